//! Reports of runs: the side-by-side table a person reads and the JSON a machine reads. Metric names are
//! those of architecture.md and part of the interface.

use engine::RunMetrics;
use serde_json::{Map, Value, json};

use crate::cluster::{ClusterRun, TTFT_SLO_P99_S};

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
        "mean_ttft_s": round(run.mean_ttft_s, 3),
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
        "ttft_slo_p99_s": TTFT_SLO_P99_S,
        "meets_ttft_slo": keep_up.meets_ttft_slo,
    });
    object
}

/// Whether one engine's replay kept up with the trace whose arrivals (on the engine clock, stretched) run
/// from `first_arrival_s` to `last_arrival_s`, by the cluster's objective (p99 time to first token at most
/// [`TTFT_SLO_P99_S`]): one line per run with its lag behind the last arrival and its p99, and for a run that
/// fell behind by how much.
pub fn replay_keep_up(runs: &[RunMetrics], first_arrival_s: f64, last_arrival_s: f64) -> String {
    let span_s = (last_arrival_s - first_arrival_s).max(0.0);
    let mut out = String::new();
    for run in runs {
        let (kept_up, drain_s) = kept_up(run, last_arrival_s);
        if kept_up {
            out.push_str(&format!(
                "{}: kept up with the trace's arrivals: last finish {drain_s:.1} s after the last arrival, p99 \
                 ttft {:.2} s\n",
                run.policy, run.p99_ttft_s
            ));
            continue;
        }
        let served_s = (run.sim_seconds - first_arrival_s).max(0.0);
        let slower = if span_s > 0.0 {
            format!(
                ", {:.2}x the {span_s:.0} s the trace spans",
                served_s / span_s
            )
        } else {
            String::new()
        };
        out.push_str(&format!(
            "{}: FELL BEHIND the trace's arrivals: served them in {served_s:.0} s{slower}; the last request \
             finished {drain_s:.0} s after the last arrival, p99 ttft {:.1} s (keeping up: p99 ttft within the \
             {TTFT_SLO_P99_S} s objective); the turn times above include that \
             queueing. Stretch the arrivals (--time-scale) or spread them over engines (--engines)\n",
            run.policy, run.p99_ttft_s
        ));
    }
    out
}

/// Whether `run` kept up with arrivals ending at `last_arrival_s` (the cluster's objective: p99 time to first
/// token within [`TTFT_SLO_P99_S`]), and how long after the last arrival its last request finished.
fn kept_up(run: &RunMetrics, last_arrival_s: f64) -> (bool, f64) {
    let drain_s = (run.sim_seconds - last_arrival_s).max(0.0);
    (run.p99_ttft_s <= TTFT_SLO_P99_S, drain_s)
}

/// [`replay_keep_up`] for machines: `{policy: {"kept_up", "drain_s"}}`.
pub(crate) fn replay_keep_up_json(runs: &[RunMetrics], last_arrival_s: f64) -> Value {
    let by_policy: Map<String, Value> = runs
        .iter()
        .map(|run| {
            let (kept_up, drain_s) = kept_up(run, last_arrival_s);
            (
                run.policy.clone(),
                json!({"kept_up": kept_up, "drain_s": round(drain_s, 3)}),
            )
        })
        .collect();
    Value::Object(by_policy)
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
         cluster: served them by {served:.1} s: sustained {rps:.2} requests/s, {tps:.0} prompt tok/s; lag: \
         last finish {drain:.1} s after the last arrival; p99 ttft {p99:.2} s against an SLO of {slo} s \
         ({verdict})\n{stopped}",
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
        slo = TTFT_SLO_P99_S,
        verdict = if keep_up.meets_ttft_slo {
            "met"
        } else {
            "missed"
        },
    )
}

/// The side-by-side table of `columns` (header, run).
fn table_of(columns: &[(&str, &RunMetrics)]) -> String {
    let runs: Vec<&RunMetrics> = columns.iter().map(|(_, run)| *run).collect();
    let rows = rows_of(&runs);
    let label_width = rows.iter().map(|(label, _)| label.len()).max().unwrap_or(0);
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(col, (header, _))| {
            rows.iter()
                .filter_map(|(_, cells)| cells.get(col).map(String::len))
                .chain([header.len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = format!("{:label_width$}", "");
    for ((header, _), width) in columns.iter().zip(&widths) {
        out.push_str(&format!("  {header:>width$}"));
    }
    out.push('\n');
    for (label, row) in &rows {
        out.push_str(&format!("{label:label_width$}"));
        for (cell, width) in row.iter().zip(&widths) {
            out.push_str(&format!("  {cell:>width$}"));
        }
        out.push('\n');
    }
    out
}

/// A row of the table: its label and one cell per run.
type Row = (String, Vec<String>);

/// The table's rows for `runs`: the headline metrics, and under the restore fallbacks and the rejected
/// requests one row per reason that any run counts.
fn rows_of(runs: &[&RunMetrics]) -> Vec<Row> {
    type Cell = fn(&RunMetrics) -> String;
    let row = |label: &str, cell: Cell| -> Row {
        (
            label.to_string(),
            runs.iter().map(|run| cell(run)).collect(),
        )
    };
    let mut rows: Vec<Row> = vec![
        row("prompt tokens from cache", |r| {
            format!("{:.1}%", r.prompt_tokens_from_cache_pct)
        }),
        row("  restored / local hit", |r| {
            format!(
                "{} / {}",
                r.prompt_tokens_restored, r.prompt_tokens_local_hit
            )
        }),
        row("  recomputed", |r| r.prompt_tokens_recomputed.to_string()),
        row("later turns with a restore", |r| {
            format!("{}/{}", r.later_turns_restored, r.later_turns)
        }),
        row("  or a full local hit", |r| {
            r.later_turns_local_hit.to_string()
        }),
        row("restore fallbacks", |r| {
            r.restore_fallbacks.values().sum::<u32>().to_string()
        }),
    ];
    rows.extend(by_reason(runs, |r| &r.restore_fallbacks));
    rows.push(row("rejected requests", |r| {
        r.rejected_requests.values().sum::<u32>().to_string()
    }));
    rows.extend(by_reason(runs, |r| &r.rejected_requests));
    let rest: [(&str, Cell); 11] = [
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
    rows.extend(rest.into_iter().map(|(label, cell)| row(label, cell)));
    rows
}

/// One row per reason any of `runs` counts in `counts`, labelled `  <reason>`, most frequent first.
fn by_reason(
    runs: &[&RunMetrics],
    counts: impl Fn(&RunMetrics) -> &std::collections::BTreeMap<String, u32>,
) -> Vec<Row> {
    let mut totals: std::collections::BTreeMap<&str, u64> = Default::default();
    for run in runs {
        for (reason, n) in counts(run) {
            *totals.entry(reason.as_str()).or_default() += u64::from(*n);
        }
    }
    let mut reasons: Vec<(&str, u64)> = totals.into_iter().filter(|(_, n)| *n > 0).collect();
    reasons.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    reasons
        .into_iter()
        .map(|(reason, _)| {
            let cells = runs
                .iter()
                .map(|run| counts(run).get(reason).copied().unwrap_or(0).to_string())
                .collect();
            (format!("  {reason}"), cells)
        })
        .collect()
}

/// The line under a table naming a run the watchdog stopped, and why; empty for a run that finished.
fn stopped_line(run: &RunMetrics) -> String {
    run.stopped
        .as_ref()
        .map(|why| format!("INCOMPLETE: {} stopped early: {why}\n", run.policy))
        .unwrap_or_default()
}

fn round(value: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (value * scale).round() / scale
}

#[cfg(test)]
mod tests;
