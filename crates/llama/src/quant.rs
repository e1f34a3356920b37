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
//! In memory the rows are taken in groups of [`GROUP`] (the last one padded with zero rows) and each group
//! is stored block by block: for block `b`, the group's rows' quantized bytes one after another (Q4_1 kept
//! as its 16 bytes of nibbles), and their scales (and minimums) as [`GROUP`] consecutive `f32`. A kernel
//! computes a group's outputs together, each in its own lane.
//!
//! Every output is one fixed sequence of operations over its weight row and its activation row: the
//! integer block sums are exact (so any order computes them), then `sum += (d_w * d_a) * sumi (+ m_w * s_a)`
//! block after block in `f32`, never fused nor reordered. The portable kernel and the AVX2 one (chosen at
//! run time) give the same bits, and rayon splits the rows across threads, never a sum,
//! so results do not depend on the batch, the thread count or the machine's SIMD.

use half::f16;
use rayon::prelude::*;

use crate::error::{LlamaError, LlamaResult};
use crate::gguf::{GgmlType, TensorInfo};

#[cfg(target_arch = "x86_64")]
mod avx2;

/// Elements per quantization block.
pub(crate) const BLOCK: usize = 32;
/// Rows per group: the unit of the weight layout and of a kernel's outputs.
pub(crate) const GROUP: usize = 8;
/// Tasks per rayon thread a product is split into (so that uneven threads still balance).
const TASKS_PER_THREAD: usize = 4;
/// Least work of one rayon task, in (row, block, activation) products: smaller products are not split so
/// finely that scheduling costs more than the work.
const MIN_TASK_WORK: usize = 8192;

/// A weight matrix of `rows` rows of `cols` inputs, each row whole blocks, in groups of [`GROUP`] rows.
#[derive(Debug)]
pub(crate) struct QMatrix {
    pub(crate) rows: usize,
    /// Blocks per row: `cols / BLOCK`.
    blocks: usize,
    /// Row groups: `rows.div_ceil(GROUP)`.
    groups: usize,
    /// Per (group, block, row of the group): the scale.
    d: Vec<f32>,
    /// Per (group, block, row of the group), Q4_1 only (empty for Q8_0): the minimum.
    m: Vec<f32>,
    /// Per (group, block, row of the group): the block's quantized bytes as in the file (Q4_1: 16 bytes of
    /// nibbles, Q8_0: 32 signed bytes).
    qs: Vec<u8>,
    kind: Kind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Q4_1,
    Q8_0,
}

impl Kind {
    /// Bytes of a block in the file before its quantized values (scale, and minimum for Q4_1).
    fn header_bytes(self) -> usize {
        match self {
            Kind::Q4_1 => 4,
            Kind::Q8_0 => 2,
        }
    }

    /// Bytes of a block's quantized values.
    fn value_bytes(self) -> usize {
        match self {
            Kind::Q4_1 => BLOCK / 2,
            Kind::Q8_0 => BLOCK,
        }
    }
}

/// Which code computes a product; every kernel gives the same bits.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kernel {
    /// Plain Rust, on every machine.
    Portable,
    /// AVX2 (x86-64 with the `x86-64-v3` features, detected at run time).
    #[cfg(target_arch = "x86_64")]
    Avx2(pulp::x86::V3),
}

