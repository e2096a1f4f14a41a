//! Resident memory per connected QP: a pair of processes (`qpmem-server`,
//! `qpmem-client`) that open the device, register one fixed buffer, make one
//! fixed-size CQ and `n` RC QPs, connect them pairwise through the usual
//! out-of-band exchange (GID + QPN over a TCP socket, then INIT -> RTR -> RTS),
//! prove every QP connected with one signalled 8-byte RDMA write each, and then
//! report their own VmRSS. Only `n` differs between runs, so
//! (RSS(n) - RSS(1)) / (n - 1) is what one more connected QP costs.
//!
//! A minimal private libibverbs FFI over the bindgen types of `xiw-abi`: the
//! inline verbs (post_send, poll_cq) go through `context->ops` as verbs.h does.

use std::ffi::CStr;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::raw::{c_char, c_int, c_void};
use std::ptr;
use std::time::{Duration, Instant};

use xiw_abi::verbs::*;

#[link(name = "ibverbs")]
extern "C" {
    fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device;
    fn ibv_free_device_list(list: *mut *mut ibv_device);
    fn ibv_get_device_name(dev: *mut ibv_device) -> *const c_char;
    fn ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context;
    fn ibv_close_device(ctx: *mut ibv_context) -> c_int;
    fn ibv_alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd;
    fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int;
    fn ibv_reg_mr(pd: *mut ibv_pd, addr: *mut c_void, len: usize, access: c_int) -> *mut ibv_mr;
    fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int;
    fn ibv_create_cq(
        ctx: *mut ibv_context,
        cqe: c_int,
        cq_context: *mut c_void,
        channel: *mut ibv_comp_channel,
        comp_vector: c_int,
    ) -> *mut ibv_cq;
    fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int;
    fn ibv_create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp;
    fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int;
    fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int;
    fn ibv_query_gid(ctx: *mut ibv_context, port: u8, index: c_int, gid: *mut ibv_gid) -> c_int;
}

/// Fixed for every run, whatever `n`: one buffer, one CQ, these QP caps.
pub const BUF_BYTES: usize = 1 << 20;
pub const CQ_DEPTH: c_int = 4096;
pub const SEND_WR: u32 = 128;
pub const RECV_WR: u32 = 128;

fn err(what: &str) -> io::Error {
    io::Error::other(format!("{what}: {}", io::Error::last_os_error()))
}

/// Raises the soft RLIMIT_NOFILE to `want`, or as far as the hard limit allows
/// when the hard limit cannot be raised (no CAP_SYS_RESOURCE); returns it.
fn raise_nofile(want: u64) -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls on local structs.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        if r.rlim_cur < want {
            let up = libc::rlimit {
                rlim_cur: want,
                rlim_max: r.rlim_max.max(want),
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &up) != 0 {
                let soft = libc::rlimit {
                    rlim_cur: r.rlim_max.min(want),
                    rlim_max: r.rlim_max,
                };
                libc::setrlimit(libc::RLIMIT_NOFILE, &soft);
            }
        }
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
    }
    r.rlim_cur
}

