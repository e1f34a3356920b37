//! Staging an import: validating the checkpoint, the request and the destination pages (R4), allocating
//! or taking a reference on the destination pages, and submitting one restore copy per rank (O1).

use std::sync::Arc;

use kv_pool::Timestamp;
use kv_pool::{PageId, PagePool};

use super::{Import, ImportId, ImportState, ResidentIndex, StageRequest};
use crate::copy::{CopyEngine, CopyJob};
use crate::error::{Invalid, Result};

impl ResidentIndex {
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
                pages: (0..rank_pages.len())
                    .filter_map(|idx| rank_pages.page_buf(idx))
                    .zip(import.pages.iter().copied())
                    .collect(),
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
}
