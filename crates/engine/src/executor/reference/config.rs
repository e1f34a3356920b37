//! `ReferenceConfig`: the reference model's shape (vocabulary, widths, layers, page width, optional sliding
//! window, seed), its validation, and the byte layout of its two kinds of pages.
//!
//! Attention page (one page table shared by every attention layer): for each attention layer in order, the
//! keys of the page's `tokens_per_page` tokens, then their values; each token's key (or value) is
//! `n_heads * head_dim` little-endian `f32`, heads in order. Keys are stored after the rotary embedding.
//! Positions of a page past the last computed token are zero.
//!
//! Recurrent state page (one per request, and one per checkpoint): a little-endian `u64` header holding the
//! number of tokens the state covers, then for each recurrent layer in order the `n_heads` state matrices of
//! `head_dim x head_dim` little-endian `f32` (row = key dimension, column = value dimension).

use kv_pool::{CacheGroup, GroupKind};

use super::error::{ModelError, ModelResult};

/// Bytes of one stored `f32`.
pub(crate) const F32_BYTES: usize = 4;
/// Bytes of the recurrent state page's header (the position the state is at, a little-endian `u64`).
pub(crate) const STATE_HEADER_BYTES: usize = 8;

const VOCAB_MAX: u32 = 1 << 20;
const WIDTH_MAX: u32 = 4096;
const LAYERS_MAX: u32 = 64;
const TOKENS_PER_PAGE_MAX: u32 = 4096;
const WINDOW_MAX: u32 = 1 << 24;
/// Weights beyond this many parameters are refused (4 GiB of `f32`).
const PARAMS_MAX: u64 = 1 << 30;

/// The shape of the reference model. Every field is validated by [`ReferenceConfig::validate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReferenceConfig {
    /// Token ids are `0..vocab`.
    pub vocab: u32,
    /// Width of the residual stream.
    pub d_model: u32,
    /// Heads of every attention and recurrent layer.
    pub n_heads: u32,
    /// Width of one head (even: the rotary embedding rotates pairs).
    pub head_dim: u32,
    /// Hidden width of the MLP after every layer.
    pub ffn_dim: u32,
    /// Attention layers (at least one): their KV lives in the attention group's pages.
    pub n_attention_layers: u32,
    /// Recurrent (gated linear recurrence) layers: their state lives in one state page per request.
    pub n_recurrent_layers: u32,
    /// Tokens per attention page.
    pub tokens_per_page: u32,
    /// Sliding window: the query at position `p` attends to keys `[p - window, p]`, and pages wholly before
    /// that may be the null page. `None` for full attention.
    pub window_tokens: Option<u32>,
    /// Seed of the weights.
    pub seed: u64,
}

impl ReferenceConfig {
    /// A model small enough for live runs of tens of requests with 1-4k-token contexts on 2 cores: vocabulary
    /// 512, width 64, 2 heads of 16, two attention layers and one recurrent layer, 16 tokens per page
    /// (8 KiB attention pages, 2 KiB + 8 bytes state pages), full attention, seed 0.
    pub fn tiny() -> ReferenceConfig {
        ReferenceConfig {
            vocab: 512,
            d_model: 64,
            n_heads: 2,
            head_dim: 16,
            ffn_dim: 128,
            n_attention_layers: 2,
            n_recurrent_layers: 1,
            tokens_per_page: 16,
            window_tokens: None,
            seed: 0,
        }
    }

