//! The ledger's configuration (running-slot limit, bounded restore wait with its environment override) and
//! the `Preflight` context a caller passes to each reservation.

use std::time::Duration;

use crate::error::{Error, Result};

/// Limits of the ledger.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LedgerConfig {
    /// Most requests running at once (admitted requests and tickets together).
    pub max_running_slots: u32,
    /// Longest a restore waits for capacity from its first refusal (W1); zero means recompute at once.
    pub restore_max_wait: Duration,
}

impl LedgerConfig {
    /// The default bounded wait: 60 s.
    pub const DEFAULT_RESTORE_MAX_WAIT: Duration = Duration::from_secs(60);
    /// The environment variable that overrides the bounded wait, in seconds.
    pub const RESTORE_MAX_WAIT_ENV: &'static str = "KVGATE_RESTORE_MAX_WAIT_S";

    /// A config with `max_running_slots` and the default 60 s wait.
    pub fn new(max_running_slots: u32) -> LedgerConfig {
        LedgerConfig {
            max_running_slots,
            restore_max_wait: Self::DEFAULT_RESTORE_MAX_WAIT,
        }
    }

    /// `new`, with the wait read from `KVGATE_RESTORE_MAX_WAIT_S` when it is set. Errors with `InvalidMaxWait`
    /// when the variable is not a non-negative number of seconds.
    pub fn from_env(max_running_slots: u32) -> Result<LedgerConfig> {
        let value = std::env::var(Self::RESTORE_MAX_WAIT_ENV).ok();
        Ok(LedgerConfig {
            max_running_slots,
            restore_max_wait: Self::parse_restore_max_wait(value.as_deref())?,
        })
    }

    /// The bounded wait given the environment variable's value: the default when absent, else its seconds
    /// (fractions allowed, `0` = recompute at once).
    pub fn parse_restore_max_wait(value: Option<&str>) -> Result<Duration> {
        let Some(value) = value else {
            return Ok(Self::DEFAULT_RESTORE_MAX_WAIT);
        };
        value
            .trim()
            .parse::<f64>()
            .ok()
            .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
            .ok_or_else(|| Error::InvalidMaxWait {
                value: value.to_owned(),
            })
    }
}

/// What else competes for the pool and the running slots this step (contract R2). The ledger adds the credits
/// of other tickets and the space of earlier capacity waiters itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Preflight {
    /// Requests running (admitted), not counting tickets that still hold their own slot.
    pub running_requests: u32,
    /// Remaining page needs of in-flight prefills that hold no ticket (cold admissions).
    pub unticketed_prefill_pages: u32,
    /// The admission watermark in pages.
    pub watermark_pages: u32,
    /// Whether other work is scheduled this step; the watermark applies only then.
    pub other_work_scheduled: bool,
}

impl Preflight {
    /// Pages of the watermark that apply: `watermark_pages` while other work is scheduled, else 0.
    pub fn applied_watermark_pages(&self) -> u32 {
        if self.other_work_scheduled {
            self.watermark_pages
        } else {
            0
        }
    }
}
