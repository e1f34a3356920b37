//! The engine's invariant checks: `check_invariants` (pool, ledger, imports, held pages, slots, credits)
//! and `leaked_pages`, both built on the set of pages live requests and imports hold.

use std::collections::{HashMap, HashSet};

use kv_pool::PageId;

use super::Engine;
use super::restore_policy::TicketHandle;
use crate::error::{Error, Result};
use crate::executor::Executor;

impl<E: Executor> Engine<E> {
    /// Pages in use that no named owner accounts for: a page whose pool reference count exceeds the references
    /// its owners hold (live requests' page tables, the index's imports, draining ones included, and the
    /// ledger's tickets). Exact at any time; 0 unless there is a bug.
    pub fn leaked_pages(&self) -> u32 {
        let owned = self.page_owners();
        (1..self.pool.n_total())
            .map(PageId)
            .filter(|page| {
                let refs = self.pool.ref_count(*page).unwrap_or(0);
                refs > owned.get(page).copied().unwrap_or(0)
            })
            .count() as u32
    }

    /// Checks every invariant: the pool's, the ledger's and the imports'; every
    /// page in use is held by a live request or import and every held page is in use (no leak, no page freed
    /// under a holder or a live copy); every request is in exactly the container its phase names; no request
    /// counts more tokens computed than it holds; slots within the limit; outstanding credits within the live
    /// tickets' needs; local hybrid snapshots within their budget (H10). A broken one is
    /// `Error::Internal` naming it.
    pub fn check_invariants(&self) -> Result<()> {
        let broken = |invariant: String| Err(Error::internal(invariant));
        self.pool.check_invariants()?;
        self.check_snapshot_budget()?;
        self.restores.index.check_invariants(&self.pool)?;
        let held_by_index: HashSet<PageId> = self.restores.index.held_pages().collect();
        for page in self.restores.copies.in_flight_pages() {
            if self.pool.ref_count(page).map_or(true, |refs| refs == 0) {
                return broken(format!("page {page:?} is free while a copy writes into it"));
            }
            // L2: the import the copy serves pins its pages until the copy drained, so a page handed to
            // anyone else meanwhile is never the copy's alone.
            if !held_by_index.contains(&page) {
                return broken(format!(
                    "page {page:?} is copied but no import of the index holds it"
                ));
            }
        }
        // L2: a page freed and reused while a copy owned it shows as a write by someone else.
        if let Some(violation) = self.restores.copies.write_violations().into_iter().next() {
            return broken(format!(
                "a page was reused under a copy in flight: {violation}"
            ));
        }
        // Every reference the pool counts has a named owner, and every owner's page is referenced: no leak, no
        // page freed under a holder.
        let owned = self.page_owners();
        for page in (1..self.pool.n_total()).map(PageId) {
            let refs = self.pool.ref_count(page).unwrap_or(0);
            let expected = owned.get(&page).copied().unwrap_or(0);
            if refs != expected {
                return broken(format!(
                    "page {page:?} has {refs} references but its owners hold {expected}"
                ));
            }
        }
        // An engine that reads a running request's whole prompt (`reads_running_tokens`) holds every prompt
        // from submit; elsewhere a deferred prompt holds its tokens from its keyed blocks' end on (the next
        // block key hashes them).
        let reads_running = self.reads_running_tokens();
        let block_tokens = self.params.geometry.block_tokens() as usize;
        if let Some((id, req)) = self.table.iter().find(|(_, req)| {
            req.tokens.is_deferred()
                && (reads_running
                    || req
                        .tokens
                        .suffix(req.spec.id, req.keys.len() * block_tokens)
                        .is_err())
        }) {
            return broken(format!(
                "{id} is {:?} with {} keys and its prompt deferred, which this engine does not allow there",
                req.phase(),
                req.keys.len()
            ));
        }
        // Computed tokens are tokens the request holds: never a position past them (a rejected draft's, H5).
        if let Some((id, req)) = self
            .table
            .iter()
            .find(|(_, req)| req.n_computed as usize > req.tokens.len())
        {
            return broken(format!(
                "{id} counts {} tokens computed of the {} it holds",
                req.n_computed,
                req.tokens.len()
            ));
        }
        let slots_held = self.policy.slots_held();
        if self.table.running().len() as u32 + slots_held > self.params.max_running {
            return broken(format!(
                "{} running + {slots_held} ticket slots > {}",
                self.table.running().len(),
                self.params.max_running
            ));
        }
        self.check_tickets()?;
        self.table.check_containers()
    }

