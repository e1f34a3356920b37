//! Checks a forward batch whole before anything runs: storages match the model's page sizes and ranks, every
//! entry's tokens, positions and pages are valid, and no entry writes a page another entry reads or writes
//! (the entries run in parallel). Returns each entry's `Span`: which page table slots it reads and writes.

use std::collections::HashMap;

use kv_pool::{PageId, PageStorage};

use super::config::{ReferenceConfig, first_key};
use super::error::{ModelError, ModelResult};
use super::{ForwardEntry, ModelStorage};

pub(crate) const ATTENTION: &str = "attention";
pub(crate) const LOCAL: &str = "local";
pub(crate) const RECURRENT: &str = "recurrent";

/// The positions and the page table slots of one entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Span {
    /// First new position.
    pub(crate) first: usize,
    /// End (exclusive) of the new positions.
    pub(crate) end: usize,
    /// The full-attention table's slots.
    pub(crate) full: Slots,
    /// The local table's slots (models with local layers).
    pub(crate) local: Option<Slots>,
}

/// The slots (blocks) of one attention table an entry uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slots {
    /// First slot the entry reads (0 for full attention; the slot of the first key of `first` with a
    /// window).
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
    check_page_size(
        config,
        ATTENTION,
        storage.attention,
        config.bytes_per_page(),
    )?;
    match (config.local.is_some(), storage.local) {
        (false, None) => {}
        (false, Some(_)) => {
            return Err(ModelError::LocalStorage {
                has: "has no",
                reason: "a local storage was given; pass None",
            });
        }
        (true, None) => {
            return Err(ModelError::LocalStorage {
                has: "has",
                reason: "no local storage was given",
            });
        }
        (true, Some(local)) => {
            check_page_size(config, LOCAL, local, config.local_bytes_per_page())?;
        }
    }
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
        (_, Some(recurrent)) => check_page_size(
            config,
            RECURRENT,
            recurrent,
            config.recurrent_bytes_per_page(),
        ),
    }
}

fn check_page_size(
    config: &ReferenceConfig,
    group: &'static str,
    storage: &dyn PageStorage,
    expected: usize,
) -> ModelResult<()> {
    if storage.bytes_per_page() != expected {
        return Err(ModelError::StoragePageSize {
            group,
            bytes_per_page: storage.bytes_per_page(),
            expected,
        });
    }
    if storage.n_ranks() != config.context_parallel {
        return Err(ModelError::StorageRanks {
            group,
            n_ranks: storage.n_ranks(),
            context_parallel: config.context_parallel,
        });
    }
    Ok(())
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
    let block = config.block_tokens() as usize;
    let (first, end) = (entry.first_pos as usize, end_pos as usize);
    let slots = |key_lo: usize| Slots {
        page_lo: key_lo / block,
        write_lo: first / block,
        read_hi: first.div_ceil(block),
        page_hi: end.div_ceil(block),
    };
    let full = slots(0);
    check_table(
        entry_idx,
        ATTENTION,
        entry.attention_pages,
        full,
        storage.attention,
        end_pos,
    )?;
    let local = match (config.local, storage.local) {
        (Some(local), Some(local_storage)) => {
            let local_slots = slots(first_key(local.window, first));
            check_table(
                entry_idx,
                LOCAL,
                entry.local_pages,
                local_slots,
                local_storage,
                end_pos,
            )?;
            Some(local_slots)
        }
        _ if !entry.local_pages.is_empty() => {
            return Err(ModelError::LocalPages { entry: entry_idx });
        }
        _ => None,
    };
    check_state_pages(config, storage, entry_idx, entry.state_pages)?;
    Ok(Span {
        first,
        end,
        full,
        local,
    })
}

/// A table covers the entry's slots; every page is in range, and those it uses are not the null page.
fn check_table(
    entry_idx: usize,
    group: &'static str,
    table: &[PageId],
    slots: Slots,
    storage: &dyn PageStorage,
    end_pos: u32,
) -> ModelResult<()> {
    if table.len() < slots.page_hi {
        return Err(ModelError::PageTableTooShort {
            entry: entry_idx,
            group,
            len: table.len(),
            needed: slots.page_hi,
            end_pos,
        });
    }
    let n_pages = storage.n_pages();
    for (slot, &page) in table[..slots.page_hi].iter().enumerate() {
        check_page(entry_idx, group, page, n_pages, slot, slot >= slots.page_lo)?;
    }
    Ok(())
}

fn check_state_pages(
    config: &ReferenceConfig,
    storage: ModelStorage<'_>,
    entry_idx: usize,
    pages: &[PageId],
) -> ModelResult<()> {
    if pages.len() != config.n_state_pages() {
        return Err(ModelError::RecurrentPage {
            entry: entry_idx,
            n_given: pages.len(),
            n_groups: config.n_state_pages(),
        });
    }
    let Some(recurrent) = storage.recurrent else {
        // No recurrent layers (`check_storage`), and no page given.
        return Ok(());
    };
    for (slot, &page) in pages.iter().enumerate() {
        check_page(entry_idx, RECURRENT, page, recurrent.n_pages(), slot, true)?;
    }
    Ok(())
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

/// The attention and local tables of an entry with the slots it uses.
fn tables<'a>(
    entry: &ForwardEntry<'a>,
    span: &Span,
) -> impl Iterator<Item = (&'static str, &'a [PageId], Slots)> {
    let local = span.local.map(|slots| (LOCAL, entry.local_pages, slots));
    [(ATTENTION, entry.attention_pages, span.full)]
        .into_iter()
        .chain(local)
}

/// No page of a group is written twice, and no page written by one entry is read by an entry (itself
/// included: a table naming a page twice).
fn check_conflicts(batch: &[ForwardEntry<'_>], spans: &[Span]) -> ModelResult<()> {
    let conflict = |group, page, writer, other| ModelError::PageConflict {
        group,
        page,
        writer,
        other,
    };
    let mut writers: HashMap<(&'static str, PageId), usize> = HashMap::new();
    for (entry_idx, (entry, span)) in batch.iter().zip(spans).enumerate() {
        for (group, table, slots) in tables(entry, span) {
            for &page in &table[slots.write_lo..slots.page_hi] {
                if let Some(writer) = writers.insert((group, page), entry_idx) {
                    return Err(conflict(group, page, writer, entry_idx));
                }
            }
        }
        for &page in entry.state_pages {
            if let Some(writer) = writers.insert((RECURRENT, page), entry_idx) {
                return Err(conflict(RECURRENT, page, writer, entry_idx));
            }
        }
    }
    for (entry_idx, (entry, span)) in batch.iter().zip(spans).enumerate() {
        for (group, table, slots) in tables(entry, span) {
            for page in &table[slots.page_lo..slots.write_lo] {
                if let Some(&writer) = writers.get(&(group, *page)) {
                    return Err(conflict(group, *page, writer, entry_idx));
                }
            }
        }
    }
    Ok(())
}
