//! Bench (issue 11, L1): a restore on the wall clock through the whole engine. A checkpoint of `n_pages`
//! pages is seeded, the prefix cache reset, and its next turn restored by the threaded copy engine (one
//! worker per core) while the engine steps on the wall clock; the time from submit to admission (the copy,
//! its publication and the engine's polling) gives `live_restore_gib_s`, against single-threaded memcpy of
//! the same bytes in the same run (`live_memcpy_gib_s`, `live_restore_vs_memcpy`). Prints one JSON line of
//! medians on stdout.
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::disallowed_methods,
    reason = "a bench binary reports on stdout and stderr and times itself"
)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use engine::{ClockKind, CopyEngineKind, Engine, EngineParams, Policy, RequestPhase, RequestSpec};
use kv_pool::RequestId;

const BYTES_PER_PAGE: u32 = 64 * 1024;
const TOKENS_PER_PAGE: u32 = 16;

fn gib_s(n_bytes: usize, elapsed: Duration) -> f64 {
    n_bytes as f64 / elapsed.as_secs_f64().max(1e-9) / f64::from(1u32 << 30)
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// One restore of `n_pages` pages on the wall clock: seconds from submit to admission.
fn live_restore_s(n_pages: u32, workers: u32) -> f64 {
    let params = EngineParams {
        n_pages: 2 * n_pages + 64,
        page_bytes: BYTES_PER_PAGE,
        clock: ClockKind::Wall,
        copy_engine: CopyEngineKind::Threaded { workers },
        policy: Policy::Reserved,
        verify_restores: false,
        chunk_tokens: 4096,
        max_batched_tokens: 8192,
        ..EngineParams::default()
    };
    let mut engine = Engine::new(params).expect("the engine builds");
    let prompt: Vec<u32> = (0..n_pages * TOKENS_PER_PAGE).collect();
    engine
        .submit(RequestSpec::new(1, prompt.clone(), 1, engine.now()))
        .expect("submit");
    let _steps = engine.run_until_idle(1_000_000).expect("seed run");
    let _finished = engine.take_finished();
    engine.reset_prefix_cache().expect("reset");
    let mut turn = RequestSpec::new(2, [prompt, vec![7; 8]].concat(), 1, engine.now());
    turn.is_later_turn = true;
    let started = Instant::now();
    engine.submit(turn).expect("submit");
    loop {
        let _report = engine.step().expect("step");
        let phase = engine.request(RequestId(2)).map(|view| view.phase);
        if matches!(phase, Some(RequestPhase::Running) | None) {
            break;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let _steps = engine.run_until_idle(1_000_000).expect("finish");
    elapsed
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let smoke = !args.iter().any(|arg| arg == "--bench");
    let (n_pages, repetitions) = if smoke { (16, 1) } else { (1024, 5) };
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get() as u32);
    let n_bytes = n_pages as usize * BYTES_PER_PAGE as usize;
    let source = vec![0x5au8; n_bytes];
    let mut destination = vec![0u8; n_bytes];
    let mut restores = Vec::new();
    let mut memcpys = Vec::new();
    for repetition in 0..repetitions {
        let restore_s = live_restore_s(n_pages, workers);
        let started = Instant::now();
        destination.copy_from_slice(black_box(&source));
        black_box(&destination);
        let memcpy = gib_s(n_bytes, started.elapsed());
        let restore = n_bytes as f64 / restore_s.max(1e-9) / f64::from(1u32 << 30);
        eprintln!(
            "live restore: repetition {repetition}: {restore:.2} GiB/s ({workers} workers), memcpy {memcpy:.2} GiB/s"
        );
        restores.push(restore);
        memcpys.push(memcpy);
    }
    let restore = median(restores);
    let memcpy = median(memcpys);
    println!(
        "{{\"live_restore_gib_s\": {restore:.3}, \"live_memcpy_gib_s\": {memcpy:.3}, \
         \"live_restore_vs_memcpy\": {:.3}}}",
        restore / memcpy
    );
}
