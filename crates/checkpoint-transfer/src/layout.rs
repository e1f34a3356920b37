//! `LayoutDescriptor`: the compact, serializable description of the pool layout a checkpoint was written for
//! (cache group kinds in order, page width, tokens per page, ranks). The engine fills it from kv-pool's
//! `Geometry`; manifests carry it so a checkpoint written for another layout is never restored (G6, R4).

use kv_pool::GroupKind;
use serde::{Deserialize, Serialize};

use crate::error::Mismatch;

/// The layout a checkpoint's pages were written for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LayoutDescriptor {
    /// Cache group kinds, in the pool's group order.
    pub groups: Vec<GroupKind>,
    /// Bytes of one page on one rank.
    pub bytes_per_page: u64,
    /// Tokens one page id holds: on one rank, its page's tokens; with context parallelism (token `i` on rank
    /// `i % n_ranks`), the tokens of the page on every rank together (a block). The unit of block keys and
    /// prefix matches.
    pub tokens_per_page: u32,
    /// Ranks the context is sharded over.
    pub n_ranks: u32,
}

impl LayoutDescriptor {
    /// One full-attention group: the simplest layout, used by tests and the simulator's default.
    pub fn single_full(bytes_per_page: u64, tokens_per_page: u32, n_ranks: u32) -> Self {
        Self {
            groups: vec![GroupKind::Full],
            bytes_per_page,
            tokens_per_page,
            n_ranks,
        }
    }

    /// Whether every group keeps per-token attention state in pages (full, sliding window, chunked local):
    /// then the first `k` full blocks of a longer checkpoint are a checkpoint at `k * tokens_per_page` of their
    /// own (`CheckpointMeta::restores_block_prefix`), as LMCache matches chunks. A recurrent group's state and
    /// an auxiliary group's pages (draft, hidden state) are valid only at exactly the boundary they were taken
    /// at, so a layout with one must restore whole checkpoints (`CheckpointStore::find_longest`).
    #[cfg(test)]
    pub(crate) fn is_attention_only(&self) -> bool {
        self.groups.iter().all(|kind| {
            matches!(
                kind,
                GroupKind::Full | GroupKind::SlidingWindow { .. } | GroupKind::ChunkedLocal { .. }
            )
        })
    }

    /// `Ok` when a checkpoint written for `self` can be restored into an engine with layout `engine`;
    /// otherwise the first difference, in the order ranks, groups, page width, tokens per page.
    pub(crate) fn check_matches(&self, engine: &LayoutDescriptor) -> Result<(), Mismatch> {
        if self.n_ranks != engine.n_ranks {
            return Err(Mismatch::Ranks {
                expected: engine.n_ranks,
                found: self.n_ranks,
            });
        }
        if self.groups != engine.groups {
            return Err(Mismatch::Groups {
                expected: groups_to_string(&engine.groups),
                found: groups_to_string(&self.groups),
            });
        }
        if self.bytes_per_page != engine.bytes_per_page {
            return Err(Mismatch::PageWidth {
                expected: engine.bytes_per_page,
                found: self.bytes_per_page,
            });
        }
        if self.tokens_per_page != engine.tokens_per_page {
            return Err(Mismatch::TokensPerPage {
                expected: engine.tokens_per_page,
                found: self.tokens_per_page,
            });
        }
        Ok(())
    }
}

pub(crate) fn groups_to_string(groups: &[GroupKind]) -> String {
    let names: Vec<String> = groups.iter().map(ToString::to_string).collect();
    format!("[{}]", names.join(", "))
}
