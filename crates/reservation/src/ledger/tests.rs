//! Ledger unit tests pinning R1-R5, Q2, Q3 and W1 of the contract, on pools a few pages larger than one
//! request.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use kv_pool::{BlockKey, CacheGroup, Geometry, GroupKind, PageId, PagePool};

use super::{Ledger, TicketState};
use crate::config::{LedgerConfig, Preflight};
use crate::error::{Error, ErrorKind};
use crate::spec::RestoreSpec;
use kv_pool::{AdmissionOrder, RequestId, Timestamp};

/// Full attention, 4 tokens per page, one rank.
fn full_geometry() -> Geometry {
    let group = CacheGroup {
        kind: GroupKind::Full,
        bytes_per_page: 64,
    };
    Geometry::new(vec![group], 4, 1, 4096).expect("valid geometry")
}

fn ledger(slots: u32) -> Ledger {
    Ledger::new(full_geometry(), LedgerConfig::new(slots))
}

/// Boundary 8 (2 import pages), prompt 16 (2 credit pages): 4 pages in all.
fn spec(geometry: &Geometry) -> RestoreSpec {
    RestoreSpec::for_geometry(geometry, 8, 16, 16)
}

fn request(id: u64) -> RequestId {
    RequestId(id)
}

fn at(secs: u64) -> Timestamp {
    Timestamp(Duration::from_secs(secs))
}

fn reserve(
    ledger: &mut Ledger,
    pool: &mut PagePool,
    id: u64,
    now: Timestamp,
) -> crate::Result<super::Ticket> {
    let spec = spec(ledger.geometry());
    ledger.reserve(
        pool,
        request(id),
        AdmissionOrder::fcfs(id),
        &spec,
        &Preflight::default(),
        now,
    )
}

/// Publish, acquire the pages as the consumer would (one reference each), admit.
fn publish_and_admit(ledger: &mut Ledger, pool: &mut PagePool, id: u64, pages: &[PageId]) {
    ledger.publish(request(id)).expect("importing");
    for &page in pages {
        pool.touch(page).expect("consumer acquires");
    }
    ledger.admit(request(id), pool).expect("ready");
}

#[test]
fn r1_reserve_takes_pages_slot_and_credits_together_or_nothing() {
    let mut pool = PagePool::new(1 + 6).expect("pool");
    let mut ledger = ledger(4);
    let ticket = reserve(&mut ledger, &mut pool, 1, at(0)).expect("fits");
    assert_eq!(ticket.import_pages.len(), 2);
    assert_eq!(ticket.credit_pages, 2);
    assert_eq!(pool.n_in_use(), 2);
    assert_eq!((ledger.slots_held(), ledger.credit_pages()), (1, 2));
    assert_eq!(
        ledger.ticket_state(request(1)),
        Some(TicketState::Importing)
    );
    ledger.check_invariants(&pool).unwrap();

    // 4 free, 2 protected: the next restore (4 pages) gets nothing at all.
    let free_before = pool.n_free();
    let err = reserve(&mut ledger, &mut pool, 2, at(0)).expect_err("pressure");
    assert_eq!(err.kind(), ErrorKind::Pressure);
    assert_eq!(pool.n_free(), free_before);
    assert_eq!(
        (
            ledger.slots_held(),
            ledger.credit_pages(),
            ledger.n_tickets()
        ),
        (1, 2, 1)
    );
    assert_eq!(ledger.ticket_state(request(2)), None);
    ledger.check_invariants(&pool).unwrap();
}

