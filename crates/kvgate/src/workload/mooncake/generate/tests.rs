//! Tests of the trace generator: what it writes reads back, the same seed gives the same trace, hash ids are
//! prefix hashes, each knob does what it says, and out-of-range requests and rates are refused.
#![allow(clippy::disallowed_methods, reason = "tests read PROPTEST_CASES")]

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;
use crate::run::later_turns;
use crate::workload::mooncake::{parse_trace, theoretical_max_hit_pct};

fn shape(seed: u64, n_requests: u32) -> TraceShape {
    TraceShape {
        seed,
        n_requests,
        ..TraceShape::default()
    }
}

fn mean_input(trace: &[TraceRequest]) -> f64 {
    trace.iter().map(|r| f64::from(r.input_length)).sum::<f64>() / trace.len() as f64
}

/// The coefficient of variation of the gaps between arrivals (1 for a Poisson process).
fn gap_variation(trace: &[TraceRequest]) -> f64 {
    let gaps: Vec<f64> = trace
        .windows(2)
        .map(|pair| (pair[1].timestamp - pair[0].timestamp) as f64)
        .collect();
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    let variance = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
    variance.sqrt() / mean
}

fn shapes() -> impl Strategy<Value = TraceShape> {
    (
        any::<u64>(),
        1u32..400,
        prop_oneof![Just(PromptLength::Short), Just(PromptLength::Long)],
        prop_oneof![Just(Reuse::Low), Just(Reuse::High)],
        prop_oneof![Just(Arrival::Steady), Just(Arrival::Bursty)],
        prop_oneof![Just(0.01), Just(1.0), Just(50.0), Just(1e6)],
    )
        .prop_map(
            |(seed, n_requests, prompt, reuse, arrival, rate_per_s)| TraceShape {
                seed,
                n_requests,
                prompt,
                reuse,
                arrival,
                rate_per_s,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        // PROPTEST_CASES overrides the count (e.g. 10x before a release), as in every crate.
        std::env::var("PROPTEST_CASES").ok().and_then(|cases| cases.parse().ok()).unwrap_or(64)
    ))]

    /// Any shape gives exactly its number of requests, which the trace reader reads back as written, and
    /// the same shape gives the same trace again.
    #[test]
    fn prop_a_generated_trace_reads_back_and_repeats(shape in shapes()) {
        let trace = generate(&shape).unwrap();
        prop_assert_eq!(trace.len(), shape.n_requests as usize);
        let text = to_jsonl(&trace);
        let read = parse_trace(std::io::Cursor::new(text.as_bytes()), "generated").unwrap();
        prop_assert_eq!(&read, &trace);
        prop_assert_eq!(generate(&shape).unwrap(), trace);
    }

    /// Hash ids are prefix hashes: wherever two requests hold the same id at a position, they hold the same
    /// ids before it; and no prompt passes the session cap.
    #[test]
    fn prop_hash_ids_are_prefix_hashes(shape in shapes()) {
        let trace = generate(&shape).unwrap();
        let mut prefix_of: HashMap<(usize, u64), &[u64]> = HashMap::new();
        for request in &trace {
            prop_assert!(request.input_length <= SESSION_TOKENS_MAX);
            for (idx, &id) in request.hash_ids.iter().enumerate() {
                let before = &request.hash_ids[..idx];
                let seen = *prefix_of.entry((idx, id)).or_insert(before);
                prop_assert_eq!(seen, before, "id {} at {}", id, idx);
            }
        }
    }
}

#[test]
fn different_seeds_give_different_traces() {
    assert_ne!(
        generate(&shape(1, 50)).unwrap(),
        generate(&shape(2, 50)).unwrap()
    );
}

#[test]
fn high_reuse_allows_more_cache_hits_and_more_later_turns_than_low() {
    for seed in 0..3 {
        let high = generate(&shape(seed, 2_000)).unwrap();
        let low = generate(&TraceShape {
            reuse: Reuse::Low,
            ..shape(seed, 2_000)
        })
        .unwrap();
        let (high_pct, low_pct) = (
            theoretical_max_hit_pct(&high),
            theoretical_max_hit_pct(&low),
        );
        assert!(
            high_pct > low_pct + 20.0,
            "seed {seed}: {high_pct} {low_pct}"
        );
        let count = |trace: &[TraceRequest]| later_turns(trace).iter().filter(|&&l| l).count();
        assert!(count(&high) > 2 * count(&low), "seed {seed}");
    }
}

