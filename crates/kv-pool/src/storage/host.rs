//! `HostStorage`: page bytes in aligned host memory, safe code only. Copy workers writing different pages
//! never wait on each other, but for the first write into a chunk of pages: the pages are allocated
//! `CHUNK_PAGES` at a time on the first write into one of them (a page never written, the null page
//! included, reads as zeros and costs nothing), and a second writer into that chunk waits until it is
//! allocated. So a large pool costs what its requests touch. A page of at most a cache line is one cache
//! line of eight atomic words, read and written word by word without a lock: a write stores into the line
//! without first taking a lock word, so a simulation writing pages of a pool too large for the cache is not
//! held up by a cache miss per page. A page written while it is read may then be read half old, half new;
//! nothing reads a page while a copy or a step may write it (the engine's ownership rules, checked by the
//! reordering copy engine), so nothing sees that. A larger page is its own allocation, made on its first
//! write, behind its own `RwLock`. A page starts on a 4096-byte boundary when pages are at least 16 KiB,
//! else on a 64-byte (cache line) boundary: a larger buffer is over-allocated by the alignment and the page
//! view starts at the first aligned byte; the closures of `with_page` and `with_page_mut` see a line page
//! through an aligned copy, and a page never written through an aligned zeroed copy.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{OnceLock, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::{PageStorage, Shape};
use crate::error::Result;
use crate::page::PageId;

/// Pages at least this large are aligned to `PAGE_ALIGN_BYTES`; smaller ones to `LINE_ALIGN_BYTES`.
const PAGE_ALIGN_MIN_BYTES: usize = 16 * 1024;
const PAGE_ALIGN_BYTES: usize = 4096;
const LINE_ALIGN_BYTES: usize = 64;

/// Pages allocated together on the first write into one of them: 64 KiB of line pages.
const CHUNK_PAGES: usize = 1024;

/// Page bytes in host memory, `n_ranks` shards of `n_pages` pages (the embedded default storage).
#[derive(Debug)]
pub struct HostStorage {
    shape: Shape,
    align_bytes: usize,
    /// Page `p` of rank `r` at index `r * n_pages + p`.
    pages: Pages,
    /// Bytes of pages allocated so far (chunks, and the buffers of larger pages).
    allocated: AtomicUsize,
}

/// The pages, each behind its own lock.
#[derive(Debug)]
enum Pages {
    /// Pages of at most one cache line (the simulator's): the bytes sit inside the lock, so an access touches
    /// one 128-byte block instead of a lock and a separate buffer, and a chunk is one allocation.
    Lines(Chunks<AtomicLine>),
    /// Larger pages: one over-allocated buffer each.
    Buffers(Chunks<RwLock<AlignedPage>>),
}

impl HostStorage {
    /// Zeroed storage of `n_ranks` shards of `n_pages` pages (the null page included) of `bytes_per_page`
    /// bytes; nothing of the pages is allocated before they are written. Errors: `EmptyStorage` for a zero
    /// count or size, `StorageTooLarge` when it cannot be addressed.
    pub fn new(n_ranks: u32, n_pages: u32, bytes_per_page: usize) -> Result<HostStorage> {
        let shape = Shape::new(n_ranks, n_pages, bytes_per_page)?;
        let align_bytes = align_bytes_for(bytes_per_page);
        let n_buffers = n_ranks as usize * n_pages as usize;
        let pages = if bytes_per_page <= LINE_ALIGN_BYTES {
            Pages::Lines(Chunks::new(n_buffers))
        } else {
            Pages::Buffers(Chunks::new(n_buffers))
        };
        Ok(HostStorage {
            shape,
            align_bytes,
            pages,
            allocated: AtomicUsize::new(0),
        })
    }

    /// Bytes of page memory the storage holds now: what the pages written so far took (chunks of line
    /// pages, the handles of larger pages and their buffers), not counting the few bytes per chunk of an
    /// empty table.
    #[cfg(test)]
    pub(crate) fn allocated_bytes(&self) -> usize {
        self.allocated.load(Ordering::Relaxed)
    }

    /// Bytes a page of `bytes_per_page` bytes takes in a shard once written (its share of its chunk): a line
    /// for a page of at most 64 bytes, else its lock and its buffer, over-allocated by the alignment.
    pub fn allocated_bytes_per_page(bytes_per_page: usize) -> usize {
        if bytes_per_page <= LINE_ALIGN_BYTES {
            std::mem::size_of::<AtomicLine>()
        } else {
            std::mem::size_of::<RwLock<AlignedPage>>()
                + bytes_per_page
                + align_bytes_for(bytes_per_page)
                - 1
        }
    }

    /// The alignment every page starts on, in bytes (4096 for pages of at least 16 KiB, else 64).
    #[cfg(test)]
    pub(crate) fn align_bytes(&self) -> usize {
        self.align_bytes
    }

