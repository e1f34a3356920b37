//! The calibrated step-time model: a step's time as a function of what its batch does, in terms of the
//! model's FLOPs and bytes under tensor parallelism and the GPU's peak compute and memory bandwidth, with
//! coefficients fitted on measured runs and kept in a TOML file (`--cost-model FILE`).
//!
//! ```text
//! step = overhead_s                                    every step that schedules anything
//!      + weights   * weight bytes per GPU / bandwidth   (the weights stream once per step)
//!      + allreduce_s * 2 * layers * (tp - 1)            (two all-reduces a layer, each waiting on tp - 1 peers)
//!      + flops     * tokens * 2 * active params / tp / peak FLOP/s   (prefill and decode tokens)
//!      + attention * prefill pairs * 4 * layers * heads * head_dim / tp / peak FLOP/s
//!      + kv_read   * context tokens decoded * KV bytes per token per GPU / bandwidth
//!      + per_seq_s * sequences decoded
//! ```
//!
//! A coefficient of 1 on `weights`, `flops`, `attention` or `kv_read` means the work runs at the datasheet's
//! peak. The model maps exactly onto the engine's [`CostModel`] (no engine change): see
//! [`Coefficients::cost_model`]. The client-side figures add a first-token delay, `first_token_s +
//! first_token_steps * the request's own decode step time` (the API server's tokenization, the engine core's
//! output processing one step behind, the stream's delivery), to time to first token and end-to-end latency.

use std::collections::BTreeMap;
use std::path::Path;

use engine::CostModel;
use serde::{Deserialize, Serialize};

use super::experiment::{Experiment, Gpu, ModelShape};
use super::{FidelityError, Result};

/// Number of step-time coefficients ([`Coefficients::step`] order).
pub(crate) const N_STEP: usize = 7;

/// The step-time coefficients' names, in order, as the file spells them.
pub(crate) const STEP_NAMES: [&str; N_STEP] = [
    "overhead_s",
    "weights",
    "allreduce_s",
    "flops",
    "attention",
    "kv_read",
    "per_seq_s",
];

/// The largest value any coefficient may take: a multiplier of 1000 on a datasheet peak, or 1000 s of fixed
/// time, is no fit of a real server.
pub(crate) const COEFFICIENT_MAX: f64 = 1000.0;

/// One fit's coefficients.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Coefficients {
    /// Seconds of every step.
    pub overhead_s: f64,
    /// Multiplier of the weights' streaming time.
    pub weights: f64,
    /// Seconds per all-reduce per peer GPU it waits on (tensor parallel only): a ring all-reduce over `tp`
    /// GPUs passes `2 (tp - 1)` messages one after another, vLLM's one-shot kernel reads `tp - 1` peers'
    /// buffers; at decode's message sizes each costs a latency, not bandwidth.
    pub allreduce_s: f64,
    /// Multiplier of the dense FLOPs' time at peak.
    pub flops: f64,
    /// Multiplier of the prefill attention FLOPs' time at peak.
    pub attention: f64,
    /// Multiplier of the KV cache's read time at peak bandwidth.
    pub kv_read: f64,
    /// Seconds per decoded sequence.
    pub per_seq_s: f64,
    /// Seconds added to time to first token and end-to-end latency.
    pub first_token_s: f64,
    /// Decode steps of the request's own added to time to first token and end-to-end latency.
    pub first_token_steps: f64,
    /// The experiments this fit was made on (empty for a prior).
    #[serde(default)]
    pub fitted_on: Vec<String>,
}

impl Coefficients {
    /// The physical prior the fit starts from: datasheet peaks reached at 80% (bandwidth) and 50% (compute),
    /// 3 ms of step overhead, 20 us per all-reduce peer and per sequence, a first token one step late.
    pub(crate) fn prior() -> Coefficients {
        Coefficients {
            overhead_s: 0.003,
            weights: 1.25,
            allreduce_s: 20e-6,
            flops: 2.0,
            attention: 2.0,
            kv_read: 1.25,
            per_seq_s: 20e-6,
            first_token_s: 0.005,
            first_token_steps: 1.0,
            fitted_on: Vec::new(),
        }
    }

    /// The least each step coefficient may be fitted to ([`STEP_NAMES`] order): 0 on every one today.
    /// `bounded_ridge` takes other bounds: 1 on `weights` would say that no GPU streams weights that do not
    /// fit in its caches faster than its datasheet's bandwidth (tried in issue 31's second pass, see
    /// docs/benchmarks.md). Not 1 on `kv_read` (sequences behind one shared prefix read the same blocks in
    /// one kernel, and the L2 cache can serve them above HBM's bandwidth) nor on `flops` (the step model adds
    /// compute to memory time where the GPU overlaps them, so a multiplier below 1 stands for the overlap).
    pub(crate) const LOWER: [f64; N_STEP] = [0.0; N_STEP];

