//! Bench: one admission step with a blocked head on a full pool and one pending restore, as the waiting queue
//! grows from 10 to 100 000. The head is a restore whose ticket the ledger refuses for pressure (polled once
//! per step); everyone behind it is an ordinary request. Prints progress on stderr and one JSON line of
//! medians (`step_ns_waiting_10`, `step_ns_waiting_500`, `step_ns_waiting_100000`) on stdout.
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::disallowed_methods,
    reason = "a bench binary reports on stdout and stderr"
)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use std::convert::Infallible;

use admission::{
    AdmissionHost, Admit, Candidate, FallbackCause, HostState, QueuePolicy, StepContext,
    WaitingQueue, schedule_step,
};
use kv_pool::{CacheGroup, Geometry, GroupKind, PagePool};
use kv_pool::{RequestId, Timestamp};
use reservation::{Ledger, LedgerConfig, RestoreSpec};

/// The queues, the ledger and the pool, and answers from a dense table: request 0 is the restore, everyone
/// else is cold.
struct Host {
    waiting: WaitingQueue,
    ready: WaitingQueue,
    ledger: Ledger,
    pool: PagePool,
    head: Candidate,
}

impl AdmissionHost for Host {
    type Error = Infallible;

    fn state(&mut self) -> HostState<'_> {
        HostState {
            waiting: &mut self.waiting,
            ready: &mut self.ready,
            ledger: Some(&mut self.ledger),
            pool: &mut self.pool,
        }
    }

    fn examine(&mut self, req: RequestId, _free_slots: u32) -> Result<Candidate, Infallible> {
        Ok(if req.0 == 0 {
            self.head
        } else {
            Candidate::Cold { need_pages: 1 }
        })
    }

    fn admit(&mut self, _admit: Admit) -> Result<bool, Infallible> {
        Ok(true)
    }

    fn fall_back(&mut self, _req: RequestId, _cause: &FallbackCause) -> Result<u32, Infallible> {
        Ok(1)
    }
}

fn median_step_ns(n_waiting: u64, iterations: u32, repetitions: usize) -> f64 {
    let group = CacheGroup {
        kind: GroupKind::Full,
        bytes_per_page: 4096,
    };
    let geometry = Geometry::new(vec![group], 16, 1, 1 << 20).expect("geometry");
    let mut pool = PagePool::new(1 + 4096).expect("pool");
    let _full = pool.allocate(4096).expect("fill the pool");
    let config = LedgerConfig {
        max_running_slots: 256,
        // Long enough that the restore never expires during the run.
        restore_max_wait: Duration::from_secs(1 << 30),
    };
    let ledger = Ledger::new(geometry.clone(), config);
    let mut waiting = WaitingQueue::new(QueuePolicy::Fcfs);
    for id in 0..=n_waiting {
        waiting.push(RequestId(id), 0).expect("new");
    }
    let mut host = Host {
        waiting,
        ready: WaitingQueue::new(QueuePolicy::Fcfs),
        ledger,
        pool,
        head: Candidate::RestoreNeedsTicket(RestoreSpec::for_geometry(&geometry, 4096, 8192, 2048)),
    };
    let ctx = StepContext {
        running_requests: 64,
        ..StepContext::default()
    };
    let mut samples: Vec<f64> = Vec::with_capacity(repetitions);
    for repetition in 0..repetitions {
        let start = Instant::now();
        for iteration in 0..iterations {
            let now = Timestamp(Duration::from_micros(u64::from(iteration)));
            let Ok(step) = schedule_step(&ctx, black_box(now), &mut host);
            assert!(step.blocked.is_some() && step.decisions.is_empty());
            black_box(step);
        }
        let ns = start.elapsed().as_nanos() as f64 / f64::from(iterations);
        eprintln!("waiting {n_waiting:>6}: repetition {repetition}: {ns:.0} ns/step");
        samples.push(ns);
    }
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn main() {
    let quick = std::env::args().any(|arg| arg == "--quick");
    let (iterations, repetitions) = if quick { (2_000, 3) } else { (50_000, 7) };
    let mut figures = Vec::new();
    for n_waiting in [10u64, 500, 100_000] {
        let ns = median_step_ns(n_waiting, iterations, repetitions);
        figures.push(format!("\"step_ns_waiting_{n_waiting}\": {ns:.1}"));
    }
    println!("{{{}}}", figures.join(", "));
}
