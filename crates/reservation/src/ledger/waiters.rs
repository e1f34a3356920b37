//! Capacity waiters: recording a refused restore with its need in admission order, the pages and slots that
//! earlier waiters hold back, bounded-wait expiry with its one warning (W1), forgetting a waiter, and the
//! waiter queries.

use super::{Ledger, WaiterEntry};

/// What `earlier_waiters_hold` summed last: the pages and slots of the waiters before `upto` at `now`. Valid
/// while no waiter before `upto` changes; every change to one drops it (`touch`).
#[derive(Clone, Copy, Debug)]
pub(super) struct HoldCursor {
    now: Timestamp,
    upto: (AdmissionOrder, RequestId),
    pages: u32,
    slots: u32,
}
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
    #[cfg(test)]
    pub(crate) fn n_waiters(&self) -> usize {
        self.waiters.len()
    }

    /// Pages and slots held, for `request` at `order`, by earlier waiters whose wait is not over. A call for a
    /// later key at the same time sums only the waiters since the previous call's key.
    pub(super) fn earlier_waiters_hold(
        &mut self,
        order: AdmissionOrder,
        request: RequestId,
        now: Timestamp,
    ) -> (u32, u32) {
        let key = (order, request);
        let (from, mut pages, mut slots) = match self.hold_cursor {
            Some(cursor) if cursor.now == now && cursor.upto <= key => {
                (Some(cursor.upto), cursor.pages, cursor.slots)
            }
            _ => (None, 0, 0),
        };
        let max_wait = self.config.restore_max_wait;
        let range = match from {
            Some(from) => self.waiters.range(from..key),
            None => self.waiters.range(..key),
        };
        for (_, waiter) in range {
            if !waiter.expired && now.since(waiter.since) < max_wait {
                pages = pages.saturating_add(waiter.need_pages);
                slots += 1;
            }
        }
        debug_assert_eq!(
            (pages, slots),
            self.waiters
                .range(..key)
                .filter(|(_, waiter)| !waiter.expired && now.since(waiter.since) < max_wait)
                .fold((0u32, 0u32), |(pages, slots), (_, waiter)| {
                    (pages.saturating_add(waiter.need_pages), slots + 1)
                }),
            "the hold cursor disagrees with the waiters before {key:?}"
        );
        self.hold_cursor = Some(HoldCursor {
            now,
            upto: key,
            pages,
            slots,
        });
        (pages, slots)
    }

    /// A waiter at `key` changes: the cursor's sum no longer holds if it counted that waiter.
    fn touch(&mut self, key: (AdmissionOrder, RequestId)) {
        if self.hold_cursor.is_some_and(|cursor| key < cursor.upto) {
            self.hold_cursor = None;
        }
    }

    /// Records `request` as a capacity waiter at `order` needing `need_pages`, or refreshes it: a waiter keeps
    /// the time of its first refusal and whether it expired; only its need (and, if it moved, its place)
    /// change. Returns whether `request` is a new waiter.
    pub(super) fn record_waiter(
        &mut self,
        request: RequestId,
        order: AdmissionOrder,
        need_pages: u32,
        now: Timestamp,
    ) -> bool {
        self.touch((order, request));
        let mut waiter = WaiterEntry {
            need_pages,
            since: now,
            expired: false,
        };
        match self.waiter_orders.insert(request, order) {
            // A refresh in place, the common case: one lookup, no removal and reinsertion.
            Some(old_order) if old_order == order => {
                if let Some(entry) = self.waiters.get_mut(&(order, request)) {
                    entry.need_pages = need_pages;
                    return false;
                }
                // The two indexes always agree (`check_invariants`); were one dangling, record it afresh.
                debug_assert!(false, "waiter index of {request} dangling");
                self.waiters.insert((order, request), waiter);
                return true;
            }
            Some(old_order) => {
                self.touch((old_order, request));
                let old = self.waiters.remove(&(old_order, request));
                debug_assert!(old.is_some(), "waiter index of {request} dangling");
                if let Some(old) = old {
                    waiter.since = old.since;
                    waiter.expired = old.expired;
                }
            }
            None => {
                self.waiters.insert((order, request), waiter);
                return true;
            }
        }
        self.waiters.insert((order, request), waiter);
        false
    }

    /// Whether `request` (a waiter) is out of time: marks it expired with exactly one warning on the transition.
    pub(super) fn check_expiry(&mut self, request: RequestId, now: Timestamp) -> Result<()> {
        let Some(&order) = self.waiter_orders.get(&request) else {
            return Ok(());
        };
        let max_wait = self.config.restore_max_wait;
        self.touch((order, request));
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

    /// Forgets `request` as a capacity waiter, expired or not (its hold lifts, Q2); `false` when it was none.
    /// Its ticket, if it holds one, is untouched: `release` ends both.
    pub fn forget_waiter(&mut self, request: RequestId) -> bool {
        match self.waiter_orders.remove(&request) {
            Some(order) => {
                self.touch((order, request));
                self.waiters.remove(&(order, request));
                true
            }
            None => false,
        }
    }
}