#[test]
fn long_prompts_are_longer_than_short_ones() {
    let long = generate(&shape(7, 1_000)).unwrap();
    let short = generate(&TraceShape {
        prompt: PromptLength::Short,
        ..shape(7, 1_000)
    })
    .unwrap();
    assert!(
        mean_input(&long) > 4.0 * mean_input(&short),
        "{} {}",
        mean_input(&long),
        mean_input(&short)
    );
}

#[test]
fn bursty_arrivals_vary_more_at_the_same_mean_rate() {
    let steady = generate(&shape(3, 5_000)).unwrap();
    let bursty = generate(&TraceShape {
        arrival: Arrival::Bursty,
        ..shape(3, 5_000)
    })
    .unwrap();
    let span_s = |trace: &[TraceRequest]| trace.last().unwrap().timestamp as f64 / 1000.0;
    // 5,000 requests at 1 a second: both spans within 10% of 5,000 s.
    for trace in [&steady, &bursty] {
        assert!((span_s(trace) - 5_000.0).abs() < 500.0, "{}", span_s(trace));
    }
    let (steady_cv, bursty_cv) = (gap_variation(&steady), gap_variation(&bursty));
    assert!((steady_cv - 1.0).abs() < 0.1, "{steady_cv}");
    assert!(bursty_cv > 2.0, "{bursty_cv}");
}

#[test]
fn the_jsonl_is_in_the_published_layout() {
    let trace = generate(&shape(0, 1)).unwrap();
    let line = to_jsonl(&trace);
    let ids: Vec<String> = trace[0].hash_ids.iter().map(u64::to_string).collect();
    assert_eq!(
        line,
        format!(
            "{{\"timestamp\": {}, \"input_length\": {}, \"output_length\": {}, \"hash_ids\": [{}]}}\n",
            trace[0].timestamp,
            trace[0].input_length,
            trace[0].output_length,
            ids.join(", ")
        )
    );
}

#[test]
fn request_counts_out_of_range_are_refused() {
    assert_eq!(generate(&shape(0, 1)).unwrap().len(), 1);
    for bad in [0, GENERATED_REQUESTS_MAX + 1, u32::MAX] {
        let error = generate(&shape(0, bad)).unwrap_err().to_string();
        assert_eq!(
            error,
            format!("--requests {bad} is invalid; allowed: a number of requests from 1 to 1000000")
        );
    }
}

#[test]
fn rates_out_of_range_are_refused() {
    for bad in [0.0, 0.009, -1.0, 1.1e6, f64::NAN, f64::INFINITY] {
        let error = generate(&TraceShape {
            rate_per_s: bad,
            ..shape(0, 10)
        })
        .unwrap_err()
        .to_string();
        assert_eq!(
            error,
            format!(
                "--rate {bad} is invalid; allowed: a mean arrival rate from 0.01 to 1e6 requests per second"
            )
        );
    }
}

#[test]
fn unknown_knob_values_are_refused_naming_the_option() {
    let cases = [
        (
            "medium".parse::<PromptLength>().map(|_| ()),
            "--prompt medium is invalid; allowed: short or long",
        ),
        (
            "some".parse::<Reuse>().map(|_| ()),
            "--reuse some is invalid; allowed: low or high",
        ),
        (
            "poisson".parse::<Arrival>().map(|_| ()),
            "--arrival poisson is invalid; allowed: steady or bursty",
        ),
    ];
    for (result, expect) in cases {
        assert_eq!(result.unwrap_err().to_string(), expect);
    }
    assert_eq!(
        "short".parse::<PromptLength>().unwrap(),
        PromptLength::Short
    );
    assert_eq!("high".parse::<Reuse>().unwrap(), Reuse::High);
    assert_eq!("bursty".parse::<Arrival>().unwrap(), Arrival::Bursty);
}
