//! How a request's pages spread over the model's cache groups (H1): one full-attention group holds the block
//! table (one page per block, keyed for the prefix cache); every sliding-window and chunked-local group holds
//! a table of its own, one page per block of its live window, null (page 0) before it, the pages that left
//! the window back in the pool (H3); every recurrent and auxiliary group holds fixed pages per request: one
//! state page per recurrent group, its pages per auxiliary group. A geometry with any group beyond the full
//! one is *hybrid*: a windowed group keeps only its window and a state is valid only at the exact token
//! boundary it was taken at, so a hybrid request gets no local prefix hit from blocks alone (the prefix cache
//! keeps attention blocks, not windows or state) and restores a whole checkpoint at its exact boundary, a
//! partial last page included (H2, H6). Its local hits are whole boundaries that finished requests left
//! cached, every group's pages at once (`snapshots.rs`, H9, H10).
//!
//! Page contents (E3): a full block of the full or a windowed group holds what recompute writes for its block
//! key; a partial last page, a recurrent state page and an auxiliary page hold what recompute writes at the
//! exact boundary `n`, keyed by the exact prefix key of the first `n` tokens (`boundary.rs`). They are
//! written when a checkpoint is captured: until then nothing reads them (the same reason full pages are
//! written only once full).
//!
//! Each group has its kind's manager (`managers.rs`); `GroupCoordinator` combines their answers for the step
//! loop, which asks it and never a kind.

use std::sync::Arc;

use checkpoint_transfer::{
    Checkpoint, CheckpointMeta, CheckpointPayload, LayoutDescriptor, PageSlot,
};
use kv_pool::{BlockKey, Geometry, GroupKind, PageId, PagePool};

use crate::error::{Error, Result};

mod boundary;
mod managers;

pub(crate) use self::boundary::{Boundary, exact_prefix_key, slot_key, window_block_key};
use self::managers::GroupManager;

/// Which token boundaries a restore may resume at: the combined answer of the groups' managers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RestoreBoundary {
    /// Any block boundary: every group's pages of a block are valid for every longer prefix (full
    /// attention alone).
    Block,
    /// Only the exact boundary a checkpoint was captured at, its partial last page included: some group
    /// (a window, a state, auxiliary pages) is valid only there (H6).
    Exact,
}

/// The groups of a geometry as the step loop uses them: one manager per group (`managers.rs`) and their
/// combined answers, as vLLM's `HybridKVCacheCoordinator` combines its managers'.
#[derive(Debug)]
pub(crate) struct GroupCoordinator {
    /// The full-attention group: the block table.
    full: Box<dyn GroupManager>,
    /// Sliding-window and chunked-local groups, in order (a request's `windows` tables).
    windows: Vec<Box<dyn GroupManager>>,
    /// Recurrent and auxiliary groups, in order (a request's `fixed` pages).
    fixed: Vec<Box<dyn GroupManager>>,
    /// Pages of all fixed groups per request.
    n_fixed: u32,
    /// Where restores resume: exact when any group says so.
    boundary: RestoreBoundary,
    /// Whether an auxiliary group keeps draft hidden state: a checkpoint then carries it (H5).
    draft_state: bool,
    /// Tokens a page id holds on all ranks together (`Geometry::block_tokens`).
    block_tokens: u32,
}

impl GroupCoordinator {
    /// The coordinator of `geometry`, or `UnsupportedGeometry` naming the first group the step loop cannot
    /// run and why (H1).
    pub(crate) fn new(geometry: &Geometry) -> Result<GroupCoordinator> {
        crate::params::check_geometry_runs(geometry)?;
        let mut full = None;
        let mut windows = Vec::new();
        let mut fixed = Vec::new();
        for (idx, group) in geometry.groups().iter().enumerate() {
            let manager = managers::manager(idx as u32, group.kind);
            match group.kind {
                // `check_geometry_runs`: exactly one.
                GroupKind::Full => full = Some(manager),
                GroupKind::SlidingWindow { .. } | GroupKind::ChunkedLocal { .. } => {
                    windows.push(manager);
                }
                GroupKind::Recurrent | GroupKind::Auxiliary { .. } => fixed.push(manager),
            }
        }
        let full =
            full.ok_or_else(|| Error::internal("a checked geometry has a full-attention group"))?;
        let n_fixed = fixed
            .iter()
            .map(|manager| manager.fixed_pages())
            .fold(0u32, u32::saturating_add);
        let all = || std::iter::once(&full).chain(&windows).chain(&fixed);
        let boundary = if all().any(|manager| manager.exact_boundary()) {
            RestoreBoundary::Exact
        } else {
            RestoreBoundary::Block
        };
        let draft_state = all().any(|manager| manager.carries_draft_state());
        Ok(GroupCoordinator {
            full,
            windows,
            fixed,
            n_fixed,
            boundary,
            draft_state,
            block_tokens: geometry.block_tokens(),
        })
    }

