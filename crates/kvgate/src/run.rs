//! Drivers that run a workload through one engine and return its metrics: the closed-loop agents sessions
//! (each turn submitted a think time after the previous one finished) and the open-loop trace replay (each
//! request submitted at its timestamp).

use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::{
    Engine, Executor, KeyedRequest, Policy, RequestSpec, RunMetrics, SimExecutor, StepReport,
};
use kv_pool::{RequestId, Timestamp};

use crate::EngineBuilder;
use crate::config::EngineConfig;
use crate::error::{Error, Result};
use crate::limits::{TIME_SCALE_MAX, duration_s, show};
use crate::workload::agents::{AgentsSpec, AgentsSpecError};
use crate::workload::mooncake::{TRACE_BLOCK_TOKENS, TraceRequest};

/// Called now and then with (requests finished, requests in the workload).
pub type Progress<'a> = &'a mut dyn FnMut(u64, u64);

/// Watches a run: sees the engine after every step and once at the end (charts, metrics exporters). `E` is
/// the engine's executor: the simulated one, or the reference model of a live run.
pub trait Observer<E: Executor = SimExecutor> {
    /// After each `Engine::step`, with its report.
    fn step(&mut self, engine: &Engine<E>, report: &StepReport);
    /// Once the run has finished.
    fn finish(&mut self, _engine: &Engine<E>) {}
    /// Asked after each step (after `step`): `true` ends the run there with `Error::Interrupted` (the Python
    /// package's Ctrl-C).
    fn stop(&mut self) -> bool {
        false
    }
}

/// An observer that does nothing.
#[derive(Debug, Default)]
pub(crate) struct NoObserver;

impl<E: Executor> Observer<E> for NoObserver {
    fn step(&mut self, _engine: &Engine<E>, _report: &StepReport) {}
}

/// Every observer of the list, in order.
impl<E: Executor> Observer<E> for Vec<&mut dyn Observer<E>> {
    fn step(&mut self, engine: &Engine<E>, report: &StepReport) {
        for observer in self.iter_mut() {
            observer.step(engine, report);
        }
    }

    fn finish(&mut self, engine: &Engine<E>) {
        for observer in self.iter_mut() {
            observer.finish(engine);
        }
    }

    fn stop(&mut self) -> bool {
        self.iter_mut().any(|observer| observer.stop())
    }
}

/// Runs the agents workload under `policy` until every turn of every session has finished.
pub fn run_agents(
    config: &EngineConfig,
    spec: &AgentsSpec,
    policy: Policy,
    progress: Progress<'_>,
) -> Result<RunMetrics> {
    run_agents_observed(config, spec, policy, progress, &mut NoObserver)
}

/// `run_agents`, with `observer` shown every step.
pub fn run_agents_observed(
    config: &EngineConfig,
    spec: &AgentsSpec,
    policy: Policy,
    progress: Progress<'_>,
    observer: &mut dyn Observer,
) -> Result<RunMetrics> {
    spec.validate()?;
    let mut engine = EngineBuilder::new(config.clone()).policy(policy).build()?;
    drive_agents(&mut engine, spec, progress, &mut |engine, report| {
        observer.step(engine, report);
        !observer.stop()
    })?;
    observer.finish(&engine);
    Ok(engine.metrics())
}

/// Runs every turn of every session of `spec` through `engine`, showing each step to `on_step`; `on_step`
/// returning `false` ends the run there with `Error::Interrupted`.
pub(crate) fn drive_agents<E: Executor>(
    engine: &mut Engine<E>,
    spec: &AgentsSpec,
    progress: Progress<'_>,
    on_step: &mut dyn FnMut(&Engine<E>, &StepReport) -> bool,
) -> Result<()> {
    let total = u64::from(spec.n_agents) * u64::from(spec.turns);
    // Each session's context so far: every earlier prompt and response.
    let mut contexts: Vec<Vec<u32>> = vec![Vec::new(); spec.n_agents as usize];
    for agent in 0..spec.n_agents {
        submit_turn(engine, spec, &mut contexts, agent, 0, Timestamp::ZERO)?;
    }
    let mut finished = 0u64;
    while !engine.is_idle() {
        let report = engine.step()?;
        if !on_step(engine, &report) {
            return Err(Error::Interrupted);
        }
        for done in engine.take_finished() {
            finished += 1;
            progress(finished, total);
            let (agent, turn) = agent_turn(spec, done.id);
            // The response, stop token included, is part of the next turn's context.
            contexts[agent as usize].extend_from_slice(&done.output);
            if turn + 1 < spec.turns {
                let think_s = spec.think_s(agent, turn);
                let think = duration_s(think_s, false).map_err(|_| AgentsSpecError::ThinkTime {
                    value: show(think_s),
                })?;
                let arrival = engine.now().after(think);
                submit_turn(engine, spec, &mut contexts, agent, turn + 1, arrival)?;
            }
        }
    }
    Ok(())
}

