//! Tests of page storage: host round trips, alignment, copies, every error, concurrent writers; CUDA tests
//! (`cuda_*`) print that they skipped when no driver is present, and fail then if `KVGATE_REQUIRE_GPU=1`;
//! the same device storage logic on the host-backed stand-in (`fake_*`): page-event ordering and its errors.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use super::{
    CudaStorage, Device, DeviceStorage, FakeFault, HostStorage, PagePrefix, PageStorage,
    cuda_available,
};
use crate::error::Error;
use crate::error::Error::BufferLength;
use crate::page::PageId;

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Round trips, copies and errors every backend must agree on.
fn check_backend(storage: &dyn PageStorage) {
    let bytes_per_page = storage.bytes_per_page();
    let mut buffer = vec![0xAA; bytes_per_page];
    // Fresh pages, the null page included, read as zeros.
    storage.read(0, PageId::NULL, &mut buffer).unwrap();
    assert!(buffer.iter().all(|&b| b == 0));
    // Same page id on two ranks: separate shards.
    storage
        .write(0, PageId(1), &pattern(1, bytes_per_page))
        .unwrap();
    storage
        .write(1, PageId(1), &pattern(2, bytes_per_page))
        .unwrap();
    storage.read(0, PageId(1), &mut buffer).unwrap();
    assert_eq!(buffer, pattern(1, bytes_per_page));
    storage.read(1, PageId(1), &mut buffer).unwrap();
    assert_eq!(buffer, pattern(2, bytes_per_page));
    // Copies both ways along the shard; a self-copy is a no-op.
    storage.copy(0, PageId(1), PageId(3)).unwrap();
    storage.read(0, PageId(3), &mut buffer).unwrap();
    assert_eq!(buffer, pattern(1, bytes_per_page));
    storage
        .write(0, PageId(3), &pattern(3, bytes_per_page))
        .unwrap();
    storage.copy(0, PageId(3), PageId(2)).unwrap();
    storage.read(0, PageId(2), &mut buffer).unwrap();
    assert_eq!(buffer, pattern(3, bytes_per_page));
    storage.copy(0, PageId(2), PageId(2)).unwrap();
    storage.read(0, PageId(1), &mut buffer).unwrap();
    assert_eq!(buffer, pattern(1, bytes_per_page), "neighbours untouched");
    // A prefix reads the page's first bytes only; longer than a page or out of range is an error.
    let mut prefix = vec![0u8; bytes_per_page.min(10)];
    storage.read_prefix(0, PageId(1), &mut prefix).unwrap();
    assert_eq!(prefix, pattern(1, bytes_per_page)[..prefix.len()]);
    let mut whole = vec![0u8; bytes_per_page];
    storage.read_prefix(0, PageId(2), &mut whole).unwrap();
    assert_eq!(whole, pattern(3, bytes_per_page));
    let mut long = vec![0u8; bytes_per_page + 1];
    assert_eq!(
        storage.read_prefix(0, PageId(1), &mut long).unwrap_err(),
        Error::BufferLength {
            len: bytes_per_page + 1,
            bytes_per_page
        }
    );
    assert!(matches!(
        storage
            .read_prefix(0, PageId(storage.n_pages()), &mut prefix)
            .unwrap_err(),
        Error::PageOutOfRange { .. }
    ));
    // Errors.
    let n_pages = storage.n_pages();
    let n_ranks = storage.n_ranks();
    let page = pattern(0, bytes_per_page);
    assert_eq!(
        storage.write(0, PageId::NULL, &page).unwrap_err(),
        Error::NullPage
    );
    assert_eq!(
        storage.copy(0, PageId(1), PageId::NULL).unwrap_err(),
        Error::NullPage
    );
    assert_eq!(
        storage.write(n_ranks, PageId(1), &page).unwrap_err(),
        Error::RankOutOfRange {
            rank: n_ranks,
            n_ranks
        }
    );
    assert_eq!(
        storage.read(0, PageId(n_pages), &mut buffer).unwrap_err(),
        Error::PageOutOfRange {
            page: n_pages,
            n_pages
        }
    );
    assert_eq!(
        storage.copy(0, PageId(n_pages), PageId(1)).unwrap_err(),
        Error::PageOutOfRange {
            page: n_pages,
            n_pages
        }
    );
    assert_eq!(
        storage.write(0, PageId(1), &page[1..]).unwrap_err(),
        Error::BufferLength {
            len: bytes_per_page - 1,
            bytes_per_page
        }
    );
    let mut long = vec![0; bytes_per_page + 1];
    assert_eq!(
        storage.read(0, PageId(1), &mut long).unwrap_err(),
        Error::BufferLength {
            len: bytes_per_page + 1,
            bytes_per_page
        }
    );
    check_read_run(storage);
    check_write_prefix(storage);
}

