//! Capacity waiters: recording a refused restore with its need in admission order, the pages and slots that
//! earlier waiters hold back, bounded-wait expiry with its one warning (W1), forgetting a waiter, and the
//! waiter queries.

use super::{Ledger, WaiterEntry};
use crate::error::{Error, Result};
use kv_pool::{AdmissionOrder, RequestId, Timestamp};

impl Ledger {
    /// Marks every waiter whose bounded wait is over as expired, with its one warning; returns them in order.
    /// Optional: `reserve` expires a waiter when it is polled, and an overdue waiter holds nobody back.
    pub fn expire_due(&mut self, now: Timestamp) -> Vec<RequestId> {
        let due: Vec<RequestId> = self
            .waiters
            .iter()
            .filter(|(_, waiter)| {
                !waiter.expired && now.since(waiter.since) >= self.config.restore_max_wait
            })
            .map(|(&(_, request), _)| request)
            .collect();
        for &request in &due {
            // Marks and warns; the error value is the answer for a polled request, not needed here.
            let _expired = self.check_expiry(request, now);
        }
        due
    }

    /// Whether `request` is a capacity waiter (expired or not).
    pub fn is_waiter(&self, request: RequestId) -> bool {
        self.waiter_orders.contains_key(&request)
    }

    /// Whether `request`'s bounded wait is over (it must recompute; admission or release clears this).
    pub fn is_expired(&self, request: RequestId) -> bool {
        self.waiter_orders
            .get(&request)
            .is_some_and(|&order| self.waiters[&(order, request)].expired)
    }

    /// Capacity waiters, expired ones included.
    pub fn n_waiters(&self) -> usize {
        self.waiters.len()
    }

    /// Pages and slots held, for `request` at `order`, by earlier waiters whose wait is not over.
    pub(super) fn earlier_waiters_hold(
        &self,
        order: AdmissionOrder,
        request: RequestId,
        now: Timestamp,
    ) -> (u32, u32) {
        let max_wait = self.config.restore_max_wait;
        self.waiters
            .range(..(order, request))
            .filter(|(_, waiter)| !waiter.expired && now.since(waiter.since) < max_wait)
            .fold((0u32, 0u32), |(pages, slots), (_, waiter)| {
                (pages.saturating_add(waiter.need_pages), slots + 1)
            })
    }

    pub(super) fn record_waiter(
        &mut self,
        request: RequestId,
        order: AdmissionOrder,
        need_pages: u32,
        now: Timestamp,
    ) {
        let mut waiter = WaiterEntry {
            need_pages,
            since: now,
            expired: false,
        };
        if let Some(old_order) = self.waiter_orders.insert(request, order) {
            let old = self.waiters.remove(&(old_order, request));
            debug_assert!(old.is_some(), "waiter index of {request} dangling");
            if let Some(old) = old {
                waiter.since = old.since;
                waiter.expired = old.expired;
            }
        }
        self.waiters.insert((order, request), waiter);
    }

    /// Whether `request` (a waiter) is out of time: marks it expired with exactly one warning on the transition.
    pub(super) fn check_expiry(&mut self, request: RequestId, now: Timestamp) -> Result<()> {
        let Some(&order) = self.waiter_orders.get(&request) else {
            return Ok(());
        };
        let max_wait = self.config.restore_max_wait;
        let Some(waiter) = self.waiters.get_mut(&(order, request)) else {
            // The two indexes always agree (`check_invariants`); were one dangling, drop it: no waiter.
            debug_assert!(false, "waiter index of {request} dangling");
            self.waiter_orders.remove(&request);
            return Ok(());
        };
        let waited = now.since(waiter.since);
        if !waiter.expired && waited < max_wait {
            return Ok(());
        }
        if !waiter.expired {
            waiter.expired = true;
            tracing::warn!(
                %request,
                waited_s = waited.as_secs_f64(),
                max_wait_s = max_wait.as_secs_f64(),
                "restore gave up waiting for capacity after {:.1} s; recomputing its prompt",
                waited.as_secs_f64()
            );
        }
        Err(Error::Expired { request, waited })
    }

    pub(super) fn forget_waiter(&mut self, request: RequestId) -> bool {
        match self.waiter_orders.remove(&request) {
            Some(order) => {
                self.waiters.remove(&(order, request));
                true
            }
            None => false,
        }
    }
}
