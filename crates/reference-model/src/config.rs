//! `ReferenceConfig`: the reference model's shape (vocabulary, widths, layers per cache group, page width,
//! context-parallel ranks, seed), its validation, and the byte layout of its pages.
//!
//! Cache groups, in order: the full-attention group (every full-attention layer), with local layers a
//! windowed group (every sliding-window or chunked-local layer), then one recurrent group per state page.
//!
//! Blocks and ranks: a page id names one page on each of the `context_parallel` ranks; together they hold a
//! block of `block_tokens = tokens_per_page * context_parallel` tokens. Token `p` lives on rank
//! `p % context_parallel` (as `kv_pool::Geometry` shards it), in slot `(p % block_tokens) / context_parallel`
//! of that rank's page.
//!
//! Attention page (on one rank; the full-attention and the local group alike, each over its own layers):
//! for each of the group's layers in order, the keys of the rank's `tokens_per_page` tokens, then their
//! values; each token's key (or value) is `n_heads * head_dim` little-endian `f32`, heads in order. Keys are
//! stored after the rotary embedding. Positions of a page past the last computed token are zero.
//!
//! Recurrent state page (one per recurrent group and request, and one per checkpoint; the same bytes on every
//! rank): a little-endian `u64` header holding the number of tokens the state covers, then for each of the
//! group's layers in order the `n_heads` state matrices of `head_dim x head_dim` little-endian `f32`
//! (row = key dimension, column = value dimension).

use kv_pool::{CacheGroup, Geometry, GroupKind};

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
const RANKS_MAX: u32 = 64;
const RECURRENT_GROUPS_MAX: u32 = 16;
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
    /// Full-attention layers (at least one): their KV lives in the full-attention group's pages.
    pub n_attention_layers: u32,
    /// Local attention layers (sliding window or chunked local) and their window: their KV lives in a
    /// windowed group of its own. `None`: no local layers.
    pub local: Option<LocalAttention>,
    /// Recurrent (gated linear recurrence) layers of each recurrent group: their state lives in the group's
    /// state page. 0: no recurrent group.
    pub n_recurrent_layers: u32,
    /// Recurrent groups (at least one; none when `n_recurrent_layers` is 0): one state page each per request.
    pub n_recurrent_groups: u32,
    /// Tokens per page on one rank.
    pub tokens_per_page: u32,
    /// Context-parallel ranks the context is sharded over (one page id names a page on each).
    pub context_parallel: u32,
    /// Seed of the weights.
    pub seed: u64,
}

/// The model's local attention layers: how many, and which keys a query sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LocalAttention {
    /// Local layers (at least one).
    pub n_layers: u32,
    /// The local group's kind, which says the keys a query of a local layer attends to:
    /// `GroupKind::SlidingWindow` without retained tail (the query at `p` attends to `[p - window_tokens, p]`)
    /// or `GroupKind::ChunkedLocal` (to its aligned chunk, `[p / chunk_tokens * chunk_tokens, p]`).
    pub window: GroupKind,
}

impl LocalAttention {
    /// Checks the layer count and the window. Errors: `ModelError::InvalidConfig` naming the field.
    fn validate(&self) -> ModelResult<()> {
        let local = self;
        if !(1..=LAYERS_MAX).contains(&local.n_layers) {
            return Err(invalid(
                "local.n_layers",
                format!("{} is not in 1..={LAYERS_MAX}", local.n_layers),
            ));
        }
        let (name, tokens) = match local.window {
            GroupKind::SlidingWindow {
                window_tokens,
                retained_tail_tokens: 0,
            } => ("local.window_tokens", window_tokens),
            GroupKind::ChunkedLocal { chunk_tokens } => ("local.chunk_tokens", chunk_tokens),
            kind => {
                return Err(invalid(
                    "local.window",
                    format!(
                        "{kind} is not a local window; give a sliding window without retained tail or chunked local"
                    ),
                ));
            }
        };
        if !(1..=WINDOW_MAX).contains(&tokens) {
            return Err(invalid(
                name,
                format!("{tokens} is not in 1..={WINDOW_MAX}"),
            ));
        }
        Ok(())
    }
}

/// The first key the query at `pos` attends to in a group of kind `kind`: 0 under full attention, the first
/// of the window's keys under a sliding window, the start of the aligned chunk under chunked local (`pos`
/// itself for kinds that keep no keys, which no attention layer has).
pub(crate) fn first_key(kind: GroupKind, pos: usize) -> usize {
    match kind {
        GroupKind::Full => 0,
        GroupKind::SlidingWindow { window_tokens, .. } => {
            pos.saturating_sub(window_tokens as usize)
        }
        GroupKind::ChunkedLocal { chunk_tokens } => {
            let chunk = chunk_tokens.max(1) as usize;
            pos / chunk * chunk
        }
        GroupKind::Recurrent | GroupKind::Auxiliary { .. } => pos,
    }
}