/// Replays a trace under `policy`: request `i` arrives at its timestamp times `time_scale` (2.0 replays an
/// hour of trace over two simulated hours, at half the load) with its own prompt and output length;
/// requests are handed to the engine as the clock reaches them, so memory stays bounded. Errors: a time scale
/// out of range ([`check_time_scale`]), an arrival past the limit on every time, one flag per request missing.
pub fn run_replay(
    config: &EngineConfig,
    trace: &[TraceRequest],
    later_turn: &[bool],
    time_scale: f64,
    policy: Policy,
    progress: Progress<'_>,
) -> Result<RunMetrics> {
    run_replay_observed(
        config,
        trace,
        later_turn,
        time_scale,
        policy,
        progress,
        &mut NoObserver,
    )
}

/// `run_replay`, with `observer` shown every step.
pub fn run_replay_observed(
    config: &EngineConfig,
    trace: &[TraceRequest],
    later_turn: &[bool],
    time_scale: f64,
    policy: Policy,
    progress: Progress<'_>,
    observer: &mut dyn Observer,
) -> Result<RunMetrics> {
    let arrivals = replay_arrivals(trace, later_turn, time_scale)?;
    let mut engine = EngineBuilder::new(config.clone()).policy(policy).build()?;
    let block_tokens = engine.params().geometry.block_tokens();
    // Building a request (its prompt's tokens and block keys) is most of what a submit costs, and it does not
    // depend on the engine: a second thread builds them ahead, in order, a bounded number at a time, and
    // hands them over in batches: a channel hand-over that wakes the other thread costs microseconds of
    // system time, more than a request's build at scale.
    // A waiting request holds its trace record, not its tokens (`RequestSpec::keyed_from_source`): on one
    // engine at the trace's own rate most of the trace waits at once.
    let (sender, batches) = std::sync::mpsc::sync_channel::<Vec<engine::Result<KeyedRequest>>>(
        REPLAY_BUILD_AHEAD_BATCHES,
    );
    std::thread::scope(|scope| {
        scope.spawn(|| {
            // One prompt buffer for every request: each is generated into it, keyed, and dropped.
            let mut scratch = Vec::new();
            for (first, chunk) in (0..)
                .step_by(REPLAY_BUILD_BATCH)
                .zip(trace.chunks(REPLAY_BUILD_BATCH))
            {
                let batch = chunk
                    .iter()
                    .enumerate()
                    .map(|(offset, request)| {
                        let idx = first + offset;
                        let arrival = arrivals[idx];
                        keyed_trace_request(
                            idx,
                            request,
                            arrival,
                            later_turn[idx],
                            block_tokens,
                            &mut scratch,
                        )
                    })
                    .collect();
                // The run stopped early (an error): nothing is waiting for the rest.
                if sender.send(batch).is_err() {
                    return;
                }
            }
        });
        // `batches` is dropped when this returns, which stops the builder if the run stopped early.
        let requests = BuiltAhead {
            batches,
            batch: Vec::new().into_iter(),
        };
        drive_replay(&mut engine, requests, &arrivals, progress, observer)
    })
}

/// Trace request `idx` as the engine's request `idx`, arriving at `arrival`, keyed for blocks of
/// `block_tokens` and held as its trace record (`RequestSpec::keyed_from_source_in`, generated into `scratch`).
pub(crate) fn keyed_trace_request(
    idx: usize,
    request: &TraceRequest,
    arrival: Timestamp,
    is_later_turn: bool,
    block_tokens: u32,
    scratch: &mut Vec<u32>,
) -> engine::Result<KeyedRequest> {
    let mut spec = RequestSpec::new(
        idx as u64,
        Vec::new(),
        request.output_length.max(1),
        arrival,
    );
    spec.is_later_turn = is_later_turn;
    spec.keyed_from_source_in(block_tokens, Arc::new(request.clone()), scratch)
}

/// Requests a replay's builder puts in one hand-over, and hand-overs it builds ahead of its engine: enough to
/// keep the builder busy while the engine steps and to make hand-overs rare, few enough that they take no
/// memory to speak of.
const REPLAY_BUILD_BATCH: usize = 64;
const REPLAY_BUILD_AHEAD_BATCHES: usize = 2;

