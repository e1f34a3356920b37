//! Checkpoint page bytes in shared buffers. `RankPages`: one rank's pages of a checkpoint in one buffer (a
//! capture reads its pages straight into it: one allocation per rank, no per-page record, and dropping it
//! is one release, not one per page). `PageBuf`: the bytes of one page, a cheap-to-clone view of a shared
//! buffer, which a restore hands a copy engine without copying.

use std::fmt;
use std::ops::{Deref, Range};
use std::sync::Arc;

/// The bytes of one page: `range` of a shared, immutable buffer. Compares, hashes and prints as its bytes.
#[derive(Clone)]
pub struct PageBuf {
    buffer: Arc<[u8]>,
    range: Range<usize>,
}

impl Deref for PageBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // `range` lies inside `buffer` by construction (`RankPages::page_buf`, `From`).
        self.buffer.get(self.range.clone()).unwrap_or_default()
    }
}

impl AsRef<[u8]> for PageBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl From<Vec<u8>> for PageBuf {
    fn from(bytes: Vec<u8>) -> Self {
        Arc::<[u8]>::from(bytes).into()
    }
}

impl From<&[u8]> for PageBuf {
    fn from(bytes: &[u8]) -> Self {
        Arc::<[u8]>::from(bytes).into()
    }
}

impl From<Arc<[u8]>> for PageBuf {
    fn from(buffer: Arc<[u8]>) -> Self {
        let range = 0..buffer.len();
        PageBuf { buffer, range }
    }
}

impl PartialEq for PageBuf {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for PageBuf {}

impl std::hash::Hash for PageBuf {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (**self).hash(state);
    }
}

impl fmt::Debug for PageBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

/// One rank's pages of a checkpoint in one shared buffer: page `i` is bytes `[i * bytes_per_page, (i + 1) *
/// bytes_per_page)` of its `n_bytes`, the last one shorter when `n_bytes` is not a multiple. Clones and
/// ranges share the buffer. Compares as its pages' bytes.
#[derive(Clone)]
pub struct RankPages {
    buffer: Arc<[u8]>,
    /// Where its first page starts in `buffer`.
    start: usize,
    n_bytes: usize,
    bytes_per_page: usize,
}

impl RankPages {
    /// `n_pages` pages of `bytes_per_page` zeroed bytes, filled by `fill` (the whole buffer, page by page) before
    /// anyone else sees them; `fill`'s error is returned as it is. A `bytes_per_page` of 0 counts as 1.
    pub fn filled<E>(
        n_pages: usize,
        bytes_per_page: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<RankPages, E> {
        let bytes_per_page = bytes_per_page.max(1);
        let n_bytes = n_pages.saturating_mul(bytes_per_page);
        // Built in place (a trusted-length iterator collects into the `Arc`'s own allocation, no copy).
        let mut buffer: Arc<[u8]> = std::iter::repeat_n(0u8, n_bytes).collect();
        if let Some(bytes) = Arc::get_mut(&mut buffer) {
            fill(bytes)?;
        }
        Ok(RankPages {
            buffer,
            start: 0,
            n_bytes,
            bytes_per_page,
        })
    }

    /// `bytes` cut into pages of `bytes_per_page` (0 counts as 1), the last one shorter when the length is
    /// not a multiple.
    pub fn new(bytes: Vec<u8>, bytes_per_page: usize) -> RankPages {
        let n_bytes = bytes.len();
        RankPages {
            buffer: Arc::from(bytes),
            start: 0,
            n_bytes,
            bytes_per_page: bytes_per_page.max(1),
        }
    }

    /// The pages `pages`, in order, each `bytes_per_page` long (the caller's to check: a shorter page shifts
    /// the ones after it).
    pub fn from_pages<'a>(
        pages: impl IntoIterator<Item = &'a [u8]>,
        bytes_per_page: usize,
    ) -> RankPages {
        RankPages::new(
            pages.into_iter().flatten().copied().collect(),
            bytes_per_page,
        )
    }

    /// Number of pages.
    pub fn len(&self) -> usize {
        self.n_bytes.div_ceil(self.bytes_per_page)
    }

    /// Whether it holds no page.
    pub fn is_empty(&self) -> bool {
        self.n_bytes == 0
    }

    /// Bytes of every page but perhaps the last.
    pub fn bytes_per_page(&self) -> usize {
        self.bytes_per_page
    }

    /// Bytes in all.
    pub fn n_bytes(&self) -> usize {
        self.n_bytes
    }

