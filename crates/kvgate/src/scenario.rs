//! `kvgate scenario FILE`: a scripted timeline (config, policy and events such as submit, cancel, reset,
//! copy faults and clock jumps, each at a step index) run through one engine, producing a per-step JSON trace
//! of what each step scheduled, preemptions, request states, credits and free pages. The format is documented
//! in `docs/scenarios.md`; unknown fields are rejected. Steps where the engine is idle and no event is due are
//! skipped: the run jumps to the next event's step.
//!
//! A scenario may also state where it comes from and what it must show (`source`, `symptom`, `contract`,
//! `scaled_down`, `policies`, `expect`): `kvgate scenario --suite DIR` runs every file of a directory under
//! each policy it names and checks its expectations (`suite`), as the ported upstream incidents under
//! `tests/scenarios/incidents/` do.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use checkpoint_transfer::Fault;
use engine::{Engine, Policy, RequestSpec, RunMetrics, StepReport};
use kv_pool::RequestId;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::EngineBuilder;
use crate::config::EngineConfig;
use crate::error::{Error, Result};
use crate::limits::{SCENARIO_STEPS_MAX, duration_s, show};
use crate::report;
use crate::workload::token;

/// A scenario file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// What the scenario shows.
    #[serde(default)]
    pub description: String,
    /// Engine configuration (the TOML config's structure, in JSON; a model preset named in
    /// `model.preset` is applied). Default: the embedded default.
    #[serde(default, deserialize_with = "config_with_model_preset")]
    pub config: EngineConfig,
    /// Policy: ordinary, pages-only, reserved (default) or oracle.
    #[serde(default = "default_policy")]
    pub policy: String,
    /// Steps at most; the run also ends once every event ran and the engine is idle. Default 10000; at most
    /// 1000000.
    #[serde(default = "default_max_steps")]
    pub max_steps: u32,
    /// The timeline.
    pub events: Vec<Event>,
    /// Where the timeline comes from: the project and issue or pull request it ports (for example
    /// `vllm-project/vllm#57104`). Required in a suite.
    #[serde(default)]
    pub source: String,
    /// What went wrong there. Required in a suite.
    #[serde(default)]
    pub symptom: String,
    /// The contract ids that hold the symptom back here (for example `["R2", "Q2"]`). Required in a suite.
    #[serde(default)]
    pub contract: Vec<String>,
    /// What of the upstream timeline was scaled down, and how.
    #[serde(default)]
    pub scaled_down: String,
    /// The policies a suite runs the file under (default: `policy` alone); each needs an entry in `expect`.
    #[serde(default)]
    pub policies: Vec<String>,
    /// What each policy's run must show, by policy name (checked by a suite run, `suite::check`).
    #[serde(default)]
    pub expect: BTreeMap<String, suite::Expect>,
}

/// One event: `action` is applied just before step `at_step` runs (steps count from 0).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Event {
    /// The step before which the event happens.
    pub at_step: u32,
    /// What happens.
    #[serde(rename = "do")]
    pub action: Action,
}

/// What an event does.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum Action {
    /// Submit a request.
    Submit(Submit),
    /// Cancel a request.
    Cancel {
        /// The request.
        id: u64,
    },
    /// Reset the prefix cache, forced or not.
    Reset {
        /// Forced resets preempt running requests and release ready imports (X1); non-forced ones fail while
        /// an import is staged or owned (X2).
        forced: bool,
    },
    /// Resume a paused streaming request with more input (Q7).
    Resume {
        /// The request.
        id: u64,
        /// New input tokens.
        new_tokens: u32,
        /// Output tokens of the resumed turn.
        max_output_tokens: u32,
    },
    /// Inject a fault into the simulated copy engine.
    CopyFault(CopyFault),
    /// Jump the engine clock forward by this many seconds.
    AdvanceS(f64),
}

/// A request to submit.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Submit {
    /// Request id (unique among live requests).
    pub id: u64,
    /// The finished request whose prompt and output this prompt starts with (the previous turn of its
    /// session), if any. Its checkpoints are what a restore finds in the store.
    #[serde(default)]
    pub extends: Option<u64>,
    /// New tokens appended after the extended context (or the whole prompt without `extends`).
    pub new_tokens: u32,
    /// Seed of the new tokens' stream. Default: the request id.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Output length cap.
    pub max_output_tokens: u32,
    /// Emit the stop token after this many output tokens.
    #[serde(default)]
    pub stop_after: Option<u32>,
    /// Scheduling priority (larger first when the engine schedules by priority).
    #[serde(default)]
    pub priority: i32,
    /// A streaming session that pauses when its output is done (Q7).
    #[serde(default)]
    pub streaming: bool,
    /// Whether its checkpoints carry saved logits (Q4).
    #[serde(default)]
    pub saved_logits: bool,
    /// Tokens of its instruction: a chunk ends there and that boundary's checkpoint is published (H7).
    #[serde(default)]
    pub instruction_tokens: Option<u32>,
}

