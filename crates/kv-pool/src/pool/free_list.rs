//! The free pages of the page pool, in two structures with no heap node per page: a stack (`Vec<u32>`, with
//! each page's position in it) of the free pages that hold no cached block, and an index-linked LRU list of
//! the free pages that still hold one. Policy: uncached free pages are reused first (LIFO: the most recently
//! freed page, still hot in cache, goes first); cached free pages are evicted in LRU order only when no
//! uncached page is left. The LRU list is a circular doubly-linked list stored in two `Vec<u32>` (`prev`,
//! `next`) with slot 0 (the null page, never free) as its sentinel. O(1) push, pop and removal from the
//! middle of either structure: a page taken out of the middle of the stack is replaced by the top page
//! (swap-remove), a page taken out of the LRU list is unlinked and the others keep their order.
//!
//! Sized to use: the pages no allocation has taken yet (the *fresh* pages, `fresh..n_pages`) are the bottom
//! of the stack, in id order with the lowest on top, without an entry each; the per-page arrays cover only
//! the pages the pool has handed out (`cover`), so a large pool costs what its requests touch.

use crate::error::Result;
use crate::{ensure, ensure_eq};

/// Link value of a page that is not on the LRU list, and position of a page that never was on the stack.
const NOT_LISTED: u32 = u32::MAX;

/// Sentinel of the LRU list: the null page is never free, so its links anchor the circle. `next[LRU]` is the
/// LRU end (next to be evicted), `prev[LRU]` the MRU end.
const LRU: u32 = 0;

/// The free pages of a pool: uncached ones on a stack, cached ones in LRU order.
#[derive(Debug, Clone)]
pub(crate) struct FreeList {
    /// Pages of the pool, the null page included.
    n_pages: u32,
    /// The lowest fresh page: `fresh..n_pages` were never taken and lie below `stack`, lowest on top.
    fresh: u32,
    /// Uncached free pages above the fresh ones, the top (next to be reused) last.
    stack: Vec<u32>,
    /// Per page, its index in `stack`; meaningful only while the page is on the stack (a free page that
    /// holds no key): popping leaves it stale, so the hot path writes one array less.
    stack_pos: Vec<u32>,
    prev: Vec<u32>,
    next: Vec<u32>,
    n_cached: u32,
}

impl FreeList {
    /// Every usable page of `0..n_pages` free, uncached and fresh (slot 0 is never listed), the per-page
    /// arrays covering the first `n_covered` pages (at least the null page).
    pub(crate) fn new(n_pages: u32, n_covered: u32) -> FreeList {
        debug_assert!((1..NOT_LISTED).contains(&n_pages));
        debug_assert!((1..=n_pages).contains(&n_covered));
        let mut free_list = FreeList {
            n_pages,
            fresh: 1,
            stack: Vec::new(),
            stack_pos: Vec::new(),
            prev: Vec::new(),
            next: Vec::new(),
            n_cached: 0,
        };
        free_list.cover(n_covered);
        free_list.prev[LRU as usize] = LRU;
        free_list.next[LRU as usize] = LRU;
        free_list
    }

    /// Extends the per-page arrays to the first `n_covered` pages (no page among the new ones is listed
    /// but as fresh). The stack gets room for every covered page, so pushing reallocates only after a cover.
    pub(crate) fn cover(&mut self, n_covered: u32) {
        let len = n_covered as usize;
        self.stack_pos.resize(len, NOT_LISTED);
        self.prev.resize(len, NOT_LISTED);
        self.next.resize(len, NOT_LISTED);
        self.stack.reserve(len.saturating_sub(self.stack.len()));
    }

    /// The lowest fresh page (every page from it on was never taken and is free).
    #[inline]
    pub(crate) fn fresh(&self) -> u32 {
        self.fresh
    }

    /// Fresh pages: never taken, free, uncached.
    #[inline]
    pub(crate) fn n_fresh(&self) -> u32 {
        self.n_pages - self.fresh
    }

    /// Bytes of the structures' per-page arrays.
    pub(crate) fn bookkeeping_bytes(&self) -> usize {
        (self.stack.capacity()
            + self.stack_pos.capacity()
            + self.prev.capacity()
            + self.next.capacity())
            * std::mem::size_of::<u32>()
    }

