//! `HostStorage`: page bytes in aligned host memory, safe code only. Copy workers writing different pages
//! never wait on each other. A page of at most a cache line is one cache line of eight atomic words, read
//! and written word by word without a lock: a write stores into the line without first taking a lock word,
//! so a simulation writing pages of a pool too large for the cache is not held up by a cache miss per page.
//! A page written while it is read may then be read half old, half new; nothing reads a page while a copy
//! or a step may write it (the engine's ownership rules, checked by the reordering copy engine), so nothing
//! sees that. A larger page is its own allocation behind its own `RwLock`. A page starts on a 4096-byte
//! boundary when pages are at least 16 KiB, else on a 64-byte (cache line) boundary: a larger buffer is
//! over-allocated by the alignment and the page view starts at the first aligned byte; the closures of
//! `with_page` and `with_page_mut` see a line page through an aligned copy.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::{PageStorage, Shape};
use crate::error::Result;
use crate::page::PageId;

/// Pages at least this large are aligned to `PAGE_ALIGN_BYTES`; smaller ones to `LINE_ALIGN_BYTES`.
const PAGE_ALIGN_MIN_BYTES: usize = 16 * 1024;
const PAGE_ALIGN_BYTES: usize = 4096;
const LINE_ALIGN_BYTES: usize = 64;

/// Page bytes in host memory, `n_ranks` shards of `n_pages` pages (the embedded default storage).
#[derive(Debug)]
pub struct HostStorage {
    shape: Shape,
    align_bytes: usize,
    /// Page `p` of rank `r` at index `r * n_pages + p`.
    pages: Pages,
}

/// The pages, each behind its own lock.
#[derive(Debug)]
enum Pages {
    /// Pages of at most one cache line (the simulator's): the bytes sit inside the lock, so an access touches
    /// one 128-byte block instead of a lock and a separate buffer, and the storage is one allocation.
    Lines(Vec<AtomicLine>),
    /// Larger pages: one over-allocated buffer each.
    Buffers(Vec<RwLock<AlignedPage>>),
}

impl HostStorage {
    /// Zeroed storage of `n_ranks` shards of `n_pages` pages (the null page included) of `bytes_per_page`
    /// bytes. Errors: `EmptyStorage` for a zero count or size, `StorageTooLarge` when it cannot be addressed.
    pub fn new(n_ranks: u32, n_pages: u32, bytes_per_page: usize) -> Result<HostStorage> {
        let shape = Shape::new(n_ranks, n_pages, bytes_per_page)?;
        let align_bytes = if bytes_per_page >= PAGE_ALIGN_MIN_BYTES {
            PAGE_ALIGN_BYTES
        } else {
            LINE_ALIGN_BYTES
        };
        let n_buffers = n_ranks as usize * n_pages as usize;
        let pages = if bytes_per_page <= LINE_ALIGN_BYTES {
            Pages::Lines((0..n_buffers).map(|_| AtomicLine::default()).collect())
        } else {
            Pages::Buffers(
                (0..n_buffers)
                    .map(|_| RwLock::new(AlignedPage::zeroed(bytes_per_page, align_bytes)))
                    .collect(),
            )
        };
        Ok(HostStorage {
            shape,
            align_bytes,
            pages,
        })
    }

    /// The alignment every page starts on, in bytes (4096 for pages of at least 16 KiB, else 64).
    pub fn align_bytes(&self) -> usize {
        self.align_bytes
    }

    /// Run `f` over the bytes of page `page` of `rank` (the fast path for bulk copies: no buffer copy).
    /// Errors: `RankOutOfRange`, `PageOutOfRange`.
    pub fn with_page<R>(&self, rank: u32, page: PageId, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        self.shape.check_page(rank, page)?;
        let (idx, len) = (self.index(rank, page), self.shape.bytes_per_page);
        Ok(match &self.pages {
            Pages::Lines(pages) => f(pages[idx].load().view(len)),
            Pages::Buffers(pages) => f(read_lock(pages, idx).view(len)),
        })
    }

    /// Run `f` over the mutable bytes of page `page` of `rank`. Errors: `RankOutOfRange`,
    /// `PageOutOfRange`, `NullPage`.
    pub fn with_page_mut<R>(
        &self,
        rank: u32,
        page: PageId,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R> {
        self.shape.check_writable(rank, page)?;
        let (idx, len) = (self.index(rank, page), self.shape.bytes_per_page);
        Ok(match &self.pages {
            Pages::Lines(pages) => {
                let mut line = pages[idx].load();
                let result = f(line.view_mut(len));
                pages[idx].store(&line.0);
                result
            }
            Pages::Buffers(pages) => f(write_lock(pages, idx).view_mut(len)),
        })
    }

    fn index(&self, rank: u32, page: PageId) -> usize {
        rank as usize * self.shape.n_pages as usize + page.idx()
    }
}

/// The bytes of one page, whatever holds them.
trait PageBytes {
    /// The page's first `len` bytes (`len` is the storage's page size, which fits).
    fn view(&self, len: usize) -> &[u8];
    fn view_mut(&mut self, len: usize) -> &mut [u8];
}

// Page bytes are plain data: a panic while one was locked leaves no broken invariant, so poisoning is
// ignored. Indexes are checked against the shape before these are called.
fn read_lock<T: PageBytes>(pages: &[RwLock<T>], idx: usize) -> RwLockReadGuard<'_, T> {
    pages[idx].read().unwrap_or_else(PoisonError::into_inner)
}

fn write_lock<T: PageBytes>(pages: &[RwLock<T>], idx: usize) -> RwLockWriteGuard<'_, T> {
    pages[idx].write().unwrap_or_else(PoisonError::into_inner)
}

