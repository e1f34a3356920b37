//! `ModelError`: what the reference model refuses (an invalid configuration, a batch that does not fit its
//! pages or vocabulary) and the storage failures it passes on. Every batch is checked whole before any page
//! is written, so a refused batch changes nothing.

use kv_pool::PageId;

/// Result of reference model operations.
pub(crate) type ModelResult<T> = std::result::Result<T, ModelError>;

/// Everything the reference model can refuse or fail at.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A configuration field is out of its allowed range.
    #[error("invalid reference model config {name}: {reason}")]
    InvalidConfig {
        /// The field.
        name: &'static str,
        /// Why it is invalid and what is allowed.
        reason: String,
    },
    /// A batch entry has no new tokens.
    #[error("batch entry {entry} has no tokens: every entry computes at least one")]
    EmptyTokens {
        /// Index of the entry in the batch.
        entry: usize,
    },
    /// A token id is not in the vocabulary.
    #[error("batch entry {entry}: token {token} is not below the vocabulary size {vocab}")]
    TokenOutOfVocab {
        /// Index of the entry in the batch.
        entry: usize,
        /// The token id.
        token: u32,
        /// Vocabulary size.
        vocab: u32,
    },
    /// The entry's last position does not fit a `u32`.
    #[error("batch entry {entry}: positions from {first_pos} for {n_tokens} tokens overflow u32")]
    PositionOverflow {
        /// Index of the entry in the batch.
        entry: usize,
        /// Position of the first new token.
        first_pos: u32,
        /// New tokens.
        n_tokens: usize,
    },
    /// An attention or local page table does not cover the entry's positions.
    #[error(
        "batch entry {entry}: {group} page table has {len} pages but positions up to {end_pos} need {needed}"
    )]
    PageTableTooShort {
        /// Index of the entry in the batch.
        entry: usize,
        /// `"attention"` or `"local"`.
        group: &'static str,
        /// Pages in the table.
        len: usize,
        /// Pages needed.
        needed: usize,
        /// End (exclusive) of the entry's positions.
        end_pos: u32,
    },
    /// A page id is past the end of its storage.
    #[error(
        "batch entry {entry}: {group} page {page:?} is out of range: the storage has {n_pages} pages"
    )]
    PageOutOfRange {
        /// Index of the entry in the batch.
        entry: usize,
        /// `"attention"`, `"local"` or `"recurrent"`.
        group: &'static str,
        /// The page.
        page: PageId,
        /// Pages in the storage, the null page included.
        n_pages: u32,
    },
    /// A page the entry reads or writes is the null page (only pages wholly outside a sliding window may be).
    #[error(
        "batch entry {entry}: {group} page table slot {slot} is the null page but the entry uses it"
    )]
    NullPage {
        /// Index of the entry in the batch.
        entry: usize,
        /// `"attention"`, `"local"` or `"recurrent"`.
        group: &'static str,
        /// Index in the page table (0 for the recurrent state page).
        slot: usize,
    },
    /// Two entries of a batch write the same page, or one reads a page another writes.
    #[error("{group} page {page:?} is written by batch entry {writer} and used by entry {other}")]
    PageConflict {
        /// `"attention"`, `"local"` or `"recurrent"`.
        group: &'static str,
        /// The page.
        page: PageId,
        /// The entry that writes it.
        writer: usize,
        /// The other entry that reads or writes it.
        other: usize,
    },
    /// A storage's page size is not the model's.
    #[error("{group} storage has {bytes_per_page}-byte pages but the model's are {expected} bytes")]
    StoragePageSize {
        /// `"attention"`, `"local"` or `"recurrent"`.
        group: &'static str,
        /// The storage's page size.
        bytes_per_page: usize,
        /// The model's page size for the group.
        expected: usize,
    },
    /// The model has recurrent layers and no recurrent storage was given, or the reverse.
    #[error("the model has {n_recurrent_layers} recurrent layer(s): {reason}")]
    RecurrentStorage {
        /// Recurrent layers of the model.
        n_recurrent_layers: u32,
        /// What is missing or extra.
        reason: &'static str,
    },
    /// The entry does not give one state page per recurrent group.
    #[error(
        "batch entry {entry}: {n_given} recurrent state page(s) given, but the model has {n_groups} recurrent \
         group(s), one state page each"
    )]
    RecurrentPage {
        /// Index of the entry in the batch.
        entry: usize,
        /// State pages given.
        n_given: usize,
        /// Recurrent groups of the model.
        n_groups: usize,
    },
    /// The model has local layers and no local storage was given, or the reverse.
    #[error("the model {has} local layers: {reason}")]
    LocalStorage {
        /// `"has"` or `"has no"`.
        has: &'static str,
        /// What is missing or extra.
        reason: &'static str,
    },
    /// The entry's local page table is given to a model without local layers.
    #[error("batch entry {entry}: a local page table was given to a model without local layers")]
    LocalPages {
        /// Index of the entry in the batch.
        entry: usize,
    },
    /// A storage has another rank count than the model's context-parallel ranks.
    #[error(
        "{group} storage has {n_ranks} rank(s) but the model runs on {context_parallel} context-parallel rank(s)"
    )]
    StorageRanks {
        /// `"attention"`, `"local"` or `"recurrent"`.
        group: &'static str,
        /// The storage's ranks.
        n_ranks: u32,
        /// The model's ranks.
        context_parallel: u32,
    },
    /// The recurrent state page holds the state at another position than the entry's first position.
    #[error(
        "batch entry {entry}: state page {page:?} holds the state after {found} tokens, not {expected}"
    )]
    StatePosition {
        /// Index of the entry in the batch.
        entry: usize,
        /// The state page.
        page: PageId,
        /// The entry's first position.
        expected: u32,
        /// The position in the page's header.
        found: u64,
    },
    /// Reading or writing page storage failed.
    #[error(transparent)]
    Storage(#[from] kv_pool::Error),
}
