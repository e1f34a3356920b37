//! Model presets (H8): a cache geometry, a draft depth and acceptance and a step-time cost preset under one
//! name, for `--preset` and `[model] preset`. Where each number comes from is in `docs/presets.md`; the page
//! sizes are what the layers of each group store per page, the step-time costs are the cost preset's.

use kv_pool::GroupKind;

use super::GroupConfig;

/// A model preset: everything of `[model]` plus the draft depth and acceptance.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ModelPreset {
    /// The name `--preset` takes.
    pub name: &'static str,
    /// One line on what it models.
    pub summary: &'static str,
    /// The step-time cost preset (`CostModel::preset`).
    pub cost: &'static str,
    /// Tokens per page.
    pub tokens_per_page: u32,
    /// Context-parallel ranks.
    pub context_parallel: u32,
    /// Draft (multi-token-prediction) lookahead tokens per decode step.
    pub draft_tokens: u32,
    /// Probability that a draft token is accepted given that the one before it was (0 without drafts).
    pub draft_acceptance: f64,
    /// Cache groups.
    pub groups: Vec<GroupConfig>,
}

/// Bytes of one bf16 value.
const BF16: u64 = 2;
/// Bytes of one f32 value (recurrent states are kept in f32).
const F32: u64 = 4;

/// Names of every model preset.
pub const MODEL_PRESETS: [&str; 3] = ["glm-mla-hybrid", "linear-hybrid", "sliding-window"];

/// The model preset named `name`, if any.
pub(crate) fn model_preset(name: &str) -> Option<ModelPreset> {
    match name {
        "glm-mla-hybrid" => Some(glm_mla_hybrid()),
        "linear-hybrid" => Some(linear_hybrid()),
        "sliding-window" => Some(sliding_window()),
        _ => None,
    }
}

/// The upstream test fixture's shape (`../shared/seed/pr-description.md`: a GLM MoE model with MLA attention
/// and recurrent state, TP2/DCP2, MTP3): one MLA group of 64-token pages, three recurrent groups, two
/// context-parallel ranks, three draft tokens, each accepted with probability 0.85 given the one before (the
/// low end of DeepSeek-V3's 85-90% for its multi-token-prediction module's token, arXiv:2412.19437, section
/// 5.4.3; `docs/presets.md`). MLA keeps one compressed latent of 512 values plus a 64-value
/// rotary key per token and layer (DeepSeek-V2, arXiv:2405.04434, section 2.1), here for 46 layers in bf16; a
/// recurrent group keeps one state page of 16 heads x 128 x 128 f32 values per layer (a gated-delta-rule
/// state, Gated DeltaNet, arXiv:2412.06464) for 4 layers.
fn glm_mla_hybrid() -> ModelPreset {
    let tokens_per_page = 64;
    let mla_bytes_per_token = (512 + 64) * BF16 * 46;
    let state_bytes = 16 * 128 * 128 * F32 * 4;
    let recurrent = || GroupConfig {
        kind: GroupKind::Recurrent,
        bytes_per_page: Some(state_bytes),
    };
    ModelPreset {
        name: "glm-mla-hybrid",
        summary: "MLA attention (64-token pages) + 3 recurrent groups, 2 ranks, 3 draft tokens",
        cost: "glm-like-moe",
        tokens_per_page,
        context_parallel: 2,
        draft_tokens: 3,
        draft_acceptance: 0.85,
        groups: vec![
            GroupConfig {
                kind: GroupKind::Full,
                bytes_per_page: Some(mla_bytes_per_token * u64::from(tokens_per_page)),
            },
            recurrent(),
            recurrent(),
            recurrent(),
        ],
    }
}

/// A linear-attention hybrid with three recurrent layers for each full-attention layer (the 3:1 layout of
/// Qwen3-Next's Gated DeltaNet and gated attention layers): 48 layers, 12 of them full attention with 8 KV
/// heads of 128 values in bf16 (K and V), 36 recurrent with a 16 x 128 x 128 f32 state each.
fn linear_hybrid() -> ModelPreset {
    let tokens_per_page = 16;
    let kv_bytes_per_token = 2 * 8 * 128 * BF16 * 12;
    ModelPreset {
        name: "linear-hybrid",
        summary: "3 recurrent layers per full-attention layer (one full and one recurrent group)",
        cost: "small-8b-gpu",
        tokens_per_page,
        context_parallel: 1,
        draft_tokens: 0,
        draft_acceptance: 0.0,
        groups: vec![
            GroupConfig {
                kind: GroupKind::Full,
                bytes_per_page: Some(kv_bytes_per_token * u64::from(tokens_per_page)),
            },
            GroupConfig {
                kind: GroupKind::Recurrent,
                bytes_per_page: Some(16 * 128 * 128 * F32 * 36),
            },
        ],
    }
}

/// A sliding-window model with five sliding-window layers for each full-attention layer, a 1024-token window
/// (the 5:1 local/global interleave of Gemma 3, arXiv:2503.19786, section 2): 48 layers, 8 full attention and
/// 40 sliding, each with 8 KV heads of 128 values, K and V in bf16.
fn sliding_window() -> ModelPreset {
    let tokens_per_page = 16;
    let kv_bytes_per_token_per_layer = 2 * 8 * 128 * BF16;
    ModelPreset {
        name: "sliding-window",
        summary: "5 sliding-window layers (1024 tokens) per full-attention layer",
        cost: "small-8b-gpu",
        tokens_per_page,
        context_parallel: 1,
        draft_tokens: 0,
        draft_acceptance: 0.0,
        groups: vec![
            GroupConfig {
                kind: GroupKind::Full,
                bytes_per_page: Some(kv_bytes_per_token_per_layer * 8 * u64::from(tokens_per_page)),
            },
            GroupConfig {
                kind: GroupKind::SlidingWindow {
                    window_tokens: 1024,
                    retained_tail_tokens: 0,
                },
                bytes_per_page: Some(
                    kv_bytes_per_token_per_layer * 40 * u64::from(tokens_per_page),
                ),
            },
        ],
    }
}