#[test]
fn r2_preflight_counts_credits_prefills_and_watermark_only_with_other_work() {
    let geometry = full_geometry();
    let spec = spec(&geometry);
    let mut ledger = ledger(8);
    let mut pool = PagePool::new(1 + 8).expect("pool");
    // Two cached free pages must survive every refusal.
    let cached = pool.allocate(2).expect("pages");
    let keys: Vec<BlockKey> = (0..2u32)
        .map(|i| BlockKey::chain(None, &[i], b""))
        .collect();
    for (&page, &key) in cached.iter().zip(&keys) {
        assert!(pool.cache_block(page, key).expect("in use"));
    }
    pool.free_all(&cached).expect("free");
    assert_eq!((pool.n_free(), pool.n_cached_free()), (8, 2));

    let order = AdmissionOrder::fcfs(1);
    let cases = [
        // (unticketed prefill pages, watermark, other work, fits)
        (5, 0, false, false),
        (4, 0, false, true),
        (0, 5, true, false),
        (0, 5, false, true),
        (2, 2, true, true),
        (2, 3, true, false),
    ];
    for (prefill, watermark, other_work, fits) in cases {
        let preflight = Preflight {
            running_requests: 0,
            unticketed_prefill_pages: prefill,
            watermark_pages: watermark,
            other_work_scheduled: other_work,
        };
        let mut pool = pool.clone();
        let mut ledger = ledger.clone();
        let got = ledger.reserve(&mut pool, request(1), order, &spec, &preflight, at(0));
        assert_eq!(got.is_ok(), fits, "{preflight:?}: {got:?}");
        if !fits {
            assert_eq!(got.expect_err("refused").kind(), ErrorKind::Pressure);
            assert_eq!(
                (pool.n_free(), pool.n_cached_free()),
                (8, 2),
                "no cached page evicted"
            );
            for (&page, key) in cached.iter().zip(&keys) {
                assert_eq!(pool.lookup(key), Some(page), "the cached block survives");
            }
            assert_eq!((ledger.credit_pages(), ledger.slots_held()), (0, 0));
            assert!(ledger.is_waiter(request(1)));
        }
    }

    // Credits of another ticket count as unavailable.
    let _first = ledger
        .reserve(
            &mut pool,
            request(1),
            order,
            &spec,
            &Preflight::default(),
            at(0),
        )
        .expect("fits");
    let _decode = pool.allocate(1).expect("page");
    let err = ledger
        .reserve(
            &mut pool,
            request(2),
            AdmissionOrder::fcfs(2),
            &spec,
            &Preflight::default(),
            at(0),
        )
        .expect_err("5 free, 2 credited");
    assert_eq!(
        err,
        Error::Pressure {
            need_pages: 4,
            available_pages: 3,
            free_slots: 7,
        },
        "5 free after the first import and a decode page, minus 2 credits"
    );
}

#[test]
fn r3_impossible_is_distinct_and_leaves_pool_and_waiters_untouched() {
    let mut pool = PagePool::new(1 + 3).expect("pool");
    let mut ledger = ledger(4);
    let err = reserve(&mut ledger, &mut pool, 1, at(0)).expect_err("4 pages never fit 3");
    assert_eq!(
        err,
        Error::Impossible {
            need_pages: 4,
            usable_pages: 3,
        }
    );
    assert_eq!(err.kind(), ErrorKind::Impossible);
    assert_eq!(pool.n_free(), 3);
    assert!(!ledger.holds_anything(request(1)));
    assert_eq!(ledger.n_waiters(), 0);

    // A waiter that later turns out impossible (larger prompt) is dropped, not kept.
    let mut pool = PagePool::new(1 + 5).expect("pool");
    let _hog = pool.allocate(4).expect("pages");
    let _pressure = reserve(&mut ledger, &mut pool, 2, at(0)).expect_err("pressure");
    assert!(ledger.is_waiter(request(2)));
    let mut bigger = spec(ledger.geometry());
    bigger.prompt_tokens = 64;
    let err = ledger
        .reserve(
            &mut pool,
            request(2),
            AdmissionOrder::fcfs(2),
            &bigger,
            &Preflight::default(),
            at(1),
        )
        .expect_err("impossible");
    assert_eq!(err.kind(), ErrorKind::Impossible);
    assert!(!ledger.is_waiter(request(2)));
}

