//! `PageBuf`: the bytes of one checkpoint page, a cheap-to-clone view of a shared buffer. A capture copies all
//! its pages into one buffer and hands out one view per page (one allocation per checkpoint, not per page);
//! a restore hands the views to a copy engine without copying; a part of a checkpoint shares its pages.

use std::fmt;
use std::ops::{Deref, Range};
use std::sync::Arc;

/// The bytes of one page: `range` of a shared, immutable buffer. Compares, hashes and prints as its bytes.
#[derive(Clone)]
pub struct PageBuf {
    buffer: Arc<[u8]>,
    range: Range<usize>,
}

impl PageBuf {
    /// One view per `bytes_per_page` bytes of `bytes`, in order, sharing one buffer; the last view is shorter
    /// when the length is not a multiple. No view for empty bytes; a `bytes_per_page` of 0 counts as 1.
    pub fn split(bytes: Vec<u8>, bytes_per_page: usize) -> Vec<PageBuf> {
        let bytes_per_page = bytes_per_page.max(1);
        let len = bytes.len();
        let buffer: Arc<[u8]> = Arc::from(bytes);
        (0..len)
            .step_by(bytes_per_page)
            .map(|start| PageBuf {
                buffer: Arc::clone(&buffer),
                range: start..(start + bytes_per_page).min(len),
            })
            .collect()
    }
}

impl Deref for PageBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // `range` lies inside `buffer` by construction (`split`, `From`).
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

#[cfg(test)]
mod tests {
    use super::PageBuf;

    #[test]
    fn split_views_share_one_buffer_and_compare_as_bytes() {
        let pages = PageBuf::split((0..10u8).collect(), 4);
        assert_eq!(pages.len(), 3);
        assert_eq!(&pages[0][..], &[0, 1, 2, 3]);
        assert_eq!(&pages[1][..], &[4, 5, 6, 7]);
        assert_eq!(&pages[2][..], &[8, 9], "a shorter last view");
        assert_eq!(pages[1], PageBuf::from(vec![4u8, 5, 6, 7]));
        assert_ne!(pages[0], pages[1]);
        assert_eq!(format!("{:?}", pages[2]), "[8, 9]");
        assert!(PageBuf::split(Vec::new(), 4).is_empty());
        assert_eq!(
            PageBuf::split(vec![1, 2], 0).len(),
            2,
            "a zero size splits bytes"
        );
    }
}
