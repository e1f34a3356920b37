//! The device copy engine: the same scenarios on the host-backed stand-in (`fake_*`, in CI) and on a real
//! GPU (`cuda_*`, skipped, saying so, without a driver), then what only the stand-in can show: transfers
//! batched per run of pages, the pinned staging bound, staging off the engine thread, one stream per rank,
//! accesses ordered by the events of their pages, and every error path keeping pages and staging held until
//! the device says the transfer is over (issue 36, items 3 to 7 and 9).

#![allow(
    clippy::disallowed_methods,
    reason = "tests bound their waits on the wall clock"
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use kv_pool::{
    CudaStorage, Device, DeviceStorage, FakeDevice, FakeFault, PageId, PageStorage, Timestamp,
};

use super::tests::{BYTES_PER_PAGE, page_bytes, restore_job};
use crate::copy::{
    CopyCompletion, CopyEngine, CopyJob, CopyOutcome, CudaCopyEngine, DeviceCopyEngine,
    StagingLimits,
};

type Fake = DeviceCopyEngine<FakeDevice>;

/// A stand-in device of 2 ranks x `n_pages`, and an engine staging `chunk_pages` pages per chunk, 2 chunks
/// per rank.
fn fake(n_pages: u32, chunk_pages: usize) -> (Arc<DeviceStorage<FakeDevice>>, Fake) {
    let storage = Arc::new(DeviceStorage::fake(2, n_pages, BYTES_PER_PAGE).unwrap());
    let limits = StagingLimits {
        chunk_bytes: chunk_pages * BYTES_PER_PAGE,
        chunks_per_rank: 2,
    };
    let copies = DeviceCopyEngine::with_staging(Arc::clone(&storage), limits).unwrap();
    (storage, copies)
}

/// A CUDA engine over 2 ranks x `n_pages`; `None` when the test skipped (printed and logged).
fn cuda(test: &str, n_pages: u32) -> Option<(Arc<CudaStorage>, CudaCopyEngine)> {
    if !kv_pool::gpu_test_gate(test).unwrap() {
        return None;
    }
    let storage = Arc::new(CudaStorage::new(0, 2, n_pages, BYTES_PER_PAGE).unwrap());
    let copies = CudaCopyEngine::new(Arc::clone(&storage)).unwrap();
    Some((storage, copies))
}

fn read_back(storage: &dyn PageStorage, rank: u32, page: u32) -> Vec<u8> {
    let mut bytes = vec![0u8; BYTES_PER_PAGE];
    storage.read(rank, PageId(page), &mut bytes).unwrap();
    bytes
}

/// Polls until nothing is in flight (at most 10 s), returning the completions in order.
fn poll_until_idle<D: Device>(copies: &mut DeviceCopyEngine<D>) -> Vec<CopyCompletion> {
    let started = Instant::now();
    let mut done = Vec::new();
    while copies.n_in_flight() > 0 && started.elapsed() < Duration::from_secs(10) {
        done.extend(copies.poll(Timestamp::ZERO));
        std::thread::yield_now();
    }
    assert_eq!(copies.n_in_flight(), 0, "jobs never completed: {done:?}");
    done
}

