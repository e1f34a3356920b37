//! The staging thread of one rank of a `DeviceCopyEngine`: it takes the rank's restore jobs in order, copies
//! their store buffers into pinned chunks of a bounded pool (off the engine thread), queues one
//! host-to-device transfer per run of consecutive destination pages in a chunk on the rank's copy stream,
//! and records an event after each chunk. A chunk is reused only once its event completed, or the stream
//! synchronized; when the device cannot say either, the chunk is held (never refilled, never freed) until it
//! can, or leaked at the end rather than freed under a transfer. A panic in a device call is that call's
//! error (so the chunk takes the error path, never unwinds away under a transfer); any other panic fails
//! the job, which is then over only once the stream synchronized.
#![allow(
    unsafe_code,
    reason = "transfers queued from pinned chunks run after the call returned; each block has a SAFETY note"
)]

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use crossbeam::channel::Receiver;
use kv_pool::{Device, DeviceStorage, PageId, PageStorage};

use crate::copy::{CopyJobId, catch_panic};
use crate::page_buf::PageBuf;

/// The bound on a rank's pinned staging: `chunks_per_rank` chunks of `chunk_bytes` (rounded down to whole
/// pages, at least one page). A restore larger than the pool is staged chunk by chunk as earlier chunks'
/// transfers complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StagingLimits {
    /// Bytes of one pinned chunk.
    pub chunk_bytes: usize,
    /// Chunks a rank may hold at once.
    pub chunks_per_rank: usize,
}

impl Default for StagingLimits {
    /// 4 chunks of 16 MiB per rank: 64 MiB of pinned memory per rank at most.
    fn default() -> Self {
        StagingLimits {
            chunk_bytes: 16 << 20,
            chunks_per_rank: 4,
        }
    }
}

/// One job as the staging thread receives it.
pub(crate) struct Order {
    pub(crate) id: CopyJobId,
    pub(crate) pages: Vec<(PageBuf, PageId)>,
}

/// A job's state, shared by the engine thread and the rank's staging thread.
pub(crate) struct JobRecord<E> {
    pub(crate) rank: u32,
    pub(crate) pages: Vec<PageId>,
    pub(crate) cancelled: bool,
    /// The staging thread is done with it: nothing more of it will be queued.
    pub(crate) staged: bool,
    /// The events recorded after its chunks, in order; the last completes after all of them.
    pub(crate) events: Vec<Arc<E>>,
    pub(crate) failure: Option<String>,
    /// Something of it may be queued with no event after it: only a synchronized stream says it is over.
    pub(crate) unconfirmed: bool,
    /// For an unconfirmed job: an event recorded after everything queued on the stream, which `poll`
    /// queries instead of blocking for the stream.
    pub(crate) fence: Option<Arc<E>>,
}

/// The jobs of one engine, and a condition signalled when one is staged.
pub(crate) struct Shared<E> {
    pub(crate) jobs: Mutex<HashMap<CopyJobId, JobRecord<E>>>,
    pub(crate) staged: Condvar,
}

