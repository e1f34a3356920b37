//! The device-to-host link captures travel on (issue 14, a realistic copy model). A capture reads its pages
//! when it is taken, but on the simulated clock its checkpoint reaches the store only once the copy out would
//! have finished: captures share the link first come first served, each taking `Executor::copy_time` of its
//! tokens. PCIe is full duplex, so captures contend with one another and not with restores, which travel the
//! other way (`InlineCopyEngine`'s per-rank links). On the wall clock the read itself is the copy, and a
//! capture reaches the store at once.

use std::collections::VecDeque;
use std::time::Duration;

use checkpoint_transfer::Checkpoint;
use kv_pool::{RequestId, Timestamp};

/// Captures on their way to the store, in the order they were taken (and so of their arrival).
#[derive(Debug, Default)]
pub(crate) struct CaptureLink {
    /// When the link is free again.
    free_at: Timestamp,
    /// Each capture with the time it reaches the store, earliest first.
    in_flight: VecDeque<(Timestamp, RequestId, Checkpoint)>,
}

impl CaptureLink {
    /// Sends `checkpoint` of `request`, taken at `now`, whose copy lasts `duration`: it starts once the
    /// captures before it are through. Returns when it reaches the store.
    pub(crate) fn send(
        &mut self,
        now: Timestamp,
        duration: Duration,
        request: RequestId,
        checkpoint: Checkpoint,
    ) -> Timestamp {
        let arrives_at = self.free_at.max(now).after(duration);
        self.free_at = arrives_at;
        self.in_flight.push_back((arrives_at, request, checkpoint));
        arrives_at
    }

    /// The next capture that has reached the store by `now`, if any.
    pub(crate) fn arrived(&mut self, now: Timestamp) -> Option<(RequestId, Checkpoint)> {
        if self.in_flight.front()?.0 > now {
            return None;
        }
        let (_, request, checkpoint) = self.in_flight.pop_front()?;
        Some((request, checkpoint))
    }

    /// Every capture still in flight, in order (a shutdown delivers them all).
    pub(crate) fn take_all(&mut self) -> Vec<(RequestId, Checkpoint)> {
        self.in_flight
            .drain(..)
            .map(|(_, request, checkpoint)| (request, checkpoint))
            .collect()
    }

    /// When the next capture reaches the store.
    pub(crate) fn next_arrival_at(&self) -> Option<Timestamp> {
        self.in_flight.front().map(|(at, _, _)| *at)
    }

    /// When the last capture sent reaches the store (or the link was last free).
    pub(crate) fn free_at(&self) -> Timestamp {
        self.free_at
    }

    /// Captures in flight.
    pub(crate) fn len(&self) -> usize {
        self.in_flight.len()
    }
}
