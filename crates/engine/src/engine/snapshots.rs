//! Local prefix hits of a hybrid model (H9, H10), after vLLM's hybrid KV cache manager: a windowed group keeps
//! the blocks still inside its window, a recurrent (or auxiliary) group keeps its state at the boundary it was
//! taken at, and a hit is the longest prefix for which every group has what it needs.
//!
//! When a hybrid request finishes, its pages at exactly its computed tokens `n` (the boundary of its response
//! checkpoint) become a *snapshot*: its full-attention blocks stay cached under their block keys as always,
//! its windows' live full blocks are cached under `window_block_key` (shared by every snapshot holding the
//! block), and its partial last pages and its fixed pages (state, auxiliary) under the slot keys of the exact
//! boundary (`slot_key`). No page is copied: the finished request hands its pages to the prefix cache. Blocks
//! of full attention and of the windows are cached blocks like any other; the pages valid at the exact
//! boundary alone (partial last pages, state) are the snapshots' own, at most
//! `EngineParams::state_snapshot_pages` of them keyed: past it, the oldest snapshots lose those keys. All are
//! free cached pages, evicted by the pool like any other.
//!
//! A later request whose prompt starts with a snapshot's exact boundary (the exact prefix key, salt
//! included) gets a local hit there when every page of the boundary is still cached; one page evicted and the
//! snapshot is a miss, never a partial or wrong hit (H10). The hit is admitted like a published import: the
//! request takes the pages and copies its partial pages and state on its first allocation (H6).

use std::collections::VecDeque;

use kv_pool::{BlockKey, PageId, RequestId};

use super::Engine;
use super::groups::{exact_prefix_key, slot_key, window_block_key};
use crate::error::Result;
use crate::executor::Executor;

/// The local snapshots of a hybrid engine, oldest first, and the pages they keyed.
#[derive(Debug, Default)]
pub(crate) struct Snapshots {
    held: VecDeque<Snapshot>,
    /// Pages keyed by the snapshots held (each counts at least 1).
    pages: u32,
}

impl Snapshots {
    /// Pages the snapshots hold keyed, as the budget counts them.
    pub(crate) fn pages(&self) -> u32 {
        self.pages
    }

    /// Pages the snapshots keyed that still hold their key (the pool evicts some): at most `pages`.
    pub(crate) fn keyed_pages(&self, pool: &kv_pool::PagePool) -> u32 {
        self.held
            .iter()
            .flat_map(|snapshot| &snapshot.owned)
            .filter(|(page, key)| pool.key_of(*page).ok().flatten() == Some(*key))
            .count() as u32
    }

    /// Forgets every snapshot (the prefix cache was reset).
    pub(crate) fn clear(&mut self) {
        self.held.clear();
        self.pages = 0;
    }
}

/// One boundary a finished request left in the prefix cache.
#[derive(Debug)]
struct Snapshot {
    /// Its exact boundary.
    n_tokens: u32,
    /// The exact prefix key of its first `n_tokens` tokens (salt included).
    exact: BlockKey,
    /// The key of its last full block, if any: a prompt whose block there differs cannot hold the boundary,
    /// found without hashing the prompt's tail.
    last_block: Option<BlockKey>,
    /// The key each page of the boundary is found under, in `GroupCoordinator::slots` order.
    keys: Vec<BlockKey>,
    /// The pages valid at its exact boundary alone (partial last pages, state) that it keyed itself, with
    /// their key: they lose it when it is dropped.
    owned: Vec<(PageId, BlockKey)>,
}

impl Snapshot {
    /// Pages it counts against the budget.
    fn cost(&self) -> u32 {
        (self.owned.len() as u32).max(1)
    }
}

