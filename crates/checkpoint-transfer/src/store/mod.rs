//! The external checkpoint store behind the `CheckpointStore` trait, with its tiers: `HostStore` (host
//! memory, the embedded default) and `DiskStore` (a directory of checksummed manifests and payload files that
//! survives restarts) and `RedisStore` (a Redis server several engines share). All are capacity-bounded and
//! evict the least recently used checkpoint. `SharedStore` lets several engines of one process use one store.
//! The tiers share one `Catalog` (the index) and one put/get/remove skeleton (`tier`); each writes, reads and
//! deletes on its own medium only.

mod catalog;
mod disk;
mod host;
mod link;
mod manifest;
mod redis;
mod shared;
mod tier;

use std::sync::Arc;

pub use self::redis::{DEFAULT_KEY_PREFIX, KEY_PREFIX_BYTES_MAX, RedisStore, check_redis_url};
pub use disk::DiskStore;
pub use host::HostStore;
pub use link::{Found, Lookup, StoreLink};
pub use shared::SharedStore;

use crate::checkpoint::{Checkpoint, CheckpointId, CheckpointMeta, PrefixQuery};
use crate::error::Result;

/// A store of checkpoints (the LMCache-like tier).
pub trait CheckpointStore: Send + std::fmt::Debug {
    /// The longest stored checkpoint whose token prefix is a prefix of the query's request (ties: newest
    /// generation), refreshing its recency. `None` when nothing matches.
    fn find_longest(&mut self, query: &PrefixQuery<'_>) -> Option<Arc<CheckpointMeta>>;

    /// The stored checkpoint sharing the longest run of leading full blocks with the query's request, and the
    /// length of that run in blocks, when those blocks are a checkpoint of their own
    /// (`CheckpointMeta::restores_block_prefix`: always for a whole checkpoint ending on a block boundary, for a
    /// strict prefix only with an attention-only layout). Only full blocks count: a partial tail is never
    /// matched. Ties: the newest stored. Refreshes its recency. `None` when no block matches. Served from a
    /// block-key index, not a scan of the stored checkpoints. Layouts with a recurrent or auxiliary group
    /// restore whole checkpoints with `find_longest`.
    fn find_longest_prefix(
        &mut self,
        query: &PrefixQuery<'_>,
    ) -> Option<(Arc<CheckpointMeta>, u32)>;

    /// Stores (captures) a checkpoint. A newer generation of a stored id supersedes it; an older or equal
    /// one is refused (`Error::StaleGeneration`). Least recently used checkpoints are evicted to make room.
    fn put(&mut self, checkpoint: Checkpoint) -> Result<PutOutcome>;

    /// The checkpoint's manifest data and page bytes (verified against its checksums where the tier keeps
    /// them). Refreshes its recency.
    fn get(&mut self, id: &CheckpointId) -> Result<Checkpoint>;

    /// The manifest data of a stored checkpoint, without touching its recency.
    fn meta(&self, id: &CheckpointId) -> Option<Arc<CheckpointMeta>>;

    /// Drops a checkpoint; `false` when it was not stored.
    fn remove(&mut self, id: &CheckpointId) -> Result<bool>;

    /// What the store holds.
    fn stats(&self) -> StoreStats;

    /// Whether what it holds may outlive this process (a disk or Redis store), so that another run may
    /// restore it and check its pages' bytes. The default, `true`, is the safe answer; a store in this
    /// process's memory says `false`.
    fn outlives_the_process(&self) -> bool {
        true
    }
}

/// What a `put` changed besides storing the checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PutOutcome {
    /// The older generation it replaced, if any.
    pub superseded_generation: Option<u64>,
    /// Checkpoints evicted to make room, least recently used first.
    pub evicted: Vec<CheckpointId>,
}

/// What a store holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Checkpoints stored.
    pub n_checkpoints: usize,
    /// Payload bytes stored.
    pub n_bytes: u64,
    /// Capacity in payload bytes.
    pub capacity_bytes: u64,
    /// Checkpoints evicted for room since the store was created or opened.
    pub n_evictions: u64,
    /// Puts whose files could not be written (disk full, read-only file system, permission) since the store
    /// was created or opened; none of those checkpoints is stored.
    pub n_write_failures: u64,
}

#[cfg(test)]
mod tests;
