//! Captures: copying a request's pool pages out to new buffers (then into a store). The index pins every
//! source page with one reference while any rank's copy may still read it, and reports the checkpoint once
//! every rank finished.

use kv_pool::{PageId, PagePool};
use kv_pool::{RequestId, Timestamp};

use crate::checkpoint::{Checkpoint, CheckpointMeta, CheckpointPayload};
use crate::copy::{CopyCompletion, CopyEngine, CopyJob, CopyJobId, CopyOutcome, CopyWork};
use crate::error::{Invalid, Result};
use crate::index::{CaptureId, ImportEvent, ResidentIndex, release_page};
use crate::page_buf::RankPages;

#[derive(Debug)]
pub(crate) struct CaptureState {
    request: RequestId,
    meta: CheckpointMeta,
    /// Source pages, each pinned by one reference of the index.
    pub(crate) pages: Vec<PageId>,
    jobs: Vec<CopyJobId>,
    captured: Vec<RankPages>,
    failure: Option<String>,
}

impl ResidentIndex {
    /// Copies `pages` (in `meta.pages` order, owned by the request) out of the pool on every rank. Each
    /// source page is pinned until every rank's copy completed; then `poll` reports
    /// `ImportEvent::Captured` with the bytes (or `CaptureFailed`).
    pub fn capture(
        &mut self,
        pool: &mut PagePool,
        copies: &mut dyn CopyEngine,
        now: Timestamp,
        request: RequestId,
        meta: CheckpointMeta,
        pages: &[PageId],
    ) -> Result<CaptureId> {
        meta.layout
            .check_matches(&self.layout)
            .map_err(Invalid::Layout)?;
        if pages.len() != meta.pages.len() {
            return Err(Invalid::PayloadShape {
                rank: 0,
                expected: meta.pages.len(),
                found: pages.len(),
            }
            .into());
        }
        for &page in pages {
            if pool.ref_count(page).unwrap_or(0) == 0 {
                return Err(Invalid::DependencyNotOwned { page }.into());
            }
        }
        for &page in pages {
            pool.touch(page)?;
        }
        let capture_id = CaptureId(self.next_capture);
        self.next_capture += 1;
        let n_ranks = meta.layout.n_ranks as usize;
        let mut state = CaptureState {
            request,
            meta,
            pages: pages.to_vec(),
            jobs: Vec::with_capacity(n_ranks),
            captured: vec![RankPages::default(); n_ranks],
            failure: None,
        };
        for rank in 0..n_ranks as u32 {
            let job = CopyJob {
                rank,
                work: CopyWork::Capture {
                    pages: pages.to_vec(),
                },
            };
            match copies.submit(job, now) {
                Ok(job_id) => {
                    state.jobs.push(job_id);
                    self.capture_by_job.insert(job_id, capture_id);
                }
                Err(err) => {
                    state.failure = Some(err.to_string());
                    for &job in &state.jobs {
                        copies.cancel(job);
                    }
                    break;
                }
            }
        }
        if state.jobs.is_empty() {
            for &page in &state.pages {
                release_page(pool, page);
            }
            return Err(crate::error::Error::Unavailable(
                state.failure.unwrap_or_else(|| "no copy submitted".into()),
            ));
        }
        self.captures.insert(capture_id, state);
        Ok(capture_id)
    }

    pub(crate) fn apply_capture_completion(
        &mut self,
        pool: &mut PagePool,
        copies: &mut dyn CopyEngine,
        capture_id: CaptureId,
        completion: CopyCompletion,
    ) -> Option<ImportEvent> {
        let state = self.captures.get_mut(&capture_id)?;
        state.jobs.retain(|job| *job != completion.job);
        match completion.outcome {
            CopyOutcome::Done { captured } => {
                let bytes_per_page = state.meta.layout.bytes_per_page as usize;
                state.captured[completion.rank as usize] =
                    RankPages::from_pages(captured.iter().map(|page| &page[..]), bytes_per_page);
            }
            CopyOutcome::Failed { reason } => {
                if state.failure.is_none() {
                    state.failure = Some(format!("rank {}: {reason}", completion.rank));
                    for &job in &state.jobs {
                        copies.cancel(job);
                    }
                }
            }
            CopyOutcome::Cancelled => {
                if state.failure.is_none() {
                    state.failure = Some(format!("rank {}: cancelled", completion.rank));
                }
            }
        }
        if !state.jobs.is_empty() {
            return None;
        }
        let state = self.captures.remove(&capture_id)?;
        for &page in &state.pages {
            release_page(pool, page);
        }
        Some(match state.failure {
            Some(reason) => ImportEvent::CaptureFailed {
                request: state.request,
                capture: capture_id,
                reason,
            },
            None => ImportEvent::Captured {
                request: state.request,
                capture: capture_id,
                checkpoint: Box::new(Checkpoint {
                    meta: state.meta,
                    payload: CheckpointPayload {
                        ranks: state.captured,
                    },
                }),
            },
        })
    }
}
