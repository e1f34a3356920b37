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

/// One rank's pages of a checkpoint in shared buffers: page `i` is bytes `[i * bytes_per_page, (i + 1) *
/// bytes_per_page)` of its `n_bytes`, the last one shorter when `n_bytes` is not a multiple. They lie in one
/// buffer, or two: the pages of an earlier capture of the same prefix, shared, then its own
/// (`RankPages::extending`). Clones and ranges share the buffers. Compares as its pages' bytes.
#[derive(Clone)]
pub struct RankPages {
    first: Segment,
    /// The pages after `first`, which then holds whole pages only.
    second: Option<Segment>,
    bytes_per_page: usize,
}

/// Bytes `[start, start + n_bytes)` of a shared buffer.
#[derive(Clone)]
struct Segment {
    buffer: Arc<[u8]>,
    start: usize,
    n_bytes: usize,
}

impl Segment {
    fn new(buffer: Arc<[u8]>) -> Segment {
        Segment {
            n_bytes: buffer.len(),
            buffer,
            start: 0,
        }
    }

    fn bytes(&self) -> &[u8] {
        // `start + n_bytes` lies inside `buffer` by construction.
        self.buffer
            .get(self.start..self.start + self.n_bytes)
            .unwrap_or_default()
    }

    /// Its bytes `[from, to)` (clamped).
    fn sub(&self, from: usize, to: usize) -> Segment {
        let to = to.min(self.n_bytes);
        let from = from.min(to);
        Segment {
            buffer: Arc::clone(&self.buffer),
            start: self.start + from,
            n_bytes: to - from,
        }
    }
}

