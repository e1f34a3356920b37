//! `DeviceCopyEngine`: restores straight into the pool's device pages (`kv_pool::DeviceStorage`), one copy
//! stream per rank; `CudaCopyEngine` is it over the real driver, and over `kv_pool::FakeDevice` the same
//! logic runs in CI. `submit` only records the job and hands it to its rank's staging thread (`stager`),
//! which fills pinned chunks of a bounded pool and queues one host-to-device transfer per run of
//! consecutive pages, with an event after each chunk; `poll` queries each job's last event and never
//! blocks; a cancelled job stops staging chunks and is reported once what it queued completed. A job is
//! reported (done, cancelled or failed) only once the device says nothing of it can still run: its last
//! event completed, or an event recorded after everything queued on its stream did (`poll`), or its rank's
//! stream synchronized (`wait_all`). When the device can say neither (a failed context),
//! the job stays in flight, its pages listed by `in_flight_pages` and its staging held; `wait_all` then
//! returns without it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam::channel::Sender;
use kv_pool::{CudaDriver, Device, DeviceStorage, PageId, PageStorage, Timestamp};

pub use super::stager::StagingLimits;
use super::stager::{JobRecord, Order, Shared, run_stager};
use crate::copy::{CopyCompletion, CopyEngine, CopyJob, CopyJobId, CopyOutcome};
use crate::error::{Error, Result};

/// Copies into CUDA device pages: `DeviceCopyEngine` over the real driver.
pub type CudaCopyEngine = DeviceCopyEngine<CudaDriver>;

/// Copies into a `DeviceStorage`, one staging thread and copy stream per rank.
pub struct DeviceCopyEngine<D: Device> {
    storage: Arc<DeviceStorage<D>>,
    shared: Arc<Shared<D::Event>>,
    /// Rank `r`'s staging thread's orders; empty once the engine is dropped.
    orders: Vec<Sender<Order>>,
    stagers: Vec<JoinHandle<()>>,
    /// Jobs not reported yet, in submission order.
    in_flight: VecDeque<CopyJobId>,
    next_job: u64,
}

impl<D: Device> std::fmt::Debug for DeviceCopyEngine<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceCopyEngine")
            .field("storage", &self.storage)
            .field("n_in_flight", &self.in_flight.len())
            .finish_non_exhaustive()
    }
}

/// What the engine thread reads of a job to decide whether it is over, taken under the lock.
struct Snapshot<E> {
    rank: u32,
    staged: bool,
    unconfirmed: bool,
    last_event: Option<Arc<E>>,
}

impl<D: Device> DeviceCopyEngine<D> {
    /// Copies into `storage` with the default staging bound (`StagingLimits::default`).
    pub fn new(storage: Arc<DeviceStorage<D>>) -> Result<Self> {
        Self::with_staging(storage, StagingLimits::default())
    }

    /// Copies into `storage`, each rank staging through at most `limits` of pinned memory. Errors:
    /// `Error::Unavailable` for an empty bound or when a staging thread cannot start.
    pub fn with_staging(storage: Arc<DeviceStorage<D>>, limits: StagingLimits) -> Result<Self> {
        if limits.chunk_bytes == 0 || limits.chunks_per_rank == 0 {
            return Err(Error::Unavailable(format!(
                "staging of {} chunks of {} bytes per rank holds nothing; give both a positive value",
                limits.chunks_per_rank, limits.chunk_bytes
            )));
        }
        let shared = Arc::new(Shared {
            jobs: std::sync::Mutex::new(std::collections::HashMap::new()),
            staged: std::sync::Condvar::new(),
        });
        let mut orders = Vec::new();
        let mut stagers = Vec::new();
        for rank in 0..storage.n_ranks() {
            let (sender, receiver) = crossbeam::channel::unbounded();
            let (storage, shared) = (Arc::clone(&storage), Arc::clone(&shared));
            let stager = std::thread::Builder::new()
                .name(format!("kvgate-stage-{rank}"))
                .spawn(move || run_stager(&storage, &shared, rank, &receiver, limits))
                .map_err(|e| Error::Unavailable(format!("cannot start a staging thread: {e}")))?;
            orders.push(sender);
            stagers.push(stager);
        }
        Ok(Self {
            storage,
            shared,
            orders,
            stagers,
            in_flight: VecDeque::new(),
            next_job: 0,
        })
    }

    /// The storage the engine writes.
    pub fn storage(&self) -> &Arc<DeviceStorage<D>> {
        &self.storage
    }

