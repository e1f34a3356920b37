//! `StoreLink`: how an engine reaches its checkpoint store. Inline, every call is answered at once: the
//! simulated clock's way (deterministic; the store's I/O takes no simulated time). Threaded, the store lives on
//! a thread of its own and the caller never waits for its I/O: a lookup is sent and answered at a later poll,
//! a checkpoint's pages are read ahead (`ready`) and taken once read (`take`), a put is queued. A slow or
//! dead store then delays the restores that asked it, never the caller.
//!
//! Jobs run in the order they were sent, so a lookup sees every put sent before it. A store that panics is
//! dropped: every later lookup finds nothing and every later put counts as a write failure.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use crossbeam::channel::{Receiver, Sender, unbounded};
use kv_pool::{BlockKey, RequestId};

use super::{CheckpointStore, PutOutcome, StoreStats};
use crate::checkpoint::{Checkpoint, CheckpointId, CheckpointMeta, PrefixQuery};
use crate::error::{Error, Result};

/// Which of the store's lookups to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// `CheckpointStore::find_longest_prefix`: the longest run of leading full blocks.
    BlockPrefix,
    /// `CheckpointStore::find_longest`: the longest whole checkpoint that is a prefix; the count is 0.
    Whole,
}

/// A lookup's answer: the checkpoint found and, for `Lookup::BlockPrefix`, the blocks it matches.
pub type Found = Option<(Arc<CheckpointMeta>, u32)>;

/// How an engine reaches its checkpoint store (see the module docs).
#[derive(Debug)]
pub struct StoreLink {
    mode: Mode,
}

#[derive(Debug)]
enum Mode {
    Inline(Box<dyn CheckpointStore>),
    Threaded(Worker),
}

/// The threaded store: its thread, the jobs on their way, the answers not yet taken.
#[derive(Debug)]
struct Worker {
    jobs: Option<Sender<Job>>,
    answers: Receiver<Answer>,
    /// Puts the store refused, with the request each captured, not yet taken.
    put_failures: Vec<(RequestId, Error)>,
    /// The store's figures after its last job.
    stats: Arc<Mutex<StoreStats>>,
    /// Lookups sent and not yet taken: `None` while the answer is on its way.
    lookups: HashMap<RequestId, Option<Found>>,
    /// Checkpoint reads sent and not yet taken, per request: `None` while on their way.
    reads: HashMap<RequestId, (CheckpointId, Option<Result<Checkpoint>>)>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Debug)]
enum Job {
    Find {
        request: RequestId,
        lookup: Lookup,
        block_keys: Vec<BlockKey>,
        tokens: Vec<u32>,
    },
    Put {
        request: RequestId,
        checkpoint: Checkpoint,
    },
    Get {
        id: CheckpointId,
        reply: Sender<Result<Checkpoint>>,
    },
    Read {
        request: RequestId,
        id: CheckpointId,
    },
}

/// What the store's thread sends back unasked.
#[derive(Debug)]
enum Answer {
    Found(RequestId, Found),
    Read(RequestId, CheckpointId, Result<Checkpoint>),
    PutFailed(RequestId, Error),
}

impl StoreLink {
    /// Every call answered at once by `store`.
    pub fn inline(store: Box<dyn CheckpointStore>) -> StoreLink {
        StoreLink {
            mode: Mode::Inline(store),
        }
    }

    /// `store` on a thread of its own. Errors: `Error::StoreUnavailable` when its thread cannot be started.
    pub fn threaded(store: Box<dyn CheckpointStore>) -> Result<StoreLink> {
        let (jobs, job_rx) = unbounded::<Job>();
        let (answer_tx, answers) = unbounded();
        let stats = Arc::new(Mutex::new(store.stats()));
        let shared = Arc::clone(&stats);
        let thread = std::thread::Builder::new()
            .name("kvgate-store".to_string())
            .spawn(move || serve(store, &job_rx, &answer_tx, &shared))
            .map_err(|error| Error::StoreUnavailable {
                reason: format!("cannot start the store's thread: {error}"),
            })?;
        Ok(StoreLink {
            mode: Mode::Threaded(Worker {
                jobs: Some(jobs),
                answers,
                put_failures: Vec::new(),
                stats,
                lookups: HashMap::new(),
                reads: HashMap::new(),
                thread: Some(thread),
            }),
        })
    }

    /// Whether the store runs on a thread of its own.
    #[cfg(test)]
    pub(crate) fn is_threaded(&self) -> bool {
        matches!(self.mode, Mode::Threaded(_))
    }

