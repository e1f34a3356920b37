//! The `Engine`: owns the pool, the page bytes, the checkpoint store, the copy engine, the resident checkpoint
//! index (`checkpoint_transfer::ResidentIndex`: every import), the reservation ledger (`reserved` only) and
//! every live request, and exposes the API the facade drives step by step.
//!
//! What each policy does and who owns an import's pages at each stage: `restore_policy/mod.rs`.
//!
//! Layout: this file holds the `Engine` type and the request API (submit, resume, reset); `builder.rs` its
//! construction (`Engine::builder`, the one way); `parts.rs` its smaller owned parts; `step.rs` the step loop;
//! `admit.rs` admission; `coordinator.rs` the restore coordinator; `pages.rs` page-level work; `table/req.rs` a live
//! request and its phase's data; `table.rs` the live requests and their containers (`RequestTable::move_to`);
//! `lifecycle.rs` the lifecycle's edges (`cancel`, `finish`, `preempt`, `fall_back`, ...), each doing its side
//! effects once; `report.rs` `StepReport`, `RequestView` and the read-only accessors; `invariants.rs`
//! `check_invariants` and the leak count; `capture_link.rs` the captures on their way to the store; `clock.rs`
//! the injected clock; `groups.rs` the cache groups' plan; `drafts.rs` what a decode with draft tokens yields;
//! `recompute.rs` E3 verification by recompute; `snapshots.rs` local prefix hits of a hybrid model.

mod admit;
mod builder;
mod capture_link;
mod clock;
mod coordinator;
mod drafts;
mod groups;
mod invariants;
mod kv_events;
mod lifecycle;
mod pages;
mod parts;
mod recompute;
mod report;
mod restore_policy;
mod snapshots;
mod step;
mod table;
mod tokens;
use table::req;
use tokens::Tokens;

use std::sync::Arc;

use checkpoint_transfer::Fault;
use kv_pool::{AdmissionOrder, RequestId, Timestamp};
use kv_pool::{PageId, PagePool, PageStorage};

use crate::error::{Error, Result};
use crate::executor::{Executor, SimExecutor};
use crate::metrics::{FallbackReason, RejectReason};
use crate::params::EngineParams;
use crate::request::{FinishedRequest, KeyedRequest, RequestSpec};

use self::groups::GroupCoordinator;
use self::parts::{Ids, Restores, StepScratch, StepTime, Tally, Watchdog};
use self::req::{Req, Restore};
use self::table::RequestTable;

pub use self::builder::Builder;
pub use self::clock::{Clock, SimClock, WALL_IDLE_WAIT, WallClock};
pub use self::report::{RequestPhase, RequestView, RestoreGauges, ShutdownReport, StepReport};

/// The engine: step loop, restore coordinator, executor, policies and metrics.
pub struct Engine<E: Executor = SimExecutor> {
    params: EngineParams,
    executor: E,
    pool: PagePool,
    /// The page bytes: host or CUDA memory (`EngineParams::storage`).
    storage: Arc<dyn PageStorage>,
    /// How requests' pages spread over the cache groups.
    groups: GroupCoordinator,
    /// The restore mechanism: `params.policy` as code, with the reservation ledger where it keeps one.
    policy: Box<dyn restore_policy::RestorePolicy>,
    /// Every live request, in the container its phase names.
    table: RequestTable,
    /// The copies, the store, every import and the captures on their way to the store.
    restores: Restores,
    /// Where `now` comes from (L1), and the steps taken.
    time: StepTime,
    /// The liveness watchdog (K3).
    watchdog: Watchdog,
    /// The sources of admission sequence numbers and checkpoint generations.
    ids: Ids,
    /// What ended: finished requests, their metrics, rejections and the counters reports read.
    tally: Tally,
    /// What one step leaves for the next, and its scratch.
    scratch: StepScratch,
    /// The KV events not yet taken, once enabled (`enable_kv_events`).
    kv_events: Option<crate::kv_events::KvEventLog>,
    /// The local snapshots of a hybrid model (H9, H10).
    snapshots: snapshots::Snapshots,
}

