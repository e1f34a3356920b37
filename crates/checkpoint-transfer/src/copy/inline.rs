//! `InlineCopyEngine`: deterministic copies on the injected clock. A job completes at submit time plus
//! latency plus bytes / bandwidth; its bytes are written at completion, so a cancelled or failed job never
//! touches page storage. Fault injection: fail a job or a rank's next job, delay one, evict a
//! destination page mid-copy, or corrupt a byte of the next restore silently.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kv_pool::Timestamp;
use kv_pool::{PageId, PageStorage};

use crate::copy::{CopyCompletion, CopyEngine, CopyJob, CopyJobId, CopyOutcome};
use crate::error::Result;

/// The modeled cost of a copy: `latency + bytes / bandwidth_bytes_per_s`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CopyModel {
    /// Sustained bandwidth of one rank's link, bytes per second.
    pub bandwidth_bytes_per_s: f64,
    /// Fixed cost of one job.
    pub latency: Duration,
}

impl CopyModel {
    /// Modeled duration of a job moving `n_bytes`.
    pub fn duration(&self, n_bytes: u64) -> Duration {
        let transfer_s = n_bytes as f64 / self.bandwidth_bytes_per_s.max(1.0);
        self.latency + Duration::from_secs_f64(transfer_s)
    }
}

/// A fault to inject into the inline engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The next job submitted on `rank` fails at its completion time.
    FailNext {
        /// The rank.
        rank: u32,
    },
    /// The next job submitted on `rank` completes `by` later.
    DelayNext {
        /// The rank.
        rank: u32,
        /// Extra time.
        by: Duration,
    },
    /// The next restore job submitted on `rank` completes as done, but writes the first page's byte
    /// `byte` inverted: silent corruption, for the engine's byte-for-byte verification to catch (E3, L5).
    CorruptNext {
        /// The rank.
        rank: u32,
        /// Offset of the corrupted byte in the job's first page.
        byte: usize,
    },
    /// An in-flight job fails at its completion time.
    FailJob(CopyJobId),
    /// Every job in flight on `rank` fails at its completion time.
    FailInFlight {
        /// The rank.
        rank: u32,
    },
    /// An in-flight job completes `by` later.
    DelayJob(CopyJobId, Duration),
    /// The destination page is evicted while copied into: every in-flight restore job writing it reports it
    /// in `CopyCompletion::invalidated`.
    EvictDestination(PageId),
}

#[derive(Debug)]
struct InlineJob {
    job: CopyJob,
    complete_at: Timestamp,
    cancelled: bool,
    failure: Option<String>,
    /// A byte of the first page to write inverted (an injected silent corruption).
    corrupt_byte: Option<usize>,
    invalidated: Vec<PageId>,
}

/// Deterministic copies on the injected clock.
pub struct InlineCopyEngine {
    model: CopyModel,
    bytes_per_page: u64,
    storage: Option<Arc<dyn PageStorage>>,
    in_flight: BTreeMap<CopyJobId, InlineJob>,
    next_job: u64,
    next_on_rank: Vec<Fault>,
    /// When each rank's link is free again: copies on one rank share its bandwidth, one after the other
    /// (first come, first served), instead of each getting all of it.
    link_free_at: BTreeMap<u32, Timestamp>,
}

impl std::fmt::Debug for InlineCopyEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InlineCopyEngine")
            .field("model", &self.model)
            .field("bytes_per_page", &self.bytes_per_page)
            .field("has_storage", &self.storage.is_some())
            .field("n_in_flight", &self.in_flight.len())
            .finish()
    }
}

impl InlineCopyEngine {
    /// An engine that models time only: restores write nothing.
    pub fn new(model: CopyModel, bytes_per_page: u64) -> Self {
        Self {
            model,
            bytes_per_page,
            storage: None,
            in_flight: BTreeMap::new(),
            next_job: 0,
            next_on_rank: Vec::new(),
            link_free_at: BTreeMap::new(),
        }
    }

    /// An engine that also writes the bytes into `storage` at each job's completion.
    pub fn with_storage(model: CopyModel, storage: Arc<dyn PageStorage>) -> Self {
        let mut engine = Self::new(model, storage.bytes_per_page() as u64);
        engine.storage = Some(storage);
        engine
    }

    /// Injects a fault (see `Fault`).
    pub(crate) fn inject(&mut self, fault: Fault) {
        match fault {
            Fault::FailNext { .. } | Fault::DelayNext { .. } | Fault::CorruptNext { .. } => {
                self.next_on_rank.push(fault);
            }
            Fault::FailJob(id) => {
                if let Some(job) = self.in_flight.get_mut(&id) {
                    job.failure = Some(format!("injected failure of job {}", id.0));
                }
            }
            Fault::FailInFlight { rank } => {
                for (id, job) in &mut self.in_flight {
                    if job.job.rank == rank && job.failure.is_none() {
                        job.failure = Some(format!("injected failure of job {}", id.0));
                    }
                }
            }
            Fault::DelayJob(id, by) => {
                if let Some(job) = self.in_flight.get_mut(&id) {
                    job.complete_at = job.complete_at.after(by);
                }
            }
            Fault::EvictDestination(page) => {
                for job in self.in_flight.values_mut() {
                    let writes_page = job.job.pages.iter().any(|(_, p)| *p == page);
                    if writes_page && !job.invalidated.contains(&page) {
                        job.invalidated.push(page);
                    }
                }
            }
        }
    }

