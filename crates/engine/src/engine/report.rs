//! What the engine reports: `StepReport` (what one step did), `RequestView` (where a live request is) and
//! the read-only accessors for metrics, the pool, the ledger, the store and counters.

use std::time::Duration;

use checkpoint_transfer::StoreStats;
use kv_pool::{PageId, PagePool};
use kv_pool::{RequestId, Timestamp};
use reservation::{Ledger, LedgerSnapshot};

use super::Engine;
pub use super::table::RequestPhase;
use crate::executor::Executor;
use crate::metrics::{FallbackReason, RequestMetrics, RunMetrics};

/// What one step did, for traces and tests. It includes what happened since the previous step outside any
/// step: a forced prefix-cache reset's preemptions and fallbacks.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepReport {
    /// Engine clock after the step.
    pub now: Timestamp,
    /// Modeled duration of the step (zero when nothing ran and the clock jumped to the next event).
    pub duration: Duration,
    /// Requests that computed prefill tokens, with how many.
    pub prefills: Vec<(RequestId, u32)>,
    /// Requests that decoded.
    pub decodes: Vec<RequestId>,
    /// Ready full-prompt restores given a logits-only entry (Q4).
    pub logits_only: Vec<RequestId>,
    /// Requests admitted this step (ordinary admissions and ready imports).
    pub admitted: Vec<RequestId>,
    /// Requests preempted by recompute this step.
    pub preempted: Vec<RequestId>,
    /// Requests a forced prefix-cache reset preempted since the previous step (X1).
    pub reset_preempted: Vec<RequestId>,
    /// Requests that finished (or paused, for streams) this step.
    pub finished: Vec<RequestId>,
    /// Restores that fell back to recompute this step, with why.
    pub fallbacks: Vec<(RequestId, FallbackReason)>,
    /// Waiting requests the admission walk examined (Q8: bounded by admissions + 1 + ready imports).
    pub examined: u32,
    /// Pending restores polled (each at most once per step).
    pub restore_polls: u32,
    /// Free pages after the step.
    pub free_pages: u32,
    /// Outstanding credits after the step.
    pub credit_pages: u32,
    /// Requests waiting for ordinary admission after the step.
    pub waiting: u32,
    /// Requests running after the step.
    pub running: u32,
    /// Whether the engine had nothing to do and nothing will happen by itself.
    pub idle: bool,
}

impl StepReport {
    /// Whether the step scheduled any work.
    pub fn scheduled_any(&self) -> bool {
        !self.prefills.is_empty() || !self.decodes.is_empty() || !self.logits_only.is_empty()
    }
}

/// Restore gauges at one moment, for monitoring (the facade's Prometheus metrics), under every policy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestoreGauges {
    /// Copies in flight (restores and drains of cancelled imports).
    pub copies_in_flight: usize,
    /// Requests whose restore is copying, in admission order.
    pub importing: Vec<RequestId>,
    /// Capacity waiters with the time their wait started, in admission order.
    pub waiters: Vec<(RequestId, Timestamp)>,
    /// Pages of published imports still owned by their waiting consumer (`reserved`: ready imports).
    pub owned_import_pages: u32,
}

/// What `Engine::shutdown` did (L6).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// The requests it cancelled, in admission order.
    pub cancelled: Vec<RequestId>,
    /// Copies that were in flight and were waited for.
    pub copies_drained: usize,
}

impl std::fmt::Display for RequestPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a live request is, for tests and traces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestView {
    /// Its lifecycle phase.
    pub phase: RequestPhase,
    /// Tokens whose KV is computed or restored.
    pub n_computed: u32,
    /// Pages in its page table.
    pub n_pages: u32,
    /// Its block table: page `i` holds block `i` on every rank.
    pub page_table: Vec<PageId>,
    /// Its recurrent-state and auxiliary pages, in group order (empty without such groups).
    pub fixed_pages: Vec<PageId>,
    /// One table per sliding-window or chunked-local group, block-indexed: the null page before the window.
    pub window_tables: Vec<Vec<PageId>>,
    /// Whether it holds a ledger ticket.
    pub has_ticket: bool,
    /// Whether it is a capacity waiter.
    pub is_waiter: bool,
    /// Output tokens so far.
    pub n_output: u32,
    /// Store lookups sent for its restore so far.
    pub lookups: u32,
    /// Admitted by an `ordinary` restore at once whose copy into its pages is still in flight.
    pub loading: bool,
}

