//! The restore policies as code: one `RestorePolicy` per `Policy`, each holding what its mechanism needs
//! (only `reserved` and `oracle` keep a reservation ledger). The engine asks its policy wherever the mechanisms
//! differ and never infers the policy from its own state.
//!
//! Who holds each page reference of an import (the pool counts them; `Engine::check_invariants` checks that
//! every reference has exactly one of these owners):
//!
//! | import stage                      | `ordinary` ([`Ordinary`])           | `pages-only` ([`PagesOnly`])  | `reserved`, `oracle` ([`Reserved`])                    |
//! |-----------------------------------|-------------------------------------|-------------------------------|-------------------------------------------------------|
//! | reserved                          | -                                   | -                             | the ticket (`Ledger::reserve` allocates them, R1)     |
//! | staged (copying)                  | the index and the admitted request  | the index (`stage` allocates) | the index (`stage_into`; the ticket hands its refs over) |
//! | published, not admitted           | -                                   | nobody: cached, evictable     | the index (an owned ready import, O3)                 |
//! | admitted                          | the request                         | the request (if still cached) | the request (`ResidentIndex::acquire`, O4)            |
//! | cancelled or failed while copying | the index until drained (O5, O7)    | the index until drained       | the index until drained                               |
//!
//! One owner drains: the index, whichever the policy. The ledger keeps the ticket's slot and credits, never its
//! pages, once the import is staged (`Ledger::hand_over_pages`).

mod ordinary;
mod pages_only;
mod reserved;

use std::fmt;
use std::time::Duration;

use kv_pool::{AdmissionOrder, PageId, PagePool, RequestId, Timestamp};
use reservation::{ErrorKind, Ledger, LedgerConfig, Preflight, RestoreSpec};

pub(crate) use self::ordinary::Ordinary;
pub(crate) use self::pages_only::PagesOnly;
pub(crate) use self::reserved::Reserved;
use crate::error::Result;
use crate::params::EngineParams;
use crate::policy::Policy;

/// What a restore mechanism does at each point where the policies differ. Ledger-backed steps (credits,
/// tickets' allocations, slots) default to "no ledger": nothing held, and a `TicketHandle` handed to such a
/// policy (which never makes one) is an internal error.
pub(crate) trait RestorePolicy: fmt::Debug + Send {
    /// G1: an answered restore is tried at admission, at once or not at all, instead of reserving now (and a
    /// request whose local prefix was evicted does not ask the store again).
    fn restores_at_admission(&self) -> bool;

    /// Reserves an answered restore's destination before its copy starts.
    fn reserve(
        &mut self,
        pool: &mut PagePool,
        ask: &ReserveAsk<'_>,
    ) -> Result<Reservation, Refusal>;

    /// Whether a reservation needing `need_pages` (a [`Refusal::pressure_need`]) would be refused for pressure
    /// now whatever earlier capacity waiters hold: the free pages (`admissible_pages` where the policy has no
    /// ledger) or the slots refuse it already. `false` where the policy cannot tell without reserving.
    fn refuses_for_pressure(
        &self,
        _pool: &PagePool,
        _preflight: &Preflight,
        _admissible_pages: u32,
        _need_pages: u32,
    ) -> bool {
        false
    }

    /// The import of `ticket` is staged: the ticket's page references pass to the caller (the index took its
    /// own; the caller drops these).
    fn hand_over(&mut self, ticket: &TicketHandle) -> Result<Vec<PageId>> {
        Err(no_tickets(ticket))
    }

    /// `request`'s import is published (its copies landed and were verified): who owns its pages now.
    fn publish(&mut self, request: RequestId) -> Result<Publication>;

    /// Whether `request`'s capacity wait, started at `started` (its first refusal), is over at `now` (W1).
    fn wait_expired(
        &mut self,
        request: RequestId,
        now: Timestamp,
        started: Option<Timestamp>,
        max_wait: Duration,
    ) -> bool;

    /// A refused restore still under pressure after `waited`: whether the policy's own bounded wait is over
    /// (a ledger's waiters expire in the ledger instead).
    fn own_wait_over(&self, waited: Duration, max_wait: Duration) -> bool;

    /// Pages promised to tickets' remaining prompts (C1): free pages others may not take.
    fn credit_pages(&self) -> u32 {
        0
    }

    /// Running slots held by tickets not yet admitted.
    fn slots_held(&self) -> u32 {
        0
    }

    /// Whether `request` runs on an admitted ticket: its pages come from its credits.
    fn holds_admitted_ticket(&self, _request: RequestId) -> bool {
        false
    }

    /// `need` pages for `request`'s admitted ticket from its credits; `None` when they are not there now.
    fn allocate_from_ticket(
        &mut self,
        _pool: &mut PagePool,
        request: RequestId,
        _need: u32,
    ) -> Result<Option<Vec<PageId>>> {
        Err(crate::error::Error::internal(format!(
            "{request} allocates from a ticket under a policy without tickets"
        )))
    }

    /// `n` window pages drawn from `request`'s credits left its window: the credits come back (C4).
    fn release_window_pages(&mut self, _request: RequestId, _n: u32) -> Result<()> {
        Ok(())
    }

    /// The ready import of `ticket` is admitted (O4): the ticket runs on, on its credits.
    fn admit(&mut self, ticket: &TicketHandle, _pool: &mut PagePool) -> Result<()> {
        Err(no_tickets(ticket))
    }

