//! The engine's admission walk, which is `admission::schedule_step`, seen through the step reports: Q8's
//! bound on the work of a step with a blocked head and a pending restore, and Q1's copying import that
//! schedules nothing.

use std::time::Duration;

use checkpoint_transfer::Fault;
use engine::{Engine, Policy, RequestPhase};
use kv_pool::RequestId;

use crate::agents::tokens;
use crate::contract::{TPP, params, seed_checkpoint, spec};

/// The report of one step with a blocked cold head: `n_waiting` requests wait behind a running decode, and a
/// restore waits for capacity with the coordinator.
fn blocked_head_step(n_waiting: u64) -> engine::StepReport {
    let mut engine = Engine::new(params(Policy::Reserved, 64)).unwrap();
    let history = tokens(7, 4242, 0, 22 * TPP);
    seed_checkpoint(&mut engine, 999, &history, 1);
    let hog = spec(0, tokens(7, 0, 0, 40 * TPP - 1), 100, engine.now());
    engine.submit(hog).unwrap();
    while !engine.step().expect("step").decodes.contains(&RequestId(0)) {
        assert!(engine.steps() < 50, "the decode does not start");
    }
    // A restore of 22 pages plus its continuation: it cannot reserve next to the decode, so it waits.
    let mut restore = history;
    restore.extend(tokens(7, 4242, 1, 8));
    engine
        .submit(spec(1_000_000, restore, 4, engine.now()))
        .unwrap();
    for id in 1..=n_waiting {
        // 30 pages each: none fits next to the decode's 40.
        let prompt = tokens(7, id as u32, 0, 30 * TPP);
        engine.submit(spec(id, prompt, 4, engine.now())).unwrap();
    }
    for _ in 0..50 {
        let report = engine.step().expect("step");
        engine.check_invariants().expect("invariants");
        if u64::from(report.waiting) == n_waiting {
            let report = engine.step().expect("step");
            engine.check_invariants().expect("invariants");
            assert!(
                engine
                    .request(RequestId(1_000_000))
                    .is_some_and(|view| view.is_waiter),
                "the restore waits for capacity"
            );
            return report;
        }
    }
    panic!("the {n_waiting} requests did not all reach the waiting queue");
}

#[test]
fn q8_engine_step_examines_the_blocked_head_only_however_long_the_queue() {
    for n_waiting in [10, 1_000] {
        let report = blocked_head_step(n_waiting);
        assert!(report.admitted.is_empty(), "{n_waiting}: {report:?}");
        assert_eq!(
            (report.examined, report.restore_polls),
            (1, 1),
            "{n_waiting} waiting: the blocked head examined, the pending restore polled once"
        );
        assert!(report.decodes.contains(&RequestId(0)), "the decode runs");
    }
}

#[test]
fn q1_a_copying_import_schedules_nothing_and_blocks_nobody() {
    let mut engine = Engine::new(params(Policy::Reserved, 64)).unwrap();
    let history = tokens(8, 1, 0, 10 * TPP);
    seed_checkpoint(&mut engine, 100, &history, 1);
    engine
        .inject_copy_fault(Fault::DelayNext {
            rank: 0,
            by: Duration::from_secs(5),
        })
        .expect("inline copies take faults");
    let mut restore = history;
    restore.extend(tokens(8, 1, 1, 8));
    engine.submit(spec(1, restore, 4, engine.now())).unwrap();
    engine
        .submit(spec(2, tokens(8, 2, 0, 4 * TPP), 4, engine.now()))
        .unwrap();
    engine.step().expect("step"); // the arrivals; the restore's copy starts
    let mut copying_steps = 0;
    while engine
        .request(RequestId(1))
        .is_some_and(|view| view.phase == RequestPhase::Restoring)
    {
        let report = engine.step().expect("step");
        engine.check_invariants().expect("invariants");
        let still_copying = engine
            .request(RequestId(1))
            .is_some_and(|view| view.phase == RequestPhase::Restoring);
        if !still_copying {
            break; // published in this step: admitted at once, as a ready import may be
        }
        copying_steps += 1;
        assert!(
            report.prefills.iter().all(|(id, _)| *id != RequestId(1))
                && !report.decodes.contains(&RequestId(1)),
            "a copying import schedules nothing: {report:?}"
        );
        assert!(copying_steps < 10_000, "the copy never lands");
    }
    assert!(
        copying_steps > 1,
        "the copy was in flight for several steps"
    );
    let metrics = engine.request_metrics();
    assert!(
        metrics.iter().any(|m| m.id == Some(RequestId(2))),
        "the cold request behind it ran to completion meanwhile"
    );
}
