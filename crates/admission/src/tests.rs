//! Admission tests pinning R2-R5, Q1, Q8, W1 and G1's restore at once at the step level, and the FCFS
//! property test.
#![allow(clippy::disallowed_methods, reason = "tests read PROPTEST_CASES")]

use std::collections::HashMap;
use std::convert::Infallible;

use kv_pool::RequestId;
use kv_pool::{CacheGroup, Geometry, GroupKind, PageId, PagePool};
use proptest::prelude::*;
use reservation::{Ledger, LedgerConfig};

use crate::{
    AdmissionHost, Admit, BlockReason, Candidate, Decision, FallbackCause, HostState, QueuePolicy,
    StepContext, StepDecisions, WaitingQueue, schedule_step,
};

fn geometry() -> Geometry {
    let group = CacheGroup {
        kind: GroupKind::Full,
        bytes_per_page: 64,
    };
    Geometry::new(vec![group], 4, 1, 4096).expect("valid geometry")
}

/// A scripted engine: its queues, ledger and pool, each request's candidate, and its cold need after a
/// fallback. It carries out admissions as an engine does: a cold admission or a restore at once allocates its
/// pages at once.
struct Host {
    waiting: WaitingQueue,
    ready: WaitingQueue,
    ledger: Option<Ledger>,
    pool: PagePool,
    candidates: HashMap<RequestId, Candidate>,
    fallbacks: Vec<RequestId>,
    /// Pages taken by admissions.
    held: Vec<PageId>,
    /// Ready imports whose pages were lost: `admit` declines them and requeues them.
    lost: Vec<RequestId>,
    /// Whether a restore at once can start (a copy slot is free).
    at_once_starts: bool,
}

impl Host {
    fn set(&mut self, id: u64, candidate: Candidate) {
        self.candidates.insert(RequestId(id), candidate);
    }

    fn push(&mut self, id: u64) {
        self.waiting.push(RequestId(id), 0).expect("new");
    }

    fn mark_ready(&mut self, id: u64) {
        self.waiting
            .move_to(RequestId(id), &mut self.ready)
            .expect("queued");
    }

    fn step(&mut self, ctx: &StepContext) -> StepDecisions {
        let Ok(step) = schedule_step(ctx, self);
        step
    }
}

impl AdmissionHost for Host {
    type Error = Infallible;

