//! The engine on CUDA page storage (L1, L2, L5): without a driver, asking for it is an error naming
//! `storage` (asserted here, on machines without a GPU); with one, agents sessions restore through CUDA
//! copies straight into the pool's device pages and every restored page is read back from the device and
//! compared with recompute (E3), and cancel, reset and shutdown with copies in flight leave no page leaked.
//! The GPU tests pass `kv_pool::gpu_test_gate` first: without a driver they print `skipped: <test>: <reason>`
//! and log it for `cargo xtask` to count, unless `KVGATE_REQUIRE_GPU=1`, which makes a missing driver a
//! failure (`cargo xtask gpu` sets it on machines with a driver).

use engine::{CopyEngineKind, Engine, EngineParams, Error, Policy, StorageKind};
use kv_pool::RequestId;

use crate::agents::{Agents, run_agents, tokens};
use crate::contract::{TPP, params, seed_checkpoint, spec};

const CUDA: StorageKind = StorageKind::Cuda { device: 0 };

/// `params` on CUDA storage with CUDA copies, restores verified.
fn cuda_params(policy: Policy, n_pages: u32) -> EngineParams {
    EngineParams {
        storage: CUDA,
        copy_engine: CopyEngineKind::Cuda,
        verify_restores: true,
        ..params(policy, n_pages)
    }
}

/// Whether GPU test `test` runs here: `false` (printed, and logged for `cargo xtask`) without a driver, a
/// failure instead when `KVGATE_REQUIRE_GPU=1`.
fn gpu_present(test: &str) -> bool {
    kv_pool::gpu_test_gate(test).unwrap()
}

#[test]
fn cuda_storage_without_a_driver_is_an_error_naming_storage_never_a_panic() {
    let built = Engine::new(cuda_params(Policy::Reserved, 64));
    match kv_pool::cuda_available() {
        Err(reason) => {
            let error = built.unwrap_err();
            let Error::InvalidParam { name, reason: why } = &error else {
                panic!("expected InvalidParam naming storage, got {error}");
            };
            assert_eq!(*name, "storage");
            assert!(why.contains(&reason), "{error}");
            let message = error.to_string();
            assert!(
                message.contains("needs an NVIDIA driver")
                    && message.contains("[pool] storage = \"host\""),
                "the error says what to do: {message}"
            );
        }
        Ok(()) => {
            built.expect("an engine on CUDA storage");
            // A device the machine lacks is the same clear error.
            let absent = EngineParams {
                storage: StorageKind::Cuda { device: 63 },
                ..cuda_params(Policy::Reserved, 64)
            };
            let message = Engine::new(absent).unwrap_err().to_string();
            assert!(message.contains("storage"), "{message}");
        }
    }
}

#[test]
fn cuda_copies_need_cuda_storage_and_host_copies_take_any_storage() {
    let host_storage = EngineParams {
        copy_engine: CopyEngineKind::Cuda,
        ..params(Policy::Reserved, 64)
    };
    let message = Engine::new(host_storage).unwrap_err().to_string();
    assert!(
        message.contains("copy_engine")
            && message.contains("storage is host")
            && message.contains("set storage to cuda"),
        "{message}"
    );
    let bad_device = EngineParams {
        storage: StorageKind::Cuda { device: 64 },
        ..params(Policy::Reserved, 64)
    };
    let message = Engine::new(bad_device).unwrap_err().to_string();
    assert!(
        message.contains("storage") && message.contains("at most 63"),
        "{message}"
    );
}