/// `write_prefix` leaves the bytes `write` of the prefix padded with zeros left (what the reference model's
/// page view wrote before it moved here), over a page that held other bytes; a prefix longer than a page,
/// the null page, a bad rank or page is an error that writes nothing.
fn check_write_prefix(storage: &dyn PageStorage) {
    let bytes_per_page = storage.bytes_per_page();
    let mut whole = vec![0u8; bytes_per_page];
    for len in [0, 1, bytes_per_page / 2, bytes_per_page - 1, bytes_per_page] {
        storage
            .write(1, PageId(2), &pattern(40, bytes_per_page))
            .unwrap();
        let prefix = pattern(50, len);
        storage.write_prefix(1, PageId(2), &prefix).unwrap();
        storage.read(1, PageId(2), &mut whole).unwrap();
        let mut padded = prefix.clone();
        padded.resize(bytes_per_page, 0);
        assert_eq!(whole, padded, "a prefix of {len} bytes");
    }
    storage
        .write(0, PageId(2), &pattern(41, bytes_per_page))
        .unwrap();
    let long = pattern(0, bytes_per_page + 1);
    assert_eq!(
        storage.write_prefix(0, PageId(2), &long).unwrap_err(),
        Error::BufferLength {
            len: bytes_per_page + 1,
            bytes_per_page
        }
    );
    let short = &long[..1];
    assert_eq!(
        storage.write_prefix(0, PageId::NULL, short).unwrap_err(),
        Error::NullPage
    );
    let (n_ranks, n_pages) = (storage.n_ranks(), storage.n_pages());
    assert_eq!(
        storage.write_prefix(n_ranks, PageId(2), short).unwrap_err(),
        Error::RankOutOfRange {
            rank: n_ranks,
            n_ranks
        }
    );
    assert_eq!(
        storage.write_prefix(0, PageId(n_pages), short).unwrap_err(),
        Error::PageOutOfRange {
            page: n_pages,
            n_pages
        }
    );
    storage.read(0, PageId(2), &mut whole).unwrap();
    assert_eq!(
        whole,
        pattern(41, bytes_per_page),
        "refused prefixes wrote nothing"
    );
    storage.read(0, PageId::NULL, &mut whole).unwrap();
    assert!(whole.iter().all(|&b| b == 0), "the null page stays zeros");
}

/// A storage with only the required methods: the trait's defaults (`read_prefix`, `read_run`,
/// `write_prefix`) over `HostStorage`.
#[derive(Debug)]
struct Defaults(HostStorage);

impl PageStorage for Defaults {
    fn n_ranks(&self) -> u32 {
        self.0.n_ranks()
    }
    fn n_pages(&self) -> u32 {
        self.0.n_pages()
    }
    fn bytes_per_page(&self) -> usize {
        self.0.bytes_per_page()
    }
    fn read(&self, rank: u32, page: PageId, dst: &mut [u8]) -> crate::Result<()> {
        self.0.read(rank, page, dst)
    }
    fn write(&self, rank: u32, page: PageId, src: &[u8]) -> crate::Result<()> {
        self.0.write(rank, page, src)
    }
    fn copy(&self, rank: u32, src: PageId, dst: PageId) -> crate::Result<()> {
        self.0.copy(rank, src, dst)
    }
}

#[test]
fn the_default_prefix_and_run_methods_agree_with_the_backends() {
    for bytes_per_page in [8, 100] {
        check_backend(&Defaults(HostStorage::new(2, 4, bytes_per_page).unwrap()));
    }
}

