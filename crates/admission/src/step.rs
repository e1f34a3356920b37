//! One admission step: walk the waiting queue from its head in order, admitting cold requests that fit (free
//! slot, free pages after credits, unticketed prefills and the watermark) and ready imports, reserving
//! tickets for restores, until the head blocks; then walk only the ready-import list (Q1). A step examines the
//! requests it admits, the blocked head and the ready imports: never the rest of the queue (Q8).

use kv_pool::PagePool;
use reservation::{
    AdmissionOrder, ErrorKind, Ledger, Preflight, RequestId, RestoreSpec, Ticket, Timestamp,
};

use crate::error::Result;
use crate::queue::{QueuePolicy, WaitingQueue};

/// What the engine says about a waiting request when the step examines it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Candidate {
    /// An ordinary request needing `need_pages` new pages (after its local prefix hits) to start.
    Cold {
        /// Pages it needs now.
        need_pages: u32,
    },
    /// A restore whose lookup is unanswered or whose copies are in flight: it schedules nothing this step.
    RestorePending,
    /// A published import owned by this request (it holds a ticket): admit it.
    RestoreReady,
    /// A restore with an answered lookup that needs its ticket.
    RestoreNeedsTicket(RestoreSpec),
}

/// The engine side of a step.
pub trait AdmissionHost {
    /// What `req` needs now. Called once per examined request per step (a restore poll for restores).
    fn examine(&mut self, req: RequestId) -> Candidate;

    /// The ledger refused `req`'s restore for good (`cause.kind()` is impossible, expired or invalid): the
    /// request drops its restore and recomputes. Returns the pages it needs as a cold request; the step tries
    /// to admit it at once.
    fn fall_back(&mut self, req: RequestId, cause: &reservation::Error) -> u32;
}

/// The engine's state at the start of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepContext {
    /// Admitted requests running (they hold running slots; tickets' slots are the ledger's).
    pub running_requests: u32,
    /// Remaining page needs of in-flight prefills that hold no ticket.
    pub unticketed_prefill_pages: u32,
    /// The admission watermark in pages.
    pub watermark_pages: u32,
    /// Whether other work (running requests) is scheduled this step; the watermark applies only then (or once
    /// this step admitted something).
    pub other_work_scheduled: bool,
    /// Most admissions this step (`u32::MAX` for no limit).
    pub max_admissions: u32,
}

impl Default for StepContext {
    fn default() -> Self {
        StepContext {
            running_requests: 0,
            unticketed_prefill_pages: 0,
            watermark_pages: 0,
            other_work_scheduled: false,
            max_admissions: u32::MAX,
        }
    }
}

/// One decision of a step, in the order taken. Admitted and rejected requests have left the waiting queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Admit an ordinary request: allocate its pages and run it.
    AdmitCold {
        /// The request.
        req: RequestId,
        /// Pages it said it needs.
        need_pages: u32,
    },
    /// Admit a ready import: acquire its pages through the prefix-hit path, then `Ledger::admit`.
    AdmitReady {
        /// The request.
        req: RequestId,
    },
    /// A ticket was granted: start copying into `ticket.import_pages`. The request keeps waiting (importing).
    Reserved {
        /// The granted ticket.
        ticket: Ticket,
    },
    /// The restore was refused for good (impossible, expired or invalid) and its ledger state cleared; the
    /// request recomputes (an `AdmitCold` follows if it fits now).
    FellBack {
        /// The request.
        req: RequestId,
        /// Why.
        cause: reservation::Error,
    },
    /// A cold request that can never fit the whole usable pool: removed from the queue; abort it.
    Rejected {
        /// The request.
        req: RequestId,
        /// Pages it needs.
        need_pages: u32,
        /// Usable pages of the pool.
        usable_pages: u32,
    },
}

/// Why the head blocked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlockReason {
    /// A cold request does not fit now: no free slot or not enough available pages.
    Pressure {
        /// Pages it needs.
        need_pages: u32,
        /// Pages available to it.
        available_pages: u32,
        /// Free running slots.
        free_slots: u32,
    },
    /// The ledger refused the restore's ticket for pressure; it is a capacity waiter.
    RestorePressure(reservation::Error),
    /// A restore whose lookup is unanswered or whose copies are in flight.
    RestorePending,
    /// The step reached `max_admissions`.
    AdmissionLimit,
}

/// The request that blocked FCFS and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockedHead {
    /// The request.
    pub req: RequestId,
    /// Why it blocked.
    pub reason: BlockReason,
}

/// What a step decided, and how much work it did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepDecisions {
    /// Decisions in order.
    pub decisions: Vec<Decision>,
    /// The head that blocked, if any.
    pub blocked: Option<BlockedHead>,
    /// Requests examined (calls to `AdmissionHost::examine`).
    pub examined: u32,
    /// Restore polls: examinations that answered a pending restore or one needing a ticket.
    pub restore_polls: u32,
}

/// The admission gates over one waiting queue.
#[derive(Clone, Debug, Default)]
pub struct Admission {
    queue: WaitingQueue,
}

/// Running totals of one step.
struct StepState {
    running: u32,
    unticketed_pages: u32,
    admitted: u32,
}

impl Admission {
    /// Gates over an empty queue ordered by `policy`.
    pub fn new(policy: QueuePolicy) -> Admission {
        Admission {
            queue: WaitingQueue::new(policy),
        }
    }

