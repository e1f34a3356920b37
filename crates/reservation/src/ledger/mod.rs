//! The `Ledger`: tickets (destination pages + one running slot + execution credits, taken together or not at
//! all), credit consumption as the consumer computes its prompt, capacity waiters in admission order with
//! their needs, bounded-wait expiry and idempotent release.
//!
//! The ledger never holds a page a copy writes: a caller hands an import's pages over (`hand_over_pages`) before
//! it submits a copy into them, and their holder (the resident index) pins them until the copies drained (O5).
//! A ticket released before that hand-over gives its pages back at once: no copy ever received them.
//!
//! Ticket life: `reserve` (Importing: pages copying) -> `publish` (Ready: owned by its waiting consumer) ->
//! `admit` (Admitted: the slot becomes the consumer's running slot, the ticket's page references are dropped
//! after the consumer acquired the pages) -> `allocate` / `consume` / `release_window_pages` while the prompt is
//! computed -> `finish_prompt` (credits gone). `release` ends any stage at once.
//!
//! Credits: a ticket reserves `peak` pages; its outstanding credits are `peak - held`, where `held` counts the
//! pages the consumer currently holds from them. Window pages the consumer frees lower `held`, so freed pages
//! stay protected for it (C4). Other requests see `n_free - credits` (R2, C1); running decodes may dip into
//! credit-protected pages (C5): the ledger tolerates `n_free < credits` and never asks anyone to preempt.
//!
//! Layout: this file holds the `Ledger` type, its entries, reserve / hand over / publish / admit / release,
//! and the counting queries; `credits.rs` the admitted consumer's credit use (`allocate`, `consume`,
//! `release_window_pages`, `finish_prompt`); `waiters.rs` capacity waiters, their holds and bounded-wait
//! expiry; `view.rs` the `snapshot` views and `check_invariants`.

mod credits;
mod view;
mod waiters;

use std::collections::BTreeMap;

use kv_pool::{Geometry, PageId, PagePool, RestoreNeed};

use crate::config::{LedgerConfig, Preflight};
use crate::error::{Error, Result};
use crate::spec::RestoreSpec;
use kv_pool::{AdmissionOrder, RequestId, Timestamp};

pub use view::{LedgerSnapshot, TicketView, WaiterView};

/// Where a ticket is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TicketState {
    /// Destination pages reserved, copies in flight. Schedules nothing.
    Importing,
    /// Published on every rank, owned by its waiting consumer: a ready import.
    Ready,
    /// The consumer is admitted and computes its prompt from the credits.
    Admitted,
}

/// A granted reservation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ticket {
    /// The request.
    pub request: RequestId,
    /// The destination pages (one reference each, owned by the ticket until `admit` or `release`).
    pub import_pages: Vec<PageId>,
    /// Execution credits reserved for the continuation.
    pub credit_pages: u32,
}

/// What `release` gave back. All zero / `None` / `false` when the request held nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Released {
    /// A running slot held by a ticket.
    pub slot: bool,
    /// Outstanding credits released.
    pub credit_pages: u32,
    /// Destination pages whose ticket reference was dropped now: a ready import's (they become evictable) or
    /// an importing ticket's that never handed them over (no copy received them).
    pub freed_import_pages: u32,
    /// A capacity waiter (expired or not) was forgotten.
    pub waiter: bool,
}

impl Released {
    /// Whether nothing was held.
    #[cfg(test)]
    pub(crate) fn is_noop(&self) -> bool {
        *self == Released::default()
    }
}

#[derive(Clone, Debug)]
struct TicketEntry {
    state: TicketState,
    import_pages: Vec<PageId>,
    /// The pages went to the import that copies into them (`hand_over_pages`): their holder drains them.
    handed_over: bool,
    peak_credit_pages: u32,
    held_pages: u32,
}

impl TicketEntry {
    fn outstanding(&self) -> u32 {
        self.peak_credit_pages.saturating_sub(self.held_pages)
    }

    fn holds_slot(&self) -> bool {
        self.state != TicketState::Admitted
    }
}

#[derive(Clone, Copy, Debug)]
struct WaiterEntry {
    need_pages: u32,
    since: Timestamp,
    expired: bool,
}

/// The restore-admission ledger over one pool (every rank's pool has the same size; counts are per rank).
#[derive(Clone, Debug)]
pub struct Ledger {
    geometry: Geometry,
    config: LedgerConfig,
    tickets: BTreeMap<RequestId, TicketEntry>,
    waiters: BTreeMap<(AdmissionOrder, RequestId), WaiterEntry>,
    waiter_orders: BTreeMap<RequestId, AdmissionOrder>,
    /// The holds of the waiters before a key at one time, kept between calls so that a step that polls its
    /// waiters in admission order sums each waiter once, not once per later waiter.
    hold_cursor: Option<waiters::HoldCursor>,
    credit_pages: u32,
    slots_held: u32,
}

