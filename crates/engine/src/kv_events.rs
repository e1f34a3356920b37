//! KV events in vLLM's format: what vLLM's KV event publisher sends a KV-aware router (Dynamo's, llm-d's) as
//! its prefix cache changes, so such a router can follow kvgate's cache.
//!
//! The events, their fields and the fields' order are vLLM's, from `vllm/distributed/kv_events.py` at
//! commit 0181ea3173e53eea8cf04a86891488e3dc89bb34 of vllm-project/vllm: `BlockStored` (block_hashes,
//! parent_block_hash, token_ids, block_size, lora_id, medium, lora_name, extra_keys, group_idx,
//! kv_cache_spec_kind, kv_cache_spec_sliding_window), `BlockRemoved` (block_hashes, medium, group_idx),
//! `AllBlocksCleared`, and the `KVEventBatch` envelope (ts, events, data_parallel_rank). The Python binding
//! writes them as dicts with those names and a `type` tag naming the event, as msgspec's tagged structs do.
//!
//! A block hash is the block's [`BlockKey`]: 32 bytes of a BLAKE3 chain over the parent key, the block's
//! tokens and (for the first block) the request's salt. vLLM's `ExternalBlockHash` is `bytes | int`: bytes
//! by default (its sha256 keys), an int only when `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES` truncates them to
//! 64 bits. kvgate sends the bytes: the whole key, so two blocks never share a hash on the wire.
//!
//! Only the full-attention group's blocks are cached (the prefix cache keeps no window or state pages), so
//! every event names that group (`group_idx`, `kv_cache_spec_kind` "full_attention"); the medium is "GPU",
//! the engine's page pool. No LoRA adapters: `lora_id` and `lora_name` are `None`. The salt is hashed into
//! the first key, so `extra_keys` is `None`.

use std::collections::{HashSet, VecDeque};

use kv_pool::BlockKey;

/// vLLM's `MEDIUM_GPU`: the medium of every event (the engine's page pool).
pub(crate) const MEDIUM_GPU: &str = "GPU";

/// vLLM's `KVCacheSpecKind.FULL_ATTENTION`: the kind of the one group whose blocks are cached.
pub(crate) const FULL_ATTENTION: &str = "full_attention";

/// vLLM's `BlockStored`: consecutive blocks of one chain now cached, `token_ids` their tokens in order
/// (`block_size` per block).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockStored {
    pub block_hashes: Vec<BlockKey>,
    /// The key of the block before the first, `None` for a chain's first block.
    pub parent_block_hash: Option<BlockKey>,
    pub token_ids: Vec<u32>,
    pub block_size: u32,
    pub lora_id: Option<u32>,
    pub medium: Option<&'static str>,
    pub lora_name: Option<String>,
    pub extra_keys: Option<Vec<Option<Vec<u32>>>>,
    pub group_idx: Option<u32>,
    pub kv_cache_spec_kind: Option<&'static str>,
    pub kv_cache_spec_sliding_window: Option<u32>,
}

/// vLLM's `BlockRemoved`: blocks no longer cached (evicted, invalidated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockRemoved {
    pub block_hashes: Vec<BlockKey>,
    pub medium: Option<&'static str>,
    pub group_idx: Option<u32>,
}

/// One of vLLM's KV cache events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    BlockStored(BlockStored),
    BlockRemoved(BlockRemoved),
    /// vLLM's `AllBlocksCleared`: the prefix cache was reset.
    AllBlocksCleared,
}

impl KvEvent {
    /// vLLM's name of the event (its msgspec tag).
    pub fn name(&self) -> &'static str {
        match self {
            KvEvent::BlockStored(_) => "BlockStored",
            KvEvent::BlockRemoved(_) => "BlockRemoved",
            KvEvent::AllBlocksCleared => "AllBlocksCleared",
        }
    }
}

/// The events not yet taken, at most `capacity` (the oldest dropped first, and counted), and the blocks a
/// consumer of every event knows as cached (a key dropped that was never announced, such as a hybrid
/// import's slot key, is no event).
#[derive(Debug)]
pub(crate) struct KvEventLog {
    events: VecDeque<KvEvent>,
    capacity: usize,
    dropped: u64,
    announced: HashSet<BlockKey>,
    /// The full-attention group: every event's `group_idx`.
    group: u32,
    block_size: u32,
}

impl KvEventLog {
    /// An empty log of at most `capacity` events (at least 1) for blocks of `block_size` tokens in `group`.
    pub(crate) fn new(capacity: usize, group: u32, block_size: u32) -> KvEventLog {
        KvEventLog {
            events: VecDeque::new(),
            capacity: capacity.max(1),
            dropped: 0,
            announced: HashSet::new(),
            group,
            block_size,
        }
    }

    /// Events dropped, oldest first, because the log was full.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Takes every event, oldest first.
    pub(crate) fn take(&mut self) -> Vec<KvEvent> {
        self.events.drain(..).collect()
    }