impl<E: Executor> std::fmt::Debug for Engine<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("policy", &self.params.policy)
            .field("now", &self.time.now)
            .field("live", &self.table.len())
            .field("running", &self.table.running().len())
            .field("free_pages", &self.pool.n_free())
            .finish_non_exhaustive()
    }
}

impl<E: Executor> Engine<E> {
    /// The parameters the engine was built from.
    pub fn params(&self) -> &EngineParams {
        &self.params
    }

    /// Submits a request; it is considered from its arrival time on. Errors: an id still live, an empty
    /// prompt, zero output tokens, or a request longer than the model.
    pub fn submit(&mut self, spec: RequestSpec) -> Result<()> {
        self.check_submit(&spec, spec.prompt.len())?;
        let block_tokens = self.params.geometry.block_tokens();
        self.enter(spec.keyed(block_tokens))
    }

    /// `submit`, with the prompt's block keys already computed (`RequestSpec::keyed`, perhaps on another
    /// thread). Errors: those of `submit`, and keys computed for another block size than the engine's.
    pub fn submit_keyed(&mut self, request: KeyedRequest) -> Result<()> {
        let block_tokens = self.params.geometry.block_tokens();
        if request.block_tokens() != block_tokens {
            return Err(Error::InvalidParam {
                name: "block_tokens",
                reason: format!(
                    "{} was keyed for blocks of {} tokens; this engine's blocks hold {block_tokens}",
                    request.spec().id,
                    request.block_tokens()
                ),
            });
        }
        self.check_submit(request.spec(), request.prompt_len())?;
        self.enter(request)
    }

    /// Refuses a request `submit` must not take: a live id, an empty prompt, a bad instruction boundary, zero
    /// output tokens, or one the executor cannot run; and one that can never run (counted, K1).
    fn check_submit(&mut self, spec: &RequestSpec, prompt_len: usize) -> Result<()> {
        let id = spec.id;
        if self.table.contains(id) {
            return Err(Error::DuplicateRequest { request: id });
        }
        if prompt_len == 0 {
            return Err(Error::EmptyPrompt { request: id });
        }
        if let Some(at) = spec.instruction_tokens
            && (at == 0 || at as usize >= prompt_len)
        {
            return Err(Error::InvalidParam {
                name: "instruction_tokens",
                reason: format!(
                    "{id}: an instruction of {at} tokens in a prompt of {}; between 1 and the prompt's length \
                     minus one",
                    prompt_len
                ),
            });
        }
        self.executor.check_request(spec)?;
        if spec.max_output_tokens == 0 {
            return Err(Error::InvalidParam {
                name: "max_output_tokens",
                reason: format!("{id} asks for 0 output tokens; at least 1"),
            });
        }
        let tokens = prompt_len as u64
            + u64::from(spec.max_output_tokens)
            + u64::from(self.params.draft_tokens);
        let model_limit = u64::from(self.params.geometry.max_model_len());
        let rejected = if tokens > model_limit {
            Some((RejectReason::LongerThanModel, model_limit))
        } else if self.peak_pages(tokens as u32) > self.pool.n_usable() {
            Some((
                RejectReason::LargerThanPool,
                u64::from(self.pool_token_limit()),
            ))
        } else {
            None
        };
        if let Some((reason, limit)) = rejected {
            // K1: this request alone is refused; it is counted and everything else goes on.
            *self.tally.rejected.entry(reason).or_default() += 1;
            tracing::warn!(request = %id, %reason, tokens, limit, "request rejected: it can never run");
            return Err(Error::Rejected {
                request: id,
                reason,
                tokens,
                limit,
            });
        }
        Ok(())
    }

