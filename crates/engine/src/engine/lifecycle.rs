//! The request lifecycle: every edge moves a request's `Phase` and its container together, through
//! `Engine::move_to`, the only code that writes a phase or touches the containers' membership. Together with
//! `check_containers` (every live request is in exactly the container its phase names) this makes a forgotten
//! container an immediate internal error instead of a stray request found many steps later.
//!
//! ```text
//!              submit
//!                |
//!            Arriving ----------------------.
//!                | arrival: local prefix      | arrival: ask the store
//!                v covers it                  v
//!   .------> Waiting <---- fallback ----- Restoring <--.  retry (O7), refresh (G4)
//!   |          |   ^                         |   |     |
//!   |          |   '------ lost pages ---.   |   '-----'
//!   |  admit   |  (cold, restore at once) |   | published (reserved)
//!   |          v                          |   v
//!   |       Running <----- admit -------- Ready   (ready: walk; ready-logits: isolated step, Q4)
//!   |        |  |  ^
//!   '--------'  |  '------------- Resuming <-- resume (Q7) --.
//!  preempt      | stream answer ends                          |
//!  (or to       '---------------------------------------> Paused
//!  Restoring)
//! any phase -> gone: finished, cancelled, rejected (retire)
//! ```
//!
//! Glossary, the four state machines side by side:
//!
//! | `Phase` (`RequestPhase`) | `Restore` (engine)         | `TicketState` (ledger, `reserved`) | `ImportState` (index)   |
//! |--------------------|----------------------------|------------------------------------|-------------------------|
//! | Arriving           | Idle                       | none                               | none                    |
//! | Restoring          | Lookup / Answered          | none, or a capacity waiter         | none                    |
//! | Restoring          | Importing                  | Importing                          | Staged                  |
//! | Ready              | Importing                  | Ready                              | Published               |
//! | Waiting            | Idle (or Answered, ordinary)| none                              | none                    |
//! | Running            | Idle                       | Admitted until the prompt is computed, then none | none (acquired) |
//! | Running (ordinary, restore at once) | Idle (`Req::loading`) | none                 | Staged, then released   |
//! | Paused / Resuming  | Idle                       | none                               | none                    |
//! | gone (cancelled while copying) | -              | none (slot and credits released)   | Cancelled until drained |

use kv_pool::RequestId;

use super::Engine;
use super::req::{Phase, Restore};
use crate::error::{Error, Result};
use crate::executor::Executor;

impl<E: Executor> Engine<E> {
    /// Moves `id` to phase `to`: out of the container its phase names, into the one `to` names (its place
    /// in the order for queues, the back for the running list and the resume queue). An edge the lifecycle
    /// does not have is `Error::Internal`, and nothing changes.
    pub(crate) fn move_to(&mut self, id: RequestId, to: Phase) -> Result<()> {
        let from = self
            .reqs
            .get(&id)
            .ok_or_else(|| Error::internal(format!("{id} moves to {to:?} but is not live")))?
            .phase;
        if !edge_exists(from, to) {
            return Err(Error::internal(format!(
                "{id} cannot move from {from:?} to {to:?}"
            )));
        }
        self.leave_container(id);
        let req = &self.reqs[&id];
        let order = req.order;
        match to {
            Phase::Arriving => {
                self.arriving.insert(req.arrival_key, id);
            }
            Phase::Waiting => {
                self.waiting.insert(order, id);
            }
            Phase::Restoring => {
                self.restoring.insert(order, id);
            }
            Phase::Ready if self.whole_prompt_with_logits(id) => {
                // Its own isolated step admits it (Q4), not the admission walk.
                self.ready_logits.insert(order, id);
            }
            Phase::Ready => {
                self.ready.insert(order, id);
            }
            Phase::Running => self.running.push(id),
            Phase::Resuming => self.resuming.push_back(id),
            Phase::Paused => {}
        }
        super::req::live(&mut self.reqs, id)?.phase = to;
        Ok(())
    }

    /// Whether a running request's whole prompt is read: by an executor that reads tokens, or on a hybrid
    /// model (its lookups and captures end at exact boundaries, which take their partial pages' tokens). Such
    /// an engine generates a deferred prompt at submit; otherwise a request reads only its held tokens
    /// (`Tokens`), and a deferred prompt stays deferred but for a verified restore.
    pub(crate) fn reads_running_tokens(&self) -> bool {
        self.executor.reads_tokens() || self.groups.is_hybrid()
    }

    /// Generates `id`'s deferred prompt, if it has one (`RequestSpec::keyed_from_source`); a no-op once held.
    /// A source that changed fails the caller's step naming `prompt_source` (only a verified restore, which
    /// stops the run on any mismatch, generates one after submit).
    pub(crate) fn materialize(&mut self, id: RequestId) -> Result<()> {
        super::req::live(&mut self.reqs, id)?.tokens.materialize(id)
    }

    /// Takes `id` out of whatever container its phase names (idempotent: a queue the admission walk already
    /// took it from is left as it is).
    pub(crate) fn leave_container(&mut self, id: RequestId) {
        let Some(req) = self.reqs.get(&id) else {
            return;
        };
        let order = req.order;
        match req.phase {
            Phase::Arriving => {
                self.arriving.remove(&req.arrival_key);
            }
            Phase::Waiting => {
                self.waiting.remove(&order);
            }
            Phase::Restoring => {
                self.restoring.remove(&order);
            }
            Phase::Ready => {
                self.ready.remove(&order);
                self.ready_logits.remove(&order);
            }
            Phase::Running => self.running.retain(|running| *running != id),
            Phase::Resuming => self.resuming.retain(|resuming| *resuming != id),
            Phase::Paused => {}
        }
    }

    /// Whether `id`'s ready import restores its whole prompt and the request has saved logits (Q4).
    fn whole_prompt_with_logits(&self, id: RequestId) -> bool {
        let req = &self.reqs[&id];
        req.spec.saved_logits
            && matches!(req.restore, Restore::Importing { tokens, .. }
                if tokens as usize == req.tokens.len())
    }
}

/// The lifecycle's edges (same-phase moves re-queue a request at its place: a retried lookup, a request
/// the admission walk put back).
fn edge_exists(from: Phase, to: Phase) -> bool {
    use Phase::{Arriving, Paused, Ready, Restoring, Resuming, Running, Waiting};
    matches!(
        (from, to),
        (Arriving, Waiting | Restoring)
            | (Waiting, Waiting | Restoring | Running)
            | (Restoring, Restoring | Waiting | Ready)
            | (Ready, Running | Waiting)
            | (Running, Waiting | Restoring | Paused)
            | (Paused, Resuming)
            | (Resuming, Running)
    )
}
