//! Tests of the drivers' workload bookkeeping.

use super::*;
use crate::run::live_model::{MODEL_AGENTS_MAX, MODEL_TURNS_MAX};
use crate::workload::agents::TurnPriority;
use crate::workload::mooncake::parse_trace;

#[test]
fn later_turns_extend_an_earlier_context_not_just_the_shared_first_block() {
    let trace = parse_trace(
        std::io::Cursor::new(
            "{\"timestamp\": 0, \"input_length\": 1100, \"output_length\": 1, \"hash_ids\": [0, 1, 2]}\n\
             {\"timestamp\": 1, \"input_length\": 900, \"output_length\": 1, \"hash_ids\": [0, 5]}\n\
             {\"timestamp\": 2, \"input_length\": 1600, \"output_length\": 1, \"hash_ids\": [0, 1, 7, 8]}\n\
             {\"timestamp\": 3, \"input_length\": 1300, \"output_length\": 1, \"hash_ids\": [0, 5, 9]}\n",
        ),
        "t.jsonl",
    )
    .unwrap();
    // Request 2 extends request 0's two full blocks; request 3 shares only request 1's partial block.
    assert_eq!(later_turns(&trace), vec![false, false, true, false]);
}

#[test]
fn l2_reordering_copies_from_the_config_run_agents_with_every_restore_verified() {
    let (mut config, spec) = small_agents();
    config.restore.copy_engine = "reordering".to_string();
    config.restore.copy_workers = 2;
    config.restore.copy_seed = 3;
    config.restore.verify = true;
    let params = config.engine_params(Policy::Reserved).unwrap();
    assert!(params.verify_restores);
    let mut engine = Engine::new(params).unwrap();
    let mut checked = Ok(());
    drive_agents(&mut engine, &spec, &mut |_, _| {}, &mut |engine, _| {
        if checked.is_ok() {
            // The reordering engine's write check (L2) runs with the other invariants.
            checked = engine.check_invariants();
        }
        true
    })
    .unwrap();
    checked.unwrap();
    let metrics = engine.metrics();
    assert!(metrics.later_turns_restored > 0, "{metrics:?}");
    assert_eq!(metrics.leaked_pages, 0);
}

#[test]
fn cuda_storage_runs_or_without_a_driver_fails_naming_storage() {
    let (mut config, mut spec) = small_agents();
    config.pool.storage = "cuda".to_string();
    config.restore.copy_engine = "cuda".to_string();
    spec.n_agents = 2;
    spec.turns = 2;
    let run = run_agents(&config, &spec, Policy::Reserved, &mut |_, _| {});
    match kv_pool::cuda_available() {
        Err(reason) => {
            let message = run.unwrap_err().to_string();
            assert!(
                message.contains("invalid engine parameter storage")
                    && message.contains(&reason)
                    && message.contains("--storage host"),
                "{message}"
            );
        }
        Ok(()) => assert_eq!(run.unwrap().leaked_pages, 0),
    }
}

/// `--turn-priority progress` reorders the waiters, and only that: under every policy every turn still
/// finishes, nothing leaks, `reserved` still serves every later turn from cache, and the schedule moves.
#[test]
fn q1_turns_by_session_progress_finish_every_turn_and_leak_nothing_under_every_policy() {
    let (config, _) = small_agents();
    // Six sessions on 256 pages: several restores wait at once, so their order matters.
    let arrival = AgentsSpec {
        n_agents: 6,
        turns: 6,
        ..AgentsSpec::default()
    };
    let progress = AgentsSpec {
        turn_priority: TurnPriority::Progress,
        ..arrival.clone()
    };
    let turns = arrival.n_agents * arrival.turns;
    let mut moved = false;
    for policy in Policy::ALL {
        let by_arrival = run_agents(&config, &arrival, policy, &mut |_, _| {}).unwrap();
        let by_progress = run_agents(&config, &progress, policy, &mut |_, _| {}).unwrap();
        assert_eq!(by_progress.requests_finished, turns, "{policy}");
        assert_eq!(by_progress.requests_cancelled, 0, "{policy}");
        assert_eq!(by_progress.leaked_pages, 0, "{policy}");
        if policy == Policy::Reserved {
            assert_eq!(
                by_progress.later_turns_restored + by_progress.later_turns_local_hit,
                by_progress.later_turns,
                "reserved serves every later turn of this workload from cache in either order"
            );
        }
        moved |= by_progress.mean_turn_s != by_arrival.mean_turn_s;
    }
    assert!(moved, "the order changes some policy's schedule");
}