    /// Checks every field: counts positive (recurrent layers may be zero), head width even, and every size
    /// below its limit. Errors: `ModelError::InvalidConfig` naming the field.
    pub fn validate(&self) -> ModelResult<()> {
        let fields = [
            ("vocab", self.vocab, 1, VOCAB_MAX),
            ("d_model", self.d_model, 1, WIDTH_MAX),
            ("n_heads", self.n_heads, 1, WIDTH_MAX),
            ("head_dim", self.head_dim, 2, WIDTH_MAX),
            ("ffn_dim", self.ffn_dim, 1, 4 * WIDTH_MAX),
            ("n_attention_layers", self.n_attention_layers, 1, LAYERS_MAX),
            ("n_recurrent_layers", self.n_recurrent_layers, 0, LAYERS_MAX),
            (
                "tokens_per_page",
                self.tokens_per_page,
                1,
                TOKENS_PER_PAGE_MAX,
            ),
        ];
        for (name, value, min, max) in fields {
            if !(min..=max).contains(&value) {
                return Err(invalid(name, format!("{value} is not in {min}..={max}")));
            }
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(invalid(
                "head_dim",
                format!(
                    "{} is odd; the rotary embedding needs an even width",
                    self.head_dim
                ),
            ));
        }
        let inner = u64::from(self.n_heads) * u64::from(self.head_dim);
        if inner > u64::from(WIDTH_MAX) {
            return Err(invalid(
                "n_heads * head_dim",
                format!("{inner} is more than {WIDTH_MAX}"),
            ));
        }
        if let Some(window) = self.window_tokens
            && !(1..=WINDOW_MAX).contains(&window)
        {
            return Err(invalid(
                "window_tokens",
                format!("{window} is not in 1..={WINDOW_MAX}"),
            ));
        }
        let n_params = self.n_params();
        if n_params > PARAMS_MAX {
            return Err(invalid(
                "size",
                format!("{n_params} parameters, more than {PARAMS_MAX}; make the model smaller"),
            ));
        }
        Ok(())
    }

    /// Width of one layer's heads together (`n_heads * head_dim`).
    pub fn inner_dim(&self) -> usize {
        self.n_heads as usize * self.head_dim as usize
    }

    /// Bytes of one attention page: keys and values of `tokens_per_page` tokens for every attention layer.
    pub fn bytes_per_page(&self) -> usize {
        self.n_attention_layers as usize
            * 2
            * self.tokens_per_page as usize
            * self.inner_dim()
            * F32_BYTES
    }

    /// Bytes of one recurrent state page: the position header and every recurrent layer's state (0 when the
    /// model has no recurrent layer).
    pub fn recurrent_bytes_per_page(&self) -> usize {
        if self.n_recurrent_layers == 0 {
            return 0;
        }
        STATE_HEADER_BYTES
            + self.n_recurrent_layers as usize * self.state_floats_per_layer() * F32_BYTES
    }

    /// Attention pages a context of `n_tokens` tokens spans (the page table length it needs).
    pub fn pages_for_tokens(&self, n_tokens: u32) -> u32 {
        n_tokens.div_ceil(self.tokens_per_page)
    }

    /// The model's cache groups for a `kv_pool::Geometry`: the attention group (full or sliding window, no
    /// retained tail) and, with recurrent layers, the recurrent group.
    pub fn cache_groups(&self) -> Vec<CacheGroup> {
        let kind = match self.window_tokens {
            None => GroupKind::Full,
            Some(window_tokens) => GroupKind::SlidingWindow {
                window_tokens,
                retained_tail_tokens: 0,
            },
        };
        let mut groups = vec![CacheGroup {
            kind,
            bytes_per_page: self.bytes_per_page() as u64,
        }];
        if self.n_recurrent_layers > 0 {
            groups.push(CacheGroup {
                kind: GroupKind::Recurrent,
                bytes_per_page: self.recurrent_bytes_per_page() as u64,
            });
        }
        groups
    }

    /// Floats of one recurrent layer's state: `n_heads` matrices of `head_dim x head_dim`.
    pub(crate) fn state_floats_per_layer(&self) -> usize {
        self.inner_dim() * self.head_dim as usize
    }

    /// Parameters of the whole model.
    pub(crate) fn n_params(&self) -> u64 {
        let d = u64::from(self.d_model);
        let inner = u64::from(self.n_heads) * u64::from(self.head_dim);
        let ffn = u64::from(self.ffn_dim);
        let vocab = u64::from(self.vocab);
        let mlp = 2 * d * ffn;
        let attention = 4 * d * inner + mlp;
        let recurrent = 5 * d * inner + inner + mlp;
        2 * vocab * d
            + u64::from(self.n_attention_layers) * attention
            + u64::from(self.n_recurrent_layers) * recurrent
    }
}

fn invalid(name: &'static str, reason: String) -> ModelError {
    ModelError::InvalidConfig { name, reason }
}
