//! `SharedStore`: one checkpoint store several engines use at once (a cluster replay's engines, or engines
//! of one process that share a host-memory tier). Each clone is a handle on the same store behind a mutex;
//! a checkpoint one engine captures is found and restored by any other.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::{CheckpointStore, PutOutcome, StoreStats};
use crate::checkpoint::{Checkpoint, CheckpointId, CheckpointMeta, PrefixQuery};
use crate::error::Result;

/// A handle on a checkpoint store shared by several owners: clones share the store, and every call locks it
/// for its duration only. Engines built with clones of one `SharedStore` see each other's checkpoints.
#[derive(Clone, Debug)]
pub struct SharedStore {
    inner: Arc<Mutex<Box<dyn CheckpointStore>>>,
}

impl SharedStore {
    /// Shares `store`.
    pub fn new(store: Box<dyn CheckpointStore>) -> SharedStore {
        SharedStore {
            inner: Arc::new(Mutex::new(store)),
        }
    }

    /// The store, locked. A handle whose holder panicked mid-call still serves the store: every store
    /// operation leaves it consistent before it can panic, and the engines sharing it must go on.
    fn lock(&self) -> MutexGuard<'_, Box<dyn CheckpointStore>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many handles share the store (this one included).
    #[cfg(test)]
    pub(crate) fn n_handles(&self) -> usize {
        Arc::strong_count(&self.inner)
    }
}

impl CheckpointStore for SharedStore {
    fn find_longest(&mut self, query: &PrefixQuery<'_>) -> Option<Arc<CheckpointMeta>> {
        self.lock().find_longest(query)
    }

    fn find_longest_prefix(
        &mut self,
        query: &PrefixQuery<'_>,
    ) -> Option<(Arc<CheckpointMeta>, u32)> {
        self.lock().find_longest_prefix(query)
    }

    fn put(&mut self, checkpoint: Checkpoint) -> Result<PutOutcome> {
        self.lock().put(checkpoint)
    }

    fn get(&mut self, id: &CheckpointId) -> Result<Checkpoint> {
        self.lock().get(id)
    }

    fn meta(&self, id: &CheckpointId) -> Option<Arc<CheckpointMeta>> {
        self.lock().meta(id)
    }

    fn remove(&mut self, id: &CheckpointId) -> Result<bool> {
        self.lock().remove(id)
    }

    fn outlives_the_process(&self) -> bool {
        self.lock().outlives_the_process()
    }

    fn stats(&self) -> StoreStats {
        self.lock().stats()
    }
}
