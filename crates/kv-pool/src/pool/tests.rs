//! Unit tests of the page pool: every operation and every error, the reuse order (uncached free pages LIFO
//! first, cached free pages in LRU order only when no uncached page is left), lazy eviction (an evicted
//! block's key is gone from lookups, a surviving block's stays), and salted prefix keys.

use super::PagePool;
use crate::error::Error;
use crate::page::{BlockKey, PageId};

fn key(n: u32) -> BlockKey {
    BlockKey::chain(None, &[n], b"")
}

fn ids(pages: &[u32]) -> Vec<PageId> {
    pages.iter().copied().map(PageId).collect()
}

#[test]
fn new_counts_pages_and_rejects_tiny_pools() {
    let pool = PagePool::new(5).unwrap();
    assert_eq!(pool.n_total(), 5);
    assert_eq!(pool.n_usable(), 4);
    assert_eq!(pool.n_free(), 4);
    assert_eq!(pool.n_cached_free(), 0);
    assert_eq!(pool.n_in_use(), 0);
    assert_eq!(pool.free_pages_in_reuse_order(), ids(&[1, 2, 3, 4]));
    pool.check_invariants().unwrap();
    assert_eq!(
        PagePool::new(0).unwrap_err(),
        Error::PoolTooSmall { n_pages: 0 }
    );
    assert_eq!(
        PagePool::new(1).unwrap_err(),
        Error::PoolTooSmall { n_pages: 1 }
    );
    assert!(PagePool::new(2).is_ok());
}

#[test]
fn allocate_takes_a_new_pool_in_id_order_with_ref_one_and_never_the_null_page() {
    let mut pool = PagePool::new(5).unwrap();
    let pages = pool.allocate(2).unwrap();
    assert_eq!(pages, ids(&[1, 2]));
    for &page in &pages {
        assert_eq!(pool.ref_count(page), Ok(1));
    }
    assert_eq!((pool.n_free(), pool.n_in_use()), (2, 2));
    assert_eq!(pool.allocate(2).unwrap(), ids(&[3, 4]));
    assert_eq!(pool.allocate(0).unwrap(), ids(&[]));
    pool.check_invariants().unwrap();
}

#[test]
fn allocate_is_all_or_nothing() {
    let mut pool = PagePool::new(4).unwrap();
    assert_eq!(
        pool.allocate(4).unwrap_err(),
        Error::OutOfPages {
            requested: 4,
            free: 3
        }
    );
    assert_eq!(pool.n_free(), 3);
    assert_eq!(pool.free_pages_in_reuse_order(), ids(&[1, 2, 3]));
    pool.allocate(3).unwrap();
    assert_eq!(
        pool.allocate(1).unwrap_err(),
        Error::OutOfPages {
            requested: 1,
            free: 0
        }
    );
    assert_eq!(
        pool.allocate(u32::MAX).unwrap_err(),
        Error::OutOfPages {
            requested: u32::MAX,
            free: 0
        }
    );
    pool.check_invariants().unwrap();
}

#[test]
fn allocate_into_appends_and_leaves_out_unchanged_on_error() {
    let mut pool = PagePool::new(4).unwrap();
    let mut out = vec![PageId(9)];
    pool.allocate_into(2, &mut out).unwrap();
    assert_eq!(out, ids(&[9, 1, 2]));
    assert_eq!(
        pool.allocate_into(2, &mut out).unwrap_err(),
        Error::OutOfPages {
            requested: 2,
            free: 1
        }
    );
    assert_eq!(out, ids(&[9, 1, 2]));
}

