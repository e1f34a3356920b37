//! One scheduler step: arrivals, import completions, the restore coordinator, then the running pass first
//! (decode and chunked prefill under the token budget; preemption by recompute only from this path and only
//! while nothing is scheduled yet, Q5, Q6), streaming resumes (Q7), admissions, and finally the executor's
//! work, its page bytes, sampling, captures (E2) and completions.
use std::time::Instant;

use checkpoint_transfer::CheckpointKind;
use kv_pool::{RequestId, Timestamp};

use super::pages::AllocKind;
use super::report::RequestPhase;
use super::req::{Req, Restore};
use super::{Engine, StepReport};
use crate::error::{Error, Result};
use crate::executor::{DecodeWork, Executor, PrefillWork, StepBatch};
use crate::request::{STOP_TOKEN, output_token_at};

/// The watchdog tolerates at least this many steps without progress (K3).
const STALL_STEPS_MIN: u64 = 100_000;

/// Stuck requests named in a watchdog error at most (the rest are counted).
const STUCK_LISTED_MAX: usize = 16;

/// Work planned for one request this step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Work {
    /// Compute `n` tokens from position `first_pos`.
    Prefill { first_pos: u32, n: u32 },
    /// Compute the pending token, verify the draft tokens proposed after it (the lookahead slots) and append
    /// the tokens accepted: 1 to `1 + draft_tokens` (`Engine::decode_yield`).
    Decode { context: u32 },
    /// Sample from saved logits of a fully restored prompt (Q4).
    LogitsOnly,
}

/// The step being planned.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub(crate) entries: Vec<(RequestId, Work)>,
    pub(crate) budget: u32,
}

impl Plan {
    /// The executor's view of the plan: each entry's tokens and page tables, borrowed from `reqs`.
    fn batch<'a>(
        &self,
        table: &'a super::table::RequestTable,
        draft_tokens: u32,
        with_tokens: bool,
    ) -> Result<StepBatch<'a>> {
        // An executor that reads no tokens gets none (a deferred prompt's are not held).
        let tokens_at = |req: &'a Req, first_pos: u32, n: u32| -> Result<&'a [u32]> {
            if with_tokens {
                req.tokens_at(first_pos, n)
            } else {
                Ok(&[])
            }
        };
        let mut batch = StepBatch::default();
        for &(request, work) in &self.entries {
            let Some(req) = table.find(request) else {
                continue;
            };
            match work {
                Work::Prefill { first_pos, n } => batch.prefills.push(PrefillWork {
                    request,
                    first_pos,
                    n_tokens: n,
                    draft_replay_tokens: 0,
                    tokens: tokens_at(req, first_pos, n)?,
                    pages: req.page_tables(),
                    samples: first_pos + n >= req.tokens.len() as u32,
                }),
                Work::Decode { context } => {
                    batch.decodes.push(DecodeWork {
                        request,
                        context_tokens: context,
                        n_tokens: 1 + draft_tokens,
                        draft_replay_tokens: 0,
                        tokens: tokens_at(req, context, 1)?,
                        pages: req.page_tables(),
                    });
                }
                Work::LogitsOnly => batch.logits_only.push(request),
            }
        }
        Ok(batch)
    }
}

