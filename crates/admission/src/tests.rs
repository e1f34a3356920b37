//! Admission tests pinning R2-R5, Q1, Q8 and W1 at the step level, and the FCFS property test.

use std::collections::HashMap;
use std::time::Duration;

use kv_pool::{CacheGroup, Geometry, GroupKind, PagePool};
use proptest::prelude::*;
use reservation::{ErrorKind, Ledger, LedgerConfig, RequestId, RestoreSpec, Timestamp};

use crate::{Admission, AdmissionHost, BlockReason, Candidate, Decision, QueuePolicy, StepContext};

fn geometry() -> Geometry {
    let group = CacheGroup {
        kind: GroupKind::Full,
        bytes_per_page: 64,
    };
    Geometry::new(vec![group], 4, 1, 4096).expect("valid geometry")
}

/// A scripted engine: each request's candidate, and its cold need after a fallback.
#[derive(Default)]
struct Host {
    candidates: HashMap<RequestId, Candidate>,
    fallbacks: Vec<RequestId>,
}

impl Host {
    fn set(&mut self, id: u64, candidate: Candidate) {
        self.candidates.insert(RequestId(id), candidate);
    }
}

impl AdmissionHost for Host {
    fn examine(&mut self, req: RequestId) -> Candidate {
        self.candidates[&req]
    }

    fn fall_back(&mut self, req: RequestId, _cause: &reservation::Error) -> u32 {
        self.fallbacks.push(req);
        let need_pages = 2;
        self.candidates.insert(req, Candidate::Cold { need_pages });
        need_pages
    }
}

fn setup(n_usable: u32, slots: u32) -> (Admission, Ledger, PagePool, Host) {
    (
        Admission::new(QueuePolicy::Fcfs),
        Ledger::new(geometry(), LedgerConfig::new(slots)),
        PagePool::new(1 + n_usable).expect("pool"),
        Host::default(),
    )
}

fn restore(boundary: u32, prompt: u32) -> Candidate {
    Candidate::RestoreNeedsTicket(RestoreSpec::for_geometry(&geometry(), boundary, prompt, 16))
}

fn admitted(decisions: &[Decision]) -> Vec<u64> {
    decisions
        .iter()
        .filter_map(|decision| match decision {
            Decision::AdmitCold { req, .. } | Decision::AdmitReady { req } => Some(req.0),
            _ => None,
        })
        .collect()
}

#[test]
fn q1_blocked_head_lets_only_ready_imports_pass() {
    let (mut admission, mut ledger, mut pool, mut host) = setup(8, 8);
    let _hog = pool.allocate(6).expect("pages");
    for id in 1..=5 {
        admission.push(RequestId(id), 0).expect("new");
    }
    host.set(1, Candidate::Cold { need_pages: 3 }); // blocked: 2 free
    host.set(2, Candidate::Cold { need_pages: 1 }); // would fit, but FCFS stops
    host.set(3, Candidate::RestorePending); // still copying: schedules nothing
    host.set(4, Candidate::RestoreReady);
    host.set(5, Candidate::RestoreReady);
    admission
        .queue_mut()
        .mark_ready(RequestId(4))
        .expect("queued");
    let ctx = StepContext::default();
    let step = admission.schedule_step(&mut ledger, &mut pool, &ctx, Timestamp::ZERO, &mut host);
    assert_eq!(admitted(&step.decisions), vec![4]);
    let blocked = step.blocked.expect("head blocked");
    assert_eq!(blocked.req, RequestId(1));
    assert!(matches!(
        blocked.reason,
        BlockReason::Pressure {
            need_pages: 3,
            available_pages: 2,
            ..
        }
    ));
    assert_eq!((step.examined, step.restore_polls), (2, 0));
    assert_eq!(admission.queue().len(), 4);
    // The head is a copying import: it blocks too, and the ready one behind passes.
    let (mut admission, mut ledger, mut pool, mut host) = setup(8, 8);
    for id in [3, 2, 5] {
        admission.push(RequestId(id), 0).expect("new");
    }
    host.set(3, Candidate::RestorePending);
    host.set(2, Candidate::Cold { need_pages: 1 });
    host.set(5, Candidate::RestoreReady);
    admission
        .queue_mut()
        .mark_ready(RequestId(5))
        .expect("queued");
    let step = admission.schedule_step(&mut ledger, &mut pool, &ctx, Timestamp::ZERO, &mut host);
    assert_eq!(admitted(&step.decisions), vec![5]);
    assert_eq!(
        step.blocked.expect("blocked").reason,
        BlockReason::RestorePending
    );
}

