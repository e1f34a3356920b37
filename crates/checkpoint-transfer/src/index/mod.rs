//! The resident checkpoint index: imports of checkpoints into pool pages and captures out of them.
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
//! Architecture Invariant: the index knows nothing of slots or credits; the engine glues it to the ledger.

mod capture;
mod types;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use kv_pool::{BlockKey, Eviction, PageId, PagePool};
use reservation::{RequestId, Timestamp};

pub use types::{
    AcquiredImport, CancelOutcome, CaptureId, ImportEvent, ImportId, ImportState, LookupBudget,
    RESTORE_LOOKUPS_MAX, StageRequest,
};

use crate::checkpoint::{CheckpointMeta, PrefixQuery};
use crate::copy::{CopyCompletion, CopyEngine, CopyJob, CopyJobId, CopyOutcome, CopyWork};
use crate::error::{Error, Invalid, Result};
use crate::layout::LayoutDescriptor;
use capture::CaptureState;

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

/// Imports and captures in flight or ready, by request.
#[derive(Debug)]
pub struct ResidentIndex {
    layout: LayoutDescriptor,
    imports: BTreeMap<ImportId, Import>,
    by_request: HashMap<RequestId, ImportId>,
    by_job: HashMap<CopyJobId, ImportId>,
    page_owner: HashMap<PageId, ImportId>,
    captures: BTreeMap<CaptureId, CaptureState>,
    capture_by_job: HashMap<CopyJobId, CaptureId>,
    next_import: u64,
    next_capture: u64,
}

impl ResidentIndex {
    /// An empty index for a pool with `layout` (the engine fills it from its geometry).
    pub fn new(layout: LayoutDescriptor) -> Self {
        Self {
            layout,
            imports: BTreeMap::new(),
            by_request: HashMap::new(),
            by_job: HashMap::new(),
            page_owner: HashMap::new(),
            captures: BTreeMap::new(),
            capture_by_job: HashMap::new(),
            next_import: 0,
            next_capture: 0,
        }
    }

    /// The pool layout checkpoints must match.
    pub fn layout(&self) -> &LayoutDescriptor {
        &self.layout
    }

    /// Validates the input, allocates one destination page per checkpoint page (reference count 1, owned
    /// by the import) and submits one restore copy per rank. Invalid input changes nothing (R4); pool
    /// pressure is `Error::Pool(OutOfPages)`. The import is staged: not a cache hit until published (O1).
    pub fn stage(
        &mut self,
        pool: &mut PagePool,
        copies: &mut dyn CopyEngine,
        now: Timestamp,
        stage: StageRequest<'_>,
    ) -> Result<ImportId> {
        self.validate(pool, &stage)?;
        let pages = pool.allocate(stage.checkpoint.meta.pages.len() as u32)?;
        self.submit_import(pool, copies, now, &stage, pages)
    }

    /// `stage` into `pages` the caller already holds (one per checkpoint page, in checkpoint order, each
    /// with a reference of the caller's, for example a reservation ticket's destination pages). The index
    /// takes its own reference on each page (see the module doc); the caller keeps and later drops its
    /// own. Invalid input, `Invalid::Destination` included (a page free, listed twice or already an
    /// import's destination; `PayloadShape` for the wrong number of pages), changes nothing (R4).
    pub fn stage_into(
        &mut self,
        pool: &mut PagePool,
        copies: &mut dyn CopyEngine,
        now: Timestamp,
        stage: StageRequest<'_>,
        pages: Vec<PageId>,
    ) -> Result<ImportId> {
        self.validate(pool, &stage)?;
        self.validate_destination(pool, &stage, &pages)?;
        for &page in &pages {
            pool.touch(page)?;
        }
        self.submit_import(pool, copies, now, &stage, pages)
    }

