//! The prefix index of the page pool: which page holds which cached block (`BlockKey -> PageId`) and, per
//! page, the key it holds. The two maps are kept inverse to each other; the pool decides when keys come and
//! go (and queues the eviction notices). Keys are stored out of line: per page only a 4-byte slot index into
//! a dense slab of the held keys and the 32 hash bits of its key, so the allocate/free hot path (`holds_key`)
//! reads a small array and a removal finds the key's table entry without first reading the key.
//!
//! Key to page: an open-addressing table of 8-byte entries (the page and 32 bits of the key's hash), linear
//! probing, deletion by backward shift (no tombstones). The index never holds more keys than the pool has
//! pages, so the table is sized once, at most half full, and never grows: 2 MiB for 65,536 pages, where a
//! hash map of 36-byte entries took 4.7 MiB and a removal read the whole key. A removal knows its page, so
//! it compares page ids only; a lookup compares the whole key, read from the slab, when the hash bits match.

use std::hash::BuildHasher;

use crate::page::{BlockKey, BlockKeyHashBuilder, PageId};

/// Slot value of a page that holds no key.
const NO_SLOT: u32 = u32::MAX;

/// A free entry of the key table (page 0, the null page, never holds a key).
const EMPTY: u64 = 0;

/// A page's place in the key slab and its key's hash bits.
#[derive(Debug, Clone, Copy)]
struct PageSlot {
    /// Slot in the key slab; `NO_SLOT` when the page holds no key.
    slot: u32,
    /// The low 32 bits of its key's hash (meaningless without a slot).
    bits: u32,
}

impl PageSlot {
    const NONE: PageSlot = PageSlot {
        slot: NO_SLOT,
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
    /// Per page, its slot in `keys` (`NO_SLOT` when it holds no key) and its key's hash bits.
    slot_by_page: Vec<PageSlot>,
    /// The held keys, dense; `pages[slot]` holds `keys[slot]`.
    keys: Vec<BlockKey>,
    pages: Vec<PageId>,
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
            keys: Vec::new(),
            pages: Vec::new(),
        }
    }

    /// Number of cached keys.
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
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
        let slot = self.slot_by_page[page.idx()].slot;
        (slot != NO_SLOT).then(|| self.keys[slot as usize])
    }

    /// Whether `page` holds a key.
    #[inline]
    pub(crate) fn holds_key(&self, page: PageId) -> bool {
        self.slot_by_page[page.idx()].slot != NO_SLOT
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
        self.slot_by_page[page.idx()] = PageSlot {
            slot: self.keys.len() as u32,
            bits,
        };
        self.keys.push(key);
        self.pages.push(page);
    }

    /// Drop the key `page` holds, returning it.
    #[inline]
    pub(crate) fn remove_page(&mut self, page: PageId) -> Option<BlockKey> {
        let PageSlot { slot, bits } = self.slot_by_page[page.idx()];
        if slot == NO_SLOT {
            return None;
        }
        self.slot_by_page[page.idx()] = PageSlot::NONE;
        // The table entry is found from the stored hash bits, so its probe does not wait for the key's read.
        self.remove_entry(bits, page);
        let key = self.keys.swap_remove(slot as usize);
        self.pages.swap_remove(slot as usize);
        if let Some(&moved) = self.pages.get(slot as usize) {
            self.slot_by_page[moved.idx()].slot = slot;
        }
        Some(key)
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
            .enumerate()
            .filter(|&(_, slot)| slot.slot != NO_SLOT)
            .map(|(idx, slot)| (PageId(idx as u32), self.keys[slot.slot as usize]))
    }

    /// Assert the two maps are inverse to each other and the slab is consistent. O(n).
    pub(crate) fn check_invariants(&self) {
        assert!(!self.holds_key(PageId::NULL), "the null page holds a key");
        assert_eq!(self.keys.len(), self.pages.len(), "key slab halves differ");
        for (slot, page) in self.pages.iter().enumerate() {
            assert_eq!(
                self.slot_by_page[page.idx()].slot as usize,
                slot,
                "slot of {page:?} disagrees with the slab"
            );
            assert_eq!(
                self.slot_by_page[page.idx()].bits,
                self.hash_bits(&self.keys[slot]),
                "hash bits of {page:?} disagree with its key"
            );
        }
        let mut n_keyed = 0;
        for (page, key) in self.iter_pages() {
            n_keyed += 1;
            assert_eq!(
                self.lookup(&key),
                Some(page),
                "page {page:?} key {key:?} not indexed"
            );
        }
        let n_entries = self.table.iter().filter(|&&entry| entry != EMPTY).count();
        assert_eq!(n_keyed, n_entries, "index holds keys no page holds");
        assert_eq!(n_keyed, self.keys.len(), "slab holds keys no page holds");
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
                    assert_eq!(index.remove_page(PageId(page)), Some(key));
                    assert_eq!(index.lookup(&key), None);
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