/// The replay builder's requests, in order, one batch at a time.
struct BuiltAhead {
    batches: std::sync::mpsc::Receiver<Vec<engine::Result<KeyedRequest>>>,
    batch: std::vec::IntoIter<engine::Result<KeyedRequest>>,
}

impl BuiltAhead {
    /// The next request, waiting for the builder when its batch is used up; `None` once the builder stopped.
    fn next(&mut self) -> Option<engine::Result<KeyedRequest>> {
        loop {
            if let Some(request) = self.batch.next() {
                return Some(request);
            }
            self.batch = self.batches.recv().ok()?.into_iter();
        }
    }
}

/// The replay's step loop: hands every request of `requests` (one per entry of `arrivals`, in order) over at
/// its arrival, and steps until all have finished.
#[allow(
    clippy::needless_pass_by_value,
    reason = "dropping the receiver on return, an error included, is what stops the builder thread"
)]
fn drive_replay(
    engine: &mut Engine,
    mut requests: BuiltAhead,
    arrivals: &[Timestamp],
    progress: Progress<'_>,
    observer: &mut dyn Observer,
) -> Result<RunMetrics> {
    let total = arrivals.len() as u64;
    let mut next = 0usize;
    let mut finished = 0u64;
    #[allow(
        clippy::disallowed_methods,
        reason = "wall time paces the progress report only"
    )]
    let started = Instant::now();
    loop {
        // Hand over every request that has arrived; when the engine has nothing to do, the next one.
        while next < arrivals.len() {
            if arrivals[next] > engine.now() && !engine.is_idle() {
                break;
            }
            let request = requests.next().ok_or_else(|| {
                Error::Internal(format!(
                    "the replay's request builder stopped after {next} of {total} requests"
                ))
            })??;
            submit_keyed_or_reject(engine, request)?;
            next += 1;
        }
        if engine.is_idle() && next == arrivals.len() {
            break;
        }
        let report = match engine.step() {
            Ok(report) => report,
            // K3: the watchdog stops the run; what it did until then is still reported, marked stopped.
            Err(stalled @ engine::Error::Stalled { .. }) => {
                observer.finish(engine);
                return Ok(RunMetrics {
                    stopped: Some(stalled.to_string()),
                    ..engine.metrics()
                });
            }
            Err(error) => return Err(error.into()),
        };
        observer.step(engine, &report);
        if observer.stop() {
            return Err(Error::Interrupted);
        }
        for _ in engine.take_finished() {
            finished += 1;
            if finished.is_multiple_of(64) || started.elapsed() > Duration::from_secs(1) {
                progress(finished, total);
            }
        }
    }
    progress(total, total);
    observer.finish(engine);
    Ok(engine.metrics())
}

/// When each request of `trace` arrives on the engine clock, stretched by `time_scale`, after checking the
/// time scale and that `later_turn` has one flag per request.
pub(crate) fn replay_arrivals(
    trace: &[TraceRequest],
    later_turn: &[bool],
    time_scale: f64,
) -> Result<Vec<Timestamp>> {
    check_time_scale(time_scale)?;
    if trace.len() != later_turn.len() {
        return Err(Error::InvalidArgument {
            name: "later_turn",
            value: format!("{} flags for {} requests", later_turn.len(), trace.len()),
            allowed: "one flag per request of the trace (`later_turns`)",
        });
    }
    trace
        .iter()
        .map(|request| arrival(request.timestamp, time_scale))
        .collect()
}

/// Refuses a replay's time scale unless it is a number above 0, at most [`TIME_SCALE_MAX`].
pub fn check_time_scale(time_scale: f64) -> Result<()> {
    if time_scale.is_finite() && time_scale > 0.0 && time_scale <= TIME_SCALE_MAX {
        return Ok(());
    }
    Err(Error::InvalidArgument {
        name: "--time-scale",
        value: show(time_scale),
        allowed: "a number above 0, at most 1e6",
    })
}

/// When a request stamped `timestamp_ms` arrives on the engine clock, stretched by `time_scale`.
fn arrival(timestamp_ms: u64, time_scale: f64) -> Result<Timestamp> {
    let seconds = timestamp_ms as f64 / 1000.0 * time_scale;
    duration_s(seconds, false)
        .map(Timestamp)
        .map_err(|_| Error::InvalidArgument {
            name: "--time-scale",
            value: format!(
                "{} (a request at {timestamp_ms} ms would arrive at {} s)",
                show(time_scale),
                show(seconds)
            ),
            allowed: "a time scale that keeps every arrival within 1e9 s",
        })
}

