//! The restore coordinator (store side, G1-G5): the lookup on arrival, its timeout and non-blocking refresh,
//! the reservation (per policy), the copy-slot limit, capacity-wait logging, retry of a shorter checkpoint
//! after a failed copy, and the import completions (publication, E3 verification, ownership per policy).
//!
//! Poll order per pending restore (G2): lookup unanswered -> defer until the lookup timeout, then recompute;
//! failed or empty lookup -> recompute; complete local hit -> admit without restoring; copy in flight ->
//! defer; copy tasks at their limit -> wait for a copy slot; else reserve (policy) and copy.

use std::sync::Arc;
use std::time::Duration;

use checkpoint_transfer::{
    CheckpointMeta, ImportEvent, Lookup, PrefixQuery, RESTORE_LOOKUPS_MAX, StageRequest,
};
use kv_pool::{RequestId, Timestamp};
use reservation::{ErrorKind, Preflight, RestoreSpec};

use super::groups::RestoreBoundary;
use super::report::RequestPhase;
use super::req::{CapacityWait, Phase, Published, Refused, Req, Restore};
use super::restore_policy::{Publication, Refusal, Reservation, ReserveAsk};
use super::{Engine, StepReport};
use crate::error::{Error, Result};
use crate::executor::Executor;
use crate::metrics::FallbackReason;

/// Checkpoints a restored request publishes at most while it computes its prompt: the instruction boundary,
/// the prefill tail and the prompt end (H7), each budgeted in its credits (C2).
pub(crate) const CAPTURES_MAX: u32 = 3;

/// A capacity wait is logged when it starts and every this often after (G5).
const WAIT_LOG_INTERVAL: Duration = Duration::from_secs(30);

/// A store lookup's answer as the coordinator reads it.
enum StoreAnswer {
    /// Sent to a store on a thread of its own and not answered yet.
    OnItsWay,
    /// No checkpoint restores the request (none stored, or one that does not match: G6).
    Nothing,
    /// The checkpoint and how many of its leading tokens restore the request.
    Found(Arc<CheckpointMeta>, u32),
}

impl<E: Executor> Engine<E> {
    /// A request arrives: it asks the store unless its local prefix already covers every restorable block.
    pub(crate) fn on_arrival(&mut self, request: RequestId) -> Result<()> {
        let restorable = self.restorable_tokens(request)?;
        // The groups' combined hit: whole blocks, or on a hybrid model a snapshot's boundary (H9).
        let local = self.local_hit_tokens(request, restorable)?;
        if local >= restorable || restorable == 0 {
            let req = self.table.get_mut(request)?;
            req.expected_local_tokens = local;
            req.metrics.complete_local_hit |= !req.admitted_once && restorable > 0;
            return self.enqueue_waiting(request, None);
        }
        let limit_tokens = restorable + 1;
        if !self.send_lookup(request, limit_tokens)? {
            // K3: every path that asks the store (here: a preemption or an eviction before admission) counts
            // against the one lookup budget; once it is spent the request recomputes.
            self.enqueue_waiting(request, Some(FallbackReason::LookupsExhausted))?;
        }
        Ok(())
    }
    /// Tokens of `request`'s prompt a restore may cover (`GroupCoordinator::restorable_tokens`).
    pub(crate) fn restorable_tokens(&self, request: RequestId) -> Result<u32> {
        let req = self.table.get(request)?;
        Ok(self.groups.restorable_tokens(
            req.tokens.len() as u32,
            req.spec.saved_logits,
            self.params.geometry.block_tokens(),
        ))
    }

