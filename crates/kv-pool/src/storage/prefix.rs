//! `PagePrefix`: a smaller kind of page stored in the first bytes of every page of a larger pool storage (a
//! model's local or recurrent pages inside pages sized for its largest kind). Reads move only the prefix,
//! and a write zeroes the rest of the page without a page-sized buffer (`PageStorage::write_prefix`).

use super::{PageStorage, read_run_by_page};
use crate::error::{Error, Result};
use crate::page::PageId;

/// The first `bytes_per_page` bytes of every page of `inner`, as a storage of pages that size. A write
/// leaves the rest of the pool page zeroed; a copy copies the whole pool page.
#[derive(Clone, Copy)]
pub struct PagePrefix<'a> {
    inner: &'a dyn PageStorage,
    bytes_per_page: usize,
}

impl std::fmt::Debug for PagePrefix<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PagePrefix")
            .field("bytes_per_page", &self.bytes_per_page)
            .field("inner_bytes_per_page", &self.inner.bytes_per_page())
            .finish_non_exhaustive()
    }
}

impl<'a> PagePrefix<'a> {
    /// Pages of `bytes_per_page` bytes in the first bytes of `inner`'s pages. Errors: `BufferLength` for 0
    /// bytes or more than `inner`'s pages hold.
    pub fn new(inner: &'a dyn PageStorage, bytes_per_page: usize) -> Result<PagePrefix<'a>> {
        if bytes_per_page == 0 || bytes_per_page > inner.bytes_per_page() {
            return Err(Error::BufferLength {
                len: bytes_per_page,
                bytes_per_page: inner.bytes_per_page(),
            });
        }
        Ok(PagePrefix {
            inner,
            bytes_per_page,
        })
    }

    /// Whether the view is the whole of `inner`'s pages.
    fn whole(&self) -> bool {
        self.bytes_per_page == self.inner.bytes_per_page()
    }

    fn check_len(&self, len: usize) -> Result<()> {
        if len == self.bytes_per_page {
            Ok(())
        } else {
            Err(Error::BufferLength {
                len,
                bytes_per_page: self.bytes_per_page,
            })
        }
    }
}

impl PageStorage for PagePrefix<'_> {
    fn n_ranks(&self) -> u32 {
        self.inner.n_ranks()
    }

    fn n_pages(&self) -> u32 {
        self.inner.n_pages()
    }

    fn bytes_per_page(&self) -> usize {
        self.bytes_per_page
    }

    fn read(&self, rank: u32, page: PageId, dst: &mut [u8]) -> Result<()> {
        self.check_len(dst.len())?;
        if self.whole() {
            return self.inner.read(rank, page, dst);
        }
        self.inner.read_prefix(rank, page, dst)
    }

    fn read_run(&self, rank: u32, first: PageId, dst: &mut [u8]) -> Result<()> {
        if self.whole() {
            return self.inner.read_run(rank, first, dst);
        }
        // Prefixes of consecutive pool pages are not contiguous: page by page.
        read_run_by_page(self, rank, first, dst)
    }

    fn read_prefix(&self, rank: u32, page: PageId, dst: &mut [u8]) -> Result<()> {
        super::check_prefix_len(dst.len(), self.bytes_per_page)?;
        self.inner.read_prefix(rank, page, dst)
    }

    fn write(&self, rank: u32, page: PageId, src: &[u8]) -> Result<()> {
        self.check_len(src.len())?;
        self.inner.write_prefix(rank, page, src)
    }

    fn write_prefix(&self, rank: u32, page: PageId, src: &[u8]) -> Result<()> {
        super::check_prefix_len(src.len(), self.bytes_per_page)?;
        self.inner.write_prefix(rank, page, src)
    }

    fn copy(&self, rank: u32, src: PageId, dst: PageId) -> Result<()> {
        self.inner.copy(rank, src, dst)
    }
}
