//! `kvgate.Engine`: one engine driven from Python as a scheduler drives it: built from a config (a dict, a
//! TOML file or TOML text) and a policy, then `submit`, `step`, `cancel`, `shutdown`, request views and
//! metrics. Reports are dicts; every engine error is raised as its kind's exception (`errors`).

use std::sync::{Mutex, MutexGuard};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use serde_json::{Value, json};

use kvgate::limits::{duration_s, show};
use kvgate::workload::mooncake;
use kvgate::{
    Engine, EngineBuilder, EngineConfig, EngineError, FinishedRequest, Policy, RequestId,
    RequestMetrics, RequestSpec, RequestView, StepReport, Timestamp, report,
};

use crate::convert::{from_py, to_py};
use crate::errors;
use crate::kv_events;
use crate::options::{get, table_toml};

/// An engine error on its way to Python.
struct Failed(EngineError);

impl From<Failed> for PyErr {
    fn from(failed: Failed) -> PyErr {
        Python::attach(|py| errors::engine(py, &failed.0))
    }
}

/// A facade error on its way to Python.
struct FacadeFailed(kvgate::Error);

impl From<FacadeFailed> for PyErr {
    fn from(failed: FacadeFailed) -> PyErr {
        Python::attach(|py| errors::facade(py, failed.0))
    }
}

/// The engine behind `kvgate.Engine`. The engine may move between threads but not be shared: a mutex makes
/// the class shareable, as Python requires; calls on one engine take turns.
#[pyclass(name = "Engine", module = "kvgate._kvgate")]
pub(crate) struct PyEngine {
    engine: Mutex<Engine>,
}

impl PyEngine {
    /// The engine, for one call.
    fn engine(&self) -> PyResult<MutexGuard<'_, Engine>> {
        self.engine.lock().map_err(|_| {
            PyErr::from(FacadeFailed(kvgate::Error::Internal(
                "an earlier call on this engine panicked; build a new engine".to_owned(),
            )))
        })
    }
}

/// The config an engine's options name: `config_file`, `config_table` or `toml`, else the default; the
/// environment's override of the restore wait applies, as to a config file on the command line.
fn engine_config(options: &Bound<'_, PyDict>) -> PyResult<EngineConfig> {
    let config = if let Some(path) = get::<std::path::PathBuf>(options, "config_file")? {
        EngineConfig::load(&path)
    } else if let Some(text) = get::<String>(options, "toml")? {
        EngineConfig::from_toml(&text).and_then(EngineConfig::with_env_overrides)
    } else if let Some(table) = options.get_item("config_table")?.filter(|t| !t.is_none()) {
        let table = from_py(&table, "config")?;
        table_toml(&table)
            .and_then(|text| EngineConfig::from_toml(&text))
            .and_then(EngineConfig::with_env_overrides)
    } else {
        EngineConfig::default().with_env_overrides()
    };
    config.map_err(|error| FacadeFailed(error).into())
}

/// `seconds` as an engine timestamp, or the error naming `name`.
fn timestamp(name: &'static str, seconds: f64) -> Result<Timestamp, FacadeFailed> {
    duration_s(seconds, false)
        .map(Timestamp)
        .map_err(|allowed| {
            FacadeFailed(kvgate::Error::InvalidArgument {
                name,
                value: show(seconds),
                allowed,
            })
        })
}

#[pymethods]
impl PyEngine {
    /// Builds the engine from `options` (`config_file`, `config_table` or `toml`; `policy`; `seed`).
    #[new]
    fn new(options: &Bound<'_, PyDict>) -> PyResult<PyEngine> {
        let config = engine_config(options)?;
        let policy = get::<String>(options, "policy")?.unwrap_or_else(|| "reserved".to_owned());
        let policy: Policy = policy.parse().map_err(Failed)?;
        let mut builder = EngineBuilder::new(config).policy(policy);
        if let Some(seed) = get::<u64>(options, "seed")? {
            builder = builder.seed(seed);
        }
        let mut engine = builder.build().map_err(FacadeFailed)?;
        if let Some(capacity) = get::<usize>(options, "kv_events")? {
            engine.enable_kv_events(capacity).map_err(Failed)?;
        }
        Ok(PyEngine {
            engine: Mutex::new(engine),
        })
    }

