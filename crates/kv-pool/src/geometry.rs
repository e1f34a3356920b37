//! Cache-group geometry and the pure page arithmetic over it: how many pages a group needs (on one rank) to
//! hold a token range, the live physical window of sliding-window and chunked-local groups, partial pages
//! (copy-on-write), a checkpoint's pages, a continuation's execution credits and whether a need can ever fit a
//! pool. No state: every function is a pure function of the `Geometry` and its arguments.
//!
//! Context parallelism: the context is sharded over `context_parallel` ranks, token `i` lives on rank
//! `i % context_parallel`, and every rank has a pool of the same size. A page id names the same page on every
//! rank: page `b` of a group holds block `b`, tokens `[b * block_tokens, (b + 1) * block_tokens)` with
//! `block_tokens = tokens_per_page * context_parallel`, each rank its share. Every page count here is
//! therefore a count of blocks, the pages each rank's pool gives (allocation is symmetric: a rank that holds
//! no token of a block at a window's edge still holds its page id).

use std::ops::Range;

use crate::error::{Error, Result};

/// How the layers of one cache group use their pages. Checkpoint layouts carry it, so it is serialized.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum GroupKind {
    /// Full attention: every token of the context is kept.
    Full,
    /// Sliding-window attention: keeps the last `window_tokens` tokens plus `retained_tail_tokens` tokens before
    /// them; older positions become the null page.
    SlidingWindow {
        /// Tokens a query attends to.
        window_tokens: u32,
        /// Extra tokens kept before the window (0 for none).
        retained_tail_tokens: u32,
    },
    /// Chunked-local attention: attends within aligned chunks of `chunk_tokens` tokens; earlier chunks become
    /// the null page.
    ChunkedLocal {
        /// Tokens per aligned chunk.
        chunk_tokens: u32,
    },
    /// Recurrent state: one state page per live request and one per checkpoint, not per token.
    Recurrent,
    /// Draft / speculative / hidden-state pages: a fixed count per live request and per checkpoint.
    Auxiliary {
        /// Pages per request and per checkpoint.
        pages: u32,
    },
}

impl std::fmt::Display for GroupKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GroupKind::Full => write!(f, "full"),
            GroupKind::SlidingWindow {
                window_tokens,
                retained_tail_tokens,
            } => write!(f, "sliding({window_tokens}+{retained_tail_tokens})"),
            GroupKind::ChunkedLocal { chunk_tokens } => write!(f, "chunked({chunk_tokens})"),
            GroupKind::Recurrent => write!(f, "recurrent"),
            GroupKind::Auxiliary { pages } => write!(f, "auxiliary({pages})"),
        }
    }
}

impl GroupKind {
    /// Whether the group stores per-token attention state in pages (full, sliding window, chunked local).
    #[cfg(test)]
    pub(crate) fn is_attention(self) -> bool {
        matches!(
            self,
            GroupKind::Full | GroupKind::SlidingWindow { .. } | GroupKind::ChunkedLocal { .. }
        )
    }
}

/// Layers that share one page table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CacheGroup {
    /// How the group uses pages.
    pub kind: GroupKind,
    /// Bytes of one page of this group (all layers of the group together).
    pub bytes_per_page: u64,
}

/// A continuation to budget: a request whose first `prefix_tokens` tokens are restored (0 for a cold
/// request) and that computes the rest of its prompt `[prefix_tokens, prompt_tokens)` in prefill chunks of at
/// most `chunk_tokens` tokens, with `draft_lookahead_tokens` speculative slots written past the prompt, and
/// that may publish `captures` checkpoints on the way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Continuation {
    /// The restored boundary `n` (0 for a cold request).
    pub prefix_tokens: u32,
    /// The end of the prompt `L`; `prefix_tokens <= prompt_tokens`.
    pub prompt_tokens: u32,
    /// Largest prefill chunk, in tokens (at least 1). Credits also hold for every smaller chunk.
    pub chunk_tokens: u32,
    /// Draft (speculative) lookahead tokens written after the last computed token; 0 without draft decoding.
    pub draft_lookahead_tokens: u32,
    /// Checkpoints the request may publish during its continuation.
    pub captures: u32,
}

/// Pages a restore needs: the imported checkpoint pages and the execution credits of its continuation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RestoreNeed {
    /// Destination pages of the import (the checkpoint's pages).
    pub import_pages: u32,
    /// Execution credits: pages the consumer will still allocate until its prompt is computed.
    pub credit_pages: u32,
}

