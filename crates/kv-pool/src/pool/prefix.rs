//! The prefix index of the page pool: which page holds which cached block (`BlockKey -> PageId`) and, per
//! page, the key it holds. The two maps are kept inverse to each other; the pool decides when keys come and
//! go. Per page the index keeps its key (32 bytes, read only by a lookup that matched the hash bits, an
//! insert and `key_of`) and, apart, whether it holds one and the 32 hash bits of that key (8 bytes), so the
//! allocate/free hot path (`holds_key`) reads a small array and a removal finds the key's table entry without
//! reading the key.
//!
//! Key to page: an open-addressing table of 8-byte entries (the page and 32 bits of the key's hash), linear
//! probing, deletion by backward shift (no tombstones). The index never holds more keys than the pool has
//! pages, so the table is sized once, at most half full, and never grows: 1 MiB for 65,536 pages. A removal
//! knows its page, so it compares page ids only; a lookup compares the whole key when the hash bits match.
//! A removal touches the page's two per-page records and the table entries it shifts, nothing else (a dense
//! slab of the held keys cost a swap-remove: two more scattered reads and writes per removal).

use std::hash::BuildHasher;

use crate::page::{BlockKey, BlockKeyHashBuilder, PageId};

/// A free entry of the key table (page 0, the null page, never holds a key).
const EMPTY: u64 = 0;

/// Whether a page holds a key, and its key's hash bits.
#[derive(Debug, Clone, Copy)]
struct PageSlot {
    /// Whether the page holds a key.
    held: bool,
    /// The low 32 bits of its key's hash (meaningless unless `held`).
    bits: u32,
}

impl PageSlot {
    const NONE: PageSlot = PageSlot {
        held: false,
        bits: 0,
    };
}

/// Cached block keys, both ways.
#[derive(Debug, Clone)]
pub(crate) struct PrefixIndex {
    /// Key to page: `EMPTY`, or `(hash bits << 32) | page` of a page holding a key whose hash's low 32 bits
    /// are those hash bits (its home slot is `hash bits & mask`). Its length is a power of two.
    table: Vec<u64>,
    /// `table.len() - 1`.
    mask: usize,
    hasher: BlockKeyHashBuilder,
    /// Per page, whether it holds a key and that key's hash bits.
    slot_by_page: Vec<PageSlot>,
    /// Per page, the key it holds (meaningless unless its slot is held).
    key_by_page: Vec<BlockKey>,
    /// Number of pages holding a key.
    n_keys: usize,
}