    /// The request computed every token `ticket` budgeted: the ticket ends (C6).
    fn finish_prompt(&mut self, ticket: TicketHandle) -> Result<()> {
        Err(no_tickets(&ticket))
    }

    /// Ends `ticket` at once: its slot, its credits and the pages it still holds.
    fn release(&mut self, ticket: TicketHandle, _pool: &mut PagePool) -> Result<()> {
        Err(no_tickets(&ticket))
    }

    /// Forgets `request` as a capacity waiter, if it is one (a policy without a ledger keeps none).
    fn forget_waiter(&mut self, _request: RequestId) {}

    /// The reservation ledger, where the policy keeps one: for views, invariants and the admission step.
    fn ledger(&self) -> Option<&Ledger> {
        None
    }
}

/// The policy `params` names.
pub(crate) fn for_params(params: &EngineParams) -> Box<dyn RestorePolicy> {
    match params.policy {
        Policy::Ordinary => Box::new(Ordinary),
        Policy::PagesOnly => Box::new(PagesOnly),
        Policy::Reserved | Policy::Oracle => Box::new(Reserved::new(Ledger::new(
            params.geometry.clone(),
            LedgerConfig {
                max_running_slots: params.max_running,
                restore_max_wait: params.restore_max_wait,
            },
        ))),
    }
}

/// A ticket of the reservation ledger, held by its request (`Req::ticket`) from the reservation until it ends.
/// Only a policy with a ledger makes one, and every step on the ticket takes it: ending the ticket (`release`,
/// `finish_prompt`) consumes the handle, so no ticket ends twice, and the type says who owns it. It does not
/// release itself on drop: the ledger and the pool belong to the engine, which alone knows whether a copy
/// still writes the pages (O5). A handle dropped without ending its ticket leaves a ledger ticket that no
/// request holds, which `Engine::check_invariants` reports.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a ticket ends by `RestorePolicy::release` or `RestorePolicy::finish_prompt`"]
pub(crate) struct TicketHandle {
    request: RequestId,
}

impl TicketHandle {
    /// The handle of `request`'s new ticket: only a policy with a ledger makes one, when it reserved.
    fn new(request: RequestId) -> TicketHandle {
        TicketHandle { request }
    }

    /// The request whose ticket it is.
    pub(crate) fn request(&self) -> RequestId {
        self.request
    }
}

/// A ticket handed to a policy that makes none: a bug.
fn no_tickets(ticket: &TicketHandle) -> crate::error::Error {
    crate::error::Error::internal(format!(
        "{}: a ticket handed to a policy without tickets",
        ticket.request
    ))
}

/// An answered restore's reservation request.
#[derive(Debug)]
pub(crate) struct ReserveAsk<'a> {
    pub(crate) request: RequestId,
    pub(crate) order: AdmissionOrder,
    /// What a ticket covers: the import, the continuation's chunks, captures and draft lookahead.
    pub(crate) spec: RestoreSpec,
    /// What else competes this step (R2).
    pub(crate) preflight: &'a Preflight,
    /// Pages the import copies into.
    pub(crate) import_pages: u32,
    /// Pages an ordinary admission could take now (free pages under the watermark).
    pub(crate) admissible_pages: u32,
    pub(crate) now: Timestamp,
    pub(crate) max_wait: Duration,
}

/// A reservation made.
#[derive(Debug)]
pub(crate) enum Reservation {
    /// A ticket holds these destination pages (with a slot and credits): the import is staged into them.
    Ticket {
        ticket: TicketHandle,
        pages: Vec<PageId>,
    },
    /// The pages are free now; the index allocates them when it stages the import.
    PagesFreeNow,
}

/// Who owns a published import's pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Publication {
    /// Its request, through the index, until admitted (O3).
    Owned,
    /// Nobody: they are cached pages, as evictable as any (`pages-only`).
    Unowned,
}

/// A reservation refused; the message is formatted only when logged.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// The ledger's refusal: pressure, impossible, expired or invalid.
    Ledger(reservation::Error),
    /// The import's pages are not free now.
    PagesNotFree { need: u32, free: u32 },
    /// The pages are not free now and the policy waits no time for them.
    NoWait,
    /// The engine asked a policy for a step its mechanism does not have (a bug).
    Internal(crate::error::Error),
}

impl Refusal {
    /// The pages a reservation refused for pressure needs; `None` for any other refusal.
    pub(crate) fn pressure_need(&self) -> Option<u32> {
        match self {
            Refusal::Ledger(reservation::Error::Pressure { need_pages, .. }) => Some(*need_pages),
            Refusal::PagesNotFree { need, .. } => Some(*need),
            _ => None,
        }
    }

    /// The kind of refusal: what the coordinator does next.
    pub(crate) fn kind(&self) -> ErrorKind {
        match self {
            Refusal::Ledger(error) => error.kind(),
            Refusal::PagesNotFree { .. } => ErrorKind::Pressure,
            Refusal::NoWait => ErrorKind::Expired,
            Refusal::Internal(_) => ErrorKind::Invalid,
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Ledger(error) => error.fmt(f),
            Refusal::PagesNotFree { need, free } => write!(f, "need {need} pages, {free} free"),
            Refusal::NoWait => f.write_str("the pages are not free and the restore waits no time"),
            Refusal::Internal(error) => error.fmt(f),
        }
    }
}

#[cfg(test)]
mod tests;
