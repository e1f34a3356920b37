//! How a request's pages spread over the model's cache groups (H1): one full-attention group holds the block
//! table (one page per block, keyed for the prefix cache); every sliding-window and chunked-local group holds
//! a table of its own, one page per block of its live window, null (page 0) before it, the pages that left
//! the window back in the pool (H3); every recurrent and auxiliary group holds fixed pages per request: one
//! state page per recurrent group, its pages per auxiliary group. A geometry with any group beyond the full
//! one is *hybrid*: a windowed group keeps only its window and a state is valid only at the exact token
//! boundary it was taken at, so a hybrid request gets no local prefix hit (the prefix cache keeps attention
//! blocks, not windows or state) and restores a whole checkpoint at its exact boundary, a partial last page
//! included (H2, H6).
//!
//! Page contents (E3): a full block of the full or a windowed group holds what recompute writes for its block
//! key; a partial last page, a recurrent state page and an auxiliary page hold what recompute writes at the
//! exact boundary `n`, keyed by the exact prefix key of the first `n` tokens ([`exact_prefix_key`]). They are
//! written when a checkpoint is captured: until then nothing reads them (the same reason full pages are
//! written only once full).

use checkpoint_transfer::{LayoutDescriptor, PageSlot};
use kv_pool::{BlockKey, Geometry, GroupKind};

use crate::error::{Error, Result};
use crate::executor::PageWrite;

/// The groups of a geometry as the step loop uses them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GroupPlan {
    /// Index of the full-attention group: the block table.
    full: u32,
    /// Sliding-window and chunked-local groups, in order.
    windows: Vec<u32>,
    /// The geometry (the live window of each windowed group).
    geometry: Geometry,
    /// Recurrent and auxiliary groups in order, with the pages each holds per request.
    fixed: Vec<(u32, u32)>,
    /// Pages of all fixed groups per request.
    n_fixed: u32,
    /// Whether an auxiliary group keeps draft hidden state: a checkpoint then carries it (H5).
    auxiliary: bool,
}

impl GroupPlan {
    /// The plan of `geometry`, or `UnsupportedGeometry` naming the first group the step loop cannot run and
    /// why (H1).
    pub(crate) fn new(geometry: &Geometry) -> Result<GroupPlan> {
        let unsupported = |idx: usize, what: String, why: &str| {
            Err(Error::UnsupportedGeometry {
                reason: format!("cache group {idx} is {what}: {why}"),
            })
        };
        let mut full = None;
        let mut fixed = Vec::new();
        let mut windows = Vec::new();
        for (idx, group) in geometry.groups().iter().enumerate() {
            match group.kind {
                GroupKind::Full if full.is_none() => full = Some(idx as u32),
                GroupKind::Full => {
                    return unsupported(
                        idx,
                        "a second full-attention group".to_owned(),
                        "the step loop keeps one block table; give the layers of both one group",
                    );
                }
                GroupKind::Recurrent => fixed.push((idx as u32, 1)),
                GroupKind::Auxiliary { pages } => fixed.push((idx as u32, pages)),
                GroupKind::SlidingWindow { .. } | GroupKind::ChunkedLocal { .. } => {
                    windows.push(idx as u32);
                }
            }
        }
        let Some(full) = full else {
            return Err(Error::UnsupportedGeometry {
                reason:
                    "no cache group is full attention: the step loop needs one for the block table \
                         (add a full-attention group)"
                        .to_owned(),
            });
        };
        let n_fixed = fixed
            .iter()
            .map(|&(_, pages)| pages)
            .fold(0u32, u32::saturating_add);
        Ok(GroupPlan {
            full,
            windows,
            geometry: geometry.clone(),
            auxiliary: geometry
                .groups()
                .iter()
                .any(|group| matches!(group.kind, GroupKind::Auxiliary { .. })),
            fixed,
            n_fixed,
        })
    }

    /// Whether any group goes beyond the full one (windows, recurrent state, auxiliary pages): then prefix
    /// hits and restores are whole checkpoints at exact boundaries.
    pub(crate) fn is_hybrid(&self) -> bool {
        self.n_fixed > 0 || !self.windows.is_empty()
    }

    /// Whether checkpoints carry draft hidden state (an auxiliary group): a restore then resumes drafting
    /// without replaying its last page (H5).
    pub(crate) fn carries_draft_state(&self) -> bool {
        self.auxiliary
    }

    /// Windowed groups (sliding window, chunked local).
    pub(crate) fn n_windows(&self) -> usize {
        self.windows.len()
    }

    /// The group index of windowed group `window`.
    pub(crate) fn window_group(&self, window: usize) -> u32 {
        self.windows[window]
    }

    /// The first block windowed group `window` still holds once `n_tokens` are computed: blocks before it
    /// left the window (null in its table, back in the pool).
    pub(crate) fn window_first_block(&self, window: usize, n_tokens: u32) -> u32 {
        let live = self
            .geometry
            .live_tokens(self.windows[window] as usize, n_tokens);
        live.start / self.geometry.block_tokens()
    }

