//! Copy engines: modeled timing and fault injection of the inline engine, real bytes and drain semantics of
//! the threaded engine, and the reordering engine's seeded schedule and its check of writes by others (L2).
//! The device engine's tests are in `device_tests.rs`.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real copies and read their environment"
)]

use std::sync::Arc;
use std::time::Duration;

use kv_pool::Timestamp;
use kv_pool::{HostStorage, PageId, PageStorage};

use crate::copy::{
    CopyCompletion, CopyEngine, CopyJob, CopyModel, CopyOutcome, Fault, InlineCopyEngine,
    ReorderingCopyEngine, ThreadedCopyEngine,
};
use crate::page_buf::PageBuf;

pub(super) const BYTES_PER_PAGE: usize = 256;

pub(super) fn page_bytes(seed: u8) -> PageBuf {
    (0..BYTES_PER_PAGE)
        .map(|i| (i as u8).wrapping_mul(3) ^ seed)
        .collect::<Vec<u8>>()
        .into()
}

pub(super) fn restore_job(rank: u32, pages: &[u32]) -> CopyJob {
    CopyJob {
        rank,
        pages: pages
            .iter()
            .map(|&p| (page_bytes(p as u8), PageId(p)))
            .collect(),
    }
}

fn storage() -> Arc<HostStorage> {
    Arc::new(HostStorage::new(2, 16, BYTES_PER_PAGE).unwrap())
}

fn model() -> CopyModel {
    // 256 bytes per ms, plus 1 ms.
    CopyModel {
        bandwidth_bytes_per_s: 256_000.0,
        latency: Duration::from_millis(1),
    }
}

fn at_ms(ms: u64) -> Timestamp {
    Timestamp::ZERO.after(Duration::from_millis(ms))
}

#[test]
fn inline_engine_completes_after_modeled_time_and_writes_at_completion() {
    let storage = storage();
    let mut copies =
        InlineCopyEngine::with_storage(model(), Arc::clone(&storage) as Arc<dyn PageStorage>);
    let job = copies.submit(restore_job(1, &[3, 4]), at_ms(10)).unwrap();
    assert_eq!(copies.next_completion_at(), Some(at_ms(13)));
    assert!(copies.poll(at_ms(12)).is_empty());
    assert_eq!(
        storage.with_page(1, PageId(3), |b| b[1]).unwrap(),
        0,
        "nothing written before completion"
    );
    let done = copies.poll(at_ms(13));
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].job, job);
    assert_eq!(done[0].outcome, CopyOutcome::Done);
    assert_eq!(
        storage.with_page(1, PageId(4), <[u8]>::to_vec).unwrap(),
        page_bytes(4).to_vec()
    );
    assert_eq!(copies.n_in_flight(), 0);
}

#[test]
fn inline_engine_faults_fail_delay_and_evict() {
    let mut copies = InlineCopyEngine::new(model(), BYTES_PER_PAGE as u64);
    copies.inject(Fault::FailNext { rank: 1 });
    copies.inject(Fault::DelayNext {
        rank: 0,
        by: Duration::from_millis(5),
    });
    let delayed = copies
        .submit(restore_job(0, &[1]), Timestamp::ZERO)
        .unwrap();
    let failed = copies
        .submit(restore_job(1, &[1]), Timestamp::ZERO)
        .unwrap();
    let evicted = copies
        .submit(restore_job(1, &[2]), Timestamp::ZERO)
        .unwrap();
    copies.inject(Fault::EvictDestination(PageId(2)));
    // Rank 1's two copies share its link: the second ends at 4 ms.
    let done = copies.poll(at_ms(4));
    assert_eq!(done.len(), 2);
    let by_job = |id| done.iter().find(|c: &&CopyCompletion| c.job == id).unwrap();
    assert!(matches!(by_job(failed).outcome, CopyOutcome::Failed { .. }));
    assert_eq!(by_job(evicted).invalidated, vec![PageId(2)]);
    assert_eq!(copies.next_completion_at(), Some(at_ms(7)));
    copies.cancel(delayed);
    assert!(
        copies.poll(at_ms(6)).is_empty(),
        "a cancelled copy still drains until its completion time"
    );
    assert_eq!(copies.poll(at_ms(7))[0].outcome, CopyOutcome::Cancelled);
}