    /// Which token boundaries a restore may resume at.
    pub(crate) fn restore_boundary(&self) -> RestoreBoundary {
        self.boundary
    }

    /// Whether restores resume at exact boundaries only: lookups and captures then end at exact boundaries,
    /// which take their partial pages' tokens.
    pub(crate) fn restores_at_exact_boundaries(&self) -> bool {
        self.boundary == RestoreBoundary::Exact
    }

    /// Whether a restore's partial last pages and fixed pages came from a checkpoint, to be copied on write
    /// by the first allocation (they are shared with the checkpoint's other readers).
    pub(crate) fn restores_copy_on_write(&self) -> bool {
        self.restores_at_exact_boundaries()
    }

    /// The block-table pages of the longest prefix of `keys` every group serves from the local prefix cache
    /// block by block (the minimum over the groups' hits; none on a hybrid model, whose local hits are whole
    /// boundaries, `snapshots.rs`). Does not touch them.
    pub(crate) fn local_hit(&self, pool: &PagePool, keys: &[BlockKey]) -> Vec<PageId> {
        let mut limit = keys.len();
        for manager in self.windows.iter().chain(&self.fixed) {
            let keys = keys.get(..limit).unwrap_or_default();
            limit = limit.min(manager.local_hit(pool, keys).len());
        }
        let mut hits = self
            .full
            .local_hit(pool, keys.get(..limit).unwrap_or_default());
        hits.truncate(limit);
        hits
    }

    /// Tokens of a prompt of `len` tokens a restore may cover. Block boundaries: the full blocks of all but
    /// the last token, or the whole prompt when it ends on a block boundary and the request has saved logits
    /// (Q4). Exact boundaries (H6): all but the last token, or the whole prompt with saved logits.
    pub(crate) fn restorable_tokens(&self, len: u32, saved_logits: bool, block_tokens: u32) -> u32 {
        match self.boundary {
            RestoreBoundary::Exact if saved_logits => len,
            RestoreBoundary::Exact => len.saturating_sub(1),
            RestoreBoundary::Block if saved_logits && len.is_multiple_of(block_tokens) => len,
            RestoreBoundary::Block => len.saturating_sub(1) / block_tokens * block_tokens,
        }
    }

    /// The checkpoint an answered restore keeps after its refresh found `fresh` (G4), with the tokens it
    /// restores. Exact boundaries: a checkpoint restores at its own boundary only, so a different one
    /// replaces it whole. Block boundaries: the newer generation, at the shorter match.
    pub(crate) fn refreshed(
        &self,
        held: (Arc<CheckpointMeta>, u32),
        fresh: (Arc<CheckpointMeta>, u32),
    ) -> (Arc<CheckpointMeta>, u32) {
        match self.boundary {
            RestoreBoundary::Exact => fresh,
            RestoreBoundary::Block if fresh.0.generation > held.0.generation => {
                (fresh.0, held.1.min(fresh.1))
            }
            RestoreBoundary::Block => (held.0, held.1.min(fresh.1)),
        }
    }

    /// Pages an import of `tokens` tokens of a checkpoint of `checkpoint_pages` pages brings into the pool
    /// (reserved before the copy): its blocks, or at an exact boundary the whole checkpoint.
    pub(crate) fn import_pages(
        &self,
        checkpoint_pages: u32,
        tokens: u32,
        block_tokens: u32,
    ) -> u32 {
        match self.boundary {
            RestoreBoundary::Exact => checkpoint_pages,
            RestoreBoundary::Block => tokens / block_tokens,
        }
    }

