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

/// Captures (`Checkpoint`s; anything in the tests) on their way to the store, in the order they were taken,
/// which is the order they arrive in.
#[derive(Debug)]
pub(crate) struct CaptureLink<T = Checkpoint> {
    /// When the link is free again.
    free_at: Timestamp,
    /// Each capture with the time it reaches the store, earliest first.
    in_flight: VecDeque<(Timestamp, RequestId, T)>,
}

impl<T> Default for CaptureLink<T> {
    fn default() -> Self {
        CaptureLink {
            free_at: Timestamp::ZERO,
            in_flight: VecDeque::new(),
        }
    }
}

impl<T> CaptureLink<T> {
    /// Sends `checkpoint` of `request`, taken at `now`, whose copy lasts `duration`: it starts once the
    /// captures before it are through.
    pub(crate) fn send(
        &mut self,
        now: Timestamp,
        duration: Duration,
        request: RequestId,
        checkpoint: T,
    ) {
        let arrives_at = self.free_at.max(now).after(duration);
        self.free_at = arrives_at;
        self.in_flight.push_back((arrives_at, request, checkpoint));
    }

    /// The next capture that has reached the store by `now`, if any.
    pub(crate) fn arrived(&mut self, now: Timestamp) -> Option<(RequestId, T)> {
        if self.in_flight.front()?.0 > now {
            return None;
        }
        let (_, request, checkpoint) = self.in_flight.pop_front()?;
        Some((request, checkpoint))
    }

    /// Every capture still in flight, in order (a shutdown delivers them all).
    pub(crate) fn take_all(&mut self) -> Vec<(RequestId, T)> {
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use kv_pool::{RequestId, Timestamp};
    use proptest::prelude::*;

    use super::CaptureLink;

    fn at(micros: u64) -> Timestamp {
        Timestamp(Duration::from_micros(micros))
    }

    proptest! {
        /// Captures reach the store in the order they were sent, none before its copy could end, none
        /// overlapping another on the link, and each as soon as the link allows; nothing is lost.
        #[test]
        fn prop_captures_arrive_in_order_one_after_another_and_none_is_lost(
            sends in proptest::collection::vec((0u64..1_000, 0u64..500), 0..40),
            polls in proptest::collection::vec(0u64..2_000, 0..40),
        ) {
            let mut link = CaptureLink::default();
            let mut now = 0u64;
            let mut expected = Vec::new();
            let mut free_at = 0u64;
            for (i, &(gap, micros)) in sends.iter().enumerate() {
                now += gap;
                link.send(at(now), Duration::from_micros(micros), RequestId(i as u64), i);
                free_at = free_at.max(now) + micros;
                expected.push(free_at);
                prop_assert_eq!(link.free_at(), at(free_at));
            }
            let mut arrived = Vec::new();
            let mut t = 0u64;
            for &step in &polls {
                t += step;
                while let Some((request, index)) = link.arrived(at(t)) {
                    prop_assert_eq!(request, RequestId(index as u64));
                    prop_assert!(expected[index] <= t, "capture {} arrived before its copy ended", index);
                    arrived.push(index);
                }
                if let Some(next) = link.next_arrival_at() {
                    prop_assert!(next > at(t), "a due capture was held back");
                }
            }
            let rest: Vec<usize> = link.take_all().into_iter().map(|(_, index)| index).collect();
            arrived.extend(rest);
            prop_assert_eq!(arrived, (0..sends.len()).collect::<Vec<_>>());
            prop_assert_eq!(link.len(), 0);
        }
    }
}