    /// Free pages in both structures.
    #[inline]
    pub(crate) fn len(&self) -> u32 {
        self.n_uncached() + self.n_cached
    }

    /// Cached free pages (on the LRU list).
    #[inline]
    pub(crate) fn n_cached(&self) -> u32 {
        self.n_cached
    }

    /// Whether `page` is on the stack (O(1) but, positions being left stale by `pop_stacked`, only a
    /// debug check: the pool knows a page is stacked when it is free and holds no key).
    fn is_stacked(&self, page: u32) -> bool {
        let Some(&at) = self.stack_pos.get(page as usize) else {
            return false;
        };
        self.stack.get(at as usize) == Some(&page)
    }

    /// Whether `page` is on the LRU list.
    fn is_linked(&self, page: u32) -> bool {
        page != LRU
            && self
                .next
                .get(page as usize)
                .is_some_and(|&next| next != NOT_LISTED)
    }

    /// Push the uncached `page` on top of the stack.
    #[inline]
    pub(crate) fn push_uncached(&mut self, page: u32) {
        debug_assert!(
            page != LRU && page < self.fresh && !self.is_stacked(page) && !self.is_linked(page),
            "page {page} listed twice"
        );
        self.stack_pos[page as usize] = self.stack.len() as u32;
        self.stack.push(page);
    }

    /// Append the cached `page` at the MRU end of the LRU list.
    #[inline]
    pub(crate) fn push_cached_mru(&mut self, page: u32) {
        debug_assert!(
            page != LRU && page < self.fresh && !self.is_stacked(page) && !self.is_linked(page),
            "page {page} listed twice"
        );
        let tail = self.prev[LRU as usize];
        self.next[tail as usize] = page;
        self.prev[page as usize] = tail;
        self.next[page as usize] = LRU;
        self.prev[LRU as usize] = page;
        self.n_cached += 1;
    }

    /// Uncached free pages (on the stack, the fresh ones included).
    #[inline]
    pub(crate) fn n_uncached(&self) -> u32 {
        self.n_stacked() + self.n_fresh()
    }

    /// Uncached free pages above the fresh ones: pages freed after they were first taken.
    #[inline]
    pub(crate) fn n_stacked(&self) -> u32 {
        self.stack.len() as u32
    }

    /// Remove and return the page on top of the stack above the fresh pages, if any (a covered page).
    #[inline]
    pub(crate) fn pop_stacked(&mut self) -> Option<u32> {
        self.stack.pop()
    }

    /// Remove and return the lowest fresh page, if any: the top of the stack once `pop_stacked` finds
    /// nothing. It may lie beyond the covered pages: the caller covers it before anything reads its entries.
    pub(crate) fn pop_fresh(&mut self) -> Option<u32> {
        (self.fresh < self.n_pages).then(|| {
            self.fresh += 1;
            self.fresh - 1
        })
    }

    /// Remove and return the page at the LRU end of the LRU list, if any.
    #[inline]
    pub(crate) fn pop_cached_lru(&mut self) -> Option<u32> {
        let head = self.next[LRU as usize];
        if head == LRU {
            return None;
        }
        self.remove_cached(head);
        Some(head)
    }

    /// Remove the uncached `page` from wherever it is on the stack: the top page takes its place.
    #[inline]
    pub(crate) fn remove_uncached(&mut self, page: u32) {
        debug_assert!(self.is_stacked(page), "page {page} is not on the stack");
        let at = self.stack_pos[page as usize];
        self.stack.swap_remove(at as usize);
        if let Some(&moved) = self.stack.get(at as usize) {
            self.stack_pos[moved as usize] = at;
        }
    }

    /// Remove the fresh `page` (covered) from the stack as `remove_uncached` would: the top page takes its
    /// place. The fresh pages below it stay fresh; those above it, and the top page in its place, become
    /// stack entries under the others, in the same order. O(pages above it).
    pub(crate) fn remove_fresh(&mut self, page: u32) {
        debug_assert!(
            (self.fresh..self.n_pages).contains(&page) && (page as usize) < self.stack_pos.len(),
            "page {page} is not fresh and covered"
        );
        let moved = match self.stack.pop() {
            Some(top) => top,
            None if page == self.fresh => {
                self.fresh += 1;
                return;
            }
            // The lowest fresh page is the top: it takes the hole.
            None => self.pop_fresh().unwrap_or(page),
        };
        let above = std::iter::once(moved).chain((self.fresh..page).rev());
        let rest = std::mem::take(&mut self.stack);
        self.stack = above.chain(rest).collect();
        self.fresh = page + 1;
        for (at, &listed) in self.stack.iter().enumerate() {
            self.stack_pos[listed as usize] = at as u32;
        }
    }

