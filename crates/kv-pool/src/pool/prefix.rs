//! The prefix index of the page pool: which page holds which cached block (`BlockKey -> PageId`) and, per
//! page, the key it holds. The pool decides when keys come and go, and keeps in its own per-page word
//! whether a page holds a key and the 32 hash bits of that key (`PageWord`): the word the allocate/free hot
//! path reads anyway, so a removal finds the key's table entry without another per-page read and without
//! reading the key. Per page the index keeps only the key itself (32 bytes), read by a lookup whose hash
//! bits matched, and by `key_of`.
//!
//! Key to page: an open-addressing table of 8-byte entries (the page and 32 bits of the key's hash), linear
//! probing, deletion by backward shift (no tombstones). Only a page the pool has handed out holds a key, so
//! the table has at least twice as many entries as the pool has covered pages and stays at most half full:
//! it grows (rehashed from the entries' own hash bits, no key read) when the pool covers more pages, up to
//! 1 MiB for 65,536 pages. A removal
//! knows its page, so it compares page ids only; a lookup compares the whole key when the hash bits match;
//! an insert probes once, ending on the key (already cached) or on the empty entry it takes.

use crate::error::Result;
use crate::{ensure, ensure_eq};
use std::hash::BuildHasher;

use crate::page::{BlockKey, BlockKeyHashBuilder, PageId};

/// A free entry of the key table (page 0, the null page, never holds a key).
const EMPTY: u64 = 0;

/// Cached block keys to their pages, and each page's key.
#[derive(Debug, Clone)]
pub(crate) struct PrefixIndex {
    /// Key to page: `EMPTY`, or `(hash bits << 32) | page` of a page holding a key whose hash's low 32 bits
    /// are those hash bits (its home slot is `hash bits & mask`). Its length is a power of two.
    table: Vec<u64>,
    /// `table.len() - 1`.
    mask: usize,
    hasher: BlockKeyHashBuilder,
    /// Per page, the key it holds (meaningless unless the pool's word says it holds one).
    key_by_page: Vec<BlockKey>,
    /// Number of pages holding a key.
    n_keys: usize,
}

impl PrefixIndex {
    /// An empty index covering pages `0..n_covered`.
    pub(crate) fn new(n_covered: u32) -> PrefixIndex {
        let mut index = PrefixIndex {
            table: Vec::new(),
            mask: 0,
            hasher: BlockKeyHashBuilder::new(),
            key_by_page: Vec::new(),
            n_keys: 0,
        };
        index.cover(n_covered);
        index
    }

    /// Entries of the key table for `n_covered` pages: at most one key per page but the null page, so at
    /// most half full. Capped at 2^32 entries (the hash bits kept name the home slot), which still leaves an
    /// empty entry for every probe to end on.
    fn table_entries(n_covered: u32) -> usize {
        (2 * n_covered as usize)
            .next_power_of_two()
            .clamp(8, 1 << 32)
    }

    /// Extends the index to pages `0..n_covered` (more than it covers): room for their keys, and a larger
    /// table when they need one, every entry moved to its place in it.
    pub(crate) fn cover(&mut self, n_covered: u32) {
        self.key_by_page
            .resize(n_covered as usize, BlockKey([0; 32]));
        let n_entries = Self::table_entries(n_covered);
        if n_entries <= self.table.len() {
            return;
        }
        let old = std::mem::replace(&mut self.table, vec![EMPTY; n_entries]);
        self.mask = n_entries - 1;
        for entry in old.into_iter().filter(|&entry| entry != EMPTY) {
            let mut at = (entry >> 32) as usize & self.mask;
            while self.table[at] != EMPTY {
                at = (at + 1) & self.mask;
            }
            self.table[at] = entry;
        }
    }

    /// Bytes of the key table and the per-page keys.
    pub(crate) fn bookkeeping_bytes(&self) -> usize {
        self.table.capacity() * std::mem::size_of::<u64>()
            + self.key_by_page.capacity() * std::mem::size_of::<BlockKey>()
    }

    /// Number of cached keys.
    pub(crate) fn len(&self) -> usize {
        self.n_keys
    }

    /// The low 32 bits of `key`'s hash (its home slot is these `& mask`).
    #[inline]
    fn hash_bits(&self, key: &BlockKey) -> u32 {
        self.hasher.hash_one(key) as u32
    }

    /// The page holding `key`, if cached.
    #[inline]
    pub(crate) fn lookup(&self, key: &BlockKey) -> Option<PageId> {
        let bits = self.hash_bits(key);
        let mut at = bits as usize & self.mask;
        loop {
            let entry = self.table[at];
            if entry == EMPTY {
                return None;
            }
            // Every entry names a page holding a key, so its key is read as it is.
            let page = PageId(entry as u32);
            if (entry >> 32) as u32 == bits && self.key_by_page[page.idx()] == *key {
                return Some(page);
            }
            at = (at + 1) & self.mask;
        }
    }

    /// The key `page` holds; the caller knows it holds one (else: whatever key it held last).
    #[inline]
    pub(crate) fn key_at(&self, page: PageId) -> BlockKey {
        self.key_by_page[page.idx()]
    }

