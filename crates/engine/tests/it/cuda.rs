//! The engine on CUDA page storage (L1, L2, L5), opened here as the facade opens it for `[pool] storage =
//! "cuda"` and given to `Builder::page_storage` (CUDA copies) or `Builder::storage` (host copies through
//! `PageStorage`): on a GPU, agents sessions restore through CUDA copies straight into the pool's device
//! pages and every restored page is read back from the device and compared with recompute (E3), and cancel,
//! reset and shutdown with copies in flight leave no page leaked: on host storage, and on device storage
//! given through `Builder::page_storage` (the host-backed stand-in `FakeDevice`, and CUDA), its copy streams
//! held (`Device::hold_stream`) so the device itself says the copies are still queued when the engine acts.
//! Without a driver the facade's error naming `storage` is tested in `kvgate` (`parts`).
//! The GPU tests pass `kv_pool::gpu_test_gate` first: without a driver they print `skipped: <test>: <reason>`
//! and log it for `cargo xtask` to count, unless `KVGATE_REQUIRE_GPU=1`, which makes a missing driver a
//! failure (`cargo xtask gpu` sets it on machines with a driver).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use checkpoint_transfer::{
    CopyEngine, CopyJob, CudaCopyEngine, DeviceCopyEngine, PageBuf, StagingLimits,
};
use engine::{CopyEngineKind, Engine, EngineParams, Error, Policy, SimExecutor};
use kv_pool::{
    CudaStorage, Device, DeviceStorage, FakeDevice, PageId, PageStorage, RequestId, StreamHold,
};

use crate::agents::{Agents, run_agents_on, tokens};
use crate::contract::{TPP, params, seed_checkpoint, spec};

/// `params` with restores verified.
fn verified(policy: Policy, n_pages: u32) -> EngineParams {
    EngineParams {
        verify_restores: true,
        ..params(policy, n_pages)
    }
}

/// An engine of `params` on CUDA page storage of device 0: with CUDA copies, or, with `host_copies`, the
/// copy engine `params.copy_engine` names writing into it through `PageStorage`.
fn cuda_engine(params: EngineParams, host_copies: bool) -> Engine {
    let storage = Arc::new(
        CudaStorage::new(
            0,
            params.geometry.context_parallel(),
            params.pool_pages(),
            params.page_bytes as usize,
        )
        .expect("CUDA storage on device 0"),
    );
    let builder = Engine::builder(params);
    let builder = if host_copies {
        builder.storage(storage)
    } else {
        let copies = CudaCopyEngine::new(Arc::clone(&storage)).expect("CUDA copies");
        builder.page_storage(storage, Box::new(copies))
    };
    builder.build().expect("an engine on CUDA storage")
}

/// Whether GPU test `test` runs here: `false` (printed, and logged for `cargo xtask`) without a driver, a
/// failure instead when `KVGATE_REQUIRE_GPU=1`.
fn gpu_present(test: &str) -> bool {
    kv_pool::gpu_test_gate(test).unwrap()
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
        let run = run_agents_on(cuda_engine(verified(policy, 129), false), agents, 1);
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
            ..verified(Policy::Reserved, 129)
        };
        let run = run_agents_on(cuda_engine(params, true), agents, 1);
        assert_eq!(run.metrics.leaked_pages, 0, "{copy_engine:?}");
        assert!(run.pages_verified > 0, "{copy_engine:?}");
    }
}

/// On a GPU: CUDA page storage and the CUDA copy engine given to the engine, each rank's copy stream held by
/// a blocking host function (`Device::hold_stream`), so the device says the restores' pages are in flight
/// when cancel, reset and shutdown act.
#[test]
fn cuda_cancel_reset_and_shutdown_with_copies_in_flight_leak_nothing() {
    if !gpu_present("cuda_cancel_reset_and_shutdown_with_copies_in_flight_leak_nothing") {
        return;
    }
    for staging in [STAGING_BLOCKED, STAGING_WHOLE] {
        cancel_reset_and_shutdown_with_copies_in_flight(|policy| {
            device_engine(
                policy,
                staging,
                |ranks, pages, bytes| CudaStorage::new(0, ranks, pages, bytes).unwrap(),
                |_| Vec::new(),
            )
        });
    }
}

