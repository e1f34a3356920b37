//! Where page bytes live: the `PageStorage` trait (read, write and copy whole pages by id, per rank shard),
//! `HostStorage` (aligned host memory, the embedded default) and `DeviceStorage` over a `Device`:
//! `CudaStorage` (device arenas through cudarc, libcuda loaded at run time) or the host-backed stand-in
//! `FakeDevice` that runs the CUDA path's logic in CI; `PagePrefix`, a smaller kind of page inside the pool's
//! pages. Layout: `n_ranks` shards of `n_pages` pages of `bytes_per_page` bytes; page
//! `p` of rank `r` lives in shard `r` at offset `p * bytes_per_page`. Page 0 is the null page: it reads as
//! zeros and is never written.

mod cuda;
mod device;
mod fake_device;
mod host;
mod prefix;
#[cfg(test)]
mod tests;

pub use cuda::{CudaDriver, CudaPinned, CudaStorage, cuda_available};
pub use device::{Device, DeviceStorage, StreamHold};
pub use fake_device::{FakeDevice, FakeEvent, FakeFault, FakePinned, FakeStats};
pub use host::HostStorage;
pub use prefix::PagePrefix;

use std::cell::Cell;

use crate::error::{Error, Result};
use crate::page::PageId;

/// Page bytes by page id, one shard per rank. Shared by reference with copy worker threads: every method
/// takes `&self`, and writes to different pages may run concurrently.
pub trait PageStorage: Send + Sync {
    /// Shards (context-parallel ranks).
    fn n_ranks(&self) -> u32;
    /// Pages per shard, the null page included.
    fn n_pages(&self) -> u32;
    /// Bytes in one page.
    fn bytes_per_page(&self) -> usize;
    /// Copy page `page` of `rank` into `dst` (exactly `bytes_per_page` long).
    fn read(&self, rank: u32, page: PageId, dst: &mut [u8]) -> Result<()>;
    /// Overwrite page `page` of `rank` with `src` (exactly `bytes_per_page` long); never the null page.
    fn write(&self, rank: u32, page: PageId, src: &[u8]) -> Result<()>;
    /// Copy page `src` of `rank` over page `dst` of the same rank (copy-on-write of a partial page);
    /// `dst` is never the null page. Copying a page onto itself does nothing.
    fn copy(&self, rank: u32, src: PageId, dst: PageId) -> Result<()>;
    /// Copy pages `first`, `first + 1`, ... of `rank` into `dst`, one page per `bytes_per_page` bytes of it
    /// (`dst.len()` a positive multiple of `bytes_per_page`, else `BufferLength`): a run of consecutive
    /// pages read in one access where the backend can (device storage: one transfer). The default reads
    /// page by page.
    fn read_run(&self, rank: u32, first: PageId, dst: &mut [u8]) -> Result<()> {
        read_run_by_page(self, rank, first, dst)
    }
    /// Copy the first `dst.len()` bytes (at most `bytes_per_page`) of page `page` of `rank` into `dst`: a
    /// smaller kind of page stored inside larger pool pages. The default reads the whole page into a
    /// buffer; the backends read only the prefix.
    fn read_prefix(&self, rank: u32, page: PageId, dst: &mut [u8]) -> Result<()> {
        let bytes_per_page = self.bytes_per_page();
        if dst.len() == bytes_per_page {
            return self.read(rank, page, dst);
        }
        check_prefix_len(dst.len(), bytes_per_page)?;
        let mut whole = vec![0u8; bytes_per_page];
        self.read(rank, page, &mut whole)?;
        let prefix = whole.get(..dst.len()).ok_or(Error::BufferLength {
            len: dst.len(),
            bytes_per_page,
        })?;
        dst.copy_from_slice(prefix);
        Ok(())
    }

    /// Overwrite page `page` of `rank` with `src` (at most `bytes_per_page` long, else `BufferLength`)
    /// followed by zeros to the page's end: a smaller kind of page stored inside larger pool pages, the
    /// same bytes as `write` of `src` padded with zeros. Never the null page. The default pads through a
    /// buffer reused per thread; the backends pad in place (device storage: only `src` crosses to the
    /// device, the rest is zeroed there).
    fn write_prefix(&self, rank: u32, page: PageId, src: &[u8]) -> Result<()> {
        let bytes_per_page = self.bytes_per_page();
        if src.len() == bytes_per_page {
            return self.write(rank, page, src);
        }
        check_prefix_len(src.len(), bytes_per_page)?;
        let mut padded = PAD.try_with(Cell::take).unwrap_or_default();
        padded.clear();
        padded.extend_from_slice(src);
        padded.resize(bytes_per_page, 0);
        let written = self.write(rank, page, &padded);
        // Back for the thread's next write (dropped if the thread is ending or a nested write left one).
        let _kept = PAD.try_with(|pad| pad.replace(padded));
        written
    }
}