    /// Sends a store lookup for `request`, if its lookup budget (`RESTORE_LOOKUPS_MAX`, O7, K3) allows; `false`
    /// (nothing changed) when it is spent. Every path that asks the store goes through here.
    pub(crate) fn send_lookup(&mut self, request: RequestId, limit_tokens: u32) -> Result<bool> {
        let (now, latency) = (self.time.now, self.params.lookup_latency);
        let req = self.table.get_mut(request)?;
        if req.lookups >= RESTORE_LOOKUPS_MAX {
            return Ok(false);
        }
        req.lookups += 1;
        self.restores.earliest_lookup = Some(
            self.restores
                .earliest_lookup
                .map_or(req.order, |at| at.min(req.order)),
        );
        req.restore = Restore::Lookup {
            sent: now,
            answer_at: now.after(latency),
            limit_tokens,
        };
        self.table.move_to(request, RequestPhase::Restoring)?;
        Ok(true)
    }

    /// The store's answer: a checkpoint and how many of its leading tokens restore `request` (fewer than
    /// `limit_tokens`). With one full-attention group the checkpoint sharing the most leading blocks with
    /// `request`, even when it is longer than the match (its first blocks are a checkpoint of their own), in whole
    /// blocks; on a hybrid model (a window holds only its live blocks, a state is valid only at its exact
    /// boundary, H2) the longest whole checkpoint that is a prefix of `request`, at its exact boundary (H6). A store
    /// on a thread of its own (wall clock) answers at a later poll: `StoreAnswer::OnItsWay` until then.
    fn find_checkpoint(&mut self, request: RequestId, limit_tokens: u32) -> Result<StoreAnswer> {
        let block_tokens = self.params.geometry.block_tokens();
        let limit = limit_tokens
            .saturating_sub(1)
            .min(self.restorable_tokens(request)?);
        // An exact-boundary (hybrid) match compares the checkpoint's partial tail with the prompt's tokens,
        // which a hybrid engine holds from submit (`reads_running_tokens`); a block-prefix match reads the
        // keys alone, so a deferred prompt stays deferred.
        let (lookup, tokens) = if self.groups.restore_boundary() == RestoreBoundary::Block {
            (Lookup::BlockPrefix, &[][..])
        } else {
            (
                Lookup::Whole,
                &self.table.get(request)?.tokens.get(request)?[..limit as usize],
            )
        };
        let req = &self.table.get(request)?;
        let query = PrefixQuery {
            block_keys: &req.keys[..(limit / block_tokens) as usize],
            tokens,
        };
        let Some(found) = self.restores.store.find(request, lookup, &query) else {
            return Ok(StoreAnswer::OnItsWay);
        };
        let Some((meta, blocks)) = found else {
            return Ok(StoreAnswer::Nothing);
        };
        let (checked, tokens) = match lookup {
            Lookup::BlockPrefix => {
                // An answer sent for a shorter query than this one is still a prefix of it.
                let blocks = blocks.min(query.block_keys.len() as u32);
                let checked = meta.check_block_prefix_restorable(
                    &self.restores.layout,
                    &query,
                    blocks as usize,
                );
                (checked, blocks * block_tokens)
            }
            Lookup::Whole => (
                meta.check_restorable(&self.restores.layout, &query),
                meta.n_tokens as u32,
            ),
        };
        if let Err(mismatch) = checked {
            // G6: never restored; the request recomputes and the log says why.
            tracing::warn!(request = %request, checkpoint = %meta.id, %mismatch, "checkpoint does not match: recomputing");
            return Ok(StoreAnswer::Nothing);
        }
        Ok(StoreAnswer::Found(meta, tokens))
    }

