//! The `CopyEngine` trait: page copies from a store's buffers into pool page storage (restores), one job per
//! rank, submitted, polled at step boundaries, cancelled. Every submitted job reports exactly one completion
//! (done, cancelled or failed) and only after it can no longer touch its pages: that is what lets the index
//! free a destination page only after its copy drained (O5). Implementations: `InlineCopyEngine` (modeled
//! time, deterministic, fault injection), `ThreadedCopyEngine` (worker threads, real memcpy),
//! `DeviceCopyEngine` (device pages through pinned staging and per-rank streams: `CudaCopyEngine` on the
//! real driver, or on the host-backed `FakeDevice` stand-in in CI), and `ReorderingCopyEngine` (threaded copies that a seeded adversary delays and reorders,
//! checking that no page is written by anyone else while a copy owns it: L2).

mod cuda;
mod inline;
mod reordering;
mod stager;
mod threaded;

use kv_pool::PageId;
use kv_pool::Timestamp;

pub use cuda::{CudaCopyEngine, DeviceCopyEngine, StagingLimits};
pub use inline::{CopyModel, Fault, InlineCopyEngine};
pub use reordering::ReorderingCopyEngine;
pub use threaded::ThreadedCopyEngine;

use crate::error::{Error, Result};
use crate::page_buf::PageBuf;

/// Identifies one submitted copy job within its engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CopyJobId(pub(crate) u64);

/// One copy job: the restore of one rank, each store buffer written to its pool page.
#[derive(Clone, Debug)]
pub struct CopyJob {
    /// The rank whose page storage is written.
    pub rank: u32,
    /// `(source bytes, destination page)`, one per page.
    pub pages: Vec<(PageBuf, PageId)>,
}

impl CopyJob {
    /// Pages the job copies.
    pub fn n_pages(&self) -> usize {
        self.pages.len()
    }

    /// Pool pages the job writes.
    pub fn pool_pages(&self) -> Vec<PageId> {
        self.pages.iter().map(|(_, page)| *page).collect()
    }
}

/// How a job ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CopyOutcome {
    /// Every page was copied.
    Done,
    /// Cancelled; whatever it wrote is garbage, but it writes nothing more.
    Cancelled,
    /// The copy failed; whatever it wrote is garbage, but it writes nothing more.
    Failed {
        /// Why.
        reason: String,
    },
}

/// The end of one job, reported once by `poll` or `wait_all`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyCompletion {
    /// The job.
    pub job: CopyJobId,
    /// Its rank.
    pub rank: u32,
    /// How it ended.
    pub outcome: CopyOutcome,
    /// Destination pages invalidated while the job ran (fault injection: a page evicted mid-copy).
    pub invalidated: Vec<PageId>,
}

/// Copies pages between store buffers and pool page storage.
pub trait CopyEngine: Send + std::fmt::Debug {
    /// Starts a job at `now`. The pages must stay allocated until its completion is observed.
    fn submit(&mut self, job: CopyJob, now: Timestamp) -> Result<CopyJobId>;

    /// Completions of jobs finished by `now`, each reported once, in completion order.
    fn poll(&mut self, now: Timestamp) -> Vec<CopyCompletion>;

    /// Asks a job to stop early. Its completion (`Cancelled`, or `Done`/`Failed` if it already finished)
    /// is still reported by `poll`, once it can no longer write. Unknown or finished jobs are ignored.
    fn cancel(&mut self, job: CopyJobId);

    /// Jobs submitted whose completion has not been reported yet.
    fn n_in_flight(&self) -> usize;

    /// Blocks until every submitted job has finished and returns their completions (the inline engine
    /// ignores its clock here).
    fn wait_all(&mut self) -> Vec<CopyCompletion>;

    /// When the next in-flight job completes on the modeled clock, for engines that know (the inline
    /// engine); `None` otherwise.
    fn next_completion_at(&self) -> Option<Timestamp> {
        None
    }

    /// Pool pages some in-flight job may still read or write (cancelled jobs included): none of them may be
    /// free while it is listed here.
    fn in_flight_pages(&self) -> Vec<PageId>;

    /// Injects a fault (fault injection for tests and scenarios). The inline engine models every fault and
    /// the reordering engine the failures; the others refuse with `Error::Unavailable`.
    fn inject_fault(&mut self, fault: Fault) -> Result<()> {
        Err(Error::Unavailable(format!(
            "cannot inject {fault:?}: fault injection needs the inline copy engine"
        )))
    }

    /// Writes into a page this engine copies made by someone else while a copy owned the page: what a page
    /// freed and reused under a copy in flight looks like (L2). Only the reordering engine checks; the others
    /// report none.
    fn write_violations(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Runs `call`, a panic in it coming back as `Err` with the panic's message: where copy code catches a
/// panic so that it becomes a copy failure (D3), never a hang or an unwind through a worker or the engine.
/// The callers say what panicked.
pub(crate) fn catch_panic<T>(call: impl FnOnce() -> T) -> std::result::Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)).map_err(|payload| {
        payload
            .downcast_ref::<&str>()
            .map(|message| (*message).to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_string())
    })
}

#[cfg(test)]
mod device_tests;
#[cfg(test)]
mod tests;
