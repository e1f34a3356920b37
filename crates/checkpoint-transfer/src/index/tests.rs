//! The resident index against a real `PagePool`, `HostStorage` and the deterministic inline copy engine:
//! O1-O7, stage validation (R4's data half), and a proptest over random interleavings.
#![allow(clippy::disallowed_methods, reason = "tests read PROPTEST_CASES")]

use std::sync::Arc;
use std::time::Duration;

use kv_pool::{BlockKey, HostStorage, PageId, PagePool, PageStorage};
use kv_pool::{RequestId, Timestamp};
use proptest::prelude::*;

use crate::checkpoint::{
    Checkpoint, CheckpointId, CheckpointKind, CheckpointMeta, CheckpointPayload, PrefixQuery,
};
use crate::copy::{CopyEngine, CopyModel, Fault, InlineCopyEngine};
use crate::error::{Error, Invalid, Mismatch};
use crate::index::{
    CancelOutcome, ImportEvent, ImportState, LookupBudget, RESTORE_LOOKUPS_MAX, ResidentIndex,
    StageRequest,
};
use crate::layout::LayoutDescriptor;
use crate::page_buf::RankPages;
use crate::store::{CheckpointStore, HostStore};

const BYTES_PER_PAGE: usize = 64;
const TOKENS_PER_PAGE: usize = 4;
const N_RANKS: u32 = 2;
const N_PAGES: u32 = 32;
const SALT: &[u8] = b"tenant";

fn layout() -> LayoutDescriptor {
    LayoutDescriptor::single_full(BYTES_PER_PAGE as u64, TOKENS_PER_PAGE as u32, N_RANKS)
}

fn tokens(n: u32) -> Vec<u32> {
    (1000..1000 + n).collect()
}

fn keys(tokens: &[u32]) -> Vec<BlockKey> {
    BlockKey::chain_all(tokens, TOKENS_PER_PAGE, SALT)
}

fn checkpoint(id: &str, n_tokens: u32) -> Checkpoint {
    let meta = CheckpointMeta::full_attention(
        CheckpointId::new(id).unwrap(),
        1,
        CheckpointKind::Prompt,
        &tokens(n_tokens),
        SALT,
        layout(),
    );
    let ranks = (0..N_RANKS)
        .map(|rank| {
            (0..meta.pages.len())
                .map(|page| {
                    let bytes: Vec<u8> = (0..BYTES_PER_PAGE)
                        .map(|i| (i as u32 * 7 + rank * 13 + page as u32 * 29 + n_tokens) as u8)
                        .collect();
                    bytes
                })
                .collect::<Vec<_>>()
        })
        .map(|pages| RankPages::from_pages(pages.iter().map(Vec::as_slice), BYTES_PER_PAGE))
        .collect();
    Checkpoint {
        meta,
        payload: CheckpointPayload { ranks },
    }
}

struct Rig {
    pool: PagePool,
    storage: Arc<HostStorage>,
    copies: InlineCopyEngine,
    index: ResidentIndex,
}

/// 192 bytes per job at 64 kB/s + 1 ms: a 3-page job takes 4 ms.
fn rig() -> Rig {
    let storage = Arc::new(HostStorage::new(N_RANKS, N_PAGES, BYTES_PER_PAGE).unwrap());
    let model = CopyModel {
        bandwidth_bytes_per_s: 64_000.0,
        latency: Duration::from_millis(1),
    };
    Rig {
        pool: PagePool::new(N_PAGES).unwrap(),
        copies: InlineCopyEngine::with_storage(model, Arc::clone(&storage) as Arc<dyn PageStorage>),
        storage,
        index: ResidentIndex::new(layout()),
    }
}

fn at_ms(ms: u64) -> Timestamp {
    Timestamp::ZERO.after(Duration::from_millis(ms))
}

impl Rig {
    fn stage(
        &mut self,
        request: u64,
        checkpoint: &Checkpoint,
    ) -> crate::error::Result<crate::index::ImportId> {
        self.index.stage(
            &mut self.pool,
            &mut self.copies,
            Timestamp::ZERO,
            StageRequest {
                request: RequestId(request),
                request_tokens: 64,
                checkpoint,
                dependency_pages: &[],
            },
        )
    }

    fn poll(&mut self, ms: u64) -> Vec<ImportEvent> {
        let events = self.index.poll(&mut self.pool, &mut self.copies, at_ms(ms));
        self.check();
        events
    }