    /// Polls every pending restore once (Q8). What else competes (the restore preflight) is computed once: a
    /// poll changes no running request, so it is the same for every restore it polls. A capacity waiter whose
    /// reservation would be refused again, with nothing time-driven due, is answered from its last refusal
    /// (`Refused`): the poll would change nothing. Debug builds poll it all the same and check that it did not.
    pub(crate) fn poll_restores(&mut self, report: &mut StepReport) -> Result<()> {
        let pending: Vec<RequestId> = self.table.restoring().values().copied().collect();
        // A threaded store's answers to requests that no longer restore are dropped.
        let table = &self.table;
        self.restores.store.retain(|request| {
            table
                .find(request)
                .is_some_and(|req| !matches!(req.restore, Restore::Idle))
        });
        self.restores.earliest_lookup = None;
        let preflight = self.restore_preflight();
        for id in pending {
            report.restore_polls += 1;
            let req = self.table.get(id)?;
            match &req.restore {
                &Restore::Lookup {
                    sent,
                    answer_at,
                    limit_tokens,
                } => {
                    // A store on its own thread may answer after the modeled latency: the request waits
                    // for it up to the lookup timeout, as for an answer not yet due.
                    let answered = self.time.now >= answer_at
                        && self.answer_lookup(id, limit_tokens, &preflight, report)?;
                    if !answered && self.time.now.since(sent) >= self.params.lookup_timeout {
                        self.fall_back(id, FallbackReason::LookupTimeout, report)?;
                    }
                }
                Restore::Answered {
                    answered, refused, ..
                } => {
                    let unchanged =
                        refused.filter(|refused| self.refused_again(req, refused, &preflight));
                    if unchanged.is_some() && !cfg!(debug_assertions) {
                        continue;
                    }
                    let due_refresh =
                        self.time.now.since(*answered) >= self.params.lookup_timeout / 2;
                    let fallbacks = report.fallbacks.len();
                    self.poll_answered(id, due_refresh, &preflight, report)?;
                    if let Some(unchanged) = unchanged {
                        self.check_refused_again(id, &unchanged, fallbacks, report)?;
                    }
                }
                Restore::Importing { .. } => {} // copy in flight: defer
                Restore::Idle => {
                    return Err(Error::internal(format!(
                        "{id} is restoring without a restore"
                    )));
                }
            }
        }
        // The earliest lookup still unanswered holds back later cold admissions (Q1); `send_lookup` lowers it.
        self.restores.earliest_lookup = self
            .table
            .restoring()
            .iter()
            .find(|(_, id)| {
                self.table
                    .find(**id)
                    .is_some_and(|req| matches!(req.restore, Restore::Lookup { .. }))
            })
            .map(|(order, _)| *order);
        Ok(())
    }

    /// An answered restore's poll: the lookup's refresh when it is due (G4), then its reservation.
    fn poll_answered(
        &mut self,
        request: RequestId,
        due_refresh: bool,
        preflight: &Preflight,
        report: &mut StepReport,
    ) -> Result<()> {
        if due_refresh {
            let Restore::Answered {
                checkpoint, tokens, ..
            } = self.table.get(request)?.restore.clone()
            else {
                return Err(Error::internal(format!(
                    "{request}: refreshing an unanswered lookup"
                )));
            };
            // G4: a non-blocking refresh keeps the checkpoint recent in the store. One on its way keeps
            // the answer it refreshes until it comes (the refresh stays due).
            let (fresh, fresh_tokens) = match self.find_checkpoint(request, tokens + 1)? {
                StoreAnswer::Found(fresh, fresh_tokens) => (fresh, fresh_tokens),
                StoreAnswer::Nothing => {
                    return self.fall_back(request, FallbackReason::NotInStore, report);
                }
                StoreAnswer::OnItsWay => return self.try_reserve(request, preflight, report),
            };
            let (checkpoint, tokens) = self
                .groups
                .refreshed((checkpoint, tokens), (fresh, fresh_tokens));
            self.table.get_mut(request)?.restore = Restore::Answered {
                checkpoint,
                tokens,
                answered: self.time.now,
                refused: None,
            };
        }
        self.try_reserve(request, preflight, report)
    }

    /// Whether `req`'s reservation, last refused for pressure as `refused` records, would be refused again now
    /// with nothing else to do: its prompt is unchanged, nothing time-driven is due, and its policy refuses
    /// the same need before counting earlier waiters' holds (Q2's holds only lower what is available).
    fn refused_again(&self, req: &Req, refused: &Refused, preflight: &Preflight) -> bool {
        let admissible_pages = reservation::pages_available_to_admit(
            self.pool.n_free(),
            0,
            &self.admission_preflight(),
        );
        self.time.now < refused.until
            && refused.request_tokens == req.tokens.len() as u32
            && refused.prompt_end == req.prompt_end
            && self.policy.refuses_for_pressure(
                &self.pool,
                preflight,
                admissible_pages,
                refused.need_pages,
            )
    }