    /// `request`'s lookup of `query`: `Some` with the store's answer, `None` while it is on its way (inline,
    /// never). Threaded, the first call sends the lookup and a later one takes its answer; one lookup per
    /// request is outstanding at a time, and its answer is for the query it was sent with (a caller checks
    /// the checkpoint against its query, as it must anyway).
    pub fn find(
        &mut self,
        request: RequestId,
        lookup: Lookup,
        query: &PrefixQuery<'_>,
    ) -> Option<Found> {
        match &mut self.mode {
            Mode::Inline(store) => Some(match lookup {
                Lookup::BlockPrefix => store.find_longest_prefix(query),
                Lookup::Whole => store.find_longest(query).map(|meta| (meta, 0)),
            }),
            Mode::Threaded(worker) => worker.find(request, lookup, query),
        }
    }

    /// Stores `request`'s captured `checkpoint`. Threaded, it is queued and `Ok` with nothing superseded or
    /// evicted; a refusal comes back through `take_put_failures` once the store has tried.
    pub fn put(&mut self, request: RequestId, checkpoint: Checkpoint) -> Result<PutOutcome> {
        match &mut self.mode {
            Mode::Inline(store) => store.put(checkpoint),
            Mode::Threaded(worker) => {
                worker.send(Job::Put {
                    request,
                    checkpoint,
                });
                Ok(PutOutcome::default())
            }
        }
    }

    /// The puts the store refused since the last call, with the request each captured (inline: none, `put`
    /// returns them).
    pub fn take_put_failures(&mut self) -> Vec<(RequestId, Error)> {
        match &mut self.mode {
            Mode::Inline(_) => Vec::new(),
            Mode::Threaded(worker) => {
                worker.drain_answers();
                std::mem::take(&mut worker.put_failures)
            }
        }
    }

    /// Whether `request` can take checkpoint `id`'s pages (`take`) without waiting for the store: inline,
    /// always (nothing is read until `take`); threaded, once a read sent by an earlier call has come back
    /// (the first call sends it, and a call for another checkpoint replaces it). The pages read are held
    /// until taken or until `retain` drops the request.
    pub fn ready(&mut self, request: RequestId, id: &CheckpointId) -> bool {
        match &mut self.mode {
            Mode::Inline(_) => true,
            Mode::Threaded(worker) => worker.ready(request, id),
        }
    }

    /// Checkpoint `id` with its pages, for `request`: inline, read now; threaded, the pages `ready` had read,
    /// or, when none were, read now on the store's thread while the caller waits. Errors: the store's, or
    /// `Error::StoreUnavailable` when its thread is gone.
    pub fn take(&mut self, request: RequestId, id: &CheckpointId) -> Result<Checkpoint> {
        match &mut self.mode {
            Mode::Inline(store) => store.get(id),
            Mode::Threaded(worker) => worker.take(request, id),
        }
    }

    /// What the store holds (threaded: as of its last finished job).
    pub fn stats(&self) -> StoreStats {
        match &self.mode {
            Mode::Inline(store) => store.stats(),
            Mode::Threaded(worker) => *worker.stats.lock().unwrap_or_else(PoisonError::into_inner),
        }
    }

    /// Drops the lookups and reads of requests `keep` refuses (requests no longer waiting for one): their
    /// answers, when they come, are dropped too.
    pub fn retain(&mut self, keep: impl Fn(RequestId) -> bool) {
        if let Mode::Threaded(worker) = &mut self.mode {
            worker.lookups.retain(|&request, _| keep(request));
            worker.reads.retain(|&request, _| keep(request));
        }
    }

    /// Lookups sent and not yet taken.
    #[cfg(test)]
    pub(crate) fn n_lookups_outstanding(&self) -> usize {
        match &self.mode {
            Mode::Inline(_) => 0,
            Mode::Threaded(worker) => worker.lookups.len(),
        }
    }
}

impl Worker {
    fn send(&mut self, job: Job) {
        // The thread ends only when `jobs` is dropped; a send to a thread that ended (it cannot, but a
        // lost job is then a lookup that never answers, which its timeout covers) is dropped.
        if let Some(jobs) = &self.jobs {
            let _sent = jobs.send(job);
        }
    }

    /// Takes every answer the thread has sent so far.
    fn drain_answers(&mut self) {
        while let Ok(answer) = self.answers.try_recv() {
            match answer {
                Answer::Found(request, found) => {
                    if let Some(slot) = self.lookups.get_mut(&request) {
                        *slot = Some(found);
                    }
                }
                Answer::Read(request, id, got) => {
                    if let Some((read, slot)) = self.reads.get_mut(&request)
                        && *read == id
                    {
                        *slot = Some(got);
                    }
                }
                Answer::PutFailed(request, error) => self.put_failures.push((request, error)),
            }
        }
    }