    fn check(&self) {
        self.pool.check_invariants().unwrap();
        self.index.check_invariants(&self.pool).unwrap();
        for page in self.copies.in_flight_pages() {
            assert!(
                self.pool.ref_count(page).unwrap() >= 1,
                "page {page:?} free while copied into"
            );
        }
    }
}

fn published(events: &[ImportEvent]) -> Vec<u64> {
    events
        .iter()
        .filter_map(|e| match e {
            ImportEvent::Published { request, .. } => Some(request.0),
            _ => None,
        })
        .collect()
}

#[test]
fn o1_staged_import_is_not_a_cache_hit() {
    let mut rig = rig();
    let ckpt = checkpoint("a", 10);
    rig.stage(1, &ckpt).unwrap();
    rig.check();
    assert_eq!(rig.index.state(RequestId(1)), Some(ImportState::Staged));
    assert!(
        rig.pool.longest_prefix(&keys(&tokens(10))).is_empty(),
        "staged import seen as a hit"
    );
    assert_eq!(
        rig.index.find_longest(&PrefixQuery {
            block_keys: &keys(&tokens(10)),
            tokens: &tokens(10)
        }),
        None
    );
    assert!(rig.poll(3).is_empty(), "nothing completes before 4 ms");
    assert!(rig.pool.longest_prefix(&keys(&tokens(10))).is_empty());
    let events = rig.poll(4);
    assert_eq!(published(&events), vec![1]);
    assert_eq!(rig.pool.longest_prefix(&keys(&tokens(10))).len(), 2);
}

#[test]
fn o2_published_exactly_on_the_last_rank_acknowledgement() {
    let mut rig = rig();
    rig.copies.inject(Fault::DelayNext {
        rank: 1,
        by: Duration::from_millis(100),
    });
    rig.stage(1, &checkpoint("a", 10)).unwrap();
    let events = rig.poll(10);
    assert!(
        matches!(events[..], [ImportEvent::Acknowledged { rank: 0, .. }]),
        "{events:?}"
    );
    assert!(!rig.index.is_ready(RequestId(1)));
    assert!(rig.pool.longest_prefix(&keys(&tokens(10))).is_empty());
    let events = rig.poll(104);
    assert!(
        matches!(events[0], ImportEvent::Acknowledged { rank: 1, .. }),
        "{events:?}"
    );
    assert_eq!(published(&events), vec![1]);
    assert!(rig.index.is_ready(RequestId(1)));
}

#[test]
fn o2_destination_evicted_mid_copy_refuses_publication() {
    let mut rig = rig();
    let ckpt = checkpoint("a", 10);
    rig.stage(1, &ckpt).unwrap();
    let page = rig.index.pages(RequestId(1)).unwrap()[1];
    rig.copies.inject(Fault::EvictDestination(page));
    let events = rig.poll(10);
    assert!(
        matches!(events.last(), Some(ImportEvent::Invalidated { page: p, .. }) if *p == page),
        "{events:?}"
    );
    assert_eq!(rig.index.state(RequestId(1)), None);
    assert_eq!(rig.pool.n_in_use(), 0);
    assert!(rig.pool.longest_prefix(&keys(&tokens(10))).is_empty());
    // The restore looks up again.
    rig.stage(1, &ckpt).unwrap();
    assert_eq!(published(&rig.poll(20)), vec![1]);
}

#[test]
fn o3_published_import_is_not_evictable() {
    let mut rig = rig();
    rig.stage(1, &checkpoint("a", 10)).unwrap();
    rig.poll(10);
    let pages = rig.index.pages(RequestId(1)).unwrap().to_vec();
    // Other admissions take every free page: none of the import's pages is reused.
    let n_free = rig.pool.n_free();
    let others = rig.pool.allocate(n_free).unwrap();
    assert!(others.iter().all(|page| !pages.contains(page)));
    assert!(rig.pool.allocate(1).is_err());
    assert_eq!(
        rig.pool.longest_prefix(&keys(&tokens(10))),
        pages[..2].to_vec()
    );
    rig.pool.free_all(&others).unwrap();
    rig.check();
}