    /// Debug builds: a waiter that `refused_again` said would be refused again was polled all the same, and the
    /// poll must have changed nothing but what a refusal refreshes.
    fn check_refused_again(
        &self,
        request: RequestId,
        expected: &Refused,
        fallbacks: usize,
        report: &StepReport,
    ) -> Result<()> {
        let unchanged = report.fallbacks.len() == fallbacks
            && matches!(
                &self.table.get(request)?.restore,
                Restore::Answered { refused: Some(refused), .. } if refused == expected
            );
        if unchanged {
            Ok(())
        } else {
            Err(Error::internal(format!(
                "{request}: a capacity waiter judged to be refused again ({expected:?}) was not"
            )))
        }
    }

    /// Records a refusal for pressure of `request`'s reservation, needing `need_pages`, while it still waits.
    fn remember_refusal(&mut self, request: RequestId, need_pages: u32) -> Result<()> {
        let max_wait = self.params.restore_max_wait;
        let refresh_after = self.params.lookup_timeout / 2;
        let req = self.table.get_mut(request)?;
        let Some(CapacityWait { started, logged }) = req.capacity_wait() else {
            return Ok(());
        };
        let next_log = logged.after(WAIT_LOG_INTERVAL);
        let request_tokens = req.tokens.len() as u32;
        let prompt_end = req.prompt_end;
        if let Restore::Answered {
            answered, refused, ..
        } = &mut req.restore
        {
            *refused = Some(Refused {
                need_pages,
                request_tokens,
                prompt_end,
                until: started
                    .after(max_wait)
                    .min(answered.after(refresh_after))
                    .min(next_log),
            });
        }
        Ok(())
    }

    /// `request`'s lookup, due now: its answer taken (`true`), or `false` while a store on its own thread has not
    /// answered yet (nothing changed).
    fn answer_lookup(
        &mut self,
        request: RequestId,
        limit_tokens: u32,
        preflight: &Preflight,
        report: &mut StepReport,
    ) -> Result<bool> {
        let (checkpoint, matched_tokens) = match self.find_checkpoint(request, limit_tokens)? {
            StoreAnswer::Found(checkpoint, matched_tokens) => (checkpoint, matched_tokens),
            StoreAnswer::OnItsWay => return Ok(false),
            StoreAnswer::Nothing => {
                // After a failed copy the retry found nothing shorter: the copy failure is why it
                // recomputes.
                let reason = if self.table.get(request)?.copy_failed {
                    FallbackReason::CopyFailed
                } else {
                    FallbackReason::NotInStore
                };
                self.fall_back(request, reason, report)?;
                return Ok(true);
            }
        };
        let tokens = matched_tokens.min(self.restorable_tokens(request)?);
        let local = self.local_hit_tokens(request, tokens)?;
        if tokens <= local {
            // A complete local hit: admitted without the store (G2). The lookup is over: should the local
            // pages be evicted before admission, the request asks the store again (`examine`).
            let req = self.table.get_mut(request)?;
            req.restore = Restore::Idle;
            req.metrics.complete_local_hit |= !req.admitted_once;
            req.expected_local_tokens = local;
            self.enqueue_waiting(request, None)?;
            return Ok(true);
        }
        self.table.get_mut(request)?.restore = Restore::Answered {
            checkpoint,
            tokens,
            answered: self.time.now,
            refused: None,
        };
        if self.policy.restores_at_admission() {
            // Before the contract: the restore is tried at admission, at once or not at all (G1).
            self.enqueue_waiting(request, None)?;
        } else {
            self.try_reserve(request, preflight, report)?;
        }
        Ok(true)
    }

