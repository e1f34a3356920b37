//! A sequence's KV cache in fixed-size pages: the engine's page tables plugged into the forward pass.
//!
//! Page layout ([`PageLayout`]): a page holds `block_tokens` consecutive positions of every layer; for each
//! layer in order, the keys of its positions (`block_tokens` rows of `kv_dim` `f32`, little-endian), then
//! their values. Position `p` lives in page `p / block_tokens`, slot `p % block_tokens`. Slots past the
//! sequence's length are zero. A page may be larger than the layout: the rest is zero.
//!
//! [`PagedKv`] loads the pages of positions `0..len` through a [`PageAccess`] (one read per page), serves the
//! forward pass as a [`KvStore`], and [`PagedKv::flush`] writes back the pages of the positions it computed
//! (one write per page). The bits are those a [`ContiguousKv`] holds: a page round trip is exact.

use std::borrow::Cow;

use crate::error::{LlamaError, LlamaResult};
use crate::kv::{ContiguousKv, KvStore};

/// Where a sequence's pages are: its page table over some page storage.
pub trait PageAccess: Send + Sync {
    /// Pages in the sequence's table (page `i` holds positions `[i * block_tokens, (i + 1) * block_tokens)`).
    fn n_pages(&self) -> usize;
    /// Bytes of one page (at least the layout's).
    fn page_bytes(&self) -> usize;
    /// Reads page `index` of the table into `dst` (`page_bytes` long). Errors: `Pages`.
    fn read(&self, index: usize, dst: &mut [u8]) -> LlamaResult<()>;
    /// Overwrites page `index` of the table with `src` (`page_bytes` long). Errors: `Pages`.
    fn write(&self, index: usize, src: &[u8]) -> LlamaResult<()>;
}

/// How a model's KV cache is laid out in pages (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageLayout {
    /// Layers of the model.
    pub layers: usize,
    /// Values per position and layer: `kv_heads * head_dim`.
    pub kv_dim: usize,
    /// Positions per page.
    pub block_tokens: usize,
}

impl PageLayout {
    /// Bytes of one page: `layers * 2 * block_tokens * kv_dim * 4`.
    pub fn bytes_per_page(&self) -> usize {
        self.layers * 2 * self.block_tokens * self.kv_dim * 4
    }

    /// Bytes of one layer's keys (or values) in a page.
    fn half_bytes(&self) -> usize {
        self.block_tokens * self.kv_dim * 4
    }

    /// Encodes positions `first..end` of `kv` (all of one page, `first` its first slot) into `page`, zero
    /// past `end`.
    pub fn encode(&self, kv: &dyn KvStore, first: usize, end: usize, page: &mut [u8]) {
        page.fill(0);
        let end = end.min(kv.len()).min(first + self.block_tokens);
        if end <= first {
            return;
        }
        let half = self.half_bytes();
        let rows = (end - first) * self.kv_dim;
        for (layer, chunk) in page
            .chunks_exact_mut(2 * half)
            .take(self.layers)
            .enumerate()
        {
            let (keys, values) = kv.read(layer, end);
            let (k_out, v_out) = chunk.split_at_mut(half);
            let from = first * self.kv_dim;
            put_f32s(keys.get(from..from + rows).unwrap_or_default(), k_out);
            put_f32s(values.get(from..from + rows).unwrap_or_default(), v_out);
        }
    }
}

fn put_f32s(values: &[f32], out: &mut [u8]) {
    for (value, bytes) in values.iter().zip(out.as_chunks_mut::<4>().0) {
        *bytes = value.to_le_bytes();
    }
}

fn get_f32s(bytes: &[u8], out: &mut Vec<f32>) {
    out.clear();
    out.extend(
        bytes
            .as_chunks::<4>()
            .0
            .iter()
            .map(|b| f32::from_le_bytes(*b)),
    );
}

/// A sequence's KV loaded from its pages, written back by [`PagedKv::flush`].
pub struct PagedKv<'a> {
    layout: PageLayout,
    pages: &'a dyn PageAccess,
    kv: ContiguousKv,
    /// Positions loaded from the pages: the pages from `loaded / block_tokens` on are written back.
    loaded: usize,
}

impl std::fmt::Debug for PagedKv<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PagedKv")
            .field("layout", &self.layout)
            .field("loaded", &self.loaded)
            .field("len", &self.kv.len())
            .finish()
    }
}

impl<'a> PagedKv<'a> {
    /// Loads positions `0..len` from `pages`; the store's capacity is every position the table holds.
    /// Errors: `Pages` when the pages are smaller than the layout or `len` is past the table, and the
    /// page reads' errors.
    pub fn load(
        layout: PageLayout,
        pages: &'a dyn PageAccess,
        len: usize,
    ) -> LlamaResult<PagedKv<'a>> {
        let page_bytes = pages.page_bytes();
        if layout.block_tokens == 0 || layout.kv_dim == 0 || page_bytes < layout.bytes_per_page() {
            return Err(LlamaError::Pages(format!(
                "pages of {page_bytes} bytes cannot hold the layout {layout:?} ({} bytes)",
                layout.bytes_per_page()
            )));
        }
        let capacity = pages.n_pages() * layout.block_tokens;
        if len > capacity {
            return Err(LlamaError::Pages(format!(
                "{len} positions to load, but the table's {} pages hold {capacity}",
                pages.n_pages()
            )));
        }
        let mut kv = ContiguousKv::new(layout.layers, layout.kv_dim, capacity);
        let mut page = vec![0u8; page_bytes];
        let (mut keys, mut values) = (Vec::new(), Vec::new());
        let half = layout.half_bytes();
        for index in 0..len.div_ceil(layout.block_tokens) {
            pages.read(index, &mut page)?;
            let first = index * layout.block_tokens;
            let rows = (len - first).min(layout.block_tokens) * layout.kv_dim * 4;
            for (layer, chunk) in page.chunks_exact(2 * half).take(layout.layers).enumerate() {
                let (k, v) = chunk.split_at(half);
                get_f32s(k.get(..rows).unwrap_or_default(), &mut keys);
                get_f32s(v.get(..rows).unwrap_or_default(), &mut values);
                kv.write(layer, first, &keys, &values)?;
            }
        }
        Ok(PagedKv {
            layout,
            pages,
            kv,
            loaded: len,
        })
    }

    /// Writes back every page holding a position computed since the load (a partial first page whole).
    /// Errors: the page writes' errors.
    pub fn flush(&self) -> LlamaResult<()> {
        let tokens = self.layout.block_tokens;
        let len = self.kv.len();
        let mut page = vec![0u8; self.pages.page_bytes()];
        for index in self.loaded / tokens..len.div_ceil(tokens) {
            let first = index * tokens;
            self.layout
                .encode(&self.kv, first, len.min(first + tokens), &mut page);
            self.pages.write(index, &page)?;
        }
        Ok(())
    }
}

impl KvStore for PagedKv<'_> {
    fn capacity(&self) -> usize {
        self.kv.capacity()
    }

    fn len(&self) -> usize {
        self.kv.len()
    }

    fn write(
        &mut self,
        layer: usize,
        first: usize,
        keys: &[f32],
        values: &[f32],
    ) -> LlamaResult<()> {
        self.kv.write(layer, first, keys, values)
    }

    fn read(&self, layer: usize, len: usize) -> (Cow<'_, [f32]>, Cow<'_, [f32]>) {
        self.kv.read(layer, len)
    }

    fn truncate(&mut self, len: usize) {
        self.kv.truncate(len);
        self.loaded = self.loaded.min(len);
    }
}
