//! The prefix index of the page pool: which page holds which cached block (`BlockKey -> PageId`) and, per
//! page, the key it holds. The two maps are kept inverse to each other; the pool decides when keys come and
//! go (and queues the eviction notices).

use std::collections::HashMap;

use crate::page::{BlockKey, PageId};

/// Cached block keys, both ways.
#[derive(Debug, Clone)]
pub(crate) struct PrefixIndex {
    page_by_key: HashMap<BlockKey, PageId>,
    key_by_page: Vec<Option<BlockKey>>,
}

impl PrefixIndex {
    /// An empty index over pages `0..n_pages`.
    pub(crate) fn new(n_pages: u32) -> PrefixIndex {
        PrefixIndex {
            page_by_key: HashMap::new(),
            key_by_page: vec![None; n_pages as usize],
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
        self.key_by_page[page.idx()]
    }

    /// Whether `page` holds a key.
    #[inline]
    pub(crate) fn holds_key(&self, page: PageId) -> bool {
        self.key_by_page[page.idx()].is_some()
    }

    /// Register `page` (which holds no key) as holding `key` (which no page holds).
    pub(crate) fn insert(&mut self, page: PageId, key: BlockKey) {
        debug_assert!(self.key_by_page[page.idx()].is_none());
        let previous = self.page_by_key.insert(key, page);
        debug_assert!(previous.is_none(), "key {key:?} was cached twice");
        self.key_by_page[page.idx()] = Some(key);
    }

    /// Drop the key `page` holds, returning it.
    #[inline]
    pub(crate) fn remove_page(&mut self, page: PageId) -> Option<BlockKey> {
        let key = self.key_by_page[page.idx()].take()?;
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
        self.key_by_page
            .iter()
            .enumerate()
            .filter_map(|(idx, key)| key.map(|key| (PageId(idx as u32), key)))
    }

    /// Assert the two maps are inverse to each other. O(n).
    pub(crate) fn check_invariants(&self) {
        assert!(self.key_by_page[0].is_none(), "the null page holds a key");
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
    }
}