    /// The answered restore of `request` when it may reserve now: a copy slot is free and the checkpoint's pages
    /// can be taken without waiting for the store. `None` while it waits for either (or once it gave up).
    fn reservable(
        &mut self,
        request: RequestId,
        report: &mut StepReport,
    ) -> Result<Option<(Arc<CheckpointMeta>, u32)>> {
        if self.restores.index.n_staged() >= self.params.copy_task_limit as usize {
            // Wait for a copy slot (G2); a capacity wait whose bound ran out meanwhile is over all the same
            // (W1), or the waiter would wait for ever behind copies that keep the slots busy.
            if self.wait_expired(request) {
                self.fall_back(request, FallbackReason::WaitExpired, report)?;
            }
            return Ok(None);
        }
        let Restore::Answered {
            checkpoint,
            tokens,
            answered,
            ..
        } = self.table.get(request)?.restore.clone()
        else {
            return Err(Error::internal(format!(
                "{request}: reserving without an answered lookup"
            )));
        };
        if !self.restores.store.ready(request, &checkpoint.id) {
            // A store on its own thread reads the pages ahead, off the step: the reservation waits for them
            // up to the lookup timeout, then the restore recomputes (G2).
            if self.store_answer_expired(answered) {
                self.fall_back(request, FallbackReason::LookupTimeout, report)?;
            }
            return Ok(None);
        }
        Ok(Some((checkpoint, tokens)))
    }

    /// Whether a read ahead of a checkpoint answered at `answered` waited out the lookup timeout (G2): a
    /// store on its own thread that has not sent the pages by then is not waited for any longer.
    pub(crate) fn store_answer_expired(&self, answered: Timestamp) -> bool {
        self.time.now.since(answered) >= self.params.lookup_timeout
    }

    /// Reserves for an answered restore by the policy's mechanism and starts its copy.
    fn try_reserve(
        &mut self,
        request: RequestId,
        preflight: &Preflight,
        report: &mut StepReport,
    ) -> Result<()> {
        let Some((checkpoint, tokens)) = self.reservable(request, report)? else {
            return Ok(());
        };
        let reservation = match self.reserve(request, &checkpoint, tokens, preflight) {
            Ok(reservation) => reservation,
            Err(Refusal::Internal(error)) => return Err(error),
            Err(refusal) => {
                self.refused(request, refusal.kind(), &refusal, report)?;
                if let Some(need_pages) = refusal.pressure_need() {
                    self.remember_refusal(request, need_pages)?;
                }
                return Ok(());
            }
        };
        self.end_wait(request);
        let pages = match reservation {
            Reservation::Ticket { ticket, pages } => {
                self.table.get_mut(request)?.ticket = Some(ticket);
                Some(pages)
            }
            Reservation::PagesFreeNow => None,
        };
        let Ok(stored) = self.restores.store.take(request, &checkpoint.id) else {
            // G3: the selected checkpoint was lost (evicted from the store, or the store failed) after the
            // reservation: no copy ever received the ticket's pages, so the release frees them at once, and
            // the request looks up again.
            tracing::debug!(request = %request, "checkpoint lost after its reservation: ticket released");
            self.retry_lookup(request, tokens + 1, FallbackReason::NotInStore, report)?;
            return Ok(());
        };
        let part = self.checkpoint_part(&stored, 0, tokens)?;
        let stage = StageRequest {
            request,
            request_tokens: self.table.get(request)?.tokens.len(),
            checkpoint: &part,
            dependency_pages: &[],
        };
        let import = match pages {
            Some(pages) => {
                let import = self.restores.index.stage_into(
                    &mut self.pool,
                    &mut *self.restores.copies,
                    self.time.now,
                    stage,
                    pages,
                )?;
                // One owner pins and drains the destination pages: the index, which took its own
                // reference. The ticket hands its references over and keeps its slot and credits.
                let ticket = self.table.get(request)?.ticket.as_ref();
                let ticket =
                    ticket.ok_or_else(|| Error::internal(format!("{request} lost its ticket")))?;
                let handed = self.policy.hand_over(ticket)?;
                self.pool.free_all(&handed)?;
                import
            }
            None => self.restores.index.stage(
                &mut self.pool,
                &mut *self.restores.copies,
                self.time.now,
                stage,
            )?,
        };
        self.table.get_mut(request)?.restore = Restore::Importing { tokens, import };
        Ok(())
    }