/// A restore writes the storage's own pages of its rank only, completions come by polling, a bad page
/// fails its job, and a cancelled job is reported only once nothing of it can write.
fn check_restores<D: Device>(storage: &DeviceStorage<D>, copies: &mut DeviceCopyEngine<D>) {
    let pages: Vec<u32> = (1..=6).chain([9, 10, 20]).collect();
    copies
        .submit(restore_job(1, &pages), Timestamp::ZERO)
        .unwrap();
    for round in 0..4u32 {
        let pages: Vec<u32> = (21..60).filter(|p| p % 4 == round).collect();
        copies
            .submit(restore_job(0, &pages), Timestamp::ZERO)
            .unwrap();
    }
    let done = poll_until_idle(copies);
    assert_eq!(done.len(), 5, "every job reported once: {done:?}");
    assert!(
        done.iter().all(|c| c.outcome == CopyOutcome::Done),
        "{done:?}"
    );
    assert!(copies.in_flight_pages().is_empty());
    for &page in &pages {
        assert_eq!(read_back(storage, 1, page), page_bytes(page as u8).to_vec());
        assert_eq!(read_back(storage, 0, page), vec![0u8; BYTES_PER_PAGE]);
    }
    for page in 21..60u32 {
        assert_eq!(read_back(storage, 0, page), page_bytes(page as u8).to_vec());
    }
    let null = CopyJob {
        rank: 0,
        pages: vec![(page_bytes(1), PageId(0))],
    };
    copies.submit(null, Timestamp::ZERO).unwrap();
    let done = copies.wait_all();
    assert!(
        matches!(&done[0].outcome, CopyOutcome::Failed { reason } if reason.contains("null page")),
        "{done:?}"
    );
    let job = copies
        .submit(restore_job(0, &[1, 2, 3]), Timestamp::ZERO)
        .unwrap();
    copies.cancel(job);
    let mut done = copies.poll(Timestamp::ZERO);
    done.extend(copies.wait_all());
    assert_eq!(done.len(), 1);
    assert!(
        matches!(done[0].outcome, CopyOutcome::Cancelled | CopyOutcome::Done),
        "{done:?}"
    );
    storage.write(0, PageId(2), &[7u8; BYTES_PER_PAGE]).unwrap();
    assert_eq!(read_back(storage, 0, 2), vec![7u8; BYTES_PER_PAGE]);
}

#[test]
fn fake_restores_write_their_pages_poll_fail_and_cancel() {
    let (storage, mut copies) = fake(64, 4);
    storage.device().set_delay(Duration::from_micros(200));
    check_restores(&storage, &mut copies);
    assert!(
        storage.device().violations().is_empty(),
        "{:?}",
        storage.device().violations()
    );
}

#[test]
fn cuda_restores_write_their_pages_poll_fail_and_cancel() {
    let Some((storage, mut copies)) =
        cuda("cuda_restores_write_their_pages_poll_fail_and_cancel", 64)
    else {
        return;
    };
    check_restores(&storage, &mut copies);
}

#[test]
fn cuda_pinned_upload_baseline_moves_its_bytes() {
    let Some((storage, mut copies)) = cuda("cuda_pinned_upload_baseline_moves_its_bytes", 64)
    else {
        return;
    };
    let (elapsed, moved) = copies
        .time_pinned_upload(0, PageId(1), 8, 64 * BYTES_PER_PAGE)
        .unwrap();
    assert_eq!(moved, 64 * BYTES_PER_PAGE);
    assert!(elapsed > Duration::ZERO);
    assert_eq!(read_back(&*storage, 0, 8), vec![0x5A; BYTES_PER_PAGE]);
}

/// Cancel with the job's transfers provably still queued (issue 36, item 1): a hold queued on rank 0's
/// stream before the job (`Device::hold_stream`, a blocking host function on a GPU) keeps its transfers
/// queued, and the device itself says its three pages are in flight before and after `cancel`. The job is
/// then not reported and its pages stay listed; once the hold is dropped it is reported `Cancelled` and
/// the device says nothing is in flight.
fn check_cancel_while_queued<D: Device>(
    storage: &DeviceStorage<D>,
    copies: &mut DeviceCopyEngine<D>,
) {
    let hold = storage.device().hold_stream(0).unwrap();
    let job = copies
        .submit(restore_job(0, &[3, 4, 5]), Timestamp::ZERO)
        .unwrap();
    let started = Instant::now();
    while storage.n_pages_in_flight(0).unwrap() < 3 && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        storage.n_pages_in_flight(0).unwrap(),
        3,
        "the job's transfers are queued behind the hold"
    );
    copies.cancel(job);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        storage.n_pages_in_flight(0).unwrap(),
        3,
        "the device still holds the job's transfers after cancel"
    );
    assert!(
        copies.poll(Timestamp::ZERO).is_empty(),
        "reported while queued"
    );
    let mut listed = copies.in_flight_pages();
    listed.sort_unstable();
    assert_eq!(listed, [PageId(3), PageId(4), PageId(5)]);
    drop(hold);
    let done = copies.wait_all();
    assert_eq!(done.len(), 1, "{done:?}");
    assert_eq!(done[0].outcome, CopyOutcome::Cancelled);
    assert_eq!(storage.n_pages_in_flight(0).unwrap(), 0);
    assert!(copies.in_flight_pages().is_empty());
}

