//! Quantized weight matrices (Q4_1 and Q8_0) and their products with activations, the way llama.cpp's CPU
//! backend computes them: each activation row is quantized to 8 bits in blocks of 32 (Q8_1 against Q4_1
//! weights, Q8_0 against Q8_0 weights; scale `max|x| / 127`, values rounded half to even, the scale and the
//! block sum stored as `f16`), each block's product is an integer sum, and the blocks are combined in `f32`
//! in block order.
//!
//! Q4_1 block (20 bytes): scale `d` (`f16`), minimum `m` (`f16`), 16 bytes of nibbles; element `j < 16` is
//! `d * (qs[j] & 15) + m` and element `j + 16` is `d * (qs[j] >> 4) + m`. Q8_0 block (34 bytes): scale `d`
//! (`f16`), 32 signed bytes; element `j` is `d * qs[j]`.
//!
//! Every output is one fixed sequence of operations over its weight row and its activation row: rayon
//! splits the rows across threads, never a sum, so results do not depend on the batch or the thread count.

use half::f16;
use rayon::prelude::*;

use crate::error::{LlamaError, LlamaResult};
use crate::gguf::{GgmlType, TensorInfo};

/// Elements per quantization block.
pub(crate) const BLOCK: usize = 32;
/// Output rows per rayon task of a matrix product.
const ROWS_PER_TASK: usize = 32;

/// A weight matrix of `rows` rows of `cols` inputs, each row whole blocks.
#[derive(Debug)]
pub(crate) struct QMatrix {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    /// Per block, row-major: the scale.
    d: Vec<f32>,
    /// Per block (Q4_1 only; empty for Q8_0): the minimum.
    m: Vec<f32>,
    /// Per block, the 32 quantized values unpacked to one byte each (Q4_1: 0..=15, Q8_0: signed).
    qs: Vec<i8>,
    kind: Kind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Q4_1,
    Q8_0,
}

/// One activation row quantized to 8 bits in blocks of 32.
#[derive(Clone, Debug, Default)]
pub(crate) struct QActs {
    /// Per block: the scale, rounded through `f16`.
    d: Vec<f32>,
    /// Per block: `d * sum(qs)`, rounded through `f16` (Q8_1's sum term).
    s: Vec<f32>,
    qs: Vec<i8>,
}

fn half(bytes: &[u8]) -> f32 {
    f16::from_le_bytes([bytes[0], bytes[1]]).to_f32()
}

fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

impl QMatrix {
    /// The matrix of tensor `info` (dimensions `[cols, rows]`) from the file's `bytes`. Errors: `Tensor`
    /// when its dimensions are not `[cols, rows]`, `Quantization` when it is neither Q4_1 nor Q8_0.
    pub(crate) fn load(
        info: &TensorInfo,
        bytes: &[u8],
        cols: usize,
        rows: usize,
    ) -> LlamaResult<QMatrix> {
        check_dims(info, &[cols as u64, rows as u64])?;
        let kind = match info.ty.id {
            GgmlType::Q4_1 => Kind::Q4_1,
            GgmlType::Q8_0 => Kind::Q8_0,
            _ => {
                return Err(LlamaError::Quantization {
                    tensor: info.name.clone(),
                    type_id: info.ty.id,
                    type_name: info.ty.name,
                    expected: "a matrix must be Q4_1 or Q8_0",
                });
            }
        };
        let data = &bytes[info.start as usize..(info.start + info.len) as usize];
        let n_blocks = rows * cols / BLOCK;
        let mut d = Vec::with_capacity(n_blocks);
        let mut m = Vec::new();
        let mut qs = Vec::with_capacity(n_blocks * BLOCK);
        match kind {
            Kind::Q4_1 => {
                m.reserve(n_blocks);
                for block in data.chunks_exact(20) {
                    d.push(half(&block[0..2]));
                    m.push(half(&block[2..4]));
                    let nibbles = &block[4..20];
                    qs.extend(nibbles.iter().map(|&q| (q & 0x0f) as i8));
                    qs.extend(nibbles.iter().map(|&q| (q >> 4) as i8));
                }
            }
            Kind::Q8_0 => {
                for block in data.chunks_exact(34) {
                    d.push(half(&block[0..2]));
                    qs.extend(block[2..34].iter().map(|&q| q as i8));
                }
            }
        }
        debug_assert_eq!(d.len(), n_blocks);
        Ok(QMatrix {
            rows,
            cols,
            d,
            m,
            qs,
            kind,
        })
    }

