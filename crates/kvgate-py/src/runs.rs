//! The simulator's runs from Python: `agents`, `replay` (one engine or a cluster) and `scenario`, with the
//! command line's options and defaults and its `--json` report. Each policy runs on its own thread, as on
//! the command line, with the GIL released; the calling thread wakes every `POLL` to check for Ctrl-C
//! (`Python::check_signals`) and to call the progress callback, and on either raising it stops every run at
//! its next step (`Observer::stop`) and raises that exception.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde_json::{Value, json};

use kvgate::cluster::{self, ClusterRun, ClusterSpec, Router};
use kvgate::run::{self, Observer};
use kvgate::setup::{self, AgentsHeader, config_of, load_config, policies, stores_at_start};
use kvgate::workload::agents::TurnPriority;
use kvgate::workload::mooncake::{self, TraceRequest};
use kvgate::{Engine, EngineConfig, Executor, Policy, RunMetrics, StepReport, report};

use crate::convert::to_py;
use crate::errors;
use crate::options::{RunOptions, get};

/// How often the calling thread checks for Ctrl-C and reports progress while runs go on.
const POLL: Duration = Duration::from_millis(20);

/// One policy's run as the calling thread sees it: requests finished and in the workload.
#[derive(Debug, Default)]
struct Watch {
    done: AtomicU64,
    total: AtomicU64,
}

/// The per-step series of a run (`series=True`), as columns, and the run's stop flag.
#[derive(Debug)]
struct Recorder<'a> {
    stop: &'a AtomicBool,
    series: Option<Series>,
    /// Turns per session of an agents run: each request's session and turn go into the request series.
    turns: Option<u32>,
}

/// Columns of a run's series: one row a step (`steps`), one row a finished request (`requests`).
#[derive(Debug, Default)]
struct Series {
    steps: Vec<Value>,
    requests: Vec<Value>,
}

impl<E: Executor> Observer<E> for Recorder<'_> {
    fn step(&mut self, engine: &Engine<E>, report: &StepReport) {
        let Some(series) = &mut self.series else {
            return;
        };
        let prefill_tokens: u64 = report.prefills.iter().map(|(_, n)| u64::from(*n)).sum();
        series.steps.push(json!({
            "t_s": engine.now().as_secs_f64(),
            "free_pages": report.free_pages,
            "credit_pages": report.credit_pages,
            "waiting": report.waiting,
            "running": report.running,
            "prefill_tokens": prefill_tokens,
            "decodes": report.decodes.len(),
            "admitted": report.admitted.len(),
            "preempted": report.preempted.len(),
            "finished": report.finished.len(),
        }));
    }

    fn finish(&mut self, engine: &Engine<E>) {
        let Some(series) = &mut self.series else {
            return;
        };
        for request in engine.request_metrics() {
            let mut row = crate::engine::request_metrics_json(request);
            if let (Some(turns), Some(id)) = (self.turns, request.id) {
                row["session"] = json!(id.0 / u64::from(turns.max(1)));
                row["turn"] = json!(id.0 % u64::from(turns.max(1)));
            }
            series.requests.push(row);
        }
    }

    fn stop(&mut self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

impl Recorder<'_> {
    /// The series as columns: `{"steps": {name: [...]}, "requests": {name: [...]}}`.
    fn columns(self) -> Option<Value> {
        let series = self.series?;
        Some(json!({"steps": columns(&series.steps), "requests": columns(&series.requests)}))
    }
}

/// Rows of equal keys as one list per key (the shape `pandas.DataFrame` takes).
fn columns(rows: &[Value]) -> Value {
    let mut out = serde_json::Map::new();
    for row in rows {
        for (key, value) in row.as_object().into_iter().flatten() {
            let column = out.entry(key.clone()).or_insert_with(|| json!([]));
            if let Some(column) = column.as_array_mut() {
                column.push(value.clone());
            }
        }
    }
    Value::Object(out)
}

/// The calling thread's side of a set of runs: the progress callback and what stopped them.
struct Control<'py, 'a> {
    py: Python<'py>,
    progress: Option<&'a Bound<'py, PyAny>>,
    shown: Vec<(u64, u64)>,
}

