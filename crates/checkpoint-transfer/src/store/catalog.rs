//! `Catalog`: the in-memory index every store tier shares: entries by id, whole-checkpoint lookup by the last
//! block key of the token prefix, block-prefix lookup over every stored checkpoint's block keys, recency order
//! for LRU eviction, byte accounting against the capacity, and the counts `StoreStats` reports.
//!
//! Block-prefix index (`find_longest_prefix`): a compressed trie of the stored checkpoints' block-key chains
//! (`trie::BlockTrie`), each chain ending at a node with its checkpoint's serial. The checkpoints holding a
//! query's key `i` with the same keys before it are exactly those whose chains pass through the trie position
//! the query's first `i + 1` keys reach, so a lookup walks the query's keys down the trie (one hash probe per
//! node, a comparison per key) and answers from the newest serial below the node it stopped in, never scanning
//! the stored checkpoints. A put, supersede, eviction or rejected disk checkpoint goes through `insert` /
//! `remove`: an insert walks the checkpoint's chain the same way (at most a hash probe per trie node on the
//! path, not one per block key), a removal starts at the end node the entry recorded. Memory: per stored checkpoint at most two trie nodes (about 120 bytes each with their
//! hash-map edge), plus one copy of every distinct block key in the trie (32 bytes), plus one serial-to-id
//! entry.

mod holders;
mod trie;

use std::collections::BTreeMap;
use std::sync::Arc;

use foldhash::HashMap;
use kv_pool::BlockKey;

use crate::checkpoint::{CheckpointId, CheckpointMeta, PrefixQuery};
use crate::error::{Error, Result};
use crate::store::{PutOutcome, StoreStats};
use trie::{BlockTrie, NodeIdx};

#[derive(Debug)]
struct Entry {
    meta: Arc<CheckpointMeta>,
    n_bytes: u64,
    tick: u64,
    /// Names the entry in `blocks`; unique for the catalog's lifetime (a superseding generation gets a new
    /// one), and larger than every serial before it.
    serial: u64,
    /// The trie node its block-key chain ends at (`None` without a full block).
    end_node: Option<NodeIdx>,
}

/// Index of stored checkpoints.
#[derive(Debug)]
pub(crate) struct Catalog {
    entries: HashMap<CheckpointId, Entry>,
    by_last_key: HashMap<Option<BlockKey>, Vec<CheckpointId>>,
    /// Every entry's block-key chain, by serial.
    blocks: BlockTrie,
    by_serial: HashMap<u64, CheckpointId>,
    next_serial: u64,
    recency: BTreeMap<u64, CheckpointId>,
    tick: u64,
    n_bytes: u64,
    capacity_bytes: u64,
    n_evictions: u64,
    /// Puts the tier could not write (`count_write_failure`).
    n_write_failures: u64,
}

impl Catalog {
    pub(crate) fn new(capacity_bytes: u64) -> Self {
        Self {
            entries: HashMap::default(),
            by_last_key: HashMap::default(),
            blocks: BlockTrie::new(),
            by_serial: HashMap::default(),
            next_serial: 0,
            recency: BTreeMap::new(),
            tick: 0,
            n_bytes: 0,
            capacity_bytes,
            n_evictions: 0,
            n_write_failures: 0,
        }
    }

    pub(crate) fn stats(&self) -> StoreStats {
        StoreStats {
            n_checkpoints: self.entries.len(),
            n_bytes: self.n_bytes,
            capacity_bytes: self.capacity_bytes,
            n_evictions: self.n_evictions,
            n_write_failures: self.n_write_failures,
        }
    }

    /// Counts a put whose checkpoint the tier could not write (`StoreStats::n_write_failures`).
    pub(crate) fn count_write_failure(&mut self) {
        self.n_write_failures += 1;
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
    /// The query's keys are walked down the block trie to the longest run any entry shares; the newest entry
    /// below that point answers unless its blocks there are no checkpoint of their own (a sliding window whose
    /// pages it does not hold). Only then does it walk down the run, trying every holder of each shorter run,
    /// newest first; each candidate costs a comparison of its first blocks and a pass over its pages.
    pub(crate) fn find_longest_prefix(
        &mut self,
        query: &PrefixQuery<'_>,
    ) -> Option<(Arc<CheckpointMeta>, u32)> {
        let (mut node, held) = self.blocks.deepest(query.block_keys)?;
        let found = match self.qualifying(self.blocks.newest(node), query, held) {
            Some(meta) => Some((meta, held)),
            None => {
                let mut found = None;
                let mut n_blocks = held;
                'nodes: loop {
                    let (start, parent) = self.blocks.start_and_parent(node);
                    let serials = self.blocks.holders_newest_first(node);
                    while n_blocks > start {
                        for &serial in &serials {
                            if let Some(meta) = self.qualifying(serial, query, n_blocks) {
                                found = Some((meta, n_blocks));
                                break 'nodes;
                            }
                        }
                        n_blocks -= 1;
                    }
                    match parent {
                        Some(parent) => node = parent,
                        None => break,
                    }
                }
                found
            }
        };
        let (meta, n_blocks) = found?;
        self.touch(&meta.id);
        Some((meta, n_blocks as u32))
    }

    /// The entry `serial` when it shares the query's first `n_blocks` blocks and they are a checkpoint of
    /// their own.
    fn qualifying(
        &self,
        serial: u64,
        query: &PrefixQuery<'_>,
        n_blocks: usize,
    ) -> Option<Arc<CheckpointMeta>> {
        let entry = self.entries.get(self.by_serial.get(&serial)?)?;
        (entry.meta.common_blocks(query) >= n_blocks && entry.meta.restores_block_prefix(n_blocks))
            .then(|| Arc::clone(&entry.meta))
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
        let end_node = self.blocks.insert(&meta.block_keys, serial);
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
                end_node,
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
        if let Some(end_node) = entry.end_node {
            self.blocks.remove(end_node, entry.serial);
        }
        Some(entry.meta)
    }

    /// Asserts that the block trie holds exactly the block keys of the stored entries.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        let mut chains = Vec::new();
        for entry in self.entries.values() {
            assert_eq!(self.by_serial.get(&entry.serial), Some(&entry.meta.id));
            chains.push((&entry.meta.block_keys[..], entry.serial, entry.end_node));
        }
        assert_eq!(self.by_serial.len(), self.entries.len(), "stale serials");
        self.blocks.check_invariants(&chains);
        assert_eq!(self.recency.len(), self.entries.len());
        let bytes: u64 = self.entries.values().map(|entry| entry.n_bytes).sum();
        assert_eq!(self.n_bytes, bytes);
    }
}

#[cfg(test)]
mod tests;
