//! Admission of waiting requests through the admission crate: `admission::schedule_step` walks the waiting
//! queue and the ready-import list in FCFS (or priority) order, stops at a blocked head and lets only ready
//! imports pass it (Q1, Q8). This module is its host: it says what each request needs (its first chunk under
//! the token budget; a new store lookup when the local prefix found at its lookup was evicted since; under
//! `ordinary`, its restore at once, G1) and carries out each admission as the walk takes it: cold requests,
//! ready imports (with the logits-only entry of a fully restored prompt with saved logits, Q4) and restores at
//! once.

use admission::{AdmissionHost, Admit, Candidate, Decision, FallbackCause, HostState, StepContext};
use kv_pool::PageId;
use kv_pool::RequestId;

use super::groups::RestoreBoundary;
use super::report::RequestPhase;
use super::req::{Loading, Phase, Published, Restore};
use super::step::{Plan, Work};
use super::{Engine, StepReport};
use crate::error::{Error, Result};
use crate::executor::Executor;
use crate::metrics::{FallbackReason, RejectReason};

impl<E: Executor> Engine<E> {
    /// Admits waiting requests for this step.
    pub(crate) fn admit(&mut self, plan: &mut Plan, report: &mut StepReport) -> Result<()> {
        // Work planned this step counts as other work too.
        let preflight = self.admission_preflight();
        let ctx = StepContext {
            running_requests: preflight.running_requests,
            max_running_slots: self.params.max_running,
            unticketed_prefill_pages: preflight.unticketed_prefill_pages,
            watermark_pages: preflight.watermark_pages,
            other_work_scheduled: preflight.other_work_scheduled || !plan.entries.is_empty(),
            max_admissions: u32::MAX,
        };
        let mut host = StepHost {
            engine: self,
            plan,
            report,
        };
        let step = admission::schedule_step(&ctx, &mut host)?;
        report.examined += step.examined;
        for decision in step.decisions {
            if let Decision::Rejected {
                request: req,
                need_pages,
                usable_pages,
            } = decision
            {
                // `submit` refuses requests larger than the pool, so this is a first chunk that can never fit
                // (a watermark or a geometry the submit check does not see): reject it alone (K1).
                tracing::warn!(request = %req, need_pages, usable_pages, "request rejected: it can never fit the pool");
                *self
                    .tally
                    .rejected
                    .entry(RejectReason::LargerThanPool)
                    .or_default() += 1;
                if let Some(live) = self.table.find_mut(req) {
                    live.metrics.rejected = Some(RejectReason::LargerThanPool);
                }
                self.cancel(req)?;
            }
        }
        Ok(())
    }
}

/// The engine as the admission step's host, with the step being planned.
struct StepHost<'a, E: Executor> {
    engine: &'a mut Engine<E>,
    plan: &'a mut Plan,
    report: &'a mut StepReport,
}

impl<E: Executor> AdmissionHost for StepHost<'_, E> {
    type Error = Error;

    fn state(&mut self) -> HostState<'_> {
        let engine = &mut *self.engine;
        HostState {
            waiting: &mut engine.table.waiting,
            ready: &mut engine.table.ready,
            ledger: engine.policy.ledger(),
            pool: &mut engine.pool,
        }
    }

    fn examine(&mut self, request: RequestId, free_slots: u32) -> Result<Candidate> {
        if self.report.preempted.contains(&request) {
            // Preempted by this step's running pass (Q6): it waits for the next step, as the head of the
            // queue, like vLLM's scheduler, which admits nothing after a preemption in the same step.
            return Ok(Candidate::WaitsBehind);
        }
        self.engine
            .examine(request, free_slots, self.plan, self.report)
    }

    fn admit(&mut self, admit: Admit) -> Result<bool> {
        match admit {
            Admit::Cold {
                request: req,
                need_pages,
            } => {
                self.engine
                    .admit_cold(req, need_pages, self.plan, self.report)?;
                Ok(true)
            }
            Admit::Ready { request } => self.engine.admit_ready(request, self.plan, self.report),
            Admit::RestoreAtOnce { request, .. } => {
                self.engine.restore_at_once(request, self.report)
            }
        }
    }

    fn fall_back(&mut self, request: RequestId, cause: &FallbackCause) -> Result<u32> {
        // The engine asks for no ticket here (the coordinator reserves), so only a restore at once falls back.
        debug_assert!(
            matches!(cause, FallbackCause::NotAtOnce { .. }),
            "{request}: {cause:?}"
        );
        self.engine.give_up_restore_at_admission(
            request,
            FallbackReason::NoPagesAtOnce,
            self.report,
        )?;
        Ok(self
            .engine
            .cold_start(request, self.plan.budget)?
            .need_pages)
    }
}