    /// Creates the live request of a checked submission: the one place a request enters a container
    /// without an edge.
    fn enter(&mut self, request: KeyedRequest) -> Result<()> {
        let (mut spec, keys, deferred) = request.into_parts();
        let id = spec.id;
        let tokens = match deferred {
            Some(deferred) => {
                let mut tokens = Tokens::deferred(deferred);
                if self.reads_running_tokens() {
                    // This engine reads a running request's whole prompt: it is generated now, where a
                    // source that changed is refused with nothing changed, not later in a step.
                    tokens.materialize(id)?;
                }
                tokens
            }
            None => Tokens::held(std::mem::take(&mut spec.prompt)),
        };
        let seq = self.ids.next_seq();
        let arrival = spec.arrival.max(self.time.now);
        let req = Req::new(spec, keys, tokens, seq, arrival);
        self.table.enter(req);
        Ok(())
    }

    /// Gives a paused streaming session more input and a new output cap; it resumes ahead of the admission
    /// gate (Q7).
    pub fn resume(
        &mut self,
        request: RequestId,
        input: &[u32],
        max_output_tokens: u32,
    ) -> Result<()> {
        let block_tokens = self.params.geometry.block_tokens();
        let req = self
            .table
            .find_mut(request)
            .ok_or(Error::UnknownRequest { request })?;
        if req.phase() != RequestPhase::Paused {
            return Err(Error::NotPaused { request });
        }
        if max_output_tokens == 0 {
            return Err(Error::InvalidParam {
                name: "max_output_tokens",
                reason: format!("{request} resumed asking for 0 output tokens; at least 1"),
            });
        }
        req.push_tokens(input, block_tokens)?;
        req.prompt_end = req.tokens.len() as u32;
        req.prompt_captured = false;
        req.prefill_tail_captured = false;
        req.answer_tokens = 0;
        req.answer_cap = max_output_tokens;
        req.stopped = false;
        self.table.move_to(request, RequestPhase::Resuming)
    }

    /// Ends a paused streaming session: its pages are freed (cached) and it is reported finished.
    pub fn close_stream(&mut self, request: RequestId) -> Result<()> {
        let req = self
            .table
            .find(request)
            .ok_or(Error::UnknownRequest { request })?;
        if req.phase() != RequestPhase::Paused {
            return Err(Error::NotPaused { request });
        }
        self.finish(request)
    }

    /// Pages a request of `tokens` tokens (prompt, output and draft lookahead) holds on each rank at its last
    /// token, however its prompt is chunked: every token of a full group, the live window of a sliding-window
    /// group (its retained tail included) or of a chunked-local group, and the fixed pages of recurrent and
    /// auxiliary groups. Larger chunks need more on the way (the admission step refuses a first chunk that
    /// can never fit); no run of the request needs less.
    fn peak_pages(&self, tokens: u32) -> u32 {
        self.params.geometry.request_peak_pages(tokens, 1, 0)
    }

    /// The most tokens a request may have for `peak_pages` to fit the usable pool (it grows with the tokens,
    /// so a binary search finds it); 0 when not even one token fits.
    fn pool_token_limit(&self) -> u32 {
        let usable = self.pool.n_usable();
        let (mut fits, mut above) = (0u32, self.params.geometry.max_model_len().saturating_add(1));
        while above - fits > 1 {
            let mid = fits + (above - fits) / 2;
            if self.peak_pages(mid) <= usable {
                fits = mid;
            } else {
                above = mid;
            }
        }
        fits
    }

    /// Resets the prefix cache (X2): refused, changing nothing, while any import is staged or owned or any page
    /// is in use; `force_reset_prefix_cache` preempts and releases first.
    pub fn reset_prefix_cache(&mut self) -> Result<()> {
        if let Err(refused) =
            self.restores
                .index
                .clear(&mut self.pool, &mut *self.restores.copies, false)
        {
            let checkpoint_transfer::Error::ResetRefused { n_staged, n_owned } = refused else {
                return Err(refused.into());
            };
            return Err(Error::ResetRefusedImports {
                n_imports: n_staged + n_owned,
            });
        }
        if self.pool.n_in_use() > 0 {
            return Err(Error::ResetRefusedPagesInUse {
                n_pages: self.pool.n_in_use(),
            });
        }
        self.pool.reset_prefix_cache()?;
        self.snapshots.clear();
        Ok(())
    }