/// A copy fault.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum CopyFault {
    /// The next copy on `rank` fails.
    FailNext {
        /// The rank.
        rank: u32,
    },
    /// The next copy on `rank` completes `by_s` seconds late.
    DelayNext {
        /// The rank.
        rank: u32,
        /// Extra seconds.
        by_s: f64,
    },
}

fn default_policy() -> String {
    Policy::Reserved.name().to_string()
}

/// A scenario's config with the model preset it names applied, as a TOML config's is
/// (`EngineConfig::with_model_preset`).
fn config_with_model_preset<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<EngineConfig, D::Error> {
    let value = Value::deserialize(deserializer)?;
    let set = |section: &str, key: &str| value.get(section).and_then(|s| s.get(key)).is_some();
    let config: EngineConfig =
        serde_json::from_value(value.clone()).map_err(serde::de::Error::custom)?;
    config
        .with_model_preset(&set)
        .map_err(serde::de::Error::custom)
}

fn default_max_steps() -> u32 {
    10_000
}

/// Reads a scenario file, runs it and returns the trace as pretty JSON, with preset `preset` (a cost or model
/// preset, as `--preset` gives it) replacing the file's model when one is given. `KVGATE_RESTORE_MAX_WAIT_S`
/// overrides the file's `restore.max_wait_s`, as it overrides a config file's.
pub fn run_file_with_preset(path: &Path, preset: Option<&str>) -> Result<String> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| Error::ReadFile {
        path: shown.clone(),
        source,
    })?;
    let mut scenario: Scenario = serde_json::from_str(&text).map_err(|e| Error::Scenario {
        path: shown.clone(),
        message: e.to_string(),
    })?;
    scenario.config = scenario.config.with_env_overrides()?;
    if let Some(preset) = preset {
        scenario.config.apply_preset(preset)?;
    }
    let trace = run(&scenario).map_err(|error| match error {
        Error::Scenario { message, .. } => Error::Scenario {
            path: shown,
            message,
        },
        other => other,
    })?;
    serde_json::to_string_pretty(&trace)
        .map_err(|error| Error::Internal(format!("the scenario trace as JSON: {error}")))
}

/// Runs a scenario and returns its trace: `{"description", "policy", "steps": [...], "metrics": {...}}`.
pub fn run(scenario: &Scenario) -> Result<Value> {
    execute(scenario).map(|(trace, _)| trace)
}

/// `run`, also returning the engine's metrics (with the counts of finished and cancelled requests the trace's
/// `metrics` leaves out).
pub(crate) fn execute(scenario: &Scenario) -> Result<(Value, RunMetrics)> {
    let bad = |message: String| Error::Scenario {
        path: String::new(),
        message,
    };
    let policy: Policy = scenario.policy.parse()?;
    if scenario.max_steps > SCENARIO_STEPS_MAX {
        return Err(bad(format!(
            "max_steps {} is above the limit of {SCENARIO_STEPS_MAX}; use fewer steps",
            scenario.max_steps
        )));
    }
    let mut engine = EngineBuilder::new(scenario.config.clone())
        .policy(policy)
        .build()?;
    let mut events: BTreeMap<u32, Vec<&Action>> = BTreeMap::new();
    for event in &scenario.events {
        if event.at_step >= scenario.max_steps {
            return Err(bad(format!(
                "event at step {} is past max_steps {}",
                event.at_step, scenario.max_steps
            )));
        }
        check_event(&engine, &event.action)
            .map_err(|message| bad(format!("step {}: {message}", event.at_step)))?;
        events.entry(event.at_step).or_default().push(&event.action);
    }
    let mut contexts: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut live: BTreeSet<u64> = BTreeSet::new();
    let mut steps = Vec::new();
    let mut step = 0;
    while step < scenario.max_steps {
        let mut outcomes = Vec::new();
        for action in events.remove(&step).unwrap_or_default() {
            let outcome = apply(&mut engine, action, &mut contexts, &mut live)
                .map_err(|e| bad(format!("step {step}: {e}")))?;
            outcomes.push(outcome);
        }
        let report = engine.step()?;
        for done in engine.take_finished() {
            live.remove(&done.id.0);
            if let Some(context) = contexts.get_mut(&done.id.0) {
                context.extend_from_slice(&done.output);
            }
        }
        engine.check_invariants()?;
        steps.push(step_json(step, &report, &outcomes, &engine, &live));
        if engine.is_idle() {
            // Nothing happens by itself until the next event: jump to it rather than step through idle steps.
            match events.keys().next() {
                Some(&next) => step = next,
                None => break,
            }
        } else {
            step += 1;
        }
    }
    if !engine.is_idle() {
        return Err(bad(stuck_at_budget(&engine, scenario.max_steps, &live)));
    }
    let metrics = engine.metrics();
    let trace = json!({
        "description": scenario.description,
        "policy": policy.name(),
        "steps": steps,
        "metrics": report::run_json(&metrics),
    });
    Ok((trace, metrics))
}

