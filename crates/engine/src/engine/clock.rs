//! The engine's clock (L1), injected: the same step loop runs on a simulated clock (time advances by each
//! step's duration and jumps to the next event when nothing runs) or on the wall clock (time is read from a
//! monotonic clock; an idle step waits briefly instead of jumping, so copies and arrivals come in real time).
//! The engine's decisions read only its `now`, which comes from here.

use std::time::{Duration, Instant};

use kv_pool::Timestamp;

/// Longest wait of an idle step on the wall clock: the next step polls copies and arrivals again.
pub const WALL_IDLE_WAIT: Duration = Duration::from_millis(1);

/// Where the engine's time comes from.
pub trait Clock: Send {
    /// The clock's name for reports (`simulated`, `wall`).
    fn name(&self) -> &'static str;

    /// The time at the start of a step; `now` is the engine's last time (the result is never earlier).
    fn step_start(&mut self, now: Timestamp) -> Timestamp;

    /// The time after a step that started at `now` and took `duration` (modeled or measured).
    fn after_step(&mut self, now: Timestamp, duration: Duration) -> Timestamp;

    /// Nothing can run before `next` (an arrival, a modeled copy completion, a timeout): the time to go on
    /// from. A simulated clock jumps there; the wall clock waits for it, at most [`WALL_IDLE_WAIT`].
    fn idle_until(&mut self, now: Timestamp, next: Timestamp) -> Timestamp;
}

/// The simulated clock: deterministic, the default.
#[derive(Clone, Copy, Debug, Default)]
pub struct SimClock;

impl Clock for SimClock {
    fn name(&self) -> &'static str {
        "simulated"
    }

    fn step_start(&mut self, now: Timestamp) -> Timestamp {
        now
    }

    fn after_step(&mut self, now: Timestamp, duration: Duration) -> Timestamp {
        now.after(duration.max(Duration::from_nanos(1)))
    }

    fn idle_until(&mut self, now: Timestamp, next: Timestamp) -> Timestamp {
        now.max(next)
    }
}

/// The wall clock: the time since the clock was made, from a monotonic clock.
#[derive(Clone, Copy, Debug)]
pub struct WallClock {
    start: Instant,
}

impl WallClock {
    /// A wall clock reading zero now.
    pub fn new() -> WallClock {
        #[allow(
            clippy::disallowed_methods,
            reason = "the wall clock is the one place the engine reads real time (L1)"
        )]
        let start = Instant::now();
        WallClock { start }
    }

    fn read(&self, now: Timestamp) -> Timestamp {
        now.max(Timestamp(self.start.elapsed()))
    }
}

impl Default for WallClock {
    fn default() -> Self {
        WallClock::new()
    }
}

impl Clock for WallClock {
    fn name(&self) -> &'static str {
        "wall"
    }

    fn step_start(&mut self, now: Timestamp) -> Timestamp {
        self.read(now)
    }

    fn after_step(&mut self, now: Timestamp, _duration: Duration) -> Timestamp {
        self.read(now)
    }

    fn idle_until(&mut self, now: Timestamp, next: Timestamp) -> Timestamp {
        let now = self.read(now);
        let wait = next.since(now).min(WALL_IDLE_WAIT);
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
        self.read(now)
    }
}
