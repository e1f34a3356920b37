//! Page ids and prefix block keys: the two names every other layer uses for pool memory.

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

/// Key of one cached block: `H(parent key, the block's token ids, salt)` with BLAKE3, so a prefix cache cannot
/// be poisoned by crafted collisions. Different salts (tenants, cache salts) never produce the same key.
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
    /// The key of a block whose parent block has key `parent` (`None` for the first block).
    pub fn chain(parent: Option<&BlockKey>, tokens: &[u32], salt: &[u8]) -> BlockKey {
        let mut hasher = blake3::Hasher::new();
        // Length-prefix every field so no two different inputs serialize to the same bytes.
        hasher.update(&(salt.len() as u64).to_le_bytes());
        hasher.update(salt);
        match parent {
            Some(parent) => {
                hasher.update(&[1]);
                hasher.update(&parent.0);
            }
            None => {
                hasher.update(&[0]);
            }
        }
        hasher.update(&(tokens.len() as u64).to_le_bytes());
        for token in tokens {
            hasher.update(&token.to_le_bytes());
        }
        BlockKey(*hasher.finalize().as_bytes())
    }

    /// Keys of every full block of `tokens`, `tokens_per_page` tokens each, in order. A trailing partial
    /// block has no key: only full blocks are cached.
    pub fn chain_all(tokens: &[u32], tokens_per_page: usize, salt: &[u8]) -> Vec<BlockKey> {
        assert!(tokens_per_page > 0, "tokens_per_page must be positive");
        let mut keys: Vec<BlockKey> = Vec::with_capacity(tokens.len() / tokens_per_page);
        for block in tokens.chunks_exact(tokens_per_page) {
            let key = BlockKey::chain(keys.last(), block, salt);
            keys.push(key);
        }
        keys
    }
}

#[cfg(test)]
mod tests;