#[test]
fn o3_non_forced_reset_fails_while_staged_or_owned() {
    let mut rig = rig();
    rig.stage(1, &checkpoint("a", 10)).unwrap();
    let err = rig
        .index
        .clear(&mut rig.pool, &mut rig.copies, false)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::ResetRefused {
                n_staged: 1,
                n_owned: 0
            }
        ),
        "{err}"
    );
    rig.poll(10);
    let err = rig
        .index
        .clear(&mut rig.pool, &mut rig.copies, false)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::ResetRefused {
                n_staged: 0,
                n_owned: 1
            }
        ),
        "{err}"
    );
    assert!(
        rig.index.is_ready(RequestId(1)),
        "a refused reset changes nothing"
    );
    // Forced: the ready import is released and its request falls back to an ordinary lookup.
    rig.stage(2, &checkpoint("b", 6)).unwrap();
    let released = rig
        .index
        .clear(&mut rig.pool, &mut rig.copies, true)
        .unwrap();
    assert_eq!(released, vec![RequestId(1), RequestId(2)]);
    let events = rig.index.drain_all(&mut rig.pool, &mut rig.copies);
    assert!(
        matches!(events[..], [ImportEvent::Drained { .. }]),
        "{events:?}"
    );
    rig.check();
    assert_eq!(rig.pool.n_in_use(), 0);
    rig.pool.reset_prefix_cache().unwrap();
    assert_eq!(rig.pool.n_free(), N_PAGES - 1);
}

#[test]
fn o4_consumer_acquires_through_prefix_hits_and_pages_enter_the_lru() {
    let mut rig = rig();
    let ckpt = checkpoint("a", 10);
    rig.stage(1, &ckpt).unwrap();
    rig.poll(10);
    let n_free_before = rig.pool.n_free();
    let acquired = rig.index.acquire(&mut rig.pool, RequestId(1)).unwrap();
    rig.check();
    assert_eq!(acquired.n_hit_pages, 2);
    assert_eq!(acquired.pages.len(), 3);
    assert_eq!(rig.index.state(RequestId(1)), None);
    assert_eq!(rig.pool.n_free(), n_free_before);
    for (pos, &page) in acquired.pages.iter().enumerate() {
        assert_eq!(
            rig.pool.ref_count(page).unwrap(),
            1,
            "one reference: the consumer's"
        );
        for rank in 0..N_RANKS {
            let bytes = rig.storage.with_page(rank, page, <[u8]>::to_vec).unwrap();
            assert_eq!(
                bytes[..],
                ckpt.payload.ranks[rank as usize].page(pos).unwrap()[..],
                "restored bytes differ"
            );
        }
    }
    // Freed by the consumer: ordinary cached pages, found again by a prefix lookup.
    rig.pool.free_all(&acquired.pages).unwrap();
    assert_eq!(rig.pool.n_in_use(), 0);
    assert_eq!(rig.pool.n_cached_free(), 2);
    assert_eq!(
        rig.pool.longest_prefix(&keys(&tokens(10))),
        acquired.pages[..2].to_vec()
    );
    rig.check();
}

#[test]
fn o4_acquire_of_a_staged_import_is_refused() {
    let mut rig = rig();
    rig.stage(1, &checkpoint("a", 10)).unwrap();
    let err = rig.index.acquire(&mut rig.pool, RequestId(1)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::WrongState {
                state: "staged",
                ..
            }
        ),
        "{err}"
    );
    assert!(matches!(
        rig.index.acquire(&mut rig.pool, RequestId(9)),
        Err(Error::UnknownImport { .. })
    ));
}

#[test]
fn o5_cancel_while_copying_keeps_pages_pinned_until_drained() {
    let mut rig = rig();
    let ckpt = checkpoint("a", 10);
    rig.stage(1, &ckpt).unwrap();
    let old_pages = rig.index.pages(RequestId(1)).unwrap().to_vec();
    let outcome = rig
        .index
        .cancel(&mut rig.pool, &mut rig.copies, RequestId(1))
        .unwrap();
    assert!(
        matches!(outcome, CancelOutcome::Draining { n_jobs: 2, .. }),
        "{outcome:?}"
    );
    rig.check();
    assert_eq!(
        rig.index.state(RequestId(1)),
        None,
        "the id is free at once"
    );
    for &page in &old_pages {
        assert_eq!(
            rig.pool.ref_count(page).unwrap(),
            1,
            "pinned while copies may write"
        );
    }
    // A new request reusing the id does not inherit the cancellation.
    rig.stage(1, &ckpt).unwrap();
    let events = rig.poll(10);
    assert!(events.iter().any(|e| matches!(
        e,
        ImportEvent::Drained {
            request: RequestId(1),
            ..
        }
    )));
    assert_eq!(published(&events), vec![1]);
    for &page in &old_pages {
        assert_eq!(rig.pool.ref_count(page).unwrap(), 0);
        assert_eq!(rig.pool.key_of(page).unwrap(), None, "discarded un-cached");
    }
    assert_eq!(rig.index.n_pages_held(), 3);
}

