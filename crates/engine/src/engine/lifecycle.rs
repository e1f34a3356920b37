//! The lifecycle's edges as the engine takes them: each function here does all of one edge's side effects,
//! once; `RequestTable::move_to` (`table.rs`) moves the phase and its container, and only these edges and
//! the admission and restore paths call it.
//!
//! | Edge | From | To | What it releases |
//! |------|------|----|------------------|
//! | `enqueue_waiting` | any but Paused | Waiting | its capacity wait; a fallback's restore state |
//! | `fall_back` | Restoring | Waiting | its ticket or waiter, its capacity wait |
//! | `retry_lookup` | Restoring | Restoring, or Waiting (`fall_back`) | its ticket |
//! | `drop_restore` | Waiting, Restoring, Ready | (same) | its ticket or waiter, its import (drained first, O5) |
//! | `preempt`, `preempt_for_reset` | Running | Restoring or Waiting | a loading copy, its ticket, its pages |
//! | `cancel` | any | gone | all of the above that it holds, its ticket released once |
//! | `finish` | Running, Paused | gone | its pages (cached), whatever the ledger still holds |

use checkpoint_transfer::CheckpointKind;
use kv_pool::RequestId;

use super::report::RequestPhase;
use super::req::Restore;
use super::{Engine, StepReport};
use crate::error::{Error, Result};
use crate::executor::Executor;
use crate::metrics::FallbackReason;
use crate::params::Preemption;
use crate::request::FinishedRequest;

impl<E: Executor> Engine<E> {
    /// Cancels a live request at any point: waiting, restoring (slot and credits released at once; pages of a
    /// copying import drain first, O5), ready (ownership released, O6), running or paused.
    pub fn cancel(&mut self, request: RequestId) -> Result<()> {
        let Some(req) = self.table.find(request) else {
            return Err(Error::UnknownRequest { request });
        };
        let phase = req.phase();
        self.table.leave_container(request);
        self.release_ticket(request)?;
        match phase {
            RequestPhase::Arriving => {}
            RequestPhase::Waiting | RequestPhase::Restoring | RequestPhase::Ready => {
                self.drop_import(request)?;
            }
            RequestPhase::Running | RequestPhase::Paused | RequestPhase::Resuming => {
                // A loading copy is `ordinary`'s, which holds nothing in a ledger: releasing the ticket first
                // changes nothing for it.
                self.cancel_loading(request)?;
                self.free_request_pages(request)?;
            }
        }
        self.end_wait(request);
        self.take_out(request, true);
        Ok(())
    }

    /// A request's answer is over and it does not stream (or its stream is closed): its pages are freed (its
    /// blocks stay cached; on a hybrid model its boundary stays cached as a snapshot, H9), whatever the ledger still holds for it is released (a ticket whose prompt ended in
    /// the step it finished), and it is reported finished.
    pub(crate) fn finish(&mut self, request: RequestId) -> Result<()> {
        self.snapshot_on_finish(request)?;
        self.free_request_pages(request)?;
        self.table.leave_container(request);
        self.release_ticket(request)?;
        self.take_out(request, false);
        Ok(())
    }

    /// Takes a request out of the engine, recording its metrics; what it held is already released.
    fn take_out(&mut self, request: RequestId, cancelled: bool) {
        self.note_progress();
        let Some(mut req) = self.table.remove(request) else {
            return;
        };
        req.metrics.finished = Some(self.time.now);
        req.metrics.lookups = req.lookups;
        req.metrics.cancelled = cancelled;
        self.tally.done.push(req.metrics.clone());
        self.tally.finished.push(FinishedRequest {
            id: request,
            output: req.output,
            cancelled,
            metrics: req.metrics,
        });
    }

    /// Puts `request` in the ordinary waiting queue, recording a restore fallback if given.
    pub(crate) fn enqueue_waiting(
        &mut self,
        request: RequestId,
        fallback: Option<FallbackReason>,
    ) -> Result<()> {
        self.end_wait(request);
        let req = self.table.get_mut(request)?;
        if let Some(reason) = fallback {
            req.fall_back(reason);
            req.restore = Restore::Idle;
        }
        self.table.move_to(request, RequestPhase::Waiting)
    }

    /// The restore recomputes: release what it holds, record why, and queue it as an ordinary request.
    pub(crate) fn fall_back(
        &mut self,
        request: RequestId,
        reason: FallbackReason,
        report: &mut StepReport,
    ) -> Result<()> {
        self.release_ticket(request)?;
        self.recompute(request, reason, report)
    }

    /// A restore whose ticket (if any) ends looks up again (a shorter checkpoint below `limit_tokens`) within
    /// the lookup budget (O7), or recomputes: its copy failed, or its checkpoint was lost after the
    /// reservation (G3).
    pub(crate) fn retry_lookup(
        &mut self,
        request: RequestId,
        limit_tokens: u32,
        reason: FallbackReason,
        report: &mut StepReport,
    ) -> Result<()> {
        self.release_ticket(request)?;
        if !self.send_lookup(request, limit_tokens)? {
            self.recompute(request, reason, report)?;
        }
        Ok(())
    }

    /// What a fallback does once the ticket is released: record why, and queue it as an ordinary request.
    fn recompute(
        &mut self,
        request: RequestId,
        reason: FallbackReason,
        report: &mut StepReport,
    ) -> Result<()> {
        debug_assert!(
            self.restores.index.state(request).is_none(),
            "fallback of {request} with an import in the index"
        );
        report.fallbacks.push((request, reason));
        self.enqueue_waiting(request, Some(reason))
    }