/// The same on host storage with modeled copies (in flight until their modeled end), so the sequence and
/// its precondition run in CI (issue 36, item 1: the CUDA test cancelled after one step that only sent
/// lookups, with no copy in flight).
#[test]
fn host_cancel_reset_and_shutdown_with_copies_in_flight_leak_nothing() {
    cancel_reset_and_shutdown_with_copies_in_flight(|policy| {
        let engine = Engine::new(params(policy, 256)).unwrap();
        (engine, Hold::Gauge)
    });
}

/// The same on the stand-in device through the CUDA path's copy engine (`DeviceCopyEngine`), given to the
/// engine with `Builder::page_storage`, its streams held as on a GPU: at cancel, reset and shutdown the
/// device says transfers into the pages are still queued, the engine keeps those pages until the device
/// says the copies are over (shutdown returns only after the holds were dropped), and no page was read or
/// written while a queued transfer still wrote it.
#[test]
fn fake_device_cancel_reset_and_shutdown_with_copies_in_flight_leak_nothing() {
    for staging in [STAGING_BLOCKED, STAGING_WHOLE] {
        cancel_reset_and_shutdown_with_copies_in_flight(|policy| {
            device_engine(
                policy,
                staging,
                |ranks, pages, bytes| DeviceStorage::fake(ranks, pages, bytes).unwrap(),
                |storage| storage.device().violations(),
            )
        });
    }
}

/// Staging of 2 chunks of 8 pages a rank: a held restore's staging thread waits for a chunk, so the
/// restores are partly staged when the engine acts (a cancelled job must not be reported before staging
/// ends).
const STAGING_BLOCKED: (usize, usize) = (8, 2);
/// Staging of 4 chunks of 64 pages a rank: the three restores are staged whole while held, every transfer
/// queued, so only the device's events can say when a cancelled job is over.
const STAGING_WHOLE: (usize, usize) = (64, 4);

/// An engine of `params(policy, 256)` on device storage made by `open` (ranks, pages, bytes per page),
/// restoring through a `DeviceCopyEngine` that stages `staging.0` pages a chunk, `staging.1` chunks a
/// rank; the stand-in's ordering violations read by `violations`.
fn device_engine<D: Device>(
    policy: Policy,
    (chunk_pages, chunks_per_rank): (usize, usize),
    open: impl FnOnce(u32, u32, usize) -> DeviceStorage<D>,
    violations: fn(&DeviceStorage<D>) -> Vec<String>,
) -> (Engine, Hold) {
    let params = params(policy, 256);
    let bytes_per_page = params.page_bytes as usize;
    let storage = Arc::new(open(
        params.geometry.context_parallel(),
        params.pool_pages(),
        bytes_per_page,
    ));
    let limits = StagingLimits {
        chunk_bytes: chunk_pages * bytes_per_page,
        chunks_per_rank,
    };
    let copies = DeviceCopyEngine::with_staging(Arc::clone(&storage), limits).unwrap();
    let executor = SimExecutor::new(params.cost.clone());
    let given: Arc<dyn PageStorage> = Arc::clone(&storage) as Arc<dyn PageStorage>;
    let engine = Engine::builder(params)
        .executor(executor)
        .page_storage(given, Box::new(copies))
        .build()
        .unwrap();
    let held = DeviceHold {
        storage,
        holds: Mutex::new(Vec::new()),
        violations,
    };
    (engine, Hold::Device(Arc::new(held)))
}