/// The reference model's page view (issue 36, item 4): a smaller page in the first bytes of the pool's
/// pages reads and writes its own size, a write leaves the rest of the pool page zeroed, and on a device a
/// write is one transfer of the prefix's bytes with no read first; a view of 0 bytes or wider than the
/// pool's pages, and a buffer of the wrong size, are errors.
#[test]
fn a_page_prefix_view_writes_its_bytes_and_zeros_in_one_transfer() {
    let fake = DeviceStorage::fake(2, 8, 100).unwrap();
    let host = HostStorage::new(2, 8, 100).unwrap();
    let lines = HostStorage::new(2, 8, 40).unwrap();
    for storage in [&fake as &dyn PageStorage, &host, &lines] {
        let width = storage.bytes_per_page();
        for bad in [0, width + 1] {
            assert_eq!(
                PagePrefix::new(storage, bad).unwrap_err(),
                Error::BufferLength {
                    len: bad,
                    bytes_per_page: width
                }
            );
        }
        let view = PagePrefix::new(storage, 24).unwrap();
        assert_eq!(
            (view.n_ranks(), view.n_pages(), view.bytes_per_page()),
            (2, 8, 24)
        );
        storage.write(1, PageId(3), &pattern(1, width)).unwrap();
        view.write(1, PageId(3), &pattern(2, 24)).unwrap();
        let mut whole = vec![0u8; width];
        storage.read(1, PageId(3), &mut whole).unwrap();
        let mut expected = pattern(2, 24);
        expected.resize(width, 0);
        assert_eq!(whole, expected, "the prefix, then zeros");
        let mut page = vec![0u8; 24];
        view.read(1, PageId(3), &mut page).unwrap();
        assert_eq!(page, pattern(2, 24));
        view.write(1, PageId(4), &pattern(3, 24)).unwrap();
        let mut run = vec![0u8; 48];
        view.read_run(1, PageId(3), &mut run).unwrap();
        assert_eq!(run, [pattern(2, 24), pattern(3, 24)].concat());
        view.copy(1, PageId(4), PageId(5)).unwrap();
        view.read(1, PageId(5), &mut page).unwrap();
        assert_eq!(page, pattern(3, 24));
        let mut short = vec![0u8; 12];
        view.read_prefix(1, PageId(5), &mut short).unwrap();
        assert_eq!(short, pattern(3, 12));
        view.write_prefix(1, PageId(5), &pattern(4, 12)).unwrap();
        storage.read(1, PageId(5), &mut whole).unwrap();
        let mut expected = pattern(4, 12);
        expected.resize(width, 0);
        assert_eq!(whole, expected);
        for len in [23, 25] {
            let wrong = BufferLength {
                len,
                bytes_per_page: 24,
            };
            assert_eq!(
                view.write(1, PageId(3), &pattern(0, len)).unwrap_err(),
                wrong
            );
            assert_eq!(
                view.read(1, PageId(3), &mut vec![0; len]).unwrap_err(),
                wrong
            );
        }
        assert_eq!(
            view.write_prefix(1, PageId(3), &pattern(0, 25))
                .unwrap_err(),
            Error::BufferLength {
                len: 25,
                bytes_per_page: 24
            }
        );
        assert_eq!(
            view.write(1, PageId::NULL, &pattern(0, 24)).unwrap_err(),
            Error::NullPage
        );
        // A view as wide as the pool's pages is the storage itself.
        let full = PagePrefix::new(storage, width).unwrap();
        full.write(0, PageId(6), &pattern(5, width)).unwrap();
        storage.read(0, PageId(6), &mut whole).unwrap();
        assert_eq!(whole, pattern(5, width));
    }
    let before = fake.device().stats();
    let view = PagePrefix::new(&fake, 24).unwrap();
    for page in 1..8 {
        view.write(0, PageId(page), &pattern(page as u8, 24))
            .unwrap();
    }
    let after = fake.device().stats();
    assert_eq!(after.writes - before.writes, 7, "one transfer per write");
    assert_eq!(
        after.write_bytes - before.write_bytes,
        7 * 24,
        "only the prefixes crossed"
    );
    assert_eq!(after.reads, before.reads, "no read-modify-write");
    assert!(fake.device().violations().is_empty());
}

