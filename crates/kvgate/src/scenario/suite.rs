//! `kvgate scenario --suite DIR`: every `*.json` scenario of a directory, run under each policy it names,
//! with its expectations checked. A suite file states where its timeline comes from (`source`), what went
//! wrong there (`symptom`), which contract ids hold it back (`contract`), and per policy what the run must
//! show (`expect`). Every run verifies every restored page against recompute (`restore.verify`, E3, L5) and
//! checks the engine's invariants after every step (as every scenario run does); on top of a file's own
//! expectations, every run must leak no page and end with every submitted request finished or cancelled
//! (unless the file expects the run to fail), and under the policies with the contract no restore may be
//! admitted in a step that preempted a running request (Q6).
//!
//! `KVGATE_RESTORE_MAX_WAIT_S` does not apply to a suite: its expectations are those of the files' configs.

use std::collections::BTreeMap;
use std::path::Path;

use engine::{Policy, RunMetrics};
use serde::Deserialize;
use serde_json::Value;

use super::{Scenario, execute};
use crate::error::{Error, Result};

/// What one policy's run of a scenario must show. Every field is optional.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// The run must stop with an error whose message contains this text (a stranded request: `max_steps` ran
    /// out with work left, or the liveness watchdog stopped the run). Absent: the run must end, every
    /// submitted request finished or cancelled.
    #[serde(default)]
    pub error: Option<String>,
    /// Restore fallbacks by reason (`FallbackReason` names), exactly: a reason not named counts none.
    #[serde(default)]
    pub fallbacks: Option<BTreeMap<String, u32>>,
    /// Bounds on the run's metrics, by name: any number of the trace's `metrics` object, or a derived count
    /// (`DERIVED`). A number is checked exactly, `{"min": a, "max": b}` (either may be left out) as a range.
    #[serde(default)]
    pub metrics: BTreeMap<String, Bound>,
    /// What single requests must show, by request id.
    #[serde(default)]
    pub requests: BTreeMap<u64, RequestExpect>,
}

/// A bound on one metric: a number it must equal, or a range.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Bound {
    /// Exactly this value.
    Exact(f64),
    /// Within `[min, max]`; a missing end is open.
    Range(Range),
}

/// A range of a metric.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Range {
    /// The smallest value allowed.
    #[serde(default)]
    pub min: Option<f64>,
    /// The largest value allowed.
    #[serde(default)]
    pub max: Option<f64>,
}

/// What one request must show in the step trace.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestExpect {
    /// The reason of its restore fallback (its last, if it fell back more than once), or `"none"`.
    #[serde(default)]
    pub fallback: Option<String>,
    /// How many times it was preempted (the trace's `preempted`).
    #[serde(default)]
    pub preempted: Option<u32>,
    /// It finished at or before this engine time, in seconds.
    #[serde(default)]
    pub finished_by_s: Option<f64>,
    /// It was admitted at least once (a cancelled or stranded request may never be).
    #[serde(default)]
    pub admitted: Option<bool>,
}

/// Counts derived from the trace and the engine, checked like the trace's metrics.
pub(crate) const DERIVED: [&str; 6] = [
    "requests_submitted",
    "requests_finished",
    "requests_cancelled",
    "fallbacks_total",
    "restores_admitted_in_a_preempting_step",
    "steps",
];

/// One scenario file run under one policy, and what failed.
#[derive(Clone, Debug)]
pub struct CaseRun {
    /// The file's name without `.json`.
    pub name: String,
    /// The policy (`-` when the file could not be read).
    pub policy: String,
    /// The file's `source`.
    pub source: String,
    /// Why the run fails its expectations; empty when it passes.
    pub failures: Vec<String>,
}

