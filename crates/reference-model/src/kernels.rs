//! The reference model's numeric kernels, each computing every output by one fixed sequence of `f32`
//! operations that depends only on the shapes of the model: no reduction depends on the batch, the chunk
//! or the thread count. Rust never reassociates or contracts floating-point operations, so the order written
//! here is the order executed.

use super::weights::Matrix;

/// Added to the mean square before the square root of the RMS norm.
const RMS_EPS: f32 = 1e-5;
/// Independent accumulators of [`dot`]: a fixed shape that lets the compiler vectorize.
const LANES: usize = 8;
/// Dimensions of a head's weighted value sum accumulated in registers at once.
const VALUE_BLOCK: usize = 16;

/// `sum(a[i] * b[i])` accumulated in `LANES` interleaved partial sums, combined in lane order, then the tail.
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0.0f32; LANES];
    let a_chunks = a.chunks_exact(LANES);
    let b_chunks = b.chunks_exact(LANES);
    let (a_tail, b_tail) = (a_chunks.remainder(), b_chunks.remainder());
    for (a8, b8) in a_chunks.zip(b_chunks) {
        for lane in 0..LANES {
            acc[lane] += a8[lane] * b8[lane];
        }
    }
    let mut sum = 0.0f32;
    for partial in acc {
        sum += partial;
    }
    for (x, y) in a_tail.iter().zip(b_tail) {
        sum += x * y;
    }
    sum
}

/// `out = x M`: every output accumulated over the inputs in order.
pub(crate) fn vec_mat(x: &[f32], m: &Matrix, out: &mut [f32]) {
    debug_assert_eq!(x.len(), m.n_in);
    debug_assert_eq!(out.len(), m.n_out);
    out.fill(0.0);
    for (xi, row) in x.iter().zip(m.values.chunks_exact(m.n_out)) {
        axpy(*xi, row, out);
    }
}

/// `out += a * x`, element by element.
pub(crate) fn axpy(a: f32, x: &[f32], out: &mut [f32]) {
    for (o, xi) in out.iter_mut().zip(x) {
        *o += a * xi;
    }
}

/// `out = x / sqrt(mean(x^2) + eps)` (no gain).
pub(crate) fn rms_norm(x: &[f32], out: &mut [f32]) {
    let mean_square = dot(x, x) / x.len() as f32;
    let scale = 1.0 / (mean_square + RMS_EPS).sqrt();
    for (o, xi) in out.iter_mut().zip(x) {
        *o = xi * scale;
    }
}

/// `x * sigmoid(x)`.
pub(crate) fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// `1 / (1 + exp(-x))`.
pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// `e^x` from additions, multiplications and bit operations only (Cephes' `expf`: Cody-Waite range
/// reduction by `ln 2`, a degree-6 polynomial, the power of two built in the exponent bits), so its bits are
/// the same on every machine, unlike the platform's `expf`, and it vectorizes. Relative error about 1e-7;
/// the argument is clamped to `[-87, 88]` (below that, about 1.6e-38 instead of a subnormal or 0).
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 88.0);
    // Round to nearest (even) by adding 1.5 * 2^23: exact for |y| < 2^22, and the sum's low mantissa bits
    // are then `n` in two's complement, from which 2^n is built. No libm call, no float-to-int conversion.
    const ROUND: f32 = 12_582_912.0;
    const ROUND_BITS: u32 = 0x4b40_0000;
    let shifted = x * LOG2_E + ROUND;
    let n = shifted - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e_r = p * r * r + r + 1.0;
    // n is in [-126, 127]: a normal power of two.
    let two_n = f32::from_bits(shifted.to_bits().wrapping_sub(ROUND_BITS - 127) << 23);
    e_r * two_n
}

/// Rotary embedding of every head of `v` (heads of `inv_freq.len() * 2` values) at position `pos`: pair
/// `(2i, 2i + 1)` rotated by `pos * inv_freq[i]`, the angle computed in `f64`.
pub(crate) fn rope(v: &mut [f32], pos: u32, inv_freq: &[f64]) {
    let head_dim = 2 * inv_freq.len();
    for head in v.chunks_exact_mut(head_dim) {
        for (pair, freq) in head.chunks_exact_mut(2).zip(inv_freq) {
            let (sin, cos) = (f64::from(pos) * freq).sin_cos();
            let (sin, cos) = (sin as f32, cos as f32);
            let (x0, x1) = (pair[0], pair[1]);
            pair[0] = x0 * cos - x1 * sin;
            pair[1] = x0 * sin + x1 * cos;
        }
    }
}