#[test]
fn r4_invalid_input_names_the_problem_and_changes_nothing() {
    let geometry = full_geometry();
    let base = spec(&geometry);
    let cases: [(RestoreSpec, Error); 9] = [
        (
            RestoreSpec {
                boundary_tokens: 0,
                ..base
            },
            Error::ZeroTokens {
                boundary_tokens: 0,
                prompt_tokens: 16,
            },
        ),
        (
            RestoreSpec {
                boundary_tokens: 17,
                ..base
            },
            Error::BoundaryPastPrompt {
                boundary_tokens: 17,
                prompt_tokens: 16,
            },
        ),
        (
            RestoreSpec {
                draft_prefix_tokens: 9,
                ..base
            },
            Error::DraftPrefixPastBoundary {
                draft_prefix_tokens: 9,
                boundary_tokens: 8,
            },
        ),
        (RestoreSpec { n_ranks: 0, ..base }, Error::ZeroRanks),
        (
            RestoreSpec { n_ranks: 2, ..base },
            Error::RanksMismatch {
                ranks: 2,
                pool_ranks: 1,
            },
        ),
        (
            RestoreSpec {
                tokens_per_page: 16,
                ..base
            },
            Error::PageWidthMismatch {
                tokens_per_page: 16,
                pool_tokens_per_page: 4,
            },
        ),
        (
            RestoreSpec {
                n_groups: 2,
                ..base
            },
            Error::GroupsMismatch {
                n_groups: 2,
                pool_n_groups: 1,
            },
        ),
        (
            RestoreSpec {
                chunk_tokens: 0,
                ..base
            },
            Error::ZeroChunk,
        ),
        (
            RestoreSpec {
                prompt_tokens: 5000,
                ..base
            },
            Error::PromptPastModelLen {
                prompt_tokens: 5000,
                max_model_len: 4096,
            },
        ),
    ];
    let mut pool = PagePool::new(1 + 16).expect("pool");
    let mut ledger = ledger(4);
    for (spec, expect) in cases {
        let got = ledger.reserve(
            &mut pool,
            request(1),
            AdmissionOrder::fcfs(1),
            &spec,
            &Preflight::default(),
            at(0),
        );
        assert_eq!(got.as_ref().err(), Some(&expect));
        assert_eq!(expect.kind(), ErrorKind::Invalid);
        assert!(!expect.to_string().is_empty());
        assert_eq!(pool.n_free(), 16);
        assert!(!ledger.holds_anything(request(1)));
    }
    // A request (checkpoint id) already holding a ticket.
    let _ticket = reserve(&mut ledger, &mut pool, 1, at(0)).expect("fits");
    let free = pool.n_free();
    let err = reserve(&mut ledger, &mut pool, 1, at(0)).expect_err("in use");
    assert_eq!(
        err,
        Error::TicketExists {
            request: request(1)
        }
    );
    assert_eq!(
        (pool.n_free(), ledger.n_tickets(), ledger.credit_pages()),
        (free, 1, 2)
    );
    // Operations in the wrong stage.
    assert_eq!(
        ledger.admit(request(1), &mut pool),
        Err(Error::WrongTicketState {
            request: request(1),
            state: TicketState::Importing,
            expected: TicketState::Ready,
        })
    );
    assert_eq!(
        ledger.consume(request(9), 1),
        Err(Error::NoTicket {
            request: request(9)
        })
    );
    ledger.check_invariants(&pool).unwrap();
}

#[test]
fn r5_at_most_k_tickets_with_k_free_slots_and_earlier_ones_stay_admissible() {
    let mut pool = PagePool::new(1 + 64).expect("pool");
    let mut ledger = ledger(4);
    let running = Preflight {
        running_requests: 1,
        ..Preflight::default()
    };
    let spec = spec(ledger.geometry());
    let mut tickets = Vec::new();
    for id in 1..=3 {
        let order = AdmissionOrder::fcfs(id);
        tickets.push(
            ledger
                .reserve(&mut pool, request(id), order, &spec, &running, at(0))
                .expect("slot free"),
        );
    }
    let free = pool.n_free();
    let err = ledger
        .reserve(
            &mut pool,
            request(4),
            AdmissionOrder::fcfs(4),
            &spec,
            &running,
            at(0),
        )
        .expect_err("no slot");
    assert_eq!(
        err,
        Error::Pressure {
            need_pages: 4,
            available_pages: free - 6,
            free_slots: 0,
        }
    );
    assert_eq!(pool.n_free(), free);
    assert_eq!(ledger.slots_held(), 3);
    for ticket in &tickets {
        publish_and_admit(
            &mut ledger,
            &mut pool,
            ticket.request.0,
            &ticket.import_pages,
        );
    }
    assert_eq!(ledger.slots_held(), 0);
    ledger.check_invariants(&pool).unwrap();
}