    /// The ledger's own invariants, and each ticket's against its request (O5, C2), for a policy with a
    /// ledger.
    fn check_tickets(&self) -> Result<()> {
        let broken = |invariant: String| Err(Error::internal(invariant));
        let handles = self
            .table
            .values()
            .filter(|req| req.ticket.is_some())
            .count();
        let Some(ledger) = self.policy.ledger() else {
            if handles > 0 {
                return broken(format!("{handles} requests hold tickets of no ledger"));
            }
            return Ok(());
        };
        ledger
            .check_invariants(&self.pool)
            .map_err(|error| Error::internal(format!("the ledger: {error}")))?;
        // Each ticket is held by its request, and each handle is a ticket: none ended twice, none left behind.
        let tickets = ledger.snapshot().tickets;
        if tickets.len() != handles {
            return broken(format!(
                "the ledger holds {} tickets, requests hold {handles} handles",
                tickets.len()
            ));
        }
        // O5: the index alone pins and drains an import's pages. A ticket hands its pages over when its
        // import is staged, in the call that reserved it, or is released there, so between calls no
        // importing ticket holds pages.
        for ticket in tickets {
            let Some(req) = self.table.find(ticket.request) else {
                return broken(format!("a ticket of {}, which is not live", ticket.request));
            };
            if req.ticket.as_ref().map(TicketHandle::request) != Some(ticket.request) {
                return broken(format!(
                    "{} does not hold its ticket's handle",
                    ticket.request
                ));
            }
            if ticket.state == reservation::TicketState::Importing && !ticket.handed_over {
                return broken(format!(
                    "{}'s importing ticket still holds {} pages no staged import owns",
                    ticket.request, ticket.import_pages
                ));
            }
            let remaining = self.remaining_pages(req);
            let (captures, draft) = (0, 0);
            if i64::from(ticket.credit_pages) > remaining.max(0) + captures + draft {
                return broken(format!(
                    "{} holds {} credits for {remaining} remaining pages",
                    ticket.request, ticket.credit_pages
                ));
            }
        }
        Ok(())
    }

    /// The pages a fresh ticket for what `req` has left would need, its windows at their peak.
    fn remaining_pages(&self, req: &super::req::Req) -> i64 {
        // A ticket never holds more credits than a fresh ticket for what is left would: the
        // continuation from its computed tokens to every token still to compute (the prompt and,
        // for a request preempted after it produced output, that output too), its draft
        // lookahead and the captures it may publish (C2). The engine copies a capture out of the
        // request's own pages, so capture credits are never drawn: they end with the ticket (C6).
        // A windowed group's credits cover its peak window (C4) even when less of the prompt is
        // left than a chunk: they count at that peak.
        let geometry = &self.params.geometry;
        let continuation = kv_pool::Continuation {
            prefix_tokens: req.n_computed.min(req.tokens.len() as u32),
            prompt_tokens: req.tokens.len() as u32,
            chunk_tokens: self.params.chunk_tokens,
            draft_lookahead_tokens: self.params.draft_tokens,
            captures: super::coordinator::CAPTURES_MAX,
        };
        let peak = kv_pool::Continuation {
            prefix_tokens: 0,
            prompt_tokens: geometry.max_model_len(),
            ..continuation
        };
        let windows: u32 = (0..self.groups.n_windows())
            .map(|window| {
                let group = self.groups.window_group(window) as usize;
                geometry.group_continuation_pages(group, &peak)
            })
            .sum();
        i64::from(geometry.continuation_pages(&continuation)) + i64::from(windows)
    }

    /// The references each page's named owners hold: live requests' page tables, the resident index's
    /// imports (draining ones included), and the ledger's tickets (their destination pages until the
    /// consumer is admitted, which are the import's pages).
    fn page_owners(&self) -> HashMap<PageId, u32> {
        let mut owned: HashMap<PageId, u32> = HashMap::new();
        let mut own = |page: PageId| *owned.entry(page).or_default() += 1;
        for req in self.table.values() {
            req.pages
                .iter()
                .chain(&req.fixed)
                .chain(req.windows.iter().flatten().filter(|page| !page.is_null()))
                .copied()
                .for_each(&mut own);
        }
        self.restores.index.held_pages().for_each(&mut own);
        if let Some(ledger) = self.policy.ledger() {
            for ticket in ledger.snapshot().tickets {
                let pages = self.restores.index.pages(ticket.request).unwrap_or(&[]);
                pages
                    .iter()
                    .take(ticket.import_pages as usize)
                    .copied()
                    .for_each(&mut own);
            }
        }
        owned
    }

    /// H10: the local snapshots of a hybrid model stay within their budget, and key no more pages than they
    /// count.
    fn check_snapshot_budget(&self) -> Result<()> {
        let (counted, keyed) = (
            self.snapshots.pages(),
            self.snapshots.keyed_pages(&self.pool),
        );
        if counted > self.params.state_snapshot_pages || keyed > counted {
            return Err(Error::internal(format!(
                "local snapshots count {counted} pages and key {keyed}, over their budget of {} pages",
                self.params.state_snapshot_pages
            )));
        }
        Ok(())
    }
}