/// A blocked restore head on a full pool, `n_waiting` cold requests behind it and one ready import among them.
fn q8_step_work(n_waiting: u64) -> [(u32, u32); 2] {
    let (mut admission, mut ledger, mut pool, mut host) = setup(64, 1024);
    let _full = pool.allocate(64).expect("fill the pool");
    admission.push(RequestId(0), 0).expect("new");
    host.set(0, restore(8, 16));
    for id in 1..=n_waiting {
        admission.push(RequestId(id), 0).expect("new");
        host.set(id, Candidate::Cold { need_pages: 1 });
    }
    let ready = n_waiting / 2 + 1;
    host.set(ready, Candidate::RestoreReady);
    admission
        .queue_mut()
        .mark_ready(RequestId(ready))
        .expect("queued");
    let ctx = StepContext::default();
    let mut work = [(0, 0); 2];
    for (step_idx, slot) in work.iter_mut().enumerate() {
        let now = Timestamp(Duration::from_secs(step_idx as u64));
        let step = admission.schedule_step(&mut ledger, &mut pool, &ctx, now, &mut host);
        assert!(matches!(
            step.blocked.expect("blocked").reason,
            BlockReason::RestorePressure(_)
        ));
        *slot = (step.examined, step.restore_polls);
    }
    work
}

#[test]
fn q8_step_work_does_not_grow_with_the_waiting_queue() {
    let expected = [(2, 1), (1, 1)];
    for n_waiting in [10, 100, 1_000, 10_000] {
        assert_eq!(q8_step_work(n_waiting), expected, "{n_waiting} waiting");
    }
}

#[test]
fn r2_watermark_applies_only_while_other_work_is_scheduled() {
    for (other_work, expect) in [(false, vec![1]), (true, vec![])] {
        let (mut admission, mut ledger, mut pool, mut host) = setup(8, 8);
        admission.push(RequestId(1), 0).expect("new");
        host.set(1, Candidate::Cold { need_pages: 6 });
        let ctx = StepContext {
            watermark_pages: 3,
            other_work_scheduled: other_work,
            ..StepContext::default()
        };
        let step =
            admission.schedule_step(&mut ledger, &mut pool, &ctx, Timestamp::ZERO, &mut host);
        assert_eq!(admitted(&step.decisions), expect, "other work {other_work}");
    }
    // Once the step admitted something, the watermark applies to the rest; unticketed prefills count too.
    let (mut admission, mut ledger, mut pool, mut host) = setup(8, 8);
    for id in 1..=3 {
        admission.push(RequestId(id), 0).expect("new");
        host.set(id, Candidate::Cold { need_pages: 2 });
    }
    let ctx = StepContext {
        watermark_pages: 1,
        unticketed_prefill_pages: 2,
        ..StepContext::default()
    };
    let step = admission.schedule_step(&mut ledger, &mut pool, &ctx, Timestamp::ZERO, &mut host);
    // 8 free - 2 prefill: first 2 admitted; then 8 - 4 - 1 = 3 >= 2; then 8 - 6 - 1 = 1 < 2.
    assert_eq!(admitted(&step.decisions), vec![1, 2]);
}

#[test]
fn r3_impossible_cold_is_rejected_and_an_impossible_restore_recomputes_at_once() {
    let (mut admission, mut ledger, mut pool, mut host) = setup(4, 8);
    admission.push(RequestId(1), 0).expect("new");
    admission.push(RequestId(2), 0).expect("new");
    host.set(1, Candidate::Cold { need_pages: 5 });
    host.set(2, restore(8, 40)); // 2 import + 8 credit pages > 4
    let step = admission.schedule_step(
        &mut ledger,
        &mut pool,
        &StepContext::default(),
        Timestamp::ZERO,
        &mut host,
    );
    assert!(matches!(
        step.decisions[0],
        Decision::Rejected {
            need_pages: 5,
            usable_pages: 4,
            ..
        }
    ));
    let Decision::FellBack { req, cause } = &step.decisions[1] else {
        panic!("expected a fallback: {:?}", step.decisions);
    };
    assert_eq!((req.0, cause.kind()), (2, ErrorKind::Impossible));
    assert_eq!(
        step.decisions[2],
        Decision::AdmitCold {
            req: RequestId(2),
            need_pages: 2
        }
    );
    assert_eq!((pool.n_free(), ledger.n_waiters()), (4, 0));
}

#[test]
fn r4_invalid_restore_falls_back_with_the_named_error() {
    let (mut admission, mut ledger, mut pool, mut host) = setup(16, 8);
    admission.push(RequestId(1), 0).expect("new");
    host.set(1, restore(20, 16)); // boundary past the prompt
    let step = admission.schedule_step(
        &mut ledger,
        &mut pool,
        &StepContext::default(),
        Timestamp::ZERO,
        &mut host,
    );
    assert_eq!(
        step.decisions[0],
        Decision::FellBack {
            req: RequestId(1),
            cause: reservation::Error::BoundaryPastPrompt {
                boundary_tokens: 20,
                prompt_tokens: 16,
            },
        }
    );
    assert_eq!(host.fallbacks, vec![RequestId(1)]);
    assert_eq!((pool.n_free(), ledger.n_tickets()), (16, 0));
}

