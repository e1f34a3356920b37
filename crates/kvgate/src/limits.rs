//! The limits on what the facade reads from outside (config, environment, command line, scenario files,
//! traces) and the one conversion of a number of seconds into a `Duration`. Each check runs before anything is
//! converted or allocated, so hostile input is an error naming the field and the limit, never a panic, an
//! out-of-memory abort or a hang. The engine checks its own limits again (`EngineParams::validate`), since it
//! is embeddable without the facade.

use std::time::Duration;

/// The longest time any field, option or variable accepts, in seconds: 10^9 s, about 31.7 years. Every time
/// the facade reads goes through [`duration_s`], which refuses more.
pub const SECONDS_MAX: f64 = 1e9;

/// Longest context in tokens (`model.max_model_len`) at most, and so the longest prompt any input may ask
/// for: 16 Mi tokens.
pub(crate) const MODEL_LEN_MAX: u32 = 1 << 24;

/// Sessions of an agents run at most. Every session's whole context is held in memory by the driver and by
/// the engine of each policy, which run side by side: 100 000 one-turn sessions under the four policies took
/// 50 s and 5.8 GB on a 2-core machine.
pub(crate) const AGENTS_MAX: u32 = 100_000;

/// Turns of an agents run at most, all sessions together (`n_agents * turns`).
pub(crate) const AGENT_TURNS_TOTAL_MAX: u64 = 100_000;

/// Sessions of a live agents run (`--executor reference`) at most: the reference model computes every token
/// on the CPU, so a live run is sized for minutes (1 600 one-turn sessions took 94 s a policy on a 2-core
/// machine, 100 took 3 s).
pub(crate) const LIVE_AGENTS_MAX: u32 = 256;

/// Turns of a live agents run at most, all sessions together (`n_agents * turns`; the default live run has
/// 64).
pub(crate) const LIVE_AGENT_TURNS_TOTAL_MAX: u64 = 1_024;

/// Steps of a scenario at most (`max_steps`): every step is a record of the trace it prints.
pub(crate) const SCENARIO_STEPS_MAX: u32 = 1_000_000;

/// Bytes of one trace line at most (1 MiB, the hash ids of an 8 Mi-token prompt); a longer line is refused
/// before it is read whole.
pub(crate) const TRACE_LINE_BYTES_MAX: usize = 1 << 20;

/// Engines of a cluster replay (`--engines`) at most: each holds its own pool and page storage, all stepped
/// on one thread.
pub(crate) const ENGINES_MAX: u32 = 64;

/// `--time-scale` of a replay at most.
pub(crate) const TIME_SCALE_MAX: f64 = 1e6;

/// What [`duration_s`] allows for a time that may be zero.
pub(crate) const SECONDS_ALLOWED: &str = "a number of seconds from 0 to 1e9";

/// What [`duration_s`] allows for a time that must be positive.
pub(crate) const POSITIVE_SECONDS_ALLOWED: &str = "a number of seconds above 0, at most 1e9";

/// `value` seconds as a `Duration`, when it is a finite number from 0 (above 0 when `positive`) to
/// [`SECONDS_MAX`]; otherwise what is allowed ([`SECONDS_ALLOWED`] or [`POSITIVE_SECONDS_ALLOWED`]), for the
/// caller's error, which names the field.
pub fn duration_s(value: f64, positive: bool) -> Result<Duration, &'static str> {
    let allowed = if positive {
        POSITIVE_SECONDS_ALLOWED
    } else {
        SECONDS_ALLOWED
    };
    let in_range = value.is_finite()
        && value <= SECONDS_MAX
        && if positive { value > 0.0 } else { value >= 0.0 };
    if in_range {
        // -0.0 is in range; the conversion reads it as zero.
        Duration::try_from_secs_f64(value.abs()).map_err(|_| allowed)
    } else {
        Err(allowed)
    }
}

/// `value` as a message shows it: as Rust writes it, but in exponent form when huge (`1e300`, not 301 digits).
pub fn show(value: f64) -> String {
    if value.is_finite() && value.abs() >= 1e15 {
        format!("{value:e}")
    } else {
        value.to_string()
    }
}

#[cfg(test)]
mod tests;