#[test]
fn allocate_one_follows_the_reuse_order_evicts_the_key_and_errors_when_empty() {
    let mut pool = PagePool::new(3).unwrap();
    let (a, b) = (pool.allocate_one().unwrap(), pool.allocate_one().unwrap());
    assert_eq!((a, b), (PageId(1), PageId(2)));
    assert_eq!(pool.ref_count(a).unwrap(), 1);
    assert_eq!(
        pool.allocate_one().unwrap_err(),
        Error::OutOfPages {
            requested: 1,
            free: 0
        }
    );
    assert!(pool.cache_block(a, key(1)).unwrap());
    pool.free(a).unwrap();
    pool.free(b).unwrap();
    // The uncached page first, the cached one keeping its key; then the cached one, evicted.
    assert_eq!(pool.allocate_one().unwrap(), b);
    assert_eq!(pool.lookup(&key(1)), Some(a));
    assert_eq!(pool.n_cached_free(), 1);
    assert_eq!(pool.allocate_one().unwrap(), a);
    assert_eq!(pool.lookup(&key(1)), None);
    assert_eq!(pool.key_of(a), Ok(None));
    assert_eq!(pool.n_cached_free(), 0);
    pool.check_invariants().unwrap();
}

#[test]
fn uncached_free_pages_are_reused_most_recently_freed_first() {
    let mut pool = PagePool::new(5).unwrap();
    let pages = pool.allocate(4).unwrap();
    pool.free(pages[2]).unwrap();
    pool.free(pages[0]).unwrap();
    assert_eq!(pool.free_pages_in_reuse_order(), ids(&[1, 3]));
    assert_eq!(pool.free_pages_in_reuse_order(), ids(&[1, 3]));
    assert_eq!(pool.cached_free_pages_lru(), ids(&[]));
    assert_eq!(pool.allocate(1).unwrap(), ids(&[1]));
    assert_eq!(pool.allocate(1).unwrap(), ids(&[3]));
    pool.check_invariants().unwrap();
}

#[test]
fn cached_free_pages_are_evicted_in_lru_order_only_when_no_uncached_page_is_left() {
    let mut pool = PagePool::new(7).unwrap();
    let pages = pool.allocate(6).unwrap();
    // Pages 1, 3, 5 cache blocks; 2, 4, 6 do not. Freed interleaved: 1, 2, 3, 4, 5, 6.
    for (n, &page) in pages.iter().enumerate().step_by(2) {
        pool.cache_block(page, key(n as u32)).unwrap();
    }
    for &page in &pages {
        pool.free(page).unwrap();
    }
    assert_eq!((pool.n_free(), pool.n_cached_free()), (6, 3));
    assert_eq!(pool.cached_free_pages_lru(), ids(&[1, 3, 5]));
    assert_eq!(pool.free_pages_in_reuse_order(), ids(&[6, 4, 2, 1, 3, 5]));
    // Uncached pages first, LIFO, with no eviction while any is left: every key is still found.
    assert_eq!(pool.allocate(2).unwrap(), ids(&[6, 4]));
    assert_eq!(pool.n_cached_free(), 3);
    for (n, page) in [(0, 1), (2, 3), (4, 5)] {
        assert_eq!(pool.lookup(&key(n)), Some(PageId(page)), "key {n}");
    }
    // The last uncached page, then the cached ones from the LRU end: those two lose their keys.
    assert_eq!(pool.allocate(3).unwrap(), ids(&[2, 1, 3]));
    assert_eq!((pool.lookup(&key(0)), pool.lookup(&key(2))), (None, None));
    assert_eq!(
        (pool.key_of(PageId(1)), pool.key_of(PageId(3))),
        (Ok(None), Ok(None))
    );
    assert_eq!(pool.n_cached_free(), 1);
    assert_eq!(pool.lookup(&key(4)), Some(PageId(5)));
    pool.check_invariants().unwrap();
}

#[test]
fn a_freed_uncached_page_is_reused_before_an_older_cached_one() {
    let mut pool = PagePool::new(3).unwrap();
    let pages = pool.allocate(2).unwrap();
    pool.cache_block(pages[0], key(1)).unwrap();
    pool.free(pages[0]).unwrap();
    pool.free(pages[1]).unwrap();
    assert_eq!(pool.allocate(1).unwrap(), vec![pages[1]]);
    assert_eq!(pool.lookup(&key(1)), Some(pages[0]), "the cache survives");
    assert_eq!(pool.n_cached_free(), 1);
    pool.check_invariants().unwrap();
}

