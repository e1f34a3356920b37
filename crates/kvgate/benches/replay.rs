//! Replay benchmark: wall time and peak RSS of `kvgate replay` (the release binary, run as a child process)
//! on the shared Mooncake conversation trace with one policy (`ordinary`, 65,536 pages of 16 tokens,
//! arrivals not stretched; it lives outside the repository, in `../shared/workloads/mooncake/`, and where it
//! is absent a trace of its shape made by `kvgate trace generate` stands in, `replay_conv_trace` naming
//! which), and linear growth: a synthetic trace of 12,000 requests against one of 200,000 requests (16.7x as
//! many), generated here, with the ratio of their wall times. Peak RSS is the child's maximum resident set as
//! `/usr/bin/time` reports it (`null` without that tool). Prints progress on stderr and one JSON object on
//! stdout. Flags: `--quick` (3,000 against 50,000 synthetic requests); `--gpu` and anything else are
//! ignored. The growth pair runs twice: with the default store, and with a store full from the first requests
//! (`FULL_STORE_PAGES`); every growth run takes part in each of `ROUNDS` rounds (the short ones
//! `SMALL_PER_ROUND` times), and each figure is the median of its runs. Growth after the warm-up, default
//! store: the large trace cut at twice the small trace's length and at half its own (`--limit`); what a
//! request of its second half costs against one between the two cuts (`replay_synthetic_steady_cost_ratio`,
//! linear: 1.0). Both segments are long, so the ratio is not a difference of two short runs' noise.
#![allow(clippy::disallowed_methods, reason = "a bench times itself")]
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark binary reports its figures"
)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

const POOL_PAGES: u32 = 65_536;
const POLICY: &str = "ordinary";
/// Store pages of the growth runs whose store is full from their first requests (a few checkpoints).
const FULL_STORE_PAGES: u64 = 4_096;
/// Rounds of the growth runs (each large run once a round), and runs of each short one a round.
const ROUNDS: usize = 3;
const SMALL_PER_ROUND: usize = 2;
/// `kvgate trace generate` options for a trace of the conversation trace's shape, where it is absent: as many
/// requests, long prompts, heavy reuse, its mean rate.
const CONVERSATION_LIKE: &str =
    "--seed 0 --requests 12031 --prompt long --reuse high --arrival steady --rate 3.4";
/// Milliseconds between two arrivals of the synthetic traces.
const SYNTHETIC_GAP_MS: u64 = 20;