    /// Run `f` over the bytes of page `page` of `rank` (the fast path for bulk copies: no buffer copy but
    /// for a page never written). Errors: `RankOutOfRange`, `PageOutOfRange`.
    pub fn with_page<R>(&self, rank: u32, page: PageId, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        self.shape.check_page(rank, page)?;
        let (idx, len) = (self.index(rank, page), self.shape.bytes_per_page);
        Ok(match &self.pages {
            Pages::Lines(pages) => match pages.get(idx) {
                Some(line) => f(line.load().view(len)),
                None => f(Line::ZERO.view(len)),
            },
            Pages::Buffers(pages) => {
                let page = pages
                    .get(idx)
                    .map(|page| page.read().unwrap_or_else(PoisonError::into_inner));
                match page.as_deref().and_then(|page| page.bytes(len)) {
                    Some(bytes) => f(bytes),
                    None => f(AlignedPage::zeroed(len, self.align_bytes).view(len)),
                }
            }
        })
    }

    /// Run `f` over the mutable bytes of page `page` of `rank`. Errors: `RankOutOfRange`,
    /// `PageOutOfRange`, `NullPage`.
    #[cfg(test)]
    pub(crate) fn with_page_mut<R>(
        &self,
        rank: u32,
        page: PageId,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R> {
        self.shape.check_writable(rank, page)?;
        let (idx, len) = (self.index(rank, page), self.shape.bytes_per_page);
        Ok(match &self.pages {
            Pages::Lines(pages) => {
                let line = pages.get_or_allocate(idx, &self.allocated);
                let mut copy = line.load();
                let result = f(copy.view_mut(len));
                line.store(&copy.0);
                result
            }
            Pages::Buffers(pages) => f(self.write_buffer(pages, idx).view_mut(len)),
        })
    }

    fn index(&self, rank: u32, page: PageId) -> usize {
        rank as usize * self.shape.n_pages as usize + page.idx()
    }

    /// The larger page at `idx`, locked for writing and allocated (zeroed) if it never was.
    fn write_buffer<'a>(
        &'a self,
        pages: &'a Chunks<RwLock<AlignedPage>>,
        idx: usize,
    ) -> RwLockWriteGuard<'a, AlignedPage> {
        let mut page = pages
            .get_or_allocate(idx, &self.allocated)
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if page.buffer.is_empty() {
            *page = AlignedPage::zeroed(self.shape.bytes_per_page, self.align_bytes);
            self.allocated
                .fetch_add(page.buffer.capacity(), Ordering::Relaxed);
        }
        page
    }

    /// Copies the larger page `src` over page `dst` (different pages), locking in index order so two
    /// opposite copies cannot deadlock. A source never written leaves the destination zeroed.
    fn copy_buffer(&self, pages: &Chunks<RwLock<AlignedPage>>, src: usize, dst: usize) {
        let len = self.shape.bytes_per_page;
        let read = |idx: usize| pages.get(idx).map(read_lock);
        let copy = |from: Option<&AlignedPage>, to: &mut AlignedPage| match from
            .and_then(|from| from.bytes(len))
        {
            Some(bytes) => to.view_mut(len).copy_from_slice(bytes),
            None => to.view_mut(len).fill(0),
        };
        let src_written = read(src).is_some_and(|page| !page.buffer.is_empty());
        let dst_written = read(dst).is_some_and(|page| !page.buffer.is_empty());
        if !src_written && !dst_written {
            // Zeros over zeros.
            return;
        }
        if src < dst {
            let from = read(src);
            let mut to = self.write_buffer(pages, dst);
            copy(from.as_deref(), &mut to);
        } else {
            let mut to = self.write_buffer(pages, dst);
            let from = read(src);
            copy(from.as_deref(), &mut to);
        }
    }
}

/// The alignment a page of `bytes_per_page` bytes starts on.
fn align_bytes_for(bytes_per_page: usize) -> usize {
    if bytes_per_page >= PAGE_ALIGN_MIN_BYTES {
        PAGE_ALIGN_BYTES
    } else {
        LINE_ALIGN_BYTES
    }
}

/// Pages in chunks of `CHUNK_PAGES`, each chunk allocated on the first write into one of its pages (the last
/// one whole: a page's place in its chunk needs no bounds check).
#[derive(Debug)]
struct Chunks<P> {
    chunks: Box<[OnceLock<Box<[P; CHUNK_PAGES]>>]>,
}

impl<P: Default> Chunks<P> {
    /// `n_pages` pages, none allocated.
    fn new(n_pages: usize) -> Chunks<P> {
        Chunks {
            chunks: (0..n_pages.div_ceil(CHUNK_PAGES))
                .map(|_| OnceLock::new())
                .collect(),
        }
    }

    /// Page `idx` (in range), if its chunk is allocated.
    #[inline]
    fn get(&self, idx: usize) -> Option<&P> {
        self.chunks[idx / CHUNK_PAGES]
            .get()
            .map(|chunk| &chunk[idx % CHUNK_PAGES])
    }

    /// Page `idx` (in range), its chunk allocated first if it is not (counted in `allocated`).
    #[inline]
    fn get_or_allocate(&self, idx: usize, allocated: &AtomicUsize) -> &P {
        let chunk = self.chunks[idx / CHUNK_PAGES].get_or_init(|| {
            allocated.fetch_add(std::mem::size_of::<[P; CHUNK_PAGES]>(), Ordering::Relaxed);
            Box::new(std::array::from_fn(|_| P::default()))
        });
        &chunk[idx % CHUNK_PAGES]
    }
}

