//! The `PagePool`: a fixed set of pages, page 0 the null page; per-page reference counts; the free pages on
//! a stack (uncached) and an index-linked LRU list (cached): O(1) allocate, free and touch, no heap node per
//! page; the prefix index of cached blocks; and lazy eviction: a freed page that holds a cached block keeps
//! its key (a later prefix hit takes it back with `touch`) until an allocation reuses it and drops the key.
//!
//! Evictions are silent: an evicted block's key is gone from `lookup`, and no one is told. No one needs to
//! be: the resident checkpoint index's pages hold references, so the pool never evicts them. A consumer that
//! follows the cache (the engine's KV events) turns on `record_prefix_changes` and drains the ordered
//! `PrefixChange`s: every key registered, every key dropped (evicted, uncached), and each reset.
//!
//! Reuse policy: uncached free pages are reused first (LIFO); cached free pages are evicted in LRU order
//! only when no uncached page is left. A page that becomes an uncached free page (freed without a key, or a
//! free page whose key is dropped by `uncache` or `reset_prefix_cache`) goes on top of the stack; a page
//! freed with a key goes to the MRU end of the LRU list. So the cache lives as long as clean pages remain,
//! and the hot path (one page allocated and freed again) keeps reusing the same, cache-warm page.
//!
//! Sized to use: pages are first handed out in id order, and the per-page bookkeeping (page words, free
//! lists, the prefix index) covers only the pages up to the highest one handed out so far, growing by
//! doubling; a page beyond it is free, uncached and unreferenced without an entry. A pool of 4 Mi pages of
//! which a request touched ten holds a few kilobytes, not the 300 MB its bookkeeping takes when every page
//! has been used (72 to 88 bytes a page, `BOOKKEEPING_BYTES_PER_PAGE_MAX`).

mod free_list;
#[cfg(test)]
mod model_tests;
mod prefix;
#[cfg(test)]
mod tests;

use crate::error::{Error, Result};
use crate::page::{BlockKey, PageId};
use crate::{ensure, ensure_eq};

use free_list::FreeList;
use prefix::PrefixIndex;

/// Flag bit of a page word: the page holds a cached block key (mirrors the prefix index, so `free` decides
/// where a page goes from the one word it already reads).
const CACHED: u32 = 1 << 31;

/// Reference-count bits of a page word.
const REF_MASK: u32 = CACHED - 1;

/// Pages a new pool covers with bookkeeping before any is handed out: the null page and the first page. The
/// bookkeeping then doubles as pages are handed out (a pool's first dozen allocations grow it a few times,
/// which the small pools of the tests exercise).
const COVERED_INITIAL: u32 = 2;

/// What the pool keeps per page, in one place: the eviction path reads the reference count, whether the page
/// holds a key and that key's hash bits (which name its entry in the prefix index's table) in one load.
#[derive(Debug, Clone, Copy, Default)]
struct PageWord {
    /// Reference count (`REF_MASK` bits) and whether the page holds a key (`CACHED`).
    word: u32,
    /// The low 32 bits of the hash of the key the page holds (meaningless unless `CACHED`).
    key_bits: u32,
}

/// A change of the prefix index, recorded in order while `PagePool::record_prefix_changes` is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefixChange {
    /// A page now caches the key (`cache_block` registered it; not when another page already held it).
    Stored(BlockKey),
    /// The key is gone: its page was reused (evicted) or uncached.
    Removed(BlockKey),
    /// `reset_prefix_cache` dropped every key (no `Removed` for them).
    Cleared,
}

/// Pages, reference counts, the free lists and the prefix index. Sans-IO and single-threaded.
///
/// Invariants (checked by `check_invariants`): `n_free + n_in_use + 1 == n_total`; a page is free (on a
/// free list) exactly when its reference count is 0 (the null page never is); a free page is on the LRU
/// list of cached free pages when it holds a key and on the stack of uncached free pages otherwise, so
/// `n_cached_free` counts the free pages that hold a key; each page word's cached flag says whether the
/// prefix index holds a key for the page; the prefix index and the per-page keys are inverse maps.
#[derive(Clone)]
pub struct PagePool {
    n_pages: u32,
    /// Per page: its reference count, whether it holds a key, and that key's hash bits.
    page_words: Vec<PageWord>,
    free_list: FreeList,
    prefix: PrefixIndex,
    /// The prefix changes not yet taken, while recording (`record_prefix_changes`); `None`: not recording.
    changes: Option<Vec<PrefixChange>>,
}