fn main() {
    let quick = std::env::args().any(|arg| arg == "--quick");
    // `cargo bench` passes `--bench`; without it (`cargo test --all-targets`) this is a smoke run of the
    // synthetic traces only, at small sizes.
    let smoke = !std::env::args().any(|arg| arg == "--bench");
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_kvgate"));
    let conversation = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/workloads/mooncake/conversation_trace.jsonl");
    let dir = tempfile::tempdir().expect("a temporary directory for the synthetic traces");
    let (conv_wall_s, conv_rss_mb, conv_trace) = if smoke {
        (None, None, "none (smoke run)".to_string())
    } else {
        let (path, name) = if conversation.is_file() {
            (conversation, "the shared conversation trace".to_string())
        } else {
            let path = dir.path().join("conversation-like.jsonl");
            let args = CONVERSATION_LIKE.split(' ');
            let output = Command::new(&binary)
                .args(["trace", "generate"])
                .args(args)
                .output()
                .expect("running kvgate trace generate");
            assert!(output.status.success(), "kvgate trace generate failed");
            std::fs::write(&path, output.stdout).expect("writing the generated trace");
            (
                path,
                format!("generated: kvgate trace generate {CONVERSATION_LIKE}"),
            )
        };
        eprintln!("kvgate bench: replay of {name} under {POLICY}, {POOL_PAGES} pages");
        let run = replay(&binary, &path);
        eprintln!(
            "kvgate bench: {:.2} s, peak RSS {}",
            run.wall_s,
            run.peak_rss_mb
                .map_or("unknown".to_string(), |mb| format!("{mb:.0} MB"))
        );
        (Some(run.wall_s), run.peak_rss_mb, name)
    };

    let (small, large) = if smoke {
        (300, 1_000)
    } else if quick {
        (3_000, 50_000)
    } else {
        (12_000, 200_000)
    };
    let paths = [small, large].map(|n_requests| {
        let path = dir.path().join(format!("synthetic-{n_requests}.jsonl"));
        std::fs::write(&path, synthetic_trace(n_requests)).expect("writing a synthetic trace");
        path
    });
    // With the default store (1,048,576 pages) the checkpoints fill it after about 8,000 of these requests:
    // most of the small trace runs before the store evicts or its catalog reaches its steady size, so the
    // ratio also measures that warm-up. With a store of `FULL_STORE_PAGES` the store is in steady state
    // from its first requests. Either way the store keeps collecting the trace's distinct block chains for
    // about 100,000 requests, so later requests restore more and recompute less (`docs/benchmarks.md`).
    // Growth after the warm-up, default store: the large trace's first `2 * small` requests, then its first
    // half; the cost of a request of its second half against one between the two cuts. Linear cost gives 1.
    // (In the smoke run's small sizes the first cut is a quarter of the large trace, before its half.)
    let (cut, half) = ((2 * small).min(large / 4), large / 2);
    let runs = [
        (&paths[0], None, None),
        (&paths[1], None, None),
        (&paths[0], Some(FULL_STORE_PAGES), None),
        (&paths[1], Some(FULL_STORE_PAGES), None),
        (&paths[1], None, Some(cut)),
        (&paths[1], None, Some(half)),
    ];
    // Rounds, each running every configuration (the short ones `SMALL_PER_ROUND` times), so that the
    // machine's drift over the bench's minutes falls on both sides of every ratio alike; each figure is the
    // median of its runs. The short runs take well under a second, where the noise is a large part of the
    // time: they run more often.
    let mut walls: Vec<Vec<f64>> = vec![Vec::new(); runs.len()];
    for round in 1..=ROUNDS {
        eprintln!(
            "kvgate bench: growth round {round} of {ROUNDS}: {small} and {large} synthetic requests, the \
             default store and one of {FULL_STORE_PAGES} pages, the large trace cut at {cut} and {half}"
        );
        for (idx, &(path, store_pages, limit)) in runs.iter().enumerate() {
            let short = path == &paths[0] || limit == Some(cut);
            for _ in 0..if short { SMALL_PER_ROUND } else { 1 } {
                walls[idx].push(replay_with(&binary, path, store_pages, limit).wall_s);
            }
        }
    }
    let [small_s, large_s, full_small_s, full_large_s, cut_s, half_s] =
        std::array::from_fn(|idx| median(&mut walls[idx]));
    let growth_ratio = large_s / small_s;
    let full_growth_ratio = full_large_s / full_small_s;
    eprintln!(
        "kvgate bench: {large} requests take {growth_ratio:.1}x the time of {small} ({:.1}x as many); \
         {full_growth_ratio:.1}x with a store of {FULL_STORE_PAGES} pages",
        large as f64 / small as f64
    );
    let per_request_us = |wall_s: f64, n_requests: u64| 1e6 * wall_s / n_requests as f64;
    let middle_us = per_request_us(half_s - cut_s, half - cut);
    let second_half_us = per_request_us(large_s - half_s, large - half);
    let steady_cost_ratio = (middle_us > 0.0).then(|| second_half_us / middle_us);
    eprintln!(
        "kvgate bench: default store, a request costs {middle_us:.1} us from {cut} to {half} requests and \
         {second_half_us:.1} us from {half} to {large} (the first {small} alone: {:.1} us)",
        per_request_us(small_s, small)
    );
    println!(
        "{{\"replay_conv_trace\": {:?}, \"replay_conv_wall_s\": {}, \"replay_conv_peak_rss_mb\": {}, \
         \"replay_synthetic_small_requests\": {small}, \"replay_synthetic_small_wall_s\": {:.3}, \
         \"replay_synthetic_large_requests\": {large}, \"replay_synthetic_large_wall_s\": {:.3}, \
         \"replay_synthetic_growth_ratio\": {growth_ratio:.2}, \
         \"replay_synthetic_full_store_small_wall_s\": {:.3}, \
         \"replay_synthetic_full_store_large_wall_s\": {:.3}, \
         \"replay_synthetic_full_store_growth_ratio\": {full_growth_ratio:.2}, \
         \"replay_synthetic_steady_cost_ratio\": {}}}",
        conv_trace,
        json_number(conv_wall_s),
        json_number(conv_rss_mb),
        small_s,
        large_s,
        full_small_s,
        full_large_s,
        json_number(steady_cost_ratio),
    );
}