    /// Asks the policy to reserve `tokens` tokens of `checkpoint` for `request`.
    fn reserve(
        &mut self,
        request: RequestId,
        checkpoint: &CheckpointMeta,
        tokens: u32,
        preflight: &Preflight,
    ) -> Result<Reservation, Refusal> {
        let req = self.table.get(request).map_err(Refusal::Internal)?;
        let mut spec = RestoreSpec::for_geometry(
            &self.params.geometry,
            tokens,
            req.tokens.len() as u32,
            self.params.chunk_tokens,
        );
        spec.draft_lookahead_tokens = self.params.draft_tokens;
        spec.captures = self
            .captures_after(request, tokens)
            .map_err(Refusal::Internal)?;
        let import_pages = self.groups.import_pages(
            checkpoint.pages.len() as u32,
            tokens,
            self.params.geometry.block_tokens(),
        );
        // The naive fix counts the pages free now under the watermark, not other prefills' needs (no R2).
        let admissible_pages = reservation::pages_available_to_admit(
            self.pool.n_free(),
            0,
            &self.admission_preflight(),
        );
        let ask = ReserveAsk {
            request,
            order: req.order,
            spec,
            preflight,
            import_pages,
            admissible_pages,
            now: self.time.now,
            max_wait: self.params.restore_max_wait,
        };
        self.policy.reserve(&mut self.pool, &ask)
    }

    /// Checkpoints `request` publishes while it computes its prompt from token `from` (H7, C2): the prompt end,
    /// its instruction boundary when that is ahead, and the prefill tail when the rest takes several chunks.
    fn captures_after(&self, request: RequestId, from: u32) -> Result<u32> {
        let req = self.table.get(request)?;
        let instruction = req.spec.instruction_tokens.filter(|&at| at > from);
        let tail_from = instruction.unwrap_or(from).max(from);
        let tail = self.params.capture_prefill_tail
            && req.prompt_end.saturating_sub(tail_from) > self.params.chunk_tokens;
        Ok(1 + u32::from(instruction.is_some()) + u32::from(tail))
    }

    /// The preflight of a restore's reservation (R2): what else competes this step, the remaining needs of
    /// running prefills that hold no ticket included (they take their pages chunk by chunk).
    pub(crate) fn restore_preflight(&self) -> Preflight {
        Preflight {
            unticketed_prefill_pages: self.unticketed_prefill_pages(),
            ..self.admission_preflight()
        }
    }

    /// What competes with any admission this step: the running requests and the watermark (applied while
    /// they run). Cold admissions use it as it is: they count the pages free now, as vLLM's scheduler does.
    pub(crate) fn admission_preflight(&self) -> Preflight {
        Preflight {
            running_requests: self.table.running().len() as u32,
            unticketed_prefill_pages: 0,
            watermark_pages: self.params.watermark_pages,
            other_work_scheduled: !self.table.running().is_empty(),
        }
    }

    /// Remaining page needs of running prefills that hold no ticket (they take their pages chunk by chunk).
    fn unticketed_prefill_pages(&self) -> u32 {
        let block_tokens = self.params.geometry.block_tokens();
        self.table
            .running()
            .iter()
            .filter_map(|running| self.table.find(*running))
            .filter(|running| {
                running.in_prefill() && !self.policy.holds_admitted_ticket(running.spec.id)
            })
            .map(|running| {
                let blocks = running.prompt_end.div_ceil(block_tokens);
                let windows: u32 = (0..self.groups.n_windows())
                    .map(|window| {
                        let held = running.windows.get(window).map_or(0, Vec::len) as u32;
                        blocks.saturating_sub(held)
                    })
                    .sum();
                blocks.saturating_sub(running.pages.len() as u32)
                    + windows
                    + self
                        .groups
                        .n_fixed()
                        .saturating_sub(running.fixed.len() as u32)
            })
            .sum()
    }

