//! The waiting queue: requests in admission order (FCFS, or priority then arrival), with the separate list of
//! ready imports (published, owning their ticket) that may pass a blocked head. Every operation is
//! O(log n); nothing here walks the queue.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use reservation::{AdmissionOrder, RequestId};

use crate::error::{Error, Result};

/// How the waiting queue is ordered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum QueuePolicy {
    /// First come, first served: arrival order.
    #[default]
    Fcfs,
    /// Lower priority value first, then arrival order.
    Priority,
}

/// Waiting requests in admission order, and the ready-import list.
#[derive(Clone, Debug, Default)]
pub struct WaitingQueue {
    policy: QueuePolicy,
    next_seq: u64,
    entries: BTreeMap<AdmissionOrder, RequestId>,
    orders: HashMap<RequestId, AdmissionOrder>,
    ready: BTreeSet<AdmissionOrder>,
}

impl WaitingQueue {
    /// An empty queue ordered by `policy`.
    pub fn new(policy: QueuePolicy) -> WaitingQueue {
        WaitingQueue {
            policy,
            ..WaitingQueue::default()
        }
    }

    /// The ordering policy.
    pub fn policy(&self) -> QueuePolicy {
        self.policy
    }

    /// Appends `req` (`priority` is ignored under FCFS) and returns its place. Errors if already waiting.
    pub fn push(&mut self, req: RequestId, priority: u32) -> Result<AdmissionOrder> {
        if self.orders.contains_key(&req) {
            return Err(Error::AlreadyQueued { req });
        }
        let priority = match self.policy {
            QueuePolicy::Fcfs => 0,
            QueuePolicy::Priority => priority,
        };
        let order = AdmissionOrder {
            priority,
            seq: self.next_seq,
        };
        self.next_seq += 1;
        self.entries.insert(order, req);
        self.orders.insert(req, order);
        Ok(order)
    }

    /// Removes `req` (admitted, aborted or cancelled), from the ready list too. Returns whether it waited.
    pub fn remove(&mut self, req: RequestId) -> bool {
        let Some(order) = self.orders.remove(&req) else {
            return false;
        };
        self.entries.remove(&order);
        self.ready.remove(&order);
        true
    }

    /// `req`'s import is published and owns its ticket: it may pass a blocked head.
    pub fn mark_ready(&mut self, req: RequestId) -> Result<()> {
        let order = self.order_of(req).ok_or(Error::NotQueued { req })?;
        self.ready.insert(order);
        Ok(())
    }

    /// `req` no longer owns a ready import (released, or fell back to recompute).
    pub fn unmark_ready(&mut self, req: RequestId) -> Result<()> {
        let order = self.order_of(req).ok_or(Error::NotQueued { req })?;
        self.ready.remove(&order);
        Ok(())
    }

    /// `req`'s place, if it waits.
    pub fn order_of(&self, req: RequestId) -> Option<AdmissionOrder> {
        self.orders.get(&req).copied()
    }

    /// Whether `req` is on the ready-import list.
    pub fn is_ready(&self, req: RequestId) -> bool {
        self.order_of(req)
            .is_some_and(|order| self.ready.contains(&order))
    }

    /// Waiting requests.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nobody waits.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Ready imports waiting.
    pub fn n_ready(&self) -> usize {
        self.ready.len()
    }

    /// The first waiting request at or after `from`, in order.
    pub fn next_from(&self, from: AdmissionOrder) -> Option<(AdmissionOrder, RequestId)> {
        self.entries
            .range(from..)
            .next()
            .map(|(&order, &req)| (order, req))
    }

    /// The first ready import strictly after `after`, in order.
    pub fn next_ready_after(&self, after: AdmissionOrder) -> Option<(AdmissionOrder, RequestId)> {
        use std::ops::Bound::{Excluded, Unbounded};
        let order = *self.ready.range((Excluded(after), Unbounded)).next()?;
        Some((order, self.entries[&order]))
    }

    /// Waiting requests in order (for tests and traces; the step never calls it).
    pub fn iter(&self) -> impl Iterator<Item = (AdmissionOrder, RequestId)> + '_ {
        self.entries.iter().map(|(&order, &req)| (order, req))
    }
}
