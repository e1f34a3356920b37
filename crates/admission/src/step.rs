//! One admission step: walk the waiting queue and the ready-import list together, in order, from their head,
//! admitting cold requests that fit (free slot, free pages after credits, unticketed prefills and the
//! watermark), ready imports, and restores at once, until the head blocks; then walk only the ready-import
//! list (Q1). Restores that still need a ticket are not in the walk: the host's restore coordinator reserves
//! them (the engine's `coordinator.rs`), so a pending restore costs a step one poll there (Q8). Each admission is carried out by the host at once. A
//! step examines the requests it admits, the blocked head and the ready imports: never the rest of the queue
//! (Q8).

use kv_pool::{AdmissionOrder, RequestId};
use reservation::{Ledger, Preflight};

use crate::host::{AdmissionHost, Admit, Candidate, FallbackCause, HostState};
use crate::queue::WaitingQueue;

/// The host's state at the start of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepContext {
    /// Admitted requests running (they hold running slots; tickets' slots are the ledger's).
    pub running_requests: u32,
    /// The running-slot limit when the host has no ledger (with one, `LedgerConfig::max_running_slots` rules).
    pub max_running_slots: u32,
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
            max_running_slots: u32::MAX,
            unticketed_prefill_pages: 0,
            watermark_pages: 0,
            other_work_scheduled: false,
            max_admissions: u32::MAX,
        }
    }
}

/// One decision of a step, in the order taken. Admissions, withdrawals and fallbacks were carried out by the
/// host during the step; `Reserved` and `Rejected` are for the caller to act on. Admitted, withdrawn and
/// rejected requests have left the queues.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// An ordinary request was admitted (`Admit::Cold`).
    AdmitCold {
        /// The request.
        request: RequestId,
        /// Pages it said it needs.
        need_pages: u32,
    },
    /// A ready import was admitted (`Admit::Ready`).
    AdmitReady {
        /// The request.
        request: RequestId,
    },
    /// A restore without reservations was admitted with its import (`Admit::RestoreAtOnce`).
    AdmitRestoreAtOnce {
        /// The request.
        request: RequestId,
        /// Pages it said it needs.
        need_pages: u32,
    },
    /// The restore was given up (ledger state cleared); the request recomputes (an `AdmitCold` follows if it
    /// fits now).
    FellBack {
        /// The request.
        request: RequestId,
        /// Why.
        cause: FallbackCause,
    },
    /// The host took the request out of the queue (`Candidate::Withdrawn`).
    Withdrawn {
        /// The request.
        request: RequestId,
    },
    /// A cold request that can never fit the whole usable pool: removed from the queue; abort it.
    Rejected {
        /// The request.
        request: RequestId,
        /// Pages it needs.
        need_pages: u32,
        /// Usable pages of the pool.
        usable_pages: u32,
    },
}

/// Why the head blocked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlockReason {
    /// A cold request (or a restore at once) does not fit now: no free slot or not enough available pages.
    Pressure {
        /// Pages it needs.
        need_pages: u32,
        /// Pages available to it.
        available_pages: u32,
        /// Free running slots.
        free_slots: u32,
    },
    /// The step's token budget is spent.
    OutOfBudget,
    /// It waits for an earlier request that cannot be admitted yet (`Candidate::WaitsBehind`).
    WaitsBehind,
    /// The step reached `max_admissions`.
    AdmissionLimit,
}

/// The request that blocked FCFS and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockedHead {
    /// The request.
    pub request: RequestId,
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
}

