//! The media worker: a thread of the context, started with the first Flush
//! to persistence or Verify, that carries out the queue 1 requests waiting
//! on a medium, so neither the progress thread nor a posting thread waits
//! for one.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Weak};

use xiw_engine::queue1::Inbound;

use super::Shared;

pub struct Media {
    worker: Mutex<Option<MediaWorker>>,
    /// The next ticket to hand out.
    tickets: AtomicU64,
}

struct MediaWorker {
    jobs: mpsc::Sender<MediaJob>,
    thread: std::thread::JoinHandle<()>,
}

struct MediaJob {
    qpn: u32,
    ticket: u64,
    req: Inbound,
}

impl Media {
    pub(super) fn new() -> Media {
        Media {
            worker: Mutex::new(None),
            tickets: AtomicU64::new(1),
        }
    }

    /// A media worker job's ticket, unique in the context.
    pub fn ticket(&self) -> u64 {
        self.tickets.fetch_add(1, Ordering::Relaxed)
    }

    /// Stops the media worker (at context close), after its current job.
    pub fn stop(&self) {
        let w = self.worker.lock().take();
        if let Some(w) = w {
            drop(w.jobs);
            let _ = w.thread.join();
        }
    }
}

/// Hands a Flush to persistence or a Verify of `qpn` to the media worker of
/// the context `sh`, which answers through [`super::Endpoint::media`].
pub fn submit(sh: &Arc<Shared>, qpn: u32, ticket: u64, req: Inbound) {
    let mut m = sh.media.worker.lock();
    if m.is_none() {
        let (jobs, rx) = mpsc::channel::<MediaJob>();
        let weak = Arc::downgrade(sh);
        let spawned = std::thread::Builder::new()
            .name("xiw-media".into())
            .spawn(move || worker(weak, rx));
        match spawned {
            Ok(thread) => *m = Some(MediaWorker { jobs, thread }),
            Err(e) => {
                drop(m);
                if let Some(qp) = sh.qps.get(qpn) {
                    qp.fail_fatal(&format!("no media worker: {e}"));
                }
                return;
            }
        }
    }
    let job = MediaJob { qpn, ticket, req };
    if let Some(w) = m.as_ref() {
        let _ = w.jobs.send(job);
    }
}

fn worker(sh: Weak<Shared>, jobs: mpsc::Receiver<MediaJob>) {
    while let Ok(job) = jobs.recv() {
        let Some(sh) = sh.upgrade() else { return };
        let Some(qp) = sh.qps.get(job.qpn) else {
            continue;
        };
        qp.media(job.ticket, &job.req);
    }
}