/// `key: value kB` lines of /proc/self/status.
fn status_kb(key: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

type PostSend = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
type PollCq = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;

/// What posting RDMA writes from the local buffer to the peer's needs.
struct Io {
    post_send: PostSend,
    poll_cq: PollCq,
    cq: *mut ibv_cq,
    lkey: u32,
    local: u64,
    remote: u64,
    rkey: u32,
}

impl Io {
    /// One signalled RDMA write of `len` bytes on every QP (at distinct
    /// offsets while they fit in the buffer), waiting for all completions.
    ///
    /// # Safety
    /// `qps`, `cq` and the memory named by `local`/`lkey` must be live.
    unsafe fn write_each(&self, qps: &[*mut ibv_qp], len: usize) -> io::Result<()> {
        let n = qps.len();
        let slots = (BUF_BYTES / len).max(1);
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut wc: [ibv_wc; 64] = std::mem::zeroed();
        let (mut posted, mut done) = (0usize, 0usize);
        while done < n {
            while posted < n && posted - done < (CQ_DEPTH as usize) - 64 {
                let off = (len * (posted % slots)) as u64;
                let mut sge = ibv_sge {
                    addr: self.local + off,
                    length: len as u32,
                    lkey: self.lkey,
                };
                let mut wr: ibv_send_wr = std::mem::zeroed();
                wr.wr_id = posted as u64;
                wr.sg_list = &mut sge;
                wr.num_sge = 1;
                wr.opcode = IBV_WR_RDMA_WRITE;
                wr.send_flags = IBV_SEND_SIGNALED;
                wr.wr.rdma.remote_addr = self.remote + off;
                wr.wr.rdma.rkey = self.rkey;
                let mut bad = ptr::null_mut();
                let r = (self.post_send)(qps[posted], &mut wr, &mut bad);
                if r != 0 {
                    return Err(io::Error::from_raw_os_error(r));
                }
                posted += 1;
            }
            let got = (self.poll_cq)(self.cq, wc.len() as c_int, wc.as_mut_ptr());
            if got < 0 {
                return Err(io::Error::other("poll_cq failed"));
            }
            for w in &wc[..got as usize] {
                if w.status != IBV_WC_SUCCESS {
                    return Err(io::Error::other(format!(
                        "{len} B write on QP #{} completed with status {}",
                        w.wr_id, w.status
                    )));
                }
            }
            done += got as usize;
            if got == 0 {
                if Instant::now() > deadline {
                    return Err(io::Error::other(format!(
                        "only {done} of {n} {len} B writes completed in 120 s"
                    )));
                }
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        Ok(())
    }
}

struct Peer {
    gid: [u8; 16],
    addr: u64,
    rkey: u32,
    qpns: Vec<u32>,
}

fn exchange(s: &mut TcpStream, mine: &Peer) -> io::Result<Peer> {
    let mut out = Vec::with_capacity(32 + 4 * mine.qpns.len());
    out.extend_from_slice(&mine.gid);
    out.extend_from_slice(&mine.addr.to_le_bytes());
    out.extend_from_slice(&mine.rkey.to_le_bytes());
    out.extend_from_slice(&(mine.qpns.len() as u32).to_le_bytes());
    for q in &mine.qpns {
        out.extend_from_slice(&q.to_le_bytes());
    }
    s.write_all(&out)?;
    let mut h = [0u8; 32];
    s.read_exact(&mut h)?;
    let n = u32::from_le_bytes(h[28..32].try_into().unwrap()) as usize;
    let mut q = vec![0u8; 4 * n];
    s.read_exact(&mut q)?;
    Ok(Peer {
        gid: h[..16].try_into().unwrap(),
        addr: u64::from_le_bytes(h[16..24].try_into().unwrap()),
        rkey: u32::from_le_bytes(h[24..28].try_into().unwrap()),
        qpns: q
            .chunks(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect(),
    })
}

fn barrier(s: &mut TcpStream) -> io::Result<()> {
    s.write_all(b"b")?;
    let mut b = [0u8; 1];
    s.read_exact(&mut b)
}

/// One side of the pair. `peer` is None for the server (it listens on
/// `port`), or the server's address for the client.
pub fn run(dev_name: &str, port: u16, peer: Option<&str>, n: usize) -> io::Result<String> {
    let nofile = raise_nofile(65536);
    let mut ctl = match peer {
        None => {
            let l = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))?;
            l.accept()?.0
        }
        Some(a) => {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match TcpStream::connect((a, port)) {
                    Ok(s) => break s,
                    Err(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    Err(e) => return Err(e),
                }
            }
        }
    };
    ctl.set_nodelay(true)?;

    // SAFETY: straightforward libibverbs calls; every pointer used is checked
    // non-null first and outlives its uses (all torn down at the end).
    unsafe {
        let mut num = 0;
        let list = ibv_get_device_list(&mut num);
        if list.is_null() {
            return Err(err("ibv_get_device_list"));
        }
        let mut dev = ptr::null_mut();
        for i in 0..num.max(0) as usize {
            let d = *list.add(i);
            if CStr::from_ptr(ibv_get_device_name(d)).to_bytes() == dev_name.as_bytes() {
                dev = d;
            }
        }
        if dev.is_null() {
            ibv_free_device_list(list);
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no device {dev_name}"),
            ));
        }
        let ctx = ibv_open_device(dev);
        ibv_free_device_list(list);
        if ctx.is_null() {
            return Err(err("ibv_open_device"));
        }
        let pd = ibv_alloc_pd(ctx);
        if pd.is_null() {
            return Err(err("ibv_alloc_pd"));
        }
        // Touched, so that it is resident in every run alike.
        let mut buf = vec![1u8; BUF_BYTES];
        let access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
        let mr = ibv_reg_mr(pd, buf.as_mut_ptr().cast(), BUF_BYTES, access as c_int);
        if mr.is_null() {
            return Err(err("ibv_reg_mr"));
        }
        let cq = ibv_create_cq(ctx, CQ_DEPTH, ptr::null_mut(), ptr::null_mut(), 0);
        if cq.is_null() {
            return Err(err("ibv_create_cq"));
        }
        let mut qps = Vec::with_capacity(n);
        for i in 0..n {
            let mut ia: ibv_qp_init_attr = std::mem::zeroed();
            ia.send_cq = cq;
            ia.recv_cq = cq;
            ia.qp_type = IBV_QPT_RC;
            ia.cap.max_send_wr = SEND_WR;
            ia.cap.max_recv_wr = RECV_WR;
            ia.cap.max_send_sge = 1;
            ia.cap.max_recv_sge = 1;
            let qp = ibv_create_qp(pd, &mut ia);
            if qp.is_null() {
                return Err(err(&format!("ibv_create_qp #{i}")));
            }
            qps.push(qp);
            let mut a: ibv_qp_attr = std::mem::zeroed();
            a.qp_state = IBV_QPS_INIT;
            a.pkey_index = 0;
            a.port_num = 1;
            a.qp_access_flags = access;
            let mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
            if ibv_modify_qp(qp, &mut a, mask as c_int) != 0 {
                return Err(err("modify_qp INIT"));
            }
        }
        let mut gid: ibv_gid = std::mem::zeroed();
        if ibv_query_gid(ctx, 1, 0, &mut gid) != 0 {
            return Err(err("ibv_query_gid"));
        }
        let mine = Peer {
            gid: gid.raw,
            addr: buf.as_ptr() as u64,
            rkey: (*mr).rkey,
            qpns: qps.iter().map(|q| (**q).qp_num).collect(),
        };
        let other = exchange(&mut ctl, &mine)?;
        if other.qpns.len() != n {
            return Err(io::Error::other("the peer made a different number of QPs"));
        }

        let t0 = Instant::now();
        for (i, &qp) in qps.iter().enumerate() {
            let mut a: ibv_qp_attr = std::mem::zeroed();
            a.qp_state = IBV_QPS_RTR;
            a.path_mtu = IBV_MTU_4096;
            a.dest_qp_num = other.qpns[i];
            a.rq_psn = 0;
            a.max_dest_rd_atomic = 1;
            a.min_rnr_timer = 12;
            a.ah_attr.is_global = 1;
            a.ah_attr.port_num = 1;
            a.ah_attr.grh.dgid.raw = other.gid;
            a.ah_attr.grh.sgid_index = 0;
            a.ah_attr.grh.hop_limit = 64;
            let mask = IBV_QP_STATE
                | IBV_QP_AV
                | IBV_QP_PATH_MTU
                | IBV_QP_DEST_QPN
                | IBV_QP_RQ_PSN
                | IBV_QP_MAX_DEST_RD_ATOMIC
                | IBV_QP_MIN_RNR_TIMER;
            if ibv_modify_qp(qp, &mut a, mask as c_int) != 0 {
                return Err(err(&format!("modify_qp RTR #{i}")));
            }
            let mut a: ibv_qp_attr = std::mem::zeroed();
            a.qp_state = IBV_QPS_RTS;
            a.timeout = 14;
            a.retry_cnt = 7;
            a.rnr_retry = 7;
            a.sq_psn = 0;
            a.max_rd_atomic = 1;
            let mask = IBV_QP_STATE
                | IBV_QP_TIMEOUT
                | IBV_QP_RETRY_CNT
                | IBV_QP_RNR_RETRY
                | IBV_QP_SQ_PSN
                | IBV_QP_MAX_QP_RD_ATOMIC;
            if ibv_modify_qp(qp, &mut a, mask as c_int) != 0 {
                return Err(err(&format!("modify_qp RTS #{i}")));
            }
        }

        // One signalled 8-byte write on every QP: all complete only once
        // every connection is up (the SQ runs once connected).
        let ops = &(*ctx).ops;
        let io = Io {
            post_send: ops.post_send.expect("post_send"),
            poll_cq: ops.poll_cq.expect("poll_cq"),
            cq,
            lkey: (*mr).lkey,
            local: buf.as_ptr() as u64,
            remote: other.addr,
            rkey: other.rkey,
        };
        io.write_each(&qps, 8)?;
        let connect_ms = t0.elapsed().as_secs_f64() * 1000.0;

        // Both ends have every QP connected and idle: measure.
        barrier(&mut ctl)?;
        std::thread::sleep(Duration::from_millis(200));
        let idle = format!(
            "RESULT qps={n} rss_kb={} rss_anon_kb={} rss_file_kb={} vm_kb={} threads={} fds={} nofile={nofile} connect_ms={connect_ms:.1}",
            status_kb("VmRSS"),
            status_kb("RssAnon"),
            status_kb("RssFile"),
            status_kb("VmSize"),
            status_kb("Threads"),
            fd_count(),
        );
        barrier(&mut ctl)?;

        // Then every QP carries one large write each way, and again.
        let t1 = Instant::now();
        io.write_each(&qps, BUF_BYTES)?;
        let traffic_ms = t1.elapsed().as_secs_f64() * 1000.0;
        barrier(&mut ctl)?;
        std::thread::sleep(Duration::from_millis(200));
        let (rss2, vm2) = (status_kb("VmRSS"), status_kb("VmSize"));
        // Idle QPs give their staging buffers back within about two seconds.
        std::thread::sleep(Duration::from_millis(3000));
        let result = format!(
            "{idle} rss2_kb={rss2} vm2_kb={vm2} traffic_ms={traffic_ms:.1} rss3_kb={}",
            status_kb("VmRSS"),
        );
        barrier(&mut ctl)?;

        for qp in qps {
            ibv_destroy_qp(qp);
        }
        ibv_destroy_cq(cq);
        ibv_dereg_mr(mr);
        ibv_dealloc_pd(pd);
        ibv_close_device(ctx);
        drop(buf);
        Ok(result)
    }
}
