//! Property tests: random operation sequences on a `PagePool` (allocate, free, free_all, touch a cached
//! page, cache_block, lookup, longest_prefix, uncache, reset, and misuse) checked after every step against a
//! simple reference model: a `Vec` for the stack of uncached free pages (reused first, LIFO), a `VecDeque`
//! for the LRU list of cached free pages (evicted only when the stack is empty), plain vectors for ref
//! counts and keys, a map for the cached keys.
#![allow(clippy::disallowed_methods, reason = "tests read PROPTEST_CASES")]

use std::collections::{HashMap, VecDeque};

use crate::{BlockKey, Error, PageId, PagePool};
use proptest::prelude::*;

const TOKENS_PER_BLOCK: usize = 4;
const BLOCKS_PER_SALT: usize = 6;
const SALTS: [&[u8]; 2] = [b"tenant-a", b"tenant-b"];

/// Block keys of one shared token sequence under each salt: `keys[salt][block]`.
fn key_universe() -> Vec<Vec<BlockKey>> {
    let tokens: Vec<u32> = (0..(TOKENS_PER_BLOCK * BLOCKS_PER_SALT) as u32).collect();
    SALTS
        .iter()
        .map(|salt| BlockKey::chain_all(&tokens, TOKENS_PER_BLOCK, salt))
        .collect()
}

#[derive(Debug, Clone)]
enum Op {
    Allocate(u32),
    /// Free one held reference (index into the held list, modulo its length).
    FreeHeld(usize),
    /// Free the last `k` held references with `free_all`.
    FreeAllTail(usize),
    /// Free an arbitrary page id, possibly invalid (null, out of range, double free).
    FreeAny(u32),
    /// Look up a key and touch the page that caches it (a prefix hit).
    TouchCached(usize, usize),
    /// Touch an arbitrary page id, possibly invalid.
    TouchAny(u32),
    /// Cache a key on the page of a held reference.
    CacheHeld(usize, usize, usize),
    /// Cache a key on an arbitrary page id.
    CacheAny(u32, usize, usize),
    Uncache(u32),
    LongestPrefix(usize, usize),
    Reset,
    /// Free every held reference, then reset (a forced reset).
    ForcedReset,
}

fn op_strategy(n_pages: u32) -> impl Strategy<Value = Op> {
    let any_page = 0..n_pages + 2;
    let salt = 0..SALTS.len();
    let block = 0..BLOCKS_PER_SALT;
    prop_oneof![
        6 => (0..5u32).prop_map(Op::Allocate),
        4 => any::<usize>().prop_map(Op::FreeHeld),
        2 => (0..6usize).prop_map(Op::FreeAllTail),
        1 => any_page.clone().prop_map(Op::FreeAny),
        3 => (salt.clone(), block.clone()).prop_map(|(s, b)| Op::TouchCached(s, b)),
        1 => any_page.clone().prop_map(Op::TouchAny),
        5 => (any::<usize>(), salt.clone(), block.clone()).prop_map(|(h, s, b)| Op::CacheHeld(h, s, b)),
        1 => (any_page.clone(), salt.clone(), block.clone()).prop_map(|(p, s, b)| Op::CacheAny(p, s, b)),
        1 => any_page.prop_map(Op::Uncache),
        2 => (salt, 1..=BLOCKS_PER_SALT).prop_map(|(s, n)| Op::LongestPrefix(s, n)),
        1 => Just(Op::Reset),
        1 => Just(Op::ForcedReset),
    ]
}

/// The reference model: obviously correct, O(n) everywhere.
struct Model {
    n_pages: u32,
    ref_counts: Vec<u32>,
    keys: Vec<Option<BlockKey>>,
    index: HashMap<BlockKey, PageId>,
    /// Free pages that hold no key, the top (next to be reused) last.
    stack: Vec<PageId>,
    /// Free pages that hold a key, the LRU end (next to be evicted) first.
    lru: VecDeque<PageId>,
}

impl Model {
    fn new(n_pages: u32) -> Model {
        Model {
            n_pages,
            ref_counts: vec![0; n_pages as usize],
            keys: vec![None; n_pages as usize],
            index: HashMap::new(),
            stack: (1..n_pages).rev().map(PageId).collect(),
            lru: VecDeque::new(),
        }
    }

