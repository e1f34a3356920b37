//! `Catalog`: the in-memory index both store tiers share: entries by id, whole-checkpoint lookup by the last
//! block key of the token prefix, block-prefix lookup by any block key, recency order for LRU eviction, and
//! byte accounting against the capacity.
//!
//! Block-key index (`find_longest_prefix`): for every block key of every stored checkpoint, the serials of
//! the checkpoints holding it, in insertion order. Block keys are chained (a key hashes its parent key), so
//! the longest query key found in the index names a checkpoint sharing every block up to it; a lookup finds
//! that key by bisection over the query's keys and verifies the candidate's keys, never scanning the stored
//! checkpoints. Every insert and remove (put, supersede, eviction, a rejected disk
//! checkpoint) goes through `insert` / `remove`, which keep it in step. Memory: 8 bytes (one `u64` serial)
//! per full block of every stored checkpoint beyond the first two holders of its key, plus per distinct block
//! key one hash-map slot (32-byte key and a 40-byte `Holders` with two serials inline, about 80 bytes with
//! the table's overhead), plus one serial-to-id entry per checkpoint. Checkpoints of one conversation share their leading keys, so a store of 10,000 checkpoints of
//! 256 blocks on average costs at most about 20 MiB of serials plus 80 bytes per distinct block.

mod holders;

use std::collections::hash_map::Entry as MapEntry;
use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;
use std::sync::Arc;

use kv_pool::{BlockKey, BlockKeyHashBuilder};

use crate::checkpoint::{CheckpointId, CheckpointMeta, PrefixQuery};
use crate::error::{Error, Result};
use crate::store::{PutOutcome, StoreStats};
use holders::Holders;

#[derive(Debug)]
struct Entry {
    meta: Arc<CheckpointMeta>,
    n_bytes: u64,
    tick: u64,
    /// Names the entry in `by_block_key`; unique for the catalog's lifetime (a superseding generation gets a
    /// new one).
    serial: u64,
}

/// Index of stored checkpoints.
#[derive(Debug)]
pub(crate) struct Catalog {
    entries: HashMap<CheckpointId, Entry>,
    by_last_key: HashMap<Option<BlockKey>, Vec<CheckpointId>>,
    /// Per block key, the serials of the entries holding it, ascending (serials only grow, so an insert
    /// appends and the newest holder is last; an eviction removes the least recently used, usually among the
    /// oldest, near the front, where a spilled `Holders` removes without moving the rest).
    by_block_key: HashMap<BlockKey, Holders, BlockKeyHashBuilder>,
    by_serial: HashMap<u64, CheckpointId>,
    next_serial: u64,
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
            by_block_key: HashMap::with_hasher(BlockKeyHashBuilder::new()),
            by_serial: HashMap::new(),
            next_serial: 0,
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
            n_write_failures: 0,
        }
    }

    pub(crate) fn meta(&self, id: &CheckpointId) -> Option<Arc<CheckpointMeta>> {
        self.entries.get(id).map(|entry| Arc::clone(&entry.meta))
    }

    /// Every stored id with its generation, in no order.
    pub(crate) fn ids(&self) -> impl Iterator<Item = (&CheckpointId, u64)> {
        self.entries
            .iter()
            .map(|(id, entry)| (id, entry.meta.generation))
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

    /// The entry sharing the longest run of leading full blocks with the query whose first blocks are a
    /// checkpoint of their own (`CheckpointMeta::restores_block_prefix`), with that run's length; among the
    /// holders of the same run the newest inserted. Refreshes its recency.
    ///
    /// Keys are chained, so whenever the index holds the query's key `i` it holds every key before it: the
    /// longest held key is found by bisection (`log2(query blocks)` hash probes). From there it walks down
    /// only while no holder qualifies (a sliding window whose pages a checkpoint does not hold); each
    /// candidate costs a comparison of its first blocks and a pass over its pages.
    pub(crate) fn find_longest_prefix(
        &mut self,
        query: &PrefixQuery<'_>,
    ) -> Option<(Arc<CheckpointMeta>, u32)> {
        let (mut held, mut not_held) = (0, query.block_keys.len() + 1);
        while not_held - held > 1 {
            let mid = held + (not_held - held) / 2;
            if self.by_block_key.contains_key(&query.block_keys[mid - 1]) {
                held = mid;
            } else {
                not_held = mid;
            }
        }
        for n_blocks in (1..=held).rev() {
            let Some(serials) = self.by_block_key.get(&query.block_keys[n_blocks - 1]) else {
                continue;
            };
            let found = serials
                .iter()
                .rev()
                .filter_map(|serial| self.by_serial.get(serial))
                .filter_map(|id| self.entries.get(id))
                .find(|entry| {
                    entry.meta.common_blocks(query) >= n_blocks
                        && entry.meta.restores_block_prefix(n_blocks)
                })
                .map(|entry| Arc::clone(&entry.meta));
            if let Some(meta) = found {
                self.touch(&meta.id);
                return Some((meta, n_blocks as u32));
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
        let serial = self.next_serial;
        self.next_serial += 1;
        for key in &meta.block_keys {
            add_holder(&mut self.by_block_key, *key, serial);
        }
        self.by_serial.insert(serial, id.clone());
        self.recency.insert(self.tick, id.clone());
        self.n_bytes += n_bytes;
        self.entries.insert(
            id,
            Entry {
                meta,
                n_bytes,
                tick: self.tick,
                serial,
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
        self.by_serial.remove(&entry.serial);
        for key in &entry.meta.block_keys {
            if let MapEntry::Occupied(mut holders) = self.by_block_key.entry(*key) {
                holders.get_mut().remove(entry.serial);
                if holders.get().is_empty() {
                    holders.remove();
                }
            }
        }
        Some(entry.meta)
    }

    /// Asserts that the block-key index holds exactly the block keys of the stored entries.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        let mut expected: HashMap<BlockKey, Holders> = HashMap::new();
        let mut by_serial: Vec<(u64, &Entry)> = self
            .entries
            .values()
            .map(|entry| (entry.serial, entry))
            .collect();
        by_serial.sort_by_key(|(serial, _)| *serial);
        for (serial, entry) in by_serial {
            assert_eq!(self.by_serial.get(&serial), Some(&entry.meta.id));
            for key in &entry.meta.block_keys {
                add_holder(&mut expected, *key, serial);
            }
        }
        assert_eq!(self.by_serial.len(), self.entries.len(), "stale serials");
        assert_eq!(
            self.by_block_key.len(),
            expected.len(),
            "block-key index out of step"
        );
        for (key, serials) in &expected {
            assert_eq!(
                self.by_block_key.get(key),
                Some(serials),
                "block-key index out of step"
            );
        }
        assert_eq!(self.recency.len(), self.entries.len());
        let bytes: u64 = self.entries.values().map(|entry| entry.n_bytes).sum();
        assert_eq!(self.n_bytes, bytes);
    }
}

/// Records that the entry `serial` (newer than every holder so far) holds `key`.
fn add_holder<S: BuildHasher>(map: &mut HashMap<BlockKey, Holders, S>, key: BlockKey, serial: u64) {
    match map.entry(key) {
        MapEntry::Occupied(mut holders) => holders.get_mut().push(serial),
        MapEntry::Vacant(slot) => {
            slot.insert(Holders::one(serial));
        }
    }
}