/// A run of pages reads what the pages read one by one; a bad length, rank or range is an error.
fn check_read_run(storage: &dyn PageStorage) {
    let (bytes_per_page, n_pages, n_ranks) = (
        storage.bytes_per_page(),
        storage.n_pages(),
        storage.n_ranks(),
    );
    let mut run = vec![0xAA; 3 * bytes_per_page];
    storage.read_run(0, PageId(1), &mut run).unwrap();
    let mut one_by_one = Vec::new();
    for page in 1..4 {
        let mut buffer = vec![0; bytes_per_page];
        storage.read(0, PageId(page), &mut buffer).unwrap();
        one_by_one.extend(buffer);
    }
    assert_eq!(run, one_by_one);
    // (Every length is a whole number of one-byte pages.)
    let not_whole = (bytes_per_page > 1).then_some(bytes_per_page + 1);
    for len in [0].into_iter().chain(not_whole) {
        let mut bad = vec![0; len];
        assert_eq!(
            storage.read_run(0, PageId(1), &mut bad).unwrap_err(),
            Error::BufferLength {
                len,
                bytes_per_page
            }
        );
    }
    let mut two = vec![0; 2 * bytes_per_page];
    assert_eq!(
        storage
            .read_run(0, PageId(n_pages - 1), &mut two)
            .unwrap_err(),
        Error::PageOutOfRange {
            page: n_pages,
            n_pages
        }
    );
    assert!(matches!(
        storage.read_run(0, PageId(u32::MAX), &mut two).unwrap_err(),
        Error::PageOutOfRange { .. }
    ));
    assert_eq!(
        storage.read_run(n_ranks, PageId(1), &mut two).unwrap_err(),
        Error::RankOutOfRange {
            rank: n_ranks,
            n_ranks
        }
    );
}

/// A run of pages on a device is one transfer, after the transfers queued into its pages (issue 36, item 4).
#[test]
fn fake_device_reads_a_run_in_one_transfer_after_its_pages_transfers() {
    let storage = DeviceStorage::fake(1, 8, 64).unwrap();
    storage.device().set_delay(Duration::from_millis(20));
    let staging = queue_pages(&storage, 2, 3, 20);
    let reads = storage.device().stats().reads;
    let mut run = vec![0; 4 * 64];
    storage.read_run(0, PageId(1), &mut run).unwrap();
    assert_eq!(storage.device().stats().reads, reads + 1, "one transfer");
    let expected: Vec<u8> = [
        vec![0; 64],
        pattern(20, 64),
        pattern(21, 64),
        pattern(22, 64),
    ]
    .concat();
    assert_eq!(run, expected, "the run waited for the queued transfers");
    assert!(
        storage.device().violations().is_empty(),
        "{:?}",
        storage.device().violations()
    );
    drop(staging);
}

#[test]
fn host_storage_round_trips_copies_and_errors() {
    // Line pages of atomic words (up to a cache line; whole and partial last words) and pages in their own
    // buffer.
    for bytes_per_page in [1, 7, 8, 13, 32, 64, 65, 100] {
        let storage = HostStorage::new(2, 4, bytes_per_page).unwrap();
        assert_eq!(
            (
                storage.n_ranks(),
                storage.n_pages(),
                storage.bytes_per_page()
            ),
            (2, 4, bytes_per_page)
        );
        check_backend(&storage);
    }
}

#[test]
fn host_storage_rejects_bad_shapes() {
    for (n_ranks, n_pages, bytes_per_page) in [(0, 4, 64), (1, 0, 64), (1, 4, 0)] {
        assert_eq!(
            HostStorage::new(n_ranks, n_pages, bytes_per_page).unwrap_err(),
            Error::EmptyStorage {
                n_ranks,
                n_pages,
                bytes_per_page
            }
        );
    }
    assert_eq!(
        HostStorage::new(u32::MAX, u32::MAX, usize::MAX / 2).unwrap_err(),
        Error::StorageTooLarge {
            n_ranks: u32::MAX,
            n_pages: u32::MAX,
            bytes_per_page: usize::MAX / 2
        }
    );
}

