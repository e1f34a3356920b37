//! `Tier`: what a store tier (host, disk, Redis) does with its own medium, and the one `CheckpointStore`
//! every tier gets from it. The skeleton is written once here: a put checks the payload against its manifest
//! data, asks the catalog for room (stale generation, too large, superseded, evicted), has the tier write the
//! checkpoint and delete what the catalog dropped, and catalogs it; a get reads it back through the tier and
//! refreshes its recency, or forgets a checkpoint that could not be read; a remove forgets it and has the tier
//! delete it. A put the tier could not write counts in `StoreStats::n_write_failures`.

use std::sync::Arc;

use crate::checkpoint::{Checkpoint, CheckpointId, CheckpointMeta, CheckpointPayload, PrefixQuery};
use crate::error::{Error, Result};
use crate::store::catalog::Catalog;
use crate::store::{CheckpointStore, PutOutcome, StoreStats};

/// A store tier's own operations on its medium; `CheckpointStore` is implemented once for every tier.
pub(crate) trait Tier: Send + std::fmt::Debug {
    /// The index of what the tier holds.
    fn catalog(&self) -> &Catalog;

    /// The index of what the tier holds, to change.
    fn catalog_mut(&mut self) -> &mut Catalog;

    /// Brings the catalog in line with the medium before a lookup; `false` when the lookup is to find
    /// nothing at once (the medium is known to be failing).
    fn sync_for_lookup(&mut self) -> bool {
        true
    }

    /// Whether a put may go now, before the catalog makes room; a refusal counts as a write failure.
    fn admit_put(&mut self) -> Result<()> {
        Ok(())
    }

    /// Writes `checkpoint`, which the catalog made room for, and deletes what it dropped (`outcome`: the
    /// evicted checkpoints, the superseded generation). On failure nothing of it stays catalogued: the tier
    /// deletes what it wrote. The manifest data, for the catalog.
    fn write(&mut self, checkpoint: Checkpoint, outcome: &PutOutcome) -> Result<CheckpointMeta>;

    /// Reads back (and verifies, where the tier keeps checksums) the payload of the catalogued `meta`.
    fn read(&mut self, meta: &CheckpointMeta) -> Result<CheckpointPayload>;

    /// A catalogued checkpoint could not be read (`error`) and is about to be forgotten, never restored.
    fn read_failed(&mut self, id: &CheckpointId, error: &Error);

    /// Deletes a checkpoint the catalog forgot.
    fn delete(&mut self, meta: &CheckpointMeta) -> Result<()>;

    /// As [`CheckpointStore::outlives_the_process`].
    fn outlives_the_process(&self) -> bool {
        true
    }
}

impl<T: Tier> CheckpointStore for T {
    fn find_longest(&mut self, query: &PrefixQuery<'_>) -> Option<Arc<CheckpointMeta>> {
        if !self.sync_for_lookup() {
            return None;
        }
        self.catalog_mut().find_longest(query)
    }

    fn find_longest_prefix(
        &mut self,
        query: &PrefixQuery<'_>,
    ) -> Option<(Arc<CheckpointMeta>, u32)> {
        if !self.sync_for_lookup() {
            return None;
        }
        self.catalog_mut().find_longest_prefix(query)
    }

    fn put(&mut self, checkpoint: Checkpoint) -> Result<PutOutcome> {
        checkpoint.payload.check_shape(&checkpoint.meta)?;
        if let Err(error) = self.admit_put() {
            self.catalog_mut().count_write_failure();
            return Err(error);
        }
        let n_bytes = checkpoint.payload.n_bytes();
        let outcome = self.catalog_mut().plan_put(&checkpoint.meta, n_bytes)?;
        match self.write(checkpoint, &outcome) {
            Ok(meta) => {
                self.catalog_mut().insert(Arc::new(meta), n_bytes);
                Ok(outcome)
            }
            Err(error) => {
                self.catalog_mut().count_write_failure();
                Err(error)
            }
        }
    }

    fn get(&mut self, id: &CheckpointId) -> Result<Checkpoint> {
        let meta = self
            .catalog()
            .meta(id)
            .ok_or_else(|| Error::NotFound { id: id.clone() })?;
        match self.read(&meta) {
            Ok(payload) => {
                self.catalog_mut().touch(id);
                Ok(Checkpoint {
                    meta: CheckpointMeta::clone(&meta),
                    payload,
                })
            }
            Err(error) => {
                self.read_failed(id, &error);
                self.catalog_mut().remove(id);
                Err(error)
            }
        }
    }

    fn meta(&self, id: &CheckpointId) -> Option<Arc<CheckpointMeta>> {
        self.catalog().meta(id)
    }

    fn remove(&mut self, id: &CheckpointId) -> Result<bool> {
        let Some(meta) = self.catalog_mut().remove(id) else {
            return Ok(false);
        };
        self.delete(&meta)?;
        Ok(true)
    }

    fn outlives_the_process(&self) -> bool {
        Tier::outlives_the_process(self)
    }

    fn stats(&self) -> StoreStats {
        self.catalog().stats()
    }
}