    /// Where page `idx` lies in `buffer`, if it has one.
    fn page_range(&self, idx: usize) -> Option<Range<usize>> {
        let start = idx.checked_mul(self.bytes_per_page)?;
        let end = start.saturating_add(self.bytes_per_page).min(self.n_bytes);
        (start < self.n_bytes).then(|| self.start + start..self.start + end)
    }

    /// Bytes of page `idx`, if it has one.
    pub fn page(&self, idx: usize) -> Option<&[u8]> {
        self.buffer.get(self.page_range(idx)?)
    }

    /// Every page's bytes, in order.
    pub fn pages(&self) -> impl Iterator<Item = &[u8]> {
        self.buffer
            .get(self.start..self.start + self.n_bytes)
            .unwrap_or_default()
            .chunks(self.bytes_per_page)
    }

    /// A view of page `idx` sharing the buffer (for a copy engine), if it has one.
    pub fn page_buf(&self, idx: usize) -> Option<PageBuf> {
        Some(PageBuf {
            buffer: Arc::clone(&self.buffer),
            range: self.page_range(idx)?,
        })
    }

    /// Its pages `pages` (clamped to the pages it has), sharing the buffer.
    pub fn range(&self, pages: Range<usize>) -> RankPages {
        let end = pages
            .end
            .saturating_mul(self.bytes_per_page)
            .min(self.n_bytes);
        let start = pages.start.saturating_mul(self.bytes_per_page).min(end);
        RankPages {
            start: self.start + start,
            n_bytes: end - start,
            ..self.clone()
        }
    }
}

impl Default for RankPages {
    fn default() -> Self {
        RankPages::new(Vec::new(), 1)
    }
}

impl PartialEq for RankPages {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.pages().eq(other.pages())
    }
}

impl Eq for RankPages {}

impl fmt::Debug for RankPages {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.pages()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::{PageBuf, RankPages};

    #[test]
    fn rank_pages_cut_one_buffer_into_pages_and_share_it() {
        let pages = RankPages::new((0..10u8).collect(), 4);
        let views = [vec![0u8, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]].map(PageBuf::from);
        assert_eq!(pages.len(), 3);
        assert_eq!(pages.n_bytes(), 10);
        for (idx, view) in views.iter().enumerate() {
            assert_eq!(pages.page(idx), Some(&view[..]));
            assert_eq!(pages.page_buf(idx).as_ref(), Some(view));
        }
        assert_eq!(
            pages.pages().collect::<Vec<_>>(),
            [&[0, 1, 2, 3][..], &[4, 5, 6, 7], &[8, 9]]
        );
        assert_eq!(pages.page(3), None);
        assert_eq!(pages.page_buf(3), None);
        assert_eq!(pages.page(usize::MAX), None, "no overflow on a huge index");
        assert_eq!(pages.range(0..2), RankPages::new((0..8u8).collect(), 4));
        assert_eq!(pages.range(0..usize::MAX), pages);
        assert!(pages.range(0..0).is_empty());
        assert!(pages.range(5..usize::MAX).is_empty());
        let tail = pages.range(1..3);
        assert_eq!(tail, RankPages::new((4..10u8).collect(), 4));
        assert_eq!(tail.page(1), Some(&[8u8, 9][..]));
        assert_eq!(tail.page_buf(0), Some(PageBuf::from(vec![4u8, 5, 6, 7])));
        assert_eq!(tail.range(1..2).page(0), Some(&[8u8, 9][..]));
        assert_eq!(
            RankPages::from_pages([&[0u8, 1, 2, 3][..], &[4, 5, 6, 7], &[8, 9]], 4),
            pages
        );
        assert_ne!(pages, pages.range(0..2));
        assert_eq!(format!("{:?}", pages.range(0..1)), "[[0, 1, 2, 3]]");
        assert_eq!(
            format!("{:?}", views[2]),
            "[8, 9]",
            "a view prints as its bytes"
        );
        assert_ne!(views[0], views[1]);
        assert_eq!(
            RankPages::new(vec![1, 2], 0).len(),
            2,
            "a zero size counts as one"
        );
        let filled = RankPages::filled(3, 2, |bytes| {
            bytes.copy_from_slice(&[1, 2, 3, 4, 5, 6]);
            Ok::<(), ()>(())
        });
        assert_eq!(filled, Ok(RankPages::new(vec![1, 2, 3, 4, 5, 6], 2)));
        assert_eq!(RankPages::filled(3, 2, |_| Err::<(), _>("no")), Err("no"));
        assert!(RankPages::default().is_empty());
    }
}
