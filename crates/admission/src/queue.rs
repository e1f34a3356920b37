//! The waiting queue: requests in admission order (FCFS, or priority then arrival), keyed by their place
//! (`AdmissionOrder`). A step walks two of them: the waiting requests and the ready imports (published, owning
//! their ticket), which may pass a blocked head. Every operation is O(log n); nothing here walks the queue.

use std::collections::BTreeMap;

use foldhash::HashMap;
use kv_pool::{AdmissionOrder, RequestId};

use crate::error::{Error, Result};

/// How `WaitingQueue::push` places new requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum QueuePolicy {
    /// First come, first served: arrival order.
    #[default]
    Fcfs,
    /// Lower priority value first, then arrival order.
    Priority,
}

/// Requests in admission order. A request keeps its place: a host that assigns places itself (a preempted
/// request goes back where it was) uses `insert`; `push` assigns the next place by the policy.
#[derive(Clone, Debug, Default)]
pub struct WaitingQueue {
    policy: QueuePolicy,
    next_seq: u64,
    entries: BTreeMap<AdmissionOrder, RequestId>,
    orders: HashMap<RequestId, AdmissionOrder>,
}

impl WaitingQueue {
    /// An empty queue whose `push` places requests by `policy`.
    pub fn new(policy: QueuePolicy) -> WaitingQueue {
        WaitingQueue {
            policy,
            ..WaitingQueue::default()
        }
    }

    /// The placing policy of `push`.
    pub fn policy(&self) -> QueuePolicy {
        self.policy
    }

    /// Appends `request` (`priority` is ignored under FCFS) and returns its place. Errors if already queued.
    #[cfg(test)]
    pub(crate) fn push(&mut self, request: RequestId, priority: u32) -> Result<AdmissionOrder> {
        if self.orders.contains_key(&request) {
            return Err(Error::AlreadyQueued { request });
        }
        let priority = match self.policy {
            QueuePolicy::Fcfs => 0,
            QueuePolicy::Priority => priority,
        };
        let order = AdmissionOrder {
            priority,
            seq: self.next_seq,
        };
        let _displaced = self.insert(order, request);
        Ok(order)
    }

    /// Puts `request` at `order` (moving it if it was queued elsewhere). Returns the other request that held
    /// `order`, which leaves the queue (a host bug: places are unique).
    pub fn insert(&mut self, order: AdmissionOrder, request: RequestId) -> Option<RequestId> {
        if let Some(previous) = self.orders.insert(request, order)
            && previous != order
        {
            self.entries.remove(&previous);
        }
        self.next_seq = self.next_seq.max(order.seq.saturating_add(1));
        let displaced = self
            .entries
            .insert(order, request)
            .filter(|displaced| *displaced != request);
        if let Some(displaced) = displaced {
            self.orders.remove(&displaced);
        }
        debug_assert!(
            displaced.is_none(),
            "{displaced:?} and {request} share a place"
        );
        displaced
    }

    /// Removes the request at `order` (admitted, withdrawn, aborted or cancelled) and returns it.
    pub fn remove(&mut self, order: &AdmissionOrder) -> Option<RequestId> {
        let request = self.entries.remove(order)?;
        self.orders.remove(&request);
        Some(request)
    }

    /// Moves `request`, keeping its place, to `other` (e.g. onto the ready-import list, or back from it).
    pub(crate) fn move_to(
        &mut self,
        request: RequestId,
        other: &mut WaitingQueue,
    ) -> Result<AdmissionOrder> {
        let order = self.order_of(request).ok_or(Error::NotQueued { request })?;
        self.remove(&order);
        let _displaced = other.insert(order, request);
        Ok(order)
    }

    /// `request`'s place, if it is queued.
    pub(crate) fn order_of(&self, request: RequestId) -> Option<AdmissionOrder> {
        self.orders.get(&request).copied()
    }

    /// The request at `order`, if any.
    pub(crate) fn get(&self, order: &AdmissionOrder) -> Option<RequestId> {
        self.entries.get(order).copied()
    }

    /// Queued requests.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nobody is queued.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The first queued request at or after `from`, in order.
    pub(crate) fn next_from(&self, from: AdmissionOrder) -> Option<(AdmissionOrder, RequestId)> {
        self.entries
            .range(from..)
            .next()
            .map(|(&order, &request)| (order, request))
    }

    /// The first queued request strictly after `after`, in order.
    pub(crate) fn next_after(&self, after: AdmissionOrder) -> Option<(AdmissionOrder, RequestId)> {
        use std::ops::Bound::{Excluded, Unbounded};
        self.entries
            .range((Excluded(after), Unbounded))
            .next()
            .map(|(&order, &request)| (order, request))
    }

    /// Queued requests in order (for tests, traces and resets; a step never calls it).
    pub fn iter(&self) -> impl Iterator<Item = (AdmissionOrder, RequestId)> + '_ {
        self.entries
            .iter()
            .map(|(&order, &request)| (order, request))
    }
}