    /// Records a validated import into `pages` (each holding one reference of the index) and submits one
    /// restore copy per rank.
    fn submit_import(
        &mut self,
        pool: &mut PagePool,
        copies: &mut dyn CopyEngine,
        now: Timestamp,
        stage: &StageRequest<'_>,
        pages: Vec<PageId>,
    ) -> Result<ImportId> {
        let meta = &stage.checkpoint.meta;
        let import_id = ImportId(self.next_import);
        self.next_import += 1;
        let n_ranks = meta.layout.n_ranks as usize;
        let mut import = Import {
            request: stage.request,
            meta: Arc::new(meta.clone()),
            pages,
            dependency_pages: stage.dependency_pages.to_vec(),
            jobs: Vec::with_capacity(n_ranks),
            acknowledged: vec![false; n_ranks],
            state: ImportState::Staged,
            invalidated: None,
            failure: None,
        };
        let mut submit_error = None;
        for (rank, rank_pages) in stage.checkpoint.payload.ranks.iter().enumerate() {
            let job = CopyJob {
                rank: rank as u32,
                work: CopyWork::Restore {
                    pages: rank_pages
                        .iter()
                        .cloned()
                        .zip(import.pages.iter().copied())
                        .collect(),
                },
            };
            match copies.submit(job, now) {
                Ok(job_id) => {
                    import.jobs.push(job_id);
                    self.by_job.insert(job_id, import_id);
                }
                Err(err) => {
                    submit_error = Some(err);
                    break;
                }
            }
        }
        for &page in &import.pages {
            self.page_owner.insert(page, import_id);
        }
        if let Some(err) = submit_error {
            // Copies already submitted may write into the pages: drain them, then discard (O5).
            for &job in &import.jobs {
                copies.cancel(job);
            }
            import.state = ImportState::Cancelled;
            self.imports.insert(import_id, import);
            let _no_event = self.settle(pool, import_id);
            return Err(err);
        }
        self.by_request.insert(stage.request, import_id);
        self.imports.insert(import_id, import);
        Ok(import_id)
    }

    /// Polls the copy engine at `now` and applies its completions.
    pub fn poll(
        &mut self,
        pool: &mut PagePool,
        copies: &mut dyn CopyEngine,
        now: Timestamp,
    ) -> Vec<ImportEvent> {
        let completions = copies.poll(now);
        self.apply_completions(pool, copies, completions)
    }

    /// Waits for every copy in flight (`CopyEngine::wait_all`) and applies the completions.
    pub fn drain_all(
        &mut self,
        pool: &mut PagePool,
        copies: &mut dyn CopyEngine,
    ) -> Vec<ImportEvent> {
        let completions = copies.wait_all();
        self.apply_completions(pool, copies, completions)
    }

    /// Applies copy completions: a finished restore job is its rank's acknowledgement; the last one
    /// publishes (O2); a failure discards after the other ranks drain (O7); a cancelled import is discarded
    /// once drained (O5). Completions of jobs the index does not know are ignored.
    pub fn apply_completions(
        &mut self,
        pool: &mut PagePool,
        copies: &mut dyn CopyEngine,
        completions: Vec<CopyCompletion>,
    ) -> Vec<ImportEvent> {
        let mut events = Vec::new();
        for completion in completions {
            if let Some(capture_id) = self.capture_by_job.remove(&completion.job) {
                events.extend(self.apply_capture_completion(pool, copies, capture_id, completion));
                continue;
            }
            let Some(import_id) = self.by_job.remove(&completion.job) else {
                continue;
            };
            let Some(import) = self.imports.get_mut(&import_id) else {
                debug_assert!(false, "job of a missing import");
                continue;
            };
            import.jobs.retain(|job| *job != completion.job);
            if import.invalidated.is_none() {
                import.invalidated = completion.invalidated.first().copied();
            }
            match completion.outcome {
                CopyOutcome::Done { .. } => {
                    if import.state == ImportState::Staged {
                        import.acknowledged[completion.rank as usize] = true;
                        events.push(ImportEvent::Acknowledged {
                            request: import.request,
                            import: import_id,
                            rank: completion.rank,
                        });
                    }
                }
                CopyOutcome::Failed { reason } => {
                    if import.failure.is_none() {
                        import.failure = Some((completion.rank, reason));
                    }
                    if import.state == ImportState::Staged {
                        import.state = ImportState::Failed;
                        // The other ranks' copies are useless now: stop them early; they still drain.
                        for &job in &import.jobs {
                            copies.cancel(job);
                        }
                    }
                }
                CopyOutcome::Cancelled => {}
            }
            events.extend(self.settle(pool, import_id));
        }
        events
    }