/// Storage given to `Builder::page_storage` must have the pool's shape, and its copy engine must be idle:
/// otherwise an error naming the parameter.
#[test]
fn given_page_storage_of_another_shape_or_a_busy_copy_engine_is_refused() {
    let params = params(Policy::Reserved, 64);
    let bytes = params.page_bytes as usize;
    let engine_on = |storage: DeviceStorage<FakeDevice>, busy: bool| {
        let storage = Arc::new(storage);
        let mut copies = DeviceCopyEngine::new(Arc::clone(&storage)).unwrap();
        if busy {
            storage.device().pause(0, true);
            let job = CopyJob {
                rank: 0,
                pages: vec![(PageBuf::from(vec![1u8; bytes]), PageId(1))],
            };
            copies.submit(job, kv_pool::Timestamp::ZERO).unwrap();
        }
        let executor = SimExecutor::new(params.cost.clone());
        let built = Engine::builder(params.clone())
            .executor(executor)
            .page_storage(storage.clone(), Box::new(copies))
            .build();
        storage.device().pause(0, false);
        built.map(|_| ()).unwrap_err()
    };
    for (ranks, pages, bytes) in [(2, 64, bytes), (1, 63, bytes), (1, 64, bytes + 1)] {
        let error = engine_on(DeviceStorage::fake(ranks, pages, bytes).unwrap(), false);
        let Error::InvalidParam { name, reason } = &error else {
            panic!("expected InvalidParam, got {error}");
        };
        assert_eq!(*name, "storage", "{error}");
        assert!(reason.contains("the pool needs 1 of 64"), "{error}");
    }
    let error = engine_on(DeviceStorage::fake(1, 64, bytes).unwrap(), true);
    assert!(
        matches!(&error, Error::InvalidParam { name: "copy_engine", reason } if reason.contains("1 jobs in flight")),
        "{error}"
    );
}

/// What proves copies are in flight on a storage, beyond the engine's gauge (asserted on every storage).
enum Hold {
    /// The gauge only: modeled copies (host storage, inline copy engine) are pending until their modeled
    /// end; there is no device to ask.
    Gauge,
    /// Device storage (the stand-in or CUDA), its copy streams held while the engine acts.
    Device(Arc<dyn HeldDevice>),
}

/// A device storage whose copy streams a test holds, asked through the device what is in flight.
trait HeldDevice: Send + Sync {
    /// Queues a hold on every rank's copy stream.
    fn hold(&self);
    /// Drops the holds: the streams run on.
    fn release(&self);
    /// Pages a queued transfer still writes, on every rank, as the device says.
    fn pages_in_flight(&self) -> usize;
    /// Pages read or written while a queued transfer still wrote them (the stand-in checks; CUDA cannot).
    fn violations(&self) -> Vec<String>;
}

struct DeviceHold<D: Device> {
    storage: Arc<DeviceStorage<D>>,
    holds: Mutex<Vec<StreamHold>>,
    violations: fn(&DeviceStorage<D>) -> Vec<String>,
}

impl<D: Device> HeldDevice for DeviceHold<D> {
    fn hold(&self) {
        let mut holds = self.holds.lock().unwrap();
        for rank in 0..self.storage.n_ranks() {
            holds.push(self.storage.device().hold_stream(rank).unwrap());
        }
    }

    fn release(&self) {
        self.holds
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    fn pages_in_flight(&self) -> usize {
        (0..self.storage.n_ranks())
            .map(|rank| self.storage.n_pages_in_flight(rank).unwrap())
            .sum()
    }

    fn violations(&self) -> Vec<String> {
        (self.violations)(&self.storage)
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.release();
    }
}

impl Hold {
    /// Holds the device's copy streams.
    fn hold(&self) {
        if let Hold::Device(device) = self {
            device.hold();
        }
    }

    /// Steps taken with the copies held after the cancel (none where nothing holds them).
    fn steps_held(&self) -> u32 {
        if matches!(self, Hold::Device(_)) {
            3
        } else {
            0
        }
    }