    /// Baseline for benchmarks: the time to upload `total_bytes` (rounded up to whole runs) into pages
    /// `first..first + n_pages` of `rank` straight from one pinned buffer of that run, one transfer per run
    /// on the rank's copy stream (the `cudaMemcpyAsync` a hand-written restore would make), waiting for
    /// the last. Returns the time and the bytes moved. Nothing may be in flight.
    pub fn time_pinned_upload(
        &mut self,
        rank: u32,
        first: PageId,
        n_pages: u32,
        total_bytes: usize,
    ) -> Result<(Duration, usize)> {
        if !self.in_flight.is_empty() {
            return Err(Error::Unavailable(format!(
                "{} copies in flight: the upload baseline needs an idle engine",
                self.in_flight.len()
            )));
        }
        let device = self.storage.device();
        let run_bytes = n_pages as usize * self.storage.bytes_per_page();
        let mut pinned = device.alloc_pinned(run_bytes).map_err(Error::Unavailable)?;
        device
            .fill_pinned(&mut pinned, &mut |bytes| bytes.fill(0x5A))
            .map_err(Error::Unavailable)?;
        device.synchronize(rank).map_err(Error::Unavailable)?;
        #[allow(
            clippy::disallowed_methods,
            reason = "measures the pinned upload's wall time for the bandwidth figure"
        )]
        let started = std::time::Instant::now();
        let mut moved = 0;
        let mut outcome = Ok(());
        while moved < total_bytes && outcome.is_ok() {
            outcome = enqueue_baseline(&self.storage, rank, first, n_pages, &pinned);
            moved += run_bytes;
        }
        let synced = device.synchronize(rank);
        let elapsed = started.elapsed();
        if synced.is_err() {
            // The pinned buffer may still be read: never free it under a transfer.
            std::mem::forget(pinned);
        }
        outcome?;
        synced.map_err(Error::Unavailable)?;
        Ok((elapsed, moved))
    }

    fn snapshot(&self, id: CopyJobId) -> Option<Snapshot<D::Event>> {
        let jobs = self.shared.lock();
        jobs.get(&id).map(|job| Snapshot {
            rank: job.rank,
            staged: job.staged,
            unconfirmed: job.unconfirmed,
            last_event: job.events.last().cloned(),
        })
    }

    /// Whether the device says nothing of job `id` can still run, asking without blocking unless `block`.
    /// A failed query or wait fails the job; it is over only once its rank's stream synchronized.
    fn is_over(&self, id: CopyJobId, block: bool) -> bool {
        let Some(job) = self.snapshot(id) else {
            return true;
        };
        if !job.staged {
            return false;
        }
        let device = self.storage.device();
        let mut failure = None;
        let mut over = true;
        if job.unconfirmed {
            // Without blocking: an event after everything queued on the stream says it (kept for the next
            // poll); when none can be recorded, or when asked to block, the stream's synchronization.
            let fence = (!block).then(|| self.fence(id, job.rank)).flatten();
            let status = match &fence {
                Some(fence) => device.query(fence),
                None => device.synchronize(job.rank).map(|()| true),
            };
            over = status.unwrap_or_else(|reason| {
                failure = Some(reason);
                device.synchronize(job.rank).is_ok()
            });
        }
        if over && let Some(event) = &job.last_event {
            let status = if block {
                device.wait(event).map(|()| true)
            } else {
                device.query(event)
            };
            over = status.unwrap_or_else(|reason| {
                failure = Some(reason);
                device.synchronize(job.rank).is_ok()
            });
        }
        let mut jobs = self.shared.lock();
        if let Some(record) = jobs.get_mut(&id) {
            record.unconfirmed &= !over;
            if let Some(reason) = failure {
                record.failure.get_or_insert(reason);
            }
        }
        over
    }

    /// The event recorded after everything queued on `rank`'s stream for unconfirmed job `id`, recorded
    /// at the first ask; `None` when the device refuses one.
    fn fence(&self, id: CopyJobId, rank: u32) -> Option<Arc<D::Event>> {
        if let Some(fence) = self
            .shared
            .lock()
            .get(&id)
            .and_then(|job| job.fence.clone())
        {
            return Some(fence);
        }
        let fence = Arc::new(self.storage.device().record(rank).ok()?);
        if let Some(job) = self.shared.lock().get_mut(&id) {
            job.fence = Some(Arc::clone(&fence));
        }
        Some(fence)
    }

    /// Removes job `id`, which is over, forgetting its page marks, and says how it ended.
    fn complete(&self, id: CopyJobId) -> Option<CopyCompletion> {
        let job: JobRecord<D::Event> = self.shared.lock().remove(&id)?;
        for event in &job.events {
            self.storage.settle(job.rank, &job.pages, event);
        }
        let outcome = if let Some(reason) = job.failure {
            CopyOutcome::Failed { reason }
        } else if job.cancelled {
            CopyOutcome::Cancelled
        } else {
            CopyOutcome::Done
        };
        Some(CopyCompletion {
            job: id,
            rank: job.rank,
            outcome,
            invalidated: Vec::new(),
        })
    }

    /// Reports every job in flight that is over, in submission order.
    fn collect(&mut self, block: bool) -> Vec<CopyCompletion> {
        let mut completions = Vec::new();
        let mut waiting = VecDeque::with_capacity(self.in_flight.len());
        while let Some(id) = self.in_flight.pop_front() {
            if self.is_over(id, block) {
                completions.extend(self.complete(id));
            } else {
                waiting.push_back(id);
            }
        }
        self.in_flight = waiting;
        completions
    }
}