#[test]
fn inline_copies_on_one_rank_share_its_link_and_ranks_copy_in_parallel() {
    // 2 ms a copy (1 page at 256 bytes a ms, plus 1 ms): two on rank 0 end at 2 and 4 ms, one on rank 1 at 2.
    let mut copies = InlineCopyEngine::new(model(), BYTES_PER_PAGE as u64);
    let first = copies
        .submit(restore_job(0, &[1]), Timestamp::ZERO)
        .unwrap();
    let second = copies
        .submit(restore_job(0, &[2]), Timestamp::ZERO)
        .unwrap();
    let other_rank = copies
        .submit(restore_job(1, &[3]), Timestamp::ZERO)
        .unwrap();
    let done: Vec<super::CopyJobId> = copies.poll(at_ms(2)).iter().map(|c| c.job).collect();
    assert_eq!(done.len(), 2);
    assert!(done.contains(&first) && done.contains(&other_rank));
    assert_eq!(copies.next_completion_at(), Some(at_ms(4)));
    assert_eq!(copies.poll(at_ms(4))[0].job, second);
    // An idle link starts a copy at once.
    let later = copies.submit(restore_job(0, &[4]), at_ms(10)).unwrap();
    assert_eq!(copies.next_completion_at(), Some(at_ms(12)));
    assert_eq!(copies.poll(at_ms(12))[0].job, later);
}

#[test]
fn threaded_engine_restores_real_bytes() {
    let storage = storage();
    let mut copies =
        ThreadedCopyEngine::new(Arc::clone(&storage) as Arc<dyn PageStorage>, 3).unwrap();
    copies
        .submit(restore_job(0, &[1, 2, 3, 4, 5]), Timestamp::ZERO)
        .unwrap();
    copies
        .submit(restore_job(1, &[6]), Timestamp::ZERO)
        .unwrap();
    let done = copies.wait_all();
    assert_eq!(done.len(), 2);
    assert!(done.iter().all(|c| c.outcome == CopyOutcome::Done));
    for page in 1..=5 {
        assert_eq!(
            storage.with_page(0, PageId(page), <[u8]>::to_vec).unwrap(),
            page_bytes(page as u8).to_vec()
        );
    }
    assert_eq!(
        storage.with_page(1, PageId(6), <[u8]>::to_vec).unwrap(),
        page_bytes(6).to_vec()
    );
    assert_eq!(copies.n_in_flight(), 0);
}

#[test]
fn threaded_engine_reports_failures_and_cancelled_jobs_once() {
    let storage = storage();
    let mut copies =
        ThreadedCopyEngine::new(Arc::clone(&storage) as Arc<dyn PageStorage>, 2).unwrap();
    // Page 0 is the null page: the write fails.
    let failing = copies
        .submit(restore_job(0, &[1, 0]), Timestamp::ZERO)
        .unwrap();
    let cancelled = copies
        .submit(
            restore_job(1, &(1..16).collect::<Vec<_>>()),
            Timestamp::ZERO,
        )
        .unwrap();
    copies.cancel(cancelled);
    let mut done = copies.wait_all();
    done.sort_by_key(|c| c.job);
    assert_eq!(done.len(), 2);
    assert_eq!(done[0].job, failing);
    assert!(
        matches!(&done[0].outcome, CopyOutcome::Failed { reason } if reason.contains("null page")),
        "{done:?}"
    );
    assert_eq!(done[1].outcome, CopyOutcome::Cancelled);
    assert!(copies.poll(Timestamp::ZERO).is_empty());
}

/// Host storage whose writes to one page panic: a bug in a storage backend.
#[derive(Debug)]
struct PanickingStorage {
    inner: Arc<HostStorage>,
    panics_on: PageId,
}