    /// Invalidates pool pages (an eviction, a forced uncache, a fault): a staged import holding one (as
    /// destination or dependency) will not be published (O2); a ready import holding one is released at
    /// once and reported `Invalidated`.
    pub fn invalidate_pages(&mut self, pool: &mut PagePool, pages: &[PageId]) -> Vec<ImportEvent> {
        let mut events = Vec::new();
        for &page in pages {
            let mut hit: Vec<ImportId> = self.page_owner.get(&page).copied().into_iter().collect();
            hit.extend(
                self.imports
                    .iter()
                    .filter(|(_, import)| import.dependency_pages.contains(&page))
                    .map(|(id, _)| *id),
            );
            for import_id in hit {
                let Some(import) = self.imports.get_mut(&import_id) else {
                    continue;
                };
                if import.invalidated.is_none() {
                    import.invalidated = Some(page);
                }
                if import.state == ImportState::Published {
                    let request = import.request;
                    self.discard(pool, import_id);
                    events.push(ImportEvent::Invalidated {
                        request,
                        import: import_id,
                        page,
                    });
                }
            }
        }
        events
    }

    /// `invalidate_pages` for the pool's eviction notices (`PagePool::take_evictions`).
    pub fn on_evictions(
        &mut self,
        pool: &mut PagePool,
        evictions: &[Eviction],
    ) -> Vec<ImportEvent> {
        let pages: Vec<PageId> = evictions.iter().map(|eviction| eviction.page).collect();
        self.invalidate_pages(pool, &pages)
    }

    /// The consumer takes a ready import at admission (O4): every keyed block is acquired through the
    /// ordinary prefix-hit path (`longest_prefix` + `touch`), unkeyed pages are handed over, and the
    /// import's own references are dropped. Afterwards the pages are the consumer's; freed, they enter the
    /// LRU as ordinary cached pages. Errors: unknown request, an import not published, `Invalidated` (a
    /// block is no longer a hit; the import is released, look up again).
    pub fn acquire(&mut self, pool: &mut PagePool, request: RequestId) -> Result<AcquiredImport> {
        let import_id = self.ready_import(request)?;
        let import = &self.imports[&import_id];
        let keyed: Vec<(usize, BlockKey)> = import.keyed_pages().collect();
        // A block whose key another page held at publication may have been evicted since: our own copy
        // holds the same bytes, register it so the prefix lookup finds it.
        for &(pos, key) in &keyed {
            if pool.lookup(&key).is_none() {
                let _registered = pool.cache_block(import.pages[pos], key)?;
            }
        }
        let keys: Vec<BlockKey> = keyed.iter().map(|(_, key)| *key).collect();
        let hits = pool.longest_prefix(&keys);
        if hits.len() < keys.len() {
            let page = import.pages[keyed[hits.len()].0];
            self.discard(pool, import_id);
            return Err(Error::Invalidated { request, page });
        }
        let mut pages = import.pages.clone();
        for (&(pos, _), &hit) in keyed.iter().zip(&hits) {
            pool.touch(hit)?;
            // The import's reference on its own page is dropped below; the consumer holds `hit`.
            pages[pos] = hit;
        }
        let import = self.remove_import(import_id);
        let keyed_positions: Vec<usize> = keyed.iter().map(|(pos, _)| *pos).collect();
        for pos in keyed_positions {
            release_page(pool, import.pages[pos]);
        }
        Ok(AcquiredImport {
            import: import_id,
            meta: import.meta,
            pages,
            n_hit_pages: hits.len(),
        })
    }