impl std::fmt::Debug for PagePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PagePool")
            .field("n_total", &self.n_total())
            .field("n_free", &self.n_free())
            .field("n_cached_free", &self.n_cached_free())
            .field("n_in_use", &self.n_in_use())
            .field("n_cached", &self.prefix.len())
            .finish()
    }
}

impl PagePool {
    /// Bytes of bookkeeping a pool holds per page once every page has been handed out, at most: the page
    /// word (8), the free lists (16), the page's key (32) and its share of the key table (16 to 32, the
    /// table being a power of two at least twice the pages).
    pub const BOOKKEEPING_BYTES_PER_PAGE_MAX: u64 = 88;

    /// A pool of `n_pages` pages, the null page included; every usable page starts free and uncached, to
    /// be allocated in id order. Its bookkeeping grows with the pages handed out (the module's doc). Errors
    /// with `PoolTooSmall` below 2 pages (and at `u32::MAX`, which the free lists reserve).
    pub fn new(n_pages: u32) -> Result<PagePool> {
        if n_pages < 2 || n_pages == u32::MAX {
            return Err(Error::PoolTooSmall { n_pages });
        }
        let n_covered = n_pages.min(COVERED_INITIAL);
        Ok(PagePool {
            n_pages,
            page_words: vec![PageWord::default(); n_covered as usize],
            free_list: FreeList::new(n_pages, n_covered),
            prefix: PrefixIndex::new(n_covered),
            changes: None,
        })
    }

    /// Pages in the pool, the null page included.
    pub fn n_total(&self) -> u32 {
        self.n_pages
    }

