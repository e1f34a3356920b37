//! `HostStore`: checkpoints in host memory, capacity-bounded, least recently used evicted first. The
//! embedded default tier; page buffers are shared with copy engines without copying.
use std::sync::Arc;

use foldhash::HashMap;

use crate::checkpoint::{Checkpoint, CheckpointId, CheckpointMeta, CheckpointPayload, PrefixQuery};
use crate::error::{Error, Result};
use crate::store::catalog::Catalog;
use crate::store::{CheckpointStore, PutOutcome, StoreStats};

/// Checkpoints in host memory.
#[derive(Debug)]
pub struct HostStore {
    catalog: Catalog,
    payloads: HashMap<CheckpointId, CheckpointPayload>,
}

impl HostStore {
    /// An empty store holding at most `capacity_bytes` of page payload.
    pub fn new(capacity_bytes: u64) -> Self {
        Self {
            catalog: Catalog::new(capacity_bytes),
            payloads: HashMap::default(),
        }
    }

    /// Asserts the catalog's indexes agree with its entries and every entry has its payload.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        self.catalog.check_invariants();
        assert_eq!(self.payloads.len(), self.catalog.stats().n_checkpoints);
    }
}

impl CheckpointStore for HostStore {
    fn find_longest(&mut self, query: &PrefixQuery<'_>) -> Option<Arc<CheckpointMeta>> {
        self.catalog.find_longest(query)
    }

    fn find_longest_prefix(
        &mut self,
        query: &PrefixQuery<'_>,
    ) -> Option<(Arc<CheckpointMeta>, u32)> {
        self.catalog.find_longest_prefix(query)
    }

    fn put(&mut self, checkpoint: Checkpoint) -> Result<PutOutcome> {
        checkpoint.payload.check_shape(&checkpoint.meta)?;
        let n_bytes = checkpoint.payload.n_bytes();
        let outcome = self.catalog.plan_put(&checkpoint.meta, n_bytes)?;
        if outcome.superseded_generation.is_some() {
            self.payloads.remove(&checkpoint.meta.id);
        }
        for evicted in &outcome.evicted {
            self.payloads.remove(evicted);
        }
        let id = checkpoint.meta.id.clone();
        self.catalog.insert(Arc::new(checkpoint.meta), n_bytes);
        self.payloads.insert(id, checkpoint.payload);
        Ok(outcome)
    }

    fn get(&mut self, id: &CheckpointId) -> Result<Checkpoint> {
        let (Some(meta), Some(payload)) = (self.catalog.meta(id), self.payloads.get(id)) else {
            return Err(Error::NotFound { id: id.clone() });
        };
        let checkpoint = Checkpoint {
            meta: CheckpointMeta::clone(&meta),
            payload: payload.clone(),
        };
        self.catalog.touch(id);
        Ok(checkpoint)
    }

    fn meta(&self, id: &CheckpointId) -> Option<Arc<CheckpointMeta>> {
        self.catalog.meta(id)
    }

    fn remove(&mut self, id: &CheckpointId) -> Result<bool> {
        self.payloads.remove(id);
        Ok(self.catalog.remove(id).is_some())
    }

    fn stats(&self) -> StoreStats {
        self.catalog.stats()
    }
}