impl Ledger {
    /// An empty ledger for pools of `geometry`.
    pub fn new(geometry: Geometry, config: LedgerConfig) -> Ledger {
        Ledger {
            geometry,
            config,
            tickets: BTreeMap::new(),
            waiters: BTreeMap::new(),
            waiter_orders: BTreeMap::new(),
            hold_cursor: None,
            credit_pages: 0,
            slots_held: 0,
        }
    }

    /// The pool geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// The limits.
    pub fn config(&self) -> &LedgerConfig {
        &self.config
    }

    /// Validates `spec` (R4) and computes what it needs: import pages and credits.
    pub fn need(&self, spec: &RestoreSpec) -> Result<RestoreNeed> {
        spec.need(&self.geometry)
    }

    /// Reserve-with-admission (R1): allocates the destination pages from `pool` and takes one running slot and
    /// the execution credits together, or nothing at all. Answers, in order of precedence:
    /// - `Invalid` (R4): `request` already holds a ticket, or `spec` is invalid; nothing changes.
    /// - `Impossible` (R3): import + credits exceed `pool.n_usable()`; the pool is untouched and `request` is no
    ///   longer a waiter.
    /// - `Expired` (W1): `request` waited `restore_max_wait` since its first refusal; refused even when space
    ///   exists, warned about exactly once.
    /// - `Pressure` (R2, R5, Q2): no free slot, or the need does not fit `n_free` minus other tickets' credits,
    ///   in-flight unticketed prefill needs, the watermark (only while other work is scheduled) and the space
    ///   and slots of earlier capacity waiters. Nothing is allocated or evicted; `request` is recorded (or
    ///   refreshed) as a capacity waiter with its need; with a zero wait it expires at once.
    pub fn reserve(
        &mut self,
        pool: &mut PagePool,
        request: RequestId,
        order: AdmissionOrder,
        spec: &RestoreSpec,
        preflight: &Preflight,
        now: Timestamp,
    ) -> Result<Ticket> {
        if self.tickets.contains_key(&request) {
            return Err(Error::TicketExists { request });
        }
        let need = self.need(spec)?;
        let need_pages = need.total_pages();
        if !Geometry::fits_empty_pool(need_pages, pool.n_usable()) {
            self.forget_waiter(request);
            return Err(Error::Impossible {
                need_pages,
                usable_pages: pool.n_usable(),
            });
        }
        self.check_expiry(request, now)?;
        let free_slots = self.free_slots(preflight.running_requests);
        let available_pages = self.available_pages(pool, preflight);
        // Earlier waiters' holds only lower what is available: when the pool or the slots refuse already, the
        // answer is pressure whatever they hold, and the sum over them (one per waiter polled) is skipped. The
        // error then gives the figures before the holds.
        let (free_slots, available_pages) = if free_slots == 0 || need_pages > available_pages {
            (free_slots, available_pages)
        } else {
            let (held_pages, held_slots) = self.earlier_waiters_hold(order, request, now);
            (
                free_slots.saturating_sub(held_slots),
                available_pages.saturating_sub(held_pages),
            )
        };
        if free_slots == 0 || need_pages > available_pages {
            // A new waiter with no wait at all expires at once; one already waiting passed the same check
            // above, and a refresh keeps its first refusal's time.
            if self.record_waiter(request, order, need_pages, now) {
                self.check_expiry(request, now)?;
            }
            return Err(Error::Pressure {
                need_pages,
                available_pages,
                free_slots,
            });
        }
        let import_pages = pool.allocate(need.import_pages)?;
        self.forget_waiter(request);
        self.tickets.insert(
            request,
            TicketEntry {
                state: TicketState::Importing,
                import_pages: import_pages.clone(),
                handed_over: false,
                peak_credit_pages: need.credit_pages,
                held_pages: 0,
            },
        );
        self.credit_pages += need.credit_pages;
        self.slots_held += 1;
        Ok(Ticket {
            request,
            import_pages,
            credit_pages: need.credit_pages,
        })
    }

    /// Hands the page references of `request`'s importing ticket to the caller, who from now on holds them (for
    /// example a resident index that staged an import into them: it pins the pages while copies write and
    /// drains them after a cancel, so one owner does both). The ticket keeps its slot and credits; releasing
    /// it later gives back no pages. Hand them over before submitting any copy into them.
    pub fn hand_over_pages(&mut self, request: RequestId) -> Result<Vec<PageId>> {
        let entry = self.entry_in(request, TicketState::Importing)?;
        entry.handed_over = true;
        Ok(std::mem::take(&mut entry.import_pages))
    }

    /// The import was published on every rank: the ticket becomes a ready import, still owned by `request`.
    pub fn publish(&mut self, request: RequestId) -> Result<()> {
        let entry = self.entry_in(request, TicketState::Importing)?;
        entry.state = TicketState::Ready;
        Ok(())
    }

