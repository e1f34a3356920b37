//! Page ids and prefix block keys: the two names every other layer uses for pool memory.

use std::hash::{BuildHasher, Hasher, RandomState};

/// Index of a page in the pool. Page 0 is the null page: never allocated, never freed; it marks positions
/// that hold nothing (for example tokens that left a sliding window).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PageId(pub u32);

impl PageId {
    /// The null page.
    pub const NULL: PageId = PageId(0);

    /// The page's index as a `usize`, for slicing.
    pub fn idx(self) -> usize {
        self.0 as usize
    }

    /// Whether this is the null page.
    pub fn is_null(self) -> bool {
        self == Self::NULL
    }
}

/// Key of one cached block: BLAKE3 of the block's token ids keyed by the parent's key (a first block's by a key
/// derived from the salt), so a prefix cache cannot be poisoned by crafted collisions. Different salts
/// (tenants, cache salts) never produce the same key. A prompt given as segments (a trace's hash ids) is keyed
/// one segment at a time instead ([`BlockKey::extend_segment`]).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlockKey(pub [u8; 32]);

impl std::fmt::Debug for BlockKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BlockKey(")?;
        for byte in &self.0[..6] {
            write!(f, "{byte:02x}")?;
        }
        write!(f, "..)")
    }
}

impl BlockKey {
    /// The key of a block whose parent block has key `parent` (`None` for the first block). `salt` keys the
    /// first block; a later block's key commits to it through its parent's.
    pub fn chain(parent: Option<&BlockKey>, tokens: &[u32], salt: &[u8]) -> BlockKey {
        // BLAKE3 keyed by the parent's key, over the tokens (u32 little endian): a block of 16 tokens is one
        // 64-byte BLAKE3 block, one compression. The first block is keyed by a key derived from the salt
        // (`derive_key`, its own domain), so no first block's key is any other block's parent key unless BLAKE3
        // collides; BLAKE3 encodes the input's length, so no two token counts give the same message.
        let key = match parent {
            Some(parent) => parent.0,
            None => blake3::derive_key(ROOT_KEY_CONTEXT, salt),
        };
        let n_bytes = 4 * tokens.len();
        let mut inline = [0u8; CHAIN_INLINE_BYTES];
        let mut heap = Vec::new();
        let message = if n_bytes <= CHAIN_INLINE_BYTES {
            &mut inline[..n_bytes]
        } else {
            heap.resize(n_bytes, 0);
            &mut heap[..]
        };
        for (bytes, token) in message.chunks_exact_mut(4).zip(tokens) {
            bytes.copy_from_slice(&token.to_le_bytes());
        }
        BlockKey(*blake3::keyed_hash(&key, message).as_bytes())
    }

    /// Extends `keys` (the keys of the blocks before it) with the keys of the first `n_blocks` blocks of a
    /// segment named `segment`: a stretch of a prompt whose tokens are a function of the segment's name and
    /// the offset in it alone (a trace's hash id), starting at a block boundary. Block `j` of the segment gets
    /// the `j`-th 32 bytes of BLAKE3's extended output keyed by the parent's key (a first block's by the salt's
    /// key, as in [`BlockKey::chain`]) over a tag and the name: one hash a segment instead of one a block.
    /// Such a key names the same prefix as the chain's (the parent and the name fix the block's tokens and
    /// position), but it is another key: a prompt keyed by its segments shares no block with the same tokens
    /// keyed by [`BlockKey::chain`] (a caller keys all its prompts one way). The message is 22 bytes, and
    /// a chain's is four bytes a token, so the two never hash the same input.
    pub fn extend_segment(keys: &mut Vec<BlockKey>, segment: u64, n_blocks: usize, salt: &[u8]) {
        let key = match keys.last() {
            Some(parent) => parent.0,
            None => blake3::derive_key(ROOT_KEY_CONTEXT, salt),
        };
        let mut message = [0u8; SEGMENT_TAG.len() + 8];
        message[..SEGMENT_TAG.len()].copy_from_slice(SEGMENT_TAG);
        message[SEGMENT_TAG.len()..].copy_from_slice(&segment.to_le_bytes());
        let mut output = blake3::Hasher::new_keyed(&key)
            .update(&message)
            .finalize_xof();
        keys.reserve(n_blocks);
        let mut buffer = [0u8; SEGMENT_FILL_BLOCKS * 32];
        let mut left = n_blocks;
        while left > 0 {
            let n = left.min(SEGMENT_FILL_BLOCKS);
            output.fill(&mut buffer[..n * 32]);
            keys.extend(buffer[..n * 32].chunks_exact(32).map(|bytes| {
                let mut key = [0u8; 32];
                key.copy_from_slice(bytes);
                BlockKey(key)
            }));
            left -= n;
        }
    }

    /// Keys of every full block of `tokens`, `tokens_per_page` tokens each, in order. A trailing partial
    /// block has no key: only full blocks are cached.
    pub fn chain_all(tokens: &[u32], tokens_per_page: usize, salt: &[u8]) -> Vec<BlockKey> {
        let mut keys = Vec::with_capacity(tokens.len() / tokens_per_page.max(1));
        BlockKey::extend_chain(&mut keys, tokens, tokens_per_page, salt);
        keys
    }