    /// Block `key` (its `tokens`, after `parent`) is cached: extends the last event when it stored the
    /// parent, else a new `BlockStored`. A key already announced is no event.
    pub(crate) fn stored(&mut self, key: BlockKey, parent: Option<BlockKey>, tokens: &[u32]) {
        if !self.announced.insert(key) {
            return;
        }
        if let Some(KvEvent::BlockStored(last)) = self.events.back_mut()
            && parent.is_some()
            && last.block_hashes.last() == parent.as_ref()
        {
            last.block_hashes.push(key);
            last.token_ids.extend_from_slice(tokens);
            return;
        }
        self.push(KvEvent::BlockStored(BlockStored {
            block_hashes: vec![key],
            parent_block_hash: parent,
            token_ids: tokens.to_vec(),
            block_size: self.block_size,
            lora_id: None,
            medium: Some(MEDIUM_GPU),
            lora_name: None,
            extra_keys: None,
            group_idx: Some(self.group),
            kv_cache_spec_kind: Some(FULL_ATTENTION),
            kv_cache_spec_sliding_window: None,
        }));
    }

    /// Block `key` is no longer cached: extends the last event when it removed blocks, else a new
    /// `BlockRemoved`. A key never announced is no event.
    pub(crate) fn removed(&mut self, key: BlockKey) {
        if !self.announced.remove(&key) {
            return;
        }
        if let Some(KvEvent::BlockRemoved(last)) = self.events.back_mut() {
            last.block_hashes.push(key);
            return;
        }
        self.push(KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: vec![key],
            medium: Some(MEDIUM_GPU),
            group_idx: Some(self.group),
        }));
    }

    /// Every block is gone.
    pub(crate) fn cleared(&mut self) {
        self.announced.clear();
        self.push(KvEvent::AllBlocksCleared);
    }

    fn push(&mut self, event: KvEvent) {
        if self.events.len() >= self.capacity {
            self.events.pop_front();
            self.dropped += 1;
        }
        self.events.push_back(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u32) -> BlockKey {
        BlockKey::chain(None, &[n], b"")
    }

    /// A router's view: the set of hashes the events say are cached.
    fn replay(events: &[KvEvent]) -> HashSet<BlockKey> {
        let mut cached = HashSet::new();
        for event in events {
            match event {
                KvEvent::BlockStored(stored) => cached.extend(stored.block_hashes.iter().copied()),
                KvEvent::BlockRemoved(removed) => {
                    for hash in &removed.block_hashes {
                        assert!(cached.remove(hash), "removed before stored");
                    }
                }
                KvEvent::AllBlocksCleared => cached.clear(),
            }
        }
        cached
    }

    #[test]
    fn a_chain_coalesces_and_a_break_starts_a_new_event() {
        let mut log = KvEventLog::new(16, 2, 4);
        log.stored(key(0), None, &[1, 2, 3, 4]);
        log.stored(key(1), Some(key(0)), &[5, 6, 7, 8]);
        log.stored(key(1), Some(key(0)), &[5, 6, 7, 8]); // announced: no event
        log.stored(key(7), Some(key(5)), &[9, 9, 9, 9]); // another chain
        let events = log.take();
        assert_eq!(events.len(), 2);
        let KvEvent::BlockStored(first) = &events[0] else {
            panic!("{events:?}")
        };
        assert_eq!(first.block_hashes, vec![key(0), key(1)]);
        assert_eq!(first.parent_block_hash, None);
        assert_eq!(first.token_ids, vec![1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!((first.block_size, first.group_idx), (4, Some(2)));
        assert_eq!(first.medium, Some("GPU"));
        let KvEvent::BlockStored(second) = &events[1] else {
            panic!("{events:?}")
        };
        assert_eq!(second.parent_block_hash, Some(key(5)));
        assert!(log.take().is_empty(), "taken twice");
    }

    #[test]
    fn store_remove_clear_sequences_replay_to_the_cached_set() {
        let mut log = KvEventLog::new(16, 0, 1);
        log.stored(key(0), None, &[0]);
        log.stored(key(1), Some(key(0)), &[1]);
        log.removed(key(1));
        log.removed(key(0));
        log.removed(key(9)); // never announced: no event
        log.stored(key(2), None, &[2]);
        let events = log.take();
        let names: Vec<_> = events.iter().map(KvEvent::name).collect();
        assert_eq!(names, ["BlockStored", "BlockRemoved", "BlockStored"]);
        assert_eq!(replay(&events), HashSet::from([key(2)]));
        log.cleared();
        log.stored(key(3), None, &[3]);
        let mut all = events;
        all.extend(log.take());
        assert_eq!(all[3], KvEvent::AllBlocksCleared);
        assert_eq!(replay(&all), HashSet::from([key(3)]));
        // A key removed by the clear is announced again when stored again.
        log.stored(key(2), None, &[2]);
        assert_eq!(log.take().len(), 1);
    }

    #[test]
    fn a_full_log_drops_its_oldest_events_and_counts_them() {
        let mut log = KvEventLog::new(2, 0, 1);
        for n in 0..5 {
            log.stored(key(n), None, &[n]);
        }
        assert_eq!(log.dropped(), 3);
        let events = log.take();
        assert_eq!(events.len(), 2);
        assert_eq!(replay(&events), HashSet::from([key(3), key(4)]));
        assert_eq!(KvEventLog::new(0, 0, 1).capacity, 1, "capacity 0");
    }
}
