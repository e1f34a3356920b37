//! `MeasuredCost`: what a live executor (one that computes on the wall clock) knows of its own costs, the
//! engine's input for offload and restore decisions: a token's measured recompute time and a host copy's
//! modeled time.

use std::time::Duration;

/// Modeled restore copy bandwidth from host memory to host memory.
const COPY_BYTES_PER_S: f64 = 10e9;
/// Modeled latency of one restore copy.
const COPY_LATENCY_S: f64 = 10e-6;

/// Tokens computed and wall seconds spent over every step so far.
#[derive(Clone, Copy, Debug, Default)]
pub struct MeasuredCost {
    tokens_computed: u64,
    seconds_spent: f64,
}

impl MeasuredCost {
    /// Counts a step that computed `tokens` tokens in `seconds` of wall time.
    pub fn record(&mut self, tokens: u64, seconds: f64) {
        self.tokens_computed += tokens;
        self.seconds_spent += seconds;
    }

    /// `n_tokens` at the measured seconds per token. Before the first step nothing is known, and a copy is
    /// taken to be cheaper than running the model (`Duration::MAX`).
    pub fn recompute_time(&self, n_tokens: u32) -> Duration {
        if self.tokens_computed == 0 {
            return Duration::MAX;
        }
        let s_per_token = self.seconds_spent / self.tokens_computed as f64;
        Duration::try_from_secs_f64(s_per_token * f64::from(n_tokens)).unwrap_or(Duration::MAX)
    }

    /// The modeled time of a host-to-host restore copy of `bytes`.
    pub fn copy_time(bytes: f64) -> Duration {
        Duration::from_secs_f64(COPY_LATENCY_S + bytes / COPY_BYTES_PER_S)
    }
}
