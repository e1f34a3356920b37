//! `HostStore`: checkpoints in host memory, capacity-bounded, least recently used evicted first. The
//! embedded default tier; page buffers are shared with copy engines without copying.
use foldhash::HashMap;

use crate::checkpoint::{Checkpoint, CheckpointId, CheckpointMeta, CheckpointPayload};
use crate::error::{Error, Result};
use crate::store::PutOutcome;
use crate::store::catalog::Catalog;
use crate::store::tier::Tier;

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

impl Tier for HostStore {
    /// Its checkpoints live in this process's memory.
    fn outlives_the_process(&self) -> bool {
        false
    }

    fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    fn catalog_mut(&mut self) -> &mut Catalog {
        &mut self.catalog
    }

    fn write(&mut self, checkpoint: Checkpoint, outcome: &PutOutcome) -> Result<CheckpointMeta> {
        for evicted in &outcome.evicted {
            self.payloads.remove(evicted);
        }
        // Replaces the payload of a superseded generation.
        self.payloads
            .insert(checkpoint.meta.id.clone(), checkpoint.payload);
        Ok(checkpoint.meta)
    }

    fn read(&mut self, meta: &CheckpointMeta) -> Result<CheckpointPayload> {
        self.payloads
            .get(&meta.id)
            .cloned()
            .ok_or_else(|| Error::NotFound {
                id: meta.id.clone(),
            })
    }

    /// Never called: every catalogued checkpoint has its payload (`check_invariants`).
    fn read_failed(&mut self, _id: &CheckpointId, _error: &Error) {}

    fn delete(&mut self, meta: &CheckpointMeta) -> Result<()> {
        self.payloads.remove(&meta.id);
        Ok(())
    }
}
