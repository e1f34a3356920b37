//! The step-time cost model of the simulated executor and its named presets.
//!
//! A step costs a fixed overhead, plus prefill work (per token computed and per pair of (token, context token)
//! attended), plus decode work (per sequence in the batch and per context token read), plus the time the weights
//! take to stream once when anything decodes. Draft work (draft decoding) is the draft head's: a fraction of
//! the full model. Copies cost bytes / bandwidth plus a latency.

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
    /// The draft head's share of the full model's work for a token (its weights, per-sequence work and
    /// context reads): each draft token it proposes costs this fraction of a one-token decode pass, and its
    /// replay of a restored page (H5) this fraction of a prefill of those tokens. From 0 to 1.
    pub draft_head_fraction: f64,
}

impl CostModel {
    /// An 8B-class dense model (Llama-3-8B shape: 32 layers, 8 KV heads of 128, bf16) on one H100 SXM.
    /// Sources: 16 GB of bf16 weights over 3.35 TB/s HBM3 (H100 datasheet) gives ~5 ms per decode pass;
    /// ~16 GFLOP per prefill token at ~40% of 989 TFLOP/s dense bf16 gives ~40 us per token; attention
    /// 4 * 32 layers * 4096 = 0.5 MFLOP per pair gives ~1.3 ns per pair; KV 128 KiB per token read at HBM
    /// bandwidth gives ~40 ns per token; restores over PCIe Gen5 x16 pinned (~50 GB/s measured by common
    /// `cudaMemcpyAsync` benchmarks). Step overhead and per-sequence costs are illustrative. Draft head: an
    /// EAGLE-style head (one decoder layer of the model's shape, Li et al., arXiv:2401.15077) on Llama-3-8B
    /// (Meta's `config.json`: hidden 4096, MLP 14336, 8 KV heads of 128, vocabulary 128 256): the layer's
    /// 0.22B parameters, a 2 x 4096 -> 4096 input projection (0.03B) and the shared output head (0.53B) it
    /// runs for every proposal, 0.78B of the model's 8.0B: 0.097.
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
            draft_head_fraction: 0.097,
        }
    }

    /// A GLM-like large mixture-of-experts model served on two GPUs with tensor parallelism (the seed's
    /// deployment shape: ~32B active parameters per token, multi-token prediction). Illustrative figures chosen
    /// so one decode stream runs at ~20-25 tok/s and eight run at ~140 tok/s aggregate, the order of magnitude
    /// the seed reports (`../shared/seed/pr-description.md`); not calibrated on hardware. Draft head: GLM-4.5's
    /// multi-token-prediction layer (its `config.json`: 92 layers, hidden 5120, 96 query and 8 KV heads of 128,
    /// 8 of 160 routed experts plus a shared one of 3 x 5120 x 1536, vocabulary 151 552,
    /// `num_nextn_predict_layers` 1): one more MoE decoder block (about 0.35B active parameters), its
    /// 2 x 5120 -> 5120 input projection (0.05B) and the shared output head (0.78B): 1.18B against the 32.9B
    /// the same count gives the model a token (its card says 32B active): 0.036.
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
            draft_head_fraction: 0.036,
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

    /// Time of one decode entry reading `context_tokens` and computing `n_tokens` (its pending token and the
    /// draft tokens the full model verifies with it).
    pub fn decode_entry_s(&self, context_tokens: u32, n_tokens: u32) -> f64 {
        f64::from(n_tokens) * self.decode_s_per_seq
            + f64::from(context_tokens) * f64::from(n_tokens) * self.decode_s_per_token_read
    }

    /// Time the draft head takes to propose `depth` draft tokens, one after another, for one decode entry
    /// reading `context_tokens`: `depth` one-token passes at `draft_head_fraction` of the full model's
    /// per-sequence and context-read cost (an upper bound on the reads: the head attends with one layer).
    pub fn draft_entry_s(&self, context_tokens: u32, depth: u32) -> f64 {
        self.draft_head_fraction * f64::from(depth) * self.decode_entry_s(context_tokens, 1)
    }

    /// Time the draft head's weights take to stream for `depth` proposals, once a proposal per step that
    /// drafts (shared by its entries, like `decode_weights_s`).
    pub fn draft_weights_s(&self, depth: u32) -> f64 {
        self.draft_head_fraction * f64::from(depth) * self.decode_weights_s
    }

    /// Time the draft head takes to replay `n_tokens` tokens from position `first_pos` (after a restore whose
    /// checkpoint carried no draft state, H5): its fraction of a prefill of them.
    pub fn draft_replay_s(&self, first_pos: u32, n_tokens: u32) -> f64 {
        self.draft_head_fraction * self.prefill_s(first_pos, n_tokens)
    }

    /// Time to copy `n_tokens` tokens of KV cache from the store into the pool.
    pub fn copy_time(&self, n_tokens: u32) -> Duration {
        let bytes = u64::from(n_tokens).saturating_mul(self.kv_bytes_per_token);
        seconds(self.copy_latency_s + bytes as f64 / self.copy_bytes_per_s)
    }

    /// `Err((field, reason))` unless every figure is a finite number of seconds or bytes, not negative, the
    /// draft head's fraction is from 0 to 1, and the copy bandwidth is positive.
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
        if !(0.0..=1.0).contains(&self.draft_head_fraction) {
            return Err((
                "cost.draft_head_fraction",
                format!(
                    "{} is not a fraction of the model from 0 to 1",
                    self.draft_head_fraction
                ),
            ));
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
