//! The reference model (L3, L4): a small deterministic decoder-only transformer whose weights come from a
//! seed. It computes real keys, values and recurrent state into paged storage through each request's page
//! tables, and real logits; greedy decoding produces real tokens.
//!
//! Cache groups: the full-attention group (one page table shared by every full-attention layer), with local
//! layers a windowed group (one page table shared by every sliding-window or chunked-local layer, null pages
//! before the window), and one recurrent group per state page (each holding its gated linear recurrence
//! layers' state). A page id names a page on each context-parallel rank; each holds its share of a block's
//! tokens. Byte layouts: see `config`.
//!
//! **Batch invariance.** Every value a token produces (its keys and values, its state update, its logits) is
//! computed by one fixed sequence of `f32` operations that depends only on the model's shapes and on the
//! token's position: no reduction spans tokens of a batch, attention visits keys in position order, and the
//! recurrence steps one token at a time. Rayon splits the work across entries, tokens and heads, never inside
//! a reduction. So the bits of every page and logit do not depend on batch composition, on how a prompt is
//! split into chunks, or on the thread count, and restoring pages equals recomputing them bit for bit.
//! The guarantee holds on one machine: `exp` is portable (`kernels::exp`), but the rotary angles use the
//! platform's `sin`, `cos` and `powf` in `f64`.
//!
//! The model knows no engine type: the caller plugs its page tables and page storage in (`ForwardEntry`,
//! `ModelStorage`), as the engine's `ReferenceExecutor` does, and gets `ModelError` back, this crate's own.

mod check;
mod config;
mod error;
mod forward;
mod kernels;
mod weights;

#[cfg(test)]
mod tests;

pub use config::{LocalAttention, ReferenceConfig};
pub use error::ModelError;
use error::ModelResult;

use kv_pool::{PageId, PageStorage};
use rayon::prelude::*;

use weights::Weights;

/// Base of the rotary embedding's frequencies.
const ROPE_BASE: f64 = 10_000.0;

/// The reference model: its validated configuration and its weights.
#[derive(Debug)]
pub struct ReferenceModel {
    config: ReferenceConfig,
    weights: Weights,
    /// Rotary frequencies, one per pair of a head.
    inv_freq: Vec<f64>,
}

/// The storages of the model's cache groups, each with `context_parallel` ranks.
#[derive(Clone, Copy)]
pub struct ModelStorage<'a> {
    /// Full-attention pages, of `ReferenceConfig::bytes_per_page` bytes.
    pub attention: &'a dyn PageStorage,
    /// Local attention pages, of `ReferenceConfig::local_bytes_per_page` bytes; `None` exactly when the model
    /// has no local layer.
    pub local: Option<&'a dyn PageStorage>,
    /// Recurrent state pages of every recurrent group, of `ReferenceConfig::recurrent_bytes_per_page` bytes;
    /// `None` exactly when the model has no recurrent layer.
    pub recurrent: Option<&'a dyn PageStorage>,
}

impl std::fmt::Debug for ModelStorage<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelStorage")
            .field("attention_pages", &self.attention.n_pages())
            .field("local_pages", &self.local.map(|s| s.n_pages()))
            .field("recurrent_pages", &self.recurrent.map(|s| s.n_pages()))
            .finish()
    }
}

/// One request's work in a forward pass: its new tokens at positions `first_pos..first_pos + tokens.len()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForwardEntry<'a> {
    /// The new tokens (at least one), each below the vocabulary size.
    pub tokens: &'a [u32],
    /// Position of the first new token; positions before it are read from the pages, not computed.
    pub first_pos: u32,
    /// Full-attention page table: slot `i` holds block `i`, positions `[i * B, (i + 1) * B)` with
    /// `B = ReferenceConfig::block_tokens`. It covers at least `[0, first_pos + tokens.len())`. The pages of
    /// the new positions are written.
    pub attention_pages: &'a [PageId],
    /// Local page table (models with local layers; empty otherwise), block-indexed as `attention_pages`;
    /// slots wholly before the window of `first_pos` may be the null page.
    pub local_pages: &'a [PageId],
    /// One state page per recurrent group (empty without recurrent layers): each holds its group's state
    /// after `first_pos` tokens (ignored when `first_pos` is 0) and receives the state after the last new
    /// token.
    pub state_pages: &'a [PageId],
    /// Whether to compute the logits of the last new token.
    pub want_logits: bool,
}

/// The logits of an entry's last new token and the greedy choice.
#[derive(Clone, Debug, PartialEq)]
pub struct Logits {
    /// One logit per vocabulary entry.
    pub values: Vec<f32>,
    /// The greedy next token: the largest logit, ties broken by the lowest id.
    pub next_token: u32,
}

impl ReferenceModel {
    /// Validates `config` and generates the weights from its seed. Errors: `ModelError::InvalidConfig`.
    pub fn new(config: ReferenceConfig) -> ModelResult<ReferenceModel> {
        config.validate()?;
        let weights = Weights::generate(&config);
        let half = config.head_dim as usize / 2;
        let inv_freq = (0..half)
            .map(|i| ROPE_BASE.powf(-(2.0 * i as f64) / f64::from(config.head_dim)))
            .collect();
        Ok(ReferenceModel {
            config,
            weights,
            inv_freq,
        })
    }

    /// The model's configuration.
    pub fn config(&self) -> &ReferenceConfig {
        &self.config
    }

    /// Computes `batch`: for each entry, the keys and values of its new tokens into its attention and local
    /// pages, its recurrent states into its state pages, and its last token's logits when asked (`None`
    /// otherwise), in batch order. The batch is checked whole before any page is written; entries must not
    /// write a page another entry reads or writes. Errors: `StoragePageSize`, `StorageRanks`,
    /// `RecurrentStorage`, `LocalStorage`, and per entry `EmptyTokens`, `TokenOutOfVocab`,
    /// `PositionOverflow`, `PageTableTooShort`, `PageOutOfRange`, `NullPage`, `RecurrentPage`, `LocalPages`,
    /// `PageConflict`; while computing, `StatePosition` and `Storage`.
    pub fn forward(
        &self,
        storage: ModelStorage<'_>,
        batch: &[ForwardEntry<'_>],
    ) -> ModelResult<Vec<Option<Logits>>> {
        let spans = check::check_batch(&self.config, storage, batch)?;
        let results: Vec<ModelResult<Option<Logits>>> = batch
            .par_iter()
            .zip(spans.par_iter())
            .enumerate()
            .map(|(entry_idx, (entry, span))| self.run_entry(storage, entry_idx, entry, span))
            .collect();
        results.into_iter().collect()
    }
}