#[test]
fn q2_capacity_waiter_holds_back_only_later_restores() {
    // 7 usable pages, 3 in use by a decode: 4 free. Restore 5 (4 pages) is refused and waits.
    let mut pool = PagePool::new(1 + 7).expect("pool");
    let decode = pool.allocate(3).expect("decode pages");
    let mut ledger = ledger(8);
    let spec = spec(ledger.geometry());
    let small = RestoreSpec {
        boundary_tokens: 4,
        prompt_tokens: 5,
        ..spec
    }; // 1 import + 1 credit page
    let preflight = Preflight::default();
    let _hog = pool.allocate(1).expect("page");
    let err = ledger.reserve(
        &mut pool,
        request(5),
        AdmissionOrder::fcfs(5),
        &spec,
        &preflight,
        at(0),
    );
    assert_eq!(err.expect_err("3 free").kind(), ErrorKind::Pressure);
    pool.free_all(&_hog).expect("free");
    // Now 4 free: a later small restore (2 pages) would take the waiter's space: held back.
    let err = ledger.reserve(
        &mut pool,
        request(6),
        AdmissionOrder::fcfs(6),
        &small,
        &preflight,
        at(1),
    );
    assert_eq!(
        err,
        Err(Error::Pressure {
            need_pages: 2,
            available_pages: 0,
            free_slots: 7,
        })
    );
    // An earlier request in the same order is not held back.
    let ticket = ledger
        .reserve(
            &mut pool,
            request(3),
            AdmissionOrder::fcfs(3),
            &small,
            &preflight,
            at(1),
        )
        .expect("ahead of the waiter");
    let released = ledger.release(ticket.request, &mut pool);
    assert_eq!(released.freed_import_pages, 1);
    // Cancelling the waiter lifts its hold.
    assert!(ledger.release(request(5), &mut pool).waiter);
    let _ticket = ledger
        .reserve(
            &mut pool,
            request(6),
            AdmissionOrder::fcfs(6),
            &small,
            &preflight,
            at(2),
        )
        .expect("hold lifted");
    pool.free_all(&decode).expect("free");
    ledger.check_invariants(&pool).unwrap();
}

#[test]
fn q3_requests_ahead_of_a_capacity_waiter_are_never_blocked_by_it() {
    let mut pool = PagePool::new(1 + 8).expect("pool");
    let mut ledger = ledger(8);
    let spec = spec(ledger.geometry());
    let hog = pool.allocate(5).expect("pages");
    let preflight = Preflight::default();
    let _refused = ledger.reserve(
        &mut pool,
        request(10),
        AdmissionOrder::fcfs(10),
        &spec,
        &preflight,
        at(0),
    );
    assert!(ledger.is_waiter(request(10)));
    pool.free_all(&hog).expect("free");
    // 8 free; the waiter (4) and a request ahead of it (4) both fit; several ahead are admitted in turn.
    for id in [1, 2] {
        let got = ledger.reserve(
            &mut pool,
            request(id),
            AdmissionOrder::fcfs(id),
            &spec,
            &preflight,
            at(1),
        );
        assert!(got.is_ok(), "request {id} ahead of the waiter: {got:?}");
    }
    // The waiter itself is now refused for pressure: those ahead took the space first, as FCFS says.
    let err = ledger.reserve(
        &mut pool,
        request(10),
        AdmissionOrder::fcfs(10),
        &spec,
        &preflight,
        at(1),
    );
    assert_eq!(err.expect_err("full").kind(), ErrorKind::Pressure);
    ledger.check_invariants(&pool).unwrap();
}

/// Counts `WARN` events; everything else is ignored.
struct WarnCounter(Arc<AtomicUsize>);

