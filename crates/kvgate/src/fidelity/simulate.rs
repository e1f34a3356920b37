//! Runs one experiment's workload through the engine, its steps priced by a fit's coefficients, and predicts
//! what inference-perf would have measured per stage.
//!
//! inference-perf's figures, as the measurements define them:
//! - time to first token and end-to-end latency: the engine's, plus the first-token delay of the fit
//!   ([`Coefficients::first_token_s`] and [`Coefficients::first_token_steps`] times the request's own mean
//!   decode step);
//! - time per output token: the time from the first token to the last over `2 * output_len + 1`. Over every
//!   stage of the 16 experiments, (mean E2E - mean TTFT) / mean TPOT is `2 * output_len + 1` within 0.5%, and
//!   the inter-token latencies are bimodal (half near 30 us, half near the step time): each token reaches the
//!   client as two stream chunks and the reported TPOT counts chunks. That is read off the data; the code of
//!   the inference-perf version that ran was not found to confirm it.

use engine::{CostModel, Engine, Executor, RequestSpec, SimExecutor};
use engine::{PageWrite, StepBatch, StepOutput};
use kv_pool::{PageStorage, Timestamp};

use super::experiment::{Experiment, Figures};
use super::server::engine_params;
use super::step_model::{Coefficients, N_STEP, RawCounts, Scales};
use super::workload::{self, Workload};
use super::{FidelityError, Result};

/// Seed of every generated workload (the prompts' token ids and their order).
pub(crate) const WORKLOAD_SEED: u64 = 2026;

/// The simulated executor, recording what each step did.
#[derive(Debug)]
struct CountingExecutor {
    sim: SimExecutor,
    total: RawCounts,
}

impl Executor for CountingExecutor {
    fn name(&self) -> &str {
        self.sim.name()
    }

    fn reads_tokens(&self) -> bool {
        false
    }

    fn execute(
        &mut self,
        batch: &StepBatch<'_>,
        storage: &dyn PageStorage,
    ) -> engine::Result<StepOutput> {
        if !batch.is_empty() {
            let mut raw = RawCounts {
                steps: 1.0,
                ..RawCounts::default()
            };
            for prefill in &batch.prefills {
                let n = f64::from(prefill.n_tokens);
                raw.tokens += n;
                raw.pairs += n * f64::from(prefill.first_pos) + n * (n + 1.0) / 2.0;
            }
            for decode in &batch.decodes {
                raw.tokens += f64::from(decode.n_tokens);
                raw.decodes += f64::from(decode.n_tokens);
                raw.context_read += f64::from(decode.context_tokens) * f64::from(decode.n_tokens);
            }
            self.total = self.total.plus(&raw);
        }
        self.sim.execute(batch, storage)
    }

    fn fill_page(&self, write: &PageWrite, out: &mut [u8]) {
        self.sim.fill_page(write, out);
    }

    fn copy_time(&self, n_tokens: u32) -> std::time::Duration {
        self.sim.copy_time(n_tokens)
    }

    fn recompute_time(&self, n_tokens: u32) -> std::time::Duration {
        self.sim.recompute_time(n_tokens)
    }
}

/// One simulated request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SimRequest {
    /// Its load stage.
    pub stage: usize,
    /// Engine time to its first token, seconds.
    pub ttft_s: f64,
    /// Engine time from its first token to its last, seconds.
    pub decode_s: f64,
    /// Output tokens.
    pub output: u32,
    /// Step-time features summed over the steps of its decode ([`super::step_model::STEP_NAMES`] order).
    pub decode_features: [f64; N_STEP],
}

impl SimRequest {
    /// Its mean decode step, seconds (0 with a single output token).
    pub(crate) fn step_s(&self) -> f64 {
        if self.output > 1 {
            self.decode_s / f64::from(self.output - 1)
        } else {
            0.0
        }
    }

    /// The client's time to first token under `fit`.
    pub(crate) fn ttft(&self, fit: &Coefficients) -> f64 {
        self.ttft_s + fit.first_token_s + fit.first_token_steps * self.step_s()
    }

    /// The client's time per output token (stream chunks, see the module doc).
    pub(crate) fn tpot(&self) -> f64 {
        self.decode_s / (2.0 * f64::from(self.output) + 1.0)
    }

    /// The client's end-to-end latency under `fit`.
    pub(crate) fn e2e(&self, fit: &Coefficients) -> f64 {
        self.ttft(fit) + self.decode_s
    }
}

/// One experiment's simulated run.
#[derive(Clone, Debug, PartialEq)]
pub struct SimRun {
    /// Every request that finished, in finishing order.
    pub requests: Vec<SimRequest>,
    /// Stages.
    pub stages: usize,
    /// Requests the engine rejected or never finished.
    pub unfinished: usize,
    /// Preemptions.
    pub preemptions: u32,
}

