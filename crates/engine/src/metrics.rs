//! Run metrics (the names are part of the interface, see architecture.md): kept per request as it runs and
//! aggregated per run. Restored tokens count as restored, never as local hits; recomputed tokens never count
//! as hits.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use kv_pool::{RequestId, Timestamp};

/// Why a restore fell back to recomputing its prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FallbackReason {
    /// The store had nothing for the request's prefix.
    NotInStore,
    /// The lookup was not answered within the lookup timeout (G2).
    LookupTimeout,
    /// The policy could not get the pages at once and admitted the request as an ordinary one (G1).
    NoPagesAtOnce,
    /// The checkpoint and its continuation can never fit the pool (R3).
    Impossible,
    /// The bounded wait expired (W1).
    WaitExpired,
    /// Every copy attempt failed (O7), after at most four lookups.
    CopyFailed,
    /// Restored pages were evicted before the consumer acquired them (pages-only: no ownership).
    EvictedBeforeAdmission,
    /// A forced prefix-cache reset released the ready import (X1).
    Reset,
    /// The checkpoint no longer matched the request (lost, superseded or invalid).
    Invalid,
    /// The request asked the store `RESTORE_LOOKUPS_MAX` times already (after preemptions or evictions, K3).
    LookupsExhausted,
}

impl FallbackReason {
    /// The reason's report name.
    pub fn name(self) -> &'static str {
        match self {
            FallbackReason::NotInStore => "not_in_store",
            FallbackReason::LookupTimeout => "lookup_timeout",
            FallbackReason::NoPagesAtOnce => "no_pages_at_once",
            FallbackReason::Impossible => "impossible",
            FallbackReason::WaitExpired => "wait_expired",
            FallbackReason::CopyFailed => "copy_failed",
            FallbackReason::EvictedBeforeAdmission => "evicted_before_admission",
            FallbackReason::Reset => "reset",
            FallbackReason::Invalid => "invalid",
            FallbackReason::LookupsExhausted => "lookups_exhausted",
        }
    }
}

