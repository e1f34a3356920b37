//! The engine side of a step: the `AdmissionHost` trait through which the step reads the queues, the ledger
//! and the pool, learns what each request needs (`Candidate`), and has each admission carried out at once
//! (`Admit`), so the next request is examined against the pool as it now is.

use kv_pool::PagePool;
use kv_pool::RequestId;
use reservation::Ledger;

use crate::queue::WaitingQueue;

/// What the host says about a waiting request when the step examines it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Candidate {
    /// An ordinary request needing `need_pages` pages now to start (its first chunk, plus cached prefix hits
    /// that are free now: taking them takes them out of the free count).
    Cold {
        /// Pages it needs now.
        need_pages: u32,
    },
    /// The step's token budget is spent: the request waits, and blocks the head.
    OutOfBudget,
    /// The request waits for an earlier one this step cannot admit yet (one whose store lookup is not
    /// answered, or itself, preempted by this step's running pass), and blocks the head: FCFS (Q1).
    WaitsBehind,
    /// The host took the request out of the waiting queue (its local prefix was evicted since its lookup: it
    /// asks the store again). The step records it and goes on.
    Withdrawn,
    /// A restore without reservations (G1): its import plus its first chunk, `need_pages` in all, now, or it
    /// falls back to a cold request at once. It takes a running slot; no ledger is involved.
    RestoreAtOnce {
        /// Import pages plus first-chunk pages plus free cached hits.
        need_pages: u32,
    },
    /// A published import owned by this request (it holds a ticket): admit it.
    RestoreReady,
}

/// An admission for the host to carry out at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// An ordinary request: take its cached hits and allocate its pages (they fit), and run it.
    Cold {
        /// The request.
        request: RequestId,
        /// Pages it said it needs.
        need_pages: u32,
    },
    /// A ready import: acquire its pages through the prefix-hit path, then `Ledger::admit` (its ticket's slot
    /// becomes a running slot).
    Ready {
        /// The request.
        request: RequestId,
    },
    /// A restore without reservations: stage its import and take its first chunk's pages (they fit).
    RestoreAtOnce {
        /// The request.
        request: RequestId,
        /// Pages it said it needs.
        need_pages: u32,
    },
}

impl Admit {
    /// The request admitted.
    pub(crate) fn request(&self) -> RequestId {
        match *self {
            Admit::Cold { request, .. }
            | Admit::Ready { request }
            | Admit::RestoreAtOnce { request, .. } => request,
        }
    }
}

/// Why a restore recomputes instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FallbackCause {
    /// A restore at once did not fit now, or the host could not start it (`Admit::RestoreAtOnce` declined).
    NotAtOnce {
        /// Pages it needed.
        need_pages: u32,
        /// Pages available to it.
        available_pages: u32,
    },
}

/// What a step reads and updates, borrowed from the host for one operation at a time.
#[derive(Debug)]
pub struct HostState<'a> {
    /// Waiting requests (cold, and restores the host keeps in the queue).
    pub waiting: &'a mut WaitingQueue,
    /// Ready imports: published, owning their ticket; they may pass a blocked head.
    pub ready: &'a mut WaitingQueue,
    /// The reservation ledger; `None` under policies without reservations (never called then, G1).
    pub ledger: Option<&'a Ledger>,
    /// The page pool.
    pub pool: &'a mut PagePool,
}

/// The engine side of a step.
pub trait AdmissionHost {
    /// What the host's operations can fail with (bugs the host reports; the step stops and returns it).
    type Error;

    /// The queues, the ledger and the pool.
    fn state(&mut self) -> HostState<'_>;

    /// What `request` needs now. Called once per examined request per step (a restore poll for restores).
    /// `free_slots` are the running slots free at this point of the step: with none, a host need not do work
    /// that only matters for an admission (such as asking the store again).
    fn examine(&mut self, request: RequestId, free_slots: u32) -> Result<Candidate, Self::Error>;

    /// Carries out `admit` now; the step has checked its slot and pages. Returns `false` when the host could
    /// not: a ready import that lost its pages (the host requeued it), or a restore at once that could not
    /// start (it then falls back). A cold admission that fits always succeeds.
    fn admit(&mut self, admit: Admit) -> Result<bool, Self::Error>;

    /// `request`'s restore is given up (`cause`): the request drops it and recomputes. Returns the pages it needs
    /// as a cold request; the step tries to admit it at once.
    fn fall_back(&mut self, request: RequestId, cause: &FallbackCause) -> Result<u32, Self::Error>;
}