/// Where a cold request starts: its local prefix hits, its first chunk, and the pages it needs now.
struct ColdStart {
    hits: Vec<PageId>,
    /// Whether `hits` are a hybrid snapshot's (H9), not a published import's.
    snapshot: bool,
    /// First token to compute.
    start: u32,
    /// Tokens of the first chunk.
    chunk: u32,
    /// Pages to allocate.
    new_pages: u32,
    /// `new_pages` plus the hits that are free now (cached): touching them takes them out of the free count.
    need_pages: u32,
}

impl<E: Executor> Engine<E> {
    /// What waiting `request` needs now. With a free slot, a request whose local prefix (found at its lookup) was
    /// evicted since asks the store again, as an engine re-queries its connector whenever it considers a
    /// request; under `ordinary` an answered restore is tried at once (G1).
    fn examine(
        &mut self,
        request: RequestId,
        free_slots: u32,
        plan: &Plan,
        report: &mut StepReport,
    ) -> Result<Candidate> {
        if self.table.get(request)?.phase() == RequestPhase::Ready {
            return Ok(Candidate::RestoreReady);
        }
        if plan.budget == 0 {
            return Ok(Candidate::OutOfBudget);
        }
        let order = self.table.get(request)?.order;
        if self
            .restores
            .earliest_lookup
            .is_some_and(|earliest| earliest < order)
        {
            // FCFS (Q1): an earlier request still waits for its store lookup; it is considered first once
            // answered (a lookup latency later), and only ready imports pass it.
            return Ok(Candidate::WaitsBehind);
        }
        let cold = self.cold_start(request, plan.budget)?;
        let req = &self.table.get(request)?;
        if free_slots > 0
            && !self.policy.restores_at_admission()
            && matches!(req.restore, Restore::Idle)
            && req.metrics.fallback.is_none()
            && req.lookups < checkpoint_transfer::RESTORE_LOOKUPS_MAX
            && req.published().is_none()
            && cold.start < req.expected_local_tokens
        {
            self.table.get_mut(request)?.expected_local_tokens = 0;
            self.on_arrival(request)?;
            if self.table.get(request)?.phase() != RequestPhase::Waiting {
                return Ok(Candidate::Withdrawn);
            }
            // Back at its place as a complete local hit: it is considered as it is now.
            return Ok(Candidate::Cold {
                need_pages: cold.need_pages,
            });
        }
        if let Some(candidate) = self.wait_for_read_ahead(request, &cold, report)? {
            return Ok(candidate);
        }
        let req = &self.table.get(request)?;
        if self.policy.restores_at_admission()
            && let Restore::Answered {
                ref checkpoint,
                tokens,
                ..
            } = req.restore
        {
            if tokens > cold.start {
                let checkpoint_pages = checkpoint.pages.len() as u32;
                return Ok(Candidate::RestoreAtOnce {
                    need_pages: self.restore_at_once_need(
                        request,
                        &cold,
                        checkpoint_pages,
                        tokens,
                    )?,
                });
            }
            self.table.get_mut(request)?.restore = Restore::Idle;
        }
        Ok(Candidate::Cold {
            need_pages: cold.need_pages,
        })
    }