impl Kernel {
    /// The fastest kernel this machine runs.
    pub(crate) fn best() -> Kernel {
        #[cfg(target_arch = "x86_64")]
        if let Some(simd) = pulp::x86::V3::try_new() {
            return Kernel::Avx2(simd);
        }
        Kernel::Portable
    }
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
    /// when its dimensions are not `[cols, rows]` or `cols` is not whole blocks, `Quantization` when it is
    /// neither Q4_1 nor Q8_0.
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
        if cols == 0 || !cols.is_multiple_of(BLOCK) {
            return Err(LlamaError::Tensor {
                tensor: info.name.clone(),
                problem: format!("{cols} columns are not whole blocks of {BLOCK}"),
            });
        }
        let data = &bytes[info.start as usize..(info.start + info.len) as usize];
        let (blocks, groups) = (cols / BLOCK, rows.div_ceil(GROUP));
        let slots = groups * blocks * GROUP;
        let (header, values) = (kind.header_bytes(), kind.value_bytes());
        let mut d = vec![0.0; slots];
        let mut m = vec![0.0; if kind == Kind::Q4_1 { slots } else { 0 }];
        let mut qs = vec![0u8; slots * values];
        for (idx, block) in data
            .chunks_exact(header + values)
            .take(rows * blocks)
            .enumerate()
        {
            let (row, b) = (idx / blocks, idx % blocks);
            let slot = ((row / GROUP) * blocks + b) * GROUP + row % GROUP;
            d[slot] = half(&block[0..2]);
            if kind == Kind::Q4_1 {
                m[slot] = half(&block[2..4]);
            }
            qs[slot * values..(slot + 1) * values].copy_from_slice(&block[header..]);
        }
        Ok(QMatrix {
            rows,
            blocks,
            groups,
            d,
            m,
            qs,
            kind,
        })
    }

    /// Row `row` dequantized into `out` (`cols` values): the embedding lookup.
    pub(crate) fn row(&self, row: usize, out: &mut [f32]) {
        let values = self.kind.value_bytes();
        for (b, o) in out.chunks_exact_mut(BLOCK).take(self.blocks).enumerate() {
            let slot = ((row / GROUP) * self.blocks + b) * GROUP + row % GROUP;
            let q = &self.qs[slot * values..(slot + 1) * values];
            let d = self.d[slot];
            match self.kind {
                Kind::Q4_1 => {
                    let m = self.m[slot];
                    let (lo, hi) = o.split_at_mut(BLOCK / 2);
                    for ((lo, hi), &q) in lo.iter_mut().zip(hi).zip(q) {
                        *lo = f32::from(q & 0x0f) * d + m;
                        *hi = f32::from(q >> 4) * d + m;
                    }
                }
                Kind::Q8_0 => {
                    for (o, &q) in o.iter_mut().zip(q) {
                        *o = f32::from(q as i8) * d;
                    }
                }
            }
        }
    }

    /// `out[t * rows + r] = row r . x_t` for each quantized activation row `x_t` of `acts`, by the fastest
    /// kernel this machine runs.
    pub(crate) fn matmul(&self, acts: &[QActs], out: &mut [f32]) {
        self.matmul_with(Kernel::best(), acts, out);
    }

    /// [`QMatrix::matmul`] by `kernel`. Rayon tasks take whole groups of rows; with one activation row each
    /// task writes its rows of `out` in place, otherwise its rows of every activation into a buffer laid out
    /// by task, copied out after.
    pub(crate) fn matmul_with(&self, kernel: Kernel, acts: &[QActs], out: &mut [f32]) {
        let n = acts.len();
        debug_assert_eq!(out.len(), n * self.rows);
        if n == 0 || self.rows == 0 {
            return;
        }
        let per_task = self.rows_per_task(n);
        if n == 1 {
            out.par_chunks_mut(per_task)
                .enumerate()
                .for_each(|(task, chunk)| self.rows_into(kernel, task * per_task, acts, chunk));
            return;
        }
        let mut by_task = vec![0.0f32; n * self.rows];
        by_task
            .par_chunks_mut(per_task * n)
            .enumerate()
            .for_each(|(task, chunk)| self.rows_into(kernel, task * per_task, acts, chunk));
        for (task, chunk) in by_task.chunks(per_task * n).enumerate() {
            let (first, len) = (task * per_task, chunk.len() / n);
            for (t, values) in chunk.chunks_exact(len).enumerate() {
                out[t * self.rows + first..t * self.rows + first + len].copy_from_slice(values);
            }
        }
    }

    /// Rows per rayon task: whole groups, enough tasks to balance the threads, none under
    /// [`MIN_TASK_WORK`].
    fn rows_per_task(&self, n: usize) -> usize {
        let threads = rayon::current_num_threads().max(1);
        let by_balance = self.groups.div_ceil(threads * TASKS_PER_THREAD);
        let by_work = MIN_TASK_WORK.div_ceil(GROUP * self.blocks * n);
        by_balance.max(by_work).max(1) * GROUP
    }

    /// Rows `first..first + len` (`first` a multiple of [`GROUP`]) times every activation row into `out`,
    /// laid out `[activation][len]` with `len = out.len() / acts.len()`.
    fn rows_into(&self, kernel: Kernel, first: usize, acts: &[QActs], out: &mut [f32]) {
        match kernel {
            Kernel::Portable => self.rows_portable(first, acts, out),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2(simd) => avx2::rows(simd, self, first, acts, out),
        }
    }

    fn rows_portable(&self, first: usize, acts: &[QActs], out: &mut [f32]) {
        let len = out.len() / acts.len();
        for (i, start) in (0..len).step_by(GROUP).enumerate() {
            let width = GROUP.min(len - start);
            for (t, a) in acts.iter().enumerate() {
                let sums = self.group_portable(first / GROUP + i, a);
                out[t * len + start..t * len + start + width].copy_from_slice(&sums[..width]);
            }
        }
    }

    /// The outputs of group `g`'s rows against `a`, each summed over its blocks in order.
    fn group_portable(&self, g: usize, a: &QActs) -> [f32; GROUP] {
        let mut sums = [0.0f32; GROUP];
        let values = self.kind.value_bytes();
        for (b, aq) in
            a.qs.as_chunks::<BLOCK>()
                .0
                .iter()
                .enumerate()
                .take(self.blocks)
        {
            let (ad, asum) = (a.d[b], a.s[b]);
            for (i, sum) in sums.iter_mut().enumerate() {
                let slot = (g * self.blocks + b) * GROUP + i;
                let wq = &self.qs[slot * values..(slot + 1) * values];
                let wd = self.d[slot];
                *sum += match self.kind {
                    Kind::Q4_1 => (wd * ad) * dot_q4_1(wq, aq) as f32 + self.m[slot] * asum,
                    Kind::Q8_0 => (wd * ad) * dot_q8_0(wq, aq) as f32,
                };
            }
        }
        sums
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

/// One Q4_1 block (16 bytes of nibbles) times 32 activations, in integers (exact, so its order does not
/// matter).
#[inline]
fn dot_q4_1(w: &[u8], a: &[i8; BLOCK]) -> i32 {
    let (lo, hi) = a.split_at(BLOCK / 2);
    let mut sum = 0i32;
    for ((&q, &x), &y) in w.iter().zip(lo).zip(hi) {
        sum += i32::from(q & 0x0f) * i32::from(x) + i32::from(q >> 4) * i32::from(y);
    }
    sum
}

/// One Q8_0 block times 32 activations, in integers.
#[inline]
fn dot_q8_0(w: &[u8], a: &[i8; BLOCK]) -> i32 {
    let mut sum = 0i32;
    for (&q, &x) in w.iter().zip(a) {
        sum += i32::from(q as i8) * i32::from(x);
    }
    sum
}

impl QActs {
    /// Quantizes `x` (whole blocks) in place of `self`: per block `amax = max|x|`, `d = amax / 127`,
    /// `q = round_half_even(x * 127 / amax)`, `s = d * sum(q)`; `d` and `s` rounded through `f16` as
    /// llama.cpp stores them. A value is -128 only when `127 / amax` overflows (a block of subnormal
    /// magnitude), and then the block's scale rounds to 0, so its integer sum never reaches a product's
    /// bits (AVX2's signed byte product is not exact for -128 times -128).
    #[inline(always)]
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A seeded generator (xorshift), so every run tests the same values.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn byte(&mut self) -> u8 {
            self.next() as u8
        }

        fn f32(&mut self) -> f32 {
            (self.next() % 20_001) as f32 / 10_000.0 - 1.0
        }
    }

    /// The file bytes of a `rows` x `cols` matrix of `kind` with seeded blocks (scales of either sign,
    /// every byte value, so Q8_0 weights include -128).
    fn file_bytes(kind: Kind, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
        let mut data = Vec::new();
        for _ in 0..rows * cols / BLOCK {
            data.extend(f16::from_f32(rng.f32() * 0.1).to_le_bytes());
            if kind == Kind::Q4_1 {
                data.extend(f16::from_f32(rng.f32() * 0.1).to_le_bytes());
            }
            data.extend((0..kind.value_bytes()).map(|_| rng.byte()));
        }
        data
    }

    fn matrix(kind: Kind, rows: usize, cols: usize, data: &[u8]) -> QMatrix {
        let id = match kind {
            Kind::Q4_1 => GgmlType::Q4_1,
            Kind::Q8_0 => GgmlType::Q8_0,
        };
        let info = TensorInfo {
            name: "w".into(),
            dims: vec![cols as u64, rows as u64],
            ty: GgmlType::from_id(id).expect("a known type"),
            start: 0,
            len: data.len() as u64,
        };
        QMatrix::load(&info, data, cols, rows).expect("the matrix loads")
    }

    fn acts(n: usize, cols: usize, rng: &mut Rng) -> Vec<QActs> {
        (0..n)
            .map(|t| {
                // Rows of different magnitudes, one of them with a zero block.
                let x: Vec<f32> = (0..cols)
                    .map(|i| {
                        if t == 1 && i < BLOCK {
                            0.0
                        } else {
                            rng.f32() * (t + 1) as f32
                        }
                    })
                    .collect();
                let mut a = QActs::default();
                a.quantize(&x);
                a
            })
            .collect()
    }

    /// The product as the pre-layout code computed it, straight from the file's blocks: per output, the
    /// blocks in order, `sum += (d_w * d_a) * sumi (+ m_w * s_a)`.
    fn reference(kind: Kind, rows: usize, cols: usize, data: &[u8], acts: &[QActs]) -> Vec<f32> {
        let blocks = cols / BLOCK;
        let size = kind.header_bytes() + kind.value_bytes();
        let mut out = vec![0.0f32; acts.len() * rows];
        for (t, a) in acts.iter().enumerate() {
            for r in 0..rows {
                let mut sum = 0.0f32;
                for b in 0..blocks {
                    let block = &data[(r * blocks + b) * size..][..size];
                    let wd = half(&block[0..2]);
                    let q = &block[kind.header_bytes()..];
                    let aq = &a.qs[b * BLOCK..(b + 1) * BLOCK];
                    let mut sumi = 0i32;
                    for j in 0..BLOCK {
                        let w = match kind {
                            Kind::Q4_1 if j < 16 => i32::from(q[j] & 15),
                            Kind::Q4_1 => i32::from(q[j - 16] >> 4),
                            Kind::Q8_0 => i32::from(q[j] as i8),
                        };
                        sumi += w * i32::from(aq[j]);
                    }
                    sum += match kind {
                        Kind::Q4_1 => (wd * a.d[b]) * sumi as f32 + half(&block[2..4]) * a.s[b],
                        Kind::Q8_0 => (wd * a.d[b]) * sumi as f32,
                    };
                }
                out[t * rows + r] = sum;
            }
        }
        out
    }

    fn bits(values: &[f32]) -> Vec<u32> {
        values.iter().map(|v| v.to_bits()).collect()
    }

    fn product(m: &QMatrix, kernel: Kernel, acts: &[QActs]) -> Vec<f32> {
        let mut out = vec![f32::NAN; acts.len() * m.rows];
        m.matmul_with(kernel, acts, &mut out);
        out
    }

    #[test]
    fn every_kernel_computes_the_reference_products_bit_for_bit() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        // Row counts on and off the group size (the last group padded), one or several blocks, one or
        // several activation rows (the in-place and the by-task paths).
        for (rows, cols) in [(8, 32), (37, 96), (3, 64), (130, 160)] {
            for kind in [Kind::Q4_1, Kind::Q8_0] {
                let data = file_bytes(kind, rows, cols, &mut rng);
                let m = matrix(kind, rows, cols, &data);
                for n in [1, 3] {
                    let acts = acts(n, cols, &mut rng);
                    let want = bits(&reference(kind, rows, cols, &data, &acts));
                    let portable = product(&m, Kernel::Portable, &acts);
                    assert_eq!(
                        bits(&portable),
                        want,
                        "{kind:?} {rows}x{cols}, {n} rows: portable"
                    );
                    let best = product(&m, Kernel::best(), &acts);
                    assert_eq!(
                        bits(&best),
                        want,
                        "{kind:?} {rows}x{cols}, {n} rows: best kernel"
                    );
                }
            }
        }
    }

    #[test]
    fn a_product_with_activations_of_minus_128_is_the_same_on_every_kernel() {
        let mut rng = Rng(7);
        let (rows, cols) = (16, 64);
        // A block of subnormal magnitude: 127 / amax overflows, so -amax quantizes to -128 (and the
        // block's scale rounds to 0); the next block is ordinary.
        let tiny = f32::from_bits(1);
        let x: Vec<f32> = (0..cols)
            .map(|i| match (i < BLOCK, i % 2) {
                (true, 0) => -tiny,
                (true, _) => tiny,
                _ => rng.f32(),
            })
            .collect();
        let mut a = QActs::default();
        a.quantize(&x);
        assert!(a.qs.contains(&i8::MIN) && a.d[0] == 0.0, "{:?}", &a.qs[..4]);
        let acts = [a];
        for kind in [Kind::Q4_1, Kind::Q8_0] {
            let mut data = file_bytes(kind, rows, cols, &mut rng);
            // Every weight of the first row -128 (Q8_0), and a scale of infinity in the second row.
            let size = kind.header_bytes() + kind.value_bytes();
            for block in data.chunks_exact_mut(size).take(cols / BLOCK) {
                block[kind.header_bytes()..].fill(0x80);
            }
            data[(cols / BLOCK) * size..][..2].copy_from_slice(&f16::INFINITY.to_le_bytes());
            let m = matrix(kind, rows, cols, &data);
            let want = bits(&reference(kind, rows, cols, &data, &acts));
            assert_eq!(
                bits(&product(&m, Kernel::Portable, &acts)),
                want,
                "{kind:?}"
            );
            assert_eq!(bits(&product(&m, Kernel::best(), &acts)), want, "{kind:?}");
        }
    }

    #[test]
    fn a_row_lookup_dequantizes_the_file_s_row() {
        let mut rng = Rng(11);
        let (rows, cols) = (13, 64);
        for kind in [Kind::Q4_1, Kind::Q8_0] {
            let data = file_bytes(kind, rows, cols, &mut rng);
            let m = matrix(kind, rows, cols, &data);
            let size = kind.header_bytes() + kind.value_bytes();
            for r in [0, 7, 8, 12] {
                let mut got = vec![0.0f32; cols];
                m.row(r, &mut got);
                for (b, got) in got.chunks_exact(BLOCK).enumerate() {
                    let block = &data[(r * cols / BLOCK + b) * size..][..size];
                    let (d, q) = (half(&block[0..2]), &block[kind.header_bytes()..]);
                    for (j, &g) in got.iter().enumerate() {
                        let want = match kind {
                            Kind::Q4_1 => {
                                let nibble = if j < 16 { q[j] & 15 } else { q[j - 16] >> 4 };
                                f32::from(nibble) * d + half(&block[2..4])
                            }
                            Kind::Q8_0 => f32::from(q[j] as i8) * d,
                        };
                        assert_eq!(g.to_bits(), want.to_bits(), "{kind:?} row {r} value {j}");
                    }
                }
            }
        }
    }

    #[test]
    fn columns_that_are_not_whole_blocks_are_refused() {
        let data = vec![0u8; 20];
        let info = TensorInfo {
            name: "w".into(),
            dims: vec![16, 2],
            ty: GgmlType::from_id(GgmlType::Q4_1).expect("a known type"),
            start: 0,
            len: 20,
        };
        let err = QMatrix::load(&info, &data, 16, 2).unwrap_err();
        assert!(matches!(err, LlamaError::Tensor { .. }), "{err}");
    }
}