#[test]
fn free_errors_name_the_page() {
    let mut pool = PagePool::new(3).unwrap();
    assert_eq!(pool.free(PageId::NULL).unwrap_err(), Error::NullPage);
    assert_eq!(
        pool.free(PageId(3)).unwrap_err(),
        Error::PageOutOfRange {
            page: 3,
            n_pages: 3
        }
    );
    assert_eq!(
        pool.free(PageId(1)).unwrap_err(),
        Error::DoubleFree { page: 1 }
    );
    let pages = pool.allocate(1).unwrap();
    pool.free(pages[0]).unwrap();
    assert_eq!(
        pool.free(pages[0]).unwrap_err(),
        Error::DoubleFree { page: 1 }
    );
    pool.check_invariants().unwrap();
}

#[test]
fn shared_page_is_free_only_after_last_reference() {
    let mut pool = PagePool::new(3).unwrap();
    let page = pool.allocate(1).unwrap()[0];
    pool.touch(page).unwrap();
    assert_eq!(pool.ref_count(page), Ok(2));
    pool.free(page).unwrap();
    assert_eq!((pool.ref_count(page), pool.n_free()), (Ok(1), 1));
    pool.free(page).unwrap();
    assert_eq!((pool.ref_count(page), pool.n_free()), (Ok(0), 2));
    pool.check_invariants().unwrap();
}

#[test]
fn free_all_frees_in_reverse_order() {
    let mut pool = PagePool::new(5).unwrap();
    let pages = pool.allocate(4).unwrap();
    pool.free_all(&pages).unwrap();
    // Uncached: the head page was freed last, so it is on top and reused first.
    assert_eq!(pool.free_pages_in_reuse_order(), ids(&[1, 2, 3, 4]));
    assert_eq!(pool.n_in_use(), 0);
    let pages = pool.allocate(4).unwrap();
    for (n, &page) in pages.iter().enumerate() {
        pool.cache_block(page, key(n as u32)).unwrap();
    }
    pool.free_all(&pages).unwrap();
    // Cached: the tail block sits at the LRU end and is evicted first.
    assert_eq!(pool.cached_free_pages_lru(), ids(&[4, 3, 2, 1]));
    pool.check_invariants().unwrap();
}

#[test]
fn free_all_validates_everything_before_changing_anything() {
    let mut pool = PagePool::new(5).unwrap();
    let pages = pool.allocate(3).unwrap();
    let before = pool.free_pages_in_reuse_order();
    let bad_inputs: [(Vec<PageId>, Error); 4] = [
        (vec![pages[0], PageId::NULL], Error::NullPage),
        (
            vec![pages[0], PageId(7)],
            Error::PageOutOfRange {
                page: 7,
                n_pages: 5,
            },
        ),
        (vec![pages[0], PageId(4)], Error::DoubleFree { page: 4 }),
        // Listed twice with one reference: the second release is a double free.
        (
            vec![pages[1], pages[0], pages[0]],
            Error::DoubleFree { page: 1 },
        ),
    ];
    for (input, expected) in bad_inputs {
        assert_eq!(
            pool.free_all(&input).unwrap_err(),
            expected,
            "input {input:?}"
        );
        assert_eq!(pool.free_pages_in_reuse_order(), before);
        for &page in &pages {
            assert_eq!(pool.ref_count(page), Ok(1));
        }
        pool.check_invariants().unwrap();
    }
    // A page listed twice with two references is fine.
    pool.touch(pages[0]).unwrap();
    pool.free_all(&[pages[0], pages[0]]).unwrap();
    assert_eq!(pool.ref_count(pages[0]), Ok(0));
    pool.check_invariants().unwrap();
}