impl<E: Executor> Engine<E> {
    /// Runs one scheduler step and advances the clock by its modeled duration (or, when nothing can run, to
    /// the next event: an arrival, a copy completion, a lookup answer or timeout, a wait expiry).
    ///
    /// Errors: `Error::Stalled` when no request made progress for `EngineParams::stall_timeout` (K3), naming
    /// the stuck requests; `Error::Internal` when the engine found its own state inconsistent (a bug, K2).
    /// After `Stalled` the engine is consistent: a server may cancel the named requests and go on. After
    /// `Internal` or `RestoreMismatch` it must be dropped; the server keeps serving with a new one.
    pub fn step(&mut self) -> Result<StepReport> {
        #[allow(
            clippy::disallowed_methods,
            reason = "wall time feeds only the wall_seconds metric, never a decision"
        )]
        let wall_start = Instant::now();
        let mut report = std::mem::take(&mut self.scratch.between_steps);
        self.step_inner(&mut report)?;
        self.watch_progress()?;
        report.now = self.time.now;
        report.free_pages = self.pool.n_free();
        report.credit_pages = self.policy.credit_pages();
        report.waiting = self.table.waiting.len() as u32;
        report.running = self.table.running().len() as u32;
        self.time.step_done(wall_start.elapsed());
        Ok(report)
    }

    /// Steps until idle or `max_steps`; returns the steps taken. Errors as `step`.
    pub fn run_until_idle(&mut self, max_steps: u64) -> Result<u64> {
        let mut steps = 0;
        while !self.is_idle() && steps < max_steps {
            let report = self.step()?;
            steps += 1;
            if report.idle {
                break;
            }
        }
        Ok(steps)
    }

    /// The liveness watchdog (K3): fails when requests are active (not arriving later, not paused) and none
    /// produced a token or ended for `stall_timeout` on the engine clock or for `stall_steps_max` steps.
    fn watch_progress(&mut self) -> Result<()> {
        if !self.table.is_active() {
            self.note_progress();
            return Ok(());
        }
        let steps = self.watchdog.step_without_progress();
        let stalled = self.time.now.since(self.watchdog.last_progress);
        if stalled <= self.params.stall_timeout && steps <= self.stall_steps_max() {
            return Ok(());
        }
        Err(Error::Stalled {
            stalled_s: stalled.as_secs_f64(),
            steps,
            requests: self.describe_stuck(),
        })
    }

    /// Steps without progress the watchdog tolerates: `STALL_STEPS_MIN`, or four times the steps the longest
    /// prompt's prefill takes in chunks, when that is more.
    fn stall_steps_max(&self) -> u64 {
        let chunk = self.params.chunk_tokens.min(self.params.max_batched_tokens);
        let prefill_steps =
            u64::from(self.params.geometry.max_model_len()).div_ceil(u64::from(chunk));
        STALL_STEPS_MIN.max(4 * prefill_steps)
    }

    /// A request produced a token or ended: the watchdog starts over.
    pub(crate) fn note_progress(&mut self) {
        self.watchdog.progress(self.time.now);
    }

    /// The active requests, for the watchdog's error: id, phase, restore state, lookups and progress.
    fn describe_stuck(&self) -> String {
        let mut stuck: Vec<_> = self
            .table
            .iter()
            .filter(|(_, req)| {
                !matches!(req.phase(), RequestPhase::Arriving | RequestPhase::Paused)
            })
            .collect();
        stuck.sort_by_key(|(_, req)| req.order);
        let n_stuck = stuck.len();
        let mut text: Vec<String> = stuck
            .into_iter()
            .take(STUCK_LISTED_MAX)
            .map(|(id, req)| {
                format!(
                    "{id} ({:?}, restore {}, {} lookups, {}/{} tokens computed)",
                    req.phase(),
                    req.restore.name(),
                    req.lookups,
                    req.n_computed,
                    req.tokens.len()
                )
            })
            .collect();
        if n_stuck > STUCK_LISTED_MAX {
            text.push(format!("and {} more", n_stuck - STUCK_LISTED_MAX));
        }
        text.join(", ")
    }

    fn step_inner(&mut self, report: &mut StepReport) -> Result<()> {
        self.time.step_start();
        self.deliver_captures();
        self.process_arrivals()?;
        self.poll_imports(report)?;
        self.poll_restores(report)?;
        let mut plan = Plan {
            entries: Vec::new(),
            budget: self.params.max_batched_tokens,
        };
        self.schedule_resumes()?;
        let isolated = self.isolated_logits_step(&mut plan, report)?;
        if !isolated {
            // Q5: no ready import holds the decode pass back.
            self.schedule_running(&mut plan, report)?;
            self.admit(&mut plan, report)?;
        }
        self.scratch.last_step_isolated = isolated;
        if plan.entries.is_empty() {
            match self.next_event_at() {
                Some(at) if at > self.time.now => self.time.idle_until(at),
                Some(_) => {}
                // Copies whose end the clock cannot know (threaded): nothing else can run, so wait for them.
                None if self.restores.copies.n_in_flight() > 0 => self.wait_for_copies(report)?,
                None => report.idle = true,
            }
            return Ok(());
        }
        let replays = self.take_draft_replays(&plan)?;
        let mut batch = plan.batch(
            &self.table,
            self.params.draft_tokens,
            self.executor.reads_tokens(),
        )?;
        for work in &mut batch.prefills {
            work.draft_replay_tokens = replays.get(&work.request).copied().unwrap_or(0);
        }
        for work in &mut batch.decodes {
            work.draft_replay_tokens = replays.get(&work.request).copied().unwrap_or(0);
        }
        let output = self.executor.execute(&batch, &*self.storage)?;
        let duration = output.duration;
        self.scratch.model_tokens.extend(output.tokens);
        report.duration = duration;
        self.time.after_step(duration);
        self.apply(&plan, report)
    }

    fn process_arrivals(&mut self) -> Result<()> {
        while let Some(id) = self.table.pop_arrived(self.time.now) {
            if !self.table.is_active() {
                // Nothing was active until now: the watchdog counts from this arrival, not from the last
                // progress before an idle stretch.
                self.note_progress();
            }
            self.on_arrival(id)?;
        }
        Ok(())
    }

    /// Q4: ready imports that restore their whole prompt with saved logits get a step of their own that runs
    /// nothing but their logits-only entries (sampling from the saved logits), even behind a blocked head; they
    /// own their slot. Not twice in a row while requests run, so the decode pass is never held back for more
    /// than one step (Q5). `true` when this step is such an isolated step.
    fn isolated_logits_step(&mut self, plan: &mut Plan, report: &mut StepReport) -> Result<bool> {
        if self.scratch.last_step_isolated && !self.table.running().is_empty() {
            return Ok(false);
        }
        for id in self.table.take_ready_logits() {
            // `false`: its pages were lost and it is back in the waiting queue for a lookup.
            let _admitted = self.admit_ready(id, plan, report)?;
        }
        Ok(!plan.entries.is_empty())
    }

    /// Paused streams that received input run again at once when a slot is free: they bypass the admission
    /// gate, the blocked head and capacity waiters (Q7).
    fn schedule_resumes(&mut self) -> Result<()> {
        while let Some(id) = self.table.first_resuming() {
            if self.free_slots() == 0 {
                break;
            }
            self.table.move_to(id, RequestPhase::Running)?;
        }
        Ok(())
    }

    /// Running slots free for admissions: the limit minus running requests and ticket-held slots.
    pub(crate) fn free_slots(&self) -> u32 {
        let held = self.policy.slots_held();
        self.params
            .max_running
            .saturating_sub(self.table.running().len() as u32)
            .saturating_sub(held)
    }

    /// The running pass: every running request gets its decode or next prefill chunk if the budget and its
    /// pages allow. A request that cannot get pages preempts from the tail only while nothing is scheduled yet
    /// in this step (Q5); otherwise it waits for the next step.
    fn schedule_running(&mut self, plan: &mut Plan, report: &mut StepReport) -> Result<()> {
        let mut idx = 0;
        while idx < self.table.running().len() {
            let id = self.table.running()[idx];
            let req = &self.table.get(id)?;
            if req.loading().is_some() {
                idx += 1;
                continue;
            }
            if req.n_to_compute() == 0 {
                // An `ordinary` restore of the whole prompt with saved logits, its copy landed: it samples from
                // them, computing nothing.
                plan.entries.push((id, Work::LogitsOnly));
                idx += 1;
                continue;
            }
            let Some((work, tokens, upto, kind)) = self.next_work(id, plan.budget)? else {
                idx += 1;
                continue;
            };
            if tokens > plan.budget {
                idx += 1;
                continue;
            }
            let scheduled = tokens > 0 && self.grow_pages(id, upto, kind)?;
            if scheduled {
                if kind == AllocKind::Prefill {
                    self.register_blocks_upto(id, upto)?;
                }
                plan.entries.push((id, work));
                plan.budget -= tokens;
                idx += 1;
                continue;
            }
            if !plan.entries.is_empty() {
                // Something is scheduled already: no preemption in this step (Q5); retry next step.
                idx += 1;
                continue;
            }
            // The newest request behind it that holds no credits gives way (Q6); credits belong to their
            // consumer until its prompt is computed (C1, C6), so a credit holder is never the victim. With
            // no victim, the request gives way itself, unless it holds credits: then it waits.
            let victim = self.preemption_victim(idx);
            match victim {
                Some(victim) => self.preempt(victim, report)?,
                None if self.policy.holds_admitted_ticket(id) => idx += 1,
                None => self.preempt(id, report)?,
            }
            // Retry the same index: either `id` again with more free pages, or the next request.
        }
        Ok(())
    }

    /// The work running request `request` does next within `budget` tokens: a prefill chunk (shrunk to the
    /// pages credits leave it, C1/C5) or a decode of one token and its drafts, with the tokens it takes,
    /// the position its pages must reach and their kind. `None`: nothing this step.
    fn next_work(
        &mut self,
        request: RequestId,
        budget: u32,
    ) -> Result<Option<(Work, u32, u32, AllocKind)>> {
        let draft = self.params.draft_tokens;
        let req = self.table.get(request)?;
        Ok(Some(if req.in_prefill() || req.n_to_compute() > 1 {
            let n_budget = self.prefill_chunk(request, req.n_computed, budget)?;
            if n_budget == 0 {
                return Ok(None);
            }
            // A prefill without a ticket takes no credit-protected page (C1). When the pages it needs are
            // free but credits protect some, its chunk shrinks to the unprotected pages, or it waits when
            // there are none: credits never make anyone preempt (C5). When the pool itself lacks the
            // pages, it is ordinary pressure, handled below as without credits.
            let n = match self.credit_blocked_prefill_tokens(request, n_budget)? {
                Some(0) => return Ok(None),
                Some(n) => n,
                None => n_budget,
            };
            let upto = req.n_computed + n;
            (
                Work::Prefill {
                    first_pos: req.n_computed,
                    n,
                },
                n,
                upto,
                AllocKind::Prefill,
            )
        } else {
            let upto = req.n_computed + 1 + draft;
            (
                Work::Decode {
                    context: req.n_computed,
                },
                1 + draft,
                upto,
                AllocKind::Decode,
            )
        }))
    }

    /// The running request behind position `idx` that gives way (Q6): the newest one that is not
    /// loading and holds no credits (credits belong to their consumer until its prompt is computed, C1,
    /// C6, so a credit holder is never the victim).
    fn preemption_victim(&self, idx: usize) -> Option<RequestId> {
        self.table.running()[idx + 1..]
            .iter()
            .rev()
            .copied()
            .find(|victim| {
                self.table
                    .find(*victim)
                    .is_some_and(|victim| victim.loading().is_none())
                    && !self.policy.holds_admitted_ticket(*victim)
            })
    }

    /// `Some(tokens)` when credits, not the pool, keep `request`'s prefill of `n_tokens` from its pages: the free
    /// pages would do, but some are protected for credit holders. It may then cover only what its pages and
    /// the unprotected ones hold. `None` when the pages are there, when the pool itself lacks them, or when
    /// `request` draws on its own credits.
    fn credit_blocked_prefill_tokens(
        &self,
        request: RequestId,
        n_tokens: u32,
    ) -> Result<Option<u32>> {
        if self.policy.holds_admitted_ticket(request) {
            return Ok(None);
        }
        let block_tokens = self.params.geometry.block_tokens();
        let req = &self.table.get(request)?;
        let held = req.pages.len() as u32;
        let need = self.grow_need(request, req.n_computed + n_tokens)?;
        let unprotected = self.unprotected_free();
        if need <= unprotected || need > self.pool.n_free() {
            return Ok(None);
        }
        // Pages beyond the block table's (fixed pages, copies on write) come first.
        let overhead = self.grow_need(request, 0)?;
        let may_hold_tokens =
            (held + unprotected.saturating_sub(overhead)).saturating_mul(block_tokens);
        Ok(Some(
            n_tokens.min(may_hold_tokens.saturating_sub(req.n_computed)),
        ))
    }

    /// Applies the executed plan: page bytes, block registration, sampling, captures and completions.
    fn apply(&mut self, plan: &Plan, report: &mut StepReport) -> Result<()> {
        for &(id, work) in &plan.entries {
            if !self.table.contains(id) {
                continue;
            }
            match work {
                Work::Prefill { first_pos, n } => {
                    report.prefills.push((id, n));
                    let req = self.table.get_mut(id)?;
                    req.n_computed = first_pos + n;
                    req.metrics.prompt_tokens_recomputed += n;
                    self.write_computed(id, first_pos, first_pos + n)?;
                    self.after_compute(id)?;
                    if self
                        .table
                        .find(id)
                        .is_some_and(|req| req.n_to_compute() == 0)
                    {
                        self.sample(id, report)?;
                    }
                }
                Work::Decode { context } => {
                    report.decodes.push(id);
                    self.apply_decode(id, context, report)?;
                }
                Work::LogitsOnly => {
                    report.logits_only.push(id);
                    self.after_compute(id)?;
                    self.sample(id, report)?;
                }
            }
        }
        Ok(())
    }

    /// After compute: when every token the ticket budgeted is computed the ticket ends (C6); the checkpoint
    /// slots the computed tokens reached are captured (H7): the instruction boundary, the prefill tail (where
    /// a prompt of several chunks starts its last one, when `capture_prefill_tail`), the prompt end (E2).
    fn after_compute(&mut self, request: RequestId) -> Result<()> {
        self.capture_prompt_slots(request)?;
        let req = self.table.get_mut(request)?;
        if req.n_to_compute() == 0
            && let Some(ticket) = req.ticket.take()
        {
            self.policy.finish_prompt(ticket)?;
        }
        let req = &self.table.get(request)?;
        if req.n_computed < req.prompt_end || req.prompt_captured {
            return Ok(());
        }
        self.table.get_mut(request)?.prompt_captured = true;
        self.capture(request, CheckpointKind::Prompt)?;
        Ok(())
    }

    /// Captures the instruction and prefill-tail slots (H7) that `request`'s computed tokens just reached.
    fn capture_prompt_slots(&mut self, request: RequestId) -> Result<()> {
        let chunk_tokens = self.params.chunk_tokens;
        let prefill_tail = self.params.capture_prefill_tail;
        let req = &self.table.get(request)?;
        let at_instruction =
            !req.instruction_captured && req.spec.instruction_tokens == Some(req.n_computed);
        let left = req.prompt_end.saturating_sub(req.n_computed);
        let at_tail = prefill_tail
            && !req.prefill_tail_captured
            && left > 0
            && left <= chunk_tokens
            && req
                .spec
                .instruction_tokens
                .is_none_or(|at| req.n_computed > at);
        if at_instruction {
            self.table.get_mut(request)?.instruction_captured = true;
            self.capture(request, CheckpointKind::Instruction)?;
        }
        if at_tail {
            self.table.get_mut(request)?.prefill_tail_captured = true;
            self.capture(request, CheckpointKind::PrefillTail)?;
        }
        Ok(())
    }

    /// Tokens of `request`'s next prefill chunk from `start` within `budget` tokens: at most the chunk size, and
    /// never past its instruction boundary while that is ahead, so that a chunk ends exactly there (H7).
    pub(crate) fn prefill_chunk(&self, request: RequestId, start: u32, budget: u32) -> Result<u32> {
        let req = self.table.get(request)?;
        let chunk = (req.tokens.len() as u32)
            .saturating_sub(start)
            .min(self.params.chunk_tokens)
            .min(budget);
        Ok(match req.spec.instruction_tokens {
            Some(at) if start < at => chunk.min(at - start),
            _ => chunk,
        })
    }

    /// Applies `request`'s decode at position `context`: the pending token and the drafts accepted after it are
    /// computed (their KV written), and the tokens the step yields (`decode_yield`) are appended, the last
    /// through `sample`, which ends the answer at its cap or stop. A rejected draft's position is not
    /// computed: the token sampled in its place is the next step's pending token.
    fn apply_decode(
        &mut self,
        request: RequestId,
        context: u32,
        report: &mut StepReport,
    ) -> Result<()> {
        let kept = self.decode_yield(request, context)?;
        for _ in 1..kept {
            if self.next_token(request)? {
                return Err(Error::internal(format!(
                    "{request}: an accepted draft before the step's last token ended the answer"
                )));
            }
        }
        self.table.get_mut(request)?.n_computed = context + kept;
        self.write_computed(request, context, context + kept)?;
        self.sample(request, report)
    }

    /// Appends `request`'s next output token: the stop token when the answer stops there, else the executor's
    /// token or the engine's own (`output_token_at`). Returns whether the answer stopped.
    fn next_token(&mut self, request: RequestId) -> Result<bool> {
        let block_tokens = self.params.geometry.block_tokens();
        let now = self.time.now;
        let model_token = self.scratch.model_tokens.remove(&request);
        let stop_token = self.params.stop_token;
        let req = self.table.get_mut(request)?;
        let index = req.output.len() as u32;
        let stop_after = req
            .spec
            .stop_after
            .is_some_and(|stop_after| req.answer_tokens + 1 >= stop_after);
        let token = if stop_after {
            STOP_TOKEN
        } else if let Some(token) = model_token {
            token
        } else {
            output_token_at(req.output_token_state()?, index)
        };
        // The model's own end of turn ends the answer as an early stop does (E2).
        let stop = stop_after || model_token.is_some_and(|token| Some(token) == stop_token);
        req.output.push(token);
        req.push_tokens(&[token], block_tokens)?;
        self.watchdog.progress(now);
        let req = self.table.get_mut(request)?;
        req.answer_tokens += 1;
        req.stopped = stop;
        req.metrics.decode_tokens += 1;
        req.metrics.first_token.get_or_insert(now);
        Ok(stop)
    }

    /// Samples `request`'s next output token (`next_token`); finishes or pauses the answer at its cap or stop
    /// token.
    fn sample(&mut self, request: RequestId, report: &mut StepReport) -> Result<()> {
        let stop = self.next_token(request)?;
        let req = self.table.get(request)?;
        if req.answer_tokens < req.answer_cap && !stop {
            return Ok(());
        }
        self.capture(request, CheckpointKind::Response)?;
        report.finished.push(request);
        if self.table.get(request)?.spec.streaming {
            self.table.move_to(request, RequestPhase::Paused)?;
            self.register_blocks(request)?;
            return Ok(());
        }
        self.finish(request)
    }

    /// When something happens by itself next: an arrival, a copy completion, a capture reaching the store, a
    /// lookup answer or timeout, or a capacity wait's expiry.
    fn next_event_at(&self) -> Option<Timestamp> {
        let mut next: Option<Timestamp> = self.table.next_arrival();
        let mut consider = |at: Timestamp| next = Some(next.map_or(at, |current| current.min(at)));
        if let Some(at) = self.restores.copies.next_completion_at() {
            consider(at);
        }
        if let Some(at) = self.restores.captures.next_arrival_at() {
            consider(at);
        }
        for req in self
            .table
            .restoring()
            .values()
            .filter_map(|id| self.table.find(*id))
        {
            match req.restore {
                Restore::Lookup {
                    sent, answer_at, ..
                } => {
                    consider(answer_at.min(sent.after(self.params.lookup_timeout)));
                }
                Restore::Answered { answered, .. } => {
                    consider(answered.after(self.params.lookup_timeout / 2));
                    if let Some(started) = req.capacity_wait().map(|wait| wait.started) {
                        consider(started.after(self.params.restore_max_wait));
                    }
                }
                _ => {}
            }
        }
        next
    }

    /// Takes the pending draft replay of every request `plan` computes (H5): the tokens to charge to its
    /// work this step, counted in its metrics. A replay whose replay page is still to come waits for it.
    fn take_draft_replays(&mut self, plan: &Plan) -> Result<foldhash::HashMap<RequestId, u32>> {
        let mut replays = foldhash::HashMap::default();
        for &(id, work) in &plan.entries {
            if matches!(work, Work::LogitsOnly) {
                continue;
            }
            let req = self.table.get_mut(id)?;
            if req.draft_replay_tokens > 0 && !req.replay_page {
                let tokens = std::mem::take(&mut req.draft_replay_tokens);
                req.metrics.draft_replay_tokens += tokens;
                replays.insert(id, tokens);
            }
        }
        Ok(replays)
    }
}