/// One admission step (R2-R5, Q1-Q3, Q8, W1, and G1's restore at once) over the host's queues. See the
/// module doc. Errors only with the host's own errors.
pub fn schedule_step<H: AdmissionHost>(
    ctx: &StepContext,
    host: &mut H,
) -> Result<StepDecisions, H::Error> {
    let mut step = Step {
        ctx,
        running: ctx.running_requests,
        admitted: 0,
        out: StepDecisions::default(),
    };
    let mut cursor = None;
    let mut blocked_at = None;
    while let Some((order, request, on_ready_list)) = next_entry(&host.state(), cursor) {
        cursor = Some(order);
        if step.admitted >= ctx.max_admissions {
            step.out.blocked = Some(BlockedHead {
                request,
                reason: BlockReason::AdmissionLimit,
            });
            break;
        }
        let candidate = step.examine(host, request)?;
        if on_ready_list && candidate != Candidate::RestoreReady {
            // No longer a ready import: it waits in the queue at its place like anyone else.
            let state = host.state();
            let _moved = state.ready.move_to(request, state.waiting);
        }
        if let Some(reason) = step.consider(host, order, request, candidate)? {
            step.out.blocked = Some(BlockedHead { request, reason });
            blocked_at = Some(order);
            break;
        }
    }
    if let Some(mut after) = blocked_at {
        // Only ready imports that own their capacity pass the blocked head.
        while let Some((order, request)) = host.state().ready.next_after(after) {
            after = order;
            if step.admitted >= ctx.max_admissions {
                break;
            }
            if step.examine(host, request)? == Candidate::RestoreReady {
                step.admit(host, order, Admit::Ready { request })?;
            } else {
                let state = host.state();
                let _moved = state.ready.move_to(request, state.waiting);
            }
        }
    }
    Ok(step.out)
}

/// The first entry after `after` (from the head when `None`) in either queue: its place, the request, and
/// whether it is on the ready-import list.
fn next_entry(
    state: &HostState<'_>,
    after: Option<AdmissionOrder>,
) -> Option<(AdmissionOrder, RequestId, bool)> {
    let next = |queue: &WaitingQueue| match after {
        Some(after) => queue.next_after(after),
        None => queue.next_from(AdmissionOrder::default()),
    };
    let (waiting, ready) = (next(state.waiting), next(state.ready));
    match (waiting, ready) {
        (Some(waiting), Some(ready)) if ready.0 < waiting.0 => Some((ready.0, ready.1, true)),
        (Some(waiting), _) => Some((waiting.0, waiting.1, false)),
        (None, Some(ready)) => Some((ready.0, ready.1, true)),
        (None, None) => None,
    }
}

/// Running totals of one step.
struct Step<'a> {
    ctx: &'a StepContext,
    running: u32,
    admitted: u32,
    out: StepDecisions,
}

