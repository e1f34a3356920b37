//! One cache manager per group kind (as vLLM v1's `single_type_kv_cache_manager.py`): each answers, for its
//! own group, the questions the step loop asks of a kind: which blocks of a prompt the local prefix cache
//! serves, whether a restore resumes at the exact token boundary of its checkpoint, which tokens stay live,
//! which pages a checkpoint of it holds and which pages a request holds whatever its length.
//!
//! Only the full-attention group serves local prefix hits block by block: a windowed group keeps only its
//! window and a recurrent or auxiliary state is valid only at the exact boundary it was taken at (H2). Their
//! local hits are whole boundaries a finished request left cached, every group's pages of one exact boundary
//! found at once (`snapshots.rs`, H9), not a block-by-block answer of their managers.

use std::ops::Range;

use checkpoint_transfer::PageSlot;
use kv_pool::{BlockKey, GroupKind, PageId, PagePool};

/// The cache manager of one group.
pub(crate) trait GroupManager: std::fmt::Debug + Send + Sync {
    /// The group's index in the geometry.
    fn group(&self) -> u32;

    /// Pages a request holds of this group whatever its length (a recurrent state, auxiliary pages); 0 for a
    /// group of one page per block.
    fn fixed_pages(&self) -> u32 {
        0
    }

    /// The pages of the longest prefix of `keys` (full blocks) the local prefix cache serves for this
    /// group. Does not touch them. None by default: the prefix cache keeps blocks of full attention alone,
    /// no window and no state (H2).
    fn local_hit(&self, _pool: &PagePool, _keys: &[BlockKey]) -> Vec<PageId> {
        Vec::new()
    }

    /// Whether a checkpoint of this group restores only at the exact token boundary it was captured at (its
    /// partial pages and state are valid there alone), not at any block boundary before it (H6). By
    /// default it does: only full attention's blocks hold for every longer prefix.
    fn exact_boundary(&self) -> bool {
        true
    }

    /// The tokens the group still holds once `n_tokens` are computed (`Geometry::live_tokens`).
    fn live_tokens(&self, n_tokens: u32) -> Range<u32>;

    /// Whether the group's checkpoint carries the draft model's hidden state (H5).
    fn carries_draft_state(&self) -> bool {
        false
    }

    /// The first block the group holds in a checkpoint at `n_tokens`: its live blocks, none (the block
    /// after the boundary) when nothing is live.
    fn checkpoint_first_block(&self, n_tokens: u32, block_tokens: u32) -> u32 {
        let live = self.live_tokens(n_tokens);
        if live.is_empty() {
            n_tokens.div_ceil(block_tokens)
        } else {
            live.start / block_tokens
        }
    }

    /// The group's pages of a checkpoint at `n_tokens`, in payload order, with the block each holds: by
    /// default its live blocks, then its fixed pages, none of them keyed.
    fn checkpoint_slots(&self, n_tokens: u32, block_tokens: u32) -> Vec<(PageSlot, Option<u32>)> {
        let group = self.group();
        let unkeyed = |block| {
            (
                PageSlot {
                    group,
                    key_idx: None,
                },
                block,
            )
        };
        let live =
            self.checkpoint_first_block(n_tokens, block_tokens)..n_tokens.div_ceil(block_tokens);
        live.map(|block| unkeyed(Some(block)))
            .chain((0..self.fixed_pages()).map(|_| unkeyed(None)))
            .collect()
    }
}

/// The manager of `kind`, group `group` of its geometry.
pub(crate) fn manager(group: u32, kind: GroupKind) -> Box<dyn GroupManager> {
    match kind {
        GroupKind::Full => Box::new(FullAttention { group }),
        GroupKind::SlidingWindow {
            window_tokens,
            retained_tail_tokens,
        } => Box::new(SlidingWindow {
            group,
            kept_tokens: window_tokens.saturating_add(retained_tail_tokens),
        }),
        GroupKind::ChunkedLocal { chunk_tokens } => Box::new(ChunkedLocal {
            group,
            chunk_tokens,
        }),
        GroupKind::Recurrent => Box::new(RecurrentState { group }),
        GroupKind::Auxiliary { pages } => Box::new(Auxiliary { group, pages }),
    }
}

/// Full attention: the block table, every block kept, served from the prefix cache block by block.
#[derive(Debug)]
struct FullAttention {
    group: u32,
}

impl GroupManager for FullAttention {
    fn group(&self) -> u32 {
        self.group
    }
    /// One page per block, full blocks keyed, a partial last one not.
    fn checkpoint_slots(&self, n_tokens: u32, block_tokens: u32) -> Vec<(PageSlot, Option<u32>)> {
        let (group, n_full) = (self.group, n_tokens / block_tokens);
        (0..n_tokens.div_ceil(block_tokens))
            .map(|block| {
                let key_idx = (block < n_full).then_some(block);
                (PageSlot { group, key_idx }, Some(block))
            })
            .collect()
    }
    fn local_hit(&self, pool: &PagePool, keys: &[BlockKey]) -> Vec<PageId> {
        pool.longest_prefix(keys)
    }
    fn exact_boundary(&self) -> bool {
        false
    }
    fn live_tokens(&self, n_tokens: u32) -> Range<u32> {
        0..n_tokens
    }
}

/// Sliding-window attention: the last `window + retained tail` tokens; the prefix cache keeps no window
/// (H2), and its partial last page restores at its exact boundary.
#[derive(Debug)]
struct SlidingWindow {
    group: u32,
    /// `window_tokens + retained_tail_tokens`.
    kept_tokens: u32,
}

impl GroupManager for SlidingWindow {
    fn group(&self) -> u32 {
        self.group
    }
    fn live_tokens(&self, n_tokens: u32) -> Range<u32> {
        n_tokens.saturating_sub(self.kept_tokens)..n_tokens
    }
}

/// Chunked-local attention: the current aligned chunk; the prefix cache keeps no chunk (H2), and its partial
/// last page restores at its exact boundary.
#[derive(Debug)]
struct ChunkedLocal {
    group: u32,
    chunk_tokens: u32,
}

impl GroupManager for ChunkedLocal {
    fn group(&self) -> u32 {
        self.group
    }
    fn live_tokens(&self, n_tokens: u32) -> Range<u32> {
        // `Geometry::new` refuses a chunk of 0 tokens; were one here, nothing would be live.
        let start = n_tokens
            .checked_div(self.chunk_tokens)
            .map_or(n_tokens, |chunks| chunks * self.chunk_tokens);
        start..n_tokens
    }
}

/// Recurrent state: one state page per request, valid only at the exact boundary it was taken at; the
/// prefix cache keeps no state (H2).
#[derive(Debug)]
struct RecurrentState {
    group: u32,
}

impl GroupManager for RecurrentState {
    fn group(&self) -> u32 {
        self.group
    }
    fn fixed_pages(&self) -> u32 {
        1
    }
    fn live_tokens(&self, n_tokens: u32) -> Range<u32> {
        n_tokens..n_tokens
    }
}

/// Auxiliary pages (draft hidden state): a fixed count per request, valid at their exact boundary; a
/// checkpoint carries the draft state (H5).
#[derive(Debug)]
struct Auxiliary {
    group: u32,
    pages: u32,
}

impl GroupManager for Auxiliary {
    fn group(&self) -> u32 {
        self.group
    }
    fn fixed_pages(&self) -> u32 {
        self.pages
    }
    fn live_tokens(&self, n_tokens: u32) -> Range<u32> {
        n_tokens..n_tokens
    }
    fn carries_draft_state(&self) -> bool {
        true
    }
}
