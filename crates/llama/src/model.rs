//! The Llama model: hyperparameters and weights from a GGUF file, and the batched forward pass.

use std::path::Path;

use rayon::prelude::*;

use crate::error::{LlamaError, LlamaResult};
use crate::gguf::Gguf;
use crate::kernels;
use crate::kv::KvStore;
use crate::quant::{BLOCK, QActs, QMatrix, load_f32};

/// Largest size of any one hyperparameter accepted (a file stating more is refused before it is used).
const MAX_DIM: u64 = 1 << 20;
/// Most layers accepted.
const MAX_LAYERS: u64 = 1024;

/// The hyperparameters, every one read from the file.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// Transformer blocks (`llama.block_count`).
    pub layers: usize,
    /// Width of the residual stream (`llama.embedding_length`).
    pub embedding: usize,
    /// Width of the feed-forward's hidden layer (`llama.feed_forward_length`).
    pub feed_forward: usize,
    /// Query heads (`llama.attention.head_count`).
    pub heads: usize,
    /// Key and value heads (`llama.attention.head_count_kv`), each shared by `heads / kv_heads` queries.
    pub kv_heads: usize,
    /// Values per head: `embedding / heads` (and `llama.rope.dimension_count`, when stated, must equal it).
    pub head_dim: usize,
    /// Base of the rotary frequencies (`llama.rope.freq_base`, 10,000 when absent).
    pub rope_base: f32,
    /// Epsilon of the RMS norms (`llama.attention.layer_norm_rms_epsilon`).
    pub rms_eps: f32,
    /// Vocabulary size (`llama.vocab_size`, or the length of `tokenizer.ggml.tokens`).
    pub vocab: usize,
    /// Context the model was trained for (`llama.context_length`).
    pub context: usize,
    /// Whether the output projection is the token embedding (the file has no `output.weight`).
    pub tied_embeddings: bool,
}

impl LlamaConfig {
    /// Values per position and layer in the KV cache: `kv_heads * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    fn from_gguf(gguf: &Gguf) -> LlamaResult<LlamaConfig> {
        let arch = gguf.get_str("general.architecture")?;
        if arch != "llama" {
            return Err(LlamaError::Architecture(arch.to_string()));
        }
        let dim = |key: &str, max: u64| -> LlamaResult<usize> {
            let v = gguf.get_u64(key)?;
            if v == 0 || v > max {
                return Err(LlamaError::Metadata {
                    key: key.into(),
                    problem: format!("{v} is outside 1..={max}"),
                });
            }
            Ok(v as usize)
        };
        let layers = dim("llama.block_count", MAX_LAYERS)?;
        let embedding = dim("llama.embedding_length", MAX_DIM)?;
        let feed_forward = dim("llama.feed_forward_length", MAX_DIM)?;
        let heads = dim("llama.attention.head_count", MAX_DIM)?;
        let kv_heads = dim("llama.attention.head_count_kv", MAX_DIM)?;
        let context = dim("llama.context_length", 1 << 24)?;
        let vocab = match gguf.metadata.get("llama.vocab_size") {
            Some(_) => dim("llama.vocab_size", 1 << 24)?,
            None => gguf.get_array("tokenizer.ggml.tokens")?.len(),
        };
        let rope_base = match gguf.metadata.get("llama.rope.freq_base") {
            Some(_) => gguf.get_f32("llama.rope.freq_base")?,
            None => 10_000.0,
        };
        let rms_eps = gguf.get_f32("llama.attention.layer_norm_rms_epsilon")?;
        let bad = |s: String| Err(LlamaError::Hyperparameters(s));
        if embedding % heads != 0 {
            return bad(format!(
                "{heads} heads do not divide the embedding of {embedding}"
            ));
        }
        let head_dim = embedding / heads;
        if heads % kv_heads != 0 {
            return bad(format!("{kv_heads} KV heads do not divide {heads} heads"));
        }
        if head_dim % 2 != 0 {
            return bad(format!("head size {head_dim} is odd (rotary pairs)"));
        }
        if embedding % BLOCK != 0 || feed_forward % BLOCK != 0 {
            return bad(format!(
                "embedding {embedding} and feed-forward {feed_forward} must be multiples of {BLOCK}"
            ));
        }
        if gguf.metadata.contains_key("llama.rope.dimension_count") {
            let rot = gguf.get_u64("llama.rope.dimension_count")?;
            if rot != head_dim as u64 {
                return bad(format!(
                    "rotary dimension {rot} is not the head size {head_dim} (partial rotary is not \
                     supported)"
                ));
            }
        }
        if !(rope_base.is_finite() && rope_base > 1.0 && rms_eps.is_finite() && rms_eps > 0.0) {
            return bad(format!("rope base {rope_base} or norm epsilon {rms_eps}"));
        }
        Ok(LlamaConfig {
            layers,
            embedding,
            feed_forward,
            heads,
            kv_heads,
            head_dim,
            rope_base,
            rms_eps,
            vocab,
            context,
            tied_embeddings: gguf.tensor("output.weight").is_none(),
        })
    }
}

