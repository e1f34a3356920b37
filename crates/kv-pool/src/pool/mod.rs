//! The `PagePool`: a fixed set of pages, page 0 the null page; per-page reference counts; an index-linked
//! LRU free list (O(1) allocate, free and touch, no heap node per page); the prefix index of cached blocks;
//! and lazy eviction: a freed page that holds a cached block keeps its key (a later prefix hit takes it back
//! with `touch`) until an allocation reuses it, which queues exactly one `Eviction` notice.

mod free_list;
mod prefix;
#[cfg(test)]
mod tests;

use crate::error::{Error, Result};
use crate::page::{BlockKey, PageId};

use free_list::FreeList;
use prefix::PrefixIndex;

/// Notice that a cached block left the prefix index: its page was reused by an allocation, invalidated with
/// `uncache`, or dropped by `reset_prefix_cache`. Exactly one notice per dropped key; drain them with
/// `PagePool::take_evictions` (the checkpoint index listens).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Eviction {
    /// The page that held the block.
    pub page: PageId,
    /// The block's key.
    pub key: BlockKey,
}

/// Pages, reference counts, the LRU free list and the prefix index. Sans-IO and single-threaded.
///
/// Invariants (checked by `check_invariants`): `n_free + n_in_use + 1 == n_total`; a page is in the free
/// list exactly when its reference count is 0 (the null page never is); `n_cached_free` counts the free
/// pages that hold a key; the prefix index and the per-page keys are inverse maps.
#[derive(Clone)]
pub struct PagePool {
    n_pages: u32,
    ref_counts: Vec<u32>,
    free_list: FreeList,
    prefix: PrefixIndex,
    n_cached_free: u32,
    evictions: Vec<Eviction>,
}

impl std::fmt::Debug for PagePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PagePool")
            .field("n_total", &self.n_total())
            .field("n_free", &self.n_free())
            .field("n_cached_free", &self.n_cached_free)
            .field("n_in_use", &self.n_in_use())
            .field("n_cached", &self.prefix.len())
            .field("n_pending_evictions", &self.evictions.len())
            .finish()
    }
}

impl PagePool {
    /// A pool of `n_pages` pages, the null page included; every usable page starts free, in id order.
    /// Errors with `PoolTooSmall` below 2 pages (and at `u32::MAX`, which the free list reserves).
    pub fn new(n_pages: u32) -> Result<PagePool> {
        if n_pages < 2 || n_pages == u32::MAX {
            return Err(Error::PoolTooSmall { n_pages });
        }
        let mut free_list = FreeList::new(n_pages);
        for page in 1..n_pages {
            free_list.push_mru(page);
        }
        Ok(PagePool {
            n_pages,
            ref_counts: vec![0; n_pages as usize],
            free_list,
            prefix: PrefixIndex::new(n_pages),
            n_cached_free: 0,
            evictions: Vec::new(),
        })
    }

    /// Pages in the pool, the null page included.
    pub fn n_total(&self) -> u32 {
        self.n_pages
    }

    /// Pages that can be allocated: all but the null page.
    #[inline]
    pub fn n_usable(&self) -> u32 {
        self.n_pages - 1
    }

    /// Free pages, cached-free ones included.
    #[inline]
    pub fn n_free(&self) -> u32 {
        self.free_list.len()
    }

    /// Free pages that still hold a block key (evictable, and findable by a prefix lookup).
    pub fn n_cached_free(&self) -> u32 {
        self.n_cached_free
    }

    /// Pages with a reference count above zero.
    #[inline]
    pub fn n_in_use(&self) -> u32 {
        self.n_usable() - self.n_free()
    }

    /// Allocate `n` pages, each with reference count 1, least recently freed first. All or nothing: with
    /// fewer than `n` free pages it errors with `OutOfPages` and changes nothing. Reused cached pages lose
    /// their keys, one `Eviction` notice each.
    pub fn allocate(&mut self, n: u32) -> Result<Vec<PageId>> {
        // Capacity bounded by the free count, so an absurd `n` fails without a huge allocation.
        let mut out = Vec::with_capacity(n.min(self.n_free()) as usize);
        self.allocate_into(n, &mut out)?;
        Ok(out)
    }