    /// Pages a restore at once of `tokens` tokens from a checkpoint of `checkpoint_pages` pages takes for
    /// waiting `request`, which starts cold at `cold`: the checkpoint's pages past the local hit (on a hybrid
    /// model the whole checkpoint, a snapshot hit left alone: `restore_at_once`), the first chunk's pages
    /// after it, and the hits it touches that are free now.
    fn restore_at_once_need(
        &self,
        request: RequestId,
        cold: &ColdStart,
        checkpoint_pages: u32,
        tokens: u32,
    ) -> Result<u32> {
        let block_tokens = self.params.geometry.block_tokens();
        let exact = self.groups.restores_at_exact_boundaries();
        let n_hits = if exact { 0 } else { cold.hits.len() as u32 };
        let start = tokens;
        let chunk =
            (self.table.get(request)?.tokens.len() as u32 - start).min(self.params.chunk_tokens);
        let held = start.div_ceil(block_tokens);
        let chunk_pages = (start + chunk).div_ceil(block_tokens) - held;
        let import_pages =
            self.groups
                .restore_at_once_pages(checkpoint_pages, start, n_hits, block_tokens);
        let hits_free = if exact {
            0
        } else {
            self.cached_free(&cold.hits)
        };
        Ok(import_pages + chunk_pages * self.groups.n_tables() + hits_free)
    }

    /// A restore tried at admission (G1) whose pages a store on its own thread is still reading ahead, off
    /// the step: it waits for them at its place (Q1), up to the lookup timeout, then recomputes (G2). `None`
    /// when that is not the case (inline stores read at once).
    fn wait_for_read_ahead(
        &mut self,
        request: RequestId,
        cold: &ColdStart,
        report: &mut StepReport,
    ) -> Result<Option<Candidate>> {
        let Restore::Answered {
            ref checkpoint,
            tokens,
            answered,
            ..
        } = self.table.get(request)?.restore
        else {
            return Ok(None);
        };
        if !self.policy.restores_at_admission()
            || tokens <= cold.start
            || self.restores.store.ready(request, &checkpoint.id)
        {
            return Ok(None);
        }
        if !self.store_answer_expired(answered) {
            return Ok(Some(Candidate::WaitsBehind));
        }
        self.give_up_restore_at_admission(request, FallbackReason::LookupTimeout, report)?;
        Ok(Some(Candidate::Cold {
            need_pages: cold.need_pages,
        }))
    }

    /// A waiting request's restore at admission (G1) is given up for `reason`: it recomputes.
    fn give_up_restore_at_admission(
        &mut self,
        request: RequestId,
        reason: FallbackReason,
        report: &mut StepReport,
    ) -> Result<()> {
        let req = self.table.get_mut(request)?;
        req.fall_back(reason);
        req.restore = Restore::Idle;
        report.fallbacks.push((request, reason));
        Ok(())
    }

    /// Where `request` starts as a cold request with `budget` tokens left in the step.
    fn cold_start(&self, request: RequestId, budget: u32) -> Result<ColdStart> {
        if self.groups.restore_boundary() == RestoreBoundary::Exact {
            return self.hybrid_cold_start(request, budget);
        }
        let block_tokens = self.params.geometry.block_tokens();
        let req = &self.table.get(request)?;
        let max_blocks = ((req.tokens.len() as u32 - 1) / block_tokens) as usize;
        let hits = self.pool.longest_prefix(&req.keys[..max_blocks]);
        let start = hits.len() as u32 * block_tokens;
        let chunk = self.prefill_chunk(request, start, budget)?;
        let new_pages = (start + chunk).div_ceil(block_tokens) - hits.len() as u32;
        let need_pages = new_pages + self.cached_free(&hits);
        Ok(ColdStart {
            hits,
            snapshot: false,
            start,
            chunk,
            new_pages,
            need_pages,
        })
    }

    /// Where hybrid `request` starts: at the exact boundary of the pages-only import published for it when every
    /// one of its pages is still cached, else at the longest snapshot boundary every group still holds (H9),
    /// else at 0 (`hits` then holds its block table, its windows' live pages, then its fixed pages). Its first
    /// allocation takes the first chunk's pages, its fixed pages, and the copies on write of an imported
    /// partial page and state (`grow_need`).
    fn hybrid_cold_start(&self, request: RequestId, budget: u32) -> Result<ColdStart> {
        let req = &self.table.get(request)?;
        let hits = self.published_hits(request)?.unwrap_or_default();
        let (hits, start, snapshot) = match req.published() {
            Some(published) if !hits.is_empty() => (hits, published.tokens, false),
            _ => match self.snapshot_hit(request)? {
                Some((tokens, pages)) => (pages, tokens, true),
                None => (Vec::new(), 0, false),
            },
        };
        let chunk = self.prefill_chunk(request, start, budget)?;
        // What its first allocation takes: the tables the published import gives it (or none), grown to the
        // first chunk, as `grow_pages` will count them.
        let (pages, windows, fixed) = self
            .checkpoint_tables(request, hits.clone(), start)
            .unwrap_or_default();
        let held = super::pages::Held {
            pages: &pages,
            windows: &windows,
            fixed_len: fixed.len(),
            n_computed: start,
            copy_on_write: !hits.is_empty(),
            replay_page: !hits.is_empty()
                && self.draft_replay_after(start).is_some_and(|(_, page)| page),
        };
        let new_pages = self.need_of(&held, start + chunk);
        let need_pages = new_pages + self.cached_free(&hits);
        Ok(ColdStart {
            hits,
            snapshot,
            start,
            chunk,
            new_pages,
            need_pages,
        })
    }

