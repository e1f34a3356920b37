//! Admission of waiting requests: the ordinary queue walked in FCFS (or priority) order until its head cannot
//! be allocated (Q1: nothing passes a blocked head), then the ready imports, which already own their capacity
//! and pass it (Q1), with the logits-only entry for a fully restored prompt with saved logits (Q4). Under
//! `ordinary`, a restore is attempted here, at once or not at all (G1).

use checkpoint_transfer::{CheckpointId, StageRequest};
use kv_pool::PageId;
use reservation::RequestId;

use super::req::{Loading, Phase, Restore};
use super::step::{Plan, Work};
use super::{Engine, StepReport};
use crate::error::Result;
use crate::executor::Executor;
use crate::metrics::FallbackReason;
use crate::policy::Policy;

impl<E: Executor> Engine<E> {
    /// Admits waiting requests for this step.
    pub(crate) fn admit(&mut self, plan: &mut Plan, report: &mut StepReport) -> Result<()> {
        while let Some((&order, &id)) = self.waiting.first_key_value() {
            report.examined += 1;
            if self.free_slots() == 0
                || plan.budget == 0
                || !self.try_admit_waiting(id, plan, report)?
            {
                break; // the blocked head: FCFS stops here (Q1)
            }
            debug_assert!(
                !self.waiting.contains_key(&order),
                "admitted request left in the queue"
            );
        }
        let ready: Vec<RequestId> = self.ready.values().copied().collect();
        for id in ready {
            report.examined += 1;
            self.admit_ready(id, plan, report)?;
        }
        Ok(())
    }

    /// Pages in `hits` that are free now (cached): touching them takes them out of the free count.
    fn cached_free(&self, hits: &[PageId]) -> u32 {
        hits.iter()
            .filter(|page| self.pool.ref_count(**page).is_ok_and(|refs| refs == 0))
            .count() as u32
    }

    /// Pages a new admission may take: unprotected free pages minus the watermark while other work is
    /// scheduled (R2).
    fn admission_available(&self, plan: &Plan) -> u32 {
        let busy = !plan.entries.is_empty() || !self.running.is_empty();
        let watermark = if busy { self.params.watermark_pages } else { 0 };
        self.unprotected_free().saturating_sub(watermark)
    }

    /// Tries to admit the queue head `id`; `false` when it cannot be allocated (it stays at the head).
    fn try_admit_waiting(
        &mut self,
        id: RequestId,
        plan: &mut Plan,
        report: &mut StepReport,
    ) -> Result<bool> {
        let tpp = self.params.geometry.tokens_per_page();
        let req = &self.reqs[&id];
        let max_blocks = ((req.tokens.len() as u32 - 1) / tpp) as usize;
        let hits = self.pool.longest_prefix(&req.keys[..max_blocks]);
        if self.params.policy != Policy::Ordinary
            && matches!(req.restore, Restore::Idle)
            && req.metrics.fallback.is_none()
            && req.lookups < checkpoint_transfer::RESTORE_LOOKUPS_MAX
            && req.published_unowned.is_empty()
            && (hits.len() as u32) < req.expected_local_blocks
        {
            // The prefix found resident at the lookup was evicted since: ask the store again, as an engine
            // re-queries its connector whenever it considers a request.
            self.reqs.get_mut(&id).expect("live").expected_local_blocks = 0;
            self.on_arrival(id);
            return Ok(true);
        }
        if self.params.policy == Policy::Ordinary
            && let Restore::Answered {
                checkpoint, blocks, ..
            } = &req.restore
        {
            let (checkpoint_id, blocks) = (checkpoint.id.clone(), *blocks);
            if blocks as usize > hits.len() {
                if self.try_restore_at_once(id, &checkpoint_id, blocks, &hits, plan)? {
                    self.waiting.remove(&self.reqs[&id].order);
                    report.admitted.push(id);
                    return Ok(true);
                }
                let req = self.reqs.get_mut(&id).expect("live");
                req.fall_back(FallbackReason::NoPagesAtOnce);
                report.fallbacks.push((id, FallbackReason::NoPagesAtOnce));
            }
            self.reqs.get_mut(&id).expect("live").restore = Restore::Idle;
        }
        let req = &self.reqs[&id];
        let start = hits.len() as u32 * tpp;
        let chunk = (req.tokens.len() as u32 - start)
            .min(self.params.chunk_tokens)
            .min(plan.budget);
        let new_pages = (start + chunk).div_ceil(tpp) - hits.len() as u32;
        if new_pages + self.cached_free(&hits) > self.admission_available(plan) {
            return Ok(false);
        }
        for &page in &hits {
            self.pool.touch(page)?;
        }
        let pages = self.pool.allocate(new_pages)?;
        let req = self.reqs.get_mut(&id).expect("live");
        if !req.admitted_once {
            req.admitted_once = true;
            let restored = hits
                .iter()
                .filter(|page| req.published_unowned.contains(page))
                .count() as u32;
            req.metrics.prompt_tokens_restored = restored * tpp;
            req.metrics.prompt_tokens_local_hit = (hits.len() as u32 - restored) * tpp;
            if restored > 0 {
                req.metrics.restored = true;
            } else if !req.published_unowned.is_empty() {
                req.fall_back(FallbackReason::EvictedBeforeAdmission);
                report
                    .fallbacks
                    .push((id, FallbackReason::EvictedBeforeAdmission));
            }
        }
        req.published_unowned.clear();
        req.pages = hits;
        req.pages.extend(pages);
        req.n_computed = start;
        req.n_registered = start / tpp;
        req.phase = Phase::Running;
        let order = req.order;
        self.waiting.remove(&order);
        self.running.push(id);
        report.admitted.push(id);
        plan.entries.push((
            id,
            Work::Prefill {
                first_pos: start,
                n: chunk,
            },
        ));
        plan.budget -= chunk;
        Ok(true)
    }