impl Control<'_, '_> {
    /// Checks for Ctrl-C, then shows each run's progress that changed; the exception either raised.
    fn poll(&mut self, policies: &[Policy], watches: &[Watch]) -> PyResult<()> {
        self.py.check_signals()?;
        let Some(progress) = self.progress else {
            return Ok(());
        };
        for ((policy, watch), shown) in policies.iter().zip(watches).zip(&mut self.shown) {
            let now = (
                watch.done.load(Ordering::Relaxed),
                watch.total.load(Ordering::Relaxed),
            );
            if now != *shown && now.1 > 0 {
                *shown = now;
                progress.call1((policy.name(), now.0, now.1))?;
            }
        }
        Ok(())
    }
}

/// Runs `run` for every policy on its own thread with the GIL released, as described in the module docs.
fn run_policies<T: Send>(
    py: Python<'_>,
    policies: &[Policy],
    progress: Option<&Bound<'_, PyAny>>,
    run: impl Fn(Policy, run::Progress<'_>, &AtomicBool) -> kvgate::Result<T> + Sync,
) -> PyResult<Vec<T>> {
    let stop = AtomicBool::new(false);
    let watches: Vec<Watch> = policies.iter().map(|_| Watch::default()).collect();
    let mut control = Control {
        py,
        progress,
        shown: vec![(0, 0); policies.len()],
    };
    let mut raised: Option<PyErr> = None;
    let results: Vec<std::thread::Result<kvgate::Result<T>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = policies
            .iter()
            .zip(&watches)
            .map(|(&policy, watch)| {
                let (run, stop) = (&run, &stop);
                scope.spawn(move || {
                    let mut progress = |done: u64, total: u64| {
                        watch.total.store(total, Ordering::Relaxed);
                        watch.done.store(done, Ordering::Relaxed);
                    };
                    run(policy, &mut progress, stop)
                })
            })
            .collect();
        loop {
            let all_done = py.detach(|| {
                std::thread::sleep(POLL);
                handles
                    .iter()
                    .all(std::thread::ScopedJoinHandle::is_finished)
            });
            if raised.is_none()
                && let Err(error) = control.poll(policies, &watches)
            {
                stop.store(true, Ordering::Relaxed);
                raised = Some(error);
            }
            if all_done {
                break;
            }
        }
        handles.into_iter().map(|handle| handle.join()).collect()
    });
    if let Some(error) = raised {
        return Err(error);
    }
    results
        .into_iter()
        .map(|result| match result {
            Ok(result) => result.map_err(|error| errors::facade(py, error)),
            Err(_) => Err(errors::raise(
                py,
                errors::Kind::Internal,
                "a policy's run panicked",
            )),
        })
        .collect()
}

/// `runs` as the command line's `--json` report, with `extra` top-level fields and each run's series.
fn runs_report(runs: Vec<(RunMetrics, Option<Value>)>, extra: &[(&str, Value)]) -> Value {
    let (metrics, series): (Vec<RunMetrics>, Vec<Option<Value>>) = runs.into_iter().unzip();
    let mut out = report::runs_json(&metrics, extra);
    if let Some(runs) = out["runs"].as_array_mut() {
        for (run, series) in runs.iter_mut().zip(series) {
            if let Some(series) = series {
                run["series"] = series;
            }
        }
    }
    out
}

