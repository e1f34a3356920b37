//! The memory limits of one engine: page storage counts every rank's shard, and pool memory counts the
//! pool's bookkeeping and the storage as host storage allocates it, so neither tiny pages nor many ranks slip
//! past them. And the draft acceptance's range.

use kv_pool::{CacheGroup, Geometry, GroupKind};

use super::EngineParams;

/// The largest pool, `context_parallel` ranks, pages of `page_bytes` bytes.
fn largest_pool(context_parallel: u32, page_bytes: u32) -> EngineParams {
    let geometry = Geometry::new(
        vec![CacheGroup {
            kind: GroupKind::Full,
            bytes_per_page: 2048,
        }],
        16,
        context_parallel,
        131_072,
    )
    .unwrap();
    EngineParams {
        geometry,
        n_pages: EngineParams::N_PAGES_MAX,
        page_bytes,
        ..EngineParams::default()
    }
}

#[test]
fn pool_memory_counts_bookkeeping_and_every_ranks_storage() {
    let params = EngineParams::default();
    // 4096 pages of 32 bytes: 88 bytes of bookkeeping and a 64-byte line each.
    assert_eq!(params.pool_memory_bytes(), 4096 * (88 + 64));
    assert_eq!(params.storage_bytes(), 4096 * 32);
    params.validate().unwrap();
    let params = largest_pool(2, 32);
    assert_eq!(params.storage_bytes(), (1 << 22) * 2 * 32);
    assert_eq!(params.pool_memory_bytes(), (1 << 22) * (88 + 2 * 64));
    params.validate().unwrap();
}

#[test]
fn storage_on_many_ranks_and_tiny_pages_on_many_ranks_are_refused() {
    // 64 shards of 4 Mi pages of 8 bytes: 2 GiB of page storage (16 GiB as lines), one shard counted before.
    let error = largest_pool(64, 8).validate().unwrap_err().to_string();
    assert_eq!(
        error,
        "invalid engine parameter page_bytes: 4194304 pages of 8 bytes on 64 ranks make 2147483648 \
         bytes of page storage, above the limit of 1073741824 bytes; use fewer pages, ranks or bytes per page"
    );
    // 32 shards: 1 GiB of page storage, within its limit, but 8 GiB of 64-byte lines and 352 MiB of
    // bookkeeping.
    let error = largest_pool(32, 8).validate().unwrap_err().to_string();
    assert_eq!(
        error,
        "invalid engine parameter n_pages: 4194304 pages of 8 bytes on 32 ranks take up to 8959033344 \
         bytes of page storage and bookkeeping, above the limit of 8589934592 bytes; use fewer pages, ranks \
         or bytes per page"
    );
    largest_pool(16, 8).validate().unwrap();
}

#[test]
fn a_draft_acceptance_that_is_not_a_probability_is_refused_naming_it() {
    for bad in [-0.01, 1.01, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let params = EngineParams {
            draft_tokens: 3,
            draft_acceptance: bad,
            ..EngineParams::default()
        };
        let error = params.validate().unwrap_err().to_string();
        assert!(
            error.starts_with("invalid engine parameter draft_acceptance: "),
            "{bad}: {error}"
        );
    }
    for good in [0.0, 0.5, 1.0] {
        let params = EngineParams {
            draft_tokens: 3,
            draft_acceptance: good,
            ..EngineParams::default()
        };
        params.validate().unwrap();
    }
}