/// Simulates `experiment` with the steps priced by `fit`.
pub fn simulate(experiment: &Experiment, fit: &Coefficients) -> Result<SimRun> {
    simulate_priced(experiment, fit.cost_model(experiment))
}

/// Simulates `experiment` with the steps priced by `cost` (a fit's, or a cost preset's own).
pub(crate) fn simulate_priced(experiment: &Experiment, cost: CostModel) -> Result<SimRun> {
    let workload = workload::generate(experiment, WORKLOAD_SEED)?;
    let scales = Scales::of(experiment);
    let params = engine_params(experiment, cost.clone())?;
    let executor = CountingExecutor {
        sim: SimExecutor::new(cost),
        total: RawCounts::default(),
    };
    let mut engine = Engine::builder(params).executor(executor).build()?;
    run(&mut engine, &workload, &scales, experiment.stages.len())
}

fn run(
    engine: &mut Engine<CountingExecutor>,
    workload: &Workload,
    scales: &Scales,
    stages: usize,
) -> Result<SimRun> {
    // Cumulative counts at the end of each step that ran, with its end time.
    let mut times: Vec<f64> = vec![0.0];
    let mut counts: Vec<RawCounts> = vec![RawCounts::default()];
    let mut requests = Vec::with_capacity(workload.arrivals.len());
    let mut next = 0usize;
    let total = workload.arrivals.len();
    loop {
        while next < total {
            let at = Timestamp(std::time::Duration::from_secs_f64(
                workload.arrivals[next].at_s,
            ));
            if at > engine.now() && !engine.is_idle() {
                break;
            }
            let arrival = workload.arrivals[next];
            let spec = RequestSpec::new(
                next as u64,
                workload.prompts[arrival.prompt].clone(),
                workload.output_len,
                at,
            );
            match engine.submit(spec) {
                Ok(()) | Err(engine::Error::Rejected { .. }) => {}
                Err(error) => return Err(error.into()),
            }
            next += 1;
        }
        if engine.is_idle() && next == total {
            break;
        }
        let before = engine.executor().total.steps;
        let report = engine.step()?;
        if engine.executor().total.steps > before {
            times.push(report.now.0.as_secs_f64());
            counts.push(engine.executor().total);
        }
        for done in engine.take_finished() {
            if done.cancelled {
                continue;
            }
            let m = &done.metrics;
            let (Some(first), Some(end)) = (m.first_token, m.finished) else {
                continue;
            };
            let arrival = workload.arrivals[done.id.0 as usize];
            let first_s = first.0.as_secs_f64();
            let end_s = end.0.as_secs_f64();
            let at = |t: f64| counts[times.partition_point(|&x| x <= t).saturating_sub(1)];
            let span = at(end_s).minus(&at(first_s));
            requests.push(SimRequest {
                stage: arrival.stage,
                ttft_s: first_s - arrival.at_s,
                decode_s: end_s - first_s,
                output: m.decode_tokens.max(1),
                decode_features: scales.features(&span),
            });
        }
    }
    let metrics = engine.metrics();
    Ok(SimRun {
        unfinished: total.saturating_sub(requests.len()),
        requests,
        stages,
        preemptions: metrics.preemptions,
    })
}

/// numpy's default percentile (linear interpolation between closest ranks) of sorted `values`.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = p / 100.0 * (sorted.len() - 1) as f64;
    let low = rank.floor() as usize;
    let high = rank.ceil() as usize;
    sorted[low] + (sorted[high] - sorted[low]) * (rank - low as f64)
}

fn summary(mut values: Vec<f64>) -> [f64; 3] {
    values.sort_by(f64::total_cmp);
    let mean = values.iter().sum::<f64>() / values.len().max(1) as f64;
    [mean, percentile(&values, 90.0), percentile(&values, 99.0)]
}

impl SimRun {
    /// The predicted nine figures of each stage under `fit` (its first-token delay).
    pub(crate) fn figures(&self, fit: &Coefficients) -> Result<Vec<Figures>> {
        (0..self.stages)
            .map(|stage| {
                let of: Vec<&SimRequest> =
                    self.requests.iter().filter(|r| r.stage == stage).collect();
                if of.is_empty() {
                    return Err(FidelityError::Invalid {
                        path: format!("stage {stage}"),
                        message: "no simulated request of this stage finished; check the workload"
                            .to_owned(),
                    });
                }
                let [a, b, c] = summary(of.iter().map(|r| r.ttft(fit)).collect());
                let [d, e, f] = summary(of.iter().map(|r| r.tpot()).collect());
                let [g, h, i] = summary(of.iter().map(|r| r.e2e(fit)).collect());
                Ok([a, b, c, d, e, f, g, h, i])
            })
            .collect()
    }

    /// The requests of `stage`.
    pub(crate) fn of_stage(&self, stage: usize) -> impl Iterator<Item = &SimRequest> {
        self.requests.iter().filter(move |r| r.stage == stage)
    }
}