#[test]
fn o6_cancel_of_a_ready_import_releases_ownership_at_once() {
    let mut rig = rig();
    rig.stage(1, &checkpoint("a", 10)).unwrap();
    rig.poll(10);
    let pages = rig.index.pages(RequestId(1)).unwrap().to_vec();
    let outcome = rig
        .index
        .cancel(&mut rig.pool, &mut rig.copies, RequestId(1))
        .unwrap();
    assert!(
        matches!(outcome, CancelOutcome::Released { n_pages: 3, .. }),
        "{outcome:?}"
    );
    rig.check();
    assert_eq!(rig.pool.n_in_use(), 0);
    assert_eq!(rig.pool.n_cached_free(), 2);
    assert_eq!(
        rig.pool.longest_prefix(&keys(&tokens(10))),
        pages[..2].to_vec()
    );
    // Evictable: an allocation of every free page reuses them, and both cached blocks lose their keys.
    let all = rig.pool.allocate(rig.pool.n_free()).unwrap();
    assert!(pages.iter().all(|page| all.contains(page)));
    assert_eq!(rig.pool.n_cached_free(), 0);
    assert!(rig.pool.longest_prefix(&keys(&tokens(10))).is_empty());
    for key in keys(&tokens(10)) {
        assert_eq!(rig.pool.lookup(&key), None);
    }
    for &page in &pages {
        assert_eq!(rig.pool.key_of(page).unwrap(), None);
    }
}

#[test]
fn o7_failed_rank_discards_after_the_others_drain_then_retries_shorter() {
    let mut rig = rig();
    let mut store = HostStore::new(1 << 20);
    store.put(checkpoint("long", 10)).unwrap();
    store.put(checkpoint("short", 6)).unwrap();
    let request = tokens(12);
    let request_keys = keys(&request);
    let mut budget = LookupBudget::new();
    assert!(budget.try_take());
    let query = PrefixQuery {
        block_keys: &request_keys,
        tokens: &request,
    };
    let found = store.find_longest(&query).unwrap();
    assert_eq!(found.n_tokens, 10);
    let long = store.get(&found.id).unwrap();
    rig.copies.inject(Fault::FailNext { rank: 1 });
    rig.copies.inject(Fault::DelayNext {
        rank: 0,
        by: Duration::from_millis(50),
    });
    rig.stage(1, &long).unwrap();
    let pages = rig.index.pages(RequestId(1)).unwrap().to_vec();
    // Rank 1 failed at 4 ms; rank 0 still copies: nothing is released yet.
    assert!(rig.poll(10).is_empty());
    assert_eq!(rig.index.state(RequestId(1)), Some(ImportState::Failed));
    assert!(
        pages
            .iter()
            .all(|&page| rig.pool.ref_count(page).unwrap() == 1)
    );
    let events = rig.poll(60);
    let failed_tokens = match &events[..] {
        [
            ImportEvent::Failed {
                rank: 1, n_tokens, ..
            },
        ] => *n_tokens,
        other => panic!("expected one failure, got {other:?}"),
    };
    assert_eq!(rig.pool.n_in_use(), 0);
    // Retry a shorter checkpoint.
    assert!(budget.try_take());
    let shorter = &request[..failed_tokens - 1];
    let shorter_keys = keys(shorter);
    let found = store
        .find_longest(&PrefixQuery {
            block_keys: &shorter_keys,
            tokens: shorter,
        })
        .unwrap();
    assert_eq!(found.n_tokens, 6);
    rig.stage(1, &store.get(&found.id).unwrap()).unwrap();
    assert_eq!(published(&rig.poll(100)), vec![1]);
    // At most four lookups in all.
    assert!(budget.try_take() && budget.try_take());
    assert!(!budget.try_take());
    assert_eq!(budget.n_used(), RESTORE_LOOKUPS_MAX);
}

