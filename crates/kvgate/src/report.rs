//! Reports of runs: the side-by-side table a person reads and the JSON a machine reads. Metric names are
//! those of architecture.md and part of the interface.

use engine::RunMetrics;
use serde_json::{Map, Value, json};

/// One run as a JSON object: `policy` and every metric by its name.
pub fn run_json(run: &RunMetrics) -> Value {
    let by_reason = |counts: &std::collections::BTreeMap<String, u32>| -> Map<String, Value> {
        counts
            .iter()
            .map(|(reason, n)| (reason.clone(), json!(n)))
            .collect()
    };
    json!({
        "policy": run.policy,
        "prompt_tokens": run.prompt_tokens,
        "prompt_tokens_local_hit": run.prompt_tokens_local_hit,
        "prompt_tokens_restored": run.prompt_tokens_restored,
        "prompt_tokens_recomputed": run.prompt_tokens_recomputed,
        "prompt_tokens_from_cache_pct": round(run.prompt_tokens_from_cache_pct, 3),
        "later_turns": run.later_turns,
        "later_turns_restored": run.later_turns_restored,
        "later_turns_local_hit": run.later_turns_local_hit,
        "restore_fallbacks": by_reason(&run.restore_fallbacks),
        "rejected_requests": by_reason(&run.rejected_requests),
        "capacity_waits": run.capacity_waits,
        "longest_capacity_wait_s": round(run.longest_capacity_wait_s, 3),
        "preemptions": run.preemptions,
        "decode_tokens": run.decode_tokens,
        "aggregate_decode_tok_s": round(run.aggregate_decode_tok_s, 3),
        "mean_turn_s": round(run.mean_turn_s, 3),
        "p50_ttft_s": round(run.p50_ttft_s, 3),
        "p99_ttft_s": round(run.p99_ttft_s, 3),
        "leaked_pages": run.leaked_pages,
        "store_write_failures": run.store_write_failures,
        "sim_seconds": round(run.sim_seconds, 3),
        "wall_seconds": round(run.wall_seconds, 3),
    })
}

/// `{"runs": [...]}`, plus any extra top-level fields given (e.g. the trace's theoretical maximum).
pub fn runs_json(runs: &[RunMetrics], extra: &[(&str, Value)]) -> Value {
    let mut object = Map::new();
    for (key, value) in extra {
        object.insert((*key).to_string(), value.clone());
    }
    object.insert(
        "runs".to_string(),
        Value::Array(runs.iter().map(run_json).collect()),
    );
    Value::Object(object)
}

/// The side-by-side table, one column per run, one row per headline metric.
pub fn table(runs: &[RunMetrics]) -> String {
    type Row = (&'static str, fn(&RunMetrics) -> String);
    let rows: [Row; 16] = [
        ("prompt tokens from cache", |r| {
            format!("{:.1}%", r.prompt_tokens_from_cache_pct)
        }),
        ("  restored / local hit", |r| {
            format!(
                "{} / {}",
                r.prompt_tokens_restored, r.prompt_tokens_local_hit
            )
        }),
        ("  recomputed", |r| r.prompt_tokens_recomputed.to_string()),
        ("later turns with a restore", |r| {
            format!("{}/{}", r.later_turns_restored, r.later_turns)
        }),
        ("  or a full local hit", |r| {
            r.later_turns_local_hit.to_string()
        }),
        ("restore fallbacks", |r| by_most(&r.restore_fallbacks)),
        ("rejected requests", |r| by_most(&r.rejected_requests)),
        ("mean turn time", |r| format!("{:.1} s", r.mean_turn_s)),
        ("p50 / p99 ttft", |r| {
            format!("{:.2} / {:.2} s", r.p50_ttft_s, r.p99_ttft_s)
        }),
        ("aggregate decode", |r| {
            format!("{:.1} tok/s", r.aggregate_decode_tok_s)
        }),
        ("capacity waits (longest)", |r| {
            format!("{} ({:.1} s)", r.capacity_waits, r.longest_capacity_wait_s)
        }),
        ("preemptions", |r| r.preemptions.to_string()),
        ("leaked pages", |r| r.leaked_pages.to_string()),
        ("store write failures", |r| {
            r.store_write_failures.to_string()
        }),
        ("simulated time", |r| format!("{:.1} s", r.sim_seconds)),
        ("wall time", |r| format!("{:.2} s", r.wall_seconds)),
    ];
    let label_width = rows.iter().map(|(label, _)| label.len()).max().unwrap_or(0);
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|(_, cell)| runs.iter().map(cell).collect())
        .collect();
    let widths: Vec<usize> = (0..runs.len())
        .map(|col| {
            cells
                .iter()
                .map(|row| row[col].len())
                .chain([runs[col].policy.len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = format!("{:label_width$}", "");
    for (run, width) in runs.iter().zip(&widths) {
        out.push_str(&format!("  {:>width$}", run.policy));
    }
    out.push('\n');
    for ((label, _), row) in rows.iter().zip(&cells) {
        out.push_str(&format!("{label:label_width$}"));
        for (cell, width) in row.iter().zip(&widths) {
            out.push_str(&format!("  {cell:>width$}"));
        }
        out.push('\n');
    }
    out
}

/// A count by reason as its total and the most frequent reason.
fn by_most(counts: &std::collections::BTreeMap<String, u32>) -> String {
    let total: u32 = counts.values().sum();
    if total == 0 {
        return "0".to_string();
    }
    let mut reasons: Vec<(&String, &u32)> = counts.iter().collect();
    reasons.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let (top, n) = reasons[0];
    format!("{total} (most: {top} {n})")
}

fn round(value: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (value * scale).round() / scale
}
