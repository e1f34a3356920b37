//! The step-time cost model of the simulated executor and its named presets.
//!
//! A step costs a fixed overhead, plus prefill work (per token computed and per pair of (token, context token)
//! attended), plus decode work (per sequence in the batch and per context token read), plus the time the weights
//! take to stream once when anything decodes. Copies cost bytes / bandwidth plus a latency.

use std::time::Duration;

/// Parameters of the step-time model. All figures are seconds or bytes per second.
#[derive(Clone, Debug, PartialEq)]
pub struct CostModel {
    /// Name of the preset the figures come from.
    pub name: &'static str,
    /// Fixed cost of every step that schedules anything (scheduler, launch, sampling).
    pub step_overhead_s: f64,
    /// Prefill cost per token computed (the dense and expert matmuls).
    pub prefill_s_per_token: f64,
    /// Prefill attention cost per (query token, context token) pair.
    pub prefill_s_per_pair: f64,
    /// Cost of one decode pass over the weights, paid once per step that decodes (memory bound).
    pub decode_weights_s: f64,
    /// Decode cost per sequence in the batch (its share of the matmuls and sampling).
    pub decode_s_per_seq: f64,
    /// Decode cost per context token read from the KV cache.
    pub decode_s_per_token_read: f64,
    /// KV-cache bytes of one token over all layers (used for copy times).
    pub kv_bytes_per_token: u64,
    /// Host-to-device copy bandwidth for restores.
    pub copy_bytes_per_s: f64,
    /// Fixed latency of one restore copy.
    pub copy_latency_s: f64,
}

impl CostModel {
    /// An 8B-class dense model (Llama-3-8B shape: 32 layers, 8 KV heads of 128, bf16) on one H100 SXM.
    /// Sources: 16 GB of bf16 weights over 3.35 TB/s HBM3 (H100 datasheet) gives ~5 ms per decode pass;
    /// ~16 GFLOP per prefill token at ~40% of 989 TFLOP/s dense bf16 gives ~40 us per token; attention
    /// 4 * 32 layers * 4096 = 0.5 MFLOP per pair gives ~1.3 ns per pair; KV 128 KiB per token read at HBM
    /// bandwidth gives ~40 ns per token; restores over PCIe Gen5 x16 pinned (~50 GB/s measured by common
    /// `cudaMemcpyAsync` benchmarks). Step overhead and per-sequence costs are illustrative.
    pub fn small_8b_gpu() -> CostModel {
        CostModel {
            name: "small-8b-gpu",
            step_overhead_s: 0.002,
            prefill_s_per_token: 40e-6,
            prefill_s_per_pair: 1.3e-9,
            decode_weights_s: 0.005,
            decode_s_per_seq: 50e-6,
            decode_s_per_token_read: 40e-9,
            kv_bytes_per_token: 128 * 1024,
            copy_bytes_per_s: 50e9,
            copy_latency_s: 50e-6,
        }
    }

    /// A GLM-like large mixture-of-experts model served on two GPUs with tensor parallelism (the seed's
    /// deployment shape: ~32B active parameters per token, multi-token prediction). Illustrative figures chosen
    /// so one decode stream runs at ~20-25 tok/s and eight run at ~140 tok/s aggregate, the order of magnitude
    /// the seed reports (`../shared/seed/pr-description.md`); not calibrated on hardware.
    pub fn glm_like_moe() -> CostModel {
        CostModel {
            name: "glm-like-moe",
            step_overhead_s: 0.004,
            prefill_s_per_token: 120e-6,
            prefill_s_per_pair: 4e-9,
            decode_weights_s: 0.035,
            decode_s_per_seq: 1.5e-3,
            decode_s_per_token_read: 60e-9,
            kv_bytes_per_token: 160 * 1024,
            copy_bytes_per_s: 25e9,
            copy_latency_s: 100e-6,
        }
    }

    /// The preset named `name` (`small-8b-gpu` or `glm-like-moe`).
    pub fn preset(name: &str) -> Option<CostModel> {
        match name {
            "small-8b-gpu" => Some(CostModel::small_8b_gpu()),
            "glm-like-moe" => Some(CostModel::glm_like_moe()),
            _ => None,
        }
    }

    /// Names of every preset.
    pub const PRESETS: [&'static str; 2] = ["small-8b-gpu", "glm-like-moe"];

    /// Time of a prefill chunk of `n_tokens` tokens whose first token sits at position `first_pos`.
    pub fn prefill_s(&self, first_pos: u32, n_tokens: u32) -> f64 {
        let n = f64::from(n_tokens);
        let pairs = n * f64::from(first_pos) + n * (n + 1.0) / 2.0;
        n * self.prefill_s_per_token + pairs * self.prefill_s_per_pair
    }

    /// Time of one decode entry reading `context_tokens` and producing `n_tokens` (1 + draft tokens).
    pub fn decode_entry_s(&self, context_tokens: u32, n_tokens: u32) -> f64 {
        f64::from(n_tokens) * self.decode_s_per_seq
            + f64::from(context_tokens) * f64::from(n_tokens) * self.decode_s_per_token_read
    }

    /// Time to copy `n_tokens` tokens of KV cache from the store into the pool.
    pub fn copy_time(&self, n_tokens: u32) -> Duration {
        let bytes = u64::from(n_tokens).saturating_mul(self.kv_bytes_per_token);
        seconds(self.copy_latency_s + bytes as f64 / self.copy_bytes_per_s)
    }

    /// `Err((field, reason))` unless every figure is a finite number of seconds or bytes, not negative, and
    /// the copy bandwidth is positive.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        let figures = [
            ("cost.step_overhead_s", self.step_overhead_s),
            ("cost.prefill_s_per_token", self.prefill_s_per_token),
            ("cost.prefill_s_per_pair", self.prefill_s_per_pair),
            ("cost.decode_weights_s", self.decode_weights_s),
            ("cost.decode_s_per_seq", self.decode_s_per_seq),
            ("cost.decode_s_per_token_read", self.decode_s_per_token_read),
            ("cost.copy_bytes_per_s", self.copy_bytes_per_s),
            ("cost.copy_latency_s", self.copy_latency_s),
        ];
        for (field, value) in figures {
            if !(value.is_finite() && value >= 0.0) {
                return Err((field, format!("{value} is not a finite number from 0 up")));
            }
        }
        if self.copy_bytes_per_s <= 0.0 {
            return Err((
                "cost.copy_bytes_per_s",
                "copies need a positive bandwidth".to_owned(),
            ));
        }
        Ok(())
    }
}

/// `s` seconds as a `Duration`, saturating: a modeled time too long for a `Duration` (or not a number, from
/// a cost model nobody checked) is the longest one, never a panic.
pub(crate) fn seconds(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(if s > 0.0 {
        Duration::MAX
    } else {
        Duration::ZERO
    })
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel::small_8b_gpu()
    }
}