impl<E: Executor> Engine<E> {
    /// Aggregated metrics of every request finished or cancelled so far.
    pub fn metrics(&self) -> RunMetrics {
        let mut run = RunMetrics::aggregate(
            self.params.policy.name(),
            &self.tally.done,
            self.time.now.0,
            self.time.wall,
            self.leaked_pages(),
        );
        run.capacity_waits = run.capacity_waits.max(self.tally.capacity_waits_started);
        run.rejected_requests = self
            .tally
            .rejected
            .iter()
            .map(|(reason, n)| (reason.name().to_owned(), *n))
            .collect();
        run.store_write_failures = self.restores.store.stats().n_write_failures;
        run
    }

    /// Metrics of every request finished or cancelled so far, in completion order.
    pub fn request_metrics(&self) -> &[RequestMetrics] {
        &self.tally.done
    }

    /// Where a live request is.
    pub fn request(&self, request: RequestId) -> Option<RequestView> {
        let req = self.table.find(request)?;
        Some(RequestView {
            phase: req.phase(),
            n_computed: req.n_computed,
            n_pages: req.pages.len() as u32,
            page_table: req.pages.clone(),
            fixed_pages: req.fixed.clone(),
            window_tables: req.windows.clone(),
            has_ticket: req.ticket.is_some(),
            is_waiter: self
                .policy
                .ledger()
                .is_some_and(|ledger| ledger.is_waiter(request))
                || req.capacity_wait().is_some(),
            n_output: req.output.len() as u32,
            lookups: req.lookups,
            loading: req.loading().is_some(),
        })
    }

    /// The output tokens a live request has produced so far (a server streams them as they come); `None`
    /// once it finished or was cancelled (`take_finished` then has them all).
    pub fn output_tokens(&self, request: RequestId) -> Option<&[u32]> {
        self.table.find(request).map(|req| req.output.as_slice())
    }

    /// Restore gauges now: copies in flight, restores copying, capacity waiters, pages owned by ready
    /// imports.
    pub fn restore_gauges(&self) -> RestoreGauges {
        let mut gauges = RestoreGauges {
            copies_in_flight: self.restores.copies.n_in_flight(),
            ..RestoreGauges::default()
        };
        for (id, req) in self
            .table
            .restoring()
            .values()
            .filter_map(|id| Some((id, self.table.find(*id)?)))
        {
            if matches!(req.restore, super::req::Restore::Importing { .. }) {
                gauges.importing.push(*id);
            }
            if let Some(since) = req.capacity_wait().map(|wait| wait.started) {
                gauges.waiters.push((*id, since));
            }
        }
        let ready = self
            .table
            .ready
            .iter()
            .map(|(_, id)| id)
            .chain(self.table.ready_logits().values().copied());
        gauges.owned_import_pages = ready
            .filter_map(|id| self.restores.index.pages(id))
            .map(|pages| pages.len() as u32)
            .sum();
        gauges
    }

    /// The page pool (read only).
    pub fn pool(&self) -> &PagePool {
        &self.pool
    }

    /// The ledger's state (`None` under policies without reservations).
    pub fn ledger_snapshot(&self) -> Option<LedgerSnapshot> {
        self.policy.ledger().map(Ledger::snapshot)
    }

    /// What the checkpoint store holds.
    pub fn store_stats(&self) -> StoreStats {
        self.restores.store.stats()
    }

    /// The executor.
    pub fn executor(&self) -> &E {
        &self.executor
    }

    /// Restored pages verified byte for byte against recompute so far (E3, L5).
    pub fn pages_verified(&self) -> u64 {
        self.tally.pages_verified
    }

    /// Steps run so far.
    pub fn steps(&self) -> u64 {
        self.time.steps
    }

    /// Pages the local snapshots of a hybrid model hold keyed, as their budget
    /// (`EngineParams::state_snapshot_pages`) counts them (H9, H10); 0 on a full-attention model.
    pub fn snapshot_pages(&self) -> u32 {
        self.snapshots.pages()
    }
}