impl RestoreNeed {
    /// Import and credit pages together.
    pub fn total_pages(self) -> u32 {
        self.import_pages.saturating_add(self.credit_pages)
    }
}

/// The cache groups of a model, the page width in tokens, the context-parallel factor and the model's maximum
/// length. Validated once by [`Geometry::new`]; immutable afterwards.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Geometry {
    groups: Vec<CacheGroup>,
    tokens_per_page: u32,
    context_parallel: u32,
    max_model_len: u32,
}

impl Geometry {
    /// Validates and builds a geometry. Errors name the offending value and group index: zero
    /// `tokens_per_page`, `context_parallel`, `max_model_len`, no groups, a group with zero `bytes_per_page`,
    /// window, chunk or auxiliary pages, or a window, retained tail or chunk longer than `max_model_len`.
    pub fn new(
        groups: Vec<CacheGroup>,
        tokens_per_page: u32,
        context_parallel: u32,
        max_model_len: u32,
    ) -> Result<Geometry> {
        if tokens_per_page == 0 {
            return Err(Error::ZeroTokensPerPage);
        }
        if context_parallel == 0 {
            return Err(Error::ZeroContextParallel);
        }
        if max_model_len == 0 {
            return Err(Error::ZeroMaxModelLen);
        }
        if groups.is_empty() {
            return Err(Error::NoCacheGroups);
        }
        if tokens_per_page.checked_mul(context_parallel).is_none() {
            return Err(Error::BlockTooLarge {
                tokens_per_page,
                context_parallel,
                max: u32::MAX,
            });
        }
        for (group_idx, group) in groups.iter().enumerate() {
            if group.bytes_per_page == 0 {
                return Err(Error::ZeroBytesPerPage { group_idx });
            }
            match group.kind {
                GroupKind::SlidingWindow {
                    window_tokens,
                    retained_tail_tokens,
                } => {
                    if window_tokens == 0 {
                        return Err(Error::ZeroWindow { group_idx });
                    }
                    if window_tokens > max_model_len {
                        return Err(Error::WindowExceedsModelLen {
                            group_idx,
                            window_tokens,
                            max_model_len,
                        });
                    }
                    if retained_tail_tokens > max_model_len {
                        return Err(Error::TailExceedsModelLen {
                            group_idx,
                            window_tokens,
                            retained_tail_tokens,
                            max_model_len,
                        });
                    }
                }
                GroupKind::ChunkedLocal { chunk_tokens } => {
                    if chunk_tokens == 0 {
                        return Err(Error::ZeroChunk { group_idx });
                    }
                    if chunk_tokens > max_model_len {
                        return Err(Error::ChunkExceedsModelLen {
                            group_idx,
                            chunk_tokens,
                            max_model_len,
                        });
                    }
                }
                GroupKind::Auxiliary { pages: 0 } => {
                    return Err(Error::ZeroAuxiliaryPages { group_idx });
                }
                GroupKind::Full | GroupKind::Recurrent | GroupKind::Auxiliary { .. } => {}
            }
        }
        Ok(Geometry {
            groups,
            tokens_per_page,
            context_parallel,
            max_model_len,
        })
    }

    /// The cache groups, in order.
    pub fn groups(&self) -> &[CacheGroup] {
        &self.groups
    }

    /// Tokens per page (on one rank).
    pub fn tokens_per_page(&self) -> u32 {
        self.tokens_per_page
    }

    /// Ranks the context is sharded over.
    pub fn context_parallel(&self) -> u32 {
        self.context_parallel
    }

    /// Tokens of one block: `tokens_per_page * context_parallel`. Token `i` lives on rank
    /// `i % context_parallel`, so block `b` (tokens `[b * block_tokens, (b + 1) * block_tokens)`) is page `b` of
    /// every rank: a page id allocated once names that page on every rank, and a context of `n` tokens holds
    /// `n.div_ceil(block_tokens)` pages per rank (what `span_pages(0, n)` counts).
    pub fn block_tokens(&self) -> u32 {
        // `new` checked the product fits.
        self.tokens_per_page * self.context_parallel
    }

    /// The model's maximum length in tokens.
    pub fn max_model_len(&self) -> u32 {
        self.max_model_len
    }