#[test]
fn touch_takes_a_free_page_back_and_keeps_its_key() {
    let mut pool = PagePool::new(4).unwrap();
    let page = pool.allocate(1).unwrap()[0];
    assert_eq!(pool.cache_block(page, key(1)), Ok(true));
    pool.free(page).unwrap();
    assert_eq!((pool.n_free(), pool.n_cached_free()), (3, 1));
    pool.touch(page).unwrap();
    assert_eq!(
        (pool.n_free(), pool.n_cached_free(), pool.n_in_use()),
        (2, 0, 1)
    );
    assert_eq!(pool.ref_count(page), Ok(1));
    assert_eq!(pool.lookup(&key(1)), Some(page));
    assert!(!pool.free_pages_in_reuse_order().contains(&page));
    pool.check_invariants().unwrap();
}

#[test]
fn touch_takes_a_cached_page_out_of_the_lru_list_keeping_the_order_of_the_others() {
    let mut pool = PagePool::new(5).unwrap();
    let pages = pool.allocate(4).unwrap();
    for (n, &page) in pages.iter().enumerate() {
        pool.cache_block(page, key(n as u32)).unwrap();
    }
    for &page in &pages {
        pool.free(page).unwrap();
    }
    pool.touch(PageId(2)).unwrap();
    assert_eq!(pool.cached_free_pages_lru(), ids(&[1, 3, 4]));
    assert_eq!(pool.n_cached_free(), 3);
    pool.check_invariants().unwrap();
}

#[test]
fn touch_takes_an_uncached_free_page_off_the_stack_in_place_of_the_top_page() {
    let mut pool = PagePool::new(6).unwrap();
    assert_eq!(pool.free_pages_in_reuse_order(), ids(&[1, 2, 3, 4, 5]));
    // O(1) removal from the middle: the top page fills the hole.
    pool.touch(PageId(4)).unwrap();
    assert_eq!(pool.ref_count(PageId(4)), Ok(1));
    assert_eq!(pool.free_pages_in_reuse_order(), ids(&[2, 3, 1, 5]));
    pool.touch(PageId(2)).unwrap();
    assert_eq!(pool.free_pages_in_reuse_order(), ids(&[3, 1, 5]));
    assert_eq!((pool.n_free(), pool.n_cached_free()), (3, 0));
    pool.check_invariants().unwrap();
    // Freed again: back on top.
    pool.free(PageId(4)).unwrap();
    assert_eq!(pool.free_pages_in_reuse_order(), ids(&[4, 3, 1, 5]));
    assert_eq!(pool.allocate(2).unwrap(), ids(&[4, 3]));
    pool.check_invariants().unwrap();
}

#[test]
fn touch_errors_name_the_page() {
    let mut pool = PagePool::new(3).unwrap();
    assert_eq!(pool.touch(PageId::NULL).unwrap_err(), Error::NullPage);
    assert_eq!(
        pool.touch(PageId(9)).unwrap_err(),
        Error::PageOutOfRange {
            page: 9,
            n_pages: 3
        }
    );
}

#[test]
fn queries_reject_null_and_out_of_range_pages() {
    let mut pool = PagePool::new(3).unwrap();
    assert_eq!(pool.ref_count(PageId::NULL).unwrap_err(), Error::NullPage);
    assert_eq!(
        pool.ref_count(PageId(3)).unwrap_err(),
        Error::PageOutOfRange {
            page: 3,
            n_pages: 3
        }
    );
    assert_eq!(pool.key_of(PageId::NULL).unwrap_err(), Error::NullPage);
    assert_eq!(
        pool.key_of(PageId(3)).unwrap_err(),
        Error::PageOutOfRange {
            page: 3,
            n_pages: 3
        }
    );
    assert_eq!(pool.uncache(PageId::NULL).unwrap_err(), Error::NullPage);
    assert_eq!(
        pool.uncache(PageId(3)).unwrap_err(),
        Error::PageOutOfRange {
            page: 3,
            n_pages: 3
        }
    );
    assert_eq!(
        pool.cache_block(PageId::NULL, key(1)).unwrap_err(),
        Error::NullPage
    );
    assert_eq!(
        pool.cache_block(PageId(3), key(1)).unwrap_err(),
        Error::PageOutOfRange {
            page: 3,
            n_pages: 3
        }
    );
}

