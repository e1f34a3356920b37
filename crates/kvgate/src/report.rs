//! Reports of runs: the side-by-side table a person reads and the JSON a machine reads. Metric names are
//! those of architecture.md and part of the interface.

use engine::RunMetrics;
use serde_json::{Map, Value, json};

use crate::cluster::{ClusterRun, KEEP_UP_DRAIN_S_MAX, KEEP_UP_P99_TTFT_S_MAX};

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
        "preemptions_offloaded": run.preemptions_offloaded,
        "preempted_tokens_local_hit": run.preempted_tokens_local_hit,
        "preempted_tokens_restored": run.preempted_tokens_restored,
        "preempted_tokens_recomputed": run.preempted_tokens_recomputed,
        "decode_tokens": run.decode_tokens,
        "aggregate_decode_tok_s": round(run.aggregate_decode_tok_s, 3),
        "mean_turn_s": round(run.mean_turn_s, 3),
        "p50_ttft_s": round(run.p50_ttft_s, 3),
        "p99_ttft_s": round(run.p99_ttft_s, 3),
        "leaked_pages": run.leaked_pages,
        "store_write_failures": run.store_write_failures,
        "sim_seconds": round(run.sim_seconds, 3),
        "wall_seconds": round(run.wall_seconds, 3),
        "stopped": run.stopped,
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

/// The side-by-side table, one column per run (headed by its policy), one row per headline metric.
/// A run the watchdog stopped is named below the table, with why: its column counts only what happened until
/// then.
pub fn table(runs: &[RunMetrics]) -> String {
    let columns: Vec<(&str, &RunMetrics)> =
        runs.iter().map(|run| (run.policy.as_str(), run)).collect();
    let mut out = table_of(&columns);
    for run in runs {
        out.push_str(&stopped_line(run));
    }
    out
}

/// How a live run's policies ran, for `--json`: `policies_ran` ("one after another, each alone" in a live
/// run, "side by side" otherwise) and, when verification was on, `verify_s` (each policy's wall seconds
/// spent recomputing restores to check them, left out of its turn times).
pub fn live_json(
    runs: &[RunMetrics],
    live: bool,
    verify_s: Option<&[f64]>,
) -> Vec<(&'static str, Value)> {
    let ran = if live {
        "one after another, each alone"
    } else {
        "side by side"
    };
    let mut extra = vec![("policies_ran", json!(ran))];
    if let Some(verify_s) = verify_s {
        let by_policy: Map<String, Value> = runs
            .iter()
            .zip(verify_s)
            .map(|(run, &s)| (run.policy.clone(), json!(round(s, 3))))
            .collect();
        extra.push(("verify_s", Value::Object(by_policy)));
    }
    extra
}

/// The lines under a live run's table: how the policies ran, and with verification on, the time it took
/// per policy, which the turn times leave out.
pub fn live_note(runs: &[RunMetrics], verify_s: Option<&[f64]>) -> String {
    let mut out = String::from(
        "\nThe policies ran one after another, each alone on the machine (not side by side on shared cores).\n",
    );
    if let Some(verify_s) = verify_s {
        let each: Vec<String> = runs
            .iter()
            .zip(verify_s)
            .map(|(run, s)| format!("{} {s:.1} s", run.policy))
            .collect();
        out.push_str(&format!(
            "--verify recomputed every restore to check it byte for byte: {}; timed apart, not in the turn \
             times above.\n",
            each.join(", ")
        ));
    }
    out
}

/// A cluster replay's JSON: the cluster's metrics by their names (as [`run_json`]), plus `router`,
/// `engines` (each engine's metrics and `routed`, the requests sent to it) and `keep_up`.
pub fn cluster_json(run: &ClusterRun) -> Value {
    let mut object = run_json(&run.total);
    let engines: Vec<Value> = run
        .engines
        .iter()
        .zip(&run.routed)
        .map(|(engine, routed)| {
            let mut value = run_json(engine);
            value["routed"] = json!(routed);
            value
        })
        .collect();
    let keep_up = &run.keep_up;
    object["router"] = json!(run.router.name());
    object["engines"] = Value::Array(engines);
    object["keep_up"] = json!({
        "trace_requests": keep_up.trace_requests,
        "trace_prompt_tokens": keep_up.trace_prompt_tokens,
        "trace_span_s": round(keep_up.trace_span_s, 3),
        "needed_requests_per_s": round(keep_up.needed_requests_per_s, 3),
        "needed_prompt_tok_per_s": round(keep_up.needed_prompt_tok_per_s, 1),
        "served_span_s": round(keep_up.served_span_s, 3),
        "sustained_requests_per_s": round(keep_up.sustained_requests_per_s, 3),
        "sustained_prompt_tok_per_s": round(keep_up.sustained_prompt_tok_per_s, 1),
        "drain_s": round(keep_up.drain_s, 3),
        "p99_ttft_s": round(keep_up.p99_ttft_s, 3),
        "kept_up": keep_up.kept_up,
    });
    object
}