    /// Pages a restore at once to `start` tokens takes beyond its first chunk, `n_hits` blocks being local
    /// hits: the blocks after them; at an exact boundary the whole checkpoint, then the copies on write of
    /// its partial pages (one per table) and its fixed pages.
    pub(crate) fn restore_at_once_pages(
        &self,
        checkpoint_pages: u32,
        start: u32,
        n_hits: u32,
        block_tokens: u32,
    ) -> u32 {
        match self.boundary {
            RestoreBoundary::Exact => {
                checkpoint_pages
                    + u32::from(!start.is_multiple_of(block_tokens)) * self.n_tables()
                    + self.n_fixed
            }
            RestoreBoundary::Block => start.div_ceil(block_tokens) - n_hits,
        }
    }

    /// Pages a published import of `tokens` tokens holds: its blocks, or at an exact boundary the whole
    /// checkpoint's slots.
    pub(crate) fn import_len(&self, tokens: u32, block_tokens: u32) -> usize {
        match self.boundary {
            RestoreBoundary::Exact => self.slots(tokens, block_tokens).len(),
            RestoreBoundary::Block => tokens.div_ceil(block_tokens) as usize,
        }
    }

    /// Tokens of a ready import of `tokens` tokens that were restored, `hits` being the pages acquired and
    /// `dest` the import's own, position by position. Block boundaries: a block whose page is still the
    /// import's own (another cached page of the block was a local hit). Exact: the whole boundary (no local
    /// hit, H2).
    pub(crate) fn restored_tokens(
        &self,
        hits: &[PageId],
        dest: &[PageId],
        tokens: u32,
        block_tokens: u32,
    ) -> u32 {
        match self.boundary {
            RestoreBoundary::Exact => tokens,
            RestoreBoundary::Block => {
                hits.iter()
                    .zip(dest)
                    .filter(|(hit, own)| hit == own)
                    .count() as u32
                    * block_tokens
            }
        }
    }

    /// Whether a published import holds unkeyed pages (a partial last page, state) that a `pages-only`
    /// publication keys under their slot keys (`slot_key`).
    pub(crate) fn imports_unkeyed_pages(&self) -> bool {
        self.restores_at_exact_boundaries()
    }

    /// The part of `stored` an import of its first `tokens` tokens from block `first_block` on copies into
    /// the pool and publishes. Block boundaries: blocks `[first_block, tokens / block_tokens)` (one keyed
    /// page per block; the engine's checkpoints have one full-attention group and their keyed pages first).
    /// Exact: the whole checkpoint, which must end at exactly `tokens` (from block 0).
    pub(crate) fn import_part(
        &self,
        stored: &Checkpoint,
        first_block: u32,
        tokens: u32,
        block_tokens: u32,
    ) -> Result<Checkpoint> {
        let block_tokens = block_tokens as usize;
        if self.boundary == RestoreBoundary::Exact {
            if first_block != 0 || stored.meta.n_tokens != tokens as usize {
                return Err(Error::internal(format!(
                    "a hybrid checkpoint of {} tokens restored as {tokens} tokens from block {first_block}",
                    stored.meta.n_tokens
                )));
            }
            return Ok(stored.clone());
        }
        let end_block = tokens as usize / block_tokens;
        let blocks = first_block as usize..end_block;
        let block_keys = stored.meta.block_keys.get(blocks.clone()).ok_or_else(|| {
            Error::internal(format!(
                "an import of blocks {blocks:?} of a checkpoint of {} blocks",
                stored.meta.block_keys.len()
            ))
        })?;
        let meta = CheckpointMeta {
            n_tokens: blocks.end * block_tokens,
            draft_prefix_len: stored.meta.draft_prefix_len.min(blocks.end * block_tokens),
            block_keys: block_keys.to_vec(),
            tail_tokens: Vec::new(),
            pages: (0..blocks.len() as u32)
                .map(|key_idx| PageSlot {
                    group: self.full(),
                    key_idx: Some(key_idx),
                })
                .collect(),
            ..stored.meta.clone()
        };
        let ranks = stored
            .payload
            .ranks
            .iter()
            .map(|pages| pages.range(blocks.clone()))
            .collect();
        Ok(Checkpoint {
            meta,
            payload: CheckpointPayload { ranks },
        })
    }

    /// Whether checkpoints carry draft hidden state (an auxiliary group): a restore then resumes drafting
    /// without replaying its last page (H5).
    pub(crate) fn carries_draft_state(&self) -> bool {
        self.draft_state
    }

    /// Windowed groups (sliding window, chunked local).
    pub(crate) fn n_windows(&self) -> usize {
        self.windows.len()
    }

    /// Tables a request holds one page per block in: the block table and the windowed tables.
    pub(crate) fn n_tables(&self) -> u32 {
        1 + self.windows.len() as u32
    }

