//! Where a sequence's keys and values live between forward passes.
//!
//! The forward pass sees a sequence's KV through [`KvStore`] only: it writes the keys and values of its new
//! positions layer by layer, then reads the keys and values of every position up to its last one. Keys and
//! values are `f32`, `kv_dim = kv_heads * head_dim` per position and layer, heads in order.
//!
//! [`ContiguousKv`] keeps them in one buffer per layer. A store over the engine's page tables implements the
//! same trait: `write` scatters each position's row to `page_table[pos / block_tokens]` at slot
//! `pos % block_tokens` (the layer's offset inside the page), and `read` gathers the pages of `0..len` into
//! an owned buffer (`Cow::Owned`), or borrows when the pages happen to be one contiguous range. Nothing in
//! the forward pass changes.

use std::borrow::Cow;

use crate::error::{LlamaError, LlamaResult};

/// A sequence's KV cache, one entry per (layer, position).
pub trait KvStore: Send + Sync {
    /// Positions it can hold: a write past it fails.
    fn capacity(&self) -> usize;

    /// Positions held (`0..len` are written). The forward pass appends at `len` only.
    fn len(&self) -> usize;

    /// Whether no position is held.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes the keys and values of positions `first..first + n` of `layer`, `n` rows of `kv_dim` values
    /// each in `keys` and `values`. Positions become held once the last layer is written. Errors:
    /// `Forward` when `first` is not the current length or the positions exceed the capacity.
    fn write(
        &mut self,
        layer: usize,
        first: usize,
        keys: &[f32],
        values: &[f32],
    ) -> LlamaResult<()>;

    /// The keys and values of positions `0..len` of `layer` (`len` rows of `kv_dim`), written in this pass
    /// or before.
    fn read(&self, layer: usize, len: usize) -> (Cow<'_, [f32]>, Cow<'_, [f32]>);

    /// Forgets every position from `len` on (a sequence cut back, or a cache reused).
    fn truncate(&mut self, len: usize);
}

/// A KV store of `capacity` positions in one contiguous buffer per layer for keys and one for values.
#[derive(Clone, Debug)]
pub struct ContiguousKv {
    kv_dim: usize,
    capacity: usize,
    len: usize,
    /// Positions written in the last layer's terms: a pass writes every layer, then `len` advances.
    pending: usize,
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
}

impl ContiguousKv {
    /// An empty store of `capacity` positions for `layers` layers of `kv_dim` values per position. It
    /// allocates `2 * layers * capacity * kv_dim` floats up front.
    pub fn new(layers: usize, kv_dim: usize, capacity: usize) -> ContiguousKv {
        ContiguousKv {
            kv_dim,
            capacity,
            len: 0,
            pending: 0,
            keys: vec![vec![0.0; capacity * kv_dim]; layers],
            values: vec![vec![0.0; capacity * kv_dim]; layers],
        }
    }

    /// The bits of every key and value held, layer by layer (for comparing two stores).
    pub fn bits(&self) -> Vec<u32> {
        let n = self.len * self.kv_dim;
        self.keys
            .iter()
            .chain(&self.values)
            .flat_map(|buf| buf[..n].iter().map(|v| v.to_bits()))
            .collect()
    }
}

impl KvStore for ContiguousKv {
    fn capacity(&self) -> usize {
        self.capacity
    }

    fn len(&self) -> usize {
        self.len
    }

    fn write(
        &mut self,
        layer: usize,
        first: usize,
        keys: &[f32],
        values: &[f32],
    ) -> LlamaResult<()> {
        let n = keys.len() / self.kv_dim;
        if first != self.len {
            return Err(LlamaError::Forward(format!(
                "KV write at position {first}, but the store holds {} positions",
                self.len
            )));
        }
        if first + n > self.capacity || layer >= self.keys.len() {
            return Err(LlamaError::Forward(format!(
                "KV write of positions {first}..{} in layer {layer} past the store's {} positions of {} \
                 layers",
                first + n,
                self.capacity,
                self.keys.len()
            )));
        }
        let range = first * self.kv_dim..(first + n) * self.kv_dim;
        self.keys[layer][range.clone()].copy_from_slice(keys);
        self.values[layer][range].copy_from_slice(values);
        self.pending = first + n;
        if layer + 1 == self.keys.len() {
            self.len = self.pending;
        }
        Ok(())
    }

    fn read(&self, layer: usize, len: usize) -> (Cow<'_, [f32]>, Cow<'_, [f32]>) {
        let n = len * self.kv_dim;
        (
            Cow::Borrowed(&self.keys[layer][..n]),
            Cow::Borrowed(&self.values[layer][..n]),
        )
    }

    fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
        self.pending = self.len;
    }
}
