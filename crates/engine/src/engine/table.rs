//! The request table: every live request, and the one container its phase names. Every lifecycle edge moves a
//! request's `Phase` and its container together, through `RequestTable::move_to`, the only code that writes a
//! phase or a container's membership (the admission walk pops the heads of `waiting` and `ready` itself, then
//! moves what it took). Together with `check_containers` (every live request is in exactly the container its
//! phase names) this makes a forgotten container an immediate internal error instead of a stray request found
//! many steps later. A request the engine's state names but the table does not hold is `Error::Internal`,
//! never a panic. A `Phase` carries the data of that phase alone (`table/req.rs`; its `phase` field is written here alone): a waiting request's published
//! pages-only import (`published`), a restoring one's capacity wait (`wait`), a running one's loading copy
//! (`loading`); leaving the phase drops it, a move within it (a re-queue) keeps it. The edges that release
//! what a request holds are named functions in `lifecycle.rs`.
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
//! any phase -> gone: finished, cancelled (`finish`, `cancel`: lifecycle.rs)
//! ```
//!
//! Glossary, the four state machines side by side:
//!
//! | `Phase` (`RequestPhase`) | `Restore` (engine)         | `TicketState` (ledger, `reserved`) | `ImportState` (index)   |
//! |--------------------|----------------------------|------------------------------------|-------------------------|
//! | Arriving           | Idle                       | none                               | none                    |
//! | Restoring          | Lookup / Answered          | none, or a capacity waiter (`wait`) | none                   |
//! | Restoring          | Importing                  | Importing                          | Staged                  |
//! | Ready              | Importing                  | Ready                              | Published               |
//! | Waiting            | Idle (or Answered, ordinary); `published` (pages-only) | none | none             |
//! | Running            | Idle                       | Admitted until the prompt is computed, then none | none (acquired) |
//! | Running (ordinary, restore at once) | Idle (`loading`)   | none                        | Staged, then released   |
//! | Paused / Resuming  | Idle                       | none                               | none                    |
//! | gone (cancelled while copying) | -              | none (slot and credits released)   | Cancelled until drained |

use std::collections::{BTreeMap, VecDeque};

use admission::WaitingQueue;
use foldhash::HashMap;
use kv_pool::{AdmissionOrder, RequestId, Timestamp};

use self::req::{Phase, Req, Restore};
use crate::error::{Error, Result};

pub(crate) mod req;

/// Where a live request is in its lifecycle (this module draws the edges).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RequestPhase {
    /// Submitted with a future arrival time.
    Arriving,
    /// In the waiting queue for ordinary admission.
    Waiting,
    /// With the restore coordinator: lookup pending, capacity wait or copy in flight.
    Restoring,
    /// A published import it owns, waiting for admission (`reserved`).
    Ready,
    /// Holds a running slot.
    Running,
    /// A streaming session between inputs.
    Paused,
    /// A paused session that received input, about to run again.
    Resuming,
}

impl RequestPhase {
    /// The phase's lower-case name, as traces print it.
    pub fn name(self) -> &'static str {
        match self {
            RequestPhase::Arriving => "arriving",
            RequestPhase::Waiting => "waiting",
            RequestPhase::Restoring => "restoring",
            RequestPhase::Ready => "ready",
            RequestPhase::Running => "running",
            RequestPhase::Paused => "paused",
            RequestPhase::Resuming => "resuming",
        }
    }
}

/// Every live request and the containers of the lifecycle's phases.
#[derive(Debug, Default)]
pub(crate) struct RequestTable {
    /// Boxed: a `Req` is large (its spec, keys, tokens, metrics and phase), and an unboxed map moved every
    /// request on each rehash and copied it on insert and remove; the box moves a pointer.
    reqs: HashMap<RequestId, Box<Req>>,
    /// Submitted, by arrival time and sequence.
    arriving: BTreeMap<(Timestamp, u64), RequestId>,
    /// Requests waiting for ordinary admission, at their place (pending restores are in `restoring`).
    pub(crate) waiting: WaitingQueue,
    restoring: BTreeMap<AdmissionOrder, RequestId>,
    /// Published imports owned by their request (`reserved`): they may pass a blocked head (Q1).
    pub(crate) ready: WaitingQueue,
    /// Ready imports of a whole prompt with saved logits: admitted by their isolated logits-only step (Q4).
    ready_logits: BTreeMap<AdmissionOrder, RequestId>,
    running: Vec<RequestId>,
    resuming: VecDeque<RequestId>,
}