impl fmt::Display for FallbackReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a request was rejected: it can never run (K1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RejectReason {
    /// Its prompt plus output is longer than the model's context (`max_model_len`).
    LongerThanModel,
    /// It needs more pages than the whole pool has.
    LargerThanPool,
}

impl RejectReason {
    /// The reason's report name.
    pub fn name(self) -> &'static str {
        match self {
            RejectReason::LongerThanModel => "longer_than_model",
            RejectReason::LargerThanPool => "larger_than_pool",
        }
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What one request did, kept exactly as it runs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestMetrics {
    /// The request.
    pub id: Option<RequestId>,
    /// Prompt length in tokens.
    pub prompt_tokens: u32,
    /// Prompt tokens found in the pool's prefix cache at (last) admission, not from a restore.
    pub prompt_tokens_local_hit: u32,
    /// Prompt tokens acquired from a restored checkpoint.
    pub prompt_tokens_restored: u32,
    /// Prompt tokens computed (including recomputation after a preemption).
    pub prompt_tokens_recomputed: u32,
    /// Whether this is a later turn of a session (its prefix may be in the store).
    pub is_later_turn: bool,
    /// Whether a restore served part of the prompt.
    pub restored: bool,
    /// Whether, at its first admission, every block a restore could cover was still resident.
    pub complete_local_hit: bool,
    /// Why a restore fell back, if it did.
    pub fallback: Option<FallbackReason>,
    /// Capacity waits started (R2 pressure refusals that began a wait).
    pub capacity_waits: u32,
    /// Longest capacity wait in seconds.
    pub longest_capacity_wait_s: f64,
    /// Times the request was preempted.
    pub preemptions: u32,
    /// Of which its computed KV was offloaded to the store first (`Preemption::Offload`).
    pub preemptions_offloaded: u32,
    /// Tokens it had computed when preempted that a later admission found in the local prefix cache.
    pub preempted_tokens_local_hit: u32,
    /// Tokens it had computed when preempted that a later admission restored from the store.
    pub preempted_tokens_restored: u32,
    /// Tokens it had computed when preempted that it computed again.
    pub preempted_tokens_recomputed: u32,
    /// Tokens the draft model replayed after restores whose checkpoints carried no draft state (H5).
    pub draft_replay_tokens: u32,
    /// Output tokens produced.
    pub decode_tokens: u32,
    /// Arrival time.
    pub arrival: Timestamp,
    /// Time of the first output token.
    pub first_token: Option<Timestamp>,
    /// Time it finished or was cancelled.
    pub finished: Option<Timestamp>,
    /// Whether it was cancelled rather than finished.
    pub cancelled: bool,
    /// Store lookups its restores sent (at most `RESTORE_LOOKUPS_MAX` on every path, K3).
    pub lookups: u32,
    /// Why it was rejected, when it could never run (K1); a rejected request also reads as cancelled.
    pub rejected: Option<RejectReason>,
}

impl RequestMetrics {
    /// Time to first token in seconds, if any token was produced.
    pub fn ttft_s(&self) -> Option<f64> {
        self.first_token
            .map(|first| first.since(self.arrival).as_secs_f64())
    }

    /// Time from arrival to finish in seconds, if finished.
    pub fn turn_s(&self) -> Option<f64> {
        self.finished
            .map(|end| end.since(self.arrival).as_secs_f64())
    }
}

/// Aggregated metrics of a run, by the names of architecture.md.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunMetrics {
    /// Policy name.
    pub policy: String,
    /// Requests finished (not cancelled).
    pub requests_finished: u32,
    /// Requests cancelled.
    pub requests_cancelled: u32,
    /// Prompt tokens of finished requests.
    pub prompt_tokens: u64,
    /// Of which found in the local prefix cache.
    pub prompt_tokens_local_hit: u64,
    /// Of which restored from the store.
    pub prompt_tokens_restored: u64,
    /// Prompt tokens computed (recomputation after preemption included, so it may exceed the misses).
    pub prompt_tokens_recomputed: u64,
    /// (local hit + restored) / prompt tokens, in percent.
    pub prompt_tokens_from_cache_pct: f64,
    /// Finished later turns.
    pub later_turns: u32,
    /// Of which served by a restore.
    pub later_turns_restored: u32,
    /// Of which found their whole restorable prefix still resident (no restore needed, not counted above).
    pub later_turns_local_hit: u32,
    /// Restore fallbacks by reason name.
    pub restore_fallbacks: BTreeMap<String, u32>,
    /// Requests rejected because they can never run (K1), by reason name.
    pub rejected_requests: BTreeMap<String, u32>,
    /// Capacity waits started.
    pub capacity_waits: u32,
    /// Longest capacity wait in seconds.
    pub longest_capacity_wait_s: f64,
    /// Preemptions of running requests for pages (Q6).
    pub preemptions: u32,
    /// Of which offloaded their computed KV to the store first.
    pub preemptions_offloaded: u32,
    /// Tokens computed before a preemption that came back from the local prefix cache.
    pub preempted_tokens_local_hit: u64,
    /// Tokens computed before a preemption that came back from the store.
    pub preempted_tokens_restored: u64,
    /// Tokens computed before a preemption that were computed again.
    pub preempted_tokens_recomputed: u64,
    /// Tokens the draft model replayed after restores whose checkpoints carried no draft state (H5).
    pub draft_replay_tokens: u64,
    /// Output tokens produced.
    pub decode_tokens: u64,
    /// Output tokens per simulated second.
    pub aggregate_decode_tok_s: f64,
    /// Mean arrival-to-finish time of finished requests.
    pub mean_turn_s: f64,
    /// Mean time to first token of finished requests.
    pub mean_ttft_s: f64,
    /// Median time to first token.
    pub p50_ttft_s: f64,
    /// 99th percentile time to first token.
    pub p99_ttft_s: f64,
    /// Pages still in use once the engine is idle (must be 0).
    pub leaked_pages: u32,
    /// Checkpoint captures the store could not write (disk full, read-only file system, permission); the
    /// engine went on without them.
    pub store_write_failures: u64,
    /// Simulated (engine clock) seconds.
    pub sim_seconds: f64,
    /// Real seconds spent stepping.
    pub wall_seconds: f64,
    /// Why the run stopped before every request ended (the liveness watchdog's `Error::Stalled`, naming the
    /// stuck requests); `None` for a run that finished. The other fields count what happened until then.
    pub stopped: Option<String>,
}

impl RunMetrics {
    /// Aggregates finished requests' metrics.
    pub fn aggregate<'a>(
        policy: &str,
        requests: impl IntoIterator<Item = &'a RequestMetrics>,
        sim: Duration,
        wall: Duration,
        leaked_pages: u32,
    ) -> RunMetrics {
        let mut run = RunMetrics {
            policy: policy.to_owned(),
            leaked_pages,
            sim_seconds: sim.as_secs_f64(),
            wall_seconds: wall.as_secs_f64(),
            ..RunMetrics::default()
        };
        let mut ttfts = Vec::new();
        let mut turn_total_s = 0.0;
        for request in requests {
            run.preemptions += request.preemptions;
            run.preemptions_offloaded += request.preemptions_offloaded;
            run.preempted_tokens_local_hit += u64::from(request.preempted_tokens_local_hit);
            run.preempted_tokens_restored += u64::from(request.preempted_tokens_restored);
            run.preempted_tokens_recomputed += u64::from(request.preempted_tokens_recomputed);
            run.draft_replay_tokens += u64::from(request.draft_replay_tokens);
            run.capacity_waits += request.capacity_waits;
            run.longest_capacity_wait_s = run
                .longest_capacity_wait_s
                .max(request.longest_capacity_wait_s);
            run.decode_tokens += u64::from(request.decode_tokens);
            if let Some(reason) = request.fallback {
                *run.restore_fallbacks
                    .entry(reason.name().to_owned())
                    .or_default() += 1;
            }
            let Some(turn_s) = request.turn_s() else {
                continue;
            };
            if request.rejected.is_some() {
                // Counted by the engine in `rejected_requests`, with the requests refused at submission.
                continue;
            }
            if request.cancelled {
                run.requests_cancelled += 1;
                continue;
            }
            run.requests_finished += 1;
            turn_total_s += turn_s;
            ttfts.extend(request.ttft_s());
            run.prompt_tokens += u64::from(request.prompt_tokens);
            run.prompt_tokens_local_hit += u64::from(request.prompt_tokens_local_hit);
            run.prompt_tokens_restored += u64::from(request.prompt_tokens_restored);
            run.prompt_tokens_recomputed += u64::from(request.prompt_tokens_recomputed);
            if request.is_later_turn {
                run.later_turns += 1;
                run.later_turns_restored += u32::from(request.restored);
                run.later_turns_local_hit +=
                    u32::from(!request.restored && request.complete_local_hit);
            }
        }
        if run.prompt_tokens > 0 {
            run.prompt_tokens_from_cache_pct = 100.0
                * (run.prompt_tokens_local_hit + run.prompt_tokens_restored) as f64
                / run.prompt_tokens as f64;
        }
        if run.requests_finished > 0 {
            run.mean_turn_s = turn_total_s / f64::from(run.requests_finished);
        }
        if run.sim_seconds > 0.0 {
            run.aggregate_decode_tok_s = run.decode_tokens as f64 / run.sim_seconds;
        }
        if !ttfts.is_empty() {
            run.mean_ttft_s = ttfts.iter().sum::<f64>() / ttfts.len() as f64;
        }
        ttfts.sort_by(f64::total_cmp);
        run.p50_ttft_s = percentile(&ttfts, 0.50);
        run.p99_ttft_s = percentile(&ttfts, 0.99);
        run
    }
}

/// The `q` quantile (nearest rank) of sorted `values`; 0 when empty.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}