    /// The first block of windowed group `window` a checkpoint at `n_tokens` holds: its live pages, none when
    /// nothing is live (a chunked-local group at a chunk boundary; `Geometry::live_pages` counts 0 pages).
    pub(crate) fn window_checkpoint_first_block(&self, window: usize, n_tokens: u32) -> u32 {
        let live = self
            .geometry
            .live_tokens(self.windows[window] as usize, n_tokens);
        if live.is_empty() {
            n_tokens.div_ceil(self.geometry.block_tokens())
        } else {
            live.start / self.geometry.block_tokens()
        }
    }

    /// Index of the full-attention group.
    pub(crate) fn full(&self) -> u32 {
        self.full
    }

    /// Fixed pages a request holds once it computes (0 without recurrent or auxiliary groups).
    pub(crate) fn n_fixed(&self) -> u32 {
        self.n_fixed
    }

    /// The group of each fixed page, in the order a request holds them.
    pub(crate) fn fixed_groups(&self) -> impl Iterator<Item = u32> + '_ {
        self.fixed
            .iter()
            .flat_map(|&(group, pages)| std::iter::repeat_n(group, pages as usize))
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
        let n_full = n_tokens / block_tokens;
        let n_pages = n_tokens.div_ceil(block_tokens);
        let full = (0..n_pages).map(|block| {
            let key_idx = (block < n_full).then_some(block);
            (
                PageSlot {
                    group: self.full,
                    key_idx,
                },
                Some(block),
            )
        });
        let windows = (0..self.windows.len()).flat_map(move |window| {
            let group = self.windows[window];
            (self.window_checkpoint_first_block(window, n_tokens)..n_pages).map(move |block| {
                (
                    PageSlot {
                        group,
                        key_idx: None,
                    },
                    Some(block),
                )
            })
        });
        let fixed = self.fixed_groups().map(|group| {
            (
                PageSlot {
                    group,
                    key_idx: None,
                },
                None,
            )
        });
        full.chain(windows).chain(fixed).collect()
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
        let (slots, blocks) = self.slots(n_tokens, block_tokens).into_iter().unzip();
        Boundary {
            slots,
            blocks,
            n_tokens,
            block_tokens,
            keys,
            exact: exact_prefix_key(tokens, keys, n_tokens, block_tokens, salt),
        }
    }
}

/// A checkpoint boundary of one request: its pages (`GroupPlan::slots`) and their contents.
#[derive(Debug)]
pub(crate) struct Boundary<'a> {
    /// The pages, in payload order.
    pub(crate) slots: Vec<PageSlot>,
    /// The block each page holds (`None` for a fixed page).
    blocks: Vec<Option<u32>>,
    n_tokens: u32,
    block_tokens: u32,
    keys: &'a [BlockKey],
    /// The exact prefix key of the boundary's tokens.
    pub(crate) exact: BlockKey,
}

impl Boundary<'_> {
    /// Whether page `slot_idx` holds what recompute writes at exactly the boundary (a partial last page or a
    /// fixed page), not a full block: such pages are written when a checkpoint is captured.
    pub(crate) fn is_partial(&self, slot_idx: usize) -> bool {
        self.blocks[slot_idx].is_none_or(|block| (block + 1) * self.block_tokens > self.n_tokens)
    }

    /// What recompute writes into page `slot_idx` on `rank` (the page being `page`): a full block what its
    /// block key says; the partial last page, the state and auxiliary pages what the exact boundary says.
    pub(crate) fn write(&self, slot_idx: usize, rank: u32, page: kv_pool::PageId) -> PageWrite {
        let slot = self.slots[slot_idx];
        let block_tokens = self.block_tokens;
        let (first_pos, prefix_key) = match self.blocks[slot_idx] {
            // A full block.
            Some(block) if !self.is_partial(slot_idx) => {
                (block * block_tokens, self.keys[block as usize])
            }
            // A partial last page: its tokens start at the last block boundary.
            Some(block) => (block * block_tokens, self.exact),
            // A fixed page: its position in the payload, past the boundary.
            None => (self.n_tokens + slot_idx as u32, self.exact),
        };
        PageWrite {
            group: slot.group,
            rank,
            page,
            first_pos,
            prefix_key,
        }
    }
}

/// The key of exactly the first `n_tokens` of `tokens` (`keys` are its full blocks' keys): the block key when
/// `n_tokens` ends a block, else the last full block's key chained with the partial block's tokens.
pub(crate) fn exact_prefix_key(
    tokens: &[u32],
    keys: &[BlockKey],
    n_tokens: u32,
    block_tokens: u32,
    salt: &[u8],
) -> BlockKey {
    let n_full = (n_tokens / block_tokens) as usize;
    let tail = &tokens[n_full * block_tokens as usize..n_tokens as usize];
    if tail.is_empty() && n_full > 0 {
        return keys[n_full - 1];
    }
    let parent = n_full.checked_sub(1).map(|idx| &keys[idx]);
    BlockKey::chain(parent, tail, salt)
}

/// The key under which a published `pages-only` import's unkeyed page `slot_idx` stays findable in the
/// prefix cache until its consumer is admitted (its state is valid at exactly the boundary `exact` names).
pub(crate) fn slot_key(exact: BlockKey, slot_idx: usize) -> BlockKey {
    BlockKey::chain(Some(&exact), &[slot_idx as u32], b"kvgate-checkpoint-slot")
}