    fn state(&mut self) -> HostState<'_> {
        HostState {
            waiting: &mut self.waiting,
            ready: &mut self.ready,
            ledger: self.ledger.as_ref(),
            pool: &mut self.pool,
        }
    }

    fn examine(&mut self, request: RequestId, _free_slots: u32) -> Result<Candidate, Infallible> {
        Ok(self.candidates[&request])
    }

    fn admit(&mut self, admit: Admit) -> Result<bool, Infallible> {
        match admit {
            Admit::Cold { need_pages, .. } => {
                let pages = self.pool.allocate(need_pages);
                self.held
                    .extend(pages.expect("admission checked the pages"));
            }
            Admit::RestoreAtOnce {
                request,
                need_pages,
            } => {
                if !self.at_once_starts {
                    return Ok(false);
                }
                let pages = self.pool.allocate(need_pages);
                self.held
                    .extend(pages.expect("admission checked the pages"));
                self.candidates.remove(&request);
            }
            Admit::Ready { request } => {
                if self.lost.contains(&request) {
                    self.ready
                        .move_to(request, &mut self.waiting)
                        .expect("ready");
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    fn fall_back(&mut self, request: RequestId, _cause: &FallbackCause) -> Result<u32, Infallible> {
        self.fallbacks.push(request);
        let need_pages = 2;
        self.candidates
            .insert(request, Candidate::Cold { need_pages });
        Ok(need_pages)
    }
}

fn setup(n_usable: u32, slots: u32) -> Host {
    Host {
        waiting: WaitingQueue::new(QueuePolicy::Fcfs),
        ready: WaitingQueue::new(QueuePolicy::Fcfs),
        ledger: Some(Ledger::new(geometry(), LedgerConfig::new(slots))),
        pool: PagePool::new(1 + n_usable).expect("pool"),
        candidates: HashMap::new(),
        fallbacks: Vec::new(),
        held: Vec::new(),
        lost: Vec::new(),
        at_once_starts: true,
    }
}

fn admitted(decisions: &[Decision]) -> Vec<u64> {
    decisions
        .iter()
        .filter_map(|decision| match decision {
            Decision::AdmitCold { request, .. }
            | Decision::AdmitReady { request }
            | Decision::AdmitRestoreAtOnce { request, .. } => Some(request.0),
            _ => None,
        })
        .collect()
}

#[test]
fn q1_blocked_head_lets_only_ready_imports_pass() {
    let mut host = setup(8, 8);
    let _hog = host.pool.allocate(6).expect("pages");
    for id in 1..=5 {
        host.push(id);
    }
    host.set(1, Candidate::Cold { need_pages: 3 }); // blocked: 2 free
    host.set(2, Candidate::Cold { need_pages: 1 }); // would fit, but FCFS stops
    host.set(3, Candidate::Cold { need_pages: 1 }); // behind the blocked head: not examined
    host.set(4, Candidate::RestoreReady);
    host.set(5, Candidate::RestoreReady);
    host.mark_ready(4);
    let ctx = StepContext::default();
    let step = host.step(&ctx);
    assert_eq!(admitted(&step.decisions), vec![4]);
    let blocked = step.blocked.expect("head blocked");
    assert_eq!(blocked.request, RequestId(1));
    assert!(matches!(
        blocked.reason,
        BlockReason::Pressure {
            need_pages: 3,
            available_pages: 2,
            ..
        }
    ));
    assert_eq!(step.examined, 2);
    assert_eq!(host.waiting.len(), 4);
}

#[test]
fn q1_a_request_behind_an_unanswered_lookup_blocks_the_head_and_only_ready_imports_pass() {
    let mut host = setup(8, 8);
    for id in 1..=3 {
        host.push(id);
    }
    host.set(1, Candidate::WaitsBehind);
    host.set(2, Candidate::Cold { need_pages: 1 });
    host.set(3, Candidate::RestoreReady);
    host.mark_ready(3);
    let step = host.step(&StepContext::default());
    assert_eq!(
        admitted(&step.decisions),
        vec![3],
        "the ready import passes"
    );
    let blocked = step.blocked.expect("head blocked");
    assert_eq!(
        (blocked.request, blocked.reason),
        (RequestId(1), BlockReason::WaitsBehind)
    );
    assert_eq!(
        host.waiting
            .iter()
            .map(|(_, request)| request.0)
            .collect::<Vec<_>>(),
        vec![1, 2],
        "the cold request behind it waits, though its page would fit"
    );
}

#[test]
fn q1_ready_imports_ahead_of_the_head_are_admitted_in_order_and_a_spent_budget_blocks_the_head() {
    let mut host = setup(8, 8);
    for id in 1..=4 {
        host.push(id);
    }
    host.set(1, Candidate::RestoreReady);
    host.set(2, Candidate::OutOfBudget);
    host.set(3, Candidate::Cold { need_pages: 1 });
    host.set(4, Candidate::RestoreReady);
    host.mark_ready(1);
    host.mark_ready(4);
    let step = host.step(&StepContext::default());
    assert_eq!(admitted(&step.decisions), vec![1, 4]);
    let blocked = step.blocked.expect("head blocked");
    assert_eq!(
        (blocked.request, blocked.reason),
        (RequestId(2), BlockReason::OutOfBudget)
    );
    assert_eq!(
        step.examined, 3,
        "the head, and the ready imports around it"
    );
    assert_eq!(
        host.waiting
            .iter()
            .map(|(_, request)| request.0)
            .collect::<Vec<_>>(),
        vec![2, 3]
    );
    assert!(host.ready.is_empty());
    // A ready import that lost its pages is not admitted: the host requeued it, and the walk goes on.
    let mut host = setup(8, 8);
    for id in 1..=2 {
        host.push(id);
        host.set(id, Candidate::RestoreReady);
        host.mark_ready(id);
    }
    host.lost.push(RequestId(1));
    let step = host.step(&StepContext::default());
    assert_eq!(admitted(&step.decisions), vec![2]);
    assert_eq!(
        host.waiting.order_of(RequestId(1)).map(|order| order.seq),
        Some(0)
    );
    // A listed import that is no longer ready waits at its place like anyone else.
    let mut host = setup(8, 8);
    for id in 1..=2 {
        host.push(id);
    }
    host.set(1, Candidate::OutOfBudget);
    host.set(2, Candidate::OutOfBudget);
    host.mark_ready(2);
    let step = host.step(&StepContext::default());
    assert_eq!(
        (step.examined, host.waiting.len(), host.ready.len()),
        (2, 2, 0)
    );
    assert_eq!(
        host.waiting.order_of(RequestId(2)).map(|order| order.seq),
        Some(1)
    );
}

#[test]
fn withdrawn_request_leaves_the_queue_and_the_walk_goes_on() {
    let mut host = setup(8, 8);
    for id in 1..=2 {
        host.push(id);
    }
    host.set(1, Candidate::Withdrawn);
    host.set(2, Candidate::Cold { need_pages: 1 });
    let step = host.step(&StepContext::default());
    assert_eq!(
        step.decisions,
        vec![
            Decision::Withdrawn {
                request: RequestId(1)
            },
            Decision::AdmitCold {
                request: RequestId(2),
                need_pages: 1
            }
        ]
    );
    assert!(host.waiting.is_empty() && step.blocked.is_none());
}

#[test]
fn g1_without_a_ledger_restores_at_once_or_fall_back_to_cold_and_slots_come_from_the_context() {
    let mut host = setup(8, 8);
    host.ledger = None;
    let _hog = host.pool.allocate(3).expect("pages");
    for id in 1..=4 {
        host.push(id);
    }
    host.set(1, Candidate::RestoreAtOnce { need_pages: 4 }); // fits: 5 free
    host.set(2, Candidate::RestoreAtOnce { need_pages: 3 }); // 1 free: falls back, 2 cold pages do not fit
    host.set(3, Candidate::Cold { need_pages: 1 });
    let ctx = StepContext {
        max_running_slots: 4,
        ..StepContext::default()
    };
    let step = host.step(&ctx);
    assert_eq!(
        step.decisions,
        vec![
            Decision::AdmitRestoreAtOnce {
                request: RequestId(1),
                need_pages: 4
            },
            Decision::FellBack {
                request: RequestId(2),
                cause: FallbackCause::NotAtOnce {
                    need_pages: 3,
                    available_pages: 1
                }
            },
        ]
    );
    assert!(matches!(
        step.blocked.expect("blocked").reason,
        BlockReason::Pressure {
            need_pages: 2,
            available_pages: 1,
            free_slots: 3
        }
    ));
    assert_eq!(host.pool.n_free(), 1);
    // No free slot: a restore at once waits as it is (no fallback).
    let mut host = setup(8, 8);
    host.ledger = None;
    host.push(1);
    host.set(1, Candidate::RestoreAtOnce { need_pages: 1 });
    let full = StepContext {
        running_requests: 4,
        max_running_slots: 4,
        ..StepContext::default()
    };
    let step = host.step(&full);
    assert!(step.decisions.is_empty() && host.fallbacks.is_empty());
    assert!(matches!(
        step.blocked.expect("blocked").reason,
        BlockReason::Pressure { free_slots: 0, .. }
    ));
    // A restore at once the host cannot start (no copy slot) falls back too.
    let mut host = setup(8, 8);
    host.ledger = None;
    host.at_once_starts = false;
    host.push(1);
    host.set(1, Candidate::RestoreAtOnce { need_pages: 1 });
    let step = host.step(&ctx);
    assert_eq!(admitted(&step.decisions), vec![1]);
    assert!(matches!(
        step.decisions[0],
        Decision::FellBack {
            cause: FallbackCause::NotAtOnce { .. },
            ..
        }
    ));
}

/// A blocked head on a full pool, `n_waiting` cold requests behind it and one ready import among them. (Pending
/// restores are not in the walk: the engine's coordinator polls them, pinned by its own Q8 test.)
fn q8_step_work(n_waiting: u64) -> [u32; 2] {
    let mut host = setup(64, 1024);
    let _full = host.pool.allocate(64).expect("fill the pool");
    host.push(0);
    host.set(0, Candidate::Cold { need_pages: 2 });
    for id in 1..=n_waiting {
        host.push(id);
        host.set(id, Candidate::Cold { need_pages: 1 });
    }
    let ready = n_waiting / 2 + 1;
    host.set(ready, Candidate::RestoreReady);
    host.mark_ready(ready);
    let ctx = StepContext::default();
    let mut work = [0; 2];
    for slot in &mut work {
        let step = host.step(&ctx);
        assert!(matches!(
            step.blocked.expect("blocked").reason,
            BlockReason::Pressure { .. }
        ));
        *slot = step.examined;
    }
    work
}

#[test]
fn q8_step_work_does_not_grow_with_the_waiting_queue() {
    let expected = [2, 1];
    for n_waiting in [10, 100, 1_000, 10_000] {
        assert_eq!(q8_step_work(n_waiting), expected, "{n_waiting} waiting");
    }
}

#[test]
fn r2_watermark_applies_only_while_other_work_is_scheduled() {
    for (other_work, expect) in [(false, vec![1]), (true, vec![])] {
        let mut host = setup(8, 8);
        host.push(1);
        host.set(1, Candidate::Cold { need_pages: 6 });
        let ctx = StepContext {
            watermark_pages: 3,
            other_work_scheduled: other_work,
            ..StepContext::default()
        };
        let step = host.step(&ctx);
        assert_eq!(admitted(&step.decisions), expect, "other work {other_work}");
    }
    // Once the step admitted something, the watermark applies to the rest; unticketed prefills count too.
    let mut host = setup(8, 8);
    for id in 1..=3 {
        host.push(id);
        host.set(id, Candidate::Cold { need_pages: 2 });
    }
    let ctx = StepContext {
        watermark_pages: 1,
        unticketed_prefill_pages: 2,
        ..StepContext::default()
    };
    let step = host.step(&ctx);
    // 8 free - 2 prefill: first 2 admitted (the host takes them); then 6 - 2 - 1 = 3 >= 2; then 4 - 2 - 1 = 1 < 2.
    assert_eq!(admitted(&step.decisions), vec![1, 2]);
}

#[test]
fn r3_an_impossible_cold_request_is_rejected_and_takes_nothing() {
    let mut host = setup(4, 8);
    host.push(1);
    host.push(2);
    host.set(1, Candidate::Cold { need_pages: 5 });
    host.set(2, Candidate::Cold { need_pages: 2 });
    let step = host.step(&StepContext::default());
    assert!(matches!(
        step.decisions[0],
        Decision::Rejected {
            need_pages: 5,
            usable_pages: 4,
            ..
        }
    ));
    assert_eq!(
        step.decisions[1],
        Decision::AdmitCold {
            request: RequestId(2),
            need_pages: 2
        }
    );
    // The impossible request took nothing; only the cold admission's 2 pages are gone.
    assert_eq!(host.held.len(), 2);
    assert_eq!(host.pool.n_free(), 4 - 2);
}

#[test]
fn r5_free_slots_cap_admissions() {
    let mut host = setup(64, 4);
    for id in 1..=6 {
        host.push(id);
        host.set(id, Candidate::Cold { need_pages: 1 });
    }
    let ctx = StepContext {
        running_requests: 1,
        ..StepContext::default()
    };
    let step = host.step(&ctx);
    assert_eq!(admitted(&step.decisions), vec![1, 2, 3]);
    assert!(matches!(
        step.blocked.expect("blocked").reason,
        BlockReason::Pressure { free_slots: 0, .. }
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        // PROPTEST_CASES overrides the count (e.g. 10x before a release).
        std::env::var("PROPTEST_CASES").ok().and_then(|cases| cases.parse().ok()).unwrap_or(128)
    ))]

    /// FCFS holds among requests that do not own capacity: across steps, a cold request is admitted only after
    /// every cold request pushed before it, also when some wait behind an unanswered lookup for a few steps
    /// first (`WaitsBehind`); ready imports may pass; admitted requests leave the queues; the host's admissions
    /// never take a page that is not there.
    #[test]
    fn prop_fcfs_order_holds_among_requests_without_capacity(
        needs in proptest::collection::vec((1u32..6, proptest::bool::weighted(0.2), 0usize..3), 1..40),
        frees in proptest::collection::vec(0u32..8, 1..20),
    ) {
        let mut host = setup(16, 64);
        let mut hog = host.pool.allocate(12).expect("pages");
        for (id, &(_, ready, _)) in needs.iter().enumerate() {
            let id = id as u64;
            host.push(id);
            if ready {
                host.set(id, Candidate::RestoreReady);
                host.mark_ready(id);
            }
        }
        let mut cold_admitted: Vec<u64> = Vec::new();
        for (step_idx, &n_free) in frees.iter().enumerate() {
            for (id, &(need_pages, ready, waits)) in needs.iter().enumerate() {
                if !ready {
                    let candidate = if step_idx < waits {
                        Candidate::WaitsBehind
                    } else {
                        Candidate::Cold { need_pages }
                    };
                    host.set(id as u64, candidate);
                }
            }
            let n_free = (n_free as usize).min(hog.len());
            let freed: Vec<_> = hog.drain(..n_free).collect();
            host.pool.free_all(&freed).expect("free");
            let step = host.step(&StepContext::default());
            for decision in &step.decisions {
                if let Decision::AdmitCold { request, .. } = decision {
                    cold_admitted.push(request.0);
                }
                if let Decision::AdmitCold { request, .. } | Decision::AdmitReady { request } = decision {
                    prop_assert!(host.waiting.order_of(*request).is_none());
                    prop_assert!(host.ready.order_of(*request).is_none());
                }
            }
            // Pages the host took are freed later like the rest, as an engine's requests finish.
            hog.append(&mut host.held);
            host.pool.check_invariants().unwrap();
        }
        let cold_order: Vec<u64> =
            (0..needs.len() as u64).filter(|&id| !needs[id as usize].1).collect();
        prop_assert_eq!(&cold_admitted[..], &cold_order[..cold_admitted.len()]);
    }
}
