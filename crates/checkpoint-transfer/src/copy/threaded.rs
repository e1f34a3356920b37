//! `ThreadedCopyEngine`: N worker threads fed by a crossbeam channel, one task per page, doing real memcpy
//! from store buffers into a `PageStorage` (typically `HostStorage`). A job completes when its last page
//! task ran; cancellation skips the tasks not started yet, and the completion is only sent once no task of
//! the job can run any more, so the engine observes it only after every write into its pages ended.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use crossbeam::channel::{Receiver, Sender};
use kv_pool::Timestamp;
use kv_pool::{PageId, PageStorage};

use crate::copy::{CopyCompletion, CopyEngine, CopyJob, CopyJobId, CopyOutcome, catch_panic};
use crate::error::{Error, Result};
use crate::page_buf::PageBuf;

/// Worker threads copying pages with memcpy.
pub struct ThreadedCopyEngine {
    storage: Arc<dyn PageStorage>,
    task_tx: Option<Sender<Task>>,
    done_tx: Sender<CopyCompletion>,
    done_rx: Receiver<CopyCompletion>,
    workers: Vec<JoinHandle<()>>,
    in_flight: HashSet<CopyJobId>,
    /// Pool pages of each job in flight (they must stay allocated until its completion is observed).
    pages_in_flight: std::collections::HashMap<CopyJobId, Vec<PageId>>,
    cancel_flags: std::collections::HashMap<CopyJobId, Arc<JobShared>>,
    next_job: u64,
}

impl std::fmt::Debug for ThreadedCopyEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadedCopyEngine")
            .field("n_workers", &self.workers.len())
            .field("n_in_flight", &self.in_flight.len())
            .finish()
    }
}

struct JobShared {
    id: CopyJobId,
    rank: u32,
    remaining: AtomicUsize,
    cancelled: AtomicBool,
    failure: Mutex<Option<String>>,
    done_tx: Sender<CopyCompletion>,
}

/// One page of a job: its bytes and the page they go to.
struct Task {
    job: Arc<JobShared>,
    bytes: PageBuf,
    page: PageId,
}

impl ThreadedCopyEngine {
    /// An engine with `n_workers` threads (at least one) copying into `storage`.
    pub fn new(storage: Arc<dyn PageStorage>, n_workers: usize) -> Result<Self> {
        let (task_tx, task_rx) = crossbeam::channel::unbounded::<Task>();
        let (done_tx, done_rx) = crossbeam::channel::unbounded();
        let mut workers = Vec::with_capacity(n_workers.max(1));
        for worker_idx in 0..n_workers.max(1) {
            let task_rx = task_rx.clone();
            let storage = Arc::clone(&storage);
            let handle = std::thread::Builder::new()
                .name(format!("kvgate-copy-{worker_idx}"))
                .spawn(move || run_worker(&task_rx, storage.as_ref()))
                .map_err(|e| Error::Unavailable(format!("cannot spawn a copy worker: {e}")))?;
            workers.push(handle);
        }
        Ok(Self {
            storage,
            task_tx: Some(task_tx),
            done_tx,
            done_rx,
            workers,
            in_flight: HashSet::new(),
            pages_in_flight: std::collections::HashMap::new(),
            cancel_flags: std::collections::HashMap::new(),
            next_job: 0,
        })
    }

    fn observed(&mut self, completion: &CopyCompletion) {
        self.in_flight.remove(&completion.job);
        self.cancel_flags.remove(&completion.job);
        self.pages_in_flight.remove(&completion.job);
    }
}

impl CopyEngine for ThreadedCopyEngine {
    fn in_flight_pages(&self) -> Vec<PageId> {
        self.pages_in_flight.values().flatten().copied().collect()
    }