    /// The step coefficients in [`STEP_NAMES`] order.
    pub(crate) fn step(&self) -> [f64; N_STEP] {
        [
            self.overhead_s,
            self.weights,
            self.allreduce_s,
            self.flops,
            self.attention,
            self.kv_read,
            self.per_seq_s,
        ]
    }

    /// These coefficients with the step ones replaced by `step` ([`STEP_NAMES`] order).
    pub(crate) fn with_step(&self, step: [f64; N_STEP]) -> Coefficients {
        let [
            overhead_s,
            weights,
            allreduce_s,
            flops,
            attention,
            kv_read,
            per_seq_s,
        ] = step;
        Coefficients {
            overhead_s,
            weights,
            allreduce_s,
            flops,
            attention,
            kv_read,
            per_seq_s,
            ..self.clone()
        }
    }

    /// `Err` naming the first field (as `fits.NAME.FIELD`) that is not a finite number from 0 to
    /// [`COEFFICIENT_MAX`].
    pub(crate) fn check(&self, fit: &str) -> std::result::Result<(), (String, String)> {
        let step = self.step();
        let frontend = [
            ("first_token_s", self.first_token_s),
            ("first_token_steps", self.first_token_steps),
        ];
        let named = STEP_NAMES.iter().copied().zip(step).chain(frontend);
        for (name, value) in named {
            if !(value.is_finite() && (0.0..=COEFFICIENT_MAX).contains(&value)) {
                return Err((
                    format!("fits.{fit}.{name}"),
                    format!(
                        "{} is not a number from 0 to {COEFFICIENT_MAX}",
                        crate::limits::show(value)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The engine's cost model for `experiment`'s model, GPU and tensor parallelism.
    pub(crate) fn cost_model(&self, experiment: &Experiment) -> CostModel {
        self.cost_model_for(&Scales::of(experiment))
    }

    /// The engine's cost model for a model, GPU and tensor parallelism given by their `scales`.
    pub(crate) fn cost_model_for(&self, scales: &Scales) -> CostModel {
        CostModel {
            name: "calibrated",
            step_overhead_s: self.overhead_s
                + self.weights * scales.weights_s
                + self.allreduce_s * scales.allreduces,
            prefill_s_per_token: self.flops * scales.flops_s_per_token,
            prefill_s_per_pair: self.attention * scales.attention_s_per_pair,
            decode_weights_s: 0.0,
            decode_s_per_seq: self.per_seq_s + self.flops * scales.flops_s_per_token,
            decode_s_per_token_read: self.kv_read * scales.kv_s_per_token,
            kv_bytes_per_token: scales.kv_bytes_per_token as u64,
            // Restores never happen in these runs (no store takes part); the default preset's PCIe figures.
            ..CostModel::small_8b_gpu()
        }
    }
}

/// The physical times one unit of each batch quantity takes at the datasheet's peaks, for one experiment.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Scales {
    /// Seconds to stream one GPU's share of the weights.
    pub weights_s: f64,
    /// All-reduce peer waits per step: two all-reduces a layer, each over `tp - 1` peers (0 without tensor
    /// parallelism).
    pub allreduces: f64,
    /// Seconds of dense FLOPs per token computed.
    pub flops_s_per_token: f64,
    /// Seconds of attention FLOPs per prefill pair.
    pub attention_s_per_pair: f64,
    /// Seconds to read one context token's KV cache.
    pub kv_s_per_token: f64,
    /// KV bytes of one token on one GPU.
    pub kv_bytes_per_token: f64,
}

impl Scales {
    /// The scales of `experiment`.
    pub(crate) fn of(experiment: &Experiment) -> Scales {
        Scales::for_shape(
            &experiment.model,
            &experiment.gpu,
            experiment.server.tensor_parallel,
        )
    }

    /// The scales of `model` on `tensor_parallel` GPUs of kind `gpu`.
    pub(crate) fn for_shape(model: &ModelShape, gpu: &Gpu, tensor_parallel: u32) -> Scales {
        let tp = f64::from(tensor_parallel.max(1));
        let kv_bytes = model.kv_bytes_per_token_per_gpu(tensor_parallel);
        Scales {
            weights_s: model.params() * 2.0 / tp / gpu.bandwidth,
            allreduces: 2.0 * f64::from(model.layers) * (tp - 1.0),
            flops_s_per_token: 2.0 * model.active_params() / tp / gpu.peak_flops,
            attention_s_per_pair: model.attention_flops_per_pair() / tp / gpu.peak_flops,
            kv_s_per_token: kv_bytes / gpu.bandwidth,
            kv_bytes_per_token: kv_bytes,
        }
    }

    /// The step-time features of a span of steps from its raw counts: (steps, tokens computed, prefill
    /// pairs, context tokens decoded, sequences decoded), in [`STEP_NAMES`] order.
    pub(crate) fn features(&self, raw: &RawCounts) -> [f64; N_STEP] {
        [
            raw.steps,
            raw.steps * self.weights_s,
            raw.steps * self.allreduces,
            raw.tokens * self.flops_s_per_token,
            raw.pairs * self.attention_s_per_pair,
            raw.context_read * self.kv_s_per_token,
            raw.decodes,
        ]
    }
}

/// What a span of steps did, summed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct RawCounts {
    /// Steps.
    pub steps: f64,
    /// Tokens computed (prefill chunks and decodes).
    pub tokens: f64,
    /// Prefill (query, context) pairs.
    pub pairs: f64,
    /// Context tokens read by decodes.
    pub context_read: f64,
    /// Sequences decoded.
    pub decodes: f64,
}

impl RawCounts {
    /// `self - earlier`.
    pub(crate) fn minus(&self, earlier: &RawCounts) -> RawCounts {
        RawCounts {
            steps: self.steps - earlier.steps,
            tokens: self.tokens - earlier.tokens,
            pairs: self.pairs - earlier.pairs,
            context_read: self.context_read - earlier.context_read,
            decodes: self.decodes - earlier.decodes,
        }
    }

    /// `self + other`.
    pub(crate) fn plus(&self, other: &RawCounts) -> RawCounts {
        RawCounts {
            steps: self.steps + other.steps,
            tokens: self.tokens + other.tokens,
            pairs: self.pairs + other.pairs,
            context_read: self.context_read + other.context_read,
            decodes: self.decodes + other.decodes,
        }
    }
}

/// The coefficient file: every fit a calibration made, by name (`all`, `without-profile-P`,
/// `without-model-M`), and the command that made them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostModelFile {
    /// The command that wrote the file.
    pub fitted_by: String,
    /// The fits.
    pub fits: BTreeMap<String, Coefficients>,
}

/// The name of the fit on every experiment that is not overloaded.
pub(crate) const FIT_ALL: &str = "all";

/// The name of the fit that left profile `profile` out.
pub(crate) fn without_profile(profile: &str) -> String {
    format!("without-profile-{profile}")
}

/// The name of the fit that left model `model` out.
pub(crate) fn without_model(model: &str) -> String {
    format!("without-model-{model}")
}

/// The committed fit, made by the command in its `fitted_by`.
pub(crate) const COMMITTED: &str = include_str!("h100-vllm.toml");

impl CostModelFile {
    /// Parses and checks `text` read from `path`. Errors name the file and the field, and say what to do.
    pub(crate) fn parse(text: &str, path: &str) -> Result<CostModelFile> {
        let file: CostModelFile = toml::from_str(text).map_err(|e| FidelityError::CostModel {
            path: path.to_owned(),
            field: String::new(),
            message: format!(
                "{}; write the file as `kvgate calibrate` does",
                e.to_string().trim_end()
            ),
        })?;
        if !file.fits.contains_key(FIT_ALL) {
            return Err(FidelityError::CostModel {
                path: path.to_owned(),
                field: format!("fits.{FIT_ALL}"),
                message: "is missing; every file needs the fit on all experiments".to_owned(),
            });
        }
        for (name, fit) in &file.fits {
            fit.check(name)
                .map_err(|(field, message)| FidelityError::CostModel {
                    path: path.to_owned(),
                    field,
                    message: format!(
                        "{message}; refit with `kvgate calibrate` or correct the value"
                    ),
                })?;
        }
        Ok(file)
    }

    /// Reads and checks the file at `path`.
    pub(crate) fn load(path: &Path) -> Result<CostModelFile> {
        let text = std::fs::read_to_string(path).map_err(|source| FidelityError::Read {
            path: path.display().to_string(),
            source,
        })?;
        CostModelFile::parse(&text, &path.display().to_string())
    }

    /// The committed fit.
    pub(crate) fn committed() -> Result<CostModelFile> {
        CostModelFile::parse(COMMITTED, "crates/kvgate/src/fidelity/h100-vllm.toml")
    }

    /// The file as TOML.
    pub(crate) fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_default()
    }

    /// The fit named `name`, else the fit on all experiments.
    pub(crate) fn fit_or_all(&self, name: &str) -> Option<&Coefficients> {
        self.fits.get(name).or_else(|| self.fits.get(FIT_ALL))
    }
}
