//! The reference model (L3, L4): a small deterministic decoder-only transformer whose weights come from a
//! seed. It computes real keys, values and recurrent state into paged storage through each request's page
//! tables, and real logits; greedy decoding produces real tokens.
//!
//! Two cache groups: the attention group (one page table shared by every attention layer, full or sliding
//! window) and, with recurrent layers, the recurrent group (one state page per request holding every gated
//! linear recurrence layer's state). Byte layouts: see `config`. Only rank 0 of a storage is used.
//!
//! **Batch invariance.** Every value a token produces (its keys and values, its state update, its logits) is
//! computed by one fixed sequence of `f32` operations that depends only on the model's shapes and on the
//! token's position: no reduction spans tokens of a batch, attention visits keys in position order, and the
//! recurrence steps one token at a time. Rayon splits the work across entries, tokens and heads, never inside
//! a reduction. So the bits of every page and logit do not depend on batch composition, on how a prompt is
//! split into chunks, or on the thread count, and restoring pages equals recomputing them bit for bit.
//! The guarantee holds on one machine: `exp` is portable (`kernels::exp`), but the rotary angles use the
//! platform's `sin`, `cos` and `powf` in `f64`.

mod check;
mod config;
mod error;
mod forward;
mod kernels;
mod weights;

#[cfg(test)]
mod tests;

pub use config::ReferenceConfig;
pub use error::{ModelError, ModelResult};

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

/// The storages of the model's cache groups (rank 0 of each is used).
#[derive(Clone, Copy)]
pub struct ModelStorage<'a> {
    /// Attention pages, of `ReferenceConfig::bytes_per_page` bytes.
    pub attention: &'a dyn PageStorage,
    /// Recurrent state pages, of `ReferenceConfig::recurrent_bytes_per_page` bytes; `None` exactly when
    /// the model has no recurrent layer.
    pub recurrent: Option<&'a dyn PageStorage>,
}

impl std::fmt::Debug for ModelStorage<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelStorage")
            .field("attention_pages", &self.attention.n_pages())
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
    /// Attention page table: slot `i` holds positions `[i * tokens_per_page, (i + 1) * tokens_per_page)`.
    /// It covers at least `[0, first_pos + tokens.len())`; with a sliding window, slots wholly before
    /// `first_pos - window` may be the null page. The pages of the new positions are written.
    pub attention_pages: &'a [PageId],
    /// Recurrent state page (models with recurrent layers): it holds the state after `first_pos` tokens
    /// (ignored when `first_pos` is 0) and receives the state after the last new token.
    pub recurrent_page: Option<PageId>,
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

    /// Computes `batch`: for each entry, the keys and values of its new tokens into its attention pages, its
    /// recurrent state into its state page, and its last token's logits when asked (`None` otherwise), in
    /// batch order. The batch is checked whole before any page is written; entries must not write a page
    /// another entry reads or writes. Errors: `StoragePageSize`, `RecurrentStorage`, and per entry
    /// `EmptyTokens`, `TokenOutOfVocab`, `PositionOverflow`, `PageTableTooShort`, `PageOutOfRange`,
    /// `NullPage`, `RecurrentPage`, `PageConflict`; while computing, `StatePosition` and `Storage`.
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
