//! Writes through a page-prefix view allocate nothing per write (issue 36, item 4: the reference model's
//! page view allocated a pool-sized page on every write): counted by a global allocator that counts the
//! allocations made on the test's own thread, on host storage (line and buffer pages), on the stand-in
//! device and through the trait's default `write_prefix`, whose buffer is reused per thread.
#![allow(
    unsafe_code,
    reason = "a counting global allocator forwards to the system allocator"
)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use kv_pool::{DeviceStorage, HostStorage, PageId, PagePrefix, PageStorage};

/// The system allocator, counting each thread's allocations.
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call forwards to `System` unchanged; the counter is a const-initialized thread local,
// which itself never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _counted = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _counted = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

/// Storage with only the required methods, so `write_prefix` is the trait's default.
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
    fn read(&self, rank: u32, page: PageId, dst: &mut [u8]) -> kv_pool::Result<()> {
        self.0.read(rank, page, dst)
    }
    fn write(&self, rank: u32, page: PageId, src: &[u8]) -> kv_pool::Result<()> {
        self.0.write(rank, page, src)
    }
    fn copy(&self, rank: u32, src: PageId, dst: PageId) -> kv_pool::Result<()> {
        self.0.copy(rank, src, dst)
    }
}

/// Writes every page of a 24-byte view once (allocating the pages), then 100 more times: none of those
/// allocates.
fn assert_no_allocation_per_write(what: &str, storage: &dyn PageStorage) {
    let view = PagePrefix::new(storage, 24).unwrap();
    let src = [7u8; 24];
    for page in 1..storage.n_pages() {
        view.write(0, PageId(page), &src).unwrap();
    }
    let before = allocations();
    for round in 0..100u32 {
        let page = PageId(1 + round % (storage.n_pages() - 1));
        view.write(0, page, &src).unwrap();
    }
    assert_eq!(
        allocations() - before,
        0,
        "{what}: allocations in 100 writes"
    );
}

#[test]
fn writes_through_a_page_prefix_view_allocate_nothing() {
    let lines = HostStorage::new(1, 8, 64).unwrap();
    let buffers = HostStorage::new(1, 8, 4096).unwrap();
    let fake = DeviceStorage::fake(1, 8, 4096).unwrap();
    let defaults = Defaults(HostStorage::new(1, 8, 4096).unwrap());
    assert_no_allocation_per_write("host line pages", &lines);
    assert_no_allocation_per_write("host buffer pages", &buffers);
    assert_no_allocation_per_write("stand-in device", &fake);
    assert_no_allocation_per_write("the trait's default", &defaults);
    // The counter counts: the old view's padded page per write shows here.
    let before = allocations();
    let padded = vec![0u8; 4096];
    buffers.write(0, PageId(1), &padded).unwrap();
    assert_eq!(allocations() - before, 1);
}