#[test]
fn r5_free_slots_cap_admissions_and_tickets() {
    let (mut admission, mut ledger, mut pool, mut host) = setup(64, 4);
    for id in 1..=6 {
        admission.push(RequestId(id), 0).expect("new");
        host.set(id, Candidate::Cold { need_pages: 1 });
    }
    let ctx = StepContext {
        running_requests: 1,
        ..StepContext::default()
    };
    let step = admission.schedule_step(&mut ledger, &mut pool, &ctx, Timestamp::ZERO, &mut host);
    assert_eq!(admitted(&step.decisions), vec![1, 2, 3]);
    assert!(matches!(
        step.blocked.expect("blocked").reason,
        BlockReason::Pressure { free_slots: 0, .. }
    ));
    // A restore with no free slot is refused for pressure and leaves the pool untouched.
    host.set(4, restore(8, 16));
    let ctx = StepContext {
        running_requests: 4,
        ..StepContext::default()
    };
    let step = admission.schedule_step(&mut ledger, &mut pool, &ctx, Timestamp::ZERO, &mut host);
    let reason = step.blocked.expect("blocked").reason;
    assert!(matches!(
        reason,
        BlockReason::RestorePressure(reservation::Error::Pressure { free_slots: 0, .. })
    ));
    assert_eq!(pool.n_free(), 64);
}

#[test]
fn w1_expired_restore_is_admitted_to_recompute_and_its_state_cleared() {
    let (mut admission, mut ledger, mut pool, mut host) = setup(8, 8);
    let hog = pool.allocate(6).expect("pages");
    admission.push(RequestId(1), 0).expect("new");
    host.set(1, restore(8, 16));
    let ctx = StepContext::default();
    let at = |secs| Timestamp(Duration::from_secs(secs));
    let step = admission.schedule_step(&mut ledger, &mut pool, &ctx, at(10), &mut host);
    assert!(matches!(
        step.blocked.expect("blocked").reason,
        BlockReason::RestorePressure(_)
    ));
    assert!(ledger.is_waiter(RequestId(1)));
    pool.free_all(&hog[..4]).expect("free");
    let step = admission.schedule_step(&mut ledger, &mut pool, &ctx, at(70), &mut host);
    let Decision::FellBack { cause, .. } = &step.decisions[0] else {
        panic!("expected expiry: {:?}", step.decisions);
    };
    assert_eq!(cause.kind(), ErrorKind::Expired);
    assert_eq!(
        step.decisions[1],
        Decision::AdmitCold {
            req: RequestId(1),
            need_pages: 2
        }
    );
    assert!(!ledger.holds_anything(RequestId(1)));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// FCFS holds among requests that do not own capacity: across steps, a cold request is admitted only after
    /// every cold request pushed before it; ready imports may pass; admitted requests leave the queue.
    #[test]
    fn prop_fcfs_order_holds_among_requests_without_capacity(
        needs in proptest::collection::vec((1u32..6, proptest::bool::weighted(0.2)), 1..40),
        frees in proptest::collection::vec(0u32..8, 1..20),
    ) {
        let (mut admission, mut ledger, mut pool, mut host) = setup(16, 64);
        let mut held = pool.allocate(12).expect("pages");
        for (id, &(need_pages, ready)) in needs.iter().enumerate() {
            let id = id as u64;
            admission.push(RequestId(id), 0).expect("new");
            if ready {
                host.set(id, Candidate::RestoreReady);
                admission.queue_mut().mark_ready(RequestId(id)).expect("queued");
            } else {
                host.set(id, Candidate::Cold { need_pages });
            }
        }
        let mut cold_admitted: Vec<u64> = Vec::new();
        for (step_idx, &n_free) in frees.iter().enumerate() {
            let n_free = (n_free as usize).min(held.len());
            let freed: Vec<_> = held.drain(..n_free).collect();
            pool.free_all(&freed).expect("free");
            let now = Timestamp(Duration::from_secs(step_idx as u64));
            let step = admission.schedule_step(&mut ledger, &mut pool, &StepContext::default(), now, &mut host);
            for decision in &step.decisions {
                if let Decision::AdmitCold { req, need_pages } = decision {
                    cold_admitted.push(req.0);
                    held.extend(pool.allocate(*need_pages).expect("admission checked the pages"));
                }
                if let Decision::AdmitCold { req, .. } | Decision::AdmitReady { req } = decision {
                    prop_assert!(admission.queue().order_of(*req).is_none());
                }
            }
            pool.check_invariants();
        }
        let cold_order: Vec<u64> = (0..needs.len() as u64).filter(|&id| !needs[id as usize].1).collect();
        prop_assert_eq!(&cold_admitted[..], &cold_order[..cold_admitted.len()]);
    }
}