#[test]
fn cache_block_registers_in_use_pages_only() {
    let mut pool = PagePool::new(4).unwrap();
    assert_eq!(
        pool.cache_block(PageId(1), key(1)).unwrap_err(),
        Error::PageNotInUse { page: 1 }
    );
    let pages = pool.allocate(2).unwrap();
    assert_eq!(pool.cache_block(pages[0], key(1)), Ok(true));
    assert_eq!(pool.key_of(pages[0]), Ok(Some(key(1))));
    assert_eq!(pool.lookup(&key(1)), Some(pages[0]));
    // Same page, same key: idempotent.
    assert_eq!(pool.cache_block(pages[0], key(1)), Ok(true));
    // Another page with a cached key: refused, nothing changes.
    assert_eq!(pool.cache_block(pages[1], key(1)), Ok(false));
    assert_eq!(pool.key_of(pages[1]), Ok(None));
    assert_eq!(pool.lookup(&key(1)), Some(pages[0]));
    // A page that holds a key cannot take another.
    assert_eq!(
        pool.cache_block(pages[0], key(2)).unwrap_err(),
        Error::PageAlreadyCached { page: pages[0].0 }
    );
    assert_eq!(pool.lookup(&key(2)), None);
    pool.check_invariants().unwrap();
}

#[test]
fn freed_cached_page_stays_findable_until_reused_then_loses_its_key() {
    let mut pool = PagePool::new(3).unwrap();
    let pages = pool.allocate(2).unwrap();
    pool.cache_block(pages[0], key(1)).unwrap();
    pool.cache_block(pages[1], key(2)).unwrap();
    pool.free_all(&pages).unwrap();
    assert_eq!((pool.n_free(), pool.n_cached_free()), (2, 2));
    assert_eq!(pool.lookup(&key(1)), Some(pages[0]));
    assert_eq!(pool.lookup(&key(2)), Some(pages[1]));
    // Reverse-order free: the tail block (page 2) is the LRU and is evicted first; the other survives.
    assert_eq!(pool.allocate(1).unwrap(), vec![pages[1]]);
    assert_eq!(pool.lookup(&key(2)), None);
    assert_eq!(pool.key_of(pages[1]), Ok(None));
    assert_eq!(pool.lookup(&key(1)), Some(pages[0]));
    assert_eq!(pool.n_cached_free(), 1);
    pool.free(pages[1]).unwrap();
    // The uncached page first, then the cached one, which loses its key.
    assert_eq!(pool.allocate(2).unwrap(), vec![pages[1], pages[0]]);
    assert_eq!(pool.lookup(&key(1)), None);
    assert_eq!(pool.key_of(pages[0]), Ok(None));
    assert_eq!(pool.n_cached_free(), 0);
    pool.check_invariants().unwrap();
}