    fn check(&self, page: PageId) -> Result<(), Error> {
        if page.0 == 0 {
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

    fn n_free(&self) -> usize {
        self.stack.len() + self.lru.len()
    }

    fn is_free(&self, page: PageId) -> bool {
        self.stack.contains(&page) || self.lru.contains(&page)
    }

    fn allocate(&mut self, n: u32) -> Result<Vec<PageId>, Error> {
        if n as usize > self.n_free() {
            return Err(Error::OutOfPages {
                requested: n,
                free: self.n_free() as u32,
            });
        }
        let from_stack = (n as usize).min(self.stack.len());
        let mut pages: Vec<PageId> = Vec::new();
        for _ in 0..from_stack {
            pages.push(self.stack.pop().unwrap());
        }
        let evicted: Vec<PageId> = self.lru.drain(..n as usize - from_stack).collect();
        for &page in &pages {
            self.ref_counts[page.idx()] = 1;
        }
        for page in evicted {
            self.ref_counts[page.idx()] = 1;
            self.drop_key(page);
            pages.push(page);
        }
        Ok(pages)
    }

    fn free(&mut self, page: PageId) -> Result<(), Error> {
        self.check(page)?;
        if self.ref_counts[page.idx()] == 0 {
            return Err(Error::DoubleFree { page: page.0 });
        }
        self.ref_counts[page.idx()] -= 1;
        if self.ref_counts[page.idx()] == 0 {
            if self.keys[page.idx()].is_some() {
                self.lru.push_back(page);
            } else {
                self.stack.push(page);
            }
        }
        Ok(())
    }

    fn free_all(&mut self, pages: &[PageId]) -> Result<(), Error> {
        for &page in pages {
            self.check(page)?;
        }
        let mut trial = self.ref_counts.clone();
        for &page in pages.iter().rev() {
            if trial[page.idx()] == 0 {
                return Err(Error::DoubleFree { page: page.0 });
            }
            trial[page.idx()] -= 1;
        }
        for &page in pages.iter().rev() {
            self.free(page).unwrap();
        }
        Ok(())
    }

    fn touch(&mut self, page: PageId) -> Result<(), Error> {
        self.check(page)?;
        if self.ref_counts[page.idx()] == 0 {
            if let Some(at) = self.lru.iter().position(|&p| p == page) {
                self.lru.remove(at);
            } else {
                // O(1) removal from the stack: the top page takes the hole.
                let at = self.stack.iter().position(|&p| p == page).unwrap();
                self.stack.swap_remove(at);
            }
        }
        self.ref_counts[page.idx()] += 1;
        Ok(())
    }

    fn cache_block(&mut self, page: PageId, key: BlockKey) -> Result<bool, Error> {
        self.check(page)?;
        if self.ref_counts[page.idx()] == 0 {
            return Err(Error::PageNotInUse { page: page.0 });
        }
        match self.keys[page.idx()] {
            Some(held) if held == key => return Ok(true),
            Some(_) => return Err(Error::PageAlreadyCached { page: page.0 }),
            None => {}
        }
        if self.index.contains_key(&key) {
            return Ok(false);
        }
        self.index.insert(key, page);
        self.keys[page.idx()] = Some(key);
        Ok(true)
    }

    /// Drop `page`'s key, `true` when it held one; a free page so uncached moves to the top of the stack.
    fn drop_key(&mut self, page: PageId) -> bool {
        let Some(key) = self.keys[page.idx()].take() else {
            return false;
        };
        self.index.remove(&key);
        if let Some(at) = self.lru.iter().position(|&p| p == page) {
            self.lru.remove(at);
            self.stack.push(page);
        }
        true
    }

    fn reset(&mut self) -> Result<(), Error> {
        let n = self.ref_counts.iter().filter(|&&r| r > 0).count() as u32;
        if n > 0 {
            return Err(Error::PagesInUse { n });
        }
        for page in 1..self.n_pages {
            self.drop_key(PageId(page));
        }
        Ok(())
    }

    fn longest_prefix(&self, keys: &[BlockKey]) -> Vec<PageId> {
        keys.iter()
            .map_while(|key| self.index.get(key).copied())
            .collect()
    }
}

/// Compare every observable of the pool with the model, and the invariants that need no model.
fn assert_agrees(pool: &PagePool, model: &Model, universe: &[Vec<BlockKey>]) {
    pool.check_invariants().unwrap();
    let n_in_use = model.ref_counts.iter().filter(|&&r| r > 0).count() as u32;
    // The model's own split: the stack holds exactly the uncached free pages, the LRU list the cached ones.
    assert!(model.stack.iter().all(|p| model.keys[p.idx()].is_none()));
    assert!(model.lru.iter().all(|p| model.keys[p.idx()].is_some()));
    // free + in use + null == total.
    assert_eq!(pool.n_free() + pool.n_in_use() + 1, pool.n_total());
    assert_eq!(pool.n_free(), model.n_free() as u32);
    assert_eq!(pool.n_in_use(), n_in_use);
    assert_eq!(pool.n_cached_free(), model.lru.len() as u32);
    // LRU order among cached free pages, and the whole reuse order (stack top first, then the LRU list).
    assert_eq!(pool.cached_free_pages_lru(), Vec::from(model.lru.clone()));
    let reuse_order: Vec<PageId> = model
        .stack
        .iter()
        .rev()
        .chain(model.lru.iter())
        .copied()
        .collect();
    assert_eq!(pool.free_pages_in_reuse_order(), reuse_order);
    assert_eq!(pool.free_pages_in_reuse_order(), reuse_order);
    for page in 1..model.n_pages {
        let page = PageId(page);
        let ref_count = pool.ref_count(page).unwrap();
        assert_eq!(
            ref_count,
            model.ref_counts[page.idx()],
            "ref count of {page:?}"
        );
        // No page both free and referenced.
        assert_eq!(
            ref_count == 0,
            model.is_free(page),
            "{page:?} free and referenced"
        );
        assert_eq!(
            pool.key_of(page).unwrap(),
            model.keys[page.idx()],
            "key of {page:?}"
        );
    }
    // The cached keys are the model's: every key the model dropped (an eviction, `uncache`, a reset) is gone
    // from lookups, and every key it keeps is found on its page.
    for key in universe.iter().flatten() {
        assert_eq!(
            pool.lookup(key),
            model.index.get(key).copied(),
            "lookup of {key:?}"
        );
    }
    // Salted keys never shared: no page is found under two salts.
    for key_a in &universe[0] {
        for key_b in &universe[1] {
            if let (Some(a), Some(b)) = (pool.lookup(key_a), pool.lookup(key_b)) {
                assert_ne!(a, b, "one page cached under two salts");
            }
        }
    }
}

/// Keys of `universe` the pool finds (every key it can hold is one of them).
fn n_cached_keys(pool: &PagePool, universe: &[Vec<BlockKey>]) -> usize {
    universe
        .iter()
        .flatten()
        .filter(|key| pool.lookup(key).is_some())
        .count()
}

fn pick(held: &[PageId], h: usize) -> Option<usize> {
    (!held.is_empty()).then(|| h % held.len())
}

fn run_ops(n_pages: u32, ops: &[Op]) {
    let universe = key_universe();
    let mut pool = PagePool::new(n_pages).unwrap();
    let mut model = Model::new(n_pages);
    // One entry per reference the test holds.
    let mut held: Vec<PageId> = Vec::new();
    for op in ops {
        match *op {
            Op::Allocate(n) => {
                let n_uncached_free = pool.n_free() - pool.n_cached_free();
                let n_keys = n_cached_keys(&pool, &universe);
                let got = pool.allocate(n);
                assert_eq!(got, model.allocate(n));
                // Uncached pages are reused before any cached page is evicted: the pool loses exactly one
                // key per cached page the allocation took (none when it failed).
                let n_evicted = if got.is_ok() {
                    n.saturating_sub(n_uncached_free) as usize
                } else {
                    0
                };
                assert_eq!(
                    n_cached_keys(&pool, &universe) + n_evicted,
                    n_keys,
                    "evicted while uncached free pages were left, or kept an evicted key"
                );
                held.extend(got.unwrap_or_default());
            }
            Op::FreeHeld(h) => {
                if let Some(at) = pick(&held, h) {
                    let page = held.swap_remove(at);
                    assert_eq!(pool.free(page), model.free(page));
                }
            }
            Op::FreeAllTail(k) => {
                let tail = held.split_off(held.len().saturating_sub(k));
                assert_eq!(pool.free_all(&tail), Ok(()));
                model.free_all(&tail).unwrap();
            }
            Op::FreeAny(page) => {
                let page = PageId(page);
                let got = pool.free(page);
                assert_eq!(got, model.free(page));
                if got.is_ok() {
                    let at = held.iter().position(|&p| p == page).unwrap();
                    held.swap_remove(at);
                }
            }
            Op::TouchCached(salt, block) => {
                let key = universe[salt][block];
                assert_eq!(pool.lookup(&key), model.index.get(&key).copied());
                if let Some(page) = pool.lookup(&key) {
                    assert_eq!(pool.touch(page), model.touch(page));
                    held.push(page);
                }
            }
            Op::TouchAny(page) => {
                let page = PageId(page);
                let got = pool.touch(page);
                assert_eq!(got, model.touch(page));
                if got.is_ok() {
                    held.push(page);
                }
            }
            Op::CacheHeld(h, salt, block) => {
                if let Some(at) = pick(&held, h) {
                    let key = universe[salt][block];
                    assert_eq!(
                        pool.cache_block(held[at], key),
                        model.cache_block(held[at], key)
                    );
                }
            }
            Op::CacheAny(page, salt, block) => {
                let key = universe[salt][block];
                assert_eq!(
                    pool.cache_block(PageId(page), key),
                    model.cache_block(PageId(page), key)
                );
            }
            Op::Uncache(page) => {
                let page = PageId(page);
                let expected = model.check(page).map(|()| model.drop_key(page));
                assert_eq!(pool.uncache(page), expected);
            }
            Op::LongestPrefix(salt, n) => {
                let keys = &universe[salt][..n];
                assert_eq!(pool.longest_prefix(keys), model.longest_prefix(keys));
            }
            Op::Reset => assert_eq!(pool.reset_prefix_cache(), model.reset()),
            Op::ForcedReset => {
                assert_eq!(pool.free_all(&held), Ok(()));
                model.free_all(&held).unwrap();
                held.clear();
                assert_eq!(pool.reset_prefix_cache(), Ok(()));
                model.reset().unwrap();
                assert_eq!(
                    pool.n_free(),
                    pool.n_usable(),
                    "every page but the null page is free"
                );
                assert_eq!(pool.n_cached_free(), 0);
            }
        }
        assert_agrees(&pool, &model, &universe);
    }
}

fn pool_and_ops() -> impl Strategy<Value = (u32, Vec<Op>)> {
    (2..14u32).prop_flat_map(|n_pages| {
        (
            Just(n_pages),
            prop::collection::vec(op_strategy(n_pages), 1..120),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        // PROPTEST_CASES overrides the count (e.g. 10x before a release).
        std::env::var("PROPTEST_CASES").ok().and_then(|cases| cases.parse().ok()).unwrap_or(192)
    ))]

    /// Any sequence of pool operations (valid or misuse) agrees with the reference model after every step:
    /// free + in use + null == total, no page both free and referenced, ref counts never negative (misuse
    /// is an error that changes nothing), uncached free pages reused first (LIFO) and before any cached page
    /// is evicted, LRU order among cached free pages, the cached keys (each page's key and every key's
    /// lookup) those of the model, so an evicted key is gone and a surviving one is found, and keys of
    /// different salts never share a page.
    #[test]
    fn prop_pool_matches_reference_model((n_pages, ops) in pool_and_ops()) {
        run_ops(n_pages, &ops);
    }

    /// Requests with different salts never share a page: caching a salted chain and looking it up under
    /// another salt finds nothing, however the chains overlap in tokens.
    #[test]
    fn prop_salted_chains_never_share_pages(
        tokens in prop::collection::vec(0..4u32, 4..40),
        salt_a in prop::collection::vec(any::<u8>(), 0..8),
        salt_b in prop::collection::vec(any::<u8>(), 0..8),
    ) {
        prop_assume!(salt_a != salt_b);
        let keys_a = BlockKey::chain_all(&tokens, TOKENS_PER_BLOCK, &salt_a);
        let keys_b = BlockKey::chain_all(&tokens, TOKENS_PER_BLOCK, &salt_b);
        let mut pool = PagePool::new(keys_a.len() as u32 + 1).unwrap();
        let pages = pool.allocate(keys_a.len() as u32).unwrap();
        for (&page, &key) in pages.iter().zip(&keys_a) {
            prop_assert_eq!(pool.cache_block(page, key), Ok(true));
        }
        pool.free_all(&pages).unwrap();
        prop_assert_eq!(pool.longest_prefix(&keys_a), pages);
        prop_assert!(pool.longest_prefix(&keys_b).is_empty());
        prop_assert!(keys_b.iter().all(|key| pool.lookup(key).is_none()));
    }
}