    /// The pages of the pages-only import published for hybrid `request`, found again under their keys, when every
    /// one is still cached; `None` when one was evicted (or nothing was published).
    fn published_hits(&self, request: RequestId) -> Result<Option<Vec<PageId>>> {
        let req = &self.table.get(request)?;
        let Some(published) = req.published() else {
            return Ok(None);
        };
        Ok(self
            .published_slot_keys(request, published.tokens)?
            .iter()
            .map(|key| self.pool.lookup(key))
            .collect())
    }

    /// Pages in `hits` that are free now (cached): touching them takes them out of the free count.
    fn cached_free(&self, hits: &[PageId]) -> u32 {
        hits.iter()
            .filter(|page| self.pool.ref_count(**page).is_ok_and(|refs| refs == 0))
            .count() as u32
    }

    /// Admits waiting `request` as a cold request (its pages fit): takes its prefix hits, allocates its first
    /// chunk's pages and schedules the chunk.
    fn admit_cold(
        &mut self,
        request: RequestId,
        need_pages: u32,
        plan: &mut Plan,
        report: &mut StepReport,
    ) -> Result<()> {
        let block_tokens = self.params.geometry.block_tokens();
        let ColdStart {
            hits,
            snapshot,
            start,
            chunk,
            new_pages,
            need_pages: needed,
        } = self.cold_start(request, plan.budget)?;
        debug_assert_eq!(
            needed, need_pages,
            "{request}'s need changed since it was examined"
        );
        for &page in &hits {
            self.pool.touch(page)?;
        }
        if self.groups.restore_boundary() == RestoreBoundary::Exact {
            return self.admit_hybrid_cold(request, (hits, snapshot), start, chunk, plan, report);
        }
        let pages = self.pool.allocate(new_pages)?;
        let req = self.table.get_mut(request)?;
        // Hits on the pages its pages-only import published (and not evicted since) were restored; sorted,
        // so that a long prompt's count is not its hits times its published pages.
        let published = req.take_published();
        let was_published = published.is_some();
        let restored = if let Some(Published {
            pages: mut published,
            ..
        }) = published
        {
            published.sort_unstable();
            hits.iter()
                .filter(|page| published.binary_search(page).is_ok())
                .count() as u32
        } else {
            0
        };
        req.record_served(
            (hits.len() as u32 - restored) * block_tokens,
            restored * block_tokens,
        );
        if restored == 0 && was_published {
            req.fall_back(FallbackReason::EvictedBeforeAdmission);
            report
                .fallbacks
                .push((request, FallbackReason::EvictedBeforeAdmission));
        }
        req.pages = hits;
        req.pages.extend(pages);
        req.n_computed = start;
        req.n_registered = start / block_tokens;
        if restored > 0 {
            // Its replay page, if any, comes with its next allocation.
            self.begin_draft_replay(request)?;
        }
        self.run_first_chunk(request, start, chunk, plan, report)
    }

    /// Admits `request`, whose pages for its first chunk `[start, start + chunk)` are allocated, into the running
    /// set and schedules the chunk; its blocks are visible to requests considered later in the step.
    fn run_first_chunk(
        &mut self,
        request: RequestId,
        start: u32,
        chunk: u32,
        plan: &mut Plan,
        report: &mut StepReport,
    ) -> Result<()> {
        self.table.move_to(request, RequestPhase::Running)?;
        report.admitted.push(request);
        plan.entries.push((
            request,
            Work::Prefill {
                first_pos: start,
                n: chunk,
            },
        ));
        plan.budget -= chunk;
        self.register_blocks_upto(request, start + chunk)
    }

