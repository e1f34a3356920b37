//! `Catalog`: the in-memory index both store tiers share: entries by id, lookup by the last block key of
//! the token prefix, recency order for LRU eviction, and byte accounting against the capacity.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use kv_pool::BlockKey;

use crate::checkpoint::{CheckpointId, CheckpointMeta, PrefixQuery};
use crate::error::{Error, Result};
use crate::store::{PutOutcome, StoreStats};

#[derive(Debug)]
struct Entry {
    meta: Arc<CheckpointMeta>,
    n_bytes: u64,
    tick: u64,
}

/// Index of stored checkpoints.
#[derive(Debug)]
pub(crate) struct Catalog {
    entries: HashMap<CheckpointId, Entry>,
    by_last_key: HashMap<Option<BlockKey>, Vec<CheckpointId>>,
    recency: BTreeMap<u64, CheckpointId>,
    tick: u64,
    n_bytes: u64,
    capacity_bytes: u64,
    n_evictions: u64,
}

impl Catalog {
    pub(crate) fn new(capacity_bytes: u64) -> Self {
        Self {
            entries: HashMap::new(),
            by_last_key: HashMap::new(),
            recency: BTreeMap::new(),
            tick: 0,
            n_bytes: 0,
            capacity_bytes,
            n_evictions: 0,
        }
    }

    pub(crate) fn stats(&self) -> StoreStats {
        StoreStats {
            n_checkpoints: self.entries.len(),
            n_bytes: self.n_bytes,
            capacity_bytes: self.capacity_bytes,
            n_evictions: self.n_evictions,
        }
    }

    pub(crate) fn meta(&self, id: &CheckpointId) -> Option<Arc<CheckpointMeta>> {
        self.entries.get(id).map(|entry| Arc::clone(&entry.meta))
    }

    /// Marks `id` most recently used.
    pub(crate) fn touch(&mut self, id: &CheckpointId) {
        self.tick += 1;
        if let Some(entry) = self.entries.get_mut(id) {
            self.recency.remove(&entry.tick);
            entry.tick = self.tick;
            self.recency.insert(self.tick, id.clone());
        }
    }

    pub(crate) fn find_longest(&mut self, query: &PrefixQuery<'_>) -> Option<Arc<CheckpointMeta>> {
        for n_full in (0..=query.block_keys.len()).rev() {
            let last_key = n_full.checked_sub(1).map(|idx| query.block_keys[idx]);
            let Some(ids) = self.by_last_key.get(&last_key) else {
                continue;
            };
            let best = ids
                .iter()
                .filter_map(|id| self.entries.get(id))
                .filter(|entry| entry.meta.is_prefix_of(query))
                .max_by_key(|entry| (entry.meta.n_tokens, entry.meta.generation, entry.tick))
                .map(|entry| Arc::clone(&entry.meta));
            if let Some(meta) = best {
                self.touch(&meta.id);
                return Some(meta);
            }
        }
        None
    }

    /// Makes room for `meta` (`n_bytes` of payload): refuses a stale generation or a checkpoint larger than
    /// the store, removes a superseded generation and evicts least recently used entries. Returns what was
    /// removed; the caller deletes their payloads, stores the new one and calls `insert`.
    pub(crate) fn plan_put(&mut self, meta: &CheckpointMeta, n_bytes: u64) -> Result<PutOutcome> {
        if n_bytes > self.capacity_bytes {
            return Err(Error::TooLarge {
                id: meta.id.clone(),
                bytes: n_bytes,
                capacity_bytes: self.capacity_bytes,
            });
        }
        let mut outcome = PutOutcome::default();
        if let Some(stored) = self.entries.get(&meta.id) {
            let stored_generation = stored.meta.generation;
            if meta.generation <= stored_generation {
                return Err(Error::StaleGeneration {
                    id: meta.id.clone(),
                    generation: meta.generation,
                    stored: stored_generation,
                });
            }
            self.remove(&meta.id);
            outcome.superseded_generation = Some(stored_generation);
        }
        while self.n_bytes + n_bytes > self.capacity_bytes {
            let Some((_, victim)) = self.recency.iter().next().map(|(t, id)| (*t, id.clone()))
            else {
                break;
            };
            self.remove(&victim);
            self.n_evictions += 1;
            outcome.evicted.push(victim);
        }
        Ok(outcome)
    }

    /// Adds an entry (its id must not be stored) as the most recently used.
    pub(crate) fn insert(&mut self, meta: Arc<CheckpointMeta>, n_bytes: u64) {
        debug_assert!(
            !self.entries.contains_key(&meta.id),
            "insert over a stored id"
        );
        self.tick += 1;
        let id = meta.id.clone();
        self.by_last_key
            .entry(meta.block_keys.last().copied())
            .or_default()
            .push(id.clone());
        self.recency.insert(self.tick, id.clone());
        self.n_bytes += n_bytes;
        self.entries.insert(
            id,
            Entry {
                meta,
                n_bytes,
                tick: self.tick,
            },
        );
    }

    /// Removes an entry; `None` when absent.
    pub(crate) fn remove(&mut self, id: &CheckpointId) -> Option<Arc<CheckpointMeta>> {
        let entry = self.entries.remove(id)?;
        self.recency.remove(&entry.tick);
        self.n_bytes -= entry.n_bytes;
        let last_key = entry.meta.block_keys.last().copied();
        if let Some(ids) = self.by_last_key.get_mut(&last_key) {
            ids.retain(|other| other != id);
            if ids.is_empty() {
                self.by_last_key.remove(&last_key);
            }
        }
        Some(entry.meta)
    }
}