/// Copies page `src` over page `dst` (different pages), locking in index order so two opposite copies
/// cannot deadlock.
fn copy_page<T: PageBytes>(pages: &[RwLock<T>], src: usize, dst: usize, len: usize) {
    if src < dst {
        let from = read_lock(pages, src);
        let mut to = write_lock(pages, dst);
        to.view_mut(len).copy_from_slice(from.view(len));
    } else {
        let mut to = write_lock(pages, dst);
        let from = read_lock(pages, src);
        to.view_mut(len).copy_from_slice(from.view(len));
    }
}

impl PageStorage for HostStorage {
    fn n_ranks(&self) -> u32 {
        self.shape.n_ranks
    }

    fn n_pages(&self) -> u32 {
        self.shape.n_pages
    }

    fn bytes_per_page(&self) -> usize {
        self.shape.bytes_per_page
    }

    fn read(&self, rank: u32, page: PageId, dst: &mut [u8]) -> Result<()> {
        self.shape.check_len(dst.len())?;
        if let Pages::Lines(pages) = &self.pages {
            self.shape.check_page(rank, page)?;
            pages[self.index(rank, page)].read_into(dst);
            return Ok(());
        }
        self.with_page(rank, page, |bytes| dst.copy_from_slice(bytes))
    }

    fn write(&self, rank: u32, page: PageId, src: &[u8]) -> Result<()> {
        self.shape.check_len(src.len())?;
        if let Pages::Lines(pages) = &self.pages {
            self.shape.check_writable(rank, page)?;
            pages[self.index(rank, page)].store_bytes(src);
            return Ok(());
        }
        self.with_page_mut(rank, page, |bytes| bytes.copy_from_slice(src))
    }

    fn copy(&self, rank: u32, src: PageId, dst: PageId) -> Result<()> {
        self.shape.check_page(rank, src)?;
        self.shape.check_writable(rank, dst)?;
        if src == dst {
            return Ok(());
        }
        let (from, to) = (self.index(rank, src), self.index(rank, dst));
        let len = self.shape.bytes_per_page;
        match &self.pages {
            Pages::Lines(pages) => pages[to].store(&pages[from].load().0),
            Pages::Buffers(pages) => copy_page(pages, from, to, len),
        }
        Ok(())
    }
}

/// One cache line holding a page of at most `LINE_ALIGN_BYTES` bytes at its start.
#[derive(Debug)]
#[repr(align(64))]
struct Line([u8; LINE_ALIGN_BYTES]);

/// Words of one line page.
const LINE_WORDS: usize = LINE_ALIGN_BYTES / 8;

/// A page of at most a cache line: eight words read and written one by one (little-endian bytes).
#[derive(Debug, Default)]
#[repr(align(64))]
struct AtomicLine([AtomicU64; LINE_WORDS]);

impl AtomicLine {
    /// A copy of the line.
    fn load(&self) -> Line {
        let mut line = Line([0; LINE_ALIGN_BYTES]);
        self.read_into(&mut line.0);
        line
    }

    /// Copies the line's first `dst.len()` bytes (at most a line) into `dst`: whole words as words (no
    /// call to copy a variable length), then the bytes of a partial last word.
    fn read_into(&self, dst: &mut [u8]) {
        let mut chunks = dst.chunks_exact_mut(8);
        let mut words = self.0.iter();
        for (chunk, word) in (&mut chunks).zip(words.by_ref()) {
            chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty()
            && let Some(word) = words.next()
        {
            let len = rest.len();
            rest.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes()[..len]);
        }
    }

    /// Stores the whole line.
    fn store(&self, line: &[u8; LINE_ALIGN_BYTES]) {
        self.store_bytes(line);
    }

    /// Stores `src` (at most a line) into the line's first words, word by word with no staging copy (the
    /// simulated executor writes one page a block). The bytes past the page's length are never read:
    /// whatever a partial word holds there is fine.
    fn store_bytes(&self, src: &[u8]) {
        let mut chunks = src.chunks_exact(8);
        let mut words = self.0.iter();
        // The chunks lead the zip: when they run out, no word has been taken for nothing.
        for (chunk, word) in (&mut chunks).zip(words.by_ref()) {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(chunk);
            word.store(u64::from_le_bytes(bytes), Ordering::Relaxed);
        }
        let rest = chunks.remainder();
        if !rest.is_empty()
            && let Some(word) = words.next()
        {
            let mut bytes = [0u8; 8];
            bytes[..rest.len()].copy_from_slice(rest);
            word.store(u64::from_le_bytes(bytes), Ordering::Relaxed);
        }
    }
}

impl PageBytes for Line {
    fn view(&self, len: usize) -> &[u8] {
        &self.0[..len]
    }

    fn view_mut(&mut self, len: usize) -> &mut [u8] {
        &mut self.0[..len]
    }
}

/// One page's bytes, over-allocated so the view can start on an aligned address.
#[derive(Debug)]
struct AlignedPage {
    buffer: Vec<u8>,
    offset: usize,
}

impl AlignedPage {
    fn zeroed(len: usize, align_bytes: usize) -> AlignedPage {
        debug_assert!(align_bytes.is_power_of_two());
        let buffer = vec![0u8; len + align_bytes - 1];
        // The buffer never grows, so its address (and the view's alignment) is fixed.
        let misalignment = buffer.as_ptr().addr() % align_bytes;
        let offset = (align_bytes - misalignment) % align_bytes;
        AlignedPage { buffer, offset }
    }
}

impl PageBytes for AlignedPage {
    fn view(&self, len: usize) -> &[u8] {
        &self.buffer[self.offset..self.offset + len]
    }

    fn view_mut(&mut self, len: usize) -> &mut [u8] {
        &mut self.buffer[self.offset..self.offset + len]
    }
}