    /// The waiting queue.
    pub fn queue(&self) -> &WaitingQueue {
        &self.queue
    }

    /// The waiting queue, to push, remove and mark ready imports.
    pub fn queue_mut(&mut self) -> &mut WaitingQueue {
        &mut self.queue
    }

    /// Appends a waiting request; see `WaitingQueue::push`.
    pub fn push(&mut self, req: RequestId, priority: u32) -> Result<AdmissionOrder> {
        self.queue.push(req, priority)
    }

    /// One admission step (R2-R5, Q1-Q3, Q8, W1). See the module doc.
    pub fn schedule_step(
        &mut self,
        ledger: &mut Ledger,
        pool: &mut PagePool,
        ctx: &StepContext,
        now: Timestamp,
        host: &mut impl AdmissionHost,
    ) -> StepDecisions {
        let mut out = StepDecisions::default();
        let mut state = StepState {
            running: ctx.running_requests,
            unticketed_pages: ctx.unticketed_prefill_pages,
            admitted: 0,
        };
        let mut cursor = AdmissionOrder {
            priority: 0,
            seq: 0,
        };
        let mut blocked_at = None;
        while let Some((order, req)) = self.queue.next_from(cursor) {
            cursor = AdmissionOrder {
                priority: order.priority,
                seq: order.seq + 1,
            };
            if state.admitted >= ctx.max_admissions {
                out.blocked = Some(BlockedHead {
                    req,
                    reason: BlockReason::AdmissionLimit,
                });
                break;
            }
            out.examined += 1;
            let blocked = match host.examine(req) {
                Candidate::Cold { need_pages } => {
                    self.try_cold(ledger, pool, ctx, &mut state, req, need_pages, &mut out)
                }
                Candidate::RestoreReady => {
                    self.admit_ready(req, &mut state, &mut out);
                    None
                }
                Candidate::RestorePending => {
                    out.restore_polls += 1;
                    Some(BlockReason::RestorePending)
                }
                Candidate::RestoreNeedsTicket(spec) => {
                    out.restore_polls += 1;
                    let preflight = preflight(ctx, &state);
                    match ledger.reserve(pool, req, order, &spec, &preflight, now) {
                        Ok(ticket) => {
                            out.decisions.push(Decision::Reserved { ticket });
                            Some(BlockReason::RestorePending)
                        }
                        Err(cause) if cause.kind() == ErrorKind::Pressure => {
                            Some(BlockReason::RestorePressure(cause))
                        }
                        Err(cause) => {
                            let _cleared = ledger.release(req, pool);
                            self.queue.unmark_ready(req).ok();
                            let need_pages = host.fall_back(req, &cause);
                            out.decisions.push(Decision::FellBack { req, cause });
                            self.try_cold(ledger, pool, ctx, &mut state, req, need_pages, &mut out)
                        }
                    }
                }
            };
            if let Some(reason) = blocked {
                out.blocked = Some(BlockedHead { req, reason });
                blocked_at = Some(order);
                break;
            }
        }
        if let Some(mut after) = blocked_at {
            // Only ready imports that own their capacity pass the blocked head.
            while let Some((order, req)) = self.queue.next_ready_after(after) {
                after = order;
                if state.admitted >= ctx.max_admissions {
                    break;
                }
                out.examined += 1;
                if host.examine(req) == Candidate::RestoreReady {
                    self.admit_ready(req, &mut state, &mut out);
                } else {
                    self.queue.unmark_ready(req).ok();
                }
            }
        }
        out
    }

    fn admit_ready(&mut self, req: RequestId, state: &mut StepState, out: &mut StepDecisions) {
        self.queue.remove(req);
        state.admitted += 1;
        out.decisions.push(Decision::AdmitReady { req });
    }

    /// Admits a cold request if it fits; returns why it blocked otherwise.
    #[allow(
        clippy::too_many_arguments,
        reason = "the step's state, passed down unchanged"
    )]
    fn try_cold(
        &mut self,
        ledger: &Ledger,
        pool: &PagePool,
        ctx: &StepContext,
        state: &mut StepState,
        req: RequestId,
        need_pages: u32,
        out: &mut StepDecisions,
    ) -> Option<BlockReason> {
        let usable_pages = pool.n_usable();
        if need_pages > usable_pages {
            self.queue.remove(req);
            out.decisions.push(Decision::Rejected {
                req,
                need_pages,
                usable_pages,
            });
            return None;
        }
        let free_slots = ledger.free_slots(state.running);
        let available_pages = ledger.available_pages(pool, &preflight(ctx, state));
        if free_slots == 0 || need_pages > available_pages {
            return Some(BlockReason::Pressure {
                need_pages,
                available_pages,
                free_slots,
            });
        }
        self.queue.remove(req);
        state.running += 1;
        state.unticketed_pages = state.unticketed_pages.saturating_add(need_pages);
        state.admitted += 1;
        out.decisions.push(Decision::AdmitCold { req, need_pages });
        None
    }
}

fn preflight(ctx: &StepContext, state: &StepState) -> Preflight {
    Preflight {
        running_requests: state.running,
        unticketed_prefill_pages: state.unticketed_pages,
        watermark_pages: ctx.watermark_pages,
        other_work_scheduled: ctx.other_work_scheduled || state.admitted > 0,
    }
}