impl PageStorage for PanickingStorage {
    fn n_ranks(&self) -> u32 {
        self.inner.n_ranks()
    }
    fn n_pages(&self) -> u32 {
        self.inner.n_pages()
    }
    fn bytes_per_page(&self) -> usize {
        self.inner.bytes_per_page()
    }
    fn read(&self, rank: u32, page: PageId, dst: &mut [u8]) -> kv_pool::Result<()> {
        self.inner.read(rank, page, dst)
    }
    fn write(&self, rank: u32, page: PageId, src: &[u8]) -> kv_pool::Result<()> {
        assert!(page != self.panics_on, "a storage bug on page {}", page.0);
        self.inner.write(rank, page, src)
    }
    fn copy(&self, rank: u32, src: PageId, dst: PageId) -> kv_pool::Result<()> {
        self.inner.copy(rank, src, dst)
    }
}

/// Issue 36, item 12: a worker whose storage panics fails that job's copy instead of losing the task, so the
/// job completes (failed, naming the panic), the other jobs complete, and `wait_all` returns.
#[test]
fn a_panicking_worker_fails_its_copy_and_never_hangs_the_engine() {
    let storage = Arc::new(PanickingStorage {
        inner: storage(),
        panics_on: PageId(3),
    });
    let mut copies = ThreadedCopyEngine::new(storage as Arc<dyn PageStorage>, 1).unwrap();
    let failing = copies
        .submit(restore_job(0, &[2, 3, 4]), Timestamp::ZERO)
        .unwrap();
    let fine = copies
        .submit(restore_job(1, &[5, 6]), Timestamp::ZERO)
        .unwrap();
    // Polled with a deadline, so a regression fails here instead of hanging in `wait_all`.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut done: Vec<CopyCompletion> = Vec::new();
    while done.len() < 2 && std::time::Instant::now() < deadline {
        done.extend(copies.poll(Timestamp::ZERO));
        std::thread::sleep(Duration::from_millis(1));
    }
    done.sort_by_key(|completion| completion.job);
    assert_eq!(done.len(), 2, "{done:?}");
    assert_eq!((done[0].job, done[1].job), (failing, fine));
    assert!(
        matches!(&done[0].outcome, CopyOutcome::Failed { reason }
            if reason.contains("panicked writing page 3") && reason.contains("a storage bug on page 3")),
        "{done:?}"
    );
    assert_eq!(done[1].outcome, CopyOutcome::Done);
    // The worker survived the panic: a later job still runs.
    let later = copies
        .submit(restore_job(0, &[7]), Timestamp::ZERO)
        .unwrap();
    let after = copies.wait_all();
    assert_eq!(after.len(), 1);
    assert_eq!(
        (after[0].job, &after[0].outcome),
        (later, &CopyOutcome::Done)
    );
}

fn reordering(seed: u64) -> (Arc<HostStorage>, ReorderingCopyEngine) {
    let storage = storage();
    let engine = ReorderingCopyEngine::new(storage.clone(), 2, seed).unwrap();
    (storage, engine)
}

/// Polls until every job reported, returning the completions in the order they came.
fn poll_all(engine: &mut ReorderingCopyEngine) -> Vec<CopyCompletion> {
    let mut completions = Vec::new();
    for _ in 0..100 {
        if engine.n_in_flight() == 0 {
            break;
        }
        completions.extend(engine.poll(Timestamp::ZERO));
    }
    assert_eq!(
        engine.n_in_flight(),
        0,
        "every job reports within its schedule"
    );
    completions
}

#[test]
fn reordering_engine_copies_real_bytes_and_reorders_completions_from_its_seed() {
    let mut orders = Vec::new();
    for seed in 0..8 {
        let (storage, mut engine) = reordering(seed);
        let ids: Vec<_> = (1..7)
            .map(|page| {
                engine
                    .submit(restore_job(0, &[page]), Timestamp::ZERO)
                    .unwrap()
            })
            .collect();
        assert_eq!(engine.in_flight_pages().len(), 6);
        let completions = poll_all(&mut engine);
        assert!(
            completions
                .iter()
                .all(|c| matches!(c.outcome, CopyOutcome::Done))
        );
        let order: Vec<_> = completions.iter().map(|c| c.job).collect();
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(sorted, ids, "each job reports exactly once");
        for page in 1..7u32 {
            let mut bytes = vec![0u8; BYTES_PER_PAGE];
            storage.read(0, PageId(page), &mut bytes).unwrap();
            assert_eq!(bytes[..], page_bytes(page as u8)[..], "page {page}");
        }
        assert!(engine.write_violations().is_empty());
        // The same seed gives the same order, whatever the threads did.
        let (_, mut again) = reordering(seed);
        for page in 1..7 {
            let _id = again.submit(restore_job(0, &[page]), Timestamp::ZERO);
        }
        let again: Vec<_> = poll_all(&mut again).iter().map(|c| c.job).collect();
        assert_eq!(again, order, "seed {seed}");
        orders.push(order);
    }
    assert!(
        orders
            .iter()
            .any(|order| order.windows(2).any(|w| w[0] > w[1])),
        "some seed reports out of submission order: {orders:?}"
    );
}

