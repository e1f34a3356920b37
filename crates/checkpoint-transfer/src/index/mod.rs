//! The resident checkpoint index: imports of checkpoints into pool pages.
//! Sans-IO: it takes `&mut PagePool` and the copy engine in every call, and the engine polls it at step
//! boundaries. An import owns its destination pages by one pool reference each from staging on; it
//! registers its block keys only when the last rank acknowledges (O1, O2), keeps its references while
//! ready (O3), hands the pages to the consumer through the prefix-hit path (O4) and never frees a page
//! while a copy into it is outstanding (O5, O7).
//!
//! Page ownership: `stage` allocates the destination pages itself (the import holds the allocation's
//! reference). `stage_into` copies into pages the caller already holds, for example the destination pages
//! of a reservation ticket (`reservation::Ledger::reserve` takes pages, slot and credits together, R1): the
//! index takes its own reference on each (`PagePool::touch`), so every holder drops only its own. The ticket
//! keeps one reference until `Ledger::admit` / `release`, the index one until `acquire` (the consumer then
//! holds the prefix hits), `cancel` of a ready import, or the drain of a cancelled or failed copy. Because
//! the index's reference alone pins the pages while a copy may write into them, a caller may drop its own
//! reference at once when it cancels (the ledger's drain set can be settled immediately).
//!
//! Layout: this file holds `ResidentIndex`, its imports and the read-only queries; `stage.rs` validates
//! input and submits an import's copies; `publication.rs` applies copy completions (publish, refuse,
//! discard); `acquire.rs` takes imports out (`acquire`, `cancel`, `clear`); `invariants.rs` holds
//! `check_invariants`; `types.rs` the vocabulary. The engine captures checkpoints itself, reading pool
//! storage, never through the index.
//!
//! Architecture Invariant: the index knows nothing of slots or credits; the engine glues it to the ledger.

mod acquire;
mod invariants;
mod publication;
mod stage;
mod types;

use std::collections::BTreeMap;
use std::sync::Arc;

use foldhash::HashMap;
use kv_pool::RequestId;
use kv_pool::{BlockKey, PageId, PagePool};

#[cfg(test)]
pub(crate) use types::LookupBudget;
pub use types::{
    AcquiredImport, CancelOutcome, ImportEvent, ImportId, ImportState, RESTORE_LOOKUPS_MAX,
    StageRequest,
};

use crate::checkpoint::{CheckpointMeta, PrefixQuery};
use crate::copy::CopyJobId;
use crate::layout::LayoutDescriptor;

#[derive(Debug)]
struct Import {
    request: RequestId,
    meta: Arc<CheckpointMeta>,
    /// Destination pages in checkpoint order; the import holds one reference on each.
    pages: Vec<PageId>,
    dependency_pages: Vec<PageId>,
    /// Submitted copies whose completion has not been observed.
    jobs: Vec<CopyJobId>,
    acknowledged: Vec<bool>,
    state: ImportState,
    invalidated: Option<PageId>,
    failure: Option<(u32, String)>,
}

impl Import {
    /// `(page position, key)` of the keyed pages, in key order.
    fn keyed_pages(&self) -> impl Iterator<Item = (usize, BlockKey)> + '_ {
        self.meta
            .pages
            .iter()
            .enumerate()
            .filter_map(|(pos, slot)| {
                slot.key_idx
                    .map(|key_idx| (pos, self.meta.block_keys[key_idx as usize]))
            })
    }
}

/// Imports in flight or ready, by request.
#[derive(Debug)]
pub struct ResidentIndex {
    layout: LayoutDescriptor,
    imports: BTreeMap<ImportId, Import>,
    by_request: HashMap<RequestId, ImportId>,
    by_job: HashMap<CopyJobId, ImportId>,
    page_owner: HashMap<PageId, ImportId>,
    next_import: u64,
}

impl ResidentIndex {
    /// An empty index for a pool with `layout` (the engine fills it from its geometry).
    pub fn new(layout: LayoutDescriptor) -> Self {
        Self {
            layout,
            imports: BTreeMap::new(),
            by_request: HashMap::default(),
            by_job: HashMap::default(),
            page_owner: HashMap::default(),
            next_import: 0,
        }
    }

    /// The pool layout checkpoints must match.
    pub fn layout(&self) -> &LayoutDescriptor {
        &self.layout
    }

    /// The longest ready import whose checkpoint is a prefix of the query's request, with its consumer.
    pub fn find_longest(
        &self,
        query: &PrefixQuery<'_>,
    ) -> Option<(RequestId, Arc<CheckpointMeta>)> {
        self.imports
            .values()
            .filter(|import| {
                import.state == ImportState::Published && import.meta.is_prefix_of(query)
            })
            .max_by_key(|import| import.meta.n_tokens)
            .map(|import| (import.request, Arc::clone(&import.meta)))
    }

    /// State of the request's import, if it has one.
    pub fn state(&self, request: RequestId) -> Option<ImportState> {
        let import_id = self.by_request.get(&request)?;
        self.imports.get(import_id).map(|import| import.state)
    }

    /// Whether the request's import is published and not yet acquired.
    #[cfg(test)]
    pub(crate) fn is_ready(&self, request: RequestId) -> bool {
        self.state(request) == Some(ImportState::Published)
    }

    /// The request's import's destination pages, in checkpoint order.
    pub fn pages(&self, request: RequestId) -> Option<&[PageId]> {
        let import_id = self.by_request.get(&request)?;
        self.imports.get(import_id).map(|import| &import.pages[..])
    }

    /// Every page the index holds a reference on (destination pages of imports, draining ones included),
    /// each once per holding import.
    pub fn held_pages(&self) -> impl Iterator<Item = PageId> + '_ {
        self.imports
            .values()
            .flat_map(|import| import.pages.iter())
            .copied()
    }

    /// Imports still copying, cancelled or failed ones that are draining included.
    pub fn n_staged(&self) -> usize {
        self.imports
            .values()
            .filter(|import| import.state != ImportState::Published)
            .count()
    }

    /// Ready imports (published, owned, not yet acquired).
    pub(crate) fn n_owned(&self) -> usize {
        self.imports
            .values()
            .filter(|import| import.state == ImportState::Published)
            .count()
    }

    /// Pages the index holds a reference on (its imports' destination pages).
    pub fn n_pages_held(&self) -> usize {
        self.imports.values().map(|import| import.pages.len()).sum()
    }

    /// Removes `import_id` and its index entries; `None` when the index holds no such import.
    fn remove_import(&mut self, import_id: ImportId) -> Option<Import> {
        let import = self.imports.remove(&import_id)?;
        if self.by_request.get(&import.request) == Some(&import_id) {
            self.by_request.remove(&import.request);
        }
        for page in &import.pages {
            self.page_owner.remove(page);
        }
        for job in &import.jobs {
            self.by_job.remove(job);
        }
        Some(import)
    }
}

/// Drops one reference the index holds; a failure is a bookkeeping bug.
fn release_page(pool: &mut PagePool, page: PageId) {
    let freed = pool.free(page);
    debug_assert!(freed.is_ok(), "release of page {page:?}: {freed:?}");
}

#[cfg(test)]
mod tests;