/// A cluster replay as a person reads it: the table with one column per engine and one for the cluster,
/// then the throughput the trace needs against what the cluster sustained.
pub fn cluster_table(run: &ClusterRun) -> String {
    let names: Vec<String> = (0..run.engines.len())
        .map(|index| format!("engine {index}"))
        .collect();
    let mut columns: Vec<(&str, &RunMetrics)> =
        names.iter().map(String::as_str).zip(&run.engines).collect();
    columns.push(("total", &run.total));
    let routed: Vec<String> = run.routed.iter().map(u64::to_string).collect();
    let keep_up = &run.keep_up;
    let stopped = stopped_line(&run.total);
    format!(
        "{policy}, {n} engines, router {router} (requests routed: {routed})\n{table}\
         trace: {requests} requests over {span:.1} s: needs {need_rps:.2} requests/s, {need_tps:.0} prompt tok/s\n\
         cluster: served them by {served:.1} s: sustained {rps:.2} requests/s, {tps:.0} prompt tok/s; last \
         finish {drain:.1} s after the last arrival, p99 ttft {p99:.2} s: {verdict} (keeping up: within \
         {drain_max} s and {p99_max} s)\n{stopped}",
        policy = run.total.policy,
        n = run.engines.len(),
        router = run.router,
        routed = routed.join(" / "),
        table = table_of(&columns),
        requests = keep_up.trace_requests,
        span = keep_up.trace_span_s,
        need_rps = keep_up.needed_requests_per_s,
        need_tps = keep_up.needed_prompt_tok_per_s,
        served = keep_up.served_span_s,
        rps = keep_up.sustained_requests_per_s,
        tps = keep_up.sustained_prompt_tok_per_s,
        drain = keep_up.drain_s,
        p99 = keep_up.p99_ttft_s,
        verdict = if keep_up.kept_up {
            "kept up"
        } else {
            "fell behind"
        },
        drain_max = KEEP_UP_DRAIN_S_MAX,
        p99_max = KEEP_UP_P99_TTFT_S_MAX,
    )
}

/// The side-by-side table of `columns` (header, run).
fn table_of(columns: &[(&str, &RunMetrics)]) -> String {
    let runs: Vec<&RunMetrics> = columns.iter().map(|(_, run)| *run).collect();
    type Row = (&'static str, fn(&RunMetrics) -> String);
    let rows: [Row; 18] = [
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
        ("preemptions (offloaded)", |r| {
            format!("{} ({})", r.preemptions, r.preemptions_offloaded)
        }),
        ("  their tokens cached / restored", |r| {
            format!(
                "{} / {}",
                r.preempted_tokens_local_hit, r.preempted_tokens_restored
            )
        }),
        ("  their tokens recomputed", |r| {
            r.preempted_tokens_recomputed.to_string()
        }),
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
        .map(|(_, cell)| runs.iter().map(|run| cell(run)).collect())
        .collect();
    let widths: Vec<usize> = (0..runs.len())
        .map(|col| {
            cells
                .iter()
                .map(|row| row[col].len())
                .chain([columns[col].0.len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = format!("{:label_width$}", "");
    for ((header, _), width) in columns.iter().zip(&widths) {
        out.push_str(&format!("  {header:>width$}"));
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

/// The line under a table naming a run the watchdog stopped, and why; empty for a run that finished.
fn stopped_line(run: &RunMetrics) -> String {
    run.stopped
        .as_ref()
        .map(|why| format!("INCOMPLETE: {} stopped early: {why}\n", run.policy))
        .unwrap_or_default()
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