/// Which requests of a trace are later turns of a conversation. The trace has no session ids, so a request
/// counts as a later turn when its hash ids include the last full block of an earlier request that had at
/// least two full blocks: it extends that request's own context, not just the prompt prefix (the first
/// block) that almost every request shares. A request's last block may be partial, so it is not compared.
pub fn later_turns(trace: &[TraceRequest]) -> Vec<bool> {
    let mut context_ends = std::collections::HashSet::new();
    trace
        .iter()
        .map(|request| {
            let extends = request.hash_ids.iter().any(|id| context_ends.contains(id));
            let full_blocks = (request.input_length / TRACE_BLOCK_TOKENS) as usize;
            if full_blocks >= 2 {
                context_ends.insert(request.hash_ids[full_blocks - 1]);
            }
            extends
        })
        .collect()
}

fn submit_turn<E: Executor>(
    engine: &mut Engine<E>,
    spec: &AgentsSpec,
    contexts: &mut [Vec<u32>],
    agent: u32,
    turn: u32,
    arrival: Timestamp,
) -> Result<()> {
    let context = &mut contexts[agent as usize];
    context.extend(spec.new_input(agent, turn));
    let id = u64::from(agent) * u64::from(spec.turns) + u64::from(turn);
    let mut request =
        RequestSpec::new(id, context.clone(), spec.response_len(agent, turn), arrival);
    request.is_later_turn = turn > 0;
    request.priority = spec.turn_priority.of(turn);
    // A rejected turn ends its session: the engine counted it (K1), and the later turns would only grow.
    submit_or_reject(engine, request)
}

/// Submits `request`; a request that can never run is rejected alone (K1: the engine counts it and logs
/// why) and the run goes on. Any other error ends the run.
pub(crate) fn submit_or_reject<E: Executor>(
    engine: &mut Engine<E>,
    request: RequestSpec,
) -> Result<()> {
    match engine.submit(request) {
        Ok(()) | Err(engine::Error::Rejected { .. }) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// `submit_or_reject` for a request keyed ahead (`RequestSpec::keyed`).
pub(crate) fn submit_keyed_or_reject(engine: &mut Engine, request: KeyedRequest) -> Result<()> {
    match engine.submit_keyed(request) {
        Ok(()) | Err(engine::Error::Rejected { .. }) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// Tokens each rank's pool holds in the agents run unless told otherwise: 16 384 (1024 pages of 16 tokens),
/// so on one rank eight default sessions of up to ~9 000 tokens outgrow the pool about four times over by
/// their last turns while any one session still fits with its continuation. The page count follows the
/// model's page width (`AGENTS_POOL_TOKENS_PER_RANK / tokens_per_page`): every GPU of a model brings the same
/// memory, so a model on more context-parallel ranks has a pool of as many more tokens.
pub(crate) const AGENTS_POOL_TOKENS_PER_RANK: u32 = 16_384;

/// The seed of an agents run's token streams (`AgentsSpec::seed`): the engine config's seed plus one.
pub fn agents_seed(config: &EngineConfig) -> u64 {
    config.seed.wrapping_add(1)
}

/// Usable pages of the agents run's pool unless told otherwise: `AGENTS_POOL_TOKENS_PER_RANK` tokens of the
/// model's pages.
pub fn agents_pool_pages(config: &EngineConfig) -> u32 {
    (AGENTS_POOL_TOKENS_PER_RANK / config.model.tokens_per_page.max(1)).max(1)
}

/// The (session, turn) an agents request id stands for.
pub fn agent_turn(spec: &AgentsSpec, request: RequestId) -> (u32, u32) {
    (
        (request.0 / u64::from(spec.turns)) as u32,
        (request.0 % u64::from(spec.turns)) as u32,
    )
}

/// A small agents run that outgrows its pool (4 sessions x 4 turns on 256 pages), for tests.
#[cfg(test)]
pub(crate) fn small_agents() -> (EngineConfig, AgentsSpec) {
    let mut config = EngineConfig::default();
    config.pool.pages = 256;
    let spec = AgentsSpec {
        n_agents: 4,
        turns: 4,
        first_prompt_tokens: 1024,
        turn_input_tokens: 512,
        response_tokens: 32,
        think_s: 1.0,
        seed: 7,
        ..AgentsSpec::default()
    };
    (config, spec)
}

mod live;
mod live_model;
mod store;
#[cfg(test)]
mod tests;

pub(crate) use live::{check_live_geometry, live_agents_spec, live_params, live_pool_pages};

pub use live::{LiveReference, reference_model, run_agents_live_observed};
pub use live_model::{
    ChatSpec, MODEL_POOL_PAGES, extend_chat, first_prompt, model_params, run_chats_live,
};
pub use store::StoreAtStart;
pub use store::{describe_stores, store_at_start};
