//! Checks a forward batch whole before anything runs: storages match the model's page sizes, every entry's
//! tokens, positions and pages are valid, and no entry writes a page another entry reads or writes (the
//! entries run in parallel). Returns each entry's `Span`: which page table slots it reads and writes.

use std::collections::HashMap;

use kv_pool::{PageId, PageStorage};

use super::config::ReferenceConfig;
use super::error::{ModelError, ModelResult};
use super::{ForwardEntry, ModelStorage};

const ATTENTION: &str = "attention";
const RECURRENT: &str = "recurrent";

/// The positions and page table slots of one entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Span {
    /// First new position.
    pub(crate) first: usize,
    /// End (exclusive) of the new positions.
    pub(crate) end: usize,
    /// First slot the entry reads (0 for full attention; the slot of `first - window` with a window).
    pub(crate) page_lo: usize,
    /// First slot the entry writes: the slot of `first`.
    pub(crate) write_lo: usize,
    /// End (exclusive) of the slots the entry reads from storage: the slots holding positions before
    /// `first`.
    pub(crate) read_hi: usize,
    /// End (exclusive) of the slots the entry uses: the slot after the one holding `end - 1`.
    pub(crate) page_hi: usize,
}

/// Checks `batch` against the model and the storages; the spans of the entries in order.
pub(crate) fn check_batch(
    config: &ReferenceConfig,
    storage: ModelStorage<'_>,
    batch: &[ForwardEntry<'_>],
) -> ModelResult<Vec<Span>> {
    check_storage(config, storage)?;
    let spans = batch
        .iter()
        .enumerate()
        .map(|(entry_idx, entry)| check_entry(config, storage, entry_idx, entry))
        .collect::<ModelResult<Vec<Span>>>()?;
    check_conflicts(batch, &spans)?;
    Ok(spans)
}

fn check_storage(config: &ReferenceConfig, storage: ModelStorage<'_>) -> ModelResult<()> {
    check_page_size(ATTENTION, storage.attention, config.bytes_per_page())?;
    match (config.n_recurrent_layers, storage.recurrent) {
        (0, None) => Ok(()),
        (0, Some(_)) => Err(ModelError::RecurrentStorage {
            n_recurrent_layers: 0,
            reason: "a recurrent storage was given; pass None",
        }),
        (n_recurrent_layers, None) => Err(ModelError::RecurrentStorage {
            n_recurrent_layers,
            reason: "no recurrent storage was given",
        }),
        (_, Some(recurrent)) => {
            check_page_size(RECURRENT, recurrent, config.recurrent_bytes_per_page())
        }
    }
}

fn check_page_size(
    group: &'static str,
    storage: &dyn PageStorage,
    expected: usize,
) -> ModelResult<()> {
    if storage.bytes_per_page() == expected {
        Ok(())
    } else {
        Err(ModelError::StoragePageSize {
            group,
            bytes_per_page: storage.bytes_per_page(),
            expected,
        })
    }
}

fn check_entry(
    config: &ReferenceConfig,
    storage: ModelStorage<'_>,
    entry_idx: usize,
    entry: &ForwardEntry<'_>,
) -> ModelResult<Span> {
    if entry.tokens.is_empty() {
        return Err(ModelError::EmptyTokens { entry: entry_idx });
    }
    if let Some(&token) = entry.tokens.iter().find(|&&token| token >= config.vocab) {
        return Err(ModelError::TokenOutOfVocab {
            entry: entry_idx,
            token,
            vocab: config.vocab,
        });
    }
    let end_pos = u32::try_from(entry.tokens.len())
        .ok()
        .and_then(|n| entry.first_pos.checked_add(n))
        .ok_or(ModelError::PositionOverflow {
            entry: entry_idx,
            first_pos: entry.first_pos,
            n_tokens: entry.tokens.len(),
        })?;
    let tpp = config.tokens_per_page as usize;
    let (first, end) = (entry.first_pos as usize, end_pos as usize);
    let key_lo = config
        .window_tokens
        .map_or(0, |window| first.saturating_sub(window as usize));
    let span = Span {
        first,
        end,
        page_lo: key_lo / tpp,
        write_lo: first / tpp,
        read_hi: first.div_ceil(tpp),
        page_hi: end.div_ceil(tpp),
    };
    let table = entry.attention_pages;
    if table.len() < span.page_hi {
        return Err(ModelError::PageTableTooShort {
            entry: entry_idx,
            len: table.len(),
            needed: span.page_hi,
            end_pos,
        });
    }
    let n_pages = storage.attention.n_pages();
    for (slot, &page) in table[..span.page_hi].iter().enumerate() {
        check_page(
            entry_idx,
            ATTENTION,
            page,
            n_pages,
            slot,
            slot >= span.page_lo,
        )?;
    }
    check_recurrent_page(config, storage, entry_idx, entry.recurrent_page)?;
    Ok(span)
}

fn check_recurrent_page(
    config: &ReferenceConfig,
    storage: ModelStorage<'_>,
    entry_idx: usize,
    page: Option<PageId>,
) -> ModelResult<()> {
    match (storage.recurrent, page) {
        (None, None) => Ok(()),
        (None, Some(_)) => Err(ModelError::RecurrentPage {
            entry: entry_idx,
            reason: "a recurrent state page was given to a model without recurrent layers",
        }),
        (Some(_), None) => Err(ModelError::RecurrentPage {
            entry: entry_idx,
            reason: "no recurrent state page was given to a model with recurrent layers",
        }),
        (Some(recurrent), Some(page)) => {
            debug_assert!(config.n_recurrent_layers > 0);
            check_page(entry_idx, RECURRENT, page, recurrent.n_pages(), 0, true)
        }
    }
}

/// A page must be in its storage's range, and not the null page when the entry uses it.
fn check_page(
    entry_idx: usize,
    group: &'static str,
    page: PageId,
    n_pages: u32,
    slot: usize,
    used: bool,
) -> ModelResult<()> {
    if page.0 >= n_pages {
        return Err(ModelError::PageOutOfRange {
            entry: entry_idx,
            group,
            page,
            n_pages,
        });
    }
    if used && page.is_null() {
        return Err(ModelError::NullPage {
            entry: entry_idx,
            group,
            slot,
        });
    }
    Ok(())
}

/// No page is written twice, and no page written by one entry is read by an entry (itself included: a
/// table naming a page twice).
fn check_conflicts(batch: &[ForwardEntry<'_>], spans: &[Span]) -> ModelResult<()> {
    let conflict = |group, page, writer, other| ModelError::PageConflict {
        group,
        page,
        writer,
        other,
    };
    let mut attention_writers: HashMap<PageId, usize> = HashMap::new();
    let mut recurrent_writers: HashMap<PageId, usize> = HashMap::new();
    for (entry_idx, (entry, span)) in batch.iter().zip(spans).enumerate() {
        for &page in &entry.attention_pages[span.write_lo..span.page_hi] {
            if let Some(writer) = attention_writers.insert(page, entry_idx) {
                return Err(conflict(ATTENTION, page, writer, entry_idx));
            }
        }
        if let Some(page) = entry.recurrent_page
            && let Some(writer) = recurrent_writers.insert(page, entry_idx)
        {
            return Err(conflict(RECURRENT, page, writer, entry_idx));
        }
    }
    for (entry_idx, (entry, span)) in batch.iter().zip(spans).enumerate() {
        for page in &entry.attention_pages[span.page_lo..span.write_lo] {
            if let Some(&writer) = attention_writers.get(page) {
                return Err(conflict(ATTENTION, *page, writer, entry_idx));
            }
        }
    }
    Ok(())
}