    /// The group index of windowed group `window`.
    pub(crate) fn window_group(&self, window: usize) -> u32 {
        self.windows[window].group()
    }

    /// The first block windowed group `window` still holds once `n_tokens` are computed: blocks before it
    /// left the window (null in its table, back in the pool).
    pub(crate) fn window_first_block(&self, window: usize, n_tokens: u32) -> u32 {
        self.windows[window].live_tokens(n_tokens).start / self.block_tokens
    }

    /// The first block of windowed group `window` a checkpoint at `n_tokens` holds: its live pages, none when
    /// nothing is live (a chunked-local group at a chunk boundary; `Geometry::live_pages` counts 0 pages).
    pub(crate) fn window_checkpoint_first_block(&self, window: usize, n_tokens: u32) -> u32 {
        self.windows[window].checkpoint_first_block(n_tokens, self.block_tokens)
    }

    /// Index of the full-attention group.
    pub(crate) fn full(&self) -> u32 {
        self.full.group()
    }

    /// Fixed pages a request holds once it computes (0 without recurrent or auxiliary groups).
    pub(crate) fn n_fixed(&self) -> u32 {
        self.n_fixed
    }

    /// The checkpoint layout of `geometry` with `bytes_per_page` bytes a page (on one rank). Its
    /// `tokens_per_page` is the block (`Geometry::block_tokens`): the tokens one page id holds on all ranks
    /// together, the unit of block keys and prefix matches.
    pub(crate) fn layout(geometry: &Geometry, bytes_per_page: u64) -> LayoutDescriptor {
        LayoutDescriptor {
            groups: geometry.groups().iter().map(|group| group.kind).collect(),
            bytes_per_page,
            // A page id holds a block: `tokens_per_page` tokens on each of the ranks.
            tokens_per_page: geometry.block_tokens(),
            n_ranks: geometry.context_parallel(),
        }
    }

    /// The pages of a checkpoint at boundary `n_tokens`, in payload order, with the block each holds: one
    /// page per block of the full group (full blocks keyed, a partial last one not), then the live blocks of
    /// each windowed group (unkeyed), then the fixed pages (no block).
    pub(crate) fn slots(&self, n_tokens: u32, block_tokens: u32) -> Vec<(PageSlot, Option<u32>)> {
        std::iter::once(&self.full)
            .chain(&self.windows)
            .chain(&self.fixed)
            .flat_map(|manager| manager.checkpoint_slots(n_tokens, block_tokens))
            .collect()
    }

    /// The pages an import of `tokens` tokens from block `first_block` on holds (`import_part`), in the order
    /// the index holds them, with the block each holds: blocks `[first_block, tokens / block_tokens)`, or at
    /// an exact boundary the whole checkpoint's slots.
    pub(crate) fn import_slots(
        &self,
        first_block: u32,
        tokens: u32,
        block_tokens: u32,
    ) -> Vec<(PageSlot, Option<u32>)> {
        match self.boundary {
            RestoreBoundary::Exact => self.slots(tokens, block_tokens),
            RestoreBoundary::Block => self
                .full
                .checkpoint_slots(tokens / block_tokens * block_tokens, block_tokens)
                .into_iter()
                .skip(first_block as usize)
                .collect(),
        }
    }

    /// The checkpoint boundary at `n_tokens` of a request with `tokens` and full-block `keys`: its pages
    /// and what recompute writes into each.
    pub(crate) fn boundary<'a>(
        &self,
        tokens: &[u32],
        keys: &'a [BlockKey],
        salt: &[u8],
        n_tokens: u32,
        block_tokens: u32,
    ) -> Boundary<'a> {
        let slots = self.slots(n_tokens, block_tokens);
        Boundary::new(slots, tokens, keys, salt, n_tokens, block_tokens)
    }

    /// The boundary of an import of `n_tokens` tokens from block `first_block` on (`import_slots`): its pages
    /// and what recompute writes into each.
    pub(crate) fn import_boundary<'a>(
        &self,
        tokens: &[u32],
        keys: &'a [BlockKey],
        salt: &[u8],
        first_block: u32,
        n_tokens: u32,
        block_tokens: u32,
    ) -> Boundary<'a> {
        let slots = self.import_slots(first_block, n_tokens, block_tokens);
        Boundary::new(slots, tokens, keys, salt, n_tokens, block_tokens)
    }
}

#[cfg(test)]
mod tests;