    /// Row `row` dequantized into `out` (`cols` values): the embedding lookup.
    pub(crate) fn row(&self, row: usize, out: &mut [f32]) {
        let blocks = self.cols / BLOCK;
        for b in 0..blocks {
            let idx = row * blocks + b;
            let q = &self.qs[idx * BLOCK..(idx + 1) * BLOCK];
            let o = &mut out[b * BLOCK..(b + 1) * BLOCK];
            match self.kind {
                Kind::Q4_1 => {
                    for (o, &q) in o.iter_mut().zip(q) {
                        *o = f32::from(q) * self.d[idx] + self.m[idx];
                    }
                }
                Kind::Q8_0 => {
                    for (o, &q) in o.iter_mut().zip(q) {
                        *o = f32::from(q) * self.d[idx];
                    }
                }
            }
        }
    }

    /// `out[t * rows + r] = row r . x_t` for each quantized activation row `x_t` of `acts`.
    pub(crate) fn matmul(&self, acts: &[QActs], out: &mut [f32]) {
        let n = acts.len();
        debug_assert_eq!(out.len(), n * self.rows);
        let blocks = self.cols / BLOCK;
        // Computed row-major by weight row (each task owns its rows), then transposed.
        let mut by_row = vec![0.0f32; n * self.rows];
        by_row
            .par_chunks_mut(ROWS_PER_TASK * n)
            .enumerate()
            .for_each(|(task, chunk)| {
                let first = task * ROWS_PER_TASK;
                let mut sums = vec![0.0f32; n];
                for (i, outs) in chunk.chunks_exact_mut(n).enumerate() {
                    let row = first + i;
                    sums.fill(0.0);
                    for b in 0..blocks {
                        let idx = row * blocks + b;
                        let wq = &self.qs.as_chunks::<BLOCK>().0[idx];
                        let wd = self.d[idx];
                        for (sum, a) in sums.iter_mut().zip(acts) {
                            let aq = &a.qs.as_chunks::<BLOCK>().0[b];
                            let sumi = dot_i8(wq, aq) as f32;
                            *sum += match self.kind {
                                Kind::Q4_1 => (wd * a.d[b]) * sumi + self.m[idx] * a.s[b],
                                Kind::Q8_0 => (wd * a.d[b]) * sumi,
                            };
                        }
                    }
                    outs.copy_from_slice(&sums);
                }
            });
        for (r, values) in by_row.chunks_exact(n).enumerate() {
            for (t, &v) in values.iter().enumerate() {
                out[t * self.rows + r] = v;
            }
        }
    }
}

/// Checks that tensor `info` has dimensions `dims` (innermost first).
pub(crate) fn check_dims(info: &TensorInfo, dims: &[u64]) -> LlamaResult<()> {
    if info.dims != dims {
        return Err(LlamaError::Tensor {
            tensor: info.name.clone(),
            problem: format!(
                "dimensions {:?}, but the hyperparameters make it {dims:?}",
                info.dims
            ),
        });
    }
    Ok(())
}

/// The `f32` vector of tensor `info`, which must be F32 of `len` elements.
pub(crate) fn load_f32(info: &TensorInfo, bytes: &[u8], len: usize) -> LlamaResult<Vec<f32>> {
    check_dims(info, &[len as u64])?;
    if info.ty.id != GgmlType::F32 {
        return Err(LlamaError::Quantization {
            tensor: info.name.clone(),
            type_id: info.ty.id,
            type_name: info.ty.name,
            expected: "a norm weight must be F32",
        });
    }
    let data = &bytes[info.start as usize..(info.start + info.len) as usize];
    Ok(data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

/// `sum(a[i] * b[i])` over one block, in integers (exact, so its order does not matter).
#[inline]
fn dot_i8(a: &[i8; BLOCK], b: &[i8; BLOCK]) -> i32 {
    let mut sum = 0i32;
    for i in 0..BLOCK {
        sum += i32::from(a[i]) * i32::from(b[i]);
    }
    sum
}

impl QActs {
    /// Quantizes `x` (whole blocks) in place of `self`: per block `amax = max|x|`, `d = amax / 127`,
    /// `q = round_half_even(x * 127 / amax)`, `s = d * sum(q)`; `d` and `s` rounded through `f16` as
    /// llama.cpp stores them.
    pub(crate) fn quantize(&mut self, x: &[f32]) {
        let blocks = x.len() / BLOCK;
        self.d.clear();
        self.s.clear();
        self.qs.clear();
        for block in x.chunks_exact(BLOCK) {
            let mut amax = 0.0f32;
            for &v in block {
                amax = amax.max(v.abs());
            }
            let d = amax / 127.0;
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            let mut sum = 0i32;
            for &v in block {
                let q = (v * id).round_ties_even() as i8;
                sum += i32::from(q);
                self.qs.push(q);
            }
            self.d.push(round_f16(d));
            self.s.push(round_f16(d * sum as f32));
        }
        debug_assert_eq!(self.d.len(), blocks);
    }
}