#[test]
fn cuda_agents_restore_into_device_pages_verified_under_every_policy() {
    if !gpu_present("cuda_agents_restore_into_device_pages_verified_under_every_policy") {
        return;
    }
    let agents = Agents {
        n_agents: 4,
        turns: 4,
        first_prompt_tokens: 512,
        turn_input_tokens: 32,
        response_tokens: 48,
        think_s: 1.0,
        seed: 11,
    };
    for policy in [Policy::Ordinary, Policy::PagesOnly, Policy::Reserved] {
        let run = run_agents(cuda_params(policy, 129), agents, 1);
        assert_eq!(run.metrics.requests_finished, 16, "{policy}");
        assert_eq!(run.metrics.leaked_pages, 0, "{policy}");
        if policy == Policy::Reserved {
            assert!(
                run.metrics.later_turns_restored > 0,
                "{policy}: {:?}",
                run.metrics
            );
            assert!(
                run.pages_verified > 0,
                "restored device pages read back equal recompute (E3)"
            );
        }
    }
    // Host copies into device pages through `PageStorage` work too.
    for copy_engine in [
        CopyEngineKind::Inline,
        CopyEngineKind::Threaded { workers: 2 },
        CopyEngineKind::Reordering {
            workers: 2,
            seed: 5,
        },
    ] {
        let params = EngineParams {
            copy_engine,
            ..cuda_params(Policy::Reserved, 129)
        };
        let run = run_agents(params, agents, 1);
        assert_eq!(run.metrics.leaked_pages, 0, "{copy_engine:?}");
        assert!(run.pages_verified > 0, "{copy_engine:?}");
    }
}

#[test]
fn cuda_cancel_reset_and_shutdown_with_copies_in_flight_leak_nothing() {
    if !gpu_present("cuda_cancel_reset_and_shutdown_with_copies_in_flight_leak_nothing") {
        return;
    }
    cancel_reset_and_shutdown_with_copies_in_flight(|policy| cuda_params(policy, 256));
}

/// The same on host storage with modeled copies, so the sequence and its precondition run in CI: the test
/// that claims copies in flight asserts that they are (issue 36, item 1: the CUDA test cancelled after one
/// step that only sent lookups, with no copy in flight).
#[test]
fn host_cancel_reset_and_shutdown_with_copies_in_flight_leak_nothing() {
    cancel_reset_and_shutdown_with_copies_in_flight(|policy| EngineParams {
        verify_restores: true,
        ..params(policy, 256)
    });
}

/// Three restores copy at once; cancel, a forced reset and shutdown act while copies are in flight (asserted
/// before each acts), and no page leaks; the engine stays usable and a later restore is verified.
fn cancel_reset_and_shutdown_with_copies_in_flight(params_of: impl Fn(Policy) -> EngineParams) {
    for policy in [Policy::Ordinary, Policy::PagesOnly, Policy::Reserved] {
        let mut engine = Engine::new(params_of(policy)).unwrap();
        let histories: Vec<Vec<u32>> = (0..3u32)
            .map(|agent| tokens(21, agent, 0, 40 * TPP))
            .collect();
        for (id, history) in (1..).zip(&histories) {
            seed_checkpoint(&mut engine, id, history, 1);
        }
        for (id, history) in (10..).zip(&histories) {
            let mut prompt = history.clone();
            prompt.extend(tokens(21, id as u32, 1, 8));
            engine.submit(spec(id, prompt, 4, engine.now())).unwrap();
        }
        // Lookups are answered first; step until the restores' copies are in flight.
        let mut steps = 0;
        while engine.restore_gauges().copies_in_flight == 0 {
            engine.step().unwrap();
            engine.check_invariants().unwrap();
            steps += 1;
            assert!(steps < 1_000, "{policy}: no copy ever in flight");
        }
        engine.cancel(RequestId(10)).unwrap();
        engine.check_invariants().unwrap();
        let in_flight = engine.restore_gauges().copies_in_flight;
        assert!(in_flight > 0, "{policy}: no copy in flight at the reset");
        engine.force_reset_prefix_cache().unwrap();
        engine.check_invariants().unwrap();
        let report = engine.shutdown().unwrap();
        engine.check_invariants().unwrap();
        assert!(report.cancelled.len() >= 2, "{policy}: {report:?}");
        assert_eq!(engine.metrics().leaked_pages, 0, "{policy}");
        assert_eq!(engine.restore_gauges().copies_in_flight, 0, "{policy}");
        // The engine stays usable: a restore after the shutdown is verified.
        let mut prompt = histories[0].clone();
        prompt.extend(tokens(21, 0, 2, 8));
        engine.submit(spec(20, prompt, 4, engine.now())).unwrap();
        engine.run_until_idle(100_000).unwrap();
        engine.check_invariants().unwrap();
        assert_eq!(engine.metrics().leaked_pages, 0, "{policy}");
    }
}
