//! Bench (Q8): one engine step with a blocked head and one pending restore, as the waiting queue grows from
//! 10 to 100 000. One running slot, taken by a long decode: every step decodes one token of it, the restore
//! coordinator polls the restore in its capacity wait (no slot), and the admission walk stops at the blocked
//! head (no slot). The decode is the same at every queue length, so the ratio shows what the queue costs. Prints progress on stderr and one
//! JSON line of medians (`step_ns_waiting_10`, `step_ns_waiting_500`, `step_ns_waiting_100000`) on stdout.
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::disallowed_methods,
    reason = "a bench binary reports on stdout and stderr and times itself"
)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use engine::{Engine, EngineParams, Policy, RequestSpec};
use kv_pool::{RequestId, Timestamp};

const TPP: u32 = 16;

/// Distinct tokens for request `id` (splitmix64 of id and position).
fn tokens(id: u64, n: u32) -> Vec<u32> {
    (0..n)
        .map(|i| {
            let mut x = (id << 20 ^ u64::from(i)).wrapping_add(0x9e37_79b9_7f4a_7c15);
            x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((x ^ (x >> 31)) % 50_000) as u32 + 1
        })
        .collect()
}

/// An engine with one running slot taken by a long decode, a restore waiting for capacity and `n_waiting`
/// cold requests behind a blocked head.
fn setup(n_waiting: u64) -> Engine {
    let params = EngineParams {
        policy: Policy::Reserved,
        n_pages: 1025,
        max_running: 1,
        // Long enough that no wait expires and no lookup times out during the measurement.
        restore_max_wait: Duration::from_secs(1 << 40),
        lookup_timeout: Duration::from_secs(1 << 40),
        stall_timeout: Duration::from_secs(1 << 50),
        verify_restores: false,
        ..EngineParams::default()
    };
    let mut engine = Engine::new(params).expect("valid params");
    // A checkpoint for the restore: run its history once, then drop the prefix cache.
    let history = tokens(1 << 40, 200 * TPP);
    engine
        .submit(RequestSpec::new(1, history.clone(), 1, Timestamp::ZERO))
        .expect("submit");
    let _steps = engine.run_until_idle(100_000).expect("run");
    engine.reset_prefix_cache().expect("nothing in use");
    // The decode that holds the one running slot: 16 000 output tokens, more than the bench steps.
    engine
        .submit(RequestSpec::new(2, tokens(2, 100), 16_000, engine.now()))
        .expect("submit");
    let _report = engine.step().expect("step");
    let mut restore = history;
    restore.extend(tokens(3, 8));
    engine
        .submit(RequestSpec::new(3, restore, 4, engine.now()))
        .expect("submit");
    for id in 0..n_waiting {
        // Small, but there is no free slot.
        let prompt = tokens(10 + id, 2 * TPP);
        engine
            .submit(RequestSpec::new(10 + id, prompt, 4, engine.now()))
            .expect("submit");
    }
    for _ in 0..3 {
        let _report = engine.step().expect("step");
    }
    let view = engine.request(RequestId(3)).expect("live");
    assert!(view.is_waiter, "the restore waits for capacity");
    engine
}

fn median_step_ns(n_waiting: u64, iterations: u32, repetitions: usize) -> f64 {
    let mut engine = setup(n_waiting);
    let mut samples: Vec<f64> = Vec::with_capacity(repetitions);
    for repetition in 0..repetitions {
        let start = Instant::now();
        for _ in 0..iterations {
            let report = engine.step().expect("step");
            assert!(
                report.admitted.is_empty() && report.restore_polls == 1,
                "{report:?}"
            );
            black_box(report);
        }
        let ns = start.elapsed().as_nanos() as f64 / f64::from(iterations);
        eprintln!("waiting {n_waiting:>6}: repetition {repetition}: {ns:.0} ns/step");
        samples.push(ns);
    }
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `cargo bench` passes `--bench`; without it (`cargo test --all-targets`) the bench is a quick smoke run.
    let smoke = !args.iter().any(|arg| arg == "--bench");
    let quick = args.iter().any(|arg| arg == "--quick");
    let (iterations, repetitions, sizes): (u32, usize, &[u64]) = if smoke {
        (50, 1, &[10, 500])
    } else if quick {
        // At most 15 000 steps per queue length: the decode's 16 000 tokens outlast them.
        (500, 3, &[10, 500, 100_000])
    } else {
        (3_000, 5, &[10, 500, 100_000])
    };
    let mut figures = Vec::new();
    for &n_waiting in sizes {
        let ns = median_step_ns(n_waiting, iterations, repetitions);
        figures.push(format!("\"step_ns_waiting_{n_waiting}\": {ns:.1}"));
    }
    println!("{{{}}}", figures.join(", "));
}