#[test]
fn host_pages_are_aligned() {
    for (bytes_per_page, align_bytes) in [
        (1, 64),
        (32, 64),
        (64, 64),
        (65, 64),
        (100, 64),
        (4096, 64),
        (16 * 1024, 4096),
        (40_000, 4096),
    ] {
        let storage = HostStorage::new(2, 3, bytes_per_page).unwrap();
        assert_eq!(storage.align_bytes(), align_bytes);
        for rank in 0..2 {
            for page in 0..3 {
                let addr = storage
                    .with_page(rank, PageId(page), |b| b.as_ptr().addr())
                    .unwrap();
                assert_eq!(
                    addr % align_bytes,
                    0,
                    "page {page} of rank {rank}, {bytes_per_page} bytes"
                );
                let len = storage.with_page(rank, PageId(page), <[u8]>::len).unwrap();
                assert_eq!(len, bytes_per_page);
            }
        }
    }
}

#[test]
fn host_with_page_closures_see_the_page_bytes_and_check_ids() {
    let storage = HostStorage::new(1, 3, 8).unwrap();
    storage
        .with_page_mut(0, PageId(2), |bytes| bytes.copy_from_slice(&[7; 8]))
        .unwrap();
    assert_eq!(
        storage.with_page(0, PageId(2), <[u8]>::to_vec).unwrap(),
        vec![7; 8]
    );
    assert_eq!(
        storage.with_page_mut(0, PageId::NULL, |_| ()).unwrap_err(),
        Error::NullPage
    );
    assert_eq!(
        storage.with_page(1, PageId(1), |_| ()).unwrap_err(),
        Error::RankOutOfRange {
            rank: 1,
            n_ranks: 1
        }
    );
    assert_eq!(
        storage.with_page(0, PageId(3), |_| ()).unwrap_err(),
        Error::PageOutOfRange {
            page: 3,
            n_pages: 3
        }
    );
}

#[test]
fn host_storage_takes_concurrent_writers_and_opposite_copies() {
    for bytes_per_page in [32, 256] {
        concurrent_writers_and_opposite_copies(bytes_per_page);
    }
}