    /// Remove the cached `page` from wherever it is on the LRU list; the others keep their order.
    #[inline]
    pub(crate) fn remove_cached(&mut self, page: u32) {
        debug_assert!(self.is_linked(page), "page {page} is not on the LRU list");
        let before = self.prev[page as usize];
        let after = self.next[page as usize];
        self.next[before as usize] = after;
        self.prev[after as usize] = before;
        self.prev[page as usize] = NOT_LISTED;
        self.next[page as usize] = NOT_LISTED;
        self.n_cached -= 1;
    }

    /// The uncached free pages from the top of the stack (next to be reused) down, the fresh ones last
    /// (O(n); for checks and tests).
    pub(crate) fn iter_uncached(&self) -> impl Iterator<Item = u32> + '_ {
        self.stack
            .iter()
            .rev()
            .copied()
            .chain(self.fresh..self.n_pages)
    }

    /// The cached free pages from the LRU end (next to be evicted) to the MRU end (O(n); for checks and
    /// tests).
    pub(crate) fn iter_cached_lru(&self) -> impl Iterator<Item = u32> + '_ {
        let mut at = self.next[LRU as usize];
        std::iter::from_fn(move || {
            if at == LRU {
                return None;
            }
            let page = at;
            at = self.next[at as usize];
            Some(page)
        })
    }

    /// Assert both structures are consistent: the per-page arrays cover the same pages, the stack and its
    /// positions agree, it holds no fresh page, the LRU circle is closed both ways and holds `n_cached`
    /// pages, no page is on both, and pages off the LRU list carry no links. Returns, per covered page,
    /// whether it is free (on either, or fresh). O(covered pages).
    pub(crate) fn check_invariants(&self) -> Result<Vec<bool>> {
        let n_pages = self.next.len();
        ensure!(
            self.prev.len() == n_pages && self.stack_pos.len() == n_pages,
            "free list: per-page arrays of different lengths"
        );
        ensure!(
            (1..=self.n_pages).contains(&self.fresh) && n_pages <= self.n_pages as usize,
            "free list: fresh page {} or {n_pages} covered pages out of range",
            self.fresh
        );
        let mut seen = vec![false; n_pages];
        for (at, &page) in self.stack.iter().enumerate() {
            ensure!(
                page != LRU && page < self.fresh && (page as usize) < n_pages,
                "stack: page {page} out of range or fresh"
            );
            ensure!(!seen[page as usize], "stack: page {page} listed twice");
            seen[page as usize] = true;
            ensure_eq!(
                self.stack_pos[page as usize] as usize,
                at,
                "stack: position of page {page}"
            );
        }
        let mut count: u32 = 0;
        let mut at = LRU;
        loop {
            let after = self.next[at as usize];
            ensure!(
                (after as usize) < n_pages,
                "lru list: link {at} -> {after} out of range"
            );
            ensure_eq!(
                self.prev[after as usize],
                at,
                "lru list: prev of {after} is not {at}"
            );
            if after == LRU {
                break;
            }
            ensure!(
                !seen[after as usize],
                "lru list: page {after} listed twice or also on the stack"
            );
            seen[after as usize] = true;
            count += 1;
            ensure!(
                count <= self.n_cached,
                "lru list: more than {} pages linked",
                self.n_cached
            );
            at = after;
        }
        ensure_eq!(
            count,
            self.n_cached,
            "lru list: length counter disagrees with the links"
        );
        for (page, listed) in seen.iter_mut().enumerate().skip(self.fresh as usize) {
            ensure!(!*listed, "free list: fresh page {page} also listed");
            *listed = true;
        }
        for (page, &listed) in seen.iter().enumerate().skip(1) {
            if !listed || self.is_stacked(page as u32) || page >= self.fresh as usize {
                ensure_eq!(
                    (self.prev[page], self.next[page]),
                    (NOT_LISTED, NOT_LISTED),
                    "free list: page {page} off the lru list has links"
                );
            }
        }
        Ok(seen)
    }
}
