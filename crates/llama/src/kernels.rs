//! The forward pass's `f32` kernels, each computing every output by one fixed sequence of operations that
//! depends only on the model's shapes and the token's position, never on the batch, the chunk or the thread
//! count. Rust never reassociates or contracts floating-point operations, so the order written is the order
//! executed. Where llama.cpp's CPU backend fixes a precision (the RMS norm's `f64` sum of squares, the
//! softmax's `f64` sum, the rotary angles stepped in `f32`), these kernels do the same.
//!
//! The forward pass calls them through [`simd`], which compiles them for AVX2 where the CPU has it: the
//! compiler vectorizes their loops wider, and since it never reorders nor fuses `f32` operations (no
//! fast-math, no FMA contraction), every output keeps its bits.

/// Runs `op` compiled for x86-64-v3 (AVX2) when the CPU has those features (detected at run time through
/// `pulp`, which proves them with its `V3` token), plainly otherwise. Its `call` (`#[inline(always)]`) and
/// the kernels it calls (`#[inline(always)]` too) are inlined into the compiled copy; a closure would not
/// be, so each use is a small struct.
#[inline(always)]
pub(crate) fn simd<Op: pulp::NullaryFnOnce>(op: Op) -> Op::Output {
    #[cfg(target_arch = "x86_64")]
    if let Some(v3) = pulp::x86::V3::try_new() {
        return v3.vectorize(op);
    }
    op.call()
}

/// `out = x / sqrt(mean(x^2) + eps) * weight`: the squares summed in `f64`, as llama.cpp does.
#[inline(always)]
pub(crate) fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let mut sum = 0.0f64;
    for &v in x {
        sum += f64::from(v * v);
    }
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = (v * scale) * w;
    }
}

/// Rotary embedding ("normal" GGML mode: pairs `(2i, 2i + 1)` of each head) of every head of `v` at
/// position `pos`. The angle of pair `i` is `pos * theta_scale^i`, stepped by multiplication in `f32` from
/// `theta_scale = base^(-2 / head_dim)` as llama.cpp's rope cache does; `sin` and `cos` are the platform's.
pub(crate) fn rope(v: &mut [f32], head_dim: usize, pos: usize, theta_scale: f32) {
    let mut sin_cos = Vec::with_capacity(head_dim / 2);
    let mut theta = pos as f32;
    for _ in 0..head_dim / 2 {
        sin_cos.push(theta.sin_cos());
        theta *= theta_scale;
    }
    for head in v.chunks_exact_mut(head_dim) {
        for (pair, &(sin, cos)) in head.chunks_exact_mut(2).zip(&sin_cos) {
            let (x0, x1) = (pair[0], pair[1]);
            pair[0] = x0 * cos - x1 * sin;
            pair[1] = x0 * sin + x1 * cos;
        }
    }
}

/// Softmax attention of one query head `q` over the first `n` positions of `keys` and `values` (rows of
/// `kv_dim`, this head's slice at `offset`), into `out`: scores `q . k * scale` in position order, their
/// maximum, the exponentials and their `f64` sum, the weights scaled by the inverse sum, then the weighted
/// values accumulated in position order. `scores` is scratch.
#[allow(clippy::too_many_arguments, reason = "one head's view of the KV rows")]
#[inline(always)]
pub(crate) fn attend(
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    kv_dim: usize,
    offset: usize,
    n: usize,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let head_dim = q.len();
    let scale = 1.0 / (head_dim as f32).sqrt();
    scores.clear();
    let mut max = f32::NEG_INFINITY;
    for p in 0..n {
        let k = &keys[p * kv_dim + offset..p * kv_dim + offset + head_dim];
        let score = dot(q, k) * scale;
        max = max.max(score);
        scores.push(score);
    }
    // The exponentials first (a loop the compiler vectorizes), then their sum in position order.
    for s in scores.iter_mut() {
        *s = exp(*s - max);
    }
    let mut sum = 0.0f64;
    for &s in scores.iter() {
        sum += f64::from(s);
    }
    let inv_sum = (1.0 / sum) as f32;
    for s in scores.iter_mut() {
        *s *= inv_sum;
    }
    out.fill(0.0);
    for (p, &w) in scores.iter().enumerate() {
        let v = &values[p * kv_dim + offset..p * kv_dim + offset + head_dim];
        for (o, &vi) in out.iter_mut().zip(v) {
            *o += w * vi;
        }
    }
}

/// Independent accumulators of [`dot`]: a fixed shape that lets the compiler vectorize.
const LANES: usize = 8;

/// `sum(a[i] * b[i])` accumulated in `LANES` interleaved partial sums, combined in lane order, then the tail.
#[inline(always)]
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

/// `silu(gate) * up`, element by element.
#[inline(always)]
pub(crate) fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + exp(-g)) * u;
    }
}

/// `e^x` from additions, multiplications and bit operations only (Cephes' `expf`: Cody-Waite range
/// reduction by `ln 2`, a degree-6 polynomial, the power of two built in the exponent bits), so its bits are
/// the same on every machine, unlike the platform's `expf`. Relative error about 1e-7; the argument is
/// clamped to `[-87, 88]`. (The engine's reference model uses the same function.)
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 88.0);
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
    let two_n = f32::from_bits(shifted.to_bits().wrapping_sub(ROUND_BITS - 127) << 23);
    e_r * two_n
}

/// Index of the largest value, ties broken by the lowest index (NaN never wins); `None` when empty.
pub fn argmax(values: &[f32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (idx, &value) in values.iter().enumerate() {
        if !value.is_nan() && best.is_none_or(|(_, best_value)| value > best_value) {
            best = Some((idx, value));
        }
    }
    best.map(|(idx, _)| idx as u32)
}
