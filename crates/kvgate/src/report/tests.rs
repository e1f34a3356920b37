//! The report's table and the replay's keep-up lines.

use engine::RunMetrics;

use super::{replay_keep_up, replay_keep_up_json, table};

fn run(policy: &str) -> RunMetrics {
    RunMetrics {
        policy: policy.to_string(),
        ..RunMetrics::default()
    }
}

#[test]
fn a_replay_that_falls_behind_says_by_how_much() {
    // Arrivals from 0 to 1 000 s: one engine finishes 20 s after the last, the other 3 000 s after.
    let kept = RunMetrics {
        sim_seconds: 1_020.0,
        p99_ttft_s: 2.0,
        ..run("reserved")
    };
    let behind = RunMetrics {
        sim_seconds: 4_000.0,
        p99_ttft_s: 1_500.0,
        ..run("ordinary")
    };
    let lines = replay_keep_up(&[kept, behind.clone()], 0.0, 1_000.0);
    let lines: Vec<&str> = lines.lines().collect();
    assert_eq!(
        lines[0],
        "reserved: kept up with the trace's arrivals: last finish 20.0 s after the last arrival, p99 ttft 2.00 s"
    );
    assert!(
        lines[1].starts_with(
            "ordinary: FELL BEHIND the trace's arrivals: served them in 4000 s, 4.00x the 1000 s the trace \
             spans; the last request finished 3000 s after the last arrival, p99 ttft 1500.0 s"
        ),
        "{}",
        lines[1]
    );
    // A long p99 alone is falling behind too.
    let queued = RunMetrics {
        sim_seconds: 1_010.0,
        p99_ttft_s: 90.0,
        ..run("pages-only")
    };
    assert!(replay_keep_up(std::slice::from_ref(&queued), 0.0, 1_000.0).contains("FELL BEHIND"));
    let json = replay_keep_up_json(&[behind, queued], 1_000.0);
    assert_eq!(json["ordinary"]["kept_up"], false);
    assert_eq!(json["ordinary"]["drain_s"], 3_000.0);
    assert_eq!(json["pages-only"]["kept_up"], false);
}

#[test]
fn fallbacks_by_reason_get_a_row_each_and_keep_the_columns_narrow() {
    let mut ordinary = run("ordinary");
    ordinary
        .restore_fallbacks
        .insert("no_pages_at_once".to_string(), 184);
    ordinary
        .restore_fallbacks
        .insert("evicted_before_admission".to_string(), 3);
    let mut pages_only = run("pages-only");
    pages_only
        .restore_fallbacks
        .insert("evicted_before_admission".to_string(), 168);
    let text = table(&[ordinary, pages_only]);
    let row = |label: &str| -> Vec<String> {
        let line = text
            .lines()
            .find(|line| line.starts_with(label))
            .unwrap_or_else(|| panic!("no row {label} in\n{text}"));
        line[label.len()..]
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    assert_eq!(row("restore fallbacks"), ["187", "168"]);
    assert_eq!(row("  evicted_before_admission"), ["3", "168"]);
    assert_eq!(row("  no_pages_at_once"), ["184", "0"]);
    // No reason that no run counts.
    assert!(!text.contains("evicted_after"), "{text}");
    // No cell holds a reason beside its count, so a column is as wide as its widest figure ("0.00 / 0.00 s"):
    // at most 15 characters each after the 32-character labels.
    assert!(!text.contains("most:"), "{text}");
    for line in text.lines() {
        assert!(line.len() <= 32 + 2 * (2 + 15), "{line:?}");
    }
}