impl Step<'_> {
    fn examine<H: AdmissionHost>(
        &mut self,
        host: &mut H,
        request: RequestId,
    ) -> Result<Candidate, H::Error> {
        self.out.examined += 1;
        let free_slots = self.free_slots(host.state().ledger);
        host.examine(request, free_slots)
    }

    /// Acts on `request`'s candidate; returns why it blocks the head, if it does.
    fn consider<H: AdmissionHost>(
        &mut self,
        host: &mut H,
        order: AdmissionOrder,
        request: RequestId,
        candidate: Candidate,
    ) -> Result<Option<BlockReason>, H::Error> {
        match candidate {
            Candidate::Cold { need_pages } => self.try_cold(host, order, request, need_pages),
            Candidate::OutOfBudget => Ok(Some(BlockReason::OutOfBudget)),
            Candidate::WaitsBehind => Ok(Some(BlockReason::WaitsBehind)),
            Candidate::Withdrawn => {
                let state = host.state();
                for queue in [state.waiting, state.ready] {
                    if queue.get(&order) == Some(request) {
                        queue.remove(&order);
                    }
                }
                self.out.decisions.push(Decision::Withdrawn { request });
                Ok(None)
            }
            Candidate::RestoreAtOnce { need_pages } => {
                self.try_restore_at_once(host, order, request, need_pages)
            }
            Candidate::RestoreReady => {
                self.admit(host, order, Admit::Ready { request })?;
                Ok(None)
            }
        }
    }

    /// The restore recomputes: off the ready list, the host drops it, and it is tried as a cold request.
    fn fall_back<H: AdmissionHost>(
        &mut self,
        host: &mut H,
        order: AdmissionOrder,
        request: RequestId,
        cause: FallbackCause,
    ) -> Result<Option<BlockReason>, H::Error> {
        let state = host.state();
        if state.ready.get(&order) == Some(request) {
            let _moved = state.ready.move_to(request, state.waiting);
        }
        let need_pages = host.fall_back(request, &cause)?;
        self.out
            .decisions
            .push(Decision::FellBack { request, cause });
        self.try_cold(host, order, request, need_pages)
    }

    /// `ordinary`: the import and first chunk now, or a cold request at once. No free slot blocks it as it is.
    fn try_restore_at_once<H: AdmissionHost>(
        &mut self,
        host: &mut H,
        order: AdmissionOrder,
        request: RequestId,
        need_pages: u32,
    ) -> Result<Option<BlockReason>, H::Error> {
        let (free_slots, available_pages) = self.gates(host);
        if free_slots == 0 {
            return Ok(Some(BlockReason::Pressure {
                need_pages,
                available_pages,
                free_slots,
            }));
        }
        if need_pages <= available_pages
            && self.admit(
                host,
                order,
                Admit::RestoreAtOnce {
                    request,
                    need_pages,
                },
            )?
        {
            return Ok(None);
        }
        let cause = FallbackCause::NotAtOnce {
            need_pages,
            available_pages,
        };
        self.fall_back(host, order, request, cause)
    }

    /// Admits a cold request if it fits; returns why it blocked otherwise.
    fn try_cold<H: AdmissionHost>(
        &mut self,
        host: &mut H,
        order: AdmissionOrder,
        request: RequestId,
        need_pages: u32,
    ) -> Result<Option<BlockReason>, H::Error> {
        let usable_pages = host.state().pool.n_usable();
        if need_pages > usable_pages {
            host.state().waiting.remove(&order);
            self.out.decisions.push(Decision::Rejected {
                request,
                need_pages,
                usable_pages,
            });
            return Ok(None);
        }
        let (free_slots, available_pages) = self.gates(host);
        let blocked = BlockReason::Pressure {
            need_pages,
            available_pages,
            free_slots,
        };
        if free_slots == 0 || need_pages > available_pages {
            return Ok(Some(blocked));
        }
        let admitted = self.admit(
            host,
            order,
            Admit::Cold {
                request,
                need_pages,
            },
        )?;
        debug_assert!(admitted, "a cold admission that fits succeeds");
        Ok((!admitted).then_some(blocked))
    }

    /// Has the host carry out `admit`; on success the request leaves the queues and takes a running slot.
    fn admit<H: AdmissionHost>(
        &mut self,
        host: &mut H,
        order: AdmissionOrder,
        admit: Admit,
    ) -> Result<bool, H::Error> {
        let request = admit.request();
        // FCFS among requests that own no capacity: only a ready import passes a waiting request.
        debug_assert!(
            matches!(admit, Admit::Ready { .. })
                || host.state().waiting.iter().next() == Some((order, request)),
            "{request} was admitted without owning capacity while an earlier request waits"
        );
        if !host.admit(admit)? {
            return Ok(false);
        }
        // The host may have taken it off its queue already (the engine moves it to its running list).
        let state = host.state();
        for queue in [state.waiting, state.ready] {
            if queue.get(&order) == Some(request) {
                queue.remove(&order);
            }
        }
        self.running += 1;
        self.admitted += 1;
        self.out.decisions.push(match admit {
            Admit::Cold {
                request,
                need_pages,
            } => Decision::AdmitCold {
                request,
                need_pages,
            },
            Admit::Ready { request } => Decision::AdmitReady { request },
            Admit::RestoreAtOnce {
                request,
                need_pages,
            } => Decision::AdmitRestoreAtOnce {
                request,
                need_pages,
            },
        });
        Ok(true)
    }

    /// Free running slots and pages available to a new admission now.
    fn gates<H: AdmissionHost>(&self, host: &mut H) -> (u32, u32) {
        let preflight = self.preflight();
        let HostState { ledger, pool, .. } = host.state();
        let available_pages = match ledger {
            Some(ledger) => ledger.available_pages(pool, &preflight),
            None => reservation::pages_available_to_admit(pool.n_free(), 0, &preflight),
        };
        (self.free_slots(ledger), available_pages)
    }

    fn free_slots(&self, ledger: Option<&Ledger>) -> u32 {
        match ledger {
            Some(ledger) => ledger.free_slots(self.running),
            None => self.ctx.max_running_slots.saturating_sub(self.running),
        }
    }

    fn preflight(&self) -> Preflight {
        Preflight {
            running_requests: self.running,
            unticketed_prefill_pages: self.ctx.unticketed_prefill_pages,
            watermark_pages: self.ctx.watermark_pages,
            other_work_scheduled: self.ctx.other_work_scheduled || self.admitted > 0,
        }
    }
}