    fn ready(&mut self, request: RequestId, id: &CheckpointId) -> bool {
        self.drain_answers();
        match self.reads.get(&request) {
            Some((read, got)) if read == id => got.is_some(),
            _ => {
                self.reads.insert(request, (id.clone(), None));
                self.send(Job::Read {
                    request,
                    id: id.clone(),
                });
                false
            }
        }
    }

    /// The pages `ready` read for `request`, when they are `id`'s and here; else read now, waiting.
    fn take(&mut self, request: RequestId, id: &CheckpointId) -> Result<Checkpoint> {
        self.drain_answers();
        if self
            .reads
            .get(&request)
            .is_some_and(|(read, got)| read == id && got.is_some())
            && let Some((_, Some(got))) = self.reads.remove(&request)
        {
            return got;
        }
        let (reply, answer) = crossbeam::channel::bounded(1);
        self.send(Job::Get {
            id: id.clone(),
            reply,
        });
        answer.recv().unwrap_or_else(|_| {
            Err(Error::StoreUnavailable {
                reason: "the checkpoint store's thread is gone".to_string(),
            })
        })
    }

    fn find(
        &mut self,
        request: RequestId,
        lookup: Lookup,
        query: &PrefixQuery<'_>,
    ) -> Option<Found> {
        self.drain_answers();
        match self.lookups.get(&request) {
            Some(Some(_)) => self.lookups.remove(&request).flatten(),
            Some(None) => None,
            None => {
                self.lookups.insert(request, None);
                self.send(Job::Find {
                    request,
                    lookup,
                    block_keys: query.block_keys.to_vec(),
                    tokens: query.tokens.to_vec(),
                });
                None
            }
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Closing the queue ends the thread once the jobs sent are done: every put queued reaches the store.
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _joined = thread.join();
        }
    }
}

/// The store's thread: runs jobs in order until the queue closes.
fn serve(
    store: Box<dyn CheckpointStore>,
    jobs: &Receiver<Job>,
    answers: &Sender<Answer>,
    stats: &Mutex<StoreStats>,
) {
    let mut store = Some(store);
    for job in jobs {
        let outcome = catch_unwind(AssertUnwindSafe(|| run(store.as_deref_mut(), job, answers)));
        let Ok(()) = outcome else {
            tracing::error!(
                "the checkpoint store panicked: it is dropped, lookups find nothing from now on"
            );
            store = None;
            continue;
        };
        if let Some(store) = &store {
            *stats.lock().unwrap_or_else(PoisonError::into_inner) = store.stats();
        }
    }
}

/// One job against `store` (`None`: a store that panicked, which finds nothing and writes nothing).
fn run(store: Option<&mut (dyn CheckpointStore + 'static)>, job: Job, answers: &Sender<Answer>) {
    match job {
        Job::Find {
            request,
            lookup,
            block_keys,
            tokens,
        } => {
            let query = PrefixQuery {
                block_keys: &block_keys,
                tokens: &tokens,
            };
            let found = store.and_then(|store| match lookup {
                Lookup::BlockPrefix => store.find_longest_prefix(&query),
                Lookup::Whole => store.find_longest(&query).map(|meta| (meta, 0)),
            });
            // The link is gone when the send fails: nobody waits for the answer.
            let _sent = answers.send(Answer::Found(request, found));
        }
        Job::Put {
            request,
            checkpoint,
        } => {
            let stored = match store {
                Some(store) => store.put(checkpoint).map(|_outcome| ()),
                None => Err(Error::StoreUnavailable {
                    reason: "the checkpoint store panicked and was dropped".to_string(),
                }),
            };
            if let Err(error) = stored {
                let _sent = answers.send(Answer::PutFailed(request, error));
            }
        }
        Job::Get { id, reply } => {
            let _sent = reply.send(read(store, &id));
        }
        Job::Read { request, id } => {
            let got = read(store, &id);
            let _sent = answers.send(Answer::Read(request, id, got));
        }
    }
}

/// Checkpoint `id` from `store` (`None`: a store that panicked).
fn read(
    store: Option<&mut (dyn CheckpointStore + 'static)>,
    id: &CheckpointId,
) -> Result<Checkpoint> {
    match store {
        Some(store) => store.get(id),
        None => Err(Error::StoreUnavailable {
            reason: "the checkpoint store panicked and was dropped".to_string(),
        }),
    }
}
