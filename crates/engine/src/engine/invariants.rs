//! The engine's invariant checks: `check_invariants` (pool, ledger, imports, held pages, slots, credits)
//! and `leaked_pages`, both built on the set of pages live requests and imports hold.

use std::collections::HashSet;

use kv_pool::PageId;
use reservation::Ledger;

use super::Engine;
use crate::executor::Executor;

impl<E: Executor> Engine<E> {
    /// Pages in use that no live request, import or ticket accounts for (0 unless there is a bug).
    pub fn leaked_pages(&self) -> u32 {
        self.pool
            .n_in_use()
            .saturating_sub(self.held_pages().len() as u32)
    }

    /// Asserts every invariant: the pool's, the ledger's and the imports'; every page in use is held by a
    /// live request or import and every held page is in use (no leak, no page freed under a holder or a live
    /// copy); slots within the limit; outstanding credits within the live tickets' needs.
    pub fn check_invariants(&self) {
        self.pool.check_invariants();
        self.index.check_invariants(&self.pool);
        for page in self.copies.in_flight_pages() {
            assert!(
                self.pool.ref_count(page).expect("copied page in range") > 0,
                "page {page:?} is free while a copy writes into it"
            );
        }
        let held = self.held_pages();
        for page in &held {
            assert!(
                self.pool.ref_count(*page).expect("held page in range") > 0,
                "held page {page:?} is free"
            );
        }
        assert_eq!(
            self.pool.n_in_use() as usize,
            held.len(),
            "pages in use != pages held: a leak"
        );
        let slots_held = self.ledger.as_ref().map_or(0, Ledger::slots_held);
        assert!(
            self.running.len() as u32 + slots_held <= self.params.max_running,
            "{} running + {slots_held} ticket slots > {}",
            self.running.len(),
            self.params.max_running
        );
        if let Some(ledger) = &self.ledger {
            ledger.check_invariants(&self.pool);
            for ticket in ledger.snapshot().tickets {
                let req = self
                    .reqs
                    .get(&ticket.req)
                    .expect("a ticket belongs to a live request");
                let tpp = self.params.geometry.tokens_per_page();
                // A ticket budgets every token still to compute: the prompt and, for a request preempted
                // after it produced output, that output too.
                let remaining =
                    (req.tokens.len() as u32).div_ceil(tpp) as i64 - req.pages.len() as i64;
                assert!(
                    i64::from(ticket.credit_pages)
                        <= remaining.max(0) + 2 + i64::from(self.params.draft_tokens.div_ceil(tpp)),
                    "{} holds {} credits for {remaining} remaining pages",
                    ticket.req,
                    ticket.credit_pages
                );
            }
        }
        for (order, id) in self.waiting.iter().chain(self.ready.iter()) {
            assert_eq!(self.reqs[&id].order, order, "waiting queue key drifted");
        }
    }

    /// Every page a live request or import holds.
    fn held_pages(&self) -> HashSet<PageId> {
        let mut held: HashSet<PageId> = self
            .reqs
            .values()
            .flat_map(|req| req.pages.iter().copied())
            .collect();
        held.extend(self.index.held_pages());
        held
    }
}