impl<E> Shared<E> {
    pub(crate) fn lock(&self) -> MutexGuard<'_, HashMap<CopyJobId, JobRecord<E>>> {
        self.jobs.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What staging one job ended with.
struct Staged<E> {
    events: Vec<Arc<E>>,
    failure: Option<String>,
    unconfirmed: bool,
}

/// A rank's pinned chunks: free, in use by queued transfers (with the event after them), or held because
/// the device could not say their transfers are over.
struct Staging<D: Device> {
    free: Vec<D::Pinned>,
    busy: VecDeque<(D::Pinned, Arc<D::Event>)>,
    held: Vec<D::Pinned>,
    n_allocated: usize,
    pages_per_chunk: usize,
    limits: StagingLimits,
}

/// The staging thread of `rank`: stages every order until the engine drops its sender, then releases its
/// chunks once the stream is idle.
pub(crate) fn run_stager<D: Device>(
    storage: &DeviceStorage<D>,
    shared: &Shared<D::Event>,
    rank: u32,
    orders: &Receiver<Order>,
    limits: StagingLimits,
) {
    let bytes_per_page = storage.bytes_per_page();
    let mut staging = Staging::<D> {
        free: Vec::new(),
        busy: VecDeque::new(),
        held: Vec::new(),
        n_allocated: 0,
        pages_per_chunk: (limits.chunk_bytes / bytes_per_page).max(1),
        limits,
    };
    for order in orders {
        let staged = catch_panic(|| stage_job(storage, shared, rank, &order, &mut staging))
            .unwrap_or_else(|message| Staged {
                events: Vec::new(),
                failure: Some(format!("the staging thread panicked: {message}")),
                unconfirmed: true,
            });
        let mut jobs = shared.lock();
        if let Some(job) = jobs.get_mut(&order.id) {
            job.staged = true;
            job.events = staged.events;
            job.unconfirmed = staged.unconfirmed;
            if let Some(reason) = staged.failure {
                job.failure.get_or_insert(reason);
            }
        }
        shared.staged.notify_all();
    }
    staging.release(storage, rank);
}

/// Stages `order` chunk by chunk; stops early when it is cancelled or something fails.
fn stage_job<D: Device>(
    storage: &DeviceStorage<D>,
    shared: &Shared<D::Event>,
    rank: u32,
    order: &Order,
    staging: &mut Staging<D>,
) -> Staged<D::Event> {
    let mut staged = Staged {
        events: Vec::new(),
        failure: None,
        unconfirmed: false,
    };
    let bytes_per_page = storage.bytes_per_page();
    if let Some((bytes, page)) = order.pages.iter().find(|(b, _)| b.len() != bytes_per_page) {
        staged.failure = Some(format!(
            "the restore buffer of page {} holds {} bytes, pages hold {bytes_per_page}",
            page.0,
            bytes.len()
        ));
        return staged;
    }
    for pages in order.pages.chunks(staging.pages_per_chunk) {
        let cancelled = shared.lock().get(&order.id).is_none_or(|job| job.cancelled);
        if cancelled {
            break;
        }
        if let Err(reason) = stage_chunk(storage, rank, pages, staging, &mut staged) {
            staged.failure.get_or_insert(reason);
            break;
        }
    }
    staged
}

/// Fills a chunk with `pages`, queues their runs and records the event after them.
fn stage_chunk<D: Device>(
    storage: &DeviceStorage<D>,
    rank: u32,
    pages: &[(PageBuf, PageId)],
    staging: &mut Staging<D>,
    staged: &mut Staged<D::Event>,
) -> Result<(), String> {
    let device = storage.device();
    let bytes_per_page = storage.bytes_per_page();
    let mut chunk = staging.take(storage, rank)?;
    let filled = shielded(|| {
        device.fill_pinned(&mut chunk, &mut |bytes| {
            for ((source, _), dst) in pages.iter().zip(bytes.chunks_exact_mut(bytes_per_page)) {
                dst.copy_from_slice(source);
            }
        })
    });
    if let Err(reason) = filled {
        staging.free.push(chunk);
        return Err(reason);
    }
    let queued = shielded(|| enqueue_runs(storage, rank, pages, &chunk));
    let destinations: Vec<PageId> = pages.iter().map(|(_, page)| *page).collect();
    match shielded(|| {
        storage
            .record(rank, &destinations)
            .map_err(|e| e.to_string())
    }) {
        Ok(event) => {
            staging.busy.push_back((chunk, Arc::clone(&event)));
            staged.events.push(event);
            queued
        }
        Err(error) => {
            // Transfers of this chunk may be queued with no event after them: only the stream can say.
            match shielded(|| device.synchronize(rank)) {
                Ok(()) => staging.free.push(chunk),
                Err(_) => {
                    staging.held.push(chunk);
                    staged.unconfirmed = true;
                }
            }
            queued.and(Err(error))
        }
    }
}

/// Queues one transfer per run of consecutive destination pages of `pages`, staged in order in `chunk`.
fn enqueue_runs<D: Device>(
    storage: &DeviceStorage<D>,
    rank: u32,
    pages: &[(PageBuf, PageId)],
    chunk: &D::Pinned,
) -> Result<(), String> {
    let bytes_per_page = storage.bytes_per_page();
    let mut runs: Vec<(usize, PageId, u32)> = Vec::new();
    for (idx, (_, page)) in pages.iter().enumerate() {
        match runs.last_mut() {
            Some((_, first, len)) if first.0.checked_add(*len) == Some(page.0) => *len += 1,
            _ => runs.push((idx, *page, 1)),
        }
    }
    for (start, first, len) in runs {
        // SAFETY: the chunk goes to `Staging::busy` with the event recorded after this transfer (or is held
        // when none could be recorded), and is refilled or freed only once that event completed or the
        // stream synchronized.
        unsafe { storage.enqueue_run(rank, first, len, chunk, start * bytes_per_page) }
            .map_err(|error| error.to_string())?;
    }
    Ok(())
}

impl<D: Device> Staging<D> {
    /// A chunk no queued transfer reads: a free one, a new one within the bound, or the oldest busy one once
    /// its event completed (blocking this thread only).
    fn take(&mut self, storage: &DeviceStorage<D>, rank: u32) -> Result<D::Pinned, String> {
        let device = storage.device();
        if let Some(chunk) = self.free.pop() {
            return Ok(chunk);
        }
        if !self.held.is_empty() && shielded(|| device.synchronize(rank)).is_ok() {
            // The device says everything queued is over: the held chunks are free again.
            self.free.append(&mut self.held);
            if let Some(chunk) = self.free.pop() {
                return Ok(chunk);
            }
        }
        if self.n_allocated < self.limits.chunks_per_rank {
            let n_bytes = self.pages_per_chunk * storage.bytes_per_page();
            let chunk = shielded(|| device.alloc_pinned(n_bytes))?;
            self.n_allocated += 1;
            return Ok(chunk);
        }
        let Some((chunk, event)) = self.busy.pop_front() else {
            return Err(format!(
                "no pinned staging: all {} chunks of rank {rank} are held after device errors",
                self.n_allocated
            ));
        };
        let waited = shielded(|| device.wait(&event));
        if waited.is_ok() || shielded(|| device.synchronize(rank)).is_ok() {
            return Ok(chunk);
        }
        // The device cannot say whether anything queued is over: hold every chunk in use.
        self.held.push(chunk);
        self.held
            .extend(self.busy.drain(..).map(|(chunk, _)| chunk));
        Err(format!(
            "no pinned staging: the device cannot say whether earlier transfers are over ({})",
            waited.err().unwrap_or_default()
        ))
    }

    /// Frees the chunks once the stream is idle; leaks those in use when the device cannot say it is.
    fn release(mut self, storage: &DeviceStorage<D>, rank: u32) {
        if self.busy.is_empty() && self.held.is_empty() {
            return;
        }
        if let Err(reason) = shielded(|| storage.device().synchronize(rank)) {
            tracing::warn!(%reason, rank, "pinned staging leaked: the device cannot say its transfers are over");
            for (chunk, _) in self.busy.drain(..) {
                std::mem::forget(chunk);
            }
            for chunk in self.held.drain(..) {
                std::mem::forget(chunk);
            }
        }
    }
}

/// Runs a device call, turning a panic in it into its error: the caller's error path then keeps a chunk
/// that queued transfers may still read, where unwinding would free it under them.
fn shielded<T>(call: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    catch_panic(call).unwrap_or_else(|message| Err(format!("the device layer panicked: {message}")))
}
