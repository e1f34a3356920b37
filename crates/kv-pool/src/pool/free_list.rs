//! The index-linked LRU free list of the page pool: a circular doubly-linked list stored in two `Vec<u32>`
//! (`prev`, `next`) with slot 0 (the null page, never free) as its sentinel. O(1) push at the MRU end, pop at
//! the LRU end and unlink from the middle; no heap node per page.

/// Link value of a page that is not in the list.
const NOT_LINKED: u32 = u32::MAX;

/// Sentinel slot: the null page is never free, so its links anchor the circle. `next[0]` is the LRU end,
/// `prev[0]` the MRU end.
const SENTINEL: u32 = 0;

/// The free pages of a pool in LRU order (least recently freed first).
#[derive(Debug, Clone)]
pub(crate) struct FreeList {
    prev: Vec<u32>,
    next: Vec<u32>,
    len: u32,
}

impl FreeList {
    /// An empty list over pages `0..n_pages` (slot 0 is the sentinel and never listed).
    pub(crate) fn new(n_pages: u32) -> FreeList {
        debug_assert!((1..NOT_LINKED).contains(&n_pages));
        let mut prev = vec![NOT_LINKED; n_pages as usize];
        let mut next = vec![NOT_LINKED; n_pages as usize];
        prev[SENTINEL as usize] = SENTINEL;
        next[SENTINEL as usize] = SENTINEL;
        FreeList { prev, next, len: 0 }
    }

    /// Pages in the list.
    #[inline]
    pub(crate) fn len(&self) -> u32 {
        self.len
    }

    /// Whether `page` is in the list.
    #[inline]
    pub(crate) fn contains(&self, page: u32) -> bool {
        page != SENTINEL && self.next[page as usize] != NOT_LINKED
    }

    /// Append `page` at the MRU end.
    #[inline]
    pub(crate) fn push_mru(&mut self, page: u32) {
        debug_assert!(
            page != SENTINEL && !self.contains(page),
            "page {page} pushed twice"
        );
        let tail = self.prev[SENTINEL as usize];
        self.next[tail as usize] = page;
        self.prev[page as usize] = tail;
        self.next[page as usize] = SENTINEL;
        self.prev[SENTINEL as usize] = page;
        self.len += 1;
    }

    /// Remove and return the page at the LRU end, if any.
    #[inline]
    pub(crate) fn pop_lru(&mut self) -> Option<u32> {
        let head = self.next[SENTINEL as usize];
        if head == SENTINEL {
            return None;
        }
        self.unlink(head);
        Some(head)
    }

    /// Remove `page` from wherever it is in the list.
    #[inline]
    pub(crate) fn unlink(&mut self, page: u32) {
        debug_assert!(self.contains(page), "page {page} is not in the free list");
        let before = self.prev[page as usize];
        let after = self.next[page as usize];
        self.next[before as usize] = after;
        self.prev[after as usize] = before;
        self.prev[page as usize] = NOT_LINKED;
        self.next[page as usize] = NOT_LINKED;
        self.len -= 1;
    }

    /// The listed pages from the LRU end to the MRU end (O(n); for invariant checks and tests).
    pub(crate) fn iter_lru(&self) -> impl Iterator<Item = u32> + '_ {
        let mut at = self.next[SENTINEL as usize];
        std::iter::from_fn(move || {
            if at == SENTINEL {
                return None;
            }
            let page = at;
            at = self.next[at as usize];
            Some(page)
        })
    }

    /// Assert the links are consistent: the circle is closed both ways, holds `len` pages, and unlisted
    /// pages carry no links. O(n).
    pub(crate) fn check_invariants(&self) {
        let n_pages = self.next.len();
        let mut seen = vec![false; n_pages];
        let mut count: u32 = 0;
        let mut at = SENTINEL;
        loop {
            let after = self.next[at as usize];
            assert!(
                (after as usize) < n_pages,
                "free list: link {at} -> {after} out of range"
            );
            assert_eq!(
                self.prev[after as usize], at,
                "free list: prev of {after} is not {at}"
            );
            if after == SENTINEL {
                break;
            }
            assert!(
                !seen[after as usize],
                "free list: page {after} listed twice"
            );
            seen[after as usize] = true;
            count += 1;
            assert!(
                count <= self.len,
                "free list: more than {} pages linked",
                self.len
            );
            at = after;
        }
        assert_eq!(
            count, self.len,
            "free list: length counter disagrees with the links"
        );
        for (page, listed) in seen.iter().enumerate().skip(1) {
            if !listed {
                assert_eq!(
                    self.next[page], NOT_LINKED,
                    "free list: unlisted page {page} has links"
                );
                assert_eq!(
                    self.prev[page], NOT_LINKED,
                    "free list: unlisted page {page} has links"
                );
            }
        }
    }
}