/// Applies one action; engine refusals are part of the trace (`"error: ..."`), scenario mistakes are errors.
fn apply(
    engine: &mut Engine,
    action: &Action,
    contexts: &mut HashMap<u64, Vec<u32>>,
    live: &mut BTreeSet<u64>,
) -> std::result::Result<Value, String> {
    let outcome = |name: &str, result: std::result::Result<(), engine::Error>| match result {
        Ok(()) => json!({ name: "ok" }),
        Err(error) => json!({ name: format!("error: {error}") }),
    };
    Ok(match action {
        Action::Submit(submit) => {
            let (id, result) = submit_action(engine, submit, contexts, live)?;
            outcome(&format!("submit {id}"), result)
        }
        Action::Cancel { id } => outcome(&format!("cancel {id}"), engine.cancel(RequestId(*id))),
        Action::Reset { forced } => {
            let name = if *forced { "forced reset" } else { "reset" };
            let result = if *forced {
                engine.force_reset_prefix_cache()
            } else {
                engine.reset_prefix_cache()
            };
            outcome(name, result)
        }
        Action::Resume {
            id,
            new_tokens,
            max_output_tokens,
        } => {
            check_prompt_len(engine, "resume.new_tokens", 0, *new_tokens)?;
            let seed = id ^ u64::from(*new_tokens) ^ 0x2E5D;
            let input: Vec<u32> = (0..u64::from(*new_tokens))
                .map(|i| token(seed, i))
                .collect();
            let result = engine.resume(RequestId(*id), &input, *max_output_tokens);
            if result.is_ok() {
                live.insert(*id);
            }
            outcome(&format!("resume {id}"), result)
        }
        Action::CopyFault(fault) => {
            let (name, fault) = match *fault {
                CopyFault::FailNext { rank } => (
                    format!("fail next copy on rank {rank}"),
                    Fault::FailNext { rank },
                ),
                CopyFault::DelayNext { rank, by_s } => (
                    format!("delay next copy on rank {rank} by {by_s} s"),
                    Fault::DelayNext {
                        rank,
                        by: seconds("delay_next.by_s", by_s)?,
                    },
                ),
            };
            outcome(&name, engine.inject_copy_fault(fault))
        }
        Action::AdvanceS(by_s) => {
            engine.advance_clock(engine.now().after(seconds("advance_s", *by_s)?));
            json!({ format!("advance {by_s} s"): "ok" })
        }
    })
}

/// Submits `submit`'s request (its prompt extending a finished request's context when it says so); the
/// engine's answer is part of the trace, a scenario mistake an error.
fn submit_action(
    engine: &mut Engine,
    submit: &Submit,
    contexts: &mut HashMap<u64, Vec<u32>>,
    live: &mut BTreeSet<u64>,
) -> std::result::Result<(u64, std::result::Result<(), engine::Error>), String> {
    let mut prompt = match submit.extends {
        Some(earlier) if live.contains(&earlier) => {
            return Err(format!(
                "request {} extends request {earlier}, which has not finished",
                submit.id
            ));
        }
        Some(earlier) => contexts
            .get(&earlier)
            .cloned()
            .ok_or_else(|| format!("request {} extends unknown request {earlier}", submit.id))?,
        None => Vec::new(),
    };
    check_prompt_len(engine, "new_tokens", prompt.len(), submit.new_tokens)?;
    let seed = submit.seed.unwrap_or(submit.id) ^ 0x5CE4_A410;
    prompt.extend((0..u64::from(submit.new_tokens)).map(|i| token(seed, i)));
    let now = engine.now();
    let mut spec = RequestSpec::new(submit.id, prompt.clone(), submit.max_output_tokens, now);
    spec.stop_after = submit.stop_after;
    spec.priority = submit.priority;
    spec.streaming = submit.streaming;
    spec.saved_logits = submit.saved_logits;
    spec.instruction_tokens = submit.instruction_tokens;
    spec.is_later_turn = submit.extends.is_some();
    let result = engine.submit(spec);
    if result.is_ok() {
        contexts.insert(submit.id, prompt);
        live.insert(submit.id);
    }
    Ok((submit.id, result))
}