    /// Cancels the request's import. Copying: the request id is free at once, the pages stay pinned until
    /// every submitted copy drained (O5). Ready: its references are dropped at once and its pages become
    /// evictable cached pages (O6).
    pub fn cancel(
        &mut self,
        pool: &mut PagePool,
        copies: &mut dyn CopyEngine,
        request: RequestId,
    ) -> Result<CancelOutcome> {
        let import_id = *self
            .by_request
            .get(&request)
            .ok_or(Error::UnknownImport { request })?;
        let import = self
            .imports
            .get_mut(&import_id)
            .ok_or(Error::UnknownImport { request })?;
        if import.state == ImportState::Published {
            let n_pages = import.pages.len();
            self.discard(pool, import_id);
            return Ok(CancelOutcome::Released {
                import: import_id,
                n_pages,
            });
        }
        import.state = ImportState::Cancelled;
        for &job in &import.jobs {
            copies.cancel(job);
        }
        let n_jobs = import.jobs.len();
        self.by_request.remove(&request);
        let _drained_now = self.settle(pool, import_id);
        Ok(CancelOutcome::Draining {
            import: import_id,
            n_jobs,
        })
    }

    /// Prefix-cache reset gate (O3, X1, X2). Not forced: refused while any import is staged or owned,
    /// changing nothing. Forced: every ready import is released and every copying one cancelled (its pages
    /// drain first); returns the requests that lost their import (they fall back to an ordinary lookup).
    pub fn clear(
        &mut self,
        pool: &mut PagePool,
        copies: &mut dyn CopyEngine,
        force: bool,
    ) -> Result<Vec<RequestId>> {
        let (n_staged, n_owned) = (self.n_staged(), self.n_owned());
        if !force {
            if n_staged + n_owned > 0 {
                return Err(Error::ResetRefused { n_staged, n_owned });
            }
            return Ok(Vec::new());
        }
        let mut requests: Vec<RequestId> = self.by_request.keys().copied().collect();
        requests.sort();
        for &request in &requests {
            self.cancel(pool, copies, request)?;
        }
        Ok(requests)
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
    pub fn is_ready(&self, request: RequestId) -> bool {
        self.state(request) == Some(ImportState::Published)
    }

    /// The request's import's destination pages, in checkpoint order.
    pub fn pages(&self, request: RequestId) -> Option<&[PageId]> {
        let import_id = self.by_request.get(&request)?;
        self.imports.get(import_id).map(|import| &import.pages[..])
    }

    /// Every page the index holds a reference on (destination pages of imports, draining ones included,
    /// and captured source pages), each once per holding import or capture.
    pub fn held_pages(&self) -> impl Iterator<Item = PageId> + '_ {
        let in_imports = self.imports.values().flat_map(|import| import.pages.iter());
        let in_captures = self
            .captures
            .values()
            .flat_map(|capture| capture.pages.iter());
        in_imports.chain(in_captures).copied()
    }

    /// Imports still copying, cancelled or failed ones that are draining included.
    pub fn n_staged(&self) -> usize {
        self.imports
            .values()
            .filter(|import| import.state != ImportState::Published)
            .count()
    }

    /// Ready imports (published, owned, not yet acquired).
    pub fn n_owned(&self) -> usize {
        self.imports
            .values()
            .filter(|import| import.state == ImportState::Published)
            .count()
    }

    /// Pages the index holds a reference on (imports and captures).
    pub fn n_pages_held(&self) -> usize {
        let in_imports: usize = self.imports.values().map(|import| import.pages.len()).sum();
        let in_captures: usize = self
            .captures
            .values()
            .map(|capture| capture.pages.len())
            .sum();
        in_imports + in_captures
    }

