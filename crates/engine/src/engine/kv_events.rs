//! The engine's side of the KV events (`crate::kv_events`): off by default; once enabled the pool records
//! its prefix changes in order, and the engine turns them into vLLM's events right after each operation that
//! caches blocks, while the requests whose blocks they are (and so their tokens) are at hand.

use kv_pool::{BlockKey, PrefixChange, RequestId};

use super::Engine;
use crate::error::{Error, Result};
use crate::executor::Executor;
use crate::kv_events::{KvEvent, KvEventLog};

impl<E: Executor> Engine<E> {
    /// Starts emitting KV events in vLLM's format (`take_kv_events`), keeping at most `capacity` of them
    /// (at least 1; the oldest dropped first beyond it, counted by `kv_events_dropped`). Enabled before any
    /// request and with an empty prefix cache, so the events describe the whole cache; deferred prompts are
    /// then generated at submit (an event carries its blocks' tokens). Errors: `InvalidParam "kv_events"`
    /// once a request was submitted or a block cached.
    pub fn enable_kv_events(&mut self, capacity: usize) -> Result<()> {
        if self.table.len() > 0 || self.pool.n_cached() > 0 {
            return Err(Error::InvalidParam {
                name: "kv_events",
                reason: format!(
                    "enable KV events before the first request ({} live, {} blocks cached)",
                    self.table.len(),
                    self.pool.n_cached()
                ),
            });
        }
        let block_size = self.params.geometry.block_tokens();
        self.kv_events = Some(KvEventLog::new(capacity, self.groups.full(), block_size));
        self.pool.record_prefix_changes(true);
        Ok(())
    }

    /// The KV events since the last call, oldest first: empty unless `enable_kv_events` was called.
    pub fn take_kv_events(&mut self) -> Vec<KvEvent> {
        self.absorb_prefix_changes(&mut []);
        self.kv_events
            .as_mut()
            .map(KvEventLog::take)
            .unwrap_or_default()
    }

    /// KV events dropped because the log was full (a consumer that sees this grow lost track: resync).
    pub fn kv_events_dropped(&self) -> u64 {
        self.kv_events.as_ref().map_or(0, KvEventLog::dropped)
    }

    /// The keys of every block in the prefix cache now, in page order (O(pages); what a consumer of every
    /// KV event knows as cached, for a non-hybrid model).
    pub fn cached_block_hashes(&self) -> Vec<BlockKey> {
        self.pool.cached_keys()
    }

    /// Turns the pool's recorded prefix changes into KV events. A stored key is looked up among `owners`'
    /// blocks (each a request and the block index to search from); a key none of them holds
    /// is no block of a token chain (a hybrid import's slot key) and no event.
    pub(crate) fn absorb_prefix_changes(&mut self, owners: &mut [(RequestId, usize)]) {
        let Some(log) = self.kv_events.as_mut() else {
            return;
        };
        let block_tokens = self.params.geometry.block_tokens() as usize;
        for change in self.pool.take_prefix_changes() {
            match change {
                PrefixChange::Stored(key) => {
                    let found = owners.iter_mut().find_map(|(id, cursor)| {
                        let req = self.table.get(*id).ok()?;
                        let block = find_block(&req.keys, &key, cursor)?;
                        let first = block * block_tokens;
                        let tokens = req.tokens.suffix(*id, first).ok()?;
                        let parent = block
                            .checked_sub(1)
                            .and_then(|at| req.keys.get(at))
                            .copied();
                        Some((parent, tokens.get(..block_tokens)?))
                    });
                    if let Some((parent, tokens)) = found {
                        log.stored(key, parent, tokens);
                    }
                }
                PrefixChange::Removed(key) => log.removed(key),
                PrefixChange::Cleared => log.cleared(),
            }
        }
    }
}

/// The index of `key` in `keys`, searched from `cursor` on (wrapping around), so blocks cached in order are
/// found in one pass; `cursor` moves past it.
fn find_block(keys: &[BlockKey], key: &BlockKey, cursor: &mut usize) -> Option<usize> {
    let n = keys.len();
    let from = (*cursor).min(n);
    let at = (from..n)
        .chain(0..from)
        .find(|&at| keys.get(at) == Some(key))?;
    *cursor = at + 1;
    Some(at)
}