#[test]
fn uncache_drops_the_key_and_says_whether_there_was_one() {
    let mut pool = PagePool::new(4).unwrap();
    let pages = pool.allocate(2).unwrap();
    pool.cache_block(pages[0], key(1)).unwrap();
    pool.cache_block(pages[1], key(2)).unwrap();
    // In use: only its key goes.
    assert_eq!(pool.uncache(pages[0]), Ok(true));
    assert_eq!(pool.ref_count(pages[0]), Ok(1));
    assert_eq!(pool.lookup(&key(1)), None);
    assert_eq!(pool.key_of(pages[0]), Ok(None));
    assert_eq!(pool.lookup(&key(2)), Some(pages[1]));
    // Free and cached.
    pool.free(pages[1]).unwrap();
    assert_eq!(pool.n_cached_free(), 1);
    assert_eq!(pool.uncache(pages[1]), Ok(true));
    assert_eq!(pool.n_cached_free(), 0);
    assert_eq!(
        pool.free_pages_in_reuse_order(),
        ids(&[2, 3]),
        "an uncached free page moves to the top of the stack"
    );
    assert_eq!(pool.cached_free_pages_lru(), ids(&[]));
    assert_eq!(pool.uncache(pages[1]), Ok(false));
    assert_eq!((pool.lookup(&key(1)), pool.lookup(&key(2))), (None, None));
    assert_eq!(
        (pool.key_of(pages[0]), pool.key_of(pages[1])),
        (Ok(None), Ok(None))
    );
    // The key can now be cached by another page.
    assert_eq!(pool.cache_block(pages[0], key(2)), Ok(true));
    pool.check_invariants().unwrap();
}

#[test]
fn longest_prefix_stops_at_first_miss_and_does_not_touch() {
    let mut pool = PagePool::new(8).unwrap();
    let tokens: Vec<u32> = (0..16).collect();
    let keys = BlockKey::chain_all(&tokens, 4, b"tenant");
    let pages = pool.allocate(4).unwrap();
    for (&page, &key) in pages.iter().zip(&keys) {
        assert_eq!(pool.cache_block(page, key), Ok(true));
    }
    pool.free_all(&pages).unwrap();
    assert_eq!(pool.longest_prefix(&keys), pages);
    assert_eq!(pool.longest_prefix(&keys[..2]), pages[..2]);
    assert_eq!(pool.longest_prefix(&[]), ids(&[]));
    pool.uncache(pages[2]).unwrap();
    assert_eq!(pool.longest_prefix(&keys), pages[..2]);
    assert_eq!(pool.longest_prefix(&keys[1..]), pages[1..2]);
    assert_eq!(pool.n_in_use(), 0, "lookups do not touch");
    pool.check_invariants().unwrap();
}

#[test]
fn different_salts_never_share_a_page() {
    let mut pool = PagePool::new(8).unwrap();
    let tokens: Vec<u32> = (0..12).collect();
    let keys_a = BlockKey::chain_all(&tokens, 4, b"tenant-a");
    let keys_b = BlockKey::chain_all(&tokens, 4, b"tenant-b");
    let pages = pool.allocate(3).unwrap();
    for (&page, &key) in pages.iter().zip(&keys_a) {
        pool.cache_block(page, key).unwrap();
    }
    assert_eq!(pool.longest_prefix(&keys_a), pages);
    assert!(pool.longest_prefix(&keys_b).is_empty());
    for key in &keys_b {
        assert_eq!(pool.lookup(key), None);
    }
}

#[test]
fn reset_prefix_cache_drops_every_key_when_nothing_is_in_use() {
    let mut pool = PagePool::new(5).unwrap();
    let pages = pool.allocate(3).unwrap();
    for (n, &page) in pages.iter().enumerate() {
        pool.cache_block(page, key(n as u32)).unwrap();
    }
    assert_eq!(
        pool.reset_prefix_cache().unwrap_err(),
        Error::PagesInUse { n: 3 }
    );
    // The refusal drops no key.
    for (n, &page) in pages.iter().enumerate() {
        assert_eq!(pool.lookup(&key(n as u32)), Some(page), "key {n}");
    }
    pool.free_all(&pages).unwrap();
    pool.reset_prefix_cache().unwrap();
    assert_eq!((pool.n_free(), pool.n_cached_free()), (4, 0));
    for (n, &page) in pages.iter().enumerate() {
        assert_eq!(pool.lookup(&key(n as u32)), None, "key {n}");
        assert_eq!(pool.key_of(page), Ok(None));
    }
    // Each page uncached goes on top in page order; page 4 (never cached) stays below.
    assert_eq!(pool.free_pages_in_reuse_order(), ids(&[3, 2, 1, 4]));
    assert_eq!(pool.cached_free_pages_lru(), ids(&[]));
    pool.check_invariants().unwrap();
}

