//! `kvgate replay --engines N --router R` through the binary: the same report twice, every request routed
//! once, and `--engines 1` printing what a plain replay prints; `trace generate`, which makes their input.

use std::process::Command;

use serde_json::Value;

use crate::without_wall_time;

/// `kvgate trace generate` with `args`: the trace's text.
fn generated(args: &[&str]) -> String {
    let output = Command::new(crate::kvgate_exe())
        .args(["trace", "generate"])
        .args(args)
        .output()
        .expect("the binary runs");
    assert!(
        output.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("the trace is UTF-8")
}

/// `kvgate replay` of a generated trace's first 60 requests with `extra` arguments: its JSON report.
fn replay_json(extra: &[&str]) -> Value {
    let dir = tempfile::tempdir().expect("a temp dir");
    let trace = dir.path().join("generated.jsonl");
    std::fs::write(
        &trace,
        generated(&["--seed", "1", "--requests", "200", "--rate", "4"]),
    )
    .expect("the trace is written");
    let output = Command::new(crate::kvgate_exe())
        .args(["replay", trace.to_str().unwrap()])
        .args([
            "--limit",
            "60",
            "--pool-pages",
            "8192",
            "--json",
            "--verify",
        ])
        .args(extra)
        .output()
        .expect("the binary runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{extra:?}: {stderr}");
    serde_json::from_slice(&output.stdout).expect("the report is JSON")
}

#[test]
fn a_cluster_replay_reports_each_engine_and_the_same_run_twice() {
    let args = [
        "--engines",
        "3",
        "--router",
        "cache-aware",
        "--policy",
        "reserved,ordinary",
    ];
    let report = replay_json(&args);
    assert_eq!(report["engines"], 3);
    assert_eq!(report["router"], "cache-aware");
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for run in runs {
        let engines = run["engines"].as_array().unwrap();
        assert_eq!(engines.len(), 3, "{run}");
        let routed: u64 = engines.iter().map(|e| e["routed"].as_u64().unwrap()).sum();
        assert_eq!(routed, 60, "every request routed once: {run}");
        let finished: u64 = run["prompt_tokens"].as_u64().unwrap();
        let per_engine: u64 = engines
            .iter()
            .map(|e| e["prompt_tokens"].as_u64().unwrap())
            .sum();
        assert_eq!(finished, per_engine, "{run}");
        assert_eq!(run["leaked_pages"], 0);
        assert_eq!(run["keep_up"]["trace_requests"], 60);
        assert!(run["keep_up"]["meets_ttft_slo"].is_boolean());
        assert_eq!(run["keep_up"]["ttft_slo_p99_s"], 10.0);
    }
    assert_eq!(
        without_wall_time(report),
        without_wall_time(replay_json(&args)),
        "the same run twice"
    );
}

#[test]
fn one_engine_prints_what_a_plain_replay_prints() {
    let plain = without_wall_time(replay_json(&["--policy", "reserved"]));
    for router in ["round-robin", "least-loaded", "cache-aware"] {
        let one = replay_json(&["--policy", "reserved", "--engines", "1", "--router", router]);
        assert_eq!(without_wall_time(one), plain, "{router}");
    }
    assert!(plain["runs"][0].get("engines").is_none());
}

#[test]
fn trace_generate_writes_the_same_trace_for_the_same_seed_and_each_knob_changes_it() {
    let base = ["--seed", "5", "--requests", "50"];
    let trace = generated(&base);
    assert_eq!(trace.lines().count(), 50);
    assert_eq!(trace, generated(&base), "the same options, the same trace");
    let requests =
        kvgate::workload::mooncake::parse_trace(std::io::Cursor::new(&trace), "generated")
            .expect("the trace reads back");
    assert_eq!(requests.len(), 50);
    assert_ne!(trace, generated(&["--seed", "6", "--requests", "50"]));
    for knob in [
        ["--prompt", "short"],
        ["--reuse", "low"],
        ["--arrival", "bursty"],
        ["--rate", "2"],
    ] {
        let other = generated(&[&base[..], &knob[..]].concat());
        assert_ne!(other, trace, "{knob:?}");
    }
}
