//! Page-pool benchmark: allocate+free of one page on a 64k-page pool against a plain `Vec` push/pop
//! baseline measured in the same run, and a prefix hit (`longest_prefix` over a cached chain) per block.
//! Prints progress on stderr and one JSON object on stdout. Flags: `--quick` (fewer iterations); `--gpu`
//! and anything else (cargo passes `--bench`) are ignored.
#![allow(clippy::disallowed_methods, reason = "a bench times itself")]
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark binary reports its figures"
)]

use std::hint::black_box;
use std::time::Instant;

use kv_pool::{BlockKey, PagePool};

const POOL_PAGES: u32 = 65_536;
const CHAIN_BLOCKS: usize = 1024;
const TOKENS_PER_BLOCK: usize = 16;

fn main() {
    // `cargo bench` passes `--bench`; without it (`cargo test --all-targets`) run the quick sizes.
    let quick = std::env::args().any(|arg| arg == "--quick")
        || !std::env::args().any(|arg| arg == "--bench");
    let (repetitions, ops_per_rep, lookups_per_rep) = if quick {
        (5, 200_000, 20)
    } else {
        (15, 2_000_000, 200)
    };

    eprintln!(
        "kv-pool bench: {repetitions} repetitions of {ops_per_rep} alloc+free on {POOL_PAGES} pages"
    );
    let pool_alloc_free_ns = median(repetitions, || alloc_free_ns(ops_per_rep));
    let pool_vec_baseline_ns = median(repetitions, || vec_push_pop_ns(ops_per_rep));
    eprintln!("kv-pool bench: prefix hits over a chain of {CHAIN_BLOCKS} blocks");
    let prefix_hit_ns_per_block = median(repetitions, || prefix_hit_ns_per_block(lookups_per_rep));
    eprintln!(
        "kv-pool bench: alloc+free {pool_alloc_free_ns:.1} ns, vec {pool_vec_baseline_ns:.1} ns ({:.2}x), \
         prefix hit {prefix_hit_ns_per_block:.1} ns/block",
        pool_alloc_free_ns / pool_vec_baseline_ns
    );
    println!(
        "{{\"pool_alloc_free_ns\": {pool_alloc_free_ns:.2}, \"pool_vec_baseline_ns\": {pool_vec_baseline_ns:.2}, \
         \"prefix_hit_ns_per_block\": {prefix_hit_ns_per_block:.2}, \"pool_pages\": {POOL_PAGES}}}"
    );
}

/// Median of `repetitions` runs of `measure`.
fn median(repetitions: usize, mut measure: impl FnMut() -> f64) -> f64 {
    measure(); // warm up
    let mut figures: Vec<f64> = (0..repetitions).map(|_| measure()).collect();
    figures.sort_by(f64::total_cmp);
    figures[figures.len() / 2]
}

/// Nanoseconds per `allocate_one` + `free` on a 64k-page pool (the decode-growth path). The page holds no
/// cached block, so it goes back on top of the uncached stack and the next allocation reuses it.
fn alloc_free_ns(ops: usize) -> f64 {
    let mut pool = PagePool::new(POOL_PAGES).expect("pool");
    let start = Instant::now();
    for _ in 0..ops {
        let page = black_box(pool.allocate_one().expect("allocate"));
        pool.free(page).expect("free");
    }
    let elapsed = start.elapsed();
    black_box(&pool);
    elapsed.as_nanos() as f64 / ops as f64
}

/// Nanoseconds per pop+push on a plain `Vec` of page ids (the free-stack baseline).
fn vec_push_pop_ns(ops: usize) -> f64 {
    let mut free: Vec<u32> = (1..POOL_PAGES).collect();
    let start = Instant::now();
    for _ in 0..ops {
        let page = black_box(free.pop().expect("page"));
        free.push(page);
    }
    let elapsed = start.elapsed();
    black_box(&free);
    elapsed.as_nanos() as f64 / ops as f64
}

/// Nanoseconds per block of `longest_prefix` over a fully cached chain (freed, so cached-free pages).
fn prefix_hit_ns_per_block(lookups: usize) -> f64 {
    let tokens: Vec<u32> = (0..(CHAIN_BLOCKS * TOKENS_PER_BLOCK) as u32).collect();
    let keys = BlockKey::chain_all(&tokens, TOKENS_PER_BLOCK, b"bench");
    let mut pool = PagePool::new(POOL_PAGES).expect("pool");
    let pages = pool.allocate(CHAIN_BLOCKS as u32).expect("allocate");
    for (&page, &key) in pages.iter().zip(&keys) {
        assert!(pool.cache_block(page, key).expect("cache"));
    }
    pool.free_all(&pages).expect("free");
    let start = Instant::now();
    for _ in 0..lookups {
        let hit = pool.longest_prefix(black_box(&keys));
        assert_eq!(hit.len(), CHAIN_BLOCKS);
        black_box(hit);
    }
    let elapsed = start.elapsed();
    elapsed.as_nanos() as f64 / (lookups * CHAIN_BLOCKS) as f64
}