#[test]
fn r4_invalid_stage_input_names_the_problem_and_changes_nothing() {
    let mut rig = rig();
    rig.stage(7, &checkpoint("busy", 6)).unwrap();
    let n_free = rig.pool.n_free();
    let good = checkpoint("a", 10);
    let check = |rig: &mut Rig,
                 checkpoint: &Checkpoint,
                 request: u64,
                 request_tokens: usize,
                 deps: &[PageId],
                 expect: Invalid| {
        let err = rig
            .index
            .stage(
                &mut rig.pool,
                &mut rig.copies,
                Timestamp::ZERO,
                StageRequest {
                    request: RequestId(request),
                    request_tokens,
                    checkpoint,
                    dependency_pages: deps,
                },
            )
            .unwrap_err();
        match err {
            Error::Invalid(found) => assert_eq!(found, expect),
            other => panic!("expected {expect}, got {other}"),
        }
        assert_eq!(rig.pool.n_free(), n_free);
        assert_eq!(rig.copies.n_in_flight(), 2);
        assert_eq!(rig.index.n_staged(), 1);
    };
    let mut zero = good.clone();
    zero.meta.n_tokens = 0;
    check(
        &mut rig,
        &zero,
        1,
        64,
        &[],
        Invalid::ZeroTokens {
            id: good.meta.id.clone(),
        },
    );
    check(
        &mut rig,
        &good,
        1,
        9,
        &[],
        Invalid::BoundaryPastRequest {
            n_tokens: 10,
            request_tokens: 9,
        },
    );
    let mut draft = good.clone();
    draft.meta.draft_prefix_len = 11;
    check(
        &mut rig,
        &draft,
        1,
        64,
        &[],
        Invalid::DraftPrefixTooLong {
            draft_prefix_len: 11,
            n_tokens: 10,
        },
    );
    let mut no_ranks = good.clone();
    no_ranks.meta.layout.n_ranks = 0;
    check(
        &mut rig,
        &no_ranks,
        1,
        64,
        &[],
        Invalid::ZeroRanks {
            id: good.meta.id.clone(),
        },
    );
    check(
        &mut rig,
        &good,
        7,
        64,
        &[],
        Invalid::IdInUse {
            request: RequestId(7),
        },
    );
    check(
        &mut rig,
        &good,
        1,
        64,
        &[PageId(30)],
        Invalid::DependencyNotOwned { page: PageId(30) },
    );
    let mut wide = good.clone();
    wide.meta.layout.bytes_per_page = 128;
    check(
        &mut rig,
        &wide,
        1,
        64,
        &[],
        Invalid::Layout(Mismatch::PageWidth {
            expected: 64,
            found: 128,
        }),
    );
    let mut groups = good.clone();
    groups
        .meta
        .layout
        .groups
        .push(kv_pool::GroupKind::Recurrent);
    let err = rig
        .index
        .stage(
            &mut rig.pool,
            &mut rig.copies,
            Timestamp::ZERO,
            StageRequest {
                request: RequestId(1),
                request_tokens: 64,
                checkpoint: &groups,
                dependency_pages: &[],
            },
        )
        .unwrap_err();
    assert!(
        err.to_string().contains("groups [full, recurrent]"),
        "{err}"
    );
    let mut short_payload = good.clone();
    let short = short_payload.payload.ranks[1].len() - 1;
    short_payload.payload.ranks[1] = short_payload.payload.ranks[1].range(0..short);
    check(
        &mut rig,
        &short_payload,
        1,
        64,
        &[],
        Invalid::PayloadShape {
            rank: 1,
            expected: 3,
            found: 2,
        },
    );
    rig.check();
}

#[test]
fn dependency_page_lost_before_publication_refuses_it() {
    let mut rig = rig();
    let held = rig.pool.allocate(1).unwrap();
    let ckpt = checkpoint("a", 10);
    rig.index
        .stage(
            &mut rig.pool,
            &mut rig.copies,
            Timestamp::ZERO,
            StageRequest {
                request: RequestId(1),
                request_tokens: 64,
                checkpoint: &ckpt,
                dependency_pages: &held,
            },
        )
        .unwrap();
    rig.pool.free(held[0]).unwrap();
    let events = rig.poll(10);
    assert!(
        matches!(events.last(), Some(ImportEvent::Invalidated { page, .. }) if *page == held[0]),
        "{events:?}"
    );
    assert_eq!(rig.pool.n_in_use(), 0);
}

