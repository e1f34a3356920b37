//! `ordinary`: how engines behaved before the contract. An answered restore is tried at admission, at once or
//! not at all (G1): it holds nothing while it waits, and no reservation operation is ever called.

use std::time::Duration;

use kv_pool::{PagePool, RequestId, Timestamp};

use super::{Publication, Refusal, Reservation, ReserveAsk, RestorePolicy};
use crate::error::{Error, Result};

/// The `ordinary` policy.
#[derive(Debug)]
pub(crate) struct Ordinary;

impl RestorePolicy for Ordinary {
    fn restores_at_admission(&self) -> bool {
        true
    }

    fn reserve(
        &mut self,
        _pool: &mut PagePool,
        ask: &ReserveAsk<'_>,
    ) -> Result<Reservation, Refusal> {
        Err(Refusal::Internal(Error::internal(format!(
            "{}: ordinary reserves nothing before admission",
            ask.request
        ))))
    }

    fn publish(&mut self, request: RequestId) -> Result<Publication> {
        Err(Error::internal(format!(
            "{request}: an ordinary import is published into its admitted request, never on its own"
        )))
    }

    fn wait_expired(
        &mut self,
        _: RequestId,
        _: Timestamp,
        _: Option<Timestamp>,
        _: Duration,
    ) -> bool {
        false
    }

    fn own_wait_over(&self, _waited: Duration, _max_wait: Duration) -> bool {
        false
    }
}