    /// Pages (blocks, on every rank) touched by tokens `[start, end)` of a group that stores every token, a
    /// partial block at either end counted whole. Empty ranges need 0 pages.
    pub fn span_pages(&self, start: u32, end: u32) -> u32 {
        if end <= start {
            return 0;
        }
        let block = u64::from(self.block_tokens());
        (u64::from(end).div_ceil(block) - u64::from(start) / block) as u32
    }

    /// Pages group `group_idx` needs (per rank) to hold tokens `[start, end)` once `end` tokens are computed:
    /// a full group the whole span, a sliding/chunked group only the part of the span inside its live window
    /// at `end`, a recurrent group one state page and an auxiliary group its fixed pages (0 for an empty range).
    pub(crate) fn group_pages_for_tokens(&self, group_idx: usize, start: u32, end: u32) -> u32 {
        if end <= start {
            return 0;
        }
        match self.groups[group_idx].kind {
            GroupKind::Full => self.span_pages(start, end),
            GroupKind::SlidingWindow { .. } | GroupKind::ChunkedLocal { .. } => {
                let live_start = self.live_tokens(group_idx, end).start;
                self.span_pages(start.max(live_start), end)
            }
            GroupKind::Recurrent => 1,
            GroupKind::Auxiliary { pages } => pages,
        }
    }

    /// The live tokens of group `group_idx` once `n_tokens` are computed: what the next token may still attend
    /// to. Full: `[0, n)`; sliding window: the last `window + retained_tail` tokens; chunked local: the
    /// current aligned chunk `[n / chunk * chunk, n)`; recurrent and auxiliary groups keep no tokens (`n..n`).
    pub fn live_tokens(&self, group_idx: usize, n_tokens: u32) -> Range<u32> {
        match self.groups[group_idx].kind {
            GroupKind::Full => 0..n_tokens,
            GroupKind::SlidingWindow {
                window_tokens,
                retained_tail_tokens,
            } => {
                n_tokens.saturating_sub(window_tokens.saturating_add(retained_tail_tokens))
                    ..n_tokens
            }
            GroupKind::ChunkedLocal { chunk_tokens } => {
                n_tokens / chunk_tokens * chunk_tokens..n_tokens
            }
            GroupKind::Recurrent | GroupKind::Auxiliary { .. } => n_tokens..n_tokens,
        }
    }

    /// Physical pages (per rank) group `group_idx` holds once `n_tokens` are computed: the pages of its live
    /// tokens (partial pages counted whole; pages wholly before the window are the null page), one state page
    /// for a recurrent group and the fixed pages of an auxiliary group (0 when `n_tokens == 0`).
    pub fn live_pages(&self, group_idx: usize, n_tokens: u32) -> u32 {
        self.group_pages_for_tokens(group_idx, 0, n_tokens)
    }

    /// Whether a prefix of `n_tokens` ends inside a page on some rank, so that continuing from it needs a
    /// copy-on-write of that partial page.
    pub fn ends_inside_page(&self, n_tokens: u32) -> bool {
        !n_tokens.is_multiple_of(self.block_tokens())
    }

    /// Pages (per rank) of a checkpoint at boundary `n_tokens`: the live pages of every group.
    pub fn checkpoint_pages(&self, n_tokens: u32) -> u32 {
        (0..self.groups.len())
            .map(|group_idx| self.live_pages(group_idx, n_tokens))
            .fold(0, u32::saturating_add)
    }

    /// Pages one capture (a checkpoint published during a continuation) costs: one per group (the copied
    /// partial attention page or the recurrent state snapshot) plus the auxiliary pages.
    pub fn capture_pages(&self) -> u32 {
        self.groups
            .iter()
            .map(|group| match group.kind {
                GroupKind::Auxiliary { pages } => pages,
                _ => 1,
            })
            .fold(0, u32::saturating_add)
    }