    /// Submits request `id` with `prompt` (token ids), arriving at `arrival_s` (engine time, default now).
    #[pyo3(signature = (id, prompt, max_output_tokens, arrival_s=None, priority=0, is_later_turn=false))]
    fn submit(
        &self,
        id: u64,
        prompt: Vec<u32>,
        max_output_tokens: u32,
        arrival_s: Option<f64>,
        priority: i32,
        is_later_turn: bool,
    ) -> PyResult<()> {
        let mut engine = self.engine()?;
        let arrival = match arrival_s {
            Some(seconds) => timestamp("arrival_s", seconds)?,
            None => engine.now(),
        };
        let mut spec = RequestSpec::new(id, prompt, max_output_tokens, arrival);
        spec.priority = priority;
        spec.is_later_turn = is_later_turn;
        Ok(engine.submit(spec).map_err(Failed)?)
    }

    /// Submits a Mooncake trace record (`timestamp`, `input_length`, `output_length`, `hash_ids`) as request
    /// `id`, arriving at `arrival_s` (default: the record's timestamp).
    #[pyo3(signature = (id, record, arrival_s=None, is_later_turn=false))]
    fn submit_trace_record(
        &self,
        id: u64,
        record: &Bound<'_, PyAny>,
        arrival_s: Option<f64>,
        is_later_turn: bool,
    ) -> PyResult<()> {
        let line = from_py(record, "record")?.to_string();
        let mut parsed = mooncake::parse_trace(line.as_bytes(), "<record>")
            .map_err(|error| FacadeFailed(error.into()))?;
        let Some(request) = parsed.pop() else {
            return Err(FacadeFailed(kvgate::Error::Internal(
                "a trace record parsed to no request".to_owned(),
            ))
            .into());
        };
        let seconds = arrival_s.unwrap_or(request.timestamp as f64 / 1000.0);
        let arrival = timestamp("arrival_s", seconds)?;
        let output = request.output_length.max(1);
        let mut spec = RequestSpec::new(id, request.prompt(), output, arrival);
        spec.is_later_turn = is_later_turn;
        Ok(self.engine()?.submit(spec).map_err(Failed)?)
    }

    /// Runs one step (the GIL released) and returns its report.
    fn step<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let mut guard = self.engine()?;
        let engine: &mut Engine = &mut guard;
        let report = py.detach(|| engine.step()).map_err(Failed)?;
        to_py(py, &step_json(&report))
    }

    /// Cancels live request `id`.
    fn cancel(&self, id: u64) -> PyResult<()> {
        Ok(self.engine()?.cancel(RequestId(id)).map_err(Failed)?)
    }

    /// Cancels every live request and waits for copies in flight; what it cancelled and drained.
    fn shutdown<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let mut guard = self.engine()?;
        let engine: &mut Engine = &mut guard;
        let report = py.detach(|| engine.shutdown()).map_err(Failed)?;
        let cancelled: Vec<u64> = report.cancelled.iter().map(|id| id.0).collect();
        to_py(
            py,
            &json!({"cancelled": cancelled, "copies_drained": report.copies_drained}),
        )
    }

    /// The view of live request `id`, or `None`.
    fn request<'py>(&self, py: Python<'py>, id: u64) -> PyResult<Bound<'py, PyAny>> {
        match self.engine()?.request(RequestId(id)) {
            Some(view) => to_py(py, &view_json(&view)),
            None => Ok(py.None().into_bound(py)),
        }
    }

    /// The requests finished or cancelled since the last call: id, output tokens, cancelled, metrics.
    fn take_finished<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for done in self.engine()?.take_finished() {
            list.append(to_py(py, &finished_json(&done))?)?;
        }
        Ok(list)
    }

    /// The run's metrics so far, as `kvgate agents --json` reports a run.
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py(py, &report::run_json(&self.engine()?.metrics()))
    }

    /// Metrics of every request finished or cancelled so far, in completion order.
    fn request_metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for request in self.engine()?.request_metrics() {
            list.append(to_py(py, &request_metrics_json(request))?)?;
        }
        Ok(list)
    }

    /// Drops every cached prefix block; refused (a `PressureError`) while requests use pages or imports are
    /// staged, unless `force`, which first preempts what holds them.
    #[pyo3(signature = (force=false))]
    fn reset_prefix_cache(&self, force: bool) -> PyResult<()> {
        let mut engine = self.engine()?;
        let reset = if force {
            engine.force_reset_prefix_cache()
        } else {
            engine.reset_prefix_cache()
        };
        Ok(reset.map_err(Failed)?)
    }

    /// The KV events since the last call, oldest first, as vLLM's (`kv_events`); empty unless enabled.
    fn take_kv_events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let events = self.engine()?.take_kv_events();
        kv_events::event_list(py, &events)
    }

    /// KV events dropped, oldest first, because the log was full.
    #[getter]
    fn kv_events_dropped(&self) -> PyResult<u64> {
        Ok(self.engine()?.kv_events_dropped())
    }

    /// The hashes of every block in the prefix cache now, as `bytes`.
    fn cached_block_hashes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let hashes = self.engine()?.cached_block_hashes();
        kv_events::hash_list(py, &hashes)
    }

    /// Engine time in seconds.
    #[getter]
    fn now_s(&self) -> PyResult<f64> {
        Ok(self.engine()?.now().as_secs_f64())
    }

    /// Whether no request is live.
    fn is_idle(&self) -> PyResult<bool> {
        Ok(self.engine()?.is_idle())
    }

    /// Requests submitted and not yet finished.
    #[getter]
    fn n_live_requests(&self) -> PyResult<usize> {
        Ok(self.engine()?.n_live_requests())
    }

    /// The admission policy.
    #[getter]
    fn policy(&self) -> PyResult<&'static str> {
        Ok(self.engine()?.params().policy.name())
    }
}