/// The agents workload under each policy (`kvgate agents --json`); see `kvgate.agents`.
#[pyfunction]
#[pyo3(signature = (options, progress=None))]
pub(crate) fn agents<'py>(
    py: Python<'py>,
    options: &Bound<'py, PyDict>,
    progress: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let run_options = RunOptions::from_dict(options)?;
    let live = match get::<String>(options, "executor")?.as_deref() {
        None | Some("sim") => false,
        Some("reference") => true,
        Some(other) => {
            return Err(errors::facade(
                py,
                invalid("executor", other, "sim or reference"),
            ));
        }
    };
    let series = get::<bool>(options, "series")?.unwrap_or(false);
    let turn_priority: TurnPriority = match get::<String>(options, "turn_priority")? {
        None => TurnPriority::Arrival,
        Some(name) => serde_json::from_value(json!(name)).map_err(|_| {
            errors::facade(py, invalid("--turn-priority", &name, "arrival or progress"))
        })?,
    };
    let agents = setup::AgentsOptions {
        agents: get(options, "agents")?,
        turns: get(options, "turns")?,
        think_s: get(options, "think_s")?,
        turn_priority,
    };
    let facade = |error| errors::facade(py, error);
    let (mut config, pool_pages_set) = load_config(&run_options.run).map_err(facade)?;
    let spec = setup::agents_spec(&mut config, pool_pages_set, &agents, live).map_err(facade)?;
    let policies = policies(&run_options.policies).map_err(facade)?;
    let stores = stores_at_start(&config, &policies).map_err(facade)?;
    let header = AgentsHeader::new(&config, &spec, live, stores);
    let run_one = |policy: Policy, progress: run::Progress<'_>, stop: &AtomicBool| {
        let config = config_of(&config, policy);
        let mut recorder = Recorder {
            stop,
            series: series.then(Series::default),
            turns: Some(spec.turns),
        };
        let (metrics, verify) = if live {
            let (metrics, verify) =
                run::run_agents_live_observed(&config, &spec, policy, progress, &mut recorder)?;
            (metrics, Some(verify.as_secs_f64()))
        } else {
            let metrics =
                run::run_agents_observed(&config, &spec, policy, progress, &mut recorder)?;
            (metrics, None)
        };
        Ok(((metrics, recorder.columns()), verify))
    };
    // A live run's policies run one after another, each alone on the machine, as the command line's do
    // (issue 36); simulated ones side by side, each on its own thread.
    let runs = if live {
        let mut runs = Vec::new();
        for policy in &policies {
            runs.extend(run_policies(
                py,
                std::slice::from_ref(policy),
                progress,
                run_one,
            )?);
        }
        runs
    } else {
        run_policies(py, &policies, progress, run_one)?
    };
    let (runs, verify): (Vec<_>, Vec<_>) = runs.into_iter().unzip();
    let verify: Option<Vec<f64>> = verify.into_iter().collect();
    let verify = verify.filter(|_| config.restore.verify);
    let metrics: Vec<RunMetrics> = runs.iter().map(|(run, _)| run.clone()).collect();
    let mut extra = header.json();
    extra.extend(report::live_json(&metrics, live, verify.as_deref()));
    to_py(py, &runs_report(runs, &extra))
}

/// An `InvalidArgument` for option `name`.
fn invalid(name: &'static str, value: &str, allowed: &'static str) -> kvgate::Error {
    kvgate::Error::InvalidArgument {
        name,
        value: value.to_owned(),
        allowed,
    }
}

/// The options of a replay beyond the shared ones.
struct ReplayOptions {
    limit: Option<usize>,
    time_scale: f64,
    engines: u32,
    router: String,
}

/// A Mooncake trace replayed under each policy (`kvgate replay TRACE --json`); see `kvgate.replay`.
#[pyfunction]
#[pyo3(signature = (trace, options, progress=None))]
#[allow(
    clippy::needless_pass_by_value,
    reason = "pyo3 hands arguments over as owned values"
)]
pub(crate) fn replay<'py>(
    py: Python<'py>,
    trace: std::path::PathBuf,
    options: &Bound<'py, PyDict>,
    progress: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let run_options = RunOptions::from_dict(options)?;
    let replay = ReplayOptions {
        limit: get(options, "limit")?,
        time_scale: get(options, "time_scale")?.unwrap_or(1.0),
        engines: get(options, "engines")?.unwrap_or(1),
        router: get(options, "router")?.unwrap_or_else(|| "cache-aware".to_owned()),
    };
    let series = get::<bool>(options, "series")?.unwrap_or(false);
    let facade = |error| errors::facade(py, error);
    let (config, router, policies) = replay_setup(&run_options, &replay).map_err(facade)?;
    let trace = replay_trace(&trace, replay.limit).map_err(facade)?;
    let max_hit_pct = mooncake::theoretical_max_hit_pct(&trace);
    let later = run::later_turns(&trace);
    if replay.engines > 1 {
        if series {
            let error = kvgate::Error::InvalidArgument {
                name: "series",
                value: format!("with engines {}", replay.engines),
                allowed: "the series of a replay on one engine (engines=1)",
            };
            return Err(errors::facade(py, error));
        }
        let spec = ClusterSpec {
            n_engines: replay.engines,
            router,
        };
        let runs = run_policies(py, &policies, progress, |policy, progress, stop| {
            let config = config_of(&config, policy);
            let mut recorder = Recorder {
                stop,
                series: None,
                turns: None,
            };
            let run = (replay.time_scale, policy, spec);
            cluster::run_cluster_replay_observed(
                &config,
                &trace,
                &later,
                run,
                progress,
                &mut recorder,
            )
        })?;
        check_max_hit(runs.iter().map(|run| &run.total), max_hit_pct).map_err(facade)?;
        return to_py(py, &cluster_report(&runs, &replay, router, max_hit_pct));
    }
    let stores = stores_at_start(&config, &policies).map_err(facade)?;
    let runs = run_policies(py, &policies, progress, |policy, progress, stop| {
        let config = config_of(&config, policy);
        let mut recorder = Recorder {
            stop,
            series: series.then(Series::default),
            turns: None,
        };
        let metrics = run::run_replay_observed(
            &config,
            &trace,
            &later,
            replay.time_scale,
            policy,
            progress,
            &mut recorder,
        )?;
        Ok((metrics, recorder.columns()))
    })?;
    check_max_hit(runs.iter().map(|(run, _)| run), max_hit_pct).map_err(facade)?;
    let metrics: Vec<RunMetrics> = runs.iter().map(|(run, _)| run.clone()).collect();
    let extra = setup::replay_header_json(&metrics, &trace, replay.time_scale, &config, &stores);
    to_py(py, &runs_report(runs, &extra))
}