    /// `allocate`, appending the pages to `out` (no heap allocation when `out` has room). On error `out` is
    /// unchanged.
    #[inline]
    pub fn allocate_into(&mut self, n: u32, out: &mut Vec<PageId>) -> Result<()> {
        let free = self.n_free();
        if n > free {
            return Err(Error::OutOfPages { requested: n, free });
        }
        out.reserve(n as usize);
        for _ in 0..n {
            let page = self.free_list.pop_lru();
            debug_assert!(page.is_some(), "free list shorter than its counter");
            let Some(page) = page else { break };
            let page = PageId(page);
            debug_assert_eq!(
                self.ref_counts[page.idx()],
                0,
                "free page {page:?} is referenced"
            );
            self.ref_counts[page.idx()] = 1;
            if let Some(key) = self.prefix.remove_page(page) {
                self.n_cached_free -= 1;
                self.evictions.push(Eviction { page, key });
            }
            out.push(page);
        }
        Ok(())
    }

    /// Drop one reference to `page`; at zero it goes to the MRU end of the free list, keeping its key if it
    /// holds one. Errors: `NullPage`, `PageOutOfRange`, `DoubleFree` (reference count already 0).
    #[inline]
    pub fn free(&mut self, page: PageId) -> Result<()> {
        self.check_page(page)?;
        let ref_count = self.ref_counts[page.idx()];
        if ref_count == 0 {
            return Err(Error::DoubleFree { page: page.0 });
        }
        self.ref_counts[page.idx()] = ref_count - 1;
        if ref_count == 1 {
            self.release(page);
        }
        Ok(())
    }

    /// Free every page of `pages` in reverse order, so a request's tail blocks sit nearer the LRU end and
    /// are evicted first (as vLLM): the same as calling `free` on each from the last, but all or nothing.
    /// Every page is validated first (a page listed twice counts twice); on any error nothing changes.
    pub fn free_all(&mut self, pages: &[PageId]) -> Result<()> {
        for &page in pages {
            self.check_page(page)?;
        }
        // Trial run: take every reference in reverse order, then give them all back; the first underflow
        // is the double free.
        let mut failed = None;
        let mut n_taken = 0;
        for &page in pages.iter().rev() {
            let ref_count = &mut self.ref_counts[page.idx()];
            if *ref_count == 0 {
                failed = Some(page);
                break;
            }
            *ref_count -= 1;
            n_taken += 1;
        }
        for &page in pages.iter().rev().take(n_taken) {
            self.ref_counts[page.idx()] += 1;
        }
        if let Some(page) = failed {
            return Err(Error::DoubleFree { page: page.0 });
        }
        for &page in pages.iter().rev() {
            let ref_count = self.ref_counts[page.idx()] - 1;
            self.ref_counts[page.idx()] = ref_count;
            if ref_count == 0 {
                self.release(page);
            }
        }
        Ok(())
    }

    /// Add one reference to `page`. A free page (typically a cached one found by a prefix lookup) leaves the
    /// free list and keeps its key. Errors: `NullPage`, `PageOutOfRange`.
    #[inline]
    pub fn touch(&mut self, page: PageId) -> Result<()> {
        self.check_page(page)?;
        let ref_count = self.ref_counts[page.idx()];
        if ref_count == 0 {
            self.free_list.unlink(page.0);
            if self.prefix.holds_key(page) {
                self.n_cached_free -= 1;
            }
        }
        self.ref_counts[page.idx()] = ref_count + 1;
        Ok(())
    }

    /// The reference count of `page`. Errors: `NullPage`, `PageOutOfRange`.
    #[inline]
    pub fn ref_count(&self, page: PageId) -> Result<u32> {
        self.check_page(page)?;
        Ok(self.ref_counts[page.idx()])
    }

    /// Register `page` (in use) as holding the block `key`. Returns `false`, changing nothing, when another
    /// page already caches `key`; `true` when registered (or when `page` already holds `key`). Errors:
    /// `NullPage`, `PageOutOfRange`, `PageNotInUse` (a free page), `PageAlreadyCached` (it holds another key).
    pub fn cache_block(&mut self, page: PageId, key: BlockKey) -> Result<bool> {
        self.check_page(page)?;
        if self.ref_counts[page.idx()] == 0 {
            return Err(Error::PageNotInUse { page: page.0 });
        }
        if let Some(held) = self.prefix.key_of(page) {
            if held == key {
                return Ok(true);
            }
            return Err(Error::PageAlreadyCached { page: page.0 });
        }
        if self.prefix.lookup(&key).is_some() {
            return Ok(false);
        }
        self.prefix.insert(page, key);
        Ok(true)
    }

    /// The page caching `key`, if any (free or in use). Does not touch it.
    #[inline]
    pub fn lookup(&self, key: &BlockKey) -> Option<PageId> {
        self.prefix.lookup(key)
    }

