//! The engine's admission walk, which is `admission::schedule_step`, seen through the step reports: Q8's
//! bound on the work of a step with a blocked head.

use engine::{Engine, Policy};
use kv_pool::RequestId;

use crate::agents::tokens;
use crate::contract::{TPP, params, spec};

/// The report of one step with a blocked cold head: `n_waiting` requests wait behind a running decode.
fn blocked_head_step(n_waiting: u64) -> engine::StepReport {
    let mut engine = Engine::new(params(Policy::Reserved, 64)).unwrap();
    let hog = spec(0, tokens(7, 0, 0, 40 * TPP - 1), 100, engine.now());
    engine.submit(hog).unwrap();
    while !engine.step().expect("step").decodes.contains(&RequestId(0)) {
        assert!(engine.steps() < 50, "the decode does not start");
    }
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
            (1, 0),
            "{n_waiting} waiting"
        );
        assert!(report.decodes.contains(&RequestId(0)), "the decode runs");
    }
}