#[derive(Debug)]
struct Layer {
    attn_norm: Vec<f32>,
    wq: QMatrix,
    wk: QMatrix,
    wv: QMatrix,
    wo: QMatrix,
    ffn_norm: Vec<f32>,
    gate: QMatrix,
    up: QMatrix,
    down: QMatrix,
}

/// A loaded Llama model: its hyperparameters, weights and the file's metadata (for the tokenizer).
#[derive(Debug)]
pub struct Llama {
    config: LlamaConfig,
    embed: QMatrix,
    layers: Vec<Layer>,
    output_norm: Vec<f32>,
    /// `None` when tied to the embedding.
    output: Option<QMatrix>,
    theta_scale: f32,
    gguf: Gguf,
}

/// One sequence's work in a forward pass: its new tokens at positions `kv.len()..kv.len() + tokens.len()`.
#[derive(Debug)]
pub struct Entry<'a> {
    /// The new tokens (at least one), each below the vocabulary size.
    pub tokens: &'a [u32],
    /// The sequence's KV: it holds the positions before the new tokens and receives theirs.
    pub kv: &'a mut dyn KvStore,
    /// Whether to compute the logits of the last new token.
    pub want_logits: bool,
}

impl std::fmt::Debug for dyn KvStore + '_ {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvStore")
            .field("len", &self.len())
            .field("capacity", &self.capacity())
            .finish()
    }
}