/// Refuses, before the run, an event that could never do what it says: a copy fault on a rank the engine does
/// not have (it would never fire), a resume asking for no output (`submit` refuses 0 too).
fn check_event(engine: &Engine, action: &Action) -> std::result::Result<(), String> {
    let (field, rank) = match action {
        Action::CopyFault(CopyFault::FailNext { rank }) => ("fail_next", *rank),
        Action::CopyFault(CopyFault::DelayNext { rank, .. }) => ("delay_next", *rank),
        Action::Resume {
            max_output_tokens: 0,
            ..
        } => return Err("resume.max_output_tokens 0 is invalid; allowed: at least 1".to_string()),
        _ => return Ok(()),
    };
    let n_ranks = engine.params().geometry.context_parallel();
    if rank < n_ranks {
        return Ok(());
    }
    Err(format!(
        "copy_fault.{field}.rank {rank} is invalid; allowed: 0 to {} (model.context_parallel is {n_ranks})",
        n_ranks - 1
    ))
}

/// The error of a scenario whose `max_steps` ran out with work left: the requests still live, where each
/// stands.
fn stuck_at_budget(engine: &Engine, max_steps: u32, live: &BTreeSet<u64>) -> String {
    let stuck: Vec<String> = live
        .iter()
        .filter_map(|&id| {
            let view = engine
                .request(RequestId(id))
                .filter(|view| view.phase != engine::RequestPhase::Paused)?;
            Some(format!(
                "request {id} {} with {} tokens computed and {} output",
                view.phase.name(),
                view.n_computed,
                view.n_output
            ))
        })
        .collect();
    format!(
        "max_steps {max_steps} ran out with work left: {}; raise max_steps if it only needs longer, or \
         look for a request that can never finish",
        if stuck.is_empty() {
            "the engine is not idle".to_string()
        } else {
            stuck.join(", ")
        }
    )
}

/// `value` seconds of the scenario field `field`, or what is wrong with it.
fn seconds(field: &str, value: f64) -> std::result::Result<std::time::Duration, String> {
    duration_s(value, false)
        .map_err(|allowed| format!("{field} {} is invalid; allowed: {allowed}", show(value)))
}

/// Refuses, before it is built, a prompt of `context` tokens plus `new_tokens` longer than the model: no engine
/// could take it, and building it could exhaust memory.
fn check_prompt_len(
    engine: &Engine,
    field: &str,
    context: usize,
    new_tokens: u32,
) -> std::result::Result<(), String> {
    let max_model_len = engine.params().geometry.max_model_len();
    let tokens = context as u64 + u64::from(new_tokens);
    if tokens <= u64::from(max_model_len) {
        return Ok(());
    }
    Err(format!(
        "{field} {new_tokens} makes a prompt of {tokens} tokens, above model.max_model_len {max_model_len}; \
         use fewer tokens"
    ))
}

fn step_json(
    step: u32,
    report: &StepReport,
    events: &[Value],
    engine: &Engine,
    live: &BTreeSet<u64>,
) -> Value {
    let ids = |ids: &[RequestId]| ids.iter().map(|id| id.0).collect::<Vec<_>>();
    let requests: serde_json::Map<String, Value> = live
        .iter()
        .filter_map(|&id| {
            let view = engine.request(RequestId(id))?;
            Some((
                id.to_string(),
                json!({
                    "phase": view.phase.name(),
                    "computed": view.n_computed,
                    "pages": view.n_pages,
                    "ticket": view.has_ticket,
                    "waiter": view.is_waiter,
                    "output": view.n_output,
                }),
            ))
        })
        .collect();
    json!({
        "step": step,
        "now_s": (report.now.as_secs_f64() * 1e6).round() / 1e6,
        "events": events,
        "prefills": report.prefills.iter().map(|(id, n)| json!([id.0, n])).collect::<Vec<_>>(),
        "decodes": ids(&report.decodes),
        "logits_only": ids(&report.logits_only),
        "admitted": ids(&report.admitted),
        "preempted": ids(&report.preempted),
        "reset_preempted": ids(&report.reset_preempted),
        "finished": ids(&report.finished),
        "fallbacks": report.fallbacks.iter().map(|(id, why)| json!([id.0, why.name()])).collect::<Vec<_>>(),
        "examined": report.examined,
        "restore_polls": report.restore_polls,
        "free_pages": report.free_pages,
        "credit_pages": report.credit_pages,
        "waiting": report.waiting,
        "running": report.running,
        "requests": requests,
    })
}

pub mod suite;
mod summary;

pub use summary::summary;

#[cfg(test)]
mod tests;
