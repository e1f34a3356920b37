//! `HostStorage`: page bytes in aligned host memory, safe code only. Every page is its own allocation behind
//! its own `RwLock`, so copy workers writing different pages never wait on each other. A page starts on a
//! 4096-byte boundary when pages are at least 16 KiB, else on a 64-byte (cache line) boundary: the buffer
//! is over-allocated by the alignment and the page view starts at the first aligned byte.

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
    pages: Vec<RwLock<AlignedPage>>,
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
        let pages = (0..n_buffers)
            .map(|_| RwLock::new(AlignedPage::zeroed(bytes_per_page, align_bytes)))
            .collect();
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
        let guard = self.read_lock(rank, page);
        Ok(f(guard.bytes()))
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
        let mut guard = self.write_lock(rank, page);
        Ok(f(guard.bytes_mut()))
    }

    fn index(&self, rank: u32, page: PageId) -> usize {
        rank as usize * self.shape.n_pages as usize + page.idx()
    }

    // Page bytes are plain data: a panic while one was locked leaves no broken invariant, so poisoning is
    // ignored.
    fn read_lock(&self, rank: u32, page: PageId) -> RwLockReadGuard<'_, AlignedPage> {
        self.pages[self.index(rank, page)]
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn write_lock(&self, rank: u32, page: PageId) -> RwLockWriteGuard<'_, AlignedPage> {
        self.pages[self.index(rank, page)]
            .write()
            .unwrap_or_else(PoisonError::into_inner)
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
        self.with_page(rank, page, |bytes| dst.copy_from_slice(bytes))
    }

    fn write(&self, rank: u32, page: PageId, src: &[u8]) -> Result<()> {
        self.shape.check_len(src.len())?;
        self.with_page_mut(rank, page, |bytes| bytes.copy_from_slice(src))
    }

    fn copy(&self, rank: u32, src: PageId, dst: PageId) -> Result<()> {
        self.shape.check_page(rank, src)?;
        self.shape.check_writable(rank, dst)?;
        if src == dst {
            return Ok(());
        }
        // Lock in page order so two opposite copies cannot deadlock.
        if src < dst {
            let from = self.read_lock(rank, src);
            let mut to = self.write_lock(rank, dst);
            to.bytes_mut().copy_from_slice(from.bytes());
        } else {
            let mut to = self.write_lock(rank, dst);
            let from = self.read_lock(rank, src);
            to.bytes_mut().copy_from_slice(from.bytes());
        }
        Ok(())
    }
}

/// One page's bytes, over-allocated so the view can start on an aligned address.
#[derive(Debug)]
struct AlignedPage {
    buffer: Vec<u8>,
    offset: usize,
    len: usize,
}

impl AlignedPage {
    fn zeroed(len: usize, align_bytes: usize) -> AlignedPage {
        debug_assert!(align_bytes.is_power_of_two());
        let buffer = vec![0u8; len + align_bytes - 1];
        // The buffer never grows, so its address (and the view's alignment) is fixed.
        let misalignment = buffer.as_ptr().addr() % align_bytes;
        let offset = (align_bytes - misalignment) % align_bytes;
        AlignedPage {
            buffer,
            offset,
            len,
        }
    }

    fn bytes(&self) -> &[u8] {
        &self.buffer[self.offset..self.offset + self.len]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.buffer[self.offset..self.offset + self.len]
    }
}