    /// Asserts the index's invariants against the pool (for tests and simulations): every page an import
    /// or capture holds has a reference (so no page is freed while a copy into it is outstanding), pages
    /// belong to one import, a published import has no copy outstanding, and the maps agree.
    pub fn check_invariants(&self, pool: &PagePool) {
        let mut n_owned_pages = 0;
        for (&import_id, import) in &self.imports {
            for &page in &import.pages {
                let ref_count = pool.ref_count(page).unwrap_or(0);
                assert!(
                    ref_count >= 1,
                    "page {page:?} of import {import_id:?} has no reference"
                );
                assert_eq!(
                    self.page_owner.get(&page),
                    Some(&import_id),
                    "page owner map disagrees"
                );
                n_owned_pages += 1;
            }
            for job in &import.jobs {
                assert_eq!(self.by_job.get(job), Some(&import_id), "job map disagrees");
            }
            match import.state {
                ImportState::Published => {
                    assert!(
                        import.jobs.is_empty(),
                        "published import with copies outstanding"
                    );
                }
                ImportState::Cancelled => {
                    assert!(
                        !import.jobs.is_empty(),
                        "drained cancelled import not discarded"
                    );
                }
                ImportState::Staged | ImportState::Failed => {
                    assert!(!import.jobs.is_empty(), "settled import still staged");
                }
            }
            let mapped = self.by_request.get(&import.request) == Some(&import_id);
            assert_eq!(
                mapped,
                import.state != ImportState::Cancelled,
                "request map disagrees"
            );
        }
        assert_eq!(
            n_owned_pages,
            self.page_owner.len(),
            "page owner map has stale pages"
        );
        assert_eq!(
            self.by_job.len(),
            self.imports
                .values()
                .map(|import| import.jobs.len())
                .sum::<usize>(),
            "job map has stale jobs"
        );
        for capture in self.captures.values() {
            for &page in &capture.pages {
                assert!(
                    pool.ref_count(page).unwrap_or(0) >= 1,
                    "captured page {page:?} has no reference"
                );
            }
        }
    }

    fn validate(&self, pool: &PagePool, stage: &StageRequest<'_>) -> Result<(), Invalid> {
        let meta = &stage.checkpoint.meta;
        if meta.n_tokens == 0 {
            return Err(Invalid::ZeroTokens {
                id: meta.id.clone(),
            });
        }
        if meta.n_tokens > stage.request_tokens {
            return Err(Invalid::BoundaryPastRequest {
                n_tokens: meta.n_tokens,
                request_tokens: stage.request_tokens,
            });
        }
        if meta.draft_prefix_len > meta.n_tokens {
            return Err(Invalid::DraftPrefixTooLong {
                draft_prefix_len: meta.draft_prefix_len,
                n_tokens: meta.n_tokens,
            });
        }
        if meta.layout.n_ranks == 0 {
            return Err(Invalid::ZeroRanks {
                id: meta.id.clone(),
            });
        }
        if self.by_request.contains_key(&stage.request) {
            return Err(Invalid::IdInUse {
                request: stage.request,
            });
        }
        for &page in stage.dependency_pages {
            if pool.ref_count(page).unwrap_or(0) == 0 {
                return Err(Invalid::DependencyNotOwned { page });
            }
        }
        meta.layout
            .check_matches(&self.layout)
            .map_err(Invalid::Layout)?;
        stage.checkpoint.payload.check_shape(meta)?;
        let mut expected_key = 0u32;
        for (page_idx, slot) in meta.pages.iter().enumerate() {
            if let Some(key_idx) = slot.key_idx {
                if key_idx != expected_key || key_idx as usize >= meta.block_keys.len() {
                    return Err(Invalid::PageKeys {
                        page_idx,
                        key_idx,
                        expected: expected_key,
                    });
                }
                expected_key += 1;
            }
        }
        Ok(())
    }

    fn validate_destination(
        &self,
        pool: &PagePool,
        stage: &StageRequest<'_>,
        pages: &[PageId],
    ) -> Result<(), Invalid> {
        let expected = stage.checkpoint.meta.pages.len();
        if pages.len() != expected {
            return Err(Invalid::PayloadShape {
                rank: 0,
                expected,
                found: pages.len(),
            });
        }
        let mut seen = std::collections::HashSet::with_capacity(pages.len());
        for &page in pages {
            let reason = if pool.ref_count(page).unwrap_or(0) == 0 {
                Some("it is free")
            } else if !seen.insert(page) {
                Some("it is listed twice")
            } else if self.page_owner.contains_key(&page) {
                Some("it is already an import's destination")
            } else {
                None
            };
            if let Some(reason) = reason {
                return Err(Invalid::Destination { page, reason });
            }
        }
        Ok(())
    }

