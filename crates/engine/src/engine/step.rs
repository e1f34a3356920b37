//! One scheduler step: arrivals, import completions, the restore coordinator, then the running pass first
//! (decode and chunked prefill under the token budget; preemption by recompute only from this path and only
//! while nothing is scheduled yet, Q5, Q6), streaming resumes (Q7), admissions, and finally the executor's
//! work, its page bytes, sampling, captures (E2) and completions.

use std::time::{Duration, Instant};

use checkpoint_transfer::{CheckpointKind, CopyEngine};
use reservation::{RequestId, TicketState, Timestamp};

use super::pages::AllocKind;
use super::req::{Phase, Restore};
use super::{Engine, StepReport};
use crate::error::Result;
use crate::executor::{DecodeWork, Executor, PrefillWork, StepBatch};
use crate::request::{STOP_TOKEN, output_token};

/// Work planned for one request this step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Work {
    /// Compute `n` tokens from position `first_pos`.
    Prefill { first_pos: u32, n: u32 },
    /// Compute the pending token (plus draft lookahead slots) and sample the next.
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
    fn batch(&self, draft_tokens: u32) -> StepBatch {
        let mut batch = StepBatch::default();
        for &(request, work) in &self.entries {
            match work {
                Work::Prefill { first_pos, n } => batch.prefills.push(PrefillWork {
                    request,
                    first_pos,
                    n_tokens: n,
                }),
                Work::Decode { context } => {
                    batch.decodes.push(DecodeWork {
                        request,
                        context_tokens: context,
                        n_tokens: 1 + draft_tokens,
                    });
                }
                Work::LogitsOnly => batch.logits_only.push(request),
            }
        }
        batch
    }
}

impl<E: Executor> Engine<E> {
    /// Runs one scheduler step and advances the clock by its modeled duration (or, when nothing can run, to
    /// the next event: an arrival, a copy completion, a lookup answer or timeout, a wait expiry).
    pub fn step(&mut self) -> StepReport {
        let wall_start = Instant::now();
        let mut report = StepReport::default();
        self.step_inner(&mut report)
            .unwrap_or_else(|error| panic!("engine step failed (a bug): {error}"));
        report.now = self.now;
        report.free_pages = self.pool.n_free();
        report.credit_pages = self
            .ledger
            .as_ref()
            .map_or(0, |ledger| ledger.credit_pages());
        report.waiting = self.waiting.len() as u32;
        report.running = self.running.len() as u32;
        self.steps += 1;
        self.wall += wall_start.elapsed();
        report
    }

    /// Steps until idle or `max_steps`; returns the steps taken.
    pub fn run_until_idle(&mut self, max_steps: u64) -> u64 {
        let mut steps = 0;
        while !self.is_idle() && steps < max_steps {
            let report = self.step();
            steps += 1;
            if report.idle {
                break;
            }
        }
        steps
    }

    fn step_inner(&mut self, report: &mut StepReport) -> Result<()> {
        self.process_arrivals();
        self.poll_imports(report)?;
        self.poll_restores(report)?;
        // The notices are not the index's business: its pages hold references and are never evicted, and a
        // notice names a page's old key, so one about a page reused since as an import's destination would
        // wrongly invalidate that import.
        let _evictions = self.pool.take_evictions();
        let mut plan = Plan {
            entries: Vec::new(),
            budget: self.params.max_batched_tokens,
        };
        self.schedule_resumes();
        self.schedule_running(&mut plan, report)?;
        self.admit(&mut plan, report)?;
        let _evictions = self.pool.take_evictions();
        if plan.entries.is_empty() {
            match self.next_event_at() {
                Some(at) if at > self.now => self.now = at,
                Some(_) => {}
                None => report.idle = true,
            }
            return Ok(());
        }
        let batch = plan.batch(self.params.draft_tokens);
        let duration = self.executor.execute(&batch);
        report.duration = duration;
        self.now = self.now.after(duration.max(Duration::from_nanos(1)));
        self.apply(&plan, report)
    }

    fn process_arrivals(&mut self) {
        while let Some((&(at, seq), &id)) = self.arriving.first_key_value() {
            if at > self.now {
                break;
            }
            self.arriving.remove(&(at, seq));
            self.on_arrival(id);
        }
    }

    /// Paused streams that received input run again at once when a slot is free: they bypass the admission
    /// gate, the blocked head and capacity waiters (Q7).
    fn schedule_resumes(&mut self) {
        while let Some(&id) = self.resuming.front() {
            if self.free_slots() == 0 {
                break;
            }
            self.resuming.pop_front();
            self.reqs.get_mut(&id).expect("live").phase = Phase::Running;
            self.running.push(id);
        }
    }

    /// Running slots free for admissions: the limit minus running requests and ticket-held slots.
    pub(crate) fn free_slots(&self) -> u32 {
        let held = self
            .ledger
            .as_ref()
            .map_or(0, reservation::Ledger::slots_held);
        self.params
            .max_running
            .saturating_sub(self.running.len() as u32)
            .saturating_sub(held)
    }

