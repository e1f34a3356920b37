//! The engine's smaller owned parts: each holds the state of one job, so `Engine` lists its parts rather
//! than every counter (issue 28). The larger parts have files of their own: `table.rs` (the live requests),
//! `groups.rs` (the cache groups' plan), `restore_policy/` (the policy and its ledger).

use std::collections::BTreeMap;
use std::time::Duration;

use checkpoint_transfer::{CopyEngine, LayoutDescriptor, ResidentIndex, StoreLink};
use foldhash::HashMap;
use kv_pool::{AdmissionOrder, RequestId, Timestamp};

use super::capture_link::CaptureLink;
use super::clock::Clock;
use super::report::StepReport;
use crate::metrics::{RejectReason, RequestMetrics};
use crate::request::FinishedRequest;

/// The restore side: the copy engine, the checkpoint store, every import (staged, published and owned, or
/// draining after a cancel), the captures on their way to the store, and Q1's earliest unanswered lookup.
pub(super) struct Restores {
    pub(super) copies: Box<dyn CopyEngine>,
    /// The checkpoint store, inline (simulated clock) or on a thread of its own (wall clock).
    pub(super) store: StoreLink,
    /// Every import: staged (copying), published and owned, or draining after a cancel.
    pub(super) index: ResidentIndex,
    /// Captures on their way to the store (simulated clock).
    pub(super) captures: CaptureLink,
    /// The earliest request whose store lookup is unanswered: later cold requests wait behind it (Q1).
    pub(super) earliest_lookup: Option<AdmissionOrder>,
    /// The layout checkpoints are written for.
    pub(super) layout: LayoutDescriptor,
    /// Whether anything may check the bytes of a page: this engine's verification (E3, L5) or another run
    /// restoring from a store that outlives this process. When nothing may, the simulated executor's page
    /// content is not written (the bytes copied are then whatever the pages held), which changes no figure.
    pub(super) page_content_read: bool,
}

impl Restores {
    pub(super) fn new(
        copies: Box<dyn CopyEngine>,
        store: StoreLink,
        layout: LayoutDescriptor,
        page_content_read: bool,
    ) -> Restores {
        Restores {
            copies,
            store,
            index: ResidentIndex::new(layout.clone()),
            captures: CaptureLink::default(),
            earliest_lookup: None,
            layout,
            page_content_read,
        }
    }
}

/// Time as the engine sees it: the injected clock (L1), the engine's `now`, the wall time spent in steps
/// and the steps taken.
pub(super) struct StepTime {
    pub(super) source: Box<dyn Clock>,
    pub(super) now: Timestamp,
    pub(super) wall: Duration,
    pub(super) steps: u64,
}

impl StepTime {
    pub(super) fn new(source: Box<dyn Clock>) -> StepTime {
        StepTime {
            source,
            now: Timestamp::ZERO,
            wall: Duration::ZERO,
            steps: 0,
        }
    }

    /// A step begins: the clock says when (L1).
    pub(super) fn step_start(&mut self) {
        self.now = self.source.step_start(self.now);
    }

    /// Nothing to run before `at`: the clock idles until then.
    pub(super) fn idle_until(&mut self, at: Timestamp) {
        self.now = self.source.idle_until(self.now, at);
    }

    /// The executor took `duration` for the step's batch.
    pub(super) fn after_step(&mut self, duration: Duration) {
        self.now = self.source.after_step(self.now, duration);
    }

    /// A step ended, having taken `wall` of wall-clock time.
    pub(super) fn step_done(&mut self, wall: Duration) {
        self.steps += 1;
        self.wall += wall;
    }
}

/// The liveness watchdog (K3): when a request last produced a token or ended, and steps since.
#[derive(Default)]
pub(super) struct Watchdog {
    pub(super) last_progress: Timestamp,
    pub(super) steps_without_progress: u64,
}

impl Watchdog {
    /// A request produced a token or ended at `now`: the watchdog starts over.
    pub(super) fn progress(&mut self, now: Timestamp) {
        self.last_progress = now;
        self.steps_without_progress = 0;
    }

    /// One more step without progress; returns how many in a row.
    pub(super) fn step_without_progress(&mut self) -> u64 {
        self.steps_without_progress += 1;
        self.steps_without_progress
    }
}

/// Where new numbers come from: admission sequence numbers and checkpoint generations.
#[derive(Default)]
pub(super) struct Ids {
    pub(super) seq: u64,
    pub(super) generation: u64,
}

impl Ids {
    /// The next admission sequence number (0, 1, ...).
    pub(super) fn next_seq(&mut self) -> u64 {
        let seq = self.seq;
        self.seq += 1;
        seq
    }

    /// The next checkpoint generation (1, 2, ...).
    pub(super) fn next_generation(&mut self) -> u64 {
        self.generation += 1;
        self.generation
    }
}

/// What ended and what reports count: finished requests not yet taken, every request's metrics, requests
/// rejected because they can never run (K1), capacity waits started and pages verified (E3).
#[derive(Default)]
pub(super) struct Tally {
    pub(super) finished: Vec<FinishedRequest>,
    pub(super) done: Vec<RequestMetrics>,
    pub(super) rejected: BTreeMap<RejectReason, u32>,
    pub(super) capacity_waits_started: u32,
    pub(super) pages_verified: u64,
}

/// What one step leaves for the next, and the step's scratch.
pub(super) struct StepScratch {
    /// What happened between steps (a forced reset's preemptions and fallbacks): the next step's report
    /// starts from it.
    pub(super) between_steps: StepReport,
    /// Whether the last step was an isolated logits-only step (Q4).
    pub(super) last_step_isolated: bool,
    /// The tokens the executor's model sampled this step, taken by `sample` (L3).
    pub(super) model_tokens: HashMap<RequestId, u32>,
    /// One page's bytes, for verification by recompute (E3).
    pub(super) page_buf: Vec<u8>,
}

impl StepScratch {
    pub(super) fn new(page_bytes: usize) -> StepScratch {
        StepScratch {
            between_steps: StepReport::default(),
            last_step_isolated: false,
            model_tokens: HashMap::default(),
            page_buf: vec![0; page_bytes],
        }
    }
}
