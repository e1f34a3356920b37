//! Block keys remembered by prompt segment, so a caller keying many prompts that share segments (a trace
//! replay: prompts built from hash ids) hashes each shared segment once.

use std::collections::HashMap;

use kv_pool::BlockKey;

/// A prompt as segments whose tokens are each a function of the segment's id and the offset in it alone
/// ([`PromptSource::segments`](super::PromptSource::segments)): segment `i` is the prompt's tokens from
/// `i * tokens` on, `tokens` of them but for the last, which ends where the prompt ends.
#[derive(Clone, Copy, Debug)]
pub struct Segments<'a> {
    /// Each segment's id, in prompt order.
    pub ids: &'a [u64],
    /// Tokens in every segment but the last.
    pub tokens: u32,
}

/// Segments remembered at most, the two generations together: at 16-token blocks and 512-token segments
/// each costs about 1 KiB, so about 8 MiB in all.
const KEY_MEMO_SEGMENTS: usize = 8192;

/// The keys of a segment's full blocks after a given parent block: a segment's keys depend only on the key
/// of the block before it (which commits to the salt and every earlier token) and its tokens, so two
/// prompts whose segments agree up to some segment share its keys. Remembers the most recently used
/// segments (two generations: a segment found in the older one moves to the newer, and the older is dropped
/// when the newer fills), for one salt and block size at a time. The keys it gives are those
/// [`BlockKey::chain_all`] gives for the same prompt (tested), whatever it remembers.
#[derive(Debug)]
pub struct KeyMemo {
    capacity: usize,
    salt: Vec<u8>,
    block_tokens: u32,
    recent: HashMap<(Option<BlockKey>, u64), Vec<BlockKey>, foldhash::fast::RandomState>,
    older: HashMap<(Option<BlockKey>, u64), Vec<BlockKey>, foldhash::fast::RandomState>,
}

impl Default for KeyMemo {
    fn default() -> KeyMemo {
        KeyMemo::with_capacity(KEY_MEMO_SEGMENTS)
    }
}

impl KeyMemo {
    /// An empty memo.
    pub fn new() -> KeyMemo {
        KeyMemo::default()
    }

    /// An empty memo remembering at most about `capacity` segments (at least 2).
    fn with_capacity(capacity: usize) -> KeyMemo {
        KeyMemo {
            capacity: capacity.max(2),
            salt: Vec::new(),
            block_tokens: 0,
            recent: HashMap::default(),
            older: HashMap::default(),
        }
    }

    /// Appends to `keys` (empty) the keys of every full block of `prompt`, `block_tokens` tokens each (at
    /// least 1), salted with `salt`: what [`BlockKey::extend_chain`] appends, taken from the memo for each
    /// segment of `segments` it remembers after the same parent. Without segments, or when a segment is not a
    /// whole number of blocks, it hashes every block.
    pub(crate) fn extend(
        &mut self,
        keys: &mut Vec<BlockKey>,
        prompt: &[u32],
        segments: Option<Segments<'_>>,
        block_tokens: u32,
        salt: &[u8],
    ) {
        let block_tokens = block_tokens.max(1);
        if let Some(segments) = segments
            && segments.tokens > 0
            && segments.tokens.is_multiple_of(block_tokens)
            && keys.is_empty()
        {
            if self.block_tokens != block_tokens || self.salt != salt {
                self.recent.clear();
                self.older.clear();
                self.block_tokens = block_tokens;
                self.salt = salt.to_vec();
            }
            let bt = block_tokens as usize;
            let per_segment = (segments.tokens / block_tokens) as usize;
            let full_blocks = prompt.len() / bt;
            for (i, &id) in segments.ids.iter().enumerate() {
                let first = i * per_segment;
                if first >= full_blocks {
                    break;
                }
                let n = per_segment.min(full_blocks - first);
                let memo_key = (keys.last().copied(), id);
                let mut segment = self.take(&memo_key);
                // Hash the blocks the memo does not hold yet, after those it does.
                for block in segment.len()..n {
                    let parent = block.checked_sub(1).map_or(keys.last(), |b| segment.get(b));
                    let start = (first + block) * bt;
                    let key = BlockKey::chain(parent, &prompt[start..start + bt], salt);
                    segment.push(key);
                }
                keys.extend_from_slice(&segment[..n]);
                self.put(memo_key, segment);
            }
        }
        // Whatever the segments did not cover (all of it without them).
        BlockKey::extend_chain(keys, prompt, block_tokens as usize, salt);
    }

    /// The remembered keys of this segment, taken out (empty when none).
    fn take(&mut self, memo_key: &(Option<BlockKey>, u64)) -> Vec<BlockKey> {
        self.recent
            .remove(memo_key)
            .or_else(|| self.older.remove(memo_key))
            .unwrap_or_default()
    }

    /// Remembers this segment's keys in the newer generation, starting a new one when it is full.
    fn put(&mut self, memo_key: (Option<BlockKey>, u64), segment: Vec<BlockKey>) {
        if self.recent.len() >= self.capacity / 2 {
            self.older = std::mem::take(&mut self.recent);
        }
        self.recent.insert(memo_key, segment);
    }

    /// Segments remembered, both generations.
    pub fn len(&self) -> usize {
        self.recent.len() + self.older.len()
    }

    /// Whether it remembers no segment.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests;