/// Issue 27, item 4: a replay the liveness watchdog stops still returns what it measured until then, marked
/// stopped with the watchdog's message naming the stuck requests, instead of losing the whole report.
#[test]
fn a_replay_the_watchdog_stops_keeps_its_report_marked_stopped() {
    let trace = parse_trace(
        std::io::Cursor::new(
            "{\"timestamp\": 0, \"input_length\": 4000, \"output_length\": 400, \"hash_ids\": [0, 1, 2, 3, 4, 5, 6, 7]}\n\
             {\"timestamp\": 0, \"input_length\": 4000, \"output_length\": 400, \"hash_ids\": [8, 9, 10, 11, 12, 13, 14, 15]}\n",
        ),
        "t.jsonl",
    )
    .unwrap();
    let later = later_turns(&trace);
    let mut config = EngineConfig::default();
    // A watchdog far shorter than one prefill chunk: nothing produces a token in time.
    config.scheduler.stall_timeout_s = 1e-6;
    let run = run_replay(
        &config,
        &trace,
        &later,
        1.0,
        Policy::Reserved,
        &mut |_, _| {},
    )
    .unwrap();
    let stopped = run.stopped.as_deref().expect("stopped by the watchdog");
    assert!(
        stopped.starts_with("no progress for") && stopped.contains("stuck requests: req-0"),
        "{stopped}"
    );
    assert!(run.requests_finished < 2, "{run:?}");
    assert!(
        crate::report::table(std::slice::from_ref(&run))
            .contains("INCOMPLETE: reserved stopped early")
    );
    assert_eq!(
        crate::report::run_json(&run)["stopped"],
        serde_json::json!(stopped)
    );
}

/// Stops the run it watches after `steps` steps, counting the steps it saw.
struct StopAfter {
    steps: u64,
    seen: u64,
}

impl Observer for StopAfter {
    fn step(&mut self, _engine: &Engine, _report: &StepReport) {
        self.seen += 1;
    }

    fn stop(&mut self) -> bool {
        self.seen >= self.steps
    }
}

#[test]
fn a_model_run_refuses_sizes_past_its_limits_naming_the_option() {
    assert!(ChatSpec::default().validate().is_ok());
    let cases = [
        (
            ChatSpec {
                n_agents: 0,
                ..ChatSpec::default()
            },
            "--agents",
        ),
        (
            ChatSpec {
                n_agents: MODEL_AGENTS_MAX + 1,
                ..ChatSpec::default()
            },
            "--agents",
        ),
        (
            ChatSpec {
                turns: 0,
                ..ChatSpec::default()
            },
            "--turns",
        ),
        (
            ChatSpec {
                turns: MODEL_TURNS_MAX + 1,
                ..ChatSpec::default()
            },
            "--turns",
        ),
        (
            ChatSpec {
                answer_tokens: 0,
                ..ChatSpec::default()
            },
            "answer tokens",
        ),
        (
            ChatSpec {
                think_s: f64::NAN,
                ..ChatSpec::default()
            },
            "--think-s",
        ),
        (
            ChatSpec {
                think_s: -1.0,
                ..ChatSpec::default()
            },
            "--think-s",
        ),
    ];
    for (spec, option) in cases {
        let err = spec.validate().unwrap_err().to_string();
        assert!(err.contains(option), "{spec:?}: {err}");
    }
}

#[test]
fn an_observer_stops_an_agents_run_or_a_replay_at_the_step_it_asks() {
    let (config, spec) = small_agents();
    let mut stop = StopAfter { steps: 5, seen: 0 };
    let stopped = run_agents_observed(&config, &spec, Policy::Reserved, &mut |_, _| {}, &mut stop);
    assert!(matches!(stopped, Err(Error::Interrupted)), "{stopped:?}");
    assert_eq!(stop.seen, 5);

    let shape = crate::workload::mooncake::generate::TraceShape {
        n_requests: 200,
        rate_per_s: 4.0,
        ..Default::default()
    };
    let trace = crate::workload::mooncake::generate::generate(&shape).unwrap();
    let later = later_turns(&trace);
    let mut config = EngineConfig::default();
    config.pool.pages = 8192;
    let mut stop = StopAfter { steps: 3, seen: 0 };
    let replay = |stop: &mut StopAfter| {
        run_replay_observed(
            &config,
            &trace,
            &later,
            1.0,
            Policy::Reserved,
            &mut |_, _| {},
            stop,
        )
    };
    assert!(matches!(replay(&mut stop), Err(Error::Interrupted)));
    assert_eq!(stop.seen, 3);
    // An observer that never asks lets the run finish.
    let mut never = StopAfter {
        steps: u64::MAX,
        seen: 0,
    };
    let finished = replay(&mut never).unwrap();
    assert_eq!(finished.stopped, None);
    assert!(never.seen > 3);
}

#[test]
fn every_chat_turn_has_a_question_of_its_own_session() {
    let spec = ChatSpec::default();
    assert_ne!(spec.question(0, 0), spec.question(1, 0));
    assert_ne!(spec.question(0, 1), spec.question(0, 0));
    assert!(!spec.question(7, 7).is_empty());
}