    /// The rest of `admit_cold` for a hybrid request whose `hits` (a published import found again, a
    /// snapshot's pages when `snapshot`, or none) are touched: a snapshot hit verified (E3, as a restore is),
    /// its tables, then its first allocation (`grow_pages`: the chunk, the fixed pages and the copies on write
    /// that `hybrid_cold_start` counted).
    fn admit_hybrid_cold(
        &mut self,
        request: RequestId,
        (hits, snapshot): (Vec<PageId>, bool),
        start: u32,
        chunk: u32,
        plan: &mut Plan,
        report: &mut StepReport,
    ) -> Result<()> {
        let block_tokens = self.params.geometry.block_tokens();
        if snapshot {
            self.verify_local_hit(request, &hits, start)?;
        }
        let req = self.table.get_mut(request)?;
        let was_published = req.take_published().is_some();
        if (hits.is_empty() || snapshot) && was_published {
            req.fall_back(FallbackReason::EvictedBeforeAdmission);
            report
                .fallbacks
                .push((request, FallbackReason::EvictedBeforeAdmission));
        }
        if snapshot {
            req.record_served(start, 0);
        } else {
            req.record_served(0, start);
        }
        let restored = !hits.is_empty();
        self.assign_checkpoint_pages(request, hits, start)?;
        let req = self.table.get_mut(request)?;
        req.copy_on_write = restored;
        req.n_computed = start;
        req.n_registered = start / block_tokens;
        if restored {
            self.begin_draft_replay(request)?;
        }
        if !self.grow_pages(request, start + chunk, super::pages::AllocKind::Prefill)? {
            return Err(Error::internal(format!(
                "{request}: admitted, but its first chunk's pages were not there"
            )));
        }
        self.run_first_chunk(request, start, chunk, plan, report)
    }

    /// `ordinary`: restores the checkpoint's missing blocks with the first chunk's pages (they fit); the
    /// request is admitted with its slot and computes once the copy lands. `false` (nothing changed) when no
    /// copy slot is free or the checkpoint is gone from the store.
    fn restore_at_once(&mut self, request: RequestId, report: &mut StepReport) -> Result<bool> {
        let block_tokens = self.params.geometry.block_tokens();
        let Restore::Answered {
            checkpoint, tokens, ..
        } = self.table.get(request)?.restore.clone()
        else {
            return Err(Error::internal(format!(
                "{request}: a restore at once without an answered lookup"
            )));
        };
        if self.restores.index.n_staged() >= self.params.copy_task_limit as usize {
            return Ok(false);
        }
        let Ok(stored) = self.restores.store.take(request, &checkpoint.id) else {
            return Ok(false);
        };
        let req = &self.table.get(request)?;
        let max_blocks = ((req.tokens.len() as u32 - 1) / block_tokens) as usize;
        // The groups' combined hit: none on a hybrid model (H2), whose restore brings the whole checkpoint.
        let hits = self.groups.local_hit(&self.pool, &req.keys[..max_blocks]);
        debug_assert!(tokens > hits.len() as u32 * block_tokens);
        for &page in &hits {
            self.pool.touch(page)?;
        }
        // The index allocates the destination pages and holds them until publication; the request takes its
        // own reference on them.
        let first_block = hits.len() as u32;
        let part = self.checkpoint_part(&stored, first_block, tokens)?;
        let import = self.restores.index.stage(
            &mut self.pool,
            &mut *self.restores.copies,
            self.time.now,
            checkpoint_transfer::StageRequest {
                request,
                request_tokens: req.tokens.len(),
                checkpoint: &part,
                dependency_pages: &hits,
            },
        )?;
        let dest_pages = self
            .restores
            .index
            .pages(request)
            .ok_or_else(|| {
                Error::internal(format!("{request}: no pages for the import just staged"))
            })?
            .to_vec();
        for &page in &dest_pages {
            self.pool.touch(page)?;
        }
        let local_tokens = first_block * block_tokens;
        let req = self.table.get_mut(request)?;
        req.record_served(local_tokens, tokens - local_tokens);
        let mut pages = hits;
        pages.extend(dest_pages);
        // A hybrid import's window and fixed pages come after its block table; its partial pages and state
        // are copied on write by the first allocation.
        self.assign_checkpoint_pages(request, pages, tokens)?;
        let req = self.table.get_mut(request)?;
        req.copy_on_write = self.groups.restores_copy_on_write();
        req.n_computed = tokens;
        req.n_registered = first_block;
        req.restore = Restore::Idle;
        self.begin_draft_replay(request)?;
        let loading = Some(Loading {
            import,
            first_block,
            tokens,
        });
        self.table
            .move_to_phase(request, Phase::Running { loading })?;
        report.admitted.push(request);
        Ok(true)
    }