#[derive(Clone, Debug)]
enum Op {
    Stage { request: u64, n_tokens: u32 },
    Advance { ms: u64 },
    FailNext { rank: u32 },
    FailJob { nth: usize },
    Cancel { request: u64 },
    Evict { nth: usize },
    Acquire { request: u64 },
    FreeConsumer { nth: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..4u64, 1..24u32).prop_map(|(request, n_tokens)| Op::Stage { request, n_tokens }),
        3 => (0..6u64).prop_map(|ms| Op::Advance { ms }),
        1 => (0..N_RANKS).prop_map(|rank| Op::FailNext { rank }),
        1 => (0..8usize).prop_map(|nth| Op::FailJob { nth }),
        2 => (0..4u64).prop_map(|request| Op::Cancel { request }),
        1 => (0..16usize).prop_map(|nth| Op::Evict { nth }),
        2 => (0..4u64).prop_map(|request| Op::Acquire { request }),
        1 => (0..4usize).prop_map(|nth| Op::FreeConsumer { nth }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        // PROPTEST_CASES overrides the count (e.g. 10x before a release).
        std::env::var("PROPTEST_CASES").ok().and_then(|cases| cases.parse().ok()).unwrap_or(128)
    ))]

    /// Under any interleaving of stage / copy completion (acknowledgement) / rank failure / cancel /
    /// eviction / acquire / consumer free, no page is free while a copy into it is outstanding, the index
    /// and pool invariants hold after every operation, and once everything drains and is released every
    /// page is free again.
    #[test]
    fn prop_no_page_freed_while_copied_and_every_page_released(ops in proptest::collection::vec(op(), 1..60)) {
        let mut rig = rig();
        let mut now_ms = 0;
        let mut consumer_pages: Vec<Vec<PageId>> = Vec::new();
        for op in ops {
            match op {
                Op::Stage { request, n_tokens } => {
                    let n_free = rig.pool.n_free();
                    let ckpt = checkpoint(&format!("c{n_tokens}"), n_tokens);
                    let staged = rig.index.stage(
                        &mut rig.pool, &mut rig.copies, at_ms(now_ms),
                        StageRequest { request: RequestId(request), request_tokens: 64, checkpoint: &ckpt, dependency_pages: &[] },
                    );
                    if staged.is_err() {
                        prop_assert_eq!(rig.pool.n_free(), n_free);
                    }
                }
                Op::Advance { ms } => {
                    now_ms += ms;
                    rig.poll(now_ms);
                }
                Op::FailNext { rank } => rig.copies.inject(Fault::FailNext { rank }),
                Op::FailJob { nth } => {
                    if let Some(&job) = rig.copies.in_flight_jobs().get(nth) {
                        rig.copies.inject(Fault::FailJob(job));
                    }
                }
                Op::Cancel { request } => {
                    let _outcome = rig.index.cancel(&mut rig.pool, &mut rig.copies, RequestId(request));
                }
                Op::Evict { nth } => {
                    if let Some(&page) = rig.copies.in_flight_pages().get(nth) {
                        rig.copies.inject(Fault::EvictDestination(page));
                    }
                }
                Op::Acquire { request } => {
                    if let Ok(acquired) = rig.index.acquire(&mut rig.pool, RequestId(request)) {
                        consumer_pages.push(acquired.pages);
                    }
                }
                Op::FreeConsumer { nth } => {
                    if nth < consumer_pages.len() {
                        let pages = consumer_pages.swap_remove(nth);
                        rig.pool.free_all(&pages).unwrap();
                    }
                }
            }
            rig.check();
        }
        rig.index.drain_all(&mut rig.pool, &mut rig.copies);
        rig.check();
        prop_assert_eq!(rig.copies.n_in_flight(), 0);
        for request in 0..4 {
            let _outcome = rig.index.cancel(&mut rig.pool, &mut rig.copies, RequestId(request));
        }
        for pages in consumer_pages {
            rig.pool.free_all(&pages).unwrap();
        }
        rig.check();
        prop_assert_eq!(rig.index.n_pages_held(), 0);
        prop_assert_eq!(rig.pool.n_in_use(), 0);
    }
}

/// Pages held by a caller (a reservation ticket) before `stage_into`: one reference each.
fn caller_pages(rig: &mut Rig, n: u32) -> Vec<PageId> {
    rig.pool.allocate(n).unwrap()
}

fn stage_into(
    rig: &mut Rig,
    request: u64,
    checkpoint: &Checkpoint,
    pages: Vec<PageId>,
) -> crate::error::Result<crate::index::ImportId> {
    rig.index.stage_into(
        &mut rig.pool,
        &mut rig.copies,
        Timestamp::ZERO,
        StageRequest {
            request: RequestId(request),
            request_tokens: 64,
            checkpoint,
            dependency_pages: &[],
        },
        pages,
    )
}