// Page bytes are plain data: a panic while one was locked leaves no broken invariant, so poisoning is
// ignored. Indexes are checked against the shape before these are called.
fn read_lock(page: &RwLock<AlignedPage>) -> RwLockReadGuard<'_, AlignedPage> {
    page.read().unwrap_or_else(PoisonError::into_inner)
}

impl PageStorage for HostStorage {
    fn read_prefix(&self, rank: u32, page: PageId, dst: &mut [u8]) -> Result<()> {
        super::check_prefix_len(dst.len(), self.shape.bytes_per_page)?;
        let len = dst.len();
        self.with_page(rank, page, |bytes| {
            if let Some(prefix) = bytes.get(..len) {
                dst.copy_from_slice(prefix);
            }
        })
    }

    /// In place: the prefix and the zeros after it are written into the page, no buffer between.
    fn write_prefix(&self, rank: u32, page: PageId, src: &[u8]) -> Result<()> {
        super::check_prefix_len(src.len(), self.shape.bytes_per_page)?;
        self.shape.check_writable(rank, page)?;
        let idx = self.index(rank, page);
        let len = self.shape.bytes_per_page;
        let pad = |bytes: &mut [u8]| {
            let (head, tail) = bytes.split_at_mut(src.len());
            head.copy_from_slice(src);
            tail.fill(0);
        };
        match &self.pages {
            Pages::Lines(pages) => {
                let mut line = Line([0; LINE_ALIGN_BYTES]);
                pad(line.view_mut(len));
                pages.get_or_allocate(idx, &self.allocated).store(&line.0);
            }
            Pages::Buffers(pages) => pad(self.write_buffer(pages, idx).view_mut(len)),
        }
        Ok(())
    }

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
        self.shape.check_page(rank, page)?;
        let idx = self.index(rank, page);
        match &self.pages {
            Pages::Lines(pages) => match pages.get(idx) {
                Some(line) => line.read_into(dst),
                None => dst.fill(0),
            },
            Pages::Buffers(pages) => {
                let page = pages.get(idx).map(read_lock);
                match page.as_deref().and_then(|page| page.bytes(dst.len())) {
                    Some(bytes) => dst.copy_from_slice(bytes),
                    None => dst.fill(0),
                }
            }
        }
        Ok(())
    }

    fn write(&self, rank: u32, page: PageId, src: &[u8]) -> Result<()> {
        self.shape.check_len(src.len())?;
        self.shape.check_writable(rank, page)?;
        let idx = self.index(rank, page);
        match &self.pages {
            Pages::Lines(pages) => pages.get_or_allocate(idx, &self.allocated).store_bytes(src),
            Pages::Buffers(pages) => self
                .write_buffer(pages, idx)
                .view_mut(src.len())
                .copy_from_slice(src),
        }
        Ok(())
    }

    fn copy(&self, rank: u32, src: PageId, dst: PageId) -> Result<()> {
        self.shape.check_page(rank, src)?;
        self.shape.check_writable(rank, dst)?;
        if src == dst {
            return Ok(());
        }
        let (from, to) = (self.index(rank, src), self.index(rank, dst));
        match &self.pages {
            Pages::Lines(pages) => match pages.get(from) {
                Some(line) => pages
                    .get_or_allocate(to, &self.allocated)
                    .store(&line.load().0),
                // A source never written: zeros, which a destination never written holds already.
                None => {
                    if let Some(line) = pages.get(to) {
                        line.store(&Line::ZERO.0);
                    }
                }
            },
            Pages::Buffers(pages) => self.copy_buffer(pages, from, to),
        }
        Ok(())
    }
}

/// One cache line holding a page of at most `LINE_ALIGN_BYTES` bytes at its start.
#[derive(Debug)]
#[repr(align(64))]
struct Line([u8; LINE_ALIGN_BYTES]);

impl Line {
    /// A page never written.
    const ZERO: Line = Line([0; LINE_ALIGN_BYTES]);

    fn view(&self, len: usize) -> &[u8] {
        &self.0[..len]
    }

    fn view_mut(&mut self, len: usize) -> &mut [u8] {
        &mut self.0[..len]
    }
}

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

/// One page's bytes, over-allocated so the view can start on an aligned address; empty until the page is
/// first written.
#[derive(Debug, Default)]
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

    /// The page's first `len` bytes (`len` is the storage's page size), if it was ever written.
    fn bytes(&self, len: usize) -> Option<&[u8]> {
        (!self.buffer.is_empty()).then(|| self.view(len))
    }

    /// The page's first `len` bytes of an allocated page.
    fn view(&self, len: usize) -> &[u8] {
        &self.buffer[self.offset..self.offset + len]
    }

    fn view_mut(&mut self, len: usize) -> &mut [u8] {
        &mut self.buffer[self.offset..self.offset + len]
    }
}
