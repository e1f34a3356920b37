//! The AVX2 kernel of the matrix products: the same outputs, bit for bit, as the portable one.
//!
//! Per group of [`GROUP`] rows and block, the eight integer block sums are computed together (`vpmaddubsw`
//! of unsigned weight bytes by signed activation bytes, exact: no pair of products reaches `i16`'s
//! limit; Q8_0 weights enter as `|w|` with the activation's sign flipped where `w < 0`), reduced with
//! horizontal adds into one lane per row, converted to `f32` (exact: below 2^24), and combined into the
//! row's sum with the portable kernel's operations in its order, one lane per row: a multiply of the two
//! scales, a multiply by the sum, (Q4_1: plus the minimum times the activation block's sum), then the add.
//! No fused multiply-add. Dispatched safely through `pulp`: its `V3` token proves the CPU has the
//! features, and its `vectorize` runs this code compiled for them.

use core::arch::x86_64::{__m128i, __m256, __m256i};

use pulp::NullaryFnOnce;
use pulp::bytemuck::{cast, cast_ref};
use pulp::x86::V3;

use super::{BLOCK, GROUP, QActs, QMatrix};

/// Rows `first..` of `matrix` times `acts` into `out` (see `QMatrix::rows_into`).
pub(super) fn rows(simd: V3, matrix: &QMatrix, first: usize, acts: &[QActs], out: &mut [f32]) {
    simd.vectorize(Rows {
        simd,
        matrix,
        first,
        acts,
        out,
    });
}

struct Rows<'a> {
    simd: V3,
    matrix: &'a QMatrix,
    first: usize,
    acts: &'a [QActs],
    out: &'a mut [f32],
}

impl NullaryFnOnce for Rows<'_> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        let Rows {
            simd,
            matrix,
            first,
            acts,
            out,
        } = self;
        let len = out.len() / acts.len().max(1);
        for (i, start) in (0..len).step_by(GROUP).enumerate() {
            let width = GROUP.min(len - start);
            let g = first / GROUP + i;
            for (t, a) in acts.iter().enumerate() {
                let sums: [f32; GROUP] = cast(if matrix.kind == super::Kind::Q4_1 {
                    group_q4_1(simd, matrix, g, a)
                } else {
                    group_q8_0(simd, matrix, g, a)
                });
                out[t * len + start..t * len + start + width].copy_from_slice(&sums[..width]);
            }
        }
    }
}

/// Group `g` of a Q4_1 matrix against `a`: one lane per row.
#[inline(always)]
fn group_q4_1(simd: V3, m: &QMatrix, g: usize, a: &QActs) -> __m256 {
    let (avx, avx2) = (simd.avx, simd.avx2);
    // The horizontal adds leave rows in the order 0 2 4 6 1 3 5 7.
    let order = avx._mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let qs = m.qs.as_chunks::<{ GROUP * BLOCK / 2 }>().0;
    let (ds, ms) = (m.d.as_chunks::<GROUP>().0, m.m.as_chunks::<GROUP>().0);
    let mut acc = avx._mm256_setzero_ps();
    for (b, aq) in
        a.qs.as_chunks::<BLOCK>()
            .0
            .iter()
            .enumerate()
            .take(m.blocks)
    {
        let gb = g * m.blocks + b;
        let halves: &[[i8; BLOCK / 2]; 2] = cast_ref(aq);
        let a_lo = avx2._mm256_broadcastsi128_si256(cast::<_, __m128i>(halves[0]));
        let a_hi = avx2._mm256_broadcastsi128_si256(cast::<_, __m128i>(halves[1]));
        // Two rows per 32 bytes: the low 128 bits one row's nibbles, the high the next row's.
        let pairs: &[[u8; BLOCK]; GROUP / 2] = cast_ref(&qs[gb]);
        let mut sums = [avx._mm256_setzero_si256(); GROUP / 2];
        for (sum, &pair) in sums.iter_mut().zip(pairs) {
            *sum = nibbles_dot(simd, cast(pair), a_lo, a_hi);
        }
        let h = avx2._mm256_hadd_epi32(
            avx2._mm256_hadd_epi32(sums[0], sums[1]),
            avx2._mm256_hadd_epi32(sums[2], sums[3]),
        );
        let sumi = avx._mm256_cvtepi32_ps(avx2._mm256_permutevar8x32_epi32(h, order));
        let wd: __m256 = cast(ds[gb]);
        let wm: __m256 = cast(ms[gb]);
        let scaled = avx._mm256_mul_ps(avx._mm256_mul_ps(wd, avx._mm256_set1_ps(a.d[b])), sumi);
        let term = avx._mm256_add_ps(scaled, avx._mm256_mul_ps(wm, avx._mm256_set1_ps(a.s[b])));
        acc = avx._mm256_add_ps(acc, term);
    }
    acc
}