/// The median of `values` (not empty).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// What one replay cost.
struct Run {
    wall_s: f64,
    peak_rss_mb: Option<f64>,
}

/// Runs `kvgate replay TRACE` under the bench's policy and pool; panics (the bench fails) if it fails.
fn replay(binary: &Path, trace: &Path) -> Run {
    replay_with(binary, trace, None, None)
}

/// `replay`, with a store of `store_pages` pages when given (else the default store), of the trace's first
/// `limit` requests when given.
fn replay_with(binary: &Path, trace: &Path, store_pages: Option<u64>, limit: Option<u64>) -> Run {
    let time_tool = Path::new("/usr/bin/time");
    let rss_file = tempfile::NamedTempFile::new().expect("a temporary file for the peak RSS");
    let mut command = if time_tool.is_file() {
        let mut command = Command::new(time_tool);
        command
            .args(["-f", "%M", "-o"])
            .arg(rss_file.path())
            .arg(binary);
        command
    } else {
        Command::new(binary)
    };
    command
        .arg("replay")
        .arg(trace)
        .args([
            "--pool-pages",
            &POOL_PAGES.to_string(),
            "--policy",
            POLICY,
            "--json",
        ])
        .args(store_pages.map(|pages| format!("--store-pages={pages}")))
        .args(limit.map(|limit| format!("--limit={limit}")))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let started = Instant::now();
    let status = command.status().expect("running kvgate replay");
    let wall_s = started.elapsed().as_secs_f64();
    assert!(status.success(), "kvgate replay failed: {status}");
    let peak_rss_mb = std::fs::read_to_string(rss_file.path())
        .ok()
        .and_then(|text| text.trim().lines().last()?.trim().parse::<f64>().ok())
        .map(|kib| kib * 1024.0 / 1e6);
    Run {
        wall_s,
        peak_rss_mb,
    }
}

/// A Mooncake-format trace of `n_requests` short requests arriving every [`SYNTHETIC_GAP_MS`]: one to three
/// 512-token blocks drawn from a few hundred shared prefixes, so prefix hits, evictions and captures all
/// happen, and each request is drawn the same way whatever the trace's length (the share of requests whose
/// chain is already in the store still grows over its first ~100,000).
fn synthetic_trace(n_requests: u64) -> String {
    let mut trace = String::new();
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for i in 0..n_requests {
        let n_blocks = 1 + next() % 3;
        let prefix = next() % 300;
        let hash_ids: Vec<String> = (0..n_blocks)
            .map(|block| {
                if block == 0 {
                    prefix.to_string()
                } else {
                    (1_000 + prefix * 10 + block * 1_000_000 + next() % 4).to_string()
                }
            })
            .collect();
        let input_length = (n_blocks - 1) * 512 + 1 + next() % 512;
        let output_length = 1 + next() % 32;
        let _ = writeln!(
            trace,
            "{{\"timestamp\": {}, \"input_length\": {input_length}, \"output_length\": {output_length}, \
             \"hash_ids\": [{}]}}",
            i * SYNTHETIC_GAP_MS,
            hash_ids.join(", ")
        );
    }
    trace
}

/// `value` as a JSON number, `null` when absent.
fn json_number(value: Option<f64>) -> String {
    value.map_or("null".to_string(), |value| format!("{value:.3}"))
}