    /// Whether `request`'s capacity wait is over (W1): its ledger waiter expired (with the ledger's one warning),
    /// or, without a ledger (`pages-only`), it has waited `restore_max_wait` since its first refusal.
    fn wait_expired(&mut self, request: RequestId) -> bool {
        let started = self
            .table
            .find(request)
            .and_then(Req::capacity_wait)
            .map(|wait| wait.started);
        self.policy.wait_expired(
            request,
            self.time.now,
            started,
            self.params.restore_max_wait,
        )
    }

    /// A refused reservation: pressure starts or continues a capacity wait (logged, G5); impossible and
    /// expired recompute at once.
    fn refused(
        &mut self,
        request: RequestId,
        kind: ErrorKind,
        message: &dyn std::fmt::Display,
        report: &mut StepReport,
    ) -> Result<()> {
        let now = self.time.now;
        match kind {
            ErrorKind::Pressure => {
                let max_wait = self.params.restore_max_wait;
                let req = self.table.get_mut(request)?;
                let wait = req.capacity_wait_mut()?;
                match *wait {
                    None => {
                        *wait = Some(CapacityWait {
                            started: now,
                            logged: now,
                        });
                        req.metrics.capacity_waits += 1;
                        self.tally.capacity_waits_started += 1;
                        tracing::info!(request = %request, free_pages = self.pool.n_free(), %message, "restore waits for capacity");
                    }
                    Some(CapacityWait { started, logged }) => {
                        if self.policy.own_wait_over(now.since(started), max_wait) {
                            // pages-only keeps its own bounded wait (no ledger).
                            self.fall_back(request, FallbackReason::WaitExpired, report)?;
                            return Ok(());
                        }
                        if now.since(logged) >= WAIT_LOG_INTERVAL {
                            *wait = Some(CapacityWait {
                                started,
                                logged: now,
                            });
                            tracing::info!(request = %request, waited_s = now.since(started).as_secs_f64(), %message, "restore still waits for capacity");
                        }
                    }
                }
            }
            ErrorKind::Impossible => self.fall_back(request, FallbackReason::Impossible, report)?,
            ErrorKind::Expired => self.fall_back(request, FallbackReason::WaitExpired, report)?,
            ErrorKind::Invalid => {
                tracing::warn!(request = %request, %message, "restore refused as invalid: recomputing");
                self.fall_back(request, FallbackReason::Invalid, report)?;
            }
        }
        Ok(())
    }

    /// Applies copy completions: publication (E3-verified), failures (retry, O7), invalidations (O2).
    pub(crate) fn poll_imports(&mut self, report: &mut StepReport) -> Result<()> {
        let events =
            self.restores
                .index
                .poll(&mut self.pool, &mut *self.restores.copies, self.time.now);
        self.absorb_published(&events);
        for event in events {
            self.apply_import_event(&event, report)?;
        }
        Ok(())
    }

    /// Waits for every copy in flight and applies its completion: what a step with nothing else to run does
    /// when the copy engine cannot say when its copies end (threaded copies on the simulated clock).
    pub(crate) fn wait_for_copies(&mut self, report: &mut StepReport) -> Result<()> {
        let events = self
            .restores
            .index
            .drain_all(&mut self.pool, &mut *self.restores.copies);
        self.absorb_published(&events);
        for event in events {
            self.apply_import_event(&event, report)?;
        }
        Ok(())
    }

    /// The KV events of the blocks the published imports among `events` cached.
    fn absorb_published(&mut self, events: &[ImportEvent]) {
        let mut owners: Vec<(RequestId, usize)> = events
            .iter()
            .filter_map(|event| match event {
                &ImportEvent::Published { request, .. } => Some((request, 0)),
                _ => None,
            })
            .collect();
        self.absorb_prefix_changes(&mut owners);
    }