/// Group `g` of a Q8_0 matrix against `a`: one lane per row. (`|w| * sign(a, w)` is exact but for -128 times
/// -128, and an activation of -128 comes with a block scale of 0: see `QActs::quantize`.)
#[inline(always)]
fn group_q8_0(simd: V3, m: &QMatrix, g: usize, a: &QActs) -> __m256 {
    let (avx, avx2) = (simd.avx, simd.avx2);
    let qs = m.qs.as_chunks::<{ GROUP * BLOCK }>().0;
    let ds = m.d.as_chunks::<GROUP>().0;
    let mut acc = avx._mm256_setzero_ps();
    for (b, aq) in
        a.qs.as_chunks::<BLOCK>()
            .0
            .iter()
            .enumerate()
            .take(m.blocks)
    {
        let gb = g * m.blocks + b;
        let x: __m256i = cast(*aq);
        let rows: &[[u8; BLOCK]; GROUP] = cast_ref(&qs[gb]);
        let mut sums = [avx._mm256_setzero_si256(); GROUP];
        for (sum, &row) in sums.iter_mut().zip(rows) {
            *sum = bytes_dot(simd, cast(row), x);
        }
        // `low`: rows 0-3 over the block's first 16 values (lanes 0-3) and over its last 16 (lanes 4-7);
        // `high`: rows 4-7 likewise.
        let low = avx2._mm256_hadd_epi32(
            avx2._mm256_hadd_epi32(sums[0], sums[1]),
            avx2._mm256_hadd_epi32(sums[2], sums[3]),
        );
        let high = avx2._mm256_hadd_epi32(
            avx2._mm256_hadd_epi32(sums[4], sums[5]),
            avx2._mm256_hadd_epi32(sums[6], sums[7]),
        );
        let h = avx2._mm256_add_epi32(
            avx2._mm256_permute2x128_si256::<0x20>(low, high),
            avx2._mm256_permute2x128_si256::<0x31>(low, high),
        );
        let sumi = avx._mm256_cvtepi32_ps(h);
        let wd: __m256 = cast(ds[gb]);
        let scaled = avx._mm256_mul_ps(avx._mm256_mul_ps(wd, avx._mm256_set1_ps(a.d[b])), sumi);
        acc = avx._mm256_add_ps(acc, scaled);
    }
    acc
}

/// Two Q4_1 rows' nibbles (`w`: one row per 128 bits) times one activation block (`a_lo`, `a_hi`: its first
/// and last 16 values in both halves): four `i32` partial sums per row.
#[inline(always)]
fn nibbles_dot(simd: V3, w: __m256i, a_lo: __m256i, a_hi: __m256i) -> __m256i {
    let (avx, avx2) = (simd.avx, simd.avx2);
    let nibble = avx._mm256_set1_epi8(0x0f);
    let lo = avx2._mm256_and_si256(w, nibble);
    let hi = avx2._mm256_and_si256(avx2._mm256_srli_epi16::<4>(w), nibble);
    let pairs = avx2._mm256_add_epi16(
        avx2._mm256_maddubs_epi16(lo, a_lo),
        avx2._mm256_maddubs_epi16(hi, a_hi),
    );
    avx2._mm256_madd_epi16(pairs, avx._mm256_set1_epi16(1))
}

/// One Q8_0 row's 32 signed bytes times one activation block: eight `i32` partial sums.
#[inline(always)]
fn bytes_dot(simd: V3, w: __m256i, x: __m256i) -> __m256i {
    let (avx, avx2) = (simd.avx, simd.avx2);
    let pairs = avx2._mm256_maddubs_epi16(avx2._mm256_abs_epi8(w), avx2._mm256_sign_epi8(x, w));
    avx2._mm256_madd_epi16(pairs, avx._mm256_set1_epi16(1))
}