    /// Extends `keys`, the keys of the first `keys.len()` full blocks of `tokens`, with the keys of the full
    /// blocks after them: what `chain_all` returns, without hashing again the blocks already keyed (a request
    /// that grows by a token a step keys each block once). A `tokens_per_page` of 0 counts as 1, as in
    /// `extend_chain_from` and `chain_all`.
    pub fn extend_chain(
        keys: &mut Vec<BlockKey>,
        tokens: &[u32],
        tokens_per_page: usize,
        salt: &[u8],
    ) {
        let _all_held = BlockKey::extend_chain_from(keys, tokens, 0, tokens_per_page, salt);
    }

    /// [`BlockKey::extend_chain`] given only the tokens from position `tokens_start` on (`tokens` is
    /// `all_tokens[tokens_start..]`): enough when `tokens_start` is at most where the unkeyed blocks begin
    /// (`keys.len() * tokens_per_page`). `false`, `keys` unchanged, when it is past it. A `tokens_per_page`
    /// of 0 counts as 1.
    pub fn extend_chain_from(
        keys: &mut Vec<BlockKey>,
        tokens: &[u32],
        tokens_start: usize,
        tokens_per_page: usize,
        salt: &[u8],
    ) -> bool {
        let tokens_per_page = tokens_per_page.max(1);
        let Some(start) = keys
            .len()
            .saturating_mul(tokens_per_page)
            .checked_sub(tokens_start)
        else {
            return false;
        };
        for block in tokens[start.min(tokens.len())..].chunks_exact(tokens_per_page) {
            let key = BlockKey::chain(keys.last(), block, salt);
            keys.push(key);
        }
        true
    }
}

/// Builds the hashers of hash maps keyed by [`BlockKey`] (the pool's prefix index, a checkpoint store's
/// block-key index). A key is already a BLAKE3 output, uniform over its 32 bytes, so one folded multiply of
/// its first eight bytes with a per-map random seed spreads keys over the table: SipHash over 32 bytes per
/// probe took a tenth of a replay's time. Keys are attacker-influenced (they hash request tokens), but the seed
/// is unknown to the attacker, so choosing keys that share a bucket means finding BLAKE3 outputs whose first
/// 64 bits collide, one pair per 2^32 hashes and many-way collisions far more; equality still compares the
/// whole key. Use it for maps keyed by `BlockKey` only: other keys are not uniform.
#[derive(Clone, Debug)]
pub struct BlockKeyHashBuilder {
    seed: u64,
}

impl BlockKeyHashBuilder {
    /// A builder with a fresh random seed (from the standard library's per-process random keys).
    pub fn new() -> Self {
        Self {
            seed: RandomState::new().hash_one(0x6b76_6761_7465_u64) | 1,
        }
    }
}

impl Default for BlockKeyHashBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl BuildHasher for BlockKeyHashBuilder {
    type Hasher = BlockKeyHasher;

    fn build_hasher(&self) -> BlockKeyHasher {
        BlockKeyHasher {
            seed: self.seed,
            state: 0,
        }
    }
}

/// The hasher [`BlockKeyHashBuilder`] builds.
#[derive(Debug)]
pub struct BlockKeyHasher {
    seed: u64,
    state: u64,
}

impl Hasher for BlockKeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        // `BlockKey`'s derived `Hash` writes its 32 bytes in one call; the first eight are enough.
        let mut word = [0u8; 8];
        let n = bytes.len().min(8);
        word[..n].copy_from_slice(&bytes[..n]);
        let mixed = u128::from(u64::from_le_bytes(word) ^ self.state ^ self.seed)
            * u128::from(0x9e37_79b9_7f4a_7c15_u64);
        self.state = (mixed as u64) ^ ((mixed >> 64) as u64);
    }

    fn write_usize(&mut self, _len: usize) {
        // The length prefix of an array's bytes (always 32 for a key) adds nothing.
    }

    fn finish(&self) -> u64 {
        self.state
    }
}

/// Messages of [`BlockKey::chain`] up to this many bytes (blocks of up to 64 tokens) are built on the stack.
const CHAIN_INLINE_BYTES: usize = 256;

/// What a segment's message starts with ([`BlockKey::extend_segment`]); 14 bytes.
const SEGMENT_TAG: &[u8; 14] = b"kvgate-segment";

/// Blocks of a segment's keys [`BlockKey::extend_segment`] reads from BLAKE3's output at a time: 32, a trace
/// segment of 512 tokens in blocks of 16, so one read (BLAKE3 computes up to 16 output blocks of 64 bytes
/// together).
const SEGMENT_FILL_BLOCKS: usize = 32;

/// The `derive_key` context of a first block's key (its salt is the key material).
const ROOT_KEY_CONTEXT: &str = "kvgate 2026-12 block key of a first block";

#[cfg(test)]
mod tests;