impl RequestTable {
    /// `request`'s live request, or `Error::Internal`: the engine's state names it, so it must be live.
    pub(crate) fn get(&self, request: RequestId) -> Result<&Req> {
        self.reqs
            .get(&request)
            .map(Box::as_ref)
            .ok_or_else(|| not_live(request))
    }

    /// `get`, mutably.
    pub(crate) fn get_mut(&mut self, request: RequestId) -> Result<&mut Req> {
        self.reqs
            .get_mut(&request)
            .map(Box::as_mut)
            .ok_or_else(|| not_live(request))
    }

    /// `request`'s live request, if it is live (a caller's id, or one a step may have retired).
    pub(crate) fn find(&self, request: RequestId) -> Option<&Req> {
        self.reqs.get(&request).map(Box::as_ref)
    }

    /// `find`, mutably.
    pub(crate) fn find_mut(&mut self, request: RequestId) -> Option<&mut Req> {
        self.reqs.get_mut(&request).map(Box::as_mut)
    }

    pub(crate) fn contains(&self, request: RequestId) -> bool {
        self.reqs.contains_key(&request)
    }

    /// Live requests.
    pub(crate) fn len(&self) -> usize {
        self.reqs.len()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&RequestId, &Req)> {
        self.reqs.iter().map(|(id, req)| (id, req.as_ref()))
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &Req> {
        self.reqs.values().map(Box::as_ref)
    }

    /// The running requests, in admission order.
    pub(crate) fn running(&self) -> &[RequestId] {
        &self.running
    }

    /// Pending restores, in admission order.
    pub(crate) fn restoring(&self) -> &BTreeMap<AdmissionOrder, RequestId> {
        &self.restoring
    }

    /// Ready imports admitted by their own logits-only step (Q4), in admission order.
    pub(crate) fn ready_logits(&self) -> &BTreeMap<AdmissionOrder, RequestId> {
        &self.ready_logits
    }

    /// The paused stream that resumed first.
    pub(crate) fn first_resuming(&self) -> Option<RequestId> {
        self.resuming.front().copied()
    }

    /// When the next request arrives.
    pub(crate) fn next_arrival(&self) -> Option<Timestamp> {
        self.arriving.keys().next().map(|(at, _)| *at)
    }

    /// Whether any request waits, restores, is ready, runs or resumes (arriving and paused ones do not count).
    pub(crate) fn is_active(&self) -> bool {
        !(self.waiting.is_empty()
            && self.restoring.is_empty()
            && self.ready.is_empty()
            && self.ready_logits.is_empty()
            && self.running.is_empty()
            && self.resuming.is_empty())
    }

    /// A checked submission enters: it arrives at its `arrival_key`.
    pub(crate) fn enter(&mut self, req: Req) {
        let id = req.spec.id;
        self.arriving.insert(req.arrival_key, id);
        self.reqs.insert(id, Box::new(req));
    }

    /// Takes out the first request arrived by `now`: it leaves the arriving queue and is moved on by its
    /// arrival (`Engine::on_arrival`).
    pub(crate) fn pop_arrived(&mut self, now: Timestamp) -> Option<RequestId> {
        let (&(at, seq), &id) = self.arriving.first_key_value()?;
        if at > now {
            return None;
        }
        self.arriving.remove(&(at, seq));
        Some(id)
    }

    /// Takes every ready import waiting for its logits-only step (Q4): each is admitted or sent back.
    pub(crate) fn take_ready_logits(&mut self) -> Vec<RequestId> {
        std::mem::take(&mut self.ready_logits)
            .into_values()
            .collect()
    }

    /// Takes `request` out of the table: gone (finished, cancelled, rejected).
    pub(crate) fn remove(&mut self, request: RequestId) -> Option<Box<Req>> {
        self.leave_container(request);
        self.reqs.remove(&request)
    }

    /// Moves `request` to phase `to`: out of the container its phase names, into the one `to` names (its place
    /// in the order for queues, the back for the running list and the resume queue). A move within a phase
    /// (a re-queue) keeps the phase's data; a move to another phase enters it with none (`move_to_phase`
    /// enters it with data). An edge the lifecycle does not have is `Error::Internal`, and nothing changes.
    pub(crate) fn move_to(&mut self, request: RequestId, to: RequestPhase) -> Result<()> {
        let from = self
            .reqs
            .get(&request)
            .ok_or_else(|| Error::internal(format!("{request} moves to {to:?} but is not live")))?
            .phase
            .kind();
        let entered = self.requeue(request, to)?;
        if from != to {
            self.get_mut(request)?.phase = entered;
        }
        Ok(())
    }

    /// `move_to`, entering phase `to` with its data.
    pub(crate) fn move_to_phase(&mut self, request: RequestId, to: Phase) -> Result<()> {
        let _empty = self.requeue(request, to.kind())?;
        self.get_mut(request)?.phase = to;
        Ok(())
    }

    /// Takes `request` out of its container and puts it into the one phase `to` names, checking the edge: the
    /// phase `to` with no data of its own yet, which the caller sets or drops.
    fn requeue(&mut self, request: RequestId, to: RequestPhase) -> Result<Phase> {
        let from = self.get(request)?.phase.kind();
        if !edge_exists(from, to) {
            return Err(Error::internal(format!(
                "{request} cannot move from {from:?} to {to:?}"
            )));
        }
        self.leave_container(request);
        let req = self.get(request)?;
        let order = req.order;
        Ok(match to {
            RequestPhase::Arriving => {
                self.arriving.insert(req.arrival_key, request);
                Phase::Arriving
            }
            RequestPhase::Waiting => {
                self.waiting.insert(order, request);
                Phase::Waiting { published: None }
            }
            RequestPhase::Restoring => {
                self.restoring.insert(order, request);
                Phase::Restoring { wait: None }
            }
            RequestPhase::Ready => {
                if whole_prompt_with_logits(req) {
                    // Its own isolated step admits it (Q4), not the admission walk.
                    self.ready_logits.insert(order, request);
                } else {
                    self.ready.insert(order, request);
                }
                Phase::Ready
            }
            RequestPhase::Running => {
                self.running.push(request);
                Phase::Running { loading: None }
            }
            RequestPhase::Resuming => {
                self.resuming.push_back(request);
                Phase::Resuming
            }
            RequestPhase::Paused => Phase::Paused,
        })
    }

    /// Takes `request` out of whatever container its phase names (idempotent: a queue the admission walk already
    /// took it from is left as it is).
    pub(crate) fn leave_container(&mut self, request: RequestId) {
        let Some(req) = self.reqs.get(&request) else {
            return;
        };
        let order = req.order;
        match req.phase.kind() {
            RequestPhase::Arriving => {
                self.arriving.remove(&req.arrival_key);
            }
            RequestPhase::Waiting => {
                self.waiting.remove(&order);
            }
            RequestPhase::Restoring => {
                self.restoring.remove(&order);
            }
            RequestPhase::Ready => {
                self.ready.remove(&order);
                self.ready_logits.remove(&order);
            }
            RequestPhase::Running => self.running.retain(|running| *running != request),
            RequestPhase::Resuming => self.resuming.retain(|resuming| *resuming != request),
            RequestPhase::Paused => {}
        }
    }

    /// Every live request is in exactly the container its phase names, at its own key.
    pub(crate) fn check_containers(&self) -> Result<()> {
        let broken = |invariant: String| Err(Error::internal(invariant));
        let mut in_containers = 0usize;
        let mut expect =
            |request: RequestId, phase: RequestPhase, order: Option<AdmissionOrder>, what: &str| {
                in_containers += 1;
                match self.reqs.get(&request) {
                    Some(req) if req.phase.kind() != phase => broken(format!(
                        "{request} is {:?} but in the {what} container",
                        req.phase.kind()
                    )),
                    Some(req) if order.is_some_and(|order| order != req.order) => {
                        broken(format!("{request}'s {what} key drifted"))
                    }
                    Some(_) => Ok(()),
                    None => broken(format!("{request} is in the {what} container but not live")),
                }
            };
        for id in self.arriving.values() {
            expect(*id, RequestPhase::Arriving, None, "arriving")?;
        }
        for (order, id) in self.waiting.iter() {
            expect(id, RequestPhase::Waiting, Some(order), "waiting queue")?;
        }
        for (order, id) in self.ready.iter() {
            expect(id, RequestPhase::Ready, Some(order), "ready queue")?;
        }
        for (order, id) in &self.ready_logits {
            expect(*id, RequestPhase::Ready, Some(*order), "ready-logits")?;
        }
        for (order, id) in &self.restoring {
            expect(*id, RequestPhase::Restoring, Some(*order), "restoring")?;
        }
        for id in &self.running {
            expect(*id, RequestPhase::Running, None, "running")?;
        }
        for id in &self.resuming {
            expect(*id, RequestPhase::Resuming, None, "resuming")?;
        }
        let n_paused = self
            .reqs
            .values()
            .filter(|req| req.phase.kind() == RequestPhase::Paused)
            .count();
        if in_containers + n_paused != self.reqs.len() {
            return broken(format!(
                "{} live requests but {in_containers} in containers and {n_paused} paused",
                self.reqs.len()
            ));
        }
        Ok(())
    }
}

fn not_live(request: RequestId) -> Error {
    Error::internal(format!(
        "{request} is named by the engine's state but not live"
    ))
}

/// Whether `req`'s ready import restores its whole prompt and the request has saved logits (Q4).
fn whole_prompt_with_logits(req: &Req) -> bool {
    req.spec.saved_logits
        && matches!(req.restore, Restore::Importing { tokens, .. }
            if tokens as usize == req.tokens.len())
}

/// The lifecycle's edges (same-phase moves re-queue a request at its place: a retried lookup, a request
/// the admission walk put back).
fn edge_exists(from: RequestPhase, to: RequestPhase) -> bool {
    use RequestPhase::{Arriving, Paused, Ready, Restoring, Resuming, Running, Waiting};
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

#[cfg(test)]
mod tests {
    use kv_pool::{RequestId, Timestamp};

    use super::super::req::{CapacityWait, Req};
    use super::super::tokens::Tokens;
    use super::{RequestPhase, RequestTable};
    use crate::error::Error;
    use crate::request::RequestSpec;

    const ID: RequestId = RequestId(1);

    fn table() -> RequestTable {
        let prompt = vec![1, 2, 3];
        let spec = RequestSpec::new(ID.0, prompt.clone(), 1, Timestamp::ZERO);
        let mut table = RequestTable::default();
        table.enter(Req::new(
            spec,
            Vec::new(),
            Tokens::held(prompt),
            0,
            Timestamp::ZERO,
        ));
        table
    }

    /// A re-queue within a phase (a retried lookup) keeps the phase's data; leaving the phase drops it.
    #[test]
    fn a_requeue_keeps_its_phase_data_and_leaving_the_phase_drops_it() -> crate::error::Result<()> {
        let mut table = table();
        table.move_to(ID, RequestPhase::Restoring)?;
        *table.get_mut(ID)?.capacity_wait_mut()? = Some(CapacityWait {
            started: Timestamp::ZERO,
            logged: Timestamp::ZERO,
        });
        table.move_to(ID, RequestPhase::Restoring)?;
        assert!(table.get(ID)?.capacity_wait().is_some());
        table.check_containers()?;
        table.move_to(ID, RequestPhase::Waiting)?;
        assert!(table.get(ID)?.capacity_wait().is_none());
        assert!(matches!(
            table.get_mut(ID)?.capacity_wait_mut(),
            Err(Error::Internal { .. })
        ));
        table.check_containers()
    }

    /// An edge the lifecycle does not have is an internal error, and the request stays where it was.
    #[test]
    fn an_edge_the_lifecycle_lacks_is_an_internal_error_and_changes_nothing()
    -> crate::error::Result<()> {
        let mut table = table();
        table.move_to(ID, RequestPhase::Waiting)?;
        assert!(matches!(
            table.move_to(ID, RequestPhase::Paused),
            Err(Error::Internal { .. })
        ));
        assert_eq!(table.get(ID)?.phase.kind(), RequestPhase::Waiting);
        table.check_containers()
    }
}
