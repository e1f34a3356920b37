//! `ReorderingCopyEngine`: a `ThreadedCopyEngine` (real memcpy on worker threads) behind a seeded adversary,
//! for the L2 tests: no page is reused while a copy into it is in flight.
//!
//! Every job gets a schedule from the seed when it is submitted: it waits a number of polls before its work
//! reaches the worker threads, then its completion is held back a number of polls more, so completions come
//! out of submission order and long after the bytes landed (a job due at a poll whose threads have not
//! finished yet is waited for). The schedule depends only on the seed and the sequence of calls, never on
//! thread timing. The adversary uses every freedom the `CopyEngine` contract leaves it: a cancelled job keeps
//! its schedule and may still write all its pages (or none, by a coin flip) before it reports `Cancelled`, and
//! an injected failure writes every page before it reports `Failed`.
//!
//! It checks that nobody else writes a page while one of its jobs owns it: a restore's destination pages
//! must hold, when its work starts, the bytes they held at submission, and the job's bytes from the moment
//! its threads finished until its completion is reported. A page freed under a copy and reused by a request
//! breaks one of these as soon as either side writes it. What it finds is listed by
//! `CopyEngine::write_violations`, which `Engine::check_invariants` turns into an error.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use kv_pool::Timestamp;
use kv_pool::{PageId, PageStorage};

use crate::copy::{
    CopyCompletion, CopyEngine, CopyJob, CopyJobId, CopyOutcome, Fault, ThreadedCopyEngine,
};
use crate::error::{Error, Result};

/// The most polls a job waits before it starts, and again before its completion is reported.
pub(crate) const REORDER_DELAY_POLLS_MAX: u64 = 6;

/// The most violations kept (the first ones say what went wrong).
const VIOLATIONS_KEPT: usize = 32;

/// A threaded copy engine that delays and reorders completions from a seed and checks that no page it
/// copies is written by anyone else while it owns it (L2).
pub struct ReorderingCopyEngine {
    inner: ThreadedCopyEngine,
    storage: Arc<dyn PageStorage>,
    rng: u64,
    polls: u64,
    next_job: u64,
    jobs: BTreeMap<CopyJobId, Job>,
    /// Outer id of each job handed to the worker threads.
    by_inner: HashMap<CopyJobId, CopyJobId>,
    /// Ranks whose next submitted job fails (`Fault::FailNext`).
    fail_next: Vec<u32>,
    violations: Vec<String>,
}

impl std::fmt::Debug for ReorderingCopyEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReorderingCopyEngine")
            .field("inner", &self.inner)
            .field("polls", &self.polls)
            .field("n_in_flight", &self.jobs.len())
            .field("n_violations", &self.violations.len())
            .finish()
    }
}

#[derive(Debug)]
struct Job {
    rank: u32,
    /// Pool pages the job writes.
    pages: Vec<PageId>,
    /// Each destination page's bytes at submission.
    before: Vec<Option<blake3::Hash>>,
    /// The bytes it writes.
    expected: Vec<Option<blake3::Hash>>,
    /// The work, until it is handed to the threads.
    work: Option<CopyJob>,
    start_at: u64,
    release_at: u64,
    cancelled: bool,
    /// A cancelled job that has not started skips its work (else it writes every page anyway).
    skip_if_cancelled: bool,
    fail: bool,
    stage: Stage,
}

#[derive(Debug)]
enum Stage {
    Waiting,
    Running,
    /// The threads finished (or the work never ran): how it ended and whether every page was copied.
    Finished {
        outcome: CopyOutcome,
        copied: bool,
    },
}

impl ReorderingCopyEngine {
    /// An engine with `n_workers` threads (at least one) copying into `storage`, its schedule
    /// drawn from `seed`.
    pub fn new(storage: Arc<dyn PageStorage>, n_workers: usize, seed: u64) -> Result<Self> {
        Ok(Self {
            inner: ThreadedCopyEngine::new(Arc::clone(&storage), n_workers)?,
            storage,
            rng: seed,
            polls: 0,
            next_job: 0,
            jobs: BTreeMap::new(),
            by_inner: HashMap::new(),
            fail_next: Vec::new(),
            violations: Vec::new(),
        })
    }