fn ids(ids: &[RequestId]) -> Vec<u64> {
    ids.iter().map(|id| id.0).collect()
}

/// A step's report as JSON.
fn step_json(report: &StepReport) -> Value {
    let prefills: Vec<Value> = report
        .prefills
        .iter()
        .map(|(id, tokens)| json!([id.0, tokens]))
        .collect();
    let fallbacks: Vec<Value> = report
        .fallbacks
        .iter()
        .map(|(id, reason)| json!([id.0, reason.name()]))
        .collect();
    json!({
        "now_s": report.now.as_secs_f64(),
        "duration_s": report.duration.as_secs_f64(),
        "prefills": prefills,
        "decodes": ids(&report.decodes),
        "logits_only": ids(&report.logits_only),
        "admitted": ids(&report.admitted),
        "preempted": ids(&report.preempted),
        "reset_preempted": ids(&report.reset_preempted),
        "finished": ids(&report.finished),
        "fallbacks": fallbacks,
        "examined": report.examined,
        "restore_polls": report.restore_polls,
        "free_pages": report.free_pages,
        "credit_pages": report.credit_pages,
        "waiting": report.waiting,
        "running": report.running,
        "idle": report.idle,
    })
}

/// A request's view as JSON (page ids as integers).
fn view_json(view: &RequestView) -> Value {
    let pages = |pages: &[kvgate::PageId]| -> Vec<Value> {
        pages.iter().map(|page| json!(page.0)).collect()
    };
    let windows: Vec<Vec<Value>> = view.window_tables.iter().map(|t| pages(t)).collect();
    json!({
        "phase": view.phase.name(),
        "n_computed": view.n_computed,
        "n_pages": view.n_pages,
        "page_table": pages(&view.page_table),
        "fixed_pages": pages(&view.fixed_pages),
        "window_tables": windows,
        "has_ticket": view.has_ticket,
        "is_waiter": view.is_waiter,
        "n_output": view.n_output,
        "lookups": view.lookups,
        "loading": view.loading,
    })
}

fn finished_json(done: &FinishedRequest) -> Value {
    json!({
        "id": done.id.0,
        "output": done.output,
        "cancelled": done.cancelled,
        "metrics": request_metrics_json(&done.metrics),
    })
}

/// One request's metrics as JSON; times in seconds of engine time.
pub(crate) fn request_metrics_json(request: &RequestMetrics) -> Value {
    json!({
        "id": request.id.map(|id| id.0),
        "prompt_tokens": request.prompt_tokens,
        "prompt_tokens_local_hit": request.prompt_tokens_local_hit,
        "prompt_tokens_restored": request.prompt_tokens_restored,
        "prompt_tokens_recomputed": request.prompt_tokens_recomputed,
        "is_later_turn": request.is_later_turn,
        "restored": request.restored,
        "complete_local_hit": request.complete_local_hit,
        "fallback": request.fallback.map(|reason| reason.name()),
        "capacity_waits": request.capacity_waits,
        "longest_capacity_wait_s": request.longest_capacity_wait_s,
        "preemptions": request.preemptions,
        "preemptions_offloaded": request.preemptions_offloaded,
        "decode_tokens": request.decode_tokens,
        "arrival_s": request.arrival.as_secs_f64(),
        "ttft_s": request.ttft_s(),
        "turn_s": request.turn_s(),
        "cancelled": request.cancelled,
        "rejected": request.rejected.map(|reason| reason.name()),
    })
}