#[test]
fn error_messages_name_the_value() {
    assert_eq!(
        Error::OutOfPages {
            requested: 3,
            free: 2
        }
        .to_string(),
        "out of pages: requested 3, 2 free"
    );
    assert_eq!(
        Error::PageOutOfRange {
            page: 9,
            n_pages: 4
        }
        .to_string(),
        "page 9 is out of range: the pool has 4 pages"
    );
    assert!(Error::DoubleFree { page: 5 }.to_string().contains("page 5"));
    assert!(
        Error::PageNotInUse { page: 6 }
            .to_string()
            .contains("page 6")
    );
    assert!(
        Error::PageAlreadyCached { page: 7 }
            .to_string()
            .contains("page 7")
    );
    assert!(Error::PagesInUse { n: 8 }.to_string().contains("8 pages"));
    assert!(
        Error::PoolTooSmall { n_pages: 1 }
            .to_string()
            .contains("1 pages")
    );
    assert!(Error::NullPage.to_string().contains("page 0"));
}

#[test]
fn debug_shows_counters() {
    let pool = PagePool::new(3).unwrap();
    let shown = format!("{pool:?}");
    assert!(shown.contains("n_free: 2"), "{shown}");
}

/// The largest pool the engine allows (`EngineParams::N_PAGES_MAX`): 4 Mi pages.
const BIG_POOL: u32 = 1 << 22;

#[test]
fn a_big_pool_holds_bookkeeping_only_for_the_pages_it_used() {
    let mut pool = PagePool::new(BIG_POOL).unwrap();
    assert!(
        pool.bookkeeping_bytes() < 16 * 1024,
        "a fresh pool of {BIG_POOL} pages holds {} bytes",
        pool.bookkeeping_bytes()
    );
    // A request's worth of pages, some cached, freed and found again.
    let pages = pool.allocate(100).unwrap();
    for (n, &page) in pages.iter().enumerate().take(50) {
        assert!(pool.cache_block(page, key(n as u32)).unwrap());
    }
    pool.free_all(&pages).unwrap();
    assert_eq!(pool.lookup(&key(7)), Some(pages[7]));
    pool.check_invariants().unwrap();
    assert!(
        pool.bookkeeping_bytes() < 64 * 1024,
        "100 pages used of {BIG_POOL} hold {} bytes",
        pool.bookkeeping_bytes()
    );
    // Bookkeeping grows with the pages used, at most about twice what they need.
    let held = pool.allocate(100_000).unwrap();
    let bytes = pool.bookkeeping_bytes();
    assert!(
        bytes < 100_000 * 2 * 100,
        "100 000 pages used hold {bytes} bytes"
    );
    pool.free_all(&held).unwrap();
    pool.check_invariants().unwrap();
    assert_eq!(pool.n_free(), BIG_POOL - 1);
}

#[test]
fn every_page_of_a_big_pool_is_allocated_in_id_order_once() {
    let mut pool = PagePool::new(1 << 16).unwrap();
    let pages = pool.allocate(pool.n_free()).unwrap();
    assert_eq!(pages, (1..1 << 16).map(PageId).collect::<Vec<_>>());
    assert_eq!(pool.n_free(), 0);
    pool.check_invariants().unwrap();
    pool.free_all(&pages).unwrap();
    assert_eq!(pool.n_free(), pool.n_usable());
    pool.check_invariants().unwrap();
}

