//! The context's QPs by number, as the progress thread and the media worker
//! know them ([`Endpoint`]).

use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::Arc;

use super::Endpoint;

#[derive(Default)]
pub struct Registry {
    qps: RwLock<HashMap<u32, Arc<dyn Endpoint>>>,
}

impl Registry {
    pub fn get(&self, qpn: u32) -> Option<Arc<dyn Endpoint>> {
        self.qps.read().get(&qpn).cloned()
    }

    pub fn count(&self) -> usize {
        self.qps.read().len()
    }

    /// How many QPs protection domain `pd` has.
    pub fn pd_count(&self, pd: u32) -> usize {
        self.qps.read().values().filter(|q| q.pd() == pd).count()
    }

    /// Some QP of protection domain `pd` exists.
    pub fn pd_has_qps(&self, pd: u32) -> bool {
        self.pd_count(pd) > 0
    }

    /// Trims idle QPs' buffers; true while some QP still holds large ones.
    pub fn trim(&self) -> bool {
        let qps: Vec<Arc<dyn Endpoint>> = self.qps.read().values().cloned().collect();
        qps.iter().fold(false, |big, qp| qp.trim() | big)
    }

    /// Makes a new QP reachable by number.
    pub fn insert(&self, qpn: u32, qp: Arc<dyn Endpoint>) {
        self.qps.write().insert(qpn, qp);
    }

    pub fn remove(&self, qpn: u32) {
        self.qps.write().remove(&qpn);
    }
}