    /// `ordinary`: restores the checkpoint's missing blocks only if their pages and the first chunk's fit
    /// now; the request is admitted with its slot and computes once the copy lands.
    fn try_restore_at_once(
        &mut self,
        id: RequestId,
        checkpoint_id: &CheckpointId,
        blocks: u32,
        hits: &[PageId],
        plan: &Plan,
    ) -> Result<bool> {
        let tpp = self.params.geometry.tokens_per_page();
        let req = &self.reqs[&id];
        let start = blocks * tpp;
        let chunk = (req.tokens.len() as u32 - start).min(self.params.chunk_tokens);
        let import_pages = blocks - hits.len() as u32;
        let need = import_pages + (start + chunk).div_ceil(tpp) - blocks + self.cached_free(hits);
        if need > self.admission_available(plan)
            || self.index.n_staged() >= self.params.copy_task_limit as usize
        {
            return Ok(false);
        }
        let Ok(stored) = self.store.get(checkpoint_id) else {
            return Ok(false);
        };
        for &page in hits {
            self.pool.touch(page)?;
        }
        // The index allocates the destination pages and holds them until publication; the request takes its
        // own reference on them.
        let first_block = hits.len() as u32;
        let part = self.checkpoint_part(&stored, first_block, blocks);
        let import = self.index.stage(
            &mut self.pool,
            &mut self.copies,
            self.now,
            StageRequest {
                request: id,
                request_tokens: req.tokens.len(),
                checkpoint: &part,
                dependency_pages: hits,
            },
        )?;
        let dest_pages = self.index.pages(id).expect("just staged").to_vec();
        for &page in &dest_pages {
            self.pool.touch(page)?;
        }
        let req = self.reqs.get_mut(&id).expect("live");
        req.admitted_once = true;
        req.metrics.prompt_tokens_local_hit = hits.len() as u32 * tpp;
        req.metrics.prompt_tokens_restored = import_pages * tpp;
        req.metrics.restored = true;
        req.pages = hits.to_vec();
        req.pages.extend(dest_pages);
        req.n_computed = start;
        req.n_registered = hits.len() as u32;
        req.loading = Some(Loading {
            import,
            first_block,
        });
        req.phase = Phase::Running;
        req.restore = Restore::Idle;
        self.running.push(id);
        Ok(true)
    }

    /// Admits a ready import (it owns its slot, pages and credits): acquires its pages through the prefix-hit
    /// path (O4), then schedules its first chunk from its credits, or its logits-only entry (Q4).
    fn admit_ready(
        &mut self,
        id: RequestId,
        plan: &mut Plan,
        report: &mut StepReport,
    ) -> Result<()> {
        let tpp = self.params.geometry.tokens_per_page();
        let Restore::Importing { blocks, .. } = self.reqs[&id].restore.clone() else {
            unreachable!("a ready request has a published import")
        };
        let dest = self.index.pages(id).expect("a ready import").to_vec();
        // Through the prefix-hit path (O4): the request takes its references, the index drops its own.
        let hits = match self.index.acquire(&mut self.pool, id) {
            Ok(acquired) => acquired.pages,
            Err(checkpoint_transfer::Error::Invalidated { .. }) => {
                // Lost despite ownership (a reset dropped the keys); the index released it: look up again as an
                // ordinary request.
                self.drop_restore(id)?;
                self.enqueue_waiting(id, Some(FallbackReason::Invalid));
                report.fallbacks.push((id, FallbackReason::Invalid));
                return Ok(());
            }
            Err(error) => return Err(error.into()),
        };
        debug_assert_eq!(hits.len(), blocks as usize);
        if let Some(ledger) = self.ledger.as_mut() {
            ledger
                .admit(id, &mut self.pool)
                .expect("a ready import holds a ready ticket");
        }
        let restored_pages = hits.iter().filter(|page| dest.contains(page)).count() as u32;
        let req = self.reqs.get_mut(&id).expect("live");
        req.restore = Restore::Idle;
        if !req.admitted_once {
            req.admitted_once = true;
            req.metrics.prompt_tokens_restored = restored_pages * tpp;
            req.metrics.prompt_tokens_local_hit = (blocks - restored_pages) * tpp;
            req.metrics.restored = restored_pages > 0;
        }
        req.pages = hits;
        req.n_computed = blocks * tpp;
        req.n_registered = blocks;
        req.phase = Phase::Running;
        let order = req.order;
        let full_prompt = req.n_computed == req.tokens.len() as u32;
        self.ready.remove(&order);
        self.running.push(id);
        report.admitted.push(id);
        if full_prompt {
            plan.entries.push((id, Work::LogitsOnly));
            return Ok(());
        }
        let req = &self.reqs[&id];
        let chunk = req
            .n_to_compute()
            .min(self.params.chunk_tokens)
            .min(plan.budget);
        let first_pos = req.n_computed;
        if chunk > 0 && self.grow_pages(id, first_pos + chunk, super::pages::AllocKind::Prefill)? {
            plan.entries.push((
                id,
                Work::Prefill {
                    first_pos,
                    n: chunk,
                },
            ));
            plan.budget -= chunk;
        }
        Ok(())
    }
}