    fn apply_import_event(&mut self, event: &ImportEvent, report: &mut StepReport) -> Result<()> {
        match event {
            // A drained import's pages are free: the ledger's references went when it was cancelled.
            ImportEvent::Acknowledged { .. } | ImportEvent::Drained { .. } => Ok(()),
            &ImportEvent::Published {
                request: id,
                import,
                ..
            } => self.on_published(id, import),
            &ImportEvent::Failed { request: id, .. }
            | &ImportEvent::Invalidated { request: id, .. } => self.on_import_failed(id, report),
        }
    }

    /// `request`'s import `import` is published: verified, then handed over as its policy says (ordinary: the
    /// admitted request already holds the pages; owned: the request is ready; pages-only: evictable
    /// cached pages and the request waits again).
    fn on_published(
        &mut self,
        request: RequestId,
        import: checkpoint_transfer::ImportId,
    ) -> Result<()> {
        let loading = self.table.get(request)?.loading().copied();
        let (expected, first_block, tokens) = match (&loading, &self.table.get(request)?.restore) {
            (Some(loading), _) => (loading.import, loading.first_block, loading.tokens),
            (None, &Restore::Importing { import, tokens }) => (import, 0, tokens),
            (None, restore) => {
                return Err(Error::internal(format!(
                    "{request} published an import while its restore is {}",
                    restore.name()
                )));
            }
        };
        debug_assert_eq!(
            expected, import,
            "{request} published an import it does not wait for"
        );
        self.verify_import(request, first_block, tokens)?;
        if loading.is_some() {
            // ordinary: the admitted request already holds the pages; the index lets go of them.
            self.table.get_mut(request)?.take_loading();
            let _released =
                self.restores
                    .index
                    .cancel(&mut self.pool, &mut *self.restores.copies, request)?;
        } else if self.policy.publish(request)? == Publication::Owned {
            self.table.move_to(request, RequestPhase::Ready)?;
        } else {
            // pages-only: no ownership once published; the pages are evictable cached pages.
            let published = self
                .restores
                .index
                .pages(request)
                .ok_or_else(|| {
                    Error::internal(format!("{request}: published import has no pages"))
                })?
                .to_vec();
            if self.groups.imports_unkeyed_pages() {
                // Its unkeyed pages (partial last page, state) stay findable under their slot's
                // key, as evictable as its blocks, until the request is admitted.
                self.key_unkeyed_slots(request, &published, tokens)?;
            }
            self.table.get_mut(request)?.restore = Restore::Idle;
            let _released =
                self.restores
                    .index
                    .cancel(&mut self.pool, &mut *self.restores.copies, request)?;
            let published = (!published.is_empty()).then_some(Published {
                pages: published,
                tokens,
            });
            self.table
                .move_to_phase(request, Phase::Waiting { published })?;
        }
        Ok(())
    }

    /// `request`'s import failed or was invalidated: ordinary recomputes what the copy should have brought;
    /// a restoring request releases its ticket and looks up again.
    fn on_import_failed(&mut self, request: RequestId, report: &mut StepReport) -> Result<()> {
        let block_tokens = self.params.geometry.block_tokens();
        // The index discarded the import once its copies drained.
        let reason = FallbackReason::CopyFailed;
        let req = self.table.get_mut(request)?;
        req.copy_failed = true;
        if let Some(loading) = req.take_loading() {
            // ordinary: recompute what the copy should have brought; the local hits before it stay.
            let hits = loading.first_block as usize;
            let mut garbage = req.pages.split_off(hits);
            garbage.append(&mut req.fixed);
            for table in std::mem::take(&mut req.windows) {
                garbage.extend(table.into_iter().filter(|page| !page.is_null()));
            }
            req.window_credit_pages.clear();
            req.forget_copy(hits as u32 * block_tokens);
            req.metrics.prompt_tokens_restored = 0;
            req.metrics.restored = false;
            req.fall_back(reason);
            report.fallbacks.push((request, reason));
            self.pool.free_all(&garbage)?;
            return Ok(());
        }
        let Restore::Importing { tokens, .. } = req.restore.clone() else {
            return Err(Error::internal(format!(
                "{request}: a failed import of no importing restore"
            )));
        };
        self.retry_lookup(request, tokens, reason, report)?;
        Ok(())
    }
}