    /// Ids of the jobs in flight, in submission order.
    #[cfg(test)]
    pub(crate) fn in_flight_jobs(&self) -> Vec<CopyJobId> {
        self.in_flight.keys().copied().collect()
    }

    fn finish(&self, id: CopyJobId, job: InlineJob) -> CopyCompletion {
        let rank = job.job.rank;
        let outcome = if job.cancelled {
            CopyOutcome::Cancelled
        } else if let Some(reason) = job.failure {
            CopyOutcome::Failed { reason }
        } else {
            self.execute(&job.job, job.corrupt_byte)
        };
        CopyCompletion {
            job: id,
            rank,
            outcome,
            invalidated: job.invalidated,
        }
    }

    fn execute(&self, job: &CopyJob, corrupt_byte: Option<usize>) -> CopyOutcome {
        let rank = job.rank;
        let Some(storage) = &self.storage else {
            return CopyOutcome::Done;
        };
        for (idx, (bytes, page)) in job.pages.iter().enumerate() {
            let corrupted: Option<Vec<u8>> = corrupt_byte
                .filter(|&byte| idx == 0 && byte < bytes.len())
                .map(|byte| {
                    let mut copy = bytes.to_vec();
                    copy[byte] = !copy[byte];
                    copy
                });
            let bytes: &[u8] = corrupted.as_deref().unwrap_or(bytes);
            if let Err(e) = storage.write(rank, *page, bytes) {
                return CopyOutcome::Failed {
                    reason: e.to_string(),
                };
            }
        }
        CopyOutcome::Done
    }
}

impl CopyEngine for InlineCopyEngine {
    fn submit(&mut self, job: CopyJob, now: Timestamp) -> Result<CopyJobId> {
        let id = CopyJobId(self.next_job);
        self.next_job += 1;
        let n_bytes = job.n_pages() as u64 * self.bytes_per_page;
        // The rank's link carries one copy at a time: this one starts when the copies before it are done.
        let link = self.link_free_at.entry(job.rank).or_insert(now);
        let start = (*link).max(now);
        let mut complete_at = start.after(self.model.duration(n_bytes));
        *link = complete_at;
        let mut failure = None;
        let mut corrupt_byte = None;
        let rank = job.rank;
        let mut remaining = Vec::with_capacity(self.next_on_rank.len());
        for fault in self.next_on_rank.drain(..) {
            match fault {
                Fault::FailNext { rank: r } if r == rank && failure.is_none() => {
                    failure = Some(format!("injected failure on rank {rank}"));
                }
                Fault::DelayNext { rank: r, by } if r == rank => {
                    complete_at = complete_at.after(by);
                }
                Fault::CorruptNext { rank: r, byte } if r == rank && corrupt_byte.is_none() => {
                    corrupt_byte = Some(byte);
                }
                other => remaining.push(other),
            }
        }
        self.next_on_rank = remaining;
        self.in_flight.insert(
            id,
            InlineJob {
                job,
                complete_at,
                cancelled: false,
                failure,
                corrupt_byte,
                invalidated: Vec::new(),
            },
        );
        Ok(id)
    }

    fn poll(&mut self, now: Timestamp) -> Vec<CopyCompletion> {
        let mut due: Vec<(Timestamp, CopyJobId)> = self
            .in_flight
            .iter()
            .filter(|(_, job)| job.complete_at <= now)
            .map(|(id, job)| (job.complete_at, *id))
            .collect();
        due.sort();
        let mut completions = Vec::with_capacity(due.len());
        for (_, id) in due {
            if let Some(job) = self.in_flight.remove(&id) {
                completions.push(self.finish(id, job));
            }
        }
        completions
    }

    fn cancel(&mut self, job: CopyJobId) {
        // The modeled copy may still be writing until its completion time: it keeps that time.
        if let Some(job) = self.in_flight.get_mut(&job) {
            job.cancelled = true;
        }
    }

    fn n_in_flight(&self) -> usize {
        self.in_flight.len()
    }

    fn wait_all(&mut self) -> Vec<CopyCompletion> {
        match self.in_flight.values().map(|job| job.complete_at).max() {
            Some(last) => self.poll(last),
            None => Vec::new(),
        }
    }

    fn next_completion_at(&self) -> Option<Timestamp> {
        self.in_flight.values().map(|job| job.complete_at).min()
    }

    fn in_flight_pages(&self) -> Vec<PageId> {
        self.in_flight
            .values()
            .flat_map(|job| job.job.pool_pages())
            .collect()
    }

    fn inject_fault(&mut self, fault: Fault) -> Result<()> {
        self.inject(fault);
        Ok(())
    }
}