impl PrefixIndex {
    /// An empty index over pages `0..n_pages`.
    pub(crate) fn new(n_pages: u32) -> PrefixIndex {
        // At most one key per page but the null page: at most half full. Capped at 2^32 entries (the hash bits
        // kept name the home slot), which still leaves an empty entry for every probe to end on.
        let n_entries = (2 * n_pages as usize).next_power_of_two().clamp(8, 1 << 32);
        PrefixIndex {
            table: vec![EMPTY; n_entries],
            mask: n_entries - 1,
            hasher: BlockKeyHashBuilder::new(),
            slot_by_page: vec![PageSlot::NONE; n_pages as usize],
            key_by_page: vec![BlockKey([0; 32]); n_pages as usize],
            n_keys: 0,
        }
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
            let page = PageId(entry as u32);
            if (entry >> 32) as u32 == bits && self.key_of(page).as_ref() == Some(key) {
                return Some(page);
            }
            at = (at + 1) & self.mask;
        }
    }

    /// The key `page` holds, if any.
    #[inline]
    pub(crate) fn key_of(&self, page: PageId) -> Option<BlockKey> {
        self.holds_key(page).then(|| self.key_by_page[page.idx()])
    }

    /// Whether `page` holds a key.
    #[inline]
    pub(crate) fn holds_key(&self, page: PageId) -> bool {
        self.slot_by_page[page.idx()].held
    }

    /// Register `page` (which holds no key) as holding `key` (which no page holds).
    pub(crate) fn insert(&mut self, page: PageId, key: BlockKey) {
        debug_assert!(!self.holds_key(page), "{page:?} already holds a key");
        debug_assert!(self.lookup(&key).is_none(), "key {key:?} was cached twice");
        let bits = self.hash_bits(&key);
        let mut at = bits as usize & self.mask;
        while self.table[at] != EMPTY {
            at = (at + 1) & self.mask;
        }
        self.table[at] = (u64::from(bits) << 32) | u64::from(page.0);
        self.slot_by_page[page.idx()] = PageSlot { held: true, bits };
        self.key_by_page[page.idx()] = key;
        self.n_keys += 1;
    }

    /// Drop the key `page` holds; `true` when it held one. The key itself is not read.
    #[inline]
    pub(crate) fn remove_page(&mut self, page: PageId) -> bool {
        let PageSlot { held, bits } = self.slot_by_page[page.idx()];
        if !held {
            return false;
        }
        self.slot_by_page[page.idx()] = PageSlot::NONE;
        // The table entry is found from the stored hash bits, so its probe does not wait for the key's read.
        self.remove_entry(bits, page);
        self.n_keys -= 1;
        true
    }

    /// Drops the table entry of `page`, whose key's hash bits are `bits`, shifting back the entries probed
    /// past it.
    fn remove_entry(&mut self, bits: u32, page: PageId) {
        let mut hole = bits as usize & self.mask;
        loop {
            let entry = self.table[hole];
            debug_assert_ne!(entry, EMPTY, "index and page keys disagree for {page:?}");
            if entry == EMPTY {
                return;
            }
            if entry as u32 == page.0 {
                break;
            }
            hole = (hole + 1) & self.mask;
        }
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

    /// Pages that hold a key, in page order, with their keys.
    pub(crate) fn iter_pages(&self) -> impl Iterator<Item = (PageId, BlockKey)> + '_ {
        self.slot_by_page
            .iter()
            .zip(&self.key_by_page)
            .enumerate()
            .filter(|&(_, (slot, _))| slot.held)
            .map(|(idx, (_, key))| (PageId(idx as u32), *key))
    }

    /// Assert the two maps are inverse to each other and the per-page records are consistent. O(n).
    pub(crate) fn check_invariants(&self) {
        assert!(!self.holds_key(PageId::NULL), "the null page holds a key");
        let mut n_keyed = 0;
        for (page, key) in self.iter_pages() {
            n_keyed += 1;
            assert_eq!(
                self.slot_by_page[page.idx()].bits,
                self.hash_bits(&key),
                "hash bits of {page:?} disagree with its key"
            );
            assert_eq!(
                self.lookup(&key),
                Some(page),
                "page {page:?} key {key:?} not indexed"
            );
        }
        let n_entries = self.table.iter().filter(|&&entry| entry != EMPTY).count();
        assert_eq!(n_keyed, n_entries, "index holds keys no page holds");
        assert_eq!(n_keyed, self.n_keys, "key count disagrees with the pages");
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::PrefixIndex;
    use crate::page::{BlockKey, PageId};

    /// Churn against a map: every insert, removal and lookup agrees, on tables small enough that probes
    /// wrap around and removals shift entries back.
    #[test]
    fn the_key_table_agrees_with_a_map_under_churn() {
        for n_pages in [2u32, 5, 9, 64] {
            let mut index = PrefixIndex::new(n_pages);
            let mut model: HashMap<u32, BlockKey> = HashMap::new();
            let mut state = 0x2545_f491_4f6c_dd1d_u64 ^ u64::from(n_pages);
            for step in 0..4000u32 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let page = 1 + (state % u64::from(n_pages - 1).max(1)) as u32;
                if let Some(key) = model.remove(&page) {
                    assert_eq!(index.key_of(PageId(page)), Some(key));
                    assert!(index.remove_page(PageId(page)));
                    assert!(!index.remove_page(PageId(page)), "removed once");
                    assert_eq!(index.lookup(&key), None);
                    assert_eq!(index.key_of(PageId(page)), None);
                } else {
                    let key = BlockKey::chain(None, &[step, n_pages], b"churn");
                    index.insert(PageId(page), key);
                    model.insert(page, key);
                }
                for (&page, key) in &model {
                    assert_eq!(index.lookup(key), Some(PageId(page)), "step {step}");
                }
                assert_eq!(index.len(), model.len());
                index.check_invariants();
            }
        }
    }
}