#[test]
fn fake_cancel_while_queued_drains_before_it_is_reported() {
    let (storage, mut copies) = fake(64, 4);
    check_cancel_while_queued(&storage, &mut copies);
    let device = storage.device();
    assert!(device.violations().is_empty(), "{:?}", device.violations());
}

#[test]
fn cuda_cancel_while_queued_drains_before_it_is_reported() {
    let Some((storage, mut copies)) =
        cuda("cuda_cancel_while_queued_drains_before_it_is_reported", 64)
    else {
        return;
    };
    check_cancel_while_queued(&storage, &mut copies);
}

/// One transfer per run of consecutive destination pages within a chunk (issue 36, item 4).
#[test]
fn fake_transfers_are_one_per_run_of_consecutive_pages() {
    let (storage, mut copies) = fake(64, 8);
    let pages = [1, 2, 3, 7, 8, 9, 20, 21, 22, 23, 24];
    copies
        .submit(restore_job(0, &pages), Timestamp::ZERO)
        .unwrap();
    let done = copies.wait_all();
    assert_eq!(done[0].outcome, CopyOutcome::Done);
    // Chunk one holds pages 1,2,3,7,8,9,20,21 (runs 1-3, 7-9, 20-21); chunk two 22-24 (one run).
    assert_eq!(storage.device().stats().transfers, 4);
    for page in pages {
        assert_eq!(
            read_back(&*storage, 0, page),
            page_bytes(page as u8).to_vec()
        );
    }
}

/// A restore larger than the staging pool streams through it: pinned memory never exceeds the bound, no
/// chunk is refilled or freed while a transfer reads it, and `submit` returns at once, the staging thread
/// doing the host copies (issue 36, items 5 and 6).
#[test]
fn fake_staging_is_bounded_reused_only_when_drained_and_off_the_engine_thread() {
    let (storage, mut copies) = fake(200, 4);
    let device = storage.device();
    device.pause(0, true);
    let pages: Vec<u32> = (1..200).collect();
    let started = Instant::now();
    copies
        .submit(restore_job(0, &pages), Timestamp::ZERO)
        .unwrap();
    copies
        .submit(restore_job(0, &[1]), Timestamp::ZERO)
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "submit blocked on staging"
    );
    std::thread::sleep(Duration::from_millis(20));
    assert!(
        copies.poll(Timestamp::ZERO).is_empty(),
        "nothing can finish on a stopped stream"
    );
    assert_eq!(copies.in_flight_pages().len(), 200);
    device.set_delay(Duration::from_micros(100));
    device.pause(0, false);
    let done = copies.wait_all();
    assert_eq!(done.len(), 2);
    let bound = 2 * 4 * BYTES_PER_PAGE;
    assert!(
        device.stats().pinned_peak_bytes <= bound,
        "pinned peak {} over the bound {bound}",
        device.stats().pinned_peak_bytes
    );
    assert!(device.violations().is_empty(), "{:?}", device.violations());
    for page in 2..200u32 {
        assert_eq!(
            read_back(&*storage, 0, page),
            page_bytes(page as u8).to_vec()
        );
    }
    drop(copies);
    assert_eq!(
        storage.device().stats().pinned_live_bytes,
        0,
        "staging freed with the engine"
    );
}

/// Each rank has its own stream: a stopped rank holds back none of the other's restores, and an access to
/// a page no restore writes does not wait for restores in flight (issue 36, items 3 and 9).
#[test]
fn fake_ranks_stream_independently_and_accesses_wait_only_for_their_pages() {
    let (storage, mut copies) = fake(32, 4);
    storage.device().pause(0, true);
    copies
        .submit(restore_job(0, &[1, 2, 3]), Timestamp::ZERO)
        .unwrap();
    copies
        .submit(restore_job(1, &[1, 2, 3]), Timestamp::ZERO)
        .unwrap();
    let started = Instant::now();
    let mut done = Vec::new();
    while done.is_empty() && started.elapsed() < Duration::from_secs(10) {
        done.extend(copies.poll(Timestamp::ZERO));
    }
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].rank, 1, "rank 1 finished while rank 0 is stopped");
    // The executor reads and writes other pages of the stopped rank without waiting.
    storage.write(0, PageId(5), &[9; BYTES_PER_PAGE]).unwrap();
    assert_eq!(read_back(&*storage, 0, 5), vec![9; BYTES_PER_PAGE]);
    assert_eq!(copies.n_in_flight(), 1);
    storage.device().pause(0, false);
    assert_eq!(copies.wait_all().len(), 1);
    assert!(
        storage.device().violations().is_empty(),
        "{:?}",
        storage.device().violations()
    );
}

