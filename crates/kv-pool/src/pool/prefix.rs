//! The prefix index of the page pool: which page holds which cached block (`BlockKey -> PageId`) and, per
//! page, the key it holds. The two maps are kept inverse to each other; the pool decides when keys come and
//! go (and queues the eviction notices). Keys are stored out of line: per page only a 4-byte slot index into
//! a dense slab of the held keys, so the allocate/free hot path (`holds_key`) reads a small array.

use std::collections::HashMap;

use crate::page::{BlockKey, BlockKeyHashBuilder, PageId};

/// Slot value of a page that holds no key.
const NO_SLOT: u32 = u32::MAX;

/// Cached block keys, both ways.
#[derive(Debug, Clone)]
pub(crate) struct PrefixIndex {
    page_by_key: HashMap<BlockKey, PageId, BlockKeyHashBuilder>,
    /// Per page, its slot in `keys` (`NO_SLOT` when it holds no key).
    slot_by_page: Vec<u32>,
    /// The held keys, dense; `pages[slot]` holds `keys[slot]`.
    keys: Vec<BlockKey>,
    pages: Vec<PageId>,
}

impl PrefixIndex {
    /// An empty index over pages `0..n_pages`.
    pub(crate) fn new(n_pages: u32) -> PrefixIndex {
        PrefixIndex {
            page_by_key: HashMap::with_hasher(BlockKeyHashBuilder::new()),
            slot_by_page: vec![NO_SLOT; n_pages as usize],
            keys: Vec::new(),
            pages: Vec::new(),
        }
    }

    /// Number of cached keys.
    pub(crate) fn len(&self) -> usize {
        self.page_by_key.len()
    }

    /// The page holding `key`, if cached.
    #[inline]
    pub(crate) fn lookup(&self, key: &BlockKey) -> Option<PageId> {
        self.page_by_key.get(key).copied()
    }

    /// The key `page` holds, if any.
    #[inline]
    pub(crate) fn key_of(&self, page: PageId) -> Option<BlockKey> {
        let slot = self.slot_by_page[page.idx()];
        (slot != NO_SLOT).then(|| self.keys[slot as usize])
    }

    /// Whether `page` holds a key.
    #[inline]
    pub(crate) fn holds_key(&self, page: PageId) -> bool {
        self.slot_by_page[page.idx()] != NO_SLOT
    }

    /// Register `page` (which holds no key) as holding `key` (which no page holds).
    pub(crate) fn insert(&mut self, page: PageId, key: BlockKey) {
        debug_assert!(!self.holds_key(page), "{page:?} already holds a key");
        let previous = self.page_by_key.insert(key, page);
        debug_assert!(previous.is_none(), "key {key:?} was cached twice");
        self.slot_by_page[page.idx()] = self.keys.len() as u32;
        self.keys.push(key);
        self.pages.push(page);
    }

    /// Drop the key `page` holds, returning it.
    #[inline]
    pub(crate) fn remove_page(&mut self, page: PageId) -> Option<BlockKey> {
        let slot = self.slot_by_page[page.idx()];
        if slot == NO_SLOT {
            return None;
        }
        self.slot_by_page[page.idx()] = NO_SLOT;
        let key = self.keys.swap_remove(slot as usize);
        self.pages.swap_remove(slot as usize);
        if let Some(&moved) = self.pages.get(slot as usize) {
            self.slot_by_page[moved.idx()] = slot;
        }
        let removed = self.page_by_key.remove(&key);
        debug_assert_eq!(
            removed,
            Some(page),
            "index and page keys disagree for {page:?}"
        );
        Some(key)
    }

    /// Pages that hold a key, in page order, with their keys.
    pub(crate) fn iter_pages(&self) -> impl Iterator<Item = (PageId, BlockKey)> + '_ {
        self.slot_by_page
            .iter()
            .enumerate()
            .filter(|&(_, &slot)| slot != NO_SLOT)
            .map(|(idx, &slot)| (PageId(idx as u32), self.keys[slot as usize]))
    }

    /// Assert the two maps are inverse to each other and the slab is consistent. O(n).
    pub(crate) fn check_invariants(&self) {
        assert!(!self.holds_key(PageId::NULL), "the null page holds a key");
        assert_eq!(self.keys.len(), self.pages.len(), "key slab halves differ");
        for (slot, page) in self.pages.iter().enumerate() {
            assert_eq!(
                self.slot_by_page[page.idx()] as usize,
                slot,
                "slot of {page:?} disagrees with the slab"
            );
        }
        let mut n_keyed = 0;
        for (page, key) in self.iter_pages() {
            n_keyed += 1;
            assert_eq!(
                self.page_by_key.get(&key),
                Some(&page),
                "page {page:?} key {key:?} not indexed"
            );
        }
        assert_eq!(
            n_keyed,
            self.page_by_key.len(),
            "index holds keys no page holds"
        );
        assert_eq!(n_keyed, self.keys.len(), "slab holds keys no page holds");
    }
}