/// The config, router and policies of a replay, checked as the command line checks them.
fn replay_setup(
    run_options: &RunOptions,
    replay: &ReplayOptions,
) -> kvgate::Result<(EngineConfig, Router, Vec<Policy>)> {
    let (config, _) = load_config(&run_options.run)?;
    run::check_time_scale(replay.time_scale)?;
    let router: Router = replay.router.parse()?;
    cluster::check_engines(replay.engines)?;
    let policies = policies(&run_options.policies)?;
    cluster::check_memory(&config, &policies, replay.engines)?;
    Ok((config, router, policies))
}

/// The trace at `path`, cut to its first `limit` requests (`--limit 0` is refused).
fn replay_trace(path: &std::path::Path, limit: Option<usize>) -> kvgate::Result<Vec<TraceRequest>> {
    if limit == Some(0) {
        return Err(invalid("--limit", "0", "at least 1 request"));
    }
    let mut trace = mooncake::read_trace(path)?;
    if let Some(limit) = limit {
        trace.truncate(limit);
    }
    Ok(trace)
}

/// No run without rejected requests serves more from cache than the trace allows: more is a counting bug.
fn check_max_hit<'a>(
    runs: impl Iterator<Item = &'a RunMetrics>,
    max_hit_pct: f64,
) -> kvgate::Result<()> {
    for run in runs {
        let rejected: u32 = run.rejected_requests.values().sum();
        if rejected == 0 && run.prompt_tokens_from_cache_pct > max_hit_pct + 1e-9 {
            return Err(kvgate::Error::Internal(format!(
                "{} reports {:.3}% from cache, above the trace's maximum {max_hit_pct:.3}%: a counting bug",
                run.policy, run.prompt_tokens_from_cache_pct
            )));
        }
    }
    Ok(())
}

/// A cluster replay's report, as `kvgate replay --engines N --json` prints it.
fn cluster_report(
    runs: &[ClusterRun],
    replay: &ReplayOptions,
    router: Router,
    max_hit_pct: f64,
) -> Value {
    let runs: Vec<Value> = runs.iter().map(report::cluster_json).collect();
    json!({
        "theoretical_max_hit_pct": (max_hit_pct * 1000.0).round() / 1000.0,
        "engines": replay.engines,
        "router": router.name(),
        "time_scale": replay.time_scale,
        "runs": runs,
    })
}

/// A scripted timeline's per-step trace (`kvgate scenario FILE`); see `kvgate.scenario`.
#[pyfunction]
#[pyo3(signature = (file, preset=None))]
#[allow(
    clippy::needless_pass_by_value,
    reason = "pyo3 hands arguments over as owned values"
)]
pub(crate) fn scenario<'py>(
    py: Python<'py>,
    file: std::path::PathBuf,
    preset: Option<String>,
) -> PyResult<Bound<'py, PyAny>> {
    let text = py
        .detach(|| kvgate::scenario::run_file_with_preset(&file, preset.as_deref()))
        .map_err(|error| errors::facade(py, error))?;
    let trace: Value = serde_json::from_str(&text).map_err(|error| {
        errors::raise(
            py,
            errors::Kind::Internal,
            &format!("the scenario trace is not JSON: {error}"),
        )
    })?;
    to_py(py, &trace)
}
