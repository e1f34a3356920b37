//! `reserved` (and `oracle`, the same mechanism on an unbounded pool): the contract. A ledger ticket holds the
//! import's pages, a running slot and the continuation's credits; the request owns its published import until
//! admission; a refused restore is a capacity waiter whose wait is bounded.

use std::time::Duration;

use kv_pool::{PageId, PagePool, RequestId, Timestamp};
use reservation::{Ledger, Preflight, TicketState};

use super::{Publication, Refusal, Reservation, ReserveAsk, RestorePolicy, TicketHandle};
use crate::error::{Error, Result};

/// The `reserved` and `oracle` policies: a reservation ledger.
#[derive(Debug)]
pub(crate) struct Reserved {
    ledger: Ledger,
}

impl Reserved {
    pub(crate) fn new(ledger: Ledger) -> Reserved {
        Reserved { ledger }
    }
}

impl RestorePolicy for Reserved {
    fn restores_at_admission(&self) -> bool {
        false
    }

    fn reserve(
        &mut self,
        pool: &mut PagePool,
        ask: &ReserveAsk<'_>,
    ) -> Result<Reservation, Refusal> {
        self.ledger
            .reserve(
                pool,
                ask.request,
                ask.order,
                &ask.spec,
                ask.preflight,
                ask.now,
            )
            .map(|ticket| Reservation::Ticket {
                ticket: TicketHandle::new(ticket.request),
                pages: ticket.import_pages,
            })
            .map_err(Refusal::Ledger)
    }

    fn refuses_for_pressure(
        &self,
        pool: &PagePool,
        preflight: &Preflight,
        _admissible_pages: u32,
        need_pages: u32,
    ) -> bool {
        // `Ledger::reserve`'s own test before it sums earlier waiters' holds.
        self.ledger.free_slots(preflight.running_requests) == 0
            || need_pages > self.ledger.available_pages(pool, preflight)
    }

    fn hand_over(&mut self, ticket: &TicketHandle) -> Result<Vec<PageId>> {
        let request = ticket.request();
        self.ledger
            .hand_over_pages(request)
            .map_err(|error| Error::internal(format!("{request}: {error}")))
    }

    fn publish(&mut self, request: RequestId) -> Result<Publication> {
        self.ledger.publish(request).map_err(|error| {
            Error::internal(format!(
                "{request} published without an importing ticket: {error}"
            ))
        })?;
        Ok(Publication::Owned)
    }

    fn wait_expired(
        &mut self,
        request: RequestId,
        now: Timestamp,
        _started: Option<Timestamp>,
        _max_wait: Duration,
    ) -> bool {
        // The ledger warns once for each waiter it expires.
        let _due = self.ledger.expire_due(now);
        self.ledger.is_expired(request)
    }

    fn own_wait_over(&self, _waited: Duration, _max_wait: Duration) -> bool {
        false
    }

    fn credit_pages(&self) -> u32 {
        self.ledger.credit_pages()
    }

    fn slots_held(&self) -> u32 {
        self.ledger.slots_held()
    }

    fn holds_admitted_ticket(&self, request: RequestId) -> bool {
        self.ledger.ticket_state(request) == Some(TicketState::Admitted)
    }

    fn allocate_from_ticket(
        &mut self,
        pool: &mut PagePool,
        request: RequestId,
        need: u32,
    ) -> Result<Option<Vec<PageId>>> {
        match self.ledger.allocate(pool, request, need) {
            Ok(pages) => Ok(Some(pages)),
            Err(error) if error.kind() == reservation::ErrorKind::Pressure => Ok(None),
            Err(error) => Err(Error::internal(format!(
                "ledger allocation for {request}: {error}"
            ))),
        }
    }

    fn release_window_pages(&mut self, request: RequestId, n: u32) -> Result<()> {
        self.ledger
            .release_window_pages(request, n)
            .map_err(|error| Error::internal(format!("{request}: {error}")))
    }

    fn admit(&mut self, ticket: &TicketHandle, pool: &mut PagePool) -> Result<()> {
        let request = ticket.request();
        self.ledger.admit(request, pool).map_err(|error| {
            Error::internal(format!(
                "{request}: a ready import without a ready ticket: {error}"
            ))
        })
    }

    fn finish_prompt(&mut self, ticket: TicketHandle) -> Result<()> {
        let request = ticket.request();
        self.ledger.finish_prompt(request).map_err(|error| {
            Error::internal(format!("{request}: ending an admitted ticket: {error}"))
        })
    }

    fn release(&mut self, ticket: TicketHandle, pool: &mut PagePool) -> Result<()> {
        let request = ticket.request();
        if self.ledger.ticket_state(request).is_none() {
            return Err(Error::internal(format!(
                "{request} held a handle of a ticket the ledger does not have"
            )));
        }
        let _released = self.ledger.release(request, pool);
        Ok(())
    }

    fn forget_waiter(&mut self, request: RequestId) {
        self.ledger.forget_waiter(request);
    }

    fn ledger(&self) -> Option<&Ledger> {
        Some(&self.ledger)
    }
}