    /// splitmix64.
    fn next_u64(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    fn page_hash(&self, rank: u32, page: PageId) -> Option<blake3::Hash> {
        let mut buffer = vec![0u8; self.storage.bytes_per_page()];
        self.storage
            .read(rank, page, &mut buffer)
            .ok()
            .map(|()| blake3::hash(&buffer))
    }

    fn violation(&mut self, text: String) {
        tracing::error!(violation = %text, "a copy's page was written by someone else");
        if self.violations.len() < VIOLATIONS_KEPT {
            self.violations.push(text);
        }
    }

    /// Checks the job's pages hold `expected` (`what` says when), noting each that does not.
    fn check_pages(&mut self, id: CopyJobId, expected_before: bool, what: &str) {
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        let expected = if expected_before {
            &job.before
        } else {
            &job.expected
        };
        let rank = job.rank;
        let pairs: Vec<(PageId, Option<blake3::Hash>)> = job
            .pages
            .iter()
            .copied()
            .zip(expected.iter().copied())
            .collect();
        for (page, expected) in pairs {
            let Some(expected) = expected else {
                continue;
            };
            if self.page_hash(rank, page) != Some(expected) {
                self.violation(format!(
                    "copy job {} (rank {rank}): page {} was written by someone else {what}",
                    id.0, page.0
                ));
            }
        }
    }

    /// Hands the job's work to the threads (or skips it: a cancelled job's coin flip), after checking that
    /// nobody wrote its destination pages since it was submitted.
    fn start(&mut self, id: CopyJobId) {
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        let Some(work) = job.work.take() else {
            return;
        };
        if job.cancelled && job.skip_if_cancelled {
            job.stage = Stage::Finished {
                outcome: CopyOutcome::Cancelled,
                copied: false,
            };
            return;
        }
        self.check_pages(id, true, "between the restore's submission and its start");
        match self.inner.submit(work, Timestamp::ZERO) {
            Ok(inner) => {
                self.by_inner.insert(inner, id);
                if let Some(job) = self.jobs.get_mut(&id) {
                    job.stage = Stage::Running;
                }
            }
            Err(error) => {
                if let Some(job) = self.jobs.get_mut(&id) {
                    job.stage = Stage::Finished {
                        outcome: CopyOutcome::Failed {
                            reason: error.to_string(),
                        },
                        copied: false,
                    };
                }
            }
        }
    }

    /// Records what the threads reported for a job.
    fn threads_finished(&mut self, completion: CopyCompletion) {
        let Some(id) = self.by_inner.remove(&completion.job) else {
            return;
        };
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        let (outcome, copied) = match completion.outcome {
            CopyOutcome::Done => {
                let outcome = if job.fail {
                    CopyOutcome::Failed {
                        reason: format!("injected failure of job {} on rank {}", id.0, job.rank),
                    }
                } else if job.cancelled {
                    CopyOutcome::Cancelled
                } else {
                    CopyOutcome::Done
                };
                (outcome, true)
            }
            other => (other, false),
        };
        job.stage = Stage::Finished { outcome, copied };
        if copied {
            self.check_pages(id, false, "while the restore's threads wrote it");
        }
    }

    /// Reports the job's completion, after checking its pages still hold what it copied.
    fn release(&mut self, id: CopyJobId) -> Option<CopyCompletion> {
        let copied = matches!(
            self.jobs.get(&id)?.stage,
            Stage::Finished { copied: true, .. }
        );
        if copied {
            self.check_pages(
                id,
                false,
                "after the copy and before its completion was reported",
            );
        }
        if !matches!(self.jobs.get(&id)?.stage, Stage::Finished { .. }) {
            return None;
        }
        let job = self.jobs.remove(&id)?;
        let Stage::Finished { outcome, .. } = job.stage else {
            return None;
        };
        Some(CopyCompletion {
            job: id,
            rank: job.rank,
            outcome,
            invalidated: Vec::new(),
        })
    }

    /// Starts every waiting job due by poll `at`, takes what the threads finished, waits for the threads of
    /// the jobs due for release, and releases those in a seeded order.
    fn advance_to(&mut self, at: u64) -> Vec<CopyCompletion> {
        let due_start: Vec<CopyJobId> = self
            .jobs
            .iter()
            .filter(|(_, job)| matches!(job.stage, Stage::Waiting) && job.start_at <= at)
            .map(|(id, _)| *id)
            .collect();
        for id in due_start {
            self.start(id);
        }
        for completion in self.inner.poll(Timestamp::ZERO) {
            self.threads_finished(completion);
        }
        let mut due: Vec<CopyJobId> = self
            .jobs
            .iter()
            .filter(|(_, job)| job.release_at <= at)
            .map(|(id, _)| *id)
            .collect();
        if due
            .iter()
            .any(|id| matches!(self.jobs[id].stage, Stage::Running))
        {
            for completion in self.inner.wait_all() {
                self.threads_finished(completion);
            }
        }
        // Fisher-Yates from the seed: completions due together come out in any order.
        for idx in (1..due.len()).rev() {
            let other = self.below(idx as u64 + 1) as usize;
            due.swap(idx, other);
        }
        due.into_iter().filter_map(|id| self.release(id)).collect()
    }
}

impl CopyEngine for ReorderingCopyEngine {
    fn submit(&mut self, job: CopyJob, _now: Timestamp) -> Result<CopyJobId> {
        let id = CopyJobId(self.next_job);
        self.next_job += 1;
        let rank = job.rank;
        let pages = job.pool_pages();
        let before = job
            .pages
            .iter()
            .map(|(_, page)| self.page_hash(rank, *page))
            .collect();
        let expected = job
            .pages
            .iter()
            .map(|(bytes, _)| Some(blake3::hash(bytes)))
            .collect();
        let fail = match self.fail_next.iter().position(|&r| r == rank) {
            Some(idx) => {
                self.fail_next.remove(idx);
                true
            }
            None => false,
        };
        // Start at the next poll at the earliest, so a job submitted during a step runs while later steps do.
        let start_at = self.polls + 1 + self.below(REORDER_DELAY_POLLS_MAX + 1);
        let release_at = start_at + self.below(REORDER_DELAY_POLLS_MAX + 1);
        let skip_if_cancelled = self.below(2) == 0;
        self.jobs.insert(
            id,
            Job {
                rank,
                pages,
                before,
                expected,
                work: Some(job),
                start_at,
                release_at,
                cancelled: false,
                skip_if_cancelled,
                fail,
                stage: Stage::Waiting,
            },
        );
        Ok(id)
    }