    /// Bytes of per-page bookkeeping the pool holds now (reference counts, free lists, prefix index).
    pub fn bookkeeping_bytes(&self) -> usize {
        self.page_words.capacity() * std::mem::size_of::<PageWord>()
            + self.free_list.bookkeeping_bytes()
            + self.prefix.bookkeeping_bytes()
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
    #[inline]
    pub fn n_cached_free(&self) -> u32 {
        self.free_list.n_cached()
    }

    /// Pages with a reference count above zero.
    #[inline]
    pub fn n_in_use(&self) -> u32 {
        self.n_usable() - self.n_free()
    }

    /// Allocate `n` pages, each with reference count 1: uncached free pages first, most recently freed
    /// first (LIFO); then, only when none is left, cached free pages in LRU order (least recently freed
    /// first). All or nothing: with fewer than `n` free pages it errors with `OutOfPages` and changes
    /// nothing. Reused cached pages lose their keys.
    pub fn allocate(&mut self, n: u32) -> Result<Vec<PageId>> {
        // Capacity bounded by the free count, so an absurd `n` fails without a huge allocation.
        let mut out = Vec::with_capacity(n.min(self.n_free()) as usize);
        self.allocate_into(n, &mut out)?;
        Ok(out)
    }

    /// Allocate one page: the most recently freed uncached page, else the least recently freed cached page
    /// (evicted: it loses its key). The single-page path of decode growth. Errors with `OutOfPages`
    /// and changes nothing when no page is free.
    #[inline]
    pub fn allocate_one(&mut self) -> Result<PageId> {
        if let Some(page) = self.free_list.pop_stacked() {
            let page = PageId(page);
            self.take_free_page_word(page);
            return Ok(page);
        }
        let mut out = Vec::with_capacity(1);
        self.allocate_into(1, &mut out)?;
        Ok(out[0])
    }

    /// `allocate`, appending the pages to `out` (no heap allocation when `out` has room). On error `out` is
    /// unchanged.
    #[inline]
    pub(crate) fn allocate_into(&mut self, n: u32, out: &mut Vec<PageId>) -> Result<()> {
        let n_stacked = self.free_list.n_stacked();
        if n <= n_stacked {
            // The hot path: pages freed before, most recently freed first.
            for _ in 0..n {
                let page = self.free_list.pop_stacked();
                debug_assert!(page.is_some(), "stack shorter than its length");
                let Some(page) = page else { break };
                self.take_free_page(PageId(page), out);
            }
            return Ok(());
        }
        let free = self.n_free();
        if n > free {
            return Err(Error::OutOfPages { requested: n, free });
        }
        out.reserve(n as usize);
        while let Some(page) = self.free_list.pop_stacked() {
            self.take_free_page(PageId(page), out);
        }
        // Then pages never taken, in id order, covered first.
        let n_fresh = (n - n_stacked).min(self.free_list.n_fresh());
        self.take_fresh(n_fresh, out);
        let n_uncached = n_stacked + n_fresh;
        // Then cached pages from the LRU end, each losing its key.
        for _ in n_uncached..n {
            let page = self.free_list.pop_cached_lru();
            debug_assert!(page.is_some(), "lru list shorter than its counter");
            let Some(page) = page else { break };
            let page = PageId(page);
            let removed = self.drop_key(page);
            debug_assert!(removed, "cached free {page:?} holds no key");
            self.take_free_page(page, out);
        }
        Ok(())
    }

    /// Drop one reference to `page`. At zero it becomes free: on top of the stack of uncached free pages
    /// when it holds no key, else at the MRU end of the LRU list, keeping its key. Errors: `NullPage`,
    /// `PageOutOfRange`, `DoubleFree` (reference count already 0).
    #[inline]
    pub fn free(&mut self, page: PageId) -> Result<()> {
        // `get` is the range check (one word per covered page), so the hot path checks once; the null
        // page's word is always 0, so it is told apart from a double free off the hot path. A page beyond the
        // covered ones was never handed out.
        let Some(PageWord { word, .. }) = self.page_words.get_mut(page.idx()) else {
            if page.0 < self.n_pages {
                return Err(Error::DoubleFree { page: page.0 });
            }
            return Err(Error::PageOutOfRange {
                page: page.0,
                n_pages: self.n_pages,
            });
        };
        if *word & REF_MASK == 0 {
            if page.is_null() {
                return Err(Error::NullPage);
            }
            return Err(Error::DoubleFree { page: page.0 });
        }
        *word -= 1;
        let word = *word;
        if word & REF_MASK == 0 {
            self.release(page, word);
        }
        Ok(())
    }

    /// Free every page of `pages` in reverse order, so a request's tail blocks sit nearer the LRU end and
    /// are evicted first (as vLLM), and its uncached head pages are reused first: the same as calling `free`
    /// on each from the last, but all or nothing.
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
            // A page beyond the covered ones was never handed out: unreferenced.
            let Some(PageWord { word, .. }) = self.page_words.get_mut(page.idx()) else {
                failed = Some(page);
                break;
            };
            if *word & REF_MASK == 0 {
                failed = Some(page);
                break;
            }
            *word -= 1;
            n_taken += 1;
        }
        for &page in pages.iter().rev().take(n_taken) {
            self.page_words[page.idx()].word += 1;
        }
        if let Some(page) = failed {
            return Err(Error::DoubleFree { page: page.0 });
        }
        for &page in pages.iter().rev() {
            let word = self.page_words[page.idx()].word - 1;
            self.page_words[page.idx()].word = word;
            if word & REF_MASK == 0 {
                self.release(page, word);
            }
        }
        Ok(())
    }

    /// Add one reference to `page`. A free page (typically a cached one found by a prefix lookup) leaves its
    /// free list in O(1), the other free pages keeping their order, and keeps its key. Errors: `NullPage`,
    /// `PageOutOfRange`.
    #[inline]
    pub fn touch(&mut self, page: PageId) -> Result<()> {
        self.check_page(page)?;
        let word = self.word(page);
        if word & REF_MASK == 0 {
            if word & CACHED != 0 {
                self.free_list.remove_cached(page.0);
            } else if page.0 >= self.free_list.fresh() {
                self.cover(page);
                self.free_list.remove_fresh(page.0);
            } else {
                self.free_list.remove_uncached(page.0);
            }
        }
        debug_assert!(
            word & REF_MASK < REF_MASK,
            "reference count of {page:?} overflows"
        );
        self.page_words[page.idx()].word = word + 1;
        Ok(())
    }

    /// The reference count of `page`. Errors: `NullPage`, `PageOutOfRange`.
    #[inline]
    pub fn ref_count(&self, page: PageId) -> Result<u32> {
        self.check_page(page)?;
        Ok(self.word(page) & REF_MASK)
    }

    /// Register `page` (in use) as holding the block `key`. Returns `false`, changing nothing, when another
    /// page already caches `key`; `true` when registered (or when `page` already holds `key`). Errors:
    /// `NullPage`, `PageOutOfRange`, `PageNotInUse` (a free page), `PageAlreadyCached` (it holds another key).
    pub fn cache_block(&mut self, page: PageId, key: BlockKey) -> Result<bool> {
        self.check_page(page)?;
        let word = self.word(page);
        if word & REF_MASK == 0 {
            return Err(Error::PageNotInUse { page: page.0 });
        }
        if word & CACHED != 0 {
            if self.prefix.key_at(page) == key {
                return Ok(true);
            }
            return Err(Error::PageAlreadyCached { page: page.0 });
        }
        let Some(key_bits) = self.prefix.insert(page, key) else {
            return Ok(false);
        };
        self.page_words[page.idx()] = PageWord {
            word: word | CACHED,
            key_bits,
        };
        if let Some(changes) = &mut self.changes {
            changes.push(PrefixChange::Stored(key));
        }
        Ok(true)
    }

    /// Starts (`true`) or stops recording the prefix changes for `take_prefix_changes`. Stopping drops the
    /// changes not yet taken. Off by default: the pool then keeps no log.
    pub fn record_prefix_changes(&mut self, on: bool) {
        self.changes = on.then(|| self.changes.take().unwrap_or_default());
    }

    /// The prefix changes recorded since the last call, oldest first (none when not recording). The log
    /// holds what happened between two calls: a consumer that drains it after each operation keeps it short.
    pub fn take_prefix_changes(&mut self) -> Vec<PrefixChange> {
        self.changes
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Number of keys cached (on free and in-use pages).
    pub fn n_cached(&self) -> usize {
        self.prefix.len()
    }

    /// Every cached key, in page order. O(pages handed out); for tests and diagnostics.
    pub fn cached_keys(&self) -> Vec<BlockKey> {
        (1..self.n_covered())
            .map(PageId)
            .filter(|&page| self.holds_key(page))
            .map(|page| self.prefix.key_at(page))
            .collect()
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
        Ok(self.holds_key(page).then(|| self.prefix.key_at(page)))
    }

    /// Drop `page`'s key now (invalidate the block); `true` when it held one. The page's reference count
    /// does not change. A free page so uncached moves from the LRU list to the top of the stack of uncached
    /// free pages. Errors: `NullPage`, `PageOutOfRange`.
    pub fn uncache(&mut self, page: PageId) -> Result<bool> {
        self.check_page(page)?;
        let removed = self.drop_key(page);
        if removed && self.page_words[page.idx()].word == 0 {
            self.free_list.remove_cached(page.0);
            self.free_list.push_uncached(page.0);
        }
        Ok(removed)
    }

    /// Drop every cached key, in page order; each page so uncached goes on top of the stack of uncached free
    /// pages in that order. Errors with `PagesInUse` while any page is in use, changing nothing: a forced
    /// reset frees the requests first.
    pub fn reset_prefix_cache(&mut self) -> Result<()> {
        let n_in_use = self.n_in_use();
        if n_in_use > 0 {
            return Err(Error::PagesInUse { n: n_in_use });
        }
        // Only covered pages were ever handed out, so only they can hold a key. One `Cleared` stands for
        // every key the reset drops.
        let changes = self.changes.take();
        for page in (1..self.n_covered()).map(PageId) {
            if self.drop_key(page) {
                self.free_list.remove_cached(page.0);
                self.free_list.push_uncached(page.0);
            }
        }
        self.changes = changes;
        if let Some(changes) = &mut self.changes {
            changes.push(PrefixChange::Cleared);
        }
        debug_assert_eq!(
            self.n_cached_free(),
            0,
            "cached free pages left after a reset"
        );
        Ok(())
    }

    /// Checks every invariant of the pool (O(n); for tests and simulations, after every step), returning
    /// `InvariantBroken` naming the first that fails:
    /// `n_free + n_in_use + 1 == n_total`, the free lists are consistent and hold exactly the unreferenced
    /// usable pages, the LRU list exactly those of them that hold a key and the stack the others, the null
    /// page is unreferenced and uncached, `n_cached_free` matches, and the prefix index and per-page keys are
    /// inverse maps.
    pub fn check_invariants(&self) -> Result<()> {
        let n_covered = self.n_covered();
        let listed = self.free_list.check_invariants()?;
        ensure_eq!(
            listed.len(),
            n_covered as usize,
            "page words and free lists cover different pages"
        );
        ensure!(
            (1..=self.n_pages).contains(&n_covered),
            "{n_covered} pages covered of {}",
            self.n_pages
        );
        ensure!(
            self.free_list.fresh() <= n_covered,
            "a page beyond the covered ones was handed out"
        );
        ensure_eq!(
            self.page_words[0].word,
            0,
            "the null page is referenced or cached"
        );
        self.prefix.check_invariants(
            n_covered,
            (1..n_covered)
                .map(PageId)
                .filter(|&page| self.holds_key(page))
                .map(|page| (page, self.page_words[page.idx()].key_bits)),
        )?;
        ensure!(!listed[0], "the null page is free");
        let (n_free, n_in_use, n_cached_free) = self.count_pages(n_covered, &listed)?;
        for page in self.free_list.iter_cached_lru() {
            ensure!(
                self.holds_key(PageId(page)),
                "page {page} on the LRU list holds no key"
            );
        }
        let covered = |&page: &u32| page < n_covered;
        for page in self.free_list.iter_uncached().take_while(covered) {
            ensure!(
                !self.holds_key(PageId(page)),
                "page {page} on the uncached stack holds a key"
            );
        }
        ensure_eq!(
            n_free,
            self.n_free(),
            "free counter disagrees with the pages"
        );
        ensure_eq!(
            n_in_use,
            self.n_in_use(),
            "in-use counter disagrees with the pages"
        );
        ensure_eq!(
            n_cached_free,
            self.n_cached_free(),
            "cached-free counter disagrees with the pages"
        );
        ensure_eq!(
            n_free + n_in_use + 1,
            self.n_total(),
            "free + in use + null != total"
        );
        Ok(())
    }

    /// Free, in-use and cached-free pages counted one by one (pages beyond the covered ones are free,
    /// uncached and fresh), each page's free-list membership checked against its reference count.
    fn count_pages(&self, n_covered: u32, listed: &[bool]) -> Result<(u32, u32, u32)> {
        // Pages beyond the covered ones are free, uncached and fresh.
        let mut n_free = self.n_pages - n_covered;
        let mut n_in_use = 0;
        let mut n_cached_free = 0;
        for page in 1..n_covered {
            let word = self.page_words[page as usize].word;
            let free = word & REF_MASK == 0;
            ensure_eq!(
                free,
                listed[page as usize],
                "page {page}: free list membership disagrees with ref count {}",
                word & REF_MASK
            );
            if free {
                n_free += 1;
                if self.holds_key(PageId(page)) {
                    n_cached_free += 1;
                }
            } else {
                n_in_use += 1;
            }
        }
        Ok((n_free, n_in_use, n_cached_free))
    }

    /// Free pages in the order allocations will take them: the uncached ones from the top of the stack
    /// down (most recently freed first), then the cached ones from the LRU end to the MRU end. O(n); for
    /// tests and diagnostics.
    #[cfg(test)]
    pub(crate) fn free_pages_in_reuse_order(&self) -> Vec<PageId> {
        self.free_list
            .iter_uncached()
            .chain(self.free_list.iter_cached_lru())
            .map(PageId)
            .collect()
    }

    /// Cached free pages (holding a key) from the LRU end (next to be evicted) to the MRU end. O(n); for
    /// tests and diagnostics.
    #[cfg(test)]
    pub(crate) fn cached_free_pages_lru(&self) -> Vec<PageId> {
        self.free_list.iter_cached_lru().map(PageId).collect()
    }

    /// Pages with bookkeeping: every page handed out so far is among them.
    #[inline]
    fn n_covered(&self) -> u32 {
        self.page_words.len() as u32
    }

    /// The word of `page` (in range): reference count and cached flag; 0 for a page beyond the covered
    /// ones, never handed out.
    #[inline]
    fn word(&self, page: PageId) -> u32 {
        self.page_words.get(page.idx()).map_or(0, |word| word.word)
    }

    /// Extends the bookkeeping to cover `page` (in range) and, so that a pool growing page by page does so
    /// in O(1) amortized, at least twice the pages covered now.
    #[cold]
    fn cover(&mut self, page: PageId) {
        let n_covered = self.n_covered();
        if page.0 < n_covered {
            return;
        }
        let n_covered = (page.0 + 1)
            .max(n_covered.saturating_mul(2))
            .min(self.n_pages);
        self.page_words
            .resize(n_covered as usize, PageWord::default());
        self.free_list.cover(n_covered);
        self.prefix.cover(n_covered);
    }

    /// Whether `page` (in range) holds a key.
    #[inline]
    fn holds_key(&self, page: PageId) -> bool {
        self.word(page) & CACHED != 0
    }

    /// Drops the key `page` (in range) holds from the prefix index and its word; `true` when it held one.
    /// Its reference count and free lists are the caller's.
    fn drop_key(&mut self, page: PageId) -> bool {
        let Some(&PageWord { word, key_bits }) = self.page_words.get(page.idx()) else {
            return false;
        };
        if word & CACHED == 0 {
            return false;
        }
        if let Some(changes) = &mut self.changes {
            changes.push(PrefixChange::Removed(self.prefix.key_at(page)));
        }
        self.prefix.remove(page, key_bits);
        self.page_words[page.idx()].word = word & !CACHED;
        true
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

    /// Give the free `page`, just taken off its free list and holding no key, reference count 1 and append
    /// it to `out`.
    #[inline]
    fn take_free_page(&mut self, page: PageId, out: &mut Vec<PageId>) {
        self.take_free_page_word(page);
        out.push(page);
    }

    /// Take the `n` lowest fresh pages (there are as many), covering them first, and append them to `out`.
    fn take_fresh(&mut self, n: u32, out: &mut Vec<PageId>) {
        if n == 0 {
            return;
        }
        self.cover(PageId(self.free_list.fresh() + n - 1));
        for _ in 0..n {
            let page = self.free_list.pop_fresh();
            debug_assert!(page.is_some(), "fewer fresh pages than counted");
            let Some(page) = page else { break };
            self.take_free_page(PageId(page), out);
        }
    }

    /// Give the free, key-less, covered `page` its first reference.
    #[inline]
    fn take_free_page_word(&mut self, page: PageId) {
        debug_assert!(page.0 < self.n_covered(), "{page:?} is not covered");
        debug_assert!(!self.holds_key(page), "{page:?} still holds a key");
        debug_assert_eq!(
            self.page_words[page.idx()].word & REF_MASK,
            0,
            "free page {page:?} is referenced"
        );
        // Its key bits are left as they are: meaningless without the cached flag.
        self.page_words[page.idx()].word = 1;
    }

    /// `page` (whose page word is now `word`) reached reference count 0: append it to the MRU end of the
    /// LRU list if it holds a key, else push it on top of the stack of uncached free pages.
    #[inline]
    fn release(&mut self, page: PageId, word: u32) {
        if word & CACHED != 0 {
            self.free_list.push_cached_mru(page.0);
        } else {
            self.free_list.push_uncached(page.0);
        }
    }
}