    /// Asserts the device says transfers into pages are queued before the engine does `act`, waiting up to
    /// 10 s for the staging threads to queue the first (they stage off the engine thread).
    fn assert_queued(&self, policy: Policy, act: &str) {
        if let Hold::Device(device) = self {
            let started = Instant::now();
            while device.pages_in_flight() == 0 && started.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(1));
            }
            assert!(
                device.pages_in_flight() > 0,
                "{policy}: the device holds no transfer at {act}"
            );
        }
    }

    /// Runs `act`, which waits for the copies, dropping the holds only from another thread after 50 ms,
    /// and asserts `act` returned only after that.
    fn while_held<T>(&self, act: impl FnOnce() -> T) -> T {
        let Hold::Device(device) = self else {
            return act();
        };
        let released = Arc::new(AtomicBool::new(false));
        let (flag, device) = (Arc::clone(&released), Arc::clone(device));
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            flag.store(true, Ordering::SeqCst);
            device.release();
        });
        let out = act();
        assert!(
            released.load(Ordering::SeqCst),
            "returned while the device still held the copies"
        );
        releaser.join().unwrap();
        out
    }

    /// Drops the holds (a failed assertion must not leave the engine's drop waiting).
    fn release(&self) {
        if let Hold::Device(device) = self {
            device.release();
        }
    }

    /// Asserts the stand-in saw no page read or written while a queued transfer still wrote it.
    fn assert_no_violation(&self, policy: Policy) {
        if let Hold::Device(device) = self {
            let violations = device.violations();
            assert!(violations.is_empty(), "{policy}: {violations:?}");
        }
    }
}

/// A long cold request keeps every step busy (so no step waits for the copies); three restores copy at
/// once; cancel, a forced reset and shutdown act while copies are in flight (asserted before each acts:
/// the engine's gauge on every storage, the device's queue where it can be held), and no page leaks; the
/// engine stays usable and a later restore is verified.
fn cancel_reset_and_shutdown_with_copies_in_flight(engine_of: impl Fn(Policy) -> (Engine, Hold)) {
    for policy in [Policy::Ordinary, Policy::PagesOnly, Policy::Reserved] {
        let (mut engine, hold) = engine_of(policy);
        let histories: Vec<Vec<u32>> = (0..3u32)
            .map(|agent| tokens(21, agent, 0, 40 * TPP))
            .collect();
        for (id, history) in (1..).zip(&histories) {
            seed_checkpoint(&mut engine, id, history, 1);
        }
        hold.hold();
        engine
            .submit(spec(30, tokens(22, 9, 0, 2 * TPP), 400, engine.now()))
            .unwrap();
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
        hold.assert_queued(policy, "cancel");
        engine.cancel(RequestId(10)).unwrap();
        engine.check_invariants().unwrap();
        // Held, the cancelled copy is not reported and its pages stay out of the free list.
        let in_flight = engine.restore_gauges().copies_in_flight;
        for _ in 0..hold.steps_held() {
            engine.step().unwrap();
            engine.check_invariants().unwrap();
            assert_eq!(
                engine.restore_gauges().copies_in_flight,
                in_flight,
                "{policy}"
            );
        }
        assert!(in_flight > 0, "{policy}: no copy in flight at the reset");
        hold.assert_queued(policy, "reset");
        engine.force_reset_prefix_cache().unwrap();
        engine.check_invariants().unwrap();
        assert!(
            engine.restore_gauges().copies_in_flight > 0,
            "{policy}: none at the shutdown"
        );
        hold.assert_queued(policy, "shutdown");
        let report = hold.while_held(|| engine.shutdown()).unwrap();
        engine.check_invariants().unwrap();
        assert!(report.copies_drained > 0, "{policy}: {report:?}");
        assert!(report.cancelled.len() >= 3, "{policy}: {report:?}");
        assert_eq!(engine.metrics().leaked_pages, 0, "{policy}");
        assert_eq!(engine.restore_gauges().copies_in_flight, 0, "{policy}");
        // The engine stays usable: a restore after the shutdown is verified.
        let verified = engine.pages_verified();
        let mut prompt = histories[0].clone();
        prompt.extend(tokens(21, 0, 2, 8));
        engine.submit(spec(20, prompt, 4, engine.now())).unwrap();
        engine.run_until_idle(100_000).unwrap();
        engine.check_invariants().unwrap();
        assert_eq!(engine.metrics().leaked_pages, 0, "{policy}");
        assert!(
            engine.pages_verified() > verified,
            "{policy}: the later restore was verified"
        );
        hold.assert_no_violation(policy);
    }
}