    /// Admits a ready import (it owns its slot, pages and credits): acquires its pages through the prefix-hit
    /// path (O4), then schedules its first chunk from its credits, or its logits-only entry (Q4). `false` when
    /// its pages were lost despite ownership: it is back in the waiting queue for an ordinary lookup.
    pub(crate) fn admit_ready(
        &mut self,
        request: RequestId,
        plan: &mut Plan,
        report: &mut StepReport,
    ) -> Result<bool> {
        let block_tokens = self.params.geometry.block_tokens();
        let Restore::Importing { tokens, .. } = self.table.get(request)?.restore.clone() else {
            return Err(Error::internal(format!(
                "{request} is ready without a published import"
            )));
        };
        let dest = self
            .restores
            .index
            .pages(request)
            .ok_or_else(|| {
                Error::internal(format!("{request} is ready but the index has no import"))
            })?
            .to_vec();
        // Through the prefix-hit path (O4): the request takes its references, the index drops its own.
        let acquired = self.restores.index.acquire(&mut self.pool, request);
        self.absorb_prefix_changes(&mut [(request, 0)]);
        let hits = match acquired {
            Ok(acquired) => acquired.pages,
            Err(checkpoint_transfer::Error::Invalidated { .. }) => {
                // Lost despite ownership (a reset dropped the keys); the index released it: look up again as an
                // ordinary request.
                self.drop_restore(request)?;
                self.enqueue_waiting(request, Some(FallbackReason::Invalid))?;
                report.fallbacks.push((request, FallbackReason::Invalid));
                return Ok(false);
            }
            Err(error) => return Err(error.into()),
        };
        debug_assert_eq!(hits.len(), self.groups.import_len(tokens, block_tokens));
        if let Some(ticket) = &self.table.get(request)?.ticket {
            self.policy.admit(ticket, &mut self.pool)?;
        }
        // `hits` is the import's page table with each block's page, position by position.
        let restored_tokens = self
            .groups
            .restored_tokens(&hits, &dest, tokens, block_tokens);
        let req = self.table.get_mut(request)?;
        req.restore = Restore::Idle;
        req.record_served(tokens - restored_tokens, restored_tokens);
        self.assign_checkpoint_pages(request, hits, tokens)?;
        let req = self.table.get_mut(request)?;
        req.copy_on_write = self.groups.restores_copy_on_write();
        req.n_computed = tokens;
        req.n_registered = tokens / block_tokens;
        let full_prompt = req.n_computed == req.tokens.len() as u32;
        if restored_tokens > 0 {
            self.begin_draft_replay(request)?;
        }
        self.table.move_to(request, RequestPhase::Running)?;
        report.admitted.push(request);
        if full_prompt {
            plan.entries.push((request, Work::LogitsOnly));
            return Ok(true);
        }
        self.plan_first_chunk(request, plan)?;
        Ok(true)
    }

    /// Plans the first prefill chunk of admitted request `request` after its imported prefix, within the
    /// step's budget and the pages it can grow.
    fn plan_first_chunk(&mut self, request: RequestId, plan: &mut Plan) -> Result<()> {
        let first_pos = self.table.get(request)?.n_computed;
        let chunk = self.prefill_chunk(request, first_pos, plan.budget)?;
        if chunk > 0
            && self.grow_pages(request, first_pos + chunk, super::pages::AllocKind::Prefill)?
        {
            plan.entries.push((
                request,
                Work::Prefill {
                    first_pos,
                    n: chunk,
                },
            ));
            plan.budget -= chunk;
            self.register_blocks_upto(request, first_pos + chunk)?;
        }
        Ok(())
    }
}
