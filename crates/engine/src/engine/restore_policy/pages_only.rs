//! `pages-only`: the naive fix. It reserves the imported pages alone, taken if free now: no running slot, no
//! execution credits, no hold on others' needs beyond the watermark, and no ownership once published (the
//! restored pages are evictable cached pages). It keeps its own bounded wait, without a ledger.

use std::time::Duration;

use kv_pool::{PagePool, RequestId, Timestamp};
use reservation::Preflight;

use super::{Publication, Refusal, Reservation, ReserveAsk, RestorePolicy};
use crate::error::Result;

/// The `pages-only` policy.
#[derive(Debug)]
pub(crate) struct PagesOnly;

impl RestorePolicy for PagesOnly {
    fn restores_at_admission(&self) -> bool {
        false
    }

    fn reserve(
        &mut self,
        _pool: &mut PagePool,
        ask: &ReserveAsk<'_>,
    ) -> Result<Reservation, Refusal> {
        if ask.import_pages <= ask.admissible_pages {
            // The index allocates the pages when it stages the import.
            Ok(Reservation::PagesFreeNow)
        } else if ask.max_wait.is_zero() {
            Err(Refusal::NoWait)
        } else {
            Err(Refusal::PagesNotFree {
                need: ask.import_pages,
                free: ask.admissible_pages,
            })
        }
    }

    fn refuses_for_pressure(
        &self,
        _pool: &PagePool,
        _preflight: &Preflight,
        admissible_pages: u32,
        need_pages: u32,
    ) -> bool {
        need_pages > admissible_pages
    }

    fn publish(&mut self, _request: RequestId) -> Result<Publication> {
        Ok(Publication::Unowned)
    }

    fn wait_expired(
        &mut self,
        request: RequestId,
        now: Timestamp,
        started: Option<Timestamp>,
        max_wait: Duration,
    ) -> bool {
        let Some(started) = started else {
            return false;
        };
        let waited = now.since(started);
        if waited < max_wait {
            return false;
        }
        tracing::warn!(request = %request, waited_s = waited.as_secs_f64(), "restore gave up waiting for capacity; recomputing its prompt");
        true
    }

    fn own_wait_over(&self, waited: Duration, max_wait: Duration) -> bool {
        waited >= max_wait
    }
}