impl CaseRun {
    /// Whether every expectation held.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Runs every `*.json` file of `dir` (in name order) under each policy it names and checks it. A file that
/// cannot be read or is not a valid suite case is a failed run of its own; a directory without any file is an
/// error.
pub fn run_suite(dir: &Path) -> Result<Vec<CaseRun>> {
    let shown = dir.display().to_string();
    let entries = std::fs::read_dir(dir).map_err(|source| Error::ReadFile {
        path: shown.clone(),
        source,
    })?;
    let mut paths: Vec<std::path::PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.is_file() && path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    paths.sort();
    if paths.is_empty() {
        return Err(Error::Scenario {
            path: shown,
            message: "the suite has no *.json file".to_string(),
        });
    }
    Ok(paths.iter().flat_map(|path| run_case(path)).collect())
}

/// Runs one suite file under each of its policies.
pub(crate) fn run_case(path: &Path) -> Vec<CaseRun> {
    let name = path
        .file_stem()
        .map_or_else(String::new, |stem| stem.to_string_lossy().into_owned());
    let broken = |why: String| {
        vec![CaseRun {
            name: name.clone(),
            policy: "-".to_string(),
            source: String::new(),
            failures: vec![why],
        }]
    };
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) => return broken(format!("cannot read {}: {error}", path.display())),
    };
    let scenario: Scenario = match serde_json::from_str(&text) {
        Ok(scenario) => scenario,
        Err(error) => return broken(format!("not a valid scenario: {error}")),
    };
    let policies = match case_policies(&scenario) {
        Ok(policies) => policies,
        Err(why) => {
            let mut runs = broken(why);
            runs[0].source.clone_from(&scenario.source);
            return runs;
        }
    };
    policies
        .into_iter()
        .map(|policy| {
            let mut run = scenario.clone();
            run.policy.clone_from(&policy);
            run.config.restore.verify = true;
            let outcome = execute(&run);
            let failures = check(&run, &scenario.expect[&policy], &outcome);
            CaseRun {
                name: name.clone(),
                policy,
                source: scenario.source.clone(),
                failures,
            }
        })
        .collect()
}

/// The policies a suite file runs under, or why it is not a valid suite case: it must name its source, the
/// symptom and the contract ids, run under `reserved`, and expect something of exactly the policies it runs.
fn case_policies(scenario: &Scenario) -> std::result::Result<Vec<String>, String> {
    let mut missing = Vec::new();
    if scenario.source.trim().is_empty() {
        missing.push("source");
    }
    if scenario.symptom.trim().is_empty() {
        missing.push("symptom");
    }
    if scenario.contract.is_empty() {
        missing.push("contract");
    }
    if !missing.is_empty() {
        return Err(format!(
            "a suite case needs {}; see docs/scenarios.md",
            missing.join(", ")
        ));
    }
    if let Some(id) = scenario.contract.iter().find(|id| !is_contract_id(id)) {
        return Err(format!(
            "contract id {id:?} is invalid; allowed: a letter and a number, as R2 or Q6"
        ));
    }
    let policies = if scenario.policies.is_empty() {
        vec![scenario.policy.clone()]
    } else {
        scenario.policies.clone()
    };
    for policy in &policies {
        policy
            .parse::<Policy>()
            .map_err(|error| error.to_string())?;
    }
    if !policies
        .iter()
        .any(|policy| policy == Policy::Reserved.name())
    {
        return Err("a suite case runs under reserved; add it to policies".to_string());
    }
    for policy in &policies {
        if !scenario.expect.contains_key(policy) {
            return Err(format!("policy {policy} has no entry in expect"));
        }
    }
    if let Some(extra) = scenario.expect.keys().find(|name| !policies.contains(name)) {
        return Err(format!(
            "expect names policy {extra}, which the case does not run; add it to policies"
        ));
    }
    Ok(policies)
}

fn is_contract_id(id: &str) -> bool {
    let mut chars = id.chars();
    chars.next().is_some_and(|c| c.is_ascii_uppercase())
        && id.len() > 1
        && chars.all(|c| c.is_ascii_digit())
}

/// Every way the run `outcome` of `scenario` (already set to its policy) misses `expect`, and the checks
/// every suite run makes; empty when it passes.
pub fn check(
    scenario: &Scenario,
    expect: &Expect,
    outcome: &Result<(Value, RunMetrics)>,
) -> Vec<String> {
    let mut failures = Vec::new();
    let (trace, metrics) = match (outcome, &expect.error) {
        (Err(error), Some(wanted)) => {
            let message = error.to_string();
            if !message.contains(wanted.as_str()) {
                failures.push(format!(
                    "expected an error containing {wanted:?}, got: {message}"
                ));
            }
            return failures;
        }
        (Err(error), None) => return vec![format!("the run failed: {error}")],
        (Ok(_), Some(wanted)) => {
            return vec![format!(
                "expected the run to fail with an error containing {wanted:?}, but it ended"
            )];
        }
        (Ok((trace, metrics)), None) => (trace, metrics),
    };
    let values = metric_values(trace, metrics);
    check_always(scenario, metrics, &values, &mut failures);
    if let Some(wanted) = &expect.fallbacks {
        check_fallbacks(metrics, wanted, &mut failures);
    }
    check_bounds(expect, &values, &mut failures);
    for (id, wanted) in &expect.requests {
        check_request(trace, *id, wanted, &mut failures);
    }
    failures
}