    fn poll(&mut self, _now: Timestamp) -> Vec<CopyCompletion> {
        self.polls += 1;
        self.advance_to(self.polls)
    }

    fn cancel(&mut self, job: CopyJobId) {
        // The adversary keeps the job's schedule: a cancelled copy may still write until it reports.
        if let Some(job) = self.jobs.get_mut(&job) {
            job.cancelled = true;
        }
    }

    fn n_in_flight(&self) -> usize {
        self.jobs.len()
    }

    fn wait_all(&mut self) -> Vec<CopyCompletion> {
        self.advance_to(u64::MAX)
    }

    fn in_flight_pages(&self) -> Vec<PageId> {
        self.jobs
            .values()
            .flat_map(|job| job.pages.iter().copied())
            .collect()
    }

    fn inject_fault(&mut self, fault: Fault) -> Result<()> {
        match fault {
            Fault::FailNext { rank } => self.fail_next.push(rank),
            Fault::FailJob(id) => {
                if let Some(job) = self.jobs.get_mut(&id) {
                    job.fail = true;
                }
            }
            Fault::FailInFlight { rank } => {
                for job in self.jobs.values_mut().filter(|job| job.rank == rank) {
                    job.fail = true;
                }
            }
            other => {
                return Err(Error::Unavailable(format!(
                    "cannot inject {other:?}: the reordering copy engine injects failures only"
                )));
            }
        }
        Ok(())
    }

    fn write_violations(&self) -> Vec<String> {
        self.violations.clone()
    }
}