/// Cancel, with the copy surely in flight: the job is not reported while its queued transfer can still
/// write, it stages nothing more, and its pages stay listed until then (drain before release, item 1).
#[test]
fn fake_cancelled_job_stops_staging_and_drains_before_it_is_reported() {
    let (storage, mut copies) = fake(64, 2);
    let device = storage.device();
    device.pause(0, true);
    let pages: Vec<u32> = (1..41).collect();
    let job = copies
        .submit(restore_job(0, &pages), Timestamp::ZERO)
        .unwrap();
    // Wait until both chunks are queued: the staging thread then blocks for a free chunk.
    let started = Instant::now();
    while device.n_queued(0) < 4 && started.elapsed() < Duration::from_secs(10) {
        std::thread::yield_now();
    }
    assert_eq!(
        device.n_queued(0),
        4,
        "two chunks queued (a transfer and an event each)"
    );
    copies.cancel(job);
    std::thread::sleep(Duration::from_millis(20));
    assert!(
        copies.poll(Timestamp::ZERO).is_empty(),
        "reported while its copies may write"
    );
    assert_eq!(copies.in_flight_pages().len(), 40);
    device.pause(0, false);
    let done = copies.wait_all();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].outcome, CopyOutcome::Cancelled);
    assert!(
        device.stats().transfers < 20,
        "a cancelled job stopped staging: {:?}",
        device.stats()
    );
    assert!(device.violations().is_empty(), "{:?}", device.violations());
}

/// A refused enqueue or event, or a failed query, fails the job, reported only after its stream
/// synchronized; the next job is unaffected (item 7).
#[test]
fn fake_refused_enqueue_record_and_query_fail_the_job_after_the_stream_drained() {
    for fault in [FakeFault::Enqueue, FakeFault::Record, FakeFault::Query] {
        let (storage, mut copies) = fake(32, 4);
        let device = storage.device();
        device.set_delay(Duration::from_millis(2));
        device.inject(fault);
        copies
            .submit(restore_job(0, &[1, 2, 5, 6]), Timestamp::ZERO)
            .unwrap();
        let done = poll_until_idle(&mut copies);
        assert!(
            matches!(&done[0].outcome, CopyOutcome::Failed { reason } if reason.contains("injected")),
            "{fault:?}: {done:?}"
        );
        assert_eq!(
            device.n_queued(0),
            0,
            "{fault:?}: reported with transfers queued"
        );
        copies
            .submit(restore_job(0, &[1, 2]), Timestamp::ZERO)
            .unwrap();
        assert_eq!(copies.wait_all()[0].outcome, CopyOutcome::Done, "{fault:?}");
        assert!(
            device.violations().is_empty(),
            "{fault:?}: {:?}",
            device.violations()
        );
    }
}

/// A transfer that fails leaves its stream failed: the device cannot say the job is over, so the job stays
/// in flight with its pages listed and its staging held, `wait_all` returns without it, and it is reported
/// failed once the device recovers (item 7).
#[test]
fn fake_failed_transfer_keeps_pages_and_staging_held_until_the_device_says_it_is_over() {
    let (storage, mut copies) = fake(32, 2);
    let device = storage.device();
    device.inject(FakeFault::Transfer);
    copies
        .submit(restore_job(0, &[1, 2, 3, 4, 5]), Timestamp::ZERO)
        .unwrap();
    assert!(
        copies.wait_all().is_empty(),
        "wait_all reported a job the device cannot finish"
    );
    assert_eq!(copies.in_flight_pages().len(), 5);
    assert!(device.stats().pinned_live_bytes > 0, "staging held");
    device.recover(0);
    let done = poll_until_idle(&mut copies);
    assert!(
        matches!(&done[0].outcome, CopyOutcome::Failed { reason } if reason.contains("Transfer")),
        "{done:?}"
    );
    assert!(device.violations().is_empty(), "{:?}", device.violations());
}

