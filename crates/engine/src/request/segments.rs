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
}

/// Appends to `keys` (empty) the keys of every full block of `prompt`, `block_tokens` tokens each (at least
/// 1), salted with `salt`: segment by segment where `segments` are whole numbers of blocks, then (or else)
/// chained over the tokens ([`BlockKey::extend_chain`]) for the blocks they do not cover.
pub(crate) fn extend_keys(
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
        let per_segment = (segments.tokens / block_tokens) as usize;
        let full_blocks = prompt.len() / block_tokens as usize;
        for &id in segments.ids {
            let n = per_segment.min(full_blocks - keys.len());
            if n == 0 {
                break;
            }
            BlockKey::extend_segment(keys, id, n, salt);
        }
    }
    BlockKey::extend_chain(keys, prompt, block_tokens as usize, salt);
}

#[cfg(test)]
mod tests;