    /// Execution pages (per rank) group `group_idx` still allocates for `continuation`, captures excluded.
    ///
    /// - Full: the pages of `[n, L + draft)`; a prefix ending inside a page counts that page (its
    ///   copy-on-write).
    /// - Sliding window / chunked local: only the live physical window at its peak while a chunk is computed,
    ///   bounded for any chunk up to `chunk_tokens` and any alignment, never above the full span.
    /// - Both: plus the replay page when the prefix ends on a page boundary with draft decoding on.
    /// - Recurrent: one private state page. Auxiliary: its fixed pages for the live request.
    ///
    /// Imported read-only history is not duplicated. Preconditions (validated by callers): `n <= L`,
    /// `chunk_tokens >= 1`.
    pub fn group_continuation_pages(&self, group_idx: usize, continuation: &Continuation) -> u32 {
        let prefix = continuation.prefix_tokens;
        let end = continuation
            .prompt_tokens
            .saturating_add(continuation.draft_lookahead_tokens);
        match self.groups[group_idx].kind {
            GroupKind::Full => self
                .span_pages(prefix, end)
                .saturating_add(self.replay_pages(continuation)),
            GroupKind::SlidingWindow {
                window_tokens,
                retained_tail_tokens,
            } => {
                let behind = u64::from(window_tokens) + u64::from(retained_tail_tokens);
                self.window_peak_pages(continuation, behind)
                    .saturating_add(self.replay_pages(continuation))
            }
            GroupKind::ChunkedLocal { chunk_tokens } => {
                let behind = u64::from(chunk_tokens) - 1;
                self.window_peak_pages(continuation, behind)
                    .saturating_add(self.replay_pages(continuation))
            }
            GroupKind::Recurrent => 1,
            GroupKind::Auxiliary { pages } => pages,
        }
    }

    /// Execution credits (per rank) of `continuation` (contract C1-C4): every group's continuation pages plus
    /// `captures` times [`Geometry::capture_pages`].
    pub fn continuation_pages(&self, continuation: &Continuation) -> u32 {
        (0..self.groups.len())
            .map(|group_idx| self.group_continuation_pages(group_idx, continuation))
            .fold(0, u32::saturating_add)
            .saturating_add(continuation.captures.saturating_mul(self.capture_pages()))
    }

    /// What a restore of the checkpoint at `continuation.prefix_tokens` needs: its import pages and the
    /// credits of its continuation.
    pub fn restore_need(&self, continuation: &Continuation) -> RestoreNeed {
        RestoreNeed {
            import_pages: self.checkpoint_pages(continuation.prefix_tokens),
            credit_pages: self.continuation_pages(continuation),
        }
    }

    /// Pages (per rank) a cold request of `prompt_tokens` needs at its peak, computing its prompt in chunks of
    /// at most `chunk_tokens` with `draft_lookahead_tokens` speculative slots.
    pub fn request_peak_pages(
        &self,
        prompt_tokens: u32,
        chunk_tokens: u32,
        draft_lookahead_tokens: u32,
    ) -> u32 {
        self.continuation_pages(&Continuation {
            prefix_tokens: 0,
            prompt_tokens,
            chunk_tokens,
            draft_lookahead_tokens,
            captures: 0,
        })
    }

    /// Whether a need of `need_pages` can ever fit a pool of `usable_pages` (the null page excluded). `false`
    /// is impossible geometry: waiting cannot help, the request must recompute or be refused.
    pub fn fits_empty_pool(need_pages: u32, usable_pages: u32) -> bool {
        need_pages <= usable_pages
    }

    /// Most blocks `n_tokens` contiguous tokens can touch, at any alignment.
    fn worst_pages(&self, n_tokens: u64) -> u64 {
        if n_tokens == 0 {
            return 0;
        }
        (n_tokens - 1).div_ceil(u64::from(self.block_tokens())) + 1
    }

    /// Peak pages of a windowed group whose live range reaches `behind` tokens before the current position:
    /// while a chunk `[s, s + chunk)` is computed the group holds `[max(s - behind, n), s + chunk + draft)`.
    fn window_peak_pages(&self, continuation: &Continuation, behind: u64) -> u32 {
        let prefix = continuation.prefix_tokens;
        let end = continuation
            .prompt_tokens
            .saturating_add(continuation.draft_lookahead_tokens);
        let full = self.span_pages(prefix, end);
        let held_tokens = behind
            + u64::from(continuation.chunk_tokens)
            + u64::from(continuation.draft_lookahead_tokens);
        let held_tokens = held_tokens.min(u64::from(end.saturating_sub(prefix)));
        let bound = self.worst_pages(held_tokens).min(u64::from(u32::MAX)) as u32;
        full.min(bound)
    }

    /// The replay page per attention group: a non-empty prefix that ends on a block boundary with draft
    /// decoding on replays the last page (inside a block, the partial page's copy on write holds the replay).
    fn replay_pages(&self, continuation: &Continuation) -> u32 {
        let prefix = continuation.prefix_tokens;
        if continuation.draft_lookahead_tokens == 0 || prefix == 0 {
            return 0;
        }
        u32::from(prefix.is_multiple_of(self.block_tokens()))
    }
}

#[cfg(test)]
mod tests;
