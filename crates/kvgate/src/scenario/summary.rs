//! A scenario's trace as a short text a person reads: what the scenario is, each request's path through
//! its phases by step, and the headline metrics. `kvgate scenario FILE` prints it; `--json` prints the trace.

use std::collections::BTreeMap;

use serde_json::Value;

/// The summary of a trace `run` returned: its description and policy, one line per request (each phase it
/// went through from the step it entered it, a capacity wait shown as `waiting for room`, and the steps where
/// it fell back, was preempted or finished), and the metrics.
pub fn summary(trace: &Value) -> String {
    let steps = trace["steps"].as_array().map_or(&[][..], Vec::as_slice);
    let mut paths: BTreeMap<u64, Vec<(String, u64)>> = BTreeMap::new();
    for step in steps {
        let index = step["step"].as_u64().unwrap_or(0);
        let Some(requests) = step["requests"].as_object() else {
            continue;
        };
        for (id, request) in requests {
            let Ok(id) = id.parse::<u64>() else { continue };
            let phase = request["phase"].as_str().unwrap_or("?");
            let phase = if request["waiter"].as_bool() == Some(true) {
                format!("{phase}, waiting for room")
            } else {
                phase.to_string()
            };
            let path = paths.entry(id).or_default();
            if path.last().is_none_or(|(last, _)| *last != phase) {
                path.push((phase, index));
            }
        }
        let ids = |key: &str| -> Vec<u64> {
            step[key].as_array().map_or(Vec::new(), |ids| {
                ids.iter()
                    .filter_map(|id| id.as_u64().or_else(|| id[0].as_u64()))
                    .collect()
            })
        };
        let events = [
            ("fallbacks", "fell back to recompute"),
            ("preempted", "preempted"),
            ("finished", "finished"),
        ];
        for (key, what) in events {
            for id in ids(key) {
                paths.entry(id).or_default().push((what.to_string(), index));
            }
        }
    }
    let metrics = &trace["metrics"];
    let mut out = format!(
        "{}\npolicy {}, {} steps, {:.3} s simulated\n",
        trace["description"].as_str().unwrap_or_default(),
        trace["policy"].as_str().unwrap_or("?"),
        steps.len(),
        metrics["sim_seconds"].as_f64().unwrap_or(0.0)
    );
    for (id, path) in &paths {
        let phases: Vec<String> = path
            .iter()
            .map(|(phase, step)| format!("{phase} (step {step})"))
            .collect();
        out.push_str(&format!("request {id}: {}\n", phases.join(" -> ")));
    }
    let count = |name: &str| metrics[name].as_u64().unwrap_or(0);
    let by_reason = |name: &str| -> u64 {
        metrics[name].as_object().map_or(0, |reasons| {
            reasons.values().filter_map(Value::as_u64).sum()
        })
    };
    out.push_str(&format!(
        "prompt tokens from cache {:.1}% ({} restored, {} local hit, {} recomputed); restore fallbacks {}; \
         capacity waits {} (longest {:.3} s); preemptions {}; leaked pages {}\n",
        metrics["prompt_tokens_from_cache_pct"]
            .as_f64()
            .unwrap_or(0.0),
        count("prompt_tokens_restored"),
        count("prompt_tokens_local_hit"),
        count("prompt_tokens_recomputed"),
        by_reason("restore_fallbacks"),
        count("capacity_waits"),
        metrics["longest_capacity_wait_s"].as_f64().unwrap_or(0.0),
        count("preemptions"),
        count("leaked_pages"),
    ));
    out
}