thread_local! {
    /// The page-sized buffer `PageStorage::write_prefix`'s default pads through, one per thread.
    static PAD: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// `PageStorage::read_run` page by page: what the default does, for wrappers that override it.
pub fn read_run_by_page<S: PageStorage + ?Sized>(
    storage: &S,
    rank: u32,
    first: PageId,
    dst: &mut [u8],
) -> Result<()> {
    let bytes_per_page = storage.bytes_per_page();
    run_pages(first, dst.len(), bytes_per_page)?;
    for (page, chunk) in (first.0..).zip(dst.chunks_exact_mut(bytes_per_page)) {
        storage.read(rank, PageId(page), chunk)?;
    }
    Ok(())
}

/// The pages in a run of `len` bytes from `first`: `len` must be a positive multiple of `bytes_per_page`
/// and the last page id must exist (`BufferLength`, `PageOutOfRange` otherwise).
pub(crate) fn run_pages(first: PageId, len: usize, bytes_per_page: usize) -> Result<u32> {
    if len == 0 || bytes_per_page == 0 || !len.is_multiple_of(bytes_per_page) {
        return Err(Error::BufferLength {
            len,
            bytes_per_page,
        });
    }
    let n_pages = u32::try_from(len / bytes_per_page).ok();
    let last = n_pages.and_then(|n| first.0.checked_add(n - 1));
    match (n_pages, last) {
        (Some(n_pages), Some(_)) => Ok(n_pages),
        _ => Err(Error::PageOutOfRange {
            page: u32::MAX,
            n_pages: u32::MAX,
        }),
    }
}

/// Check a prefix buffer is no longer than a page.
pub(crate) fn check_prefix_len(len: usize, bytes_per_page: usize) -> Result<()> {
    if len > bytes_per_page {
        return Err(Error::BufferLength {
            len,
            bytes_per_page,
        });
    }
    Ok(())
}

/// The validated shape of a storage, shared by the backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    pub(crate) n_ranks: u32,
    pub(crate) n_pages: u32,
    pub(crate) bytes_per_page: usize,
}

impl Shape {
    /// Check the shape: every count positive and the bytes of one shard addressable.
    pub(crate) fn new(n_ranks: u32, n_pages: u32, bytes_per_page: usize) -> Result<Shape> {
        if n_ranks == 0 || n_pages == 0 || bytes_per_page == 0 {
            return Err(Error::EmptyStorage {
                n_ranks,
                n_pages,
                bytes_per_page,
            });
        }
        let total = (n_pages as usize)
            .checked_mul(bytes_per_page)
            .and_then(|shard| shard.checked_mul(n_ranks as usize))
            .filter(|&total| total <= isize::MAX as usize);
        if total.is_none() {
            return Err(Error::StorageTooLarge {
                n_ranks,
                n_pages,
                bytes_per_page,
            });
        }
        Ok(Shape {
            n_ranks,
            n_pages,
            bytes_per_page,
        })
    }

    /// Bytes in one rank's shard.
    pub(crate) fn bytes_per_shard(self) -> usize {
        self.n_pages as usize * self.bytes_per_page
    }

    /// Check `rank` and `page` are in range (the null page included).
    pub(crate) fn check_page(self, rank: u32, page: PageId) -> Result<()> {
        if rank >= self.n_ranks {
            return Err(Error::RankOutOfRange {
                rank,
                n_ranks: self.n_ranks,
            });
        }
        if page.0 >= self.n_pages {
            return Err(Error::PageOutOfRange {
                page: page.0,
                n_pages: self.n_pages,
            });
        }
        Ok(())
    }

    /// Check a page may be written: in range and not the null page.
    pub(crate) fn check_writable(self, rank: u32, page: PageId) -> Result<()> {
        self.check_page(rank, page)?;
        if page.is_null() {
            return Err(Error::NullPage);
        }
        Ok(())
    }

    /// Check a buffer is exactly one page long.
    pub(crate) fn check_len(self, len: usize) -> Result<()> {
        if len != self.bytes_per_page {
            return Err(Error::BufferLength {
                len,
                bytes_per_page: self.bytes_per_page,
            });
        }
        Ok(())
    }
}