    /// Resets the prefix cache by force (X1): preempts running requests, releases every ready import (its
    /// request falls back to an ordinary lookup), cancels copying imports (their pages drain first), drops the
    /// pages of paused streams, then resets: once no copy is draining every page but the null page is free.
    /// The next step's report lists the preempted requests (`reset_preempted`) and the fallbacks.
    pub fn force_reset_prefix_cache(&mut self) -> Result<()> {
        for id in self.table.running().to_vec().into_iter().rev() {
            self.preempt_for_reset(id)?;
            self.scratch.between_steps.reset_preempted.push(id);
        }
        let with_imports: Vec<RequestId> = self
            .table
            .ready
            .iter()
            .map(|(_, id)| id)
            .chain(self.table.ready_logits().values().copied())
            .chain(self.table.restoring().values().copied())
            .collect();
        for id in with_imports {
            let had_import = matches!(self.table.get(id)?.restore, Restore::Importing { .. });
            self.drop_restore(id)?;
            self.enqueue_waiting(id, had_import.then_some(FallbackReason::Reset))?;
            if had_import {
                self.scratch
                    .between_steps
                    .fallbacks
                    .push((id, FallbackReason::Reset));
            }
        }
        let paused: Vec<RequestId> = self
            .table
            .iter()
            .filter(|(_, req)| matches!(req.phase(), RequestPhase::Paused | RequestPhase::Resuming))
            .map(|(id, _)| *id)
            .collect();
        for id in paused {
            self.free_request_pages(id)?;
        }
        // Every import was cancelled with its request above; only drains are left.
        let lost = self
            .restores
            .index
            .clear(&mut self.pool, &mut *self.restores.copies, true)?;
        debug_assert!(lost.is_empty(), "imports of no live request: {lost:?}");
        self.snapshots.clear();
        if self.pool.n_in_use() == 0 {
            self.pool.reset_prefix_cache()?;
        } else {
            // Copies still draining pin their pages: drop every other key now, the drained pages come back
            // free and unkeyed.
            for page in 1..self.pool.n_total() {
                let page = PageId(page);
                if self.pool.ref_count(page)? == 0 {
                    let _dropped = self.pool.uncache(page)?;
                }
            }
        }
        Ok(())
    }

    /// The engine clock.
    pub fn now(&self) -> Timestamp {
        self.time.now
    }