    /// Registers `page` (which holds no key) as holding `key`, unless another page holds `key`: then `None`,
    /// nothing changed. Returns the key's hash bits, for the pool's page word.
    #[inline]
    pub(crate) fn insert(&mut self, page: PageId, key: BlockKey) -> Option<u32> {
        let bits = self.hash_bits(&key);
        let mut at = bits as usize & self.mask;
        loop {
            let entry = self.table[at];
            if entry == EMPTY {
                break;
            }
            if (entry >> 32) as u32 == bits && self.key_by_page[(entry as u32) as usize] == key {
                return None;
            }
            at = (at + 1) & self.mask;
        }
        // Linear probing without tombstones: the first empty entry on the key's probe path is where it goes.
        self.table[at] = (u64::from(bits) << 32) | u64::from(page.0);
        self.key_by_page[page.idx()] = key;
        self.n_keys += 1;
        Some(bits)
    }

    /// Drops the key `page` holds, whose hash bits are `bits` (what `insert` returned). The key itself is
    /// not read.
    #[inline]
    pub(crate) fn remove(&mut self, page: PageId, bits: u32) {
        let mut hole = bits as usize & self.mask;
        loop {
            let entry = self.table[hole];
            debug_assert_ne!(entry, EMPTY, "index and page words disagree for {page:?}");
            if entry == EMPTY {
                return;
            }
            if entry as u32 == page.0 {
                break;
            }
            hole = (hole + 1) & self.mask;
        }
        self.n_keys -= 1;
        // Shift back the entries probed past the hole.
        let mut at = hole;
        loop {
            at = (at + 1) & self.mask;
            let entry = self.table[at];
            if entry == EMPTY {
                break;
            }
            // An entry moves into the hole unless its home lies cyclically in `(hole, at]`: probing from
            // its home would then never pass the hole.
            let home = (entry >> 32) as usize & self.mask;
            if (at.wrapping_sub(home) & self.mask) >= (at.wrapping_sub(hole) & self.mask) {
                self.table[hole] = entry;
                hole = at;
            }
        }
        self.table[hole] = EMPTY;
    }

    /// Checks that the index holds exactly the keys of `held` (every page holding a key with its recorded
    /// hash bits, each page once): each with the bits of its key and found by a lookup, and no other. O(n).
    pub(crate) fn check_invariants(
        &self,
        n_covered: u32,
        held: impl IntoIterator<Item = (PageId, u32)>,
    ) -> Result<()> {
        ensure_eq!(
            self.key_by_page.len(),
            n_covered as usize,
            "the index covers other pages than the pool"
        );
        ensure!(
            self.table.len() >= Self::table_entries(n_covered) && self.mask == self.table.len() - 1,
            "key table of {} entries for {n_covered} pages",
            self.table.len()
        );
        let mut n_held = 0;
        for (page, bits) in held {
            n_held += 1;
            ensure!(!page.is_null(), "the null page holds a key");
            let key = self.key_at(page);
            ensure_eq!(
                bits,
                self.hash_bits(&key),
                "hash bits of {page:?} disagree with its key"
            );
            ensure_eq!(
                self.lookup(&key),
                Some(page),
                "page {page:?} key {key:?} not indexed"
            );
        }
        let n_entries = self.table.iter().filter(|&&entry| entry != EMPTY).count();
        ensure_eq!(n_held, n_entries, "index holds keys no page holds");
        ensure_eq!(n_held, self.n_keys, "key count disagrees with the pages");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::PrefixIndex;
    use crate::page::{BlockKey, PageId};

    /// Churn against a map: every insert, removal and lookup agrees, on tables small enough that probes
    /// wrap around and removals shift entries back; a second insert of a held key is refused.
    #[test]
    fn the_key_table_agrees_with_a_map_under_churn() {
        for n_pages in [2u32, 5, 9, 64] {
            let mut index = PrefixIndex::new(n_pages);
            // Per page, its key and hash bits: the pool's page words.
            let mut model: HashMap<u32, (BlockKey, u32)> = HashMap::new();
            let mut state = 0x2545_f491_4f6c_dd1d_u64 ^ u64::from(n_pages);
            for step in 0..4000u32 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let page = 1 + (state % u64::from(n_pages - 1).max(1)) as u32;
                if let Some((key, bits)) = model.remove(&page) {
                    assert_eq!(index.key_at(PageId(page)), key);
                    assert_eq!(bits, index.hash_bits(&key));
                    index.remove(PageId(page), bits);
                    assert_eq!(index.lookup(&key), None);
                } else {
                    let key = BlockKey::chain(None, &[step, n_pages], b"churn");
                    let bits = index.insert(PageId(page), key).expect("a new key");
                    model.insert(page, (key, bits));
                    if let Some(&other) = model.keys().find(|&&other| other != page) {
                        assert_eq!(index.insert(PageId(other), key), None, "cached twice");
                    }
                }
                for (&page, (key, _)) in &model {
                    assert_eq!(index.lookup(key), Some(PageId(page)), "step {step}");
                }
                assert_eq!(index.len(), model.len());
                index
                    .check_invariants(
                        n_pages,
                        model.iter().map(|(&page, &(_, bits))| (PageId(page), bits)),
                    )
                    .unwrap();
            }
        }
    }
}