impl RankPages {
    /// `n_pages` pages of `bytes_per_page` zeroed bytes, filled by `fill` (the whole buffer, page by page)
    /// before anyone else sees them; `fill`'s error is returned as it is. A `bytes_per_page` of 0 counts as 1.
    pub fn filled<E>(
        n_pages: usize,
        bytes_per_page: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<RankPages, E> {
        let bytes_per_page = bytes_per_page.max(1);
        Ok(RankPages {
            first: Segment::new(filled_buffer(n_pages.saturating_mul(bytes_per_page), fill)?),
            second: None,
            bytes_per_page,
        })
    }

    /// `prefix`'s pages, shared, then `n_pages - prefix.len()` more pages filled by `fill` (those pages'
    /// bytes only): a capture of a longer prefix of the same tokens, whose first pages an earlier capture
    /// already holds (no new page: `prefix` itself, `fill` not called). `None` (nothing filled) unless
    /// `prefix` is one buffer of whole pages of `bytes_per_page` and no longer than `n_pages`. `fill`'s error
    /// is returned as it is.
    pub fn extending<E>(
        prefix: &RankPages,
        n_pages: usize,
        bytes_per_page: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Option<Result<RankPages, E>> {
        let bytes_per_page = bytes_per_page.max(1);
        let usable = prefix.second.is_none()
            && prefix.bytes_per_page == bytes_per_page
            && prefix.first.n_bytes.is_multiple_of(bytes_per_page)
            && prefix.len() <= n_pages;
        if !usable {
            return None;
        }
        let n_new = (n_pages - prefix.len()).saturating_mul(bytes_per_page);
        if n_new == 0 {
            return Some(Ok(prefix.clone()));
        }
        Some(filled_buffer(n_new, fill).map(|buffer| RankPages {
            first: prefix.first.clone(),
            second: Some(Segment::new(buffer)),
            bytes_per_page,
        }))
    }

    /// `bytes` cut into pages of `bytes_per_page` (0 counts as 1), the last one shorter when the length is
    /// not a multiple.
    pub fn new(bytes: Vec<u8>, bytes_per_page: usize) -> RankPages {
        RankPages {
            first: Segment::new(Arc::from(bytes)),
            second: None,
            bytes_per_page: bytes_per_page.max(1),
        }
    }

    /// The pages `pages`, in order, each `bytes_per_page` long (the caller's to check: a shorter page shifts
    /// the ones after it).
    pub(crate) fn from_pages<'a>(
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
        self.n_bytes().div_ceil(self.bytes_per_page)
    }

    /// Whether it holds no page.
    pub fn is_empty(&self) -> bool {
        self.n_bytes() == 0
    }

    /// Bytes of every page but perhaps the last.
    pub fn bytes_per_page(&self) -> usize {
        self.bytes_per_page
    }

    /// Bytes in all.
    pub fn n_bytes(&self) -> usize {
        self.first.n_bytes + self.second.as_ref().map_or(0, |second| second.n_bytes)
    }

    /// The segment page `idx` lies in and its range there, if it has that page.
    fn locate(&self, idx: usize) -> Option<(&Segment, std::ops::Range<usize>)> {
        let mut start = idx.checked_mul(self.bytes_per_page)?;
        let mut segment = &self.first;
        if start >= self.first.n_bytes {
            start -= self.first.n_bytes;
            segment = self.second.as_ref()?;
        }
        let end = start
            .saturating_add(self.bytes_per_page)
            .min(segment.n_bytes);
        (start < segment.n_bytes).then(|| (segment, segment.start + start..segment.start + end))
    }

    /// Bytes of page `idx`, if it has one.
    pub fn page(&self, idx: usize) -> Option<&[u8]> {
        let (segment, range) = self.locate(idx)?;
        segment.buffer.get(range)
    }

    /// Every page's bytes, in order.
    pub fn pages(&self) -> impl Iterator<Item = &[u8]> {
        let second = self.second.as_ref().map_or(&[][..], Segment::bytes);
        self.first
            .bytes()
            .chunks(self.bytes_per_page)
            .chain(second.chunks(self.bytes_per_page))
    }

    /// A view of page `idx` sharing its buffer (for a copy engine), if it has one.
    pub fn page_buf(&self, idx: usize) -> Option<PageBuf> {
        let (segment, range) = self.locate(idx)?;
        Some(PageBuf {
            buffer: Arc::clone(&segment.buffer),
            range,
        })
    }

    /// Its pages `pages` (clamped to the pages it has), sharing the buffers.
    pub fn range(&self, pages: Range<usize>) -> RankPages {
        let end = pages
            .end
            .saturating_mul(self.bytes_per_page)
            .min(self.n_bytes());
        let start = pages.start.saturating_mul(self.bytes_per_page).min(end);
        let split = self.first.n_bytes;
        let (first, second) = match &self.second {
            Some(second) if end > split && start < split => (
                self.first.sub(start, split),
                Some(second.sub(0, end - split)),
            ),
            Some(second) if start >= split => (second.sub(start - split, end - split), None),
            _ => (self.first.sub(start, end), None),
        };
        RankPages {
            first,
            second,
            bytes_per_page: self.bytes_per_page,
        }
    }
}

/// A buffer of `n_bytes` zeroed bytes, filled by `fill` before anyone else sees it.
fn filled_buffer<E>(
    n_bytes: usize,
    fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
) -> Result<Arc<[u8]>, E> {
    // Allocated where it stays: `Arc::from` a `Vec` would copy every byte into a second allocation. A new
    // `Arc` is unique, so `make_mut` hands out its bytes without cloning them.
    let mut buffer: Arc<[u8]> = std::iter::repeat_n(0u8, n_bytes).collect();
    fill(Arc::make_mut(&mut buffer))?;
    Ok(buffer)
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
        // Extending a capture shares its pages and fills only the new ones.
        let prefix = RankPages::new((0..8u8).collect(), 4);
        let longer = RankPages::extending(&prefix, 3, 4, |bytes| {
            assert_eq!(bytes.len(), 4, "only the new page");
            bytes.copy_from_slice(&[8, 9, 10, 11]);
            Ok::<(), ()>(())
        });
        let longer = longer.unwrap().unwrap();
        let flat = RankPages::new((0..12u8).collect(), 4);
        assert_eq!(longer, flat);
        assert_eq!(longer.n_bytes(), 12);
        for idx in 0..4 {
            assert_eq!(longer.page(idx), flat.page(idx));
            assert_eq!(longer.page_buf(idx), flat.page_buf(idx));
        }
        for (from, to) in [(0, 1), (0, 2), (1, 3), (2, 3), (0, 3), (3, 5), (1, 1)] {
            assert_eq!(longer.range(from..to), flat.range(from..to), "{from}..{to}");
            assert_eq!(longer.range(from..to).len(), flat.range(from..to).len());
        }
        assert_eq!(
            RankPages::extending(&prefix, 2, 4, |_| Err::<(), _>(())),
            Some(Ok(prefix.clone()))
        );
        assert!(
            RankPages::extending(&prefix, 1, 4, |_| Ok::<(), ()>(())).is_none(),
            "a longer prefix"
        );
        assert!(
            RankPages::extending(&prefix, 3, 2, |_| Ok::<(), ()>(())).is_none(),
            "another page size"
        );
        assert!(
            RankPages::extending(&longer, 4, 4, |_| Ok::<(), ()>(())).is_none(),
            "two buffers already"
        );
        assert!(
            RankPages::extending(
                &RankPages::new(vec![1, 2, 3], 2),
                3,
                2,
                |_| Ok::<(), ()>(())
            )
            .is_none(),
            "a partial last page"
        );
        assert_eq!(
            RankPages::extending(&prefix, 3, 4, |_| Err("no")),
            Some(Err("no"))
        );
    }
}