    /// Drops whatever restore `request` has in progress: its ticket or waiter (slot and credits at once), its
    /// import (drained before its pages are released, O5; released at once when ready, O6).
    pub(crate) fn drop_restore(&mut self, request: RequestId) -> Result<()> {
        self.release_ticket(request)?;
        self.drop_import(request)
    }

    /// Drops `request`'s import, if its restore has one in the index (drained before its pages are released, O5;
    /// released at once when ready, O6); its restore is idle after.
    fn drop_import(&mut self, request: RequestId) -> Result<()> {
        let req = self.table.get_mut(request)?;
        let restore = std::mem::take(&mut req.restore);
        if matches!(restore, Restore::Importing { .. })
            && self.restores.index.state(request).is_some()
        {
            let _outcome =
                self.restores
                    .index
                    .cancel(&mut self.pool, &mut *self.restores.copies, request)?;
        }
        Ok(())
    }

    /// Preempts running `request` by recompute from the running pass (Q6): its pages are freed (their blocks stay
    /// cached), its ticket released, and it asks the store again as a newly arrived request would (its
    /// prompt-end checkpoint may restore it; within its lookup budget, K3), at its place in the order.
    pub(crate) fn preempt(&mut self, request: RequestId, report: &mut StepReport) -> Result<()> {
        let offloaded = self.offload(request)?;
        let req = self.table.get_mut(request)?;
        req.preempted_tokens += req.n_computed;
        req.metrics.preemptions_offloaded += u32::from(offloaded);
        self.give_up_running(request)?;
        report.preempted.push(request);
        self.on_arrival(request)?;
        if offloaded {
            // Its own capture is still on the link: the lookup answers once it is in the store.
            let capture_arrives_at = self.restores.captures.free_at();
            if let Restore::Lookup { answer_at, .. } = &mut self.table.get_mut(request)?.restore {
                *answer_at = (*answer_at).max(capture_arrives_at);
            }
        }
        Ok(())
    }

    /// Preemption by offload: captures what running `request` computed into the store (as a checkpoint of kind
    /// `Preemption`) when `Preemption::Offload` is on and copying it out and back, with a lookup between,
    /// costs less than recomputing it. `true` when the store took it. A request whose copy is still landing
    /// has nothing valid to capture.
    fn offload(&mut self, request: RequestId) -> Result<bool> {
        let req = &self.table.get(request)?;
        if self.params.preemption != Preemption::Offload || req.loading().is_some() {
            return Ok(false);
        }
        let n_tokens = req.n_computed;
        let copy = self.executor.copy_time(n_tokens);
        let offload = copy
            .saturating_add(copy)
            .saturating_add(self.params.lookup_latency);
        if n_tokens == 0 || offload >= self.executor.recompute_time(n_tokens) {
            return Ok(false);
        }
        self.capture(request, CheckpointKind::Preemption)
    }

    /// Preempts running `request` for a forced reset (X1): as `preempt`, but straight back to the waiting queue,
    /// since the reset empties the cache a lookup would read.
    pub(crate) fn preempt_for_reset(&mut self, request: RequestId) -> Result<()> {
        self.give_up_running(request)?;
        self.enqueue_waiting(request, None)
    }

    /// What both preemptions do: cancel a restore at once still copying, release the ticket, free the pages,
    /// count the preemption.
    fn give_up_running(&mut self, request: RequestId) -> Result<()> {
        self.cancel_loading(request)?;
        self.release_ticket(request)?;
        self.free_request_pages(request)?;
        let req = self.table.get_mut(request)?;
        req.metrics.preemptions += 1;
        req.restore = Restore::Idle;
        Ok(())
    }

    /// Cancels an `ordinary` restore still copying into `request`'s pages: they hold nothing valid yet, so they
    /// are never registered as cached blocks; the index keeps them pinned until the copy drains (O5).
    pub(crate) fn cancel_loading(&mut self, request: RequestId) -> Result<()> {
        let block_tokens = self.params.geometry.block_tokens();
        let req = self.table.get_mut(request)?;
        if req.take_loading().is_some() {
            // Nothing the copy brought is valid.
            req.forget_copy(req.n_registered * block_tokens);
            let _draining =
                self.restores
                    .index
                    .cancel(&mut self.pool, &mut *self.restores.copies, request)?;
        }
        Ok(())
    }

    /// Releases everything `request` holds in the ledger, if there is one: its ticket's slot, credits and the
    /// pages it still holds (the request gives up its handle, so no ticket ends twice), or else its capacity
    /// waiter. A staged import's pages are not among them: the ticket handed them to the index, which alone
    /// pins and drains them (O5). A ticket never staged (its checkpoint was lost between the lookup's answer
    /// and the reservation, G3) gives its pages back at once: no copy received them.
    pub(crate) fn release_ticket(&mut self, request: RequestId) -> Result<()> {
        match self.table.get_mut(request)?.ticket.take() {
            Some(ticket) => self.policy.release(ticket, &mut self.pool),
            None => {
                self.policy.forget_waiter(request);
                Ok(())
            }
        }
    }

    /// Ends `request`'s capacity wait, if any, recording its length.
    pub(crate) fn end_wait(&mut self, request: RequestId) {
        let now = self.time.now;
        if let Some(req) = self.table.find_mut(request)
            && req.capacity_wait().is_some()
            && let Some(wait) = req.capacity_wait_mut().ok().and_then(Option::take)
        {
            let waited_s = now.since(wait.started).as_secs_f64();
            req.metrics.longest_capacity_wait_s = req.metrics.longest_capacity_wait_s.max(waited_s);
        }
    }
}