/// The checks every suite run makes: nothing leaked, no watchdog stop, every request ended, and under a
/// reserving policy no restore admitted in a preempting step (Q6).
fn check_always(
    scenario: &Scenario,
    metrics: &RunMetrics,
    values: &BTreeMap<String, f64>,
    failures: &mut Vec<String>,
) {
    let value = |name: &str| values.get(name).copied().unwrap_or(f64::NAN);
    if value("leaked_pages") != 0.0 {
        failures.push(format!("{} pages leaked", value("leaked_pages")));
    }
    if let Some(why) = &metrics.stopped {
        failures.push(format!("the watchdog stopped the run: {why}"));
    }
    let rejected: u32 = metrics.rejected_requests.values().sum();
    let ended = metrics.requests_finished + metrics.requests_cancelled + rejected;
    if value("requests_submitted") != f64::from(ended) {
        failures.push(format!(
            "{} requests submitted, {ended} finished, cancelled or rejected",
            value("requests_submitted")
        ));
    }
    let contract = scenario
        .policy
        .parse::<Policy>()
        .is_ok_and(Policy::uses_reservations);
    let preempting = value("restores_admitted_in_a_preempting_step");
    if contract && preempting != 0.0 {
        failures.push(format!(
            "{preempting} restores admitted in a step that preempted a running request (Q6)"
        ));
    }
}

/// The run's fallbacks by reason equal `wanted` (reasons with zero left out of both).
fn check_fallbacks(
    metrics: &RunMetrics,
    wanted: &BTreeMap<String, u32>,
    failures: &mut Vec<String>,
) {
    let got: BTreeMap<String, u32> = metrics
        .restore_fallbacks
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(reason, n)| (reason.clone(), *n))
        .collect();
    let wanted: BTreeMap<String, u32> = wanted
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(reason, n)| (reason.clone(), *n))
        .collect();
    if got != wanted {
        failures.push(format!(
            "fallbacks {} (expected {})",
            show_counts(&got),
            show_counts(&wanted)
        ));
    }
}

/// Each metric `expect` bounds is present and within its bound.
fn check_bounds(expect: &Expect, values: &BTreeMap<String, f64>, failures: &mut Vec<String>) {
    for (name, bound) in &expect.metrics {
        let Some(&got) = values.get(name.as_str()) else {
            failures.push(format!(
                "no metric {name:?}; allowed: a number of the trace's metrics or one of {}",
                DERIVED.join(", ")
            ));
            continue;
        };
        match bound {
            Bound::Exact(wanted) if got != *wanted => {
                failures.push(format!("{name} {got} (expected {wanted})"));
            }
            Bound::Range(Range { min, max }) => {
                if min.is_some_and(|min| got < min) || max.is_some_and(|max| got > max) {
                    failures.push(format!(
                        "{name} {got} (expected {} to {})",
                        min.map_or("any".to_string(), |min| min.to_string()),
                        max.map_or("any".to_string(), |max| max.to_string())
                    ));
                }
            }
            Bound::Exact(_) => {}
        }
    }
}

/// The run's metrics by name: every number of the trace's `metrics` object and the derived counts.
fn metric_values(trace: &Value, metrics: &RunMetrics) -> BTreeMap<String, f64> {
    let mut values: BTreeMap<String, f64> = trace["metrics"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(name, value)| Some((name.clone(), value.as_f64()?)))
        .collect();
    let steps = trace["steps"].as_array().map_or(&[][..], Vec::as_slice);
    let submitted = steps
        .iter()
        .flat_map(|step| step["events"].as_array().into_iter().flatten())
        .filter_map(Value::as_object)
        .flatten()
        .filter(|(name, outcome)| name.starts_with("submit ") && *outcome == "ok")
        .count();
    values.insert("requests_submitted".to_string(), submitted as f64);
    values.insert(
        "requests_finished".to_string(),
        f64::from(metrics.requests_finished),
    );
    values.insert(
        "requests_cancelled".to_string(),
        f64::from(metrics.requests_cancelled),
    );
    values.insert(
        "fallbacks_total".to_string(),
        f64::from(metrics.restore_fallbacks.values().sum::<u32>()),
    );
    values.insert(
        "restores_admitted_in_a_preempting_step".to_string(),
        restores_admitted_in_a_preempting_step(steps) as f64,
    );
    values.insert("steps".to_string(), steps.len() as f64);
    values
}