#[test]
fn reordering_engine_reports_a_page_written_by_someone_else_while_it_owns_it() {
    // Written before the copy starts: the page was reused between submission and start.
    let (storage, mut engine) = reordering(1);
    let _id = engine
        .submit(restore_job(0, &[3]), Timestamp::ZERO)
        .unwrap();
    storage.write(0, PageId(3), &page_bytes(99)).unwrap();
    let _done = poll_all(&mut engine);
    let violations = engine.write_violations();
    assert!(
        violations
            .first()
            .is_some_and(|v| v.contains("page 3") && v.contains("submission")),
        "{violations:?}"
    );
    // Written after the copy landed and before its completion was reported.
    for seed in 0..32 {
        let (storage, mut engine) = reordering(seed);
        let _id = engine
            .submit(restore_job(0, &[4]), Timestamp::ZERO)
            .unwrap();
        let mut completions = Vec::new();
        let mut written = false;
        for _ in 0..100 {
            completions.extend(engine.poll(Timestamp::ZERO));
            if engine.n_in_flight() == 0 {
                break;
            }
            // Give the worker threads time to land the copy while the completion is held back.
            let mut bytes = vec![0u8; BYTES_PER_PAGE];
            for _ in 0..50 {
                storage.read(0, PageId(4), &mut bytes).unwrap();
                if bytes[..] == page_bytes(4)[..] {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            if !written && bytes[..] == page_bytes(4)[..] {
                storage.write(0, PageId(4), &page_bytes(77)).unwrap();
                written = true;
            }
        }
        assert_eq!(completions.len(), 1);
        if written {
            let violations = engine.write_violations();
            assert!(
                violations.iter().any(|v| v.contains("page 4")),
                "seed {seed}: {violations:?}"
            );
            return;
        }
    }
    panic!("no seed held a completion back after its copy landed");
}

#[test]
fn reordering_engine_cancelled_and_failed_jobs_drain_before_they_report() {
    for seed in 0..16 {
        let (_storage, mut engine) = reordering(seed);
        let a = engine
            .submit(restore_job(0, &[1, 2]), Timestamp::ZERO)
            .unwrap();
        let b = engine
            .submit(restore_job(1, &[3]), Timestamp::ZERO)
            .unwrap();
        engine.inject_fault(Fault::FailNext { rank: 0 }).unwrap();
        let c = engine
            .submit(restore_job(0, &[5]), Timestamp::ZERO)
            .unwrap();
        engine.cancel(a);
        engine
            .inject_fault(Fault::FailInFlight { rank: 1 })
            .unwrap();
        // Cancelled and failed jobs keep their pages until they report.
        assert_eq!(engine.in_flight_pages().len(), 4);
        let completions = engine.wait_all();
        assert_eq!(engine.n_in_flight(), 0);
        let outcome = |id| {
            completions
                .iter()
                .find(|c| c.job == id)
                .map(|c| c.outcome.clone())
                .unwrap()
        };
        assert_eq!(outcome(a), CopyOutcome::Cancelled, "seed {seed}");
        assert!(
            matches!(outcome(b), CopyOutcome::Failed { .. }),
            "seed {seed}"
        );
        assert!(
            matches!(outcome(c), CopyOutcome::Failed { .. }),
            "seed {seed}"
        );
        assert!(engine.write_violations().is_empty());
    }
    let (_storage, mut engine) = reordering(0);
    let refused = engine.inject_fault(Fault::EvictDestination(PageId(1)));
    assert!(refused.is_err_and(|e| e.to_string().contains("failures only")));
}