/// Queues the baseline's one run from `pinned`.
#[allow(
    unsafe_code,
    reason = "the baseline queues a transfer from pinned memory; the block has a SAFETY note"
)]
fn enqueue_baseline<D: Device>(
    storage: &DeviceStorage<D>,
    rank: u32,
    first: PageId,
    n_pages: u32,
    pinned: &D::Pinned,
) -> Result<()> {
    // SAFETY: `pinned` is neither changed nor freed before the stream is synchronized (or it is leaked).
    unsafe { storage.enqueue_run(rank, first, n_pages, pinned, 0) }.map_err(Error::Pool)
}

impl<D: Device> CopyEngine for DeviceCopyEngine<D> {
    fn submit(&mut self, job: CopyJob, _now: Timestamp) -> Result<CopyJobId> {
        let Some(orders) = self.orders.get(job.rank as usize) else {
            return Err(Error::Pool(kv_pool::Error::RankOutOfRange {
                rank: job.rank,
                n_ranks: self.storage.n_ranks(),
            }));
        };
        let id = CopyJobId(self.next_job);
        self.next_job += 1;
        let record = JobRecord {
            rank: job.rank,
            pages: job.pool_pages(),
            cancelled: false,
            staged: false,
            events: Vec::new(),
            failure: None,
            unconfirmed: false,
            fence: None,
        };
        self.shared.lock().insert(id, record);
        self.in_flight.push_back(id);
        let order = Order {
            id,
            pages: job.pages,
        };
        if orders.send(order).is_err() {
            // The staging thread is gone: nothing of the job was queued.
            if let Some(record) = self.shared.lock().get_mut(&id) {
                record.staged = true;
                record.failure = Some("the staging thread of its rank stopped".to_string());
            }
        }
        Ok(id)
    }

    fn poll(&mut self, _now: Timestamp) -> Vec<CopyCompletion> {
        self.collect(false)
    }

    fn cancel(&mut self, job: CopyJobId) {
        // What is queued cannot be recalled; chunks not staged yet are skipped. Reported once over.
        if let Some(record) = self.shared.lock().get_mut(&job) {
            record.cancelled = true;
        }
    }

    fn n_in_flight(&self) -> usize {
        self.in_flight.len()
    }

    fn wait_all(&mut self) -> Vec<CopyCompletion> {
        {
            let mut jobs = self.shared.lock();
            while self
                .in_flight
                .iter()
                .any(|id| jobs.get(id).is_some_and(|job| !job.staged))
            {
                jobs = self
                    .shared
                    .staged
                    .wait(jobs)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
        }
        self.collect(true)
    }

    fn in_flight_pages(&self) -> Vec<PageId> {
        let jobs = self.shared.lock();
        self.in_flight
            .iter()
            .filter_map(|id| jobs.get(id))
            .flat_map(|job| job.pages.iter().copied())
            .collect()
    }
}

impl<D: Device> Drop for DeviceCopyEngine<D> {
    fn drop(&mut self) {
        // Stop staging, then let each staging thread release its chunks once its stream is idle.
        for record in self.shared.lock().values_mut() {
            record.cancelled = true;
        }
        self.orders.clear();
        for stager in self.stagers.drain(..) {
            if stager.join().is_err() {
                tracing::warn!("a staging thread panicked");
            }
        }
    }
}
