//! An admitted consumer's use of its execution credits: `allocate` from them, `consume` what it allocated
//! itself, `release_window_pages` when window pages leave (C4) and `finish_prompt`, which ends the ticket (C6).

use kv_pool::{PageId, PagePool};

use super::{Ledger, TicketState};
use crate::error::{Error, Result};
use kv_pool::RequestId;

impl Ledger {
    /// Allocates `n_pages` for admitted `request` from its credits; beyond its outstanding credits it may use only
    /// pages not protected for others (`n_free - credits`), else `Pressure` and nothing changes.
    pub fn allocate(
        &mut self,
        pool: &mut PagePool,
        request: RequestId,
        n_pages: u32,
    ) -> Result<Vec<PageId>> {
        let outstanding = self.entry_in(request, TicketState::Admitted)?.outstanding();
        let excess = n_pages.saturating_sub(outstanding);
        let unprotected = crate::rules::pages_unprotected(pool.n_free(), self.credit_pages);
        if excess > unprotected || n_pages > pool.n_free() {
            return Err(Error::Pressure {
                need_pages: n_pages,
                available_pages: outstanding.min(pool.n_free()) + unprotected,
                free_slots: 0,
            });
        }
        let pages = pool.allocate(n_pages)?;
        self.consume(request, n_pages)?;
        Ok(pages)
    }

    /// Records that admitted `request` allocated `n_pages` itself: they are drawn from its credits.
    pub(crate) fn consume(&mut self, request: RequestId, n_pages: u32) -> Result<()> {
        let entry = self.entry_in(request, TicketState::Admitted)?;
        let before = entry.outstanding();
        entry.held_pages = entry.held_pages.saturating_add(n_pages);
        let after = entry.outstanding();
        self.credit_pages -= before - after;
        Ok(())
    }

    /// Records that admitted `request` freed `n_pages` it held from its credits (positions that left a sliding or
    /// chunked window became null). The credits come back (C4): the freed pages stay protected for `request`.
    pub fn release_window_pages(&mut self, request: RequestId, n_pages: u32) -> Result<()> {
        let entry = self.entry_in(request, TicketState::Admitted)?;
        if n_pages > entry.held_pages {
            return Err(Error::WindowFreeExceedsHeld {
                request,
                n_pages,
                held_pages: entry.held_pages,
            });
        }
        let before = entry.outstanding();
        entry.held_pages -= n_pages;
        let after = entry.outstanding();
        self.credit_pages += after - before;
        Ok(())
    }

    /// The consumer computed all its prompt tokens: the ticket ends and its outstanding credits are released
    /// (C6). The consumer's pages are its own from now on.
    pub fn finish_prompt(&mut self, request: RequestId) -> Result<()> {
        self.entry_in(request, TicketState::Admitted)?;
        let removed = self.remove_ticket(request);
        debug_assert!(
            removed
                .is_some_and(|(entry, released)| entry.import_pages.is_empty() && !released.slot)
        );
        Ok(())
    }
}