#[test]
fn o4_stage_into_caller_pages_keeps_one_reference_per_holder() {
    let mut rig = rig();
    let ckpt = checkpoint("a", 10);
    let ticket = caller_pages(&mut rig, 3);
    stage_into(&mut rig, 1, &ckpt, ticket.clone()).unwrap();
    rig.check();
    for &page in &ticket {
        assert_eq!(
            rig.pool.ref_count(page).unwrap(),
            2,
            "the caller's and the index's"
        );
    }
    assert_eq!(rig.index.held_pages().collect::<Vec<_>>(), ticket);
    let events = rig.poll(10);
    assert_eq!(published(&events), vec![1]);
    for rank in 0..N_RANKS {
        for (pos, &page) in ticket.iter().enumerate() {
            let bytes = rig.storage.with_page(rank, page, <[u8]>::to_vec).unwrap();
            assert_eq!(
                bytes[..],
                ckpt.payload.ranks[rank as usize].page(pos).unwrap()[..]
            );
        }
    }
    // The consumer acquires (its own references), then the caller drops the ticket's.
    let acquired = rig.index.acquire(&mut rig.pool, RequestId(1)).unwrap();
    rig.pool.free_all(&ticket).unwrap();
    rig.check();
    for &page in &acquired.pages {
        assert_eq!(rig.pool.ref_count(page).unwrap(), 1, "the consumer's only");
    }
    assert_eq!(rig.index.held_pages().count(), 0);
    rig.pool.free_all(&acquired.pages).unwrap();
    assert_eq!(rig.pool.n_in_use(), 0);
}

#[test]
fn o5_stage_into_cancel_pins_pages_by_the_index_reference_alone() {
    let mut rig = rig();
    let ckpt = checkpoint("a", 10);
    let ticket = caller_pages(&mut rig, 3);
    stage_into(&mut rig, 1, &ckpt, ticket.clone()).unwrap();
    rig.index
        .cancel(&mut rig.pool, &mut rig.copies, RequestId(1))
        .unwrap();
    // The caller drops its reference at once: the index's still pins every page under a live copy.
    rig.pool.free_all(&ticket).unwrap();
    rig.check();
    for &page in &ticket {
        assert_eq!(rig.pool.ref_count(page).unwrap(), 1);
    }
    let events = rig.poll(10);
    assert!(
        events
            .iter()
            .any(|event| matches!(event, ImportEvent::Drained { .. }))
    );
    assert_eq!(rig.pool.n_in_use(), 0, "freed once drained");
    rig.check();
}

#[test]
fn r4_stage_into_refuses_unusable_destination_pages_and_changes_nothing() {
    let mut rig = rig();
    let ckpt = checkpoint("a", 10);
    let held = caller_pages(&mut rig, 3);
    let free_page = PageId(N_PAGES - 1);
    assert_eq!(rig.pool.ref_count(free_page).unwrap(), 0);
    let cases: Vec<(Vec<PageId>, crate::error::Error)> = vec![
        (
            held[..2].to_vec(),
            Invalid::PayloadShape {
                rank: 0,
                expected: 3,
                found: 2,
            }
            .into(),
        ),
        (
            vec![held[0], held[1], free_page],
            Invalid::Destination {
                page: free_page,
                reason: "it is free",
            }
            .into(),
        ),
        (
            vec![held[0], held[1], held[0]],
            Invalid::Destination {
                page: held[0],
                reason: "it is listed twice",
            }
            .into(),
        ),
    ];
    for (pages, expected) in cases {
        let error = stage_into(&mut rig, 1, &ckpt, pages).unwrap_err();
        assert_eq!(error.to_string(), expected.to_string());
        assert_eq!((rig.pool.n_in_use(), rig.index.n_staged()), (3, 0));
    }
    stage_into(&mut rig, 1, &ckpt, held.clone()).unwrap();
    let error = stage_into(&mut rig, 2, &ckpt, held.clone()).unwrap_err();
    assert!(
        matches!(
            error,
            Error::Invalid(Invalid::Destination {
                reason: "it is already an import's destination",
                ..
            })
        ),
        "{error}"
    );
    assert_eq!(rig.index.n_staged(), 1);
    rig.check();
}