impl ReferenceConfig {
    /// A model small enough for live runs of tens of requests with 1-4k-token contexts on 2 cores: vocabulary
    /// 512, width 64, 2 heads of 16, two full-attention layers and one recurrent group of one layer, 16
    /// tokens per page (8 KiB attention pages, 2 KiB + 8 bytes state pages), one rank, seed 0.
    pub fn tiny() -> ReferenceConfig {
        ReferenceConfig {
            vocab: 512,
            d_model: 64,
            n_heads: 2,
            head_dim: 16,
            ffn_dim: 128,
            n_attention_layers: 2,
            local: None,
            n_recurrent_layers: 1,
            n_recurrent_groups: 1,
            tokens_per_page: 16,
            context_parallel: 1,
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
                "n_recurrent_groups",
                self.n_recurrent_groups,
                1,
                RECURRENT_GROUPS_MAX,
            ),
            (
                "tokens_per_page",
                self.tokens_per_page,
                1,
                TOKENS_PER_PAGE_MAX,
            ),
            ("context_parallel", self.context_parallel, 1, RANKS_MAX),
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
        if let Some(local) = self.local {
            local.validate()?;
        }
        let block_tokens = u64::from(self.tokens_per_page) * u64::from(self.context_parallel);
        if block_tokens > u64::from(TOKENS_PER_PAGE_MAX) * 16 {
            return Err(invalid(
                "tokens_per_page * context_parallel",
                format!(
                    "{block_tokens} tokens a block, more than {}",
                    u64::from(TOKENS_PER_PAGE_MAX) * 16
                ),
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
    pub(crate) fn inner_dim(&self) -> usize {
        self.n_heads as usize * self.head_dim as usize
    }

    /// Tokens one page id holds on all ranks together: `tokens_per_page * context_parallel`.
    pub fn block_tokens(&self) -> u32 {
        self.tokens_per_page * self.context_parallel
    }

    /// Bytes of one full-attention page (on one rank): keys and values of `tokens_per_page` tokens for every
    /// full-attention layer.
    pub fn bytes_per_page(&self) -> usize {
        self.attention_bytes_per_page(self.n_attention_layers)
    }

    /// Bytes of one local attention page (on one rank), 0 without local layers.
    pub fn local_bytes_per_page(&self) -> usize {
        self.local
            .map_or(0, |local| self.attention_bytes_per_page(local.n_layers))
    }

    /// Bytes of one recurrent state page: the position header and the state of every layer of its group (0
    /// when the model has no recurrent layer).
    pub fn recurrent_bytes_per_page(&self) -> usize {
        if self.n_recurrent_layers == 0 {
            return 0;
        }
        STATE_HEADER_BYTES
            + self.n_recurrent_layers as usize * self.state_floats_per_layer() * F32_BYTES
    }

    /// The largest page of any of the model's groups: what one pool page must hold.
    pub fn max_bytes_per_page(&self) -> usize {
        self.bytes_per_page()
            .max(self.local_bytes_per_page())
            .max(self.recurrent_bytes_per_page())
    }

    /// Recurrent groups, each with one state page per request (0 without recurrent layers).
    pub fn n_state_pages(&self) -> usize {
        if self.n_recurrent_layers == 0 {
            0
        } else {
            self.n_recurrent_groups as usize
        }
    }

    /// Pages (blocks) a context of `n_tokens` tokens spans (the page table length it needs).
    pub fn pages_for_tokens(&self, n_tokens: u32) -> u32 {
        n_tokens.div_ceil(self.block_tokens())
    }

    /// The model's cache groups for a `kv_pool::Geometry`: the full-attention group, the local group (sliding
    /// window without retained tail, or chunked local) with local layers, and one recurrent group per state
    /// page.
    pub fn cache_groups(&self) -> Vec<CacheGroup> {
        let mut groups = vec![CacheGroup {
            kind: GroupKind::Full,
            bytes_per_page: self.bytes_per_page() as u64,
        }];
        if let Some(local) = self.local {
            groups.push(CacheGroup {
                kind: local.window,
                bytes_per_page: self.local_bytes_per_page() as u64,
            });
        }
        groups.extend(std::iter::repeat_n(
            CacheGroup {
                kind: GroupKind::Recurrent,
                bytes_per_page: self.recurrent_bytes_per_page() as u64,
            },
            self.n_state_pages(),
        ));
        groups
    }

    /// The model's `kv_pool::Geometry` for contexts of up to `max_model_len` tokens: its cache groups, page
    /// width and ranks. Errors: what `Geometry::new` refuses (a window longer than `max_model_len`).
    pub fn geometry(&self, max_model_len: u32) -> kv_pool::Result<Geometry> {
        Geometry::new(
            self.cache_groups(),
            self.tokens_per_page,
            self.context_parallel,
            max_model_len,
        )
    }

    /// Bytes of an attention page of `n_layers` layers (on one rank).
    fn attention_bytes_per_page(&self, n_layers: u32) -> usize {
        n_layers as usize * 2 * self.tokens_per_page as usize * self.inner_dim() * F32_BYTES
    }

    /// Floats of one recurrent layer's state: `n_heads` matrices of `head_dim x head_dim`.
    pub(crate) fn state_floats_per_layer(&self) -> usize {
        self.inner_dim() * self.head_dim as usize
    }

    /// Local attention layers (0 without).
    pub(crate) fn n_local_layers(&self) -> u32 {
        self.local.map_or(0, |local| local.n_layers)
    }

    /// Recurrent layers of every group together.
    pub(crate) fn n_recurrent_layers_total(&self) -> u32 {
        self.n_recurrent_layers * self.n_state_pages() as u32
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
        let n_attention = u64::from(self.n_attention_layers) + u64::from(self.n_local_layers());
        let n_recurrent = u64::from(self.n_recurrent_layers) * u64::from(self.n_recurrent_groups);
        2 * vocab * d + n_attention * attention + n_recurrent * recurrent
    }
}

fn invalid(name: &'static str, reason: String) -> ModelError {
    ModelError::InvalidConfig { name, reason }
}