impl<E: Executor> Engine<E> {
    /// Leaves `request`'s pages at its computed tokens in the prefix cache as a snapshot (see the module), before
    /// its pages are freed at its finish. Nothing on a full-attention model, with a budget of 0, or when its
    /// tables do not hold the whole boundary as its own (a restored partial page or state not yet copied on
    /// write, a copy still landing).
    pub(crate) fn snapshot_on_finish(&mut self, request: RequestId) -> Result<()> {
        if self.params.state_snapshot_pages == 0 || !self.groups.restores_at_exact_boundaries() {
            return Ok(());
        }
        let block_tokens = self.params.geometry.block_tokens();
        let Some(n_tokens) = self.snapshot_boundary(request)? else {
            return Ok(());
        };
        self.register_blocks(request)?;
        let pages = self.boundary_pages(request, n_tokens)?;
        let req = self.table.get(request)?;
        let boundary = self.groups.boundary(
            req.tokens.get(request)?,
            &req.keys,
            &req.spec.salt,
            n_tokens,
            block_tokens,
        );
        let exact = boundary.exact;
        let full = self.groups.full();
        let mut keys = Vec::with_capacity(pages.len());
        let mut owned = Vec::new();
        for (slot_idx, (slot, &page)) in boundary.slots.iter().zip(&pages).enumerate() {
            // The partial pages and the fixed pages hold what recompute writes at exactly `n` (as a capture
            // writes them); a full block was written when computed.
            if boundary.is_partial(slot_idx) && self.fills_pages() {
                for rank in 0..self.storage.n_ranks() {
                    let write = boundary.write(slot_idx, rank, page);
                    self.executor.fill_page(&write, &mut self.scratch.page_buf);
                    self.storage.write(rank, page, &self.scratch.page_buf)?;
                }
            }
            // A window's full block is a cached block like full attention's; the rest is the snapshot's own.
            let (key, own) = match (slot.key_idx, boundary.block(slot_idx)) {
                // A full-attention block: cached under its block key when computed.
                (Some(key_idx), _) => {
                    keys.push(req.keys[key_idx as usize]);
                    continue;
                }
                (None, Some(block)) if slot.group != full && !boundary.is_partial(slot_idx) => (
                    window_block_key(slot.group, req.keys[block as usize]),
                    false,
                ),
                _ => (slot_key(exact, slot_idx), true),
            };
            match self.pool.key_of(page)? {
                // Cached already (a window block an earlier snapshot or publication keyed): found under that.
                Some(held) => keys.push(held),
                None => {
                    // `false`: another page caches the key, with the same bytes; ours is freed with the rest.
                    if self.pool.cache_block(page, key)? && own {
                        owned.push((page, key));
                    }
                    keys.push(key);
                }
            }
        }
        let last_block = (n_tokens / block_tokens)
            .checked_sub(1)
            .map(|block| req.keys[block as usize]);
        let snapshot = Snapshot {
            n_tokens,
            exact,
            last_block,
            keys,
            owned,
        };
        self.snapshots.pages += snapshot.cost();
        self.snapshots.held.push_back(snapshot);
        self.keep_snapshots_within_budget()?;
        self.absorb_prefix_changes(&mut [(request, 0)]);
        Ok(())
    }

    /// Drops the oldest snapshots until they count no more than their budget: their own pages lose their key
    /// (a page some later owner keyed again keeps it), back among the uncached free pages; their blocks stay
    /// cached (H10).
    fn keep_snapshots_within_budget(&mut self) -> Result<()> {
        while self.snapshots.pages > self.params.state_snapshot_pages {
            let Some(oldest) = self.snapshots.held.pop_front() else {
                break;
            };
            self.snapshots.pages -= oldest.cost();
            for (page, key) in oldest.owned {
                if self.pool.key_of(page)? == Some(key) {
                    let _dropped = self.pool.uncache(page)?;
                }
            }
        }
        Ok(())
    }

    /// The boundary finishing `request` leaves as a snapshot, its computed tokens, when its tables hold every page
    /// of it as its own; `None` otherwise.
    fn snapshot_boundary(&self, request: RequestId) -> Result<Option<u32>> {
        let req = self.table.get(request)?;
        let whole = !req.copy_on_write
            && req.loading().is_none()
            && self.tables_hold_computed_boundary(req);
        Ok(whole.then_some(req.n_computed))
    }

    /// The longest snapshot boundary waiting hybrid `request` starts with, short of its last prompt token, whose
    /// every page is still cached: its tokens and its pages (`GroupCoordinator::slots` order). Does not touch
    /// them. `None` when there is none (H9, H10).
    pub(crate) fn snapshot_hit(&self, request: RequestId) -> Result<Option<(u32, Vec<PageId>)>> {
        if self.snapshots.held.is_empty() || !self.groups.restores_at_exact_boundaries() {
            return Ok(None);
        }
        let block_tokens = self.params.geometry.block_tokens();
        let req = self.table.get(request)?;
        let limit = self
            .restorable_tokens(request)?
            .min((req.tokens.len() as u32).saturating_sub(1));
        let tokens = req.tokens.get(request)?;
        let mut best: Option<(u32, Vec<PageId>)> = None;
        for snapshot in &self.snapshots.held {
            let n_tokens = snapshot.n_tokens;
            if n_tokens > limit || best.as_ref().is_some_and(|(at, _)| *at >= n_tokens) {
                continue;
            }
            let last_block = (n_tokens / block_tokens)
                .checked_sub(1)
                .map(|block| req.keys[block as usize]);
            if last_block != snapshot.last_block {
                continue;
            }
            let exact = exact_prefix_key(tokens, &req.keys, n_tokens, block_tokens, &req.spec.salt);
            if exact != snapshot.exact {
                continue;
            }
            let pages: Option<Vec<PageId>> = snapshot
                .keys
                .iter()
                .map(|key| self.pool.lookup(key))
                .collect();
            if let Some(pages) = pages {
                best = Some((n_tokens, pages));
            }
        }
        Ok(best)
    }

    /// Tokens of `request`'s restorable prefix the local prefix cache serves now: whole blocks every group holds
    /// (full attention), or the longest snapshot boundary (hybrid, H9).
    pub(crate) fn local_hit_tokens(&self, request: RequestId, restorable: u32) -> Result<u32> {
        if self.groups.restores_at_exact_boundaries() {
            return Ok(self
                .snapshot_hit(request)?
                .map_or(0, |(tokens, _)| tokens.min(restorable)));
        }
        let block_tokens = self.params.geometry.block_tokens();
        let req = self.table.get(request)?;
        let blocks = self
            .groups
            .local_hit(
                &self.pool,
                &req.keys[..(restorable / block_tokens) as usize],
            )
            .len() as u32;
        Ok(blocks * block_tokens)
    }
}