fn concurrent_writers_and_opposite_copies(bytes_per_page: usize) {
    let storage = Arc::new(HostStorage::new(2, 65, bytes_per_page).unwrap());
    let writers: Vec<_> = (0..4u32)
        .map(|worker| {
            let storage = Arc::clone(&storage);
            std::thread::spawn(move || {
                for page in (1 + worker * 16)..(1 + (worker + 1) * 16) {
                    for rank in 0..2 {
                        storage
                            .write(rank, PageId(page), &pattern(page as u8, bytes_per_page))
                            .unwrap();
                    }
                }
                // Opposite copies between the same two pages must not deadlock.
                for _ in 0..200 {
                    if worker % 2 == 0 {
                        storage.copy(0, PageId(1), PageId(64)).unwrap();
                    } else {
                        storage.copy(0, PageId(64), PageId(1)).unwrap();
                    }
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().unwrap();
    }
    let mut buffer = vec![0; bytes_per_page];
    for page in 2..64 {
        storage.read(1, PageId(page), &mut buffer).unwrap();
        assert_eq!(buffer, pattern(page as u8, bytes_per_page), "page {page}");
    }
}

/// `Some(storage)` with a driver; `None` after printing why the test skipped (a failure instead when
/// `KVGATE_REQUIRE_GPU=1`).
fn cuda_storage_or_skip(
    test: &str,
    n_ranks: u32,
    n_pages: u32,
    bytes_per_page: usize,
) -> Option<CudaStorage> {
    if !crate::gpu_test_gate(test).unwrap() {
        return None;
    }
    Some(CudaStorage::new(0, n_ranks, n_pages, bytes_per_page).unwrap())
}

#[test]
fn cuda_storage_round_trips_copies_and_errors() {
    let Some(storage) =
        cuda_storage_or_skip("cuda_storage_round_trips_copies_and_errors", 2, 4, 100)
    else {
        return;
    };
    check_backend(&storage);
}

#[test]
fn cuda_storage_large_pages_round_trip() {
    let Some(storage) = cuda_storage_or_skip("cuda_storage_large_pages_round_trip", 1, 8, 1 << 20)
    else {
        return;
    };
    let page = pattern(9, 1 << 20);
    storage.write(0, PageId(7), &page).unwrap();
    storage.copy(0, PageId(7), PageId(1)).unwrap();
    let mut buffer = vec![0; 1 << 20];
    storage.read(0, PageId(1), &mut buffer).unwrap();
    assert_eq!(buffer, page);
}

#[test]
fn cuda_without_driver_is_a_clear_error_never_a_panic() {
    match cuda_available() {
        Err(reason) => {
            assert!(!reason.is_empty());
            assert_eq!(
                CudaStorage::new(0, 1, 4, 64).unwrap_err(),
                Error::CudaUnavailable {
                    reason: reason.clone()
                }
            );
            let message = Error::CudaUnavailable { reason }.to_string();
            assert!(message.starts_with("cuda is unavailable: "), "{message}");
        }
        Ok(()) => {
            // With a driver, a device ordinal past the last one is the same clear error.
            let error = CudaStorage::new(1 << 20, 1, 4, 64).unwrap_err();
            assert!(matches!(error, Error::CudaUnavailable { .. }), "{error}");
        }
    }
    // A bad shape is reported before the driver is asked anything.
    assert_eq!(
        CudaStorage::new(0, 0, 4, 64).unwrap_err(),
        Error::EmptyStorage {
            n_ranks: 0,
            n_pages: 4,
            bytes_per_page: 64
        }
    );
}

#[test]
fn host_storage_allocates_only_the_pages_written() {
    // The largest pool the engine allows, on two ranks, with line pages and with buffer pages.
    for bytes_per_page in [32, 256] {
        let storage = HostStorage::new(2, 1 << 22, bytes_per_page).unwrap();
        assert!(
            storage.allocated_bytes() < 1 << 20,
            "fresh storage of {bytes_per_page}-byte pages holds {} bytes",
            storage.allocated_bytes()
        );
        // Unwritten pages read as zeros and allocate nothing.
        let mut buffer = vec![0xAA; bytes_per_page];
        for page in [0, 1, (1 << 22) - 1] {
            storage.read(1, PageId(page), &mut buffer).unwrap();
            assert!(buffer.iter().all(|&b| b == 0));
            storage
                .with_page(0, PageId(page), |bytes| {
                    assert!(bytes.iter().all(|&b| b == 0));
                })
                .unwrap();
        }
        storage.copy(0, PageId(5), PageId(6)).unwrap();
        let untouched = storage.allocated_bytes();
        assert!(untouched < 1 << 20, "reads allocated {untouched} bytes");
        // A written page costs its chunk (lines) or itself (buffers), not the storage.
        storage
            .write(1, PageId(1 << 21), &pattern(9, bytes_per_page))
            .unwrap();
        storage.read(1, PageId(1 << 21), &mut buffer).unwrap();
        assert_eq!(buffer, pattern(9, bytes_per_page));
        let written = storage.allocated_bytes();
        assert!(
            written - untouched <= 256 * 1024,
            "one page written cost {} bytes",
            written - untouched
        );
    }
}

#[test]
fn fake_device_storage_round_trips_copies_and_errors() {
    let storage = DeviceStorage::fake(2, 4, 100).unwrap();
    check_backend(&storage);
    assert!(storage.device().violations().is_empty());
}

/// Queues `n_pages` pages of `pattern(seed)` into pages `first..` of rank 0 and records their event; the
/// caller keeps the returned staging until the stream ran.
fn queue_pages<D: Device>(
    storage: &DeviceStorage<D>,
    first: u32,
    n_pages: u32,
    seed: u8,
) -> D::Pinned {
    let bytes_per_page = storage.bytes_per_page();
    let device = storage.device();
    let mut pinned = device
        .alloc_pinned(n_pages as usize * bytes_per_page)
        .unwrap();
    device
        .fill_pinned(&mut pinned, &mut |bytes| {
            for (idx, page) in bytes.chunks_exact_mut(bytes_per_page).enumerate() {
                page.copy_from_slice(&pattern(seed + idx as u8, bytes_per_page));
            }
        })
        .unwrap();
    // SAFETY (test): `pinned` is kept alive below until the rank's stream is synchronized.
    #[allow(unsafe_code, reason = "the test queues a transfer from pinned memory")]
    unsafe {
        storage
            .enqueue_run(0, PageId(first), n_pages, &pinned, 0)
            .unwrap();
    }
    let pages: Vec<PageId> = (first..first + n_pages).map(PageId).collect();
    storage.record(0, &pages).unwrap();
    pinned
}

/// The property the CUDA path needs (issue 36, item 3): an access to a page waits for the transfers queued
/// into that page, and not for transfers into other pages.
#[test]
fn fake_device_access_waits_for_its_pages_transfers_only() {
    let storage = Arc::new(DeviceStorage::fake(1, 8, 64).unwrap());
    storage.device().pause(0, true);
    let staging = queue_pages(&storage, 1, 2, 10);
    assert_eq!(storage.n_pending_pages(0), 2);
    // Page 3 has no transfer queued: its write and read return although the stream is stopped.
    storage.write(0, PageId(3), &pattern(3, 64)).unwrap();
    let mut buffer = vec![0; 64];
    storage.read(0, PageId(3), &mut buffer).unwrap();
    assert_eq!(buffer, pattern(3, 64));
    // Page 2's read waits for its transfer.
    let (sender, receiver) = mpsc::channel();
    let reader = Arc::clone(&storage);
    let thread = std::thread::spawn(move || {
        let mut buffer = vec![0; 64];
        reader.read(0, PageId(2), &mut buffer).unwrap();
        sender.send(buffer).unwrap();
    });
    assert_eq!(
        receiver.recv_timeout(Duration::from_millis(50)),
        Err(mpsc::RecvTimeoutError::Timeout),
        "a read of a page under a queued transfer returned before it ran"
    );
    storage.device().pause(0, false);
    assert_eq!(receiver.recv().unwrap(), pattern(11, 64));
    thread.join().unwrap();
    // A copy out of page 1 waits too, and sees the restored bytes.
    storage.copy(0, PageId(1), PageId(4)).unwrap();
    storage.read(0, PageId(4), &mut buffer).unwrap();
    assert_eq!(buffer, pattern(10, 64));
    storage.device().synchronize(0).unwrap();
    assert_eq!(storage.n_pending_pages(0), 0);
    assert!(
        storage.device().violations().is_empty(),
        "{:?}",
        storage.device().violations()
    );
    assert_eq!(
        storage.device().stats().transfers,
        1,
        "one transfer for the run of two pages"
    );
    drop(staging);
}

/// A bad run is refused before anything is queued; a failed device keeps the page marked and its access
/// fails until the device recovers.
#[test]
fn fake_device_storage_refuses_bad_runs_and_keeps_failed_pages_marked() {
    let storage = DeviceStorage::fake(1, 8, 64).unwrap();
    let device = storage.device();
    let pinned = device.alloc_pinned(128).unwrap();
    #[allow(unsafe_code, reason = "the test queues transfers from pinned memory")]
    let refused = |first: u32, n_pages: u32, src_offset: usize, rank: u32| {
        // SAFETY (test): nothing is queued by these refused calls.
        unsafe { storage.enqueue_run(rank, PageId(first), n_pages, &pinned, src_offset) }
            .unwrap_err()
    };
    assert_eq!(refused(0, 1, 0, 0), Error::NullPage);
    assert_eq!(
        refused(7, 2, 0, 0),
        Error::PageOutOfRange {
            page: 8,
            n_pages: 8
        }
    );
    assert_eq!(
        refused(1, 1, 0, 1),
        Error::RankOutOfRange {
            rank: 1,
            n_ranks: 1
        }
    );
    assert!(matches!(refused(1, 2, 64, 0), Error::CudaFailed { .. }));
    assert!(matches!(refused(1, 0, 0, 0), Error::CudaFailed { .. }));
    device.inject(FakeFault::Enqueue);
    assert!(matches!(refused(1, 1, 0, 0), Error::CudaFailed { .. }));
    assert_eq!(device.n_queued(0), 0, "nothing queued by a refused run");
    // A transfer that fails leaves its stream failed: the page stays marked and reads of it fail.
    device.inject(FakeFault::Transfer);
    let staging = queue_pages(&storage, 1, 1, 1);
    let mut buffer = vec![0; 64];
    let error = storage.read(0, PageId(1), &mut buffer).unwrap_err();
    assert!(
        matches!(
            error,
            Error::CudaFailed {
                operation: "read",
                ..
            }
        ),
        "{error}"
    );
    assert_eq!(storage.n_pending_pages(0), 1);
    device.recover(0);
    storage.read(0, PageId(1), &mut buffer).unwrap();
    assert_eq!(storage.n_pending_pages(0), 0);
    assert!(device.violations().is_empty(), "{:?}", device.violations());
    drop(staging);
}

/// A held stream keeps what is queued after it queued, and the device says so (`n_pages_in_flight`): an
/// access to one of those pages waits for the hold's drop, an access to another page does not; once
/// released, nothing is in flight. A bad rank is an error (issue 36, leftover 2).
fn check_stream_hold<D: Device>(storage: &Arc<DeviceStorage<D>>) {
    let device = storage.device();
    let hold = device.hold_stream(0).unwrap();
    let staging = queue_pages(storage, 1, 3, 30);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        storage.n_pages_in_flight(0).unwrap(),
        3,
        "held behind the hold"
    );
    assert_eq!(
        storage.n_pages_in_flight(1).unwrap(),
        0,
        "another rank's stream"
    );
    storage.write(0, PageId(5), &pattern(5, 64)).unwrap();
    let (sender, receiver) = mpsc::channel();
    let reader = Arc::clone(storage);
    let thread = std::thread::spawn(move || {
        let mut buffer = vec![0; 64];
        reader.read(0, PageId(2), &mut buffer).unwrap();
        sender.send(buffer).unwrap();
    });
    assert_eq!(
        receiver.recv_timeout(Duration::from_millis(50)),
        Err(mpsc::RecvTimeoutError::Timeout),
        "a read of a page behind the hold returned while held"
    );
    drop(hold);
    assert_eq!(receiver.recv().unwrap(), pattern(31, 64));
    thread.join().unwrap();
    device.synchronize(0).unwrap();
    assert_eq!(storage.n_pages_in_flight(0).unwrap(), 0);
    assert_eq!(
        storage.n_pages_in_flight(2).unwrap_err(),
        Error::RankOutOfRange {
            rank: 2,
            n_ranks: 2
        }
    );
    assert!(device.hold_stream(2).is_err());
    drop(staging);
}

#[test]
fn fake_device_stream_hold_keeps_transfers_queued_until_dropped() {
    let storage = Arc::new(DeviceStorage::fake(2, 8, 64).unwrap());
    check_stream_hold(&storage);
    let device = storage.device();
    assert_eq!(device.stats().transfers, 1);
    assert!(device.violations().is_empty(), "{:?}", device.violations());
    // A query the device cannot answer is an error, not a count.
    let hold = device.hold_stream(0).unwrap();
    let staging = queue_pages(&storage, 4, 1, 40);
    device.inject(FakeFault::Query);
    assert!(matches!(
        storage.n_pages_in_flight(0).unwrap_err(),
        Error::CudaFailed { .. }
    ));
    assert_eq!(storage.n_pages_in_flight(0).unwrap(), 1);
    // A device dropped while held lets its streams go instead of hanging.
    drop(staging);
    drop(storage);
    drop(hold);
}

#[test]
fn cuda_stream_hold_keeps_transfers_queued_until_dropped() {
    let Some(storage) = cuda_storage_or_skip(
        "cuda_stream_hold_keeps_transfers_queued_until_dropped",
        2,
        8,
        64,
    ) else {
        return;
    };
    check_stream_hold(&Arc::new(storage));
}
