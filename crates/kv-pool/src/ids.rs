//! The vocabulary every layer shares, kept at the bottom so that no crate depends on another for it: request
//! ids, the injected clock's timestamps and the admission order.

use std::time::Duration;

/// Identifies one request (one turn of a session) for its whole life in the engine. Ids may be reused after a
/// request is freed; nothing a freed request held carries over to a new one with the same id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId(pub u64);

impl RequestId {
    /// The number the caller gave (`RequestSpec::new`'s `id`).
    pub fn get(self) -> u64 {
        self.0
    }
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "req-{}", self.0)
    }
}

/// A point on the injected clock: time since the clock's origin. No library crate reads a real clock; callers
/// pass `now` in, so every decision is deterministic and testable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub Duration);

impl Timestamp {
    /// The clock's origin.
    pub const ZERO: Timestamp = Timestamp(Duration::ZERO);

    /// `secs` whole seconds after the origin (`engine.now().after(d)` is `d` after now).
    pub fn from_secs(secs: u64) -> Timestamp {
        Timestamp(Duration::from_secs(secs))
    }

    /// Seconds since the origin.
    pub fn as_secs_f64(self) -> f64 {
        self.0.as_secs_f64()
    }

    /// Time elapsed from `earlier` to `self`, zero if `earlier` is later.
    pub fn since(self, earlier: Timestamp) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// This timestamp moved `by` later, saturating at the clock's end (`Duration::MAX`, about 584 billion
    /// years) instead of overflowing: a clock jumped that far stays there.
    pub fn after(self, by: Duration) -> Timestamp {
        Timestamp(self.0.saturating_add(by))
    }
}

/// The timestamp `since_origin` after the clock's origin.
impl From<Duration> for Timestamp {
    fn from(since_origin: Duration) -> Timestamp {
        Timestamp(since_origin)
    }
}

/// A request's place in the admission order: lower first. FCFS uses `priority == 0` and the arrival sequence;
/// priority scheduling puts the priority first. Capacity waiters hold back only restores later in this order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AdmissionOrder {
    /// Scheduling priority, lower first (0 under FCFS).
    pub priority: u32,
    /// Arrival sequence number, lower first.
    pub seq: u64,
}

impl AdmissionOrder {
    /// The FCFS order of the `seq`-th arrival.
    pub fn fcfs(seq: u64) -> AdmissionOrder {
        AdmissionOrder { priority: 0, seq }
    }
}