/// The keys and values one attention head of one layer reads, in the attention page layout: `floats` holds
/// consecutive pages starting with the page of position `base_pos`; in each page of `page_floats` floats the
/// head's key of slot `s` starts at `key_offset + s * inner` and its value at `value_offset + s * inner`.
#[derive(Debug)]
pub(crate) struct PagedKv<'a> {
    pub(crate) floats: &'a [f32],
    pub(crate) base_pos: usize,
    pub(crate) tokens_per_page: usize,
    pub(crate) page_floats: usize,
    pub(crate) inner: usize,
    pub(crate) key_offset: usize,
    pub(crate) value_offset: usize,
}

impl PagedKv<'_> {
    /// Offsets in `floats` of the slots of positions `lo..=hi` in order, relative to the layer's keys or
    /// values (one division for the first, then page by page).
    fn slot_offsets(&self, lo: usize, hi: usize) -> impl Iterator<Item = usize> {
        let rel = lo - self.base_pos;
        let mut page_start = (rel / self.tokens_per_page) * self.page_floats;
        let mut slot = rel % self.tokens_per_page;
        (lo..=hi).map(move |_| {
            if slot == self.tokens_per_page {
                slot = 0;
                page_start += self.page_floats;
            }
            slot += 1;
            page_start + (slot - 1) * self.inner
        })
    }
}

/// Softmax attention of query `q` (one head) over positions `lo..=hi` of `kv`, into `out` (one head):
/// scores in position order and their maximum, the exponentials, then their sum and the weighted values
/// accumulated in position order, then one multiplication by the inverse sum. `scores` is scratch.
pub(crate) fn attend(
    q: &[f32],
    kv: &PagedKv<'_>,
    lo: usize,
    hi: usize,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let head_dim = q.len();
    let scale = 1.0 / (head_dim as f32).sqrt();
    scores.clear();
    // One allocation at most, of the final size, not a doubling per power of two of the context.
    scores.reserve(hi.saturating_sub(lo) + 1);
    let mut max = f32::NEG_INFINITY;
    for offset in kv.slot_offsets(lo, hi) {
        let start = offset + kv.key_offset;
        let score = dot(q, &kv.floats[start..start + head_dim]) * scale;
        max = max.max(score);
        scores.push(score);
    }
    for score in scores.iter_mut() {
        *score = exp(*score - max);
    }
    let mut sum = 0.0f32;
    for &weight in scores.iter() {
        sum += weight;
    }
    // The weighted values in blocks of `VALUE_BLOCK` dimensions held in registers, each over positions in
    // order.
    let mut dims = 0;
    while dims < head_dim {
        let width = VALUE_BLOCK.min(head_dim - dims);
        let mut acc = [0.0f32; VALUE_BLOCK];
        for (offset, &weight) in kv.slot_offsets(lo, hi).zip(scores.iter()) {
            let start = offset + kv.value_offset + dims;
            for (a, v) in acc.iter_mut().zip(&kv.floats[start..start + width]) {
                *a += weight * v;
            }
        }
        out[dims..dims + width].copy_from_slice(&acc[..width]);
        dims += width;
    }
    let inv_sum = 1.0 / sum;
    for o in out.iter_mut() {
        *o *= inv_sum;
    }
}

/// Index of the largest value, ties broken by the lowest index (NaN never wins); `None` when empty.
pub(crate) fn argmax(values: &[f32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (idx, &value) in values.iter().enumerate() {
        if !value.is_nan() && best.is_none_or(|(_, best_value)| value > best_value) {
            best = Some((idx, value));
        }
    }
    best.map(|(idx, _)| idx as u32)
}

/// Little-endian `f32`s of `bytes` into `out` (`bytes.len() == 4 * out.len()`).
pub(crate) fn floats_from_bytes(bytes: &[u8], out: &mut [f32]) {
    debug_assert_eq!(bytes.len(), out.len() * 4);
    for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

/// `values` as little-endian bytes into `out` (`out.len() == 4 * values.len()`).
pub(crate) fn floats_to_bytes(values: &[f32], out: &mut [u8]) {
    debug_assert_eq!(out.len(), values.len() * 4);
    for (b, v) in out.chunks_exact_mut(4).zip(values) {
        b.copy_from_slice(&v.to_le_bytes());
    }
}