/// A panic below the staging thread, with transfers of its chunk already queued, fails that job instead of
/// hanging the engine: the job is reported failed, naming the panic, only once its queued transfers ran;
/// the chunk they read is neither freed nor refilled under them; the rank's next job runs (issue 36,
/// item 12, for the device engine).
#[test]
fn fake_panic_while_staging_fails_the_job_after_its_transfers_ran() {
    let (storage, mut copies) = fake(32, 4);
    let device = storage.device();
    let hold = device.hold_stream(0).unwrap();
    device.inject(FakeFault::Panic);
    copies
        .submit(restore_job(0, &[1, 2, 5, 6]), Timestamp::ZERO)
        .unwrap();
    let started = Instant::now();
    while storage.n_pages_in_flight(0).unwrap() + device.n_queued(0) < 3
        && started.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        device.n_queued(0),
        3,
        "the hold and the chunk's two runs queued"
    );
    std::thread::sleep(Duration::from_millis(20));
    assert!(
        copies.poll(Timestamp::ZERO).is_empty(),
        "reported while its transfers are queued"
    );
    assert_eq!(copies.in_flight_pages().len(), 4);
    drop(hold);
    let done = poll_until_idle(&mut copies);
    assert!(
        matches!(&done[0].outcome, CopyOutcome::Failed { reason } if reason.contains("Panic")),
        "{done:?}"
    );
    assert_eq!(device.n_queued(0), 0);
    copies
        .submit(restore_job(0, &[1, 2]), Timestamp::ZERO)
        .unwrap();
    assert_eq!(copies.wait_all()[0].outcome, CopyOutcome::Done);
    assert_eq!(read_back(&*storage, 0, 2), page_bytes(2).to_vec());
    drop(copies);
    assert!(device.violations().is_empty(), "{:?}", device.violations());
    assert_eq!(
        device.stats().pinned_live_bytes,
        0,
        "staging freed with the engine"
    );
}

/// Dropping the engine with copies in flight frees no staging under a transfer.
#[test]
fn fake_engine_dropped_with_copies_in_flight_frees_staging_after_they_ran() {
    let (storage, mut copies) = fake(64, 4);
    storage.device().set_delay(Duration::from_micros(300));
    let pages: Vec<u32> = (1..40).collect();
    copies
        .submit(restore_job(0, &pages), Timestamp::ZERO)
        .unwrap();
    copies
        .submit(restore_job(1, &pages), Timestamp::ZERO)
        .unwrap();
    drop(copies);
    assert!(
        storage.device().violations().is_empty(),
        "{:?}",
        storage.device().violations()
    );
    assert_eq!(storage.device().stats().pinned_live_bytes, 0);
}

#[test]
fn device_engine_refuses_an_empty_staging_bound_and_a_bad_rank() {
    let storage = Arc::new(DeviceStorage::fake(1, 8, BYTES_PER_PAGE).unwrap());
    for limits in [
        StagingLimits {
            chunk_bytes: 0,
            chunks_per_rank: 2,
        },
        StagingLimits {
            chunk_bytes: 1024,
            chunks_per_rank: 0,
        },
    ] {
        let error = DeviceCopyEngine::with_staging(Arc::clone(&storage), limits).unwrap_err();
        assert!(error.to_string().contains("positive"), "{error}");
    }
    let mut copies = DeviceCopyEngine::new(storage).unwrap();
    let error = copies
        .submit(restore_job(1, &[1]), Timestamp::ZERO)
        .unwrap_err();
    assert!(error.to_string().contains("rank 1"), "{error}");
    let short = CopyJob {
        rank: 0,
        pages: vec![(vec![1u8; 3].into(), PageId(1))],
    };
    copies.submit(short, Timestamp::ZERO).unwrap();
    let done = copies.wait_all();
    assert!(
        matches!(&done[0].outcome, CopyOutcome::Failed { reason } if reason.contains("holds 3 bytes")),
        "{done:?}"
    );
}