/// Restores admitted (requests that were `ready` after the previous step: a published import they own) in a
/// step that also preempted a running request: a running decode gave its pages to a restore.
fn restores_admitted_in_a_preempting_step(steps: &[Value]) -> usize {
    steps
        .windows(2)
        .filter(|pair| {
            let (before, step) = (&pair[0], &pair[1]);
            let preempted = step["preempted"]
                .as_array()
                .is_some_and(|ids| !ids.is_empty());
            preempted
                && ids(&step["admitted"])
                    .any(|id| before["requests"][id.to_string()]["phase"].as_str() == Some("ready"))
        })
        .count()
}

fn ids(value: &Value) -> impl Iterator<Item = u64> + '_ {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_u64)
}

/// Checks one request's expectations against the step trace.
fn check_request(trace: &Value, id: u64, wanted: &RequestExpect, failures: &mut Vec<String>) {
    let steps = trace["steps"].as_array().map_or(&[][..], Vec::as_slice);
    if let Some(reason) = &wanted.fallback {
        let got = steps
            .iter()
            .flat_map(|step| step["fallbacks"].as_array().into_iter().flatten())
            .filter(|entry| entry[0].as_u64() == Some(id))
            .filter_map(|entry| entry[1].as_str())
            .next_back()
            .unwrap_or("none");
        if got != reason {
            failures.push(format!("request {id} fallback {got} (expected {reason})"));
        }
    }
    if let Some(times) = wanted.preempted {
        let got = steps
            .iter()
            .flat_map(|step| ids(&step["preempted"]))
            .filter(|&preempted| preempted == id)
            .count();
        if got != times as usize {
            failures.push(format!(
                "request {id} preempted {got} times (expected {times})"
            ));
        }
    }
    if let Some(by_s) = wanted.finished_by_s {
        let finished = steps
            .iter()
            .filter(|step| ids(&step["finished"]).any(|done| done == id))
            .filter_map(|step| step["now_s"].as_f64())
            .next_back();
        match finished {
            Some(at) if at <= by_s => {}
            Some(at) => failures.push(format!(
                "request {id} finished at {at} s (expected by {by_s} s)"
            )),
            None => failures.push(format!(
                "request {id} never finished (expected by {by_s} s)"
            )),
        }
    }
    if let Some(admitted) = wanted.admitted {
        let got = steps
            .iter()
            .any(|step| ids(&step["admitted"]).any(|done| done == id));
        if got != admitted {
            failures.push(format!(
                "request {id} {} (expected {})",
                if got { "admitted" } else { "never admitted" },
                if admitted {
                    "admitted"
                } else {
                    "never admitted"
                }
            ));
        }
    }
}

fn show_counts(counts: &BTreeMap<String, u32>) -> String {
    if counts.is_empty() {
        return "none".to_string();
    }
    counts
        .iter()
        .map(|(reason, n)| format!("{reason} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The suite's report: one line per case and policy (`pass` or `FAIL`, name, policy, source, and why it
/// failed), then a total.
pub fn report(runs: &[CaseRun]) -> String {
    let name_width = runs.iter().map(|run| run.name.len()).max().unwrap_or(0);
    let policy_width = runs.iter().map(|run| run.policy.len()).max().unwrap_or(0);
    let mut out = String::new();
    for run in runs {
        let status = if run.passed() { "pass" } else { "FAIL" };
        out.push_str(&format!(
            "{status}  {:name_width$}  {:policy_width$}  {}",
            run.name, run.policy, run.source
        ));
        if !run.passed() {
            out.push_str(&format!(": {}", run.failures.join("; ")));
        }
        out.push('\n');
    }
    let failed = runs.iter().filter(|run| !run.passed()).count();
    out.push_str(&format!(
        "{} case runs, {} passed, {failed} failed\n",
        runs.len(),
        runs.len() - failed
    ));
    out
}

/// `Ok` when every run passed, else an error naming the failed cases.
pub fn verdict(dir: &Path, runs: &[CaseRun]) -> Result<()> {
    let failed: Vec<String> = runs
        .iter()
        .filter(|run| !run.passed())
        .map(|run| format!("{} ({})", run.name, run.policy))
        .collect();
    if failed.is_empty() {
        return Ok(());
    }
    Err(Error::Scenario {
        path: dir.display().to_string(),
        message: format!(
            "{} of {} case runs failed: {}",
            failed.len(),
            runs.len(),
            failed.join(", ")
        ),
    })
}
