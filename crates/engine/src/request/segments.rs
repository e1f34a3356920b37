//! A prompt given as segments, each a function of its name alone (a trace's hash ids): its blocks are keyed
//! one segment at a time ([`BlockKey::extend_segment`]) instead of one block at a time.

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
    /// Tokens in the prompt: what the source generates.
    pub len: usize,
}

impl Segments<'_> {
    /// Whether these segments key a prompt's blocks of `block_tokens` tokens: each segment is a whole number of
    /// blocks, and they cover the prompt.
    pub(crate) fn key_blocks_of(&self, block_tokens: u32) -> bool {
        block_tokens > 0
            && self.tokens > 0
            && self.tokens.is_multiple_of(block_tokens)
            && self.ids.len().saturating_mul(self.tokens as usize) >= self.len
    }

    /// Appends to `keys` (empty) the keys of every full block of the prompt, `block_tokens` tokens each
    /// (blocks these segments key: [`Segments::key_blocks_of`]), salted with `salt`, segment by segment
    /// ([`BlockKey::extend_segment`]).
    pub(crate) fn extend_keys(&self, keys: &mut Vec<BlockKey>, block_tokens: u32, salt: &[u8]) {
        let per_segment = (self.tokens / block_tokens.max(1)) as usize;
        let full_blocks = self.len / block_tokens.max(1) as usize;
        for &id in self.ids {
            let n = per_segment.min(full_blocks.saturating_sub(keys.len()));
            if n == 0 {
                break;
            }
            BlockKey::extend_segment(keys, id, n, salt);
        }
    }
}

#[cfg(test)]
mod tests;