impl tracing::Subscriber for WarnCounter {
    fn enabled(&self, _metadata: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _span: &tracing::span::Id, _values: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _span: &tracing::span::Id, _follows: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if *event.metadata().level() == tracing::Level::WARN {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn enter(&self, _span: &tracing::span::Id) {}
    fn exit(&self, _span: &tracing::span::Id) {}
}

#[test]
fn w1_bounded_wait_expires_once_refuses_even_with_space_and_clears_on_release() {
    let warnings = Arc::new(AtomicUsize::new(0));
    let subscriber = WarnCounter(Arc::clone(&warnings));
    tracing::subscriber::with_default(subscriber, || {
        let mut pool = PagePool::new(1 + 8).expect("pool");
        let mut ledger = ledger(8);
        assert_eq!(ledger.config().restore_max_wait, Duration::from_secs(60));
        let hog = pool.allocate(6).expect("pages");
        // The clock starts at the first refusal (t = 100), not at t = 0.
        let _refused = reserve(&mut ledger, &mut pool, 1, at(100)).expect_err("pressure");
        let err = reserve(&mut ledger, &mut pool, 1, at(159)).expect_err("still waiting");
        assert_eq!(err.kind(), ErrorKind::Pressure);
        // A later restore is held back while the waiter's wait runs...
        pool.free_all(&hog[..2]).expect("free");
        let _refused = reserve(&mut ledger, &mut pool, 2, at(159)).expect_err("held back by 1");
        assert_eq!(warnings.load(Ordering::SeqCst), 0);
        // ...and not once it is over, even before the waiter is polled again.
        let ticket =
            reserve(&mut ledger, &mut pool, 2, at(160)).expect("expired waiter holds nobody back");
        let _released = ledger.release(ticket.request, &mut pool);
        pool.free_all(&hog[2..]).expect("free");
        // Space exists now, but the expired restore is refused: it must recompute. One warning only.
        let err = reserve(&mut ledger, &mut pool, 1, at(160)).expect_err("expired");
        assert_eq!(
            err,
            Error::Expired {
                request: request(1),
                waited: Duration::from_secs(60),
            }
        );
        let _again = reserve(&mut ledger, &mut pool, 1, at(170)).expect_err("expired");
        assert_eq!(ledger.expire_due(at(200)), Vec::new());
        assert_eq!(warnings.load(Ordering::SeqCst), 1);
        assert!(ledger.is_expired(request(1)));
        // Admission (to recompute) or release clears the expired state: a new restore starts afresh.
        assert!(ledger.release(request(1), &mut pool).waiter);
        assert!(!ledger.is_expired(request(1)));
        let _ticket = reserve(&mut ledger, &mut pool, 1, at(300)).expect("fresh");

        // Zero wait: recompute at once, still one warning.
        let mut zero = Ledger::new(
            full_geometry(),
            LedgerConfig {
                max_running_slots: 8,
                restore_max_wait: Duration::ZERO,
            },
        );
        let mut pool = PagePool::new(1 + 4).expect("pool");
        let _hog = pool.allocate(1).expect("page");
        let err = reserve(&mut zero, &mut pool, 1, at(5)).expect_err("expired at once");
        assert_eq!(err.kind(), ErrorKind::Expired);
        assert_eq!(warnings.load(Ordering::SeqCst), 2);
    });
}

/// A ticket released before it handed its pages over gives them back at once (no copy received them: the
/// checkpoint was lost between the lookup and the reservation, or the request was cancelled); one that handed
/// them over leaves them with their holder, which drains them (O5); a ready import's become evictable (O6).
/// Release is idempotent, and a reused id inherits nothing.
#[test]
fn release_is_idempotent_and_frees_only_the_pages_the_ticket_still_holds() {
    let mut pool = PagePool::new(1 + 8).expect("pool");
    let mut ledger = ledger(4);
    let _ticket = reserve(&mut ledger, &mut pool, 1, at(0)).expect("fits");
    let released = ledger.release(request(1), &mut pool);
    assert!(released.slot && released.credit_pages == 2);
    assert_eq!(released.freed_import_pages, 2);
    assert_eq!(
        (pool.n_free(), ledger.slots_held(), ledger.credit_pages()),
        (8, 0, 0)
    );
    assert!(ledger.release(request(1), &mut pool).is_noop());
    // Handed over to a staged import: slot and credits come back at once, the pages stay with their holder.
    let _ticket = reserve(&mut ledger, &mut pool, 1, at(1)).expect("fits");
    let handed = ledger.hand_over_pages(request(1)).expect("importing");
    let released = ledger.release(request(1), &mut pool);
    assert!(released.slot && released.credit_pages == 2);
    assert_eq!(released.freed_import_pages, 0);
    assert_eq!((pool.n_in_use(), ledger.slots_held()), (2, 0));
    pool.free_all(&handed).expect("held by the holder");
    ledger.check_invariants(&pool).unwrap();
    // Cancel a ready import: slot, credits and ownership at once.
    let _ticket = reserve(&mut ledger, &mut pool, 7, at(0)).expect("fits");
    ledger.publish(request(7)).expect("importing");
    let released = ledger.release(request(7), &mut pool);
    assert_eq!(released.freed_import_pages, 2);
    assert_eq!(pool.n_free(), 8);
    let snapshot = ledger.snapshot();
    assert!(snapshot.tickets.is_empty() && snapshot.waiters.is_empty());
}

#[test]
fn timestamp_after_saturates_at_the_end_of_the_clock_instead_of_overflowing() {
    let end = Timestamp(Duration::MAX);
    assert_eq!(end.after(Duration::from_secs(1)), end);
    assert_eq!(at(5).after(Duration::MAX), end);
    assert_eq!(at(5).after(Duration::from_secs(2)), at(7));
    assert_eq!(end.since(at(5)), Duration::MAX - Duration::from_secs(5));
}