    fn ready_import(&self, request: RequestId) -> Result<ImportId> {
        let import_id = *self
            .by_request
            .get(&request)
            .ok_or(Error::UnknownImport { request })?;
        let state = self.imports[&import_id].state;
        if state != ImportState::Published {
            return Err(Error::WrongState {
                request,
                state: state.name(),
                needed: "published",
            });
        }
        Ok(import_id)
    }

    /// Acts on an import whose copies have all completed: publish, refuse publication, or discard.
    fn settle(&mut self, pool: &mut PagePool, import_id: ImportId) -> Option<ImportEvent> {
        let import = self.imports.get(&import_id)?;
        if !import.jobs.is_empty() || import.state == ImportState::Published {
            return None;
        }
        let request = import.request;
        let event = match import.state {
            ImportState::Cancelled => ImportEvent::Drained {
                request,
                import: import_id,
            },
            ImportState::Failed => {
                let (rank, reason) = import.failure.clone().unwrap_or((0, "copy failed".into()));
                ImportEvent::Failed {
                    request,
                    import: import_id,
                    rank,
                    reason,
                    n_tokens: import.meta.n_tokens,
                }
            }
            ImportState::Staged => {
                debug_assert!(
                    import.acknowledged.iter().all(|acked| *acked),
                    "settled without acks"
                );
                let lost_dependency = import
                    .dependency_pages
                    .iter()
                    .find(|page| pool.ref_count(**page).unwrap_or(0) == 0)
                    .copied();
                match import.invalidated.or(lost_dependency) {
                    Some(page) => ImportEvent::Invalidated {
                        request,
                        import: import_id,
                        page,
                    },
                    None => return Some(self.publish(pool, import_id)),
                }
            }
            ImportState::Published => return None,
        };
        self.discard(pool, import_id);
        Some(event)
    }

    /// Registers the import's block keys: from now on a prefix lookup finds them (O2); the import keeps
    /// its references, so they are not evictable (O3).
    fn publish(&mut self, pool: &mut PagePool, import_id: ImportId) -> ImportEvent {
        let import = self
            .imports
            .get_mut(&import_id)
            .expect("publish of a missing import");
        import.state = ImportState::Published;
        let keyed: Vec<(usize, BlockKey)> = import.keyed_pages().collect();
        for (pos, key) in keyed {
            // `false`: another page already caches this block; the consumer's lookup finds that one.
            let registered = pool.cache_block(import.pages[pos], key);
            debug_assert!(
                registered.is_ok(),
                "cache_block of an owned fresh page: {registered:?}"
            );
        }
        ImportEvent::Published {
            request: import.request,
            import: import_id,
            n_tokens: import.meta.n_tokens,
        }
    }

    /// Removes an import with no copy outstanding and drops its references.
    fn discard(&mut self, pool: &mut PagePool, import_id: ImportId) {
        let import = self.remove_import(import_id);
        debug_assert!(import.jobs.is_empty(), "discard with copies outstanding");
        for &page in &import.pages {
            if import.state != ImportState::Published {
                // Never published: the bytes may be partial; make sure no key survives.
                let _key = pool.uncache(page);
            }
            release_page(pool, page);
        }
    }

    fn remove_import(&mut self, import_id: ImportId) -> Import {
        let import = self
            .imports
            .remove(&import_id)
            .expect("remove of a missing import");
        if self.by_request.get(&import.request) == Some(&import_id) {
            self.by_request.remove(&import.request);
        }
        for page in &import.pages {
            self.page_owner.remove(page);
        }
        for job in &import.jobs {
            self.by_job.remove(job);
        }
        import
    }
}

/// Drops one reference the index holds; a failure is a bookkeeping bug.
fn release_page(pool: &mut PagePool, page: PageId) {
    let freed = pool.free(page);
    debug_assert!(freed.is_ok(), "release of page {page:?}: {freed:?}");
}

#[cfg(test)]
mod tests;
