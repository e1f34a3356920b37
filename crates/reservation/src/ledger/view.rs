//! Read-only views of the ledger: `snapshot` with its `LedgerSnapshot`, `TicketView` and `WaiterView` (for
//! tests and the engine's trace), and `check_invariants`, which checks the ledger's bookkeeping against a pool.

use crate::error::Result;
use kv_pool::PagePool;
use kv_pool::{ensure, ensure_eq};

use super::{Ledger, TicketEntry, TicketState};
use kv_pool::{AdmissionOrder, RequestId, Timestamp};

/// One ticket, as `snapshot` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TicketView {
    /// The request.
    pub request: RequestId,
    /// Its stage.
    pub state: TicketState,
    /// Whether it still holds its own running slot (until admitted).
    pub holds_slot: bool,
    /// Destination pages still referenced by the ticket.
    pub import_pages: u32,
    /// Whether the ticket handed its pages to the import that copies into them (`Ledger::hand_over_pages`).
    pub handed_over: bool,
    /// Credits reserved at the peak.
    pub peak_credit_pages: u32,
    /// Pages the consumer holds from its credits now.
    pub held_pages: u32,
    /// Outstanding credits: `peak - held`.
    pub credit_pages: u32,
}

/// One capacity waiter, as `snapshot` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaiterView {
    /// The request.
    pub request: RequestId,
    /// Its place in the admission order.
    pub order: AdmissionOrder,
    /// Pages it needs (import + credits).
    pub need_pages: u32,
    /// Its first refusal.
    pub since: Timestamp,
    /// Whether its bounded wait is over.
    pub expired: bool,
}

/// Everything the ledger holds, for tests and the engine's trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LedgerSnapshot {
    /// Tickets by request id.
    pub tickets: Vec<TicketView>,
    /// Capacity waiters in admission order.
    pub waiters: Vec<WaiterView>,
    /// Outstanding credits of all tickets.
    pub credit_pages: u32,
    /// Running slots held by tickets.
    pub slots_held: u32,
}

impl Ledger {
    /// Everything the ledger holds.
    pub fn snapshot(&self) -> LedgerSnapshot {
        LedgerSnapshot {
            tickets: self
                .tickets
                .iter()
                .map(|(&request, entry)| TicketView {
                    request,
                    state: entry.state,
                    holds_slot: entry.holds_slot(),
                    import_pages: entry.import_pages.len() as u32,
                    handed_over: entry.handed_over,
                    peak_credit_pages: entry.peak_credit_pages,
                    held_pages: entry.held_pages,
                    credit_pages: entry.outstanding(),
                })
                .collect(),
            waiters: self
                .waiters
                .iter()
                .map(|(&(order, request), waiter)| WaiterView {
                    request,
                    order,
                    need_pages: waiter.need_pages,
                    since: waiter.since,
                    expired: waiter.expired,
                })
                .collect(),
            credit_pages: self.credit_pages,
            slots_held: self.slots_held,
        }
    }

    /// Checks the ledger's invariants against `pool` (`InvariantBroken` names the first that fails): slots held by tickets never exceed the limit and match
    /// the tickets; the credit total is the sum of outstanding credits; every page a ticket holds
    /// is referenced in `pool`; a request is never both a ticket holder and a waiter; waiter indexes agree.
    pub fn check_invariants(&self, pool: &PagePool) -> Result<()> {
        let slots = self
            .tickets
            .values()
            .filter(|entry| entry.holds_slot())
            .count() as u32;
        ensure_eq!(slots, self.slots_held, "slot count drifted");
        ensure!(
            self.slots_held <= self.config.max_running_slots,
            "{} ticket slots exceed the limit {}",
            self.slots_held,
            self.config.max_running_slots
        );
        let credits: u32 = self.tickets.values().map(TicketEntry::outstanding).sum();
        ensure_eq!(credits, self.credit_pages, "credit total drifted");
        let ticket_pages = self.tickets.values().flat_map(|entry| &entry.import_pages);
        for &page in ticket_pages {
            let ref_count = pool.ref_count(page)?;
            ensure!(
                ref_count > 0,
                "ledger holds {page:?} but the pool has it free"
            );
        }
        for (&request, entry) in &self.tickets {
            ensure!(
                !self.waiter_orders.contains_key(&request),
                "{request} is both a ticket and a waiter"
            );
            if entry.state == TicketState::Admitted {
                ensure!(
                    entry.import_pages.is_empty(),
                    "admitted {request} still holds import pages"
                );
            }
            if entry.handed_over {
                ensure!(
                    entry.import_pages.is_empty(),
                    "{request} handed its pages over and still holds some"
                );
            }
        }
        ensure_eq!(
            self.waiters.len(),
            self.waiter_orders.len(),
            "waiter indexes disagree"
        );
        for (&request, &order) in &self.waiter_orders {
            ensure!(
                self.waiters.contains_key(&(order, request)),
                "waiter {request} missing at {order:?}"
            );
        }
        Ok(())
    }
}