    /// The consumer is admitted: it has acquired the import's pages through the ordinary prefix-hit path, so
    /// the ticket drops its page references (they stay held by the consumer) and its slot becomes the
    /// consumer's running slot (count it in `Preflight::running_requests` from now on). Credits remain until
    /// `finish_prompt`.
    pub fn admit(&mut self, request: RequestId, pool: &mut PagePool) -> Result<()> {
        let entry = self.entry_in(request, TicketState::Ready)?;
        pool.free_all(&entry.import_pages)?;
        entry.import_pages.clear();
        entry.state = TicketState::Admitted;
        self.slots_held -= 1;
        Ok(())
    }

    /// Releases everything `request` holds, idempotently (a second call returns a no-op `Released`): its capacity
    /// waiter (expired or not: its hold lifts, Q2), its ticket's slot and credits at once, and the page
    /// references the ticket still holds (a ready import's become evictable, O6; an import that never handed
    /// its pages over gives them back, since no copy received them). Pages handed to an import stay with their
    /// holder, which drains them (O5). Also the cancel path.
    pub fn release(&mut self, request: RequestId, pool: &mut PagePool) -> Released {
        let waiter = self.forget_waiter(request);
        let mut released = self.release_ticket(request, pool);
        released.waiter = waiter;
        released
    }

    /// Outstanding credits of all tickets.
    pub fn credit_pages(&self) -> u32 {
        self.credit_pages
    }

    /// Outstanding credits of `request` (0 without a ticket).
    #[cfg(test)]
    pub(crate) fn credit_pages_of(&self, request: RequestId) -> u32 {
        self.tickets
            .get(&request)
            .map_or(0, TicketEntry::outstanding)
    }

    /// Running slots held by tickets not yet admitted.
    pub fn slots_held(&self) -> u32 {
        self.slots_held
    }

    /// Running slots free for a new ticket or admission, given `running_requests` admitted requests.
    pub fn free_slots(&self, running_requests: u32) -> u32 {
        self.config
            .max_running_slots
            .saturating_sub(running_requests)
            .saturating_sub(self.slots_held)
    }

    /// Pages a new request may take now (R2): free pages minus all credits, unticketed prefill needs and the
    /// applied watermark. Capacity waiters' holds are not subtracted (they only hold back later restores).
    pub fn available_pages(&self, pool: &PagePool, preflight: &Preflight) -> u32 {
        crate::rules::pages_available_to_admit(pool.n_free(), self.credit_pages, preflight)
    }

    /// The stage of `request`'s ticket, if it holds one.
    pub fn ticket_state(&self, request: RequestId) -> Option<TicketState> {
        self.tickets.get(&request).map(|entry| entry.state)
    }

    /// Whether `request` holds a ticket or is a waiter.
    #[cfg(test)]
    pub(crate) fn holds_anything(&self, request: RequestId) -> bool {
        self.tickets.contains_key(&request) || self.waiter_orders.contains_key(&request)
    }

    /// Tickets.
    #[cfg(test)]
    pub(crate) fn n_tickets(&self) -> usize {
        self.tickets.len()
    }

    fn entry_in(&mut self, request: RequestId, expected: TicketState) -> Result<&mut TicketEntry> {
        let entry = self
            .tickets
            .get_mut(&request)
            .ok_or(Error::NoTicket { request })?;
        if entry.state != expected {
            return Err(Error::WrongTicketState {
                request,
                state: entry.state,
                expected,
            });
        }
        Ok(entry)
    }

    /// Removes `request`'s ticket, giving back its slot and outstanding credits; the entry's pages are the
    /// caller's to settle (`release` does, by the ticket's state).
    fn remove_ticket(&mut self, request: RequestId) -> Option<(TicketEntry, Released)> {
        let entry = self.tickets.remove(&request)?;
        let released = Released {
            slot: entry.holds_slot(),
            credit_pages: entry.outstanding(),
            ..Released::default()
        };
        self.credit_pages -= released.credit_pages;
        if released.slot {
            self.slots_held -= 1;
        }
        Some((entry, released))
    }

    /// Removes `request`'s ticket and drops the page references it still holds: a ready import's, or an
    /// importing ticket's that never handed them over (no copy received them). Handed-over and admitted
    /// tickets hold none.
    fn release_ticket(&mut self, request: RequestId, pool: &mut PagePool) -> Released {
        let Some((entry, mut released)) = self.remove_ticket(request) else {
            return Released::default();
        };
        let freed = pool.free_all(&entry.import_pages);
        debug_assert!(
            freed.is_ok(),
            "ticket pages of {request} not referenced: {freed:?}"
        );
        released.freed_import_pages = entry.import_pages.len() as u32;
        released
    }
}

#[cfg(test)]
mod tests;