impl Llama {
    /// Loads the model file at `path` (read whole into memory, then parsed; the weights are unpacked and
    /// the file's bytes dropped). Errors: `Io` and every error of [`Llama::from_bytes`].
    pub fn load(path: &Path) -> LlamaResult<Llama> {
        let bytes = std::fs::read(path).map_err(|source| LlamaError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Llama::from_bytes(&bytes)
    }

    /// Parses a model from the bytes of a GGUF file. Errors: those of `Gguf::parse`; `Architecture`;
    /// `Metadata` and `Hyperparameters` for missing or inconsistent hyperparameters; `Tensor` for a
    /// missing tensor or one whose dimensions the hyperparameters contradict; `Quantization` for a matrix
    /// that is neither Q4_1 nor Q8_0 or a norm that is not F32.
    pub fn from_bytes(bytes: &[u8]) -> LlamaResult<Llama> {
        let gguf = Gguf::parse(bytes)?;
        let config = LlamaConfig::from_gguf(&gguf)?;
        let tensor = |name: &str| {
            gguf.tensor(name).ok_or_else(|| LlamaError::Tensor {
                tensor: name.into(),
                problem: "missing".into(),
            })
        };
        let (e, f, kv) = (config.embedding, config.feed_forward, config.kv_dim());
        let embed = QMatrix::load(tensor("token_embd.weight")?, bytes, e, config.vocab)?;
        let mut layers = Vec::with_capacity(config.layers);
        for l in 0..config.layers {
            let t = |suffix: &str| tensor(&format!("blk.{l}.{suffix}.weight"));
            layers.push(Layer {
                attn_norm: load_f32(t("attn_norm")?, bytes, e)?,
                wq: QMatrix::load(t("attn_q")?, bytes, e, e)?,
                wk: QMatrix::load(t("attn_k")?, bytes, e, kv)?,
                wv: QMatrix::load(t("attn_v")?, bytes, e, kv)?,
                wo: QMatrix::load(t("attn_output")?, bytes, e, e)?,
                ffn_norm: load_f32(t("ffn_norm")?, bytes, e)?,
                gate: QMatrix::load(t("ffn_gate")?, bytes, e, f)?,
                up: QMatrix::load(t("ffn_up")?, bytes, e, f)?,
                down: QMatrix::load(t("ffn_down")?, bytes, f, e)?,
            });
        }
        let output_norm = load_f32(tensor("output_norm.weight")?, bytes, e)?;
        let output = match gguf.tensor("output.weight") {
            Some(info) => Some(QMatrix::load(info, bytes, e, config.vocab)?),
            None => None,
        };
        let theta_scale = config.rope_base.powf(-2.0 / config.head_dim as f32);
        Ok(Llama {
            config,
            embed,
            layers,
            output_norm,
            output,
            theta_scale,
            gguf,
        })
    }

    /// The hyperparameters.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// The file's metadata and tensor table.
    pub fn gguf(&self) -> &Gguf {
        &self.gguf
    }

    /// Runs `batch`: every entry's new tokens through every layer, their keys and values appended to its
    /// KV store, and the logits of its last token when asked (`None` otherwise), in batch order. The batch
    /// is checked whole before any KV is written. Each token's values depend only on its sequence's tokens
    /// and positions, never on the other entries, how a prompt is split into passes, or the thread count.
    /// Errors: `Forward` for an empty entry, a token outside the vocabulary, or positions past the store's
    /// capacity or the model's context.
    pub fn forward(&self, batch: &mut [Entry<'_>]) -> LlamaResult<Vec<Option<Vec<f32>>>> {
        // The whole pass runs on one of rayon's workers: its parallel loops (a dozen per layer) then start
        // where the other workers steal from, rather than each handing its job to the pool from outside
        // and blocking until it is done.
        rayon::scope(|_| self.forward_in_pool(batch))
    }

    fn forward_in_pool(&self, batch: &mut [Entry<'_>]) -> LlamaResult<Vec<Option<Vec<f32>>>> {
        let tokens = self.batch_tokens(batch)?;
        let e = self.config.embedding;
        let mut x = vec![0.0f32; tokens.len() * e];
        x.par_chunks_mut(e)
            .zip(&tokens)
            .for_each(|(row, &(_, _, t))| self.embed.row(t as usize, row));
        let mut s = Scratch::new(&self.config, batch, tokens);
        for (l, layer) in self.layers.iter().enumerate() {
            self.attention(l, layer, batch, &mut x, &mut s)?;
            self.feed_forward(layer, &mut x, &mut s);
        }
        Ok(self.last_logits(batch, &x))
    }

    /// Where each of `batch`'s tokens comes from, `(entry, position, token)`, the batch checked whole.
    fn batch_tokens(&self, batch: &[Entry<'_>]) -> LlamaResult<Vec<(usize, usize, u32)>> {
        let c = &self.config;
        let mut tokens = Vec::new();
        for (idx, entry) in batch.iter().enumerate() {
            let first = entry.kv.len();
            let end = first + entry.tokens.len();
            if entry.tokens.is_empty() {
                return Err(LlamaError::Forward(format!("entry {idx} has no token")));
            }
            if let Some(&t) = entry.tokens.iter().find(|&&t| t as usize >= c.vocab) {
                return Err(LlamaError::Forward(format!(
                    "entry {idx}: token {t} is outside the vocabulary of {}",
                    c.vocab
                )));
            }
            if end > entry.kv.capacity() || end > c.context {
                return Err(LlamaError::Forward(format!(
                    "entry {idx}: positions up to {end} exceed the KV store's {} or the model's context \
                     of {}",
                    entry.kv.capacity(),
                    c.context
                )));
            }
            tokens.extend(
                entry
                    .tokens
                    .iter()
                    .enumerate()
                    .map(|(i, &t)| (idx, first + i, t)),
            );
        }
        Ok(tokens)
    }

    /// Layer `l`'s attention block: the batch's keys and values rotated and appended to each entry's
    /// store, each token attending to its own sequence, the projection added to `x`.
    fn attention(
        &self,
        l: usize,
        layer: &Layer,
        batch: &mut [Entry<'_>],
        x: &mut [f32],
        s: &mut Scratch,
    ) -> LlamaResult<()> {
        let c = &self.config;
        let (e, kv_dim) = (c.embedding, c.kv_dim());
        self.norm_and_quantize(x, &layer.attn_norm, &mut s.xn, &mut s.acts);
        layer.wq.matmul(&s.acts, &mut s.q);
        layer.wk.matmul(&s.acts, &mut s.k);
        layer.wv.matmul(&s.acts, &mut s.v);
        s.q.par_chunks_mut(e)
            .zip(s.k.par_chunks_mut(kv_dim))
            .zip(&s.tokens)
            .for_each(|((q, k), &(_, pos, _))| {
                kernels::rope(q, c.head_dim, pos, self.theta_scale);
                kernels::rope(k, c.head_dim, pos, self.theta_scale);
            });
        let mut start = 0;
        for (entry, &first) in batch.iter_mut().zip(&s.firsts) {
            let len = entry.tokens.len();
            let rows = start * kv_dim..(start + len) * kv_dim;
            entry.kv.write(l, first, &s.k[rows.clone()], &s.v[rows])?;
            start += len;
        }
        let views: Vec<_> = batch
            .iter()
            .zip(&s.firsts)
            .map(|(entry, &first)| entry.kv.read(l, first + entry.tokens.len()))
            .collect();
        let group = c.heads / c.kv_heads;
        s.attn
            .par_chunks_mut(e)
            .zip(s.q.par_chunks(e))
            .zip(&s.tokens)
            .for_each_init(Vec::new, |scores, ((out, q), &(entry, pos, _))| {
                let (keys, values) = &views[entry];
                kernels::simd(Heads {
                    q,
                    keys,
                    values,
                    kv_dim,
                    head_dim: c.head_dim,
                    group,
                    len: pos + 1,
                    scores,
                    out,
                });
            });
        drop(views);
        quantize_rows(&s.attn, e, &mut s.acts);
        layer.wo.matmul(&s.acts, &mut s.proj);
        add(x, &s.proj);
        Ok(())
    }

    /// A layer's SwiGLU feed-forward block, its output added to `x`.
    fn feed_forward(&self, layer: &Layer, x: &mut [f32], s: &mut Scratch) {
        let ff = self.config.feed_forward;
        self.norm_and_quantize(x, &layer.ffn_norm, &mut s.xn, &mut s.acts);
        layer.gate.matmul(&s.acts, &mut s.gate);
        layer.up.matmul(&s.acts, &mut s.up);
        s.hidden
            .par_chunks_mut(ff)
            .zip(s.gate.par_chunks(ff))
            .zip(s.up.par_chunks(ff))
            .for_each(|((out, gate), up)| kernels::simd(Swiglu { gate, up, out }));
        quantize_rows(&s.hidden, ff, &mut s.acts);
        layer.down.matmul(&s.acts, &mut s.proj);
        add(x, &s.proj);
    }

    /// The logits of each asking entry's last token (computed as one product), `None` for the others.
    fn last_logits(&self, batch: &[Entry<'_>], x: &[f32]) -> Vec<Option<Vec<f32>>> {
        let c = &self.config;
        let e = c.embedding;
        let mut last = Vec::new();
        let mut start = 0;
        for entry in batch.iter() {
            start += entry.tokens.len();
            if entry.want_logits {
                last.push(start - 1);
            }
        }
        let mut results = vec![None; batch.len()];
        if last.is_empty() {
            return results;
        }
        let mut final_x = vec![0.0f32; last.len() * e];
        for (row, &t) in final_x.chunks_exact_mut(e).zip(&last) {
            row.copy_from_slice(&x[t * e..(t + 1) * e]);
        }
        let mut normed = vec![0.0f32; last.len() * e];
        let mut final_acts = vec![QActs::default(); last.len()];
        self.norm_and_quantize(&final_x, &self.output_norm, &mut normed, &mut final_acts);
        let output = self.output.as_ref().unwrap_or(&self.embed);
        let mut logits = vec![0.0f32; last.len() * c.vocab];
        output.matmul(&final_acts, &mut logits);
        let mut rows = logits.chunks_exact(c.vocab);
        for (result, entry) in results.iter_mut().zip(batch.iter()) {
            if entry.want_logits {
                *result = rows.next().map(<[f32]>::to_vec);
            }
        }
        results
    }

    /// `out = rms_norm(x) * weight` row by row, and each row quantized into `acts`.
    fn norm_and_quantize(&self, x: &[f32], weight: &[f32], out: &mut [f32], acts: &mut [QActs]) {
        let e = self.config.embedding;
        let eps = self.config.rms_eps;
        out.par_chunks_mut(e)
            .zip(x.par_chunks(e))
            .zip(acts.par_iter_mut())
            .for_each(|((out, x), acts)| {
                kernels::simd(NormQuantize {
                    x,
                    weight,
                    eps,
                    out,
                    acts,
                });
            });
    }
}

/// The buffers of one forward pass, sized for its tokens, reused by every layer.
struct Scratch {
    /// Where each token comes from: (entry, position, token).
    tokens: Vec<(usize, usize, u32)>,
    /// Each entry's first new position (its store's length before the pass).
    firsts: Vec<usize>,
    xn: Vec<f32>,
    acts: Vec<QActs>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    proj: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    hidden: Vec<f32>,
}

impl Scratch {
    fn new(c: &LlamaConfig, batch: &[Entry<'_>], tokens: Vec<(usize, usize, u32)>) -> Self {
        let n = tokens.len();
        let (e, kv_dim, ff) = (c.embedding, c.kv_dim(), c.feed_forward);
        Scratch {
            firsts: batch.iter().map(|entry| entry.kv.len()).collect(),
            tokens,
            xn: vec![0.0; n * e],
            acts: vec![QActs::default(); n],
            q: vec![0.0; n * e],
            k: vec![0.0; n * kv_dim],
            v: vec![0.0; n * kv_dim],
            attn: vec![0.0; n * e],
            proj: vec![0.0; n * e],
            gate: vec![0.0; n * ff],
            up: vec![0.0; n * ff],
            hidden: vec![0.0; n * ff],
        }
    }
}

/// Each row of `x` (rows of `width`) quantized into `acts`.
fn quantize_rows(x: &[f32], width: usize, acts: &mut [QActs]) {
    acts.par_iter_mut()
        .zip(x.par_chunks(width))
        .for_each(|(acts, row)| kernels::simd(Quantize { row, acts }));
}

/// `x += y`, element by element.
fn add(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// One token's attention, every query head (its KV head `h / group`), for [`kernels::simd`].
struct Heads<'a> {
    q: &'a [f32],
    keys: &'a [f32],
    values: &'a [f32],
    kv_dim: usize,
    head_dim: usize,
    group: usize,
    /// Positions attended: `0..len`.
    len: usize,
    scores: &'a mut Vec<f32>,
    out: &'a mut [f32],
}

impl pulp::NullaryFnOnce for Heads<'_> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        let d = self.head_dim;
        for (h, (out, q)) in self
            .out
            .chunks_exact_mut(d)
            .zip(self.q.chunks_exact(d))
            .enumerate()
        {
            let offset = (h / self.group) * d;
            kernels::attend(
                q,
                self.keys,
                self.values,
                self.kv_dim,
                offset,
                self.len,
                self.scores,
                out,
            );
        }
    }
}

/// One row's RMS norm, then its quantization, for [`kernels::simd`].
struct NormQuantize<'a> {
    x: &'a [f32],
    weight: &'a [f32],
    eps: f32,
    out: &'a mut [f32],
    acts: &'a mut QActs,
}

impl pulp::NullaryFnOnce for NormQuantize<'_> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        kernels::rms_norm(self.x, self.weight, self.eps, self.out);
        self.acts.quantize(self.out);
    }
}

/// One row's quantization, for [`kernels::simd`].
struct Quantize<'a> {
    row: &'a [f32],
    acts: &'a mut QActs,
}

impl pulp::NullaryFnOnce for Quantize<'_> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        self.acts.quantize(self.row);
    }
}

/// One row's SwiGLU, for [`kernels::simd`].
struct Swiglu<'a> {
    gate: &'a [f32],
    up: &'a [f32],
    out: &'a mut [f32],
}

impl pulp::NullaryFnOnce for Swiglu<'_> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        kernels::swiglu(self.gate, self.up, self.out);
    }
}