    fn submit(&mut self, job: CopyJob, _now: Timestamp) -> Result<CopyJobId> {
        let id = CopyJobId(self.next_job);
        self.next_job += 1;
        let n_pages = job.n_pages();
        let bytes_per_page = self.storage.bytes_per_page();
        let shared = Arc::new(JobShared {
            id,
            rank: job.rank,
            remaining: AtomicUsize::new(n_pages),
            cancelled: AtomicBool::new(false),
            failure: Mutex::new(None),
            done_tx: self.done_tx.clone(),
        });
        self.in_flight.insert(id);
        self.pages_in_flight.insert(id, job.pool_pages());
        self.cancel_flags.insert(id, Arc::clone(&shared));
        if n_pages == 0 {
            let _sent = self.done_tx.send(completion_of(&shared));
            return Ok(id);
        }
        // The workers run until drop, which alone takes the sender.
        let Some(task_tx) = self.task_tx.as_ref() else {
            return Err(Error::Unavailable("the copy workers have stopped".into()));
        };
        for (bytes, page) in job.pages {
            debug_assert_eq!(
                bytes.len(),
                bytes_per_page,
                "restore buffer of the wrong width"
            );
            let task = Task {
                job: Arc::clone(&shared),
                bytes,
                page,
            };
            if let Err(unsent) = task_tx.send(task) {
                // Workers gone: count the task as run-and-failed so the job still completes.
                finish_task(&unsent.0.job, Some("copy workers stopped".to_string()));
            }
        }
        Ok(id)
    }

    fn poll(&mut self, _now: Timestamp) -> Vec<CopyCompletion> {
        let completions: Vec<CopyCompletion> = self.done_rx.try_iter().collect();
        for completion in &completions {
            self.observed(completion);
        }
        completions
    }

    fn cancel(&mut self, job: CopyJobId) {
        if let Some(shared) = self.cancel_flags.get(&job) {
            shared.cancelled.store(true, Ordering::Release);
        }
    }

    fn n_in_flight(&self) -> usize {
        self.in_flight.len()
    }

    fn wait_all(&mut self) -> Vec<CopyCompletion> {
        let mut completions = Vec::new();
        while !self.in_flight.is_empty() {
            let Ok(completion) = self.done_rx.recv() else {
                break;
            };
            self.observed(&completion);
            completions.push(completion);
        }
        completions
    }
}

impl Drop for ThreadedCopyEngine {
    fn drop(&mut self) {
        self.task_tx = None;
        for worker in self.workers.drain(..) {
            let _joined = worker.join();
        }
    }
}

fn run_worker(task_rx: &Receiver<Task>, storage: &dyn PageStorage) {
    for task in task_rx {
        let job = &task.job;
        let skip = job.cancelled.load(Ordering::Acquire)
            || job
                .failure
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_some();
        let failure = if skip {
            None
        } else {
            // A panic in the storage is this page's failure, not a lost task: the job still completes (failed),
            // the worker goes on, and nobody waits forever for a task that will never finish.
            match catch_panic(|| storage.write(job.rank, task.page, &task.bytes)) {
                Ok(written) => written.err().map(|e| e.to_string()),
                Err(message) => Some(format!(
                    "the copy worker panicked writing page {}: {message}",
                    task.page.0
                )),
            }
        };
        finish_task(job, failure);
    }
}

/// Counts one task of the job as ended; the last one sends the job's completion.
fn finish_task(job: &JobShared, failure: Option<String>) {
    if let Some(reason) = failure {
        let mut slot = job.failure.lock().unwrap_or_else(PoisonError::into_inner);
        slot.get_or_insert(reason);
    }
    if job.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
        let _sent = job.done_tx.send(completion_of(job));
    }
}

fn completion_of(job: &JobShared) -> CopyCompletion {
    let failure = job
        .failure
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    let outcome = if let Some(reason) = failure {
        CopyOutcome::Failed { reason }
    } else if job.cancelled.load(Ordering::Acquire) {
        CopyOutcome::Cancelled
    } else {
        CopyOutcome::Done
    };
    CopyCompletion {
        job: job.id,
        rank: job.rank,
        outcome,
        invalidated: Vec::new(),
    }
}