    /// The running pass: every running request gets its decode or next prefill chunk if the budget and its
    /// pages allow. A request that cannot get pages preempts from the tail only while nothing is scheduled yet
    /// in this step (Q5); otherwise it waits for the next step.
    fn schedule_running(&mut self, plan: &mut Plan, report: &mut StepReport) -> Result<()> {
        let draft = self.params.draft_tokens;
        let mut idx = 0;
        while idx < self.running.len() {
            let id = self.running[idx];
            let req = &self.reqs[&id];
            if req.loading.is_some() {
                idx += 1;
                continue;
            }
            let (work, tokens, upto, kind) = if req.in_prefill() || req.n_to_compute() > 1 {
                let n = req
                    .n_to_compute()
                    .min(self.params.chunk_tokens)
                    .min(plan.budget);
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
            };
            if tokens == 0 || tokens > plan.budget {
                idx += 1;
                continue;
            }
            if self.grow_pages(id, upto, kind)? {
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
            let victim = self.running[idx + 1..]
                .iter()
                .rev()
                .copied()
                .find(|victim| self.reqs[victim].loading.is_none())
                .unwrap_or(id);
            self.preempt(victim, Some(report), true)?;
            // Retry the same index: either `id` again with more free pages, or the next request.
        }
        Ok(())
    }

    /// Applies the executed plan: page bytes, block registration, sampling, captures and completions.
    fn apply(&mut self, plan: &Plan, report: &mut StepReport) -> Result<()> {
        for &(id, work) in &plan.entries {
            if !self.reqs.contains_key(&id) {
                continue;
            }
            match work {
                Work::Prefill { first_pos, n } => {
                    report.prefills.push((id, n));
                    let req = self.reqs.get_mut(&id).expect("live");
                    req.n_computed = first_pos + n;
                    req.metrics.prompt_tokens_recomputed += n;
                    self.write_computed(id, first_pos, first_pos + n)?;
                    self.after_compute(id)?;
                    if self
                        .reqs
                        .get(&id)
                        .is_some_and(|req| req.n_to_compute() == 0)
                    {
                        self.sample(id, report)?;
                    }
                }
                Work::Decode { context } => {
                    report.decodes.push(id);
                    self.reqs.get_mut(&id).expect("live").n_computed = context + 1;
                    self.write_computed(id, context, context + 1)?;
                    self.sample(id, report)?;
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

    /// After compute: when every token the ticket budgeted is computed the ticket ends (C6); when the prompt
    /// is complete its checkpoint is captured (E2).
    fn after_compute(&mut self, id: RequestId) -> Result<()> {
        let req = &self.reqs[&id];
        if req.n_to_compute() == 0
            && let Some(ledger) = self.ledger.as_mut()
            && ledger.ticket_state(id) == Some(TicketState::Admitted)
        {
            ledger.finish_prompt(id).expect("admitted ticket");
        }
        let req = &self.reqs[&id];
        if req.n_computed < req.prompt_end || req.prompt_captured {
            return Ok(());
        }
        self.reqs.get_mut(&id).expect("live").prompt_captured = true;
        self.capture(id, CheckpointKind::Prompt)
    }

    /// Samples `id`'s next output token; finishes or pauses the answer at its cap or stop token.
    fn sample(&mut self, id: RequestId, report: &mut StepReport) -> Result<()> {
        let tpp = self.params.geometry.tokens_per_page();
        let now = self.now;
        let req = self.reqs.get_mut(&id).expect("live");
        let index = req.output.len() as u32;
        let stop = req
            .spec
            .stop_after
            .is_some_and(|stop_after| req.answer_tokens + 1 >= stop_after);
        let token = if stop {
            STOP_TOKEN
        } else {
            output_token(&req.spec.salt, &req.spec.prompt, index)
        };
        req.output.push(token);
        req.push_tokens(&[token], tpp);
        req.answer_tokens += 1;
        req.stopped = stop;
        req.metrics.decode_tokens += 1;
        req.metrics.first_token.get_or_insert(now);
        if req.answer_tokens < req.answer_cap && !stop {
            return Ok(());
        }
        self.capture(id, CheckpointKind::Response)?;
        report.finished.push(id);
        self.running.retain(|running| *running != id);
        let req = self.reqs.get_mut(&id).expect("live");
        if req.spec.streaming {
            req.phase = Phase::Paused;
            self.register_blocks(id)?;
            return Ok(());
        }
        self.free_request_pages(id)?;
        self.retire(id, false);
        Ok(())
    }

    /// When something happens by itself next: an arrival, a copy completion, a lookup answer or timeout, or a
    /// capacity wait's expiry.
    fn next_event_at(&self) -> Option<Timestamp> {
        let mut next: Option<Timestamp> = self.arriving.keys().next().map(|(at, _)| *at);
        let mut consider = |at: Timestamp| next = Some(next.map_or(at, |current| current.min(at)));
        if let Some(at) = self.copies.next_completion_at() {
            consider(at);
        }
        for id in self.restoring.values() {
            let req = &self.reqs[id];
            match req.restore {
                Restore::Lookup {
                    sent, answer_at, ..
                } => {
                    consider(answer_at.min(sent.after(self.params.lookup_timeout)));
                }
                Restore::Answered { answered, .. } => {
                    consider(answered.after(self.params.lookup_timeout / 2));
                    if let Some(started) = req.wait_started {
                        consider(started.after(self.params.restore_max_wait));
                    }
                }
                _ => {}
            }
        }
        next
    }
}