#[test]
fn touching_a_page_never_handed_out_takes_it_off_the_stack_as_any_free_page() {
    let mut pool = PagePool::new(10).unwrap();
    assert_eq!(pool.allocate(1).unwrap(), ids(&[1]));
    // The stack from its top: 2, 3, ..., 9; page 5 leaves it and the top page (2) takes its place.
    pool.touch(PageId(5)).unwrap();
    assert_eq!(pool.ref_count(PageId(5)).unwrap(), 1);
    assert_eq!(
        pool.free_pages_in_reuse_order(),
        ids(&[3, 4, 2, 6, 7, 8, 9])
    );
    pool.check_invariants().unwrap();
    // With a page freed on top, that page takes the hole instead.
    pool.free(PageId(1)).unwrap();
    pool.touch(PageId(7)).unwrap();
    assert_eq!(
        pool.free_pages_in_reuse_order(),
        ids(&[3, 4, 2, 6, 1, 8, 9])
    );
    pool.check_invariants().unwrap();
    assert_eq!(pool.allocate(7).unwrap(), ids(&[3, 4, 2, 6, 1, 8, 9]));
    pool.check_invariants().unwrap();
    // A page never handed out is unreferenced: freeing it is a double free, and it holds no key.
    let mut pool = PagePool::new(BIG_POOL).unwrap();
    let last = PageId(BIG_POOL - 1);
    assert_eq!(pool.free(last), Err(Error::DoubleFree { page: last.0 }));
    assert_eq!(
        pool.free_all(&[last]),
        Err(Error::DoubleFree { page: last.0 })
    );
    assert_eq!(pool.ref_count(last), Ok(0));
    assert_eq!(pool.key_of(last), Ok(None));
    assert_eq!(pool.uncache(last), Ok(false));
    assert_eq!(
        pool.cache_block(last, key(1)),
        Err(Error::PageNotInUse { page: last.0 })
    );
    assert_eq!(
        pool.free(PageId(BIG_POOL)),
        Err(Error::PageOutOfRange {
            page: BIG_POOL,
            n_pages: BIG_POOL
        })
    );
    assert!(pool.bookkeeping_bytes() < 16 * 1024);
    pool.check_invariants().unwrap();
}

/// The prefix-change log, in order: a registration (not a second one of a held key), an eviction by a later
/// allocation, an `uncache`, and a reset as one `Cleared`; nothing while not recording, and stopping drops
/// what was not taken.
#[test]
fn prefix_changes_record_stores_evictions_uncaches_and_resets_in_order() {
    use super::PrefixChange::{Cleared, Removed, Stored};
    let mut pool = PagePool::new(3).unwrap();
    let pages = pool.allocate(2).unwrap();
    assert!(pool.cache_block(pages[0], key(0)).unwrap());
    assert!(pool.take_prefix_changes().is_empty(), "recorded while off");
    pool.free_all(&pages).unwrap();
    pool.record_prefix_changes(true);
    let pages = pool.allocate(2).unwrap(); // evicts key(0)
    assert!(pool.cache_block(pages[0], key(1)).unwrap());
    assert!(!pool.cache_block(pages[1], key(1)).unwrap(), "held twice");
    assert!(pool.cache_block(pages[1], key(2)).unwrap());
    assert!(pool.uncache(pages[1]).unwrap());
    assert_eq!(
        pool.take_prefix_changes(),
        vec![
            Removed(key(0)),
            Stored(key(1)),
            Stored(key(2)),
            Removed(key(2))
        ]
    );
    assert_eq!(pool.cached_keys(), vec![key(1)]);
    assert_eq!(pool.n_cached(), 1);
    pool.free_all(&pages).unwrap();
    pool.reset_prefix_cache().unwrap();
    assert_eq!(pool.take_prefix_changes(), vec![Cleared]);
    assert!(pool.take_prefix_changes().is_empty(), "taken twice");
    assert!(pool.cached_keys().is_empty());
    let pages = pool.allocate(1).unwrap();
    assert!(pool.cache_block(pages[0], key(3)).unwrap());
    pool.record_prefix_changes(false);
    pool.record_prefix_changes(true);
    assert!(pool.take_prefix_changes().is_empty(), "kept after stopping");
    pool.check_invariants().unwrap();
}