    /// Pages of the longest run of cached keys from `keys[0]`: stops at the first miss. Does not touch them.
    pub fn longest_prefix(&self, keys: &[BlockKey]) -> Vec<PageId> {
        keys.iter()
            .map_while(|key| self.prefix.lookup(key))
            .collect()
    }

    /// The key `page` holds, if any. Errors: `NullPage`, `PageOutOfRange`.
    pub fn key_of(&self, page: PageId) -> Result<Option<BlockKey>> {
        self.check_page(page)?;
        Ok(self.prefix.key_of(page))
    }

    /// Drop `page`'s key now (invalidate the block), queueing an eviction notice if it held one; the page's
    /// reference count and free-list place do not change. Errors: `NullPage`, `PageOutOfRange`.
    pub fn uncache(&mut self, page: PageId) -> Result<Option<BlockKey>> {
        self.check_page(page)?;
        let key = self.prefix.remove_page(page);
        if let Some(key) = key {
            if self.ref_counts[page.idx()] == 0 {
                self.n_cached_free -= 1;
            }
            self.evictions.push(Eviction { page, key });
        }
        Ok(key)
    }

    /// Drain the queued eviction notices, oldest first.
    pub fn take_evictions(&mut self) -> Vec<Eviction> {
        std::mem::take(&mut self.evictions)
    }

    /// Drop every cached key (one notice each, in page order). Errors with `PagesInUse` while any page is in
    /// use, changing nothing: a forced reset frees the requests first.
    pub fn reset_prefix_cache(&mut self) -> Result<()> {
        let n_in_use = self.n_in_use();
        if n_in_use > 0 {
            return Err(Error::PagesInUse { n: n_in_use });
        }
        let dropped: Vec<PageId> = self.prefix.iter_pages().map(|(page, _)| page).collect();
        for page in dropped {
            if let Some(key) = self.prefix.remove_page(page) {
                self.evictions.push(Eviction { page, key });
            }
        }
        self.n_cached_free = 0;
        Ok(())
    }

    /// Assert every invariant of the pool (O(n); for tests and simulations, after every step):
    /// `n_free + n_in_use + 1 == n_total`, the free list is consistent and holds exactly the unreferenced
    /// usable pages, the null page is unreferenced and uncached, `n_cached_free` matches, and the prefix
    /// index and per-page keys are inverse maps.
    pub fn check_invariants(&self) {
        self.free_list.check_invariants();
        self.prefix.check_invariants();
        assert_eq!(self.ref_counts.len(), self.n_pages as usize);
        assert_eq!(self.ref_counts[0], 0, "the null page is referenced");
        assert!(!self.free_list.contains(0), "the null page is free");
        let mut n_free = 0;
        let mut n_in_use = 0;
        let mut n_cached_free = 0;
        for page in 1..self.n_pages {
            let free = self.ref_counts[page as usize] == 0;
            assert_eq!(
                free,
                self.free_list.contains(page),
                "page {page}: free list membership disagrees with ref count {}",
                self.ref_counts[page as usize]
            );
            if free {
                n_free += 1;
                if self.prefix.holds_key(PageId(page)) {
                    n_cached_free += 1;
                }
            } else {
                n_in_use += 1;
            }
        }
        assert_eq!(
            n_free,
            self.n_free(),
            "free counter disagrees with the pages"
        );
        assert_eq!(
            n_in_use,
            self.n_in_use(),
            "in-use counter disagrees with the pages"
        );
        assert_eq!(
            n_cached_free, self.n_cached_free,
            "cached-free counter disagrees with the pages"
        );
        assert_eq!(
            n_free + n_in_use + 1,
            self.n_total(),
            "free + in use + null != total"
        );
    }

    /// Free pages from the LRU end (next to be reused) to the MRU end. O(n); for tests and diagnostics.
    pub fn free_pages_lru(&self) -> Vec<PageId> {
        self.free_list.iter_lru().map(PageId).collect()
    }

    #[inline]
    fn check_page(&self, page: PageId) -> Result<()> {
        if page.is_null() {
            return Err(Error::NullPage);
        }
        if page.0 >= self.n_pages {
            return Err(Error::PageOutOfRange {
                page: page.0,
                n_pages: self.n_pages,
            });
        }
        Ok(())
    }

    /// `page` reached reference count 0: append it to the MRU end of the free list.
    #[inline]
    fn release(&mut self, page: PageId) {
        self.free_list.push_mru(page.0);
        if self.prefix.holds_key(page) {
            self.n_cached_free += 1;
        }
    }
}