    /// The clock's name (`simulated`, `wall`).
    pub fn clock_name(&self) -> &'static str {
        self.time.source.name()
    }

    /// Moves the clock forward to `to` (a clock jump in simulations); never backwards.
    pub fn advance_clock(&mut self, to: Timestamp) {
        self.time.now = self.time.now.max(to);
    }

    /// Live requests: submitted and not yet finished, cancelled or rejected (paused streams included).
    pub fn n_live_requests(&self) -> usize {
        self.table.len()
    }

    /// Whether nothing is left to do: no live request other than paused streams and no copy in flight.
    pub fn is_idle(&self) -> bool {
        self.table
            .values()
            .all(|req| req.phase() == RequestPhase::Paused)
            && self.restores.index.n_staged() == 0
            && self.restores.captures.len() == 0
    }

    /// Shuts the engine down (L6): cancels every live request (restores release their tickets and cancel
    /// their copies, paused streams drop their pages), waits for every copy in flight to drain, and checks
    /// that every page is free again. Reports what it cancelled and how many copies it waited for; the
    /// cancelled requests are also in `take_finished` and the metrics. The engine stays usable.
    pub fn shutdown(&mut self) -> Result<ShutdownReport> {
        let mut live: Vec<(AdmissionOrder, RequestId)> = self
            .table
            .iter()
            .map(|(id, req)| (req.order, *id))
            .collect();
        live.sort();
        let mut report = ShutdownReport::default();
        for (_, id) in live {
            self.cancel(id)?;
            report.cancelled.push(id);
        }
        // Nothing captured is lost: the captures still on the link reach the store now.
        for (id, checkpoint) in self.restores.captures.take_all() {
            let _stored = self.store_checkpoint(id, checkpoint);
        }
        report.copies_drained = self.restores.copies.n_in_flight();
        for event in self
            .restores
            .index
            .drain_all(&mut self.pool, &mut *self.restores.copies)
        {
            // Every import was cancelled with its request: only drains are left.
            if !matches!(event, checkpoint_transfer::ImportEvent::Drained { .. }) {
                return Err(Error::internal(format!(
                    "shutdown: an import event after every request was cancelled: {event:?}"
                )));
            }
        }
        if self.pool.n_in_use() > 0 || self.restores.index.n_pages_held() > 0 {
            return Err(Error::internal(format!(
                "shutdown: {} pages still in use after every request was cancelled and every copy drained",
                self.pool.n_in_use()
            )));
        }
        tracing::info!(
            cancelled = report.cancelled.len(),
            copies_drained = report.copies_drained,
            "engine shut down"
        );
        Ok(report)
    }

    /// Takes the requests finished or cancelled since the last call.
    pub fn take_finished(&mut self) -> Vec<FinishedRequest> {
        std::mem::take(&mut self.tally.finished)
    }

    /// Empties the checkpoint store (a store restart that lost everything): pending restores find their
    /// checkpoint gone at their next lookup or refresh. Errors: on the wall clock, when the new store's thread
    /// cannot start (the old store then stays).
    pub fn forget_checkpoints(&mut self) -> Result<()> {
        let empty = checkpoint_transfer::HostStore::new(self.params.store_capacity_bytes());
        self.restores.store = builder::link_store(&self.params, Box::new(empty))?;
        Ok(())
    }

    /// Injects a copy fault (fail, delay, corrupt, evict a destination page) into the copy engine. The inline
    /// engine models every fault and the reordering engine the failures; the others refuse with an error.
    pub fn inject_copy_fault(&mut self, fault: Fault) -> Result<()> {
        let n_ranks = self.params.geometry.context_parallel();
        if let Fault::FailNext { rank }
        | Fault::DelayNext { rank, .. }
        | Fault::CorruptNext { rank, .. }
        | Fault::FailInFlight { rank } = fault
            && rank >= n_ranks
        {
            return Err(Error::InvalidParam {
                name: "rank",
                reason: format!(
                    "a copy fault on rank {rank} of an engine with {n_ranks} rank(s) would never fire; \
                     0 to {}",
                    n_ranks - 1
                ),
            });
        }
        Ok(self.restores.copies.inject_fault(fault)?)
    }

    /// Whether a running request's whole prompt is read: by an executor that reads tokens, or when restores
    /// resume at exact boundaries (a hybrid model: its lookups and captures end there, which takes their
    /// partial pages' tokens). Such
    /// an engine generates a deferred prompt at submit; otherwise a request reads only its held tokens
    /// (`Tokens`), and a deferred prompt stays deferred but for a verified restore.
    pub(crate) fn reads_running_tokens(&self) -> bool {
        self.executor.reads_tokens()
            || self.groups.restores_at_exact_boundaries()
            || self.kv_events.is_some()
    }

    /// Generates `request`'s deferred prompt, if it has one (`RequestSpec::keyed_from_source`); a no-op once held.
    /// A source that changed fails the caller's step naming `prompt_source` (only a verified restore, which
    /// stops the run on any mismatch, generates one after submit).
    pub(crate) fn materialize(&mut self, request: RequestId) -> Result<()> {
        self.table.get_mut(request)?.tokens.materialize(request)
    }
}
