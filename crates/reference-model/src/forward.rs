//! One entry's forward pass: load the pages it reads (the full-attention and local pages in their byte
//! layout, every rank's share of a block gathered into one block, and the recurrent states), run the layers
//! over its new tokens, write the pages of its new positions (each rank its share) and its states, and
//! compute its logits. Rayon splits work across tokens and heads only; every value is computed by one fixed
//! sequence of operations (see `kernels`).

use kv_pool::{GroupKind, PageId, PageStorage};
use rayon::prelude::*;

use super::check::{Slots, Span};
use super::config::{F32_BYTES, STATE_HEADER_BYTES, first_key};
use super::error::{ModelError, ModelResult};
use super::kernels::{
    PagedKv, argmax, attend, axpy, floats_from_bytes, floats_to_bytes, rms_norm, rope, sigmoid,
    silu, vec_mat,
};
use super::weights::{AttentionWeights, Block, Mlp, RecurrentWeights};
use super::{ForwardEntry, Logits, ModelStorage, ReferenceModel};

/// The rank whose copy of a state page is read (every rank holds the same bytes).
const STATE_RANK: u32 = 0;
/// Most pages one `read_run` of an entry's context reads: bounds the buffer a run needs.
const RUN_PAGES_MAX: usize = 64;
/// Fewest tokens (or heads) one rayon task takes: small tasks cost more to schedule than to compute.
const MIN_TASK_LEN: usize = 4;

/// An entry's pages of one attention group in memory, slots `page_lo..page_hi`, each block in the page byte
/// layout of one rank holding the whole block (for each layer, the keys of `block_tokens` tokens, then their
/// values), as `f32`.
struct KvPages {
    floats: Vec<f32>,
    /// Floats of one block.
    page_floats: usize,
    /// Layers of the group.
    n_layers: usize,
}

impl ReferenceModel {
    /// Runs one checked entry (see [`ReferenceModel::forward`]).
    pub(crate) fn run_entry(
        &self,
        storage: ModelStorage<'_>,
        entry_idx: usize,
        entry: &ForwardEntry<'_>,
        span: &Span,
    ) -> ModelResult<Option<Logits>> {
        let n_full = self.config.n_attention_layers as usize;
        let mut full_kv = self.load_kv(
            storage.attention,
            entry.attention_pages,
            span,
            span.full,
            n_full,
        )?;
        let mut local_kv = match (span.local, storage.local) {
            (Some(slots), Some(local)) => {
                let n_local = self.config.n_local_layers() as usize;
                Some((
                    slots,
                    self.load_kv(local, entry.local_pages, span, slots, n_local)?,
                ))
            }
            _ => None,
        };
        let mut states = self.load_states(storage, entry_idx, entry)?;
        let mut x = self.embed(entry.tokens);
        for layer in &self.weights.layers {
            match &layer.block {
                Block::Attention(w) => match (w.group, local_kv.as_mut()) {
                    (GroupKind::Full, _) => {
                        self.attention_layer(w, span, span.full, &mut full_kv, &mut x);
                    }
                    (_, Some((slots, kv))) => {
                        self.attention_layer(w, span, *slots, kv, &mut x);
                    }
                    // `check_batch` made sure a model with local layers has its local storage.
                    (_, None) => {
                        return Err(ModelError::LocalStorage {
                            has: "has",
                            reason: "no local storage was given",
                        });
                    }
                },
                Block::Recurrent(w) => {
                    let n = self.config.state_floats_per_layer();
                    let layer =
                        w.state_group * self.config.n_recurrent_layers as usize + w.recurrent_idx;
                    self.recurrent_layer(w, &mut states[layer * n..][..n], &mut x);
                }
            }
            self.mlp(&layer.mlp, &mut x);
        }
        self.store_kv(
            storage.attention,
            entry.attention_pages,
            span.full,
            &full_kv,
        )?;
        if let (Some((slots, kv)), Some(local), Some(attention)) =
            (&mut local_kv, storage.local, self.config.local)
        {
            self.forget_before_window(kv, *slots, span, attention.window);
            self.store_kv(local, entry.local_pages, *slots, kv)?;
        }
        self.store_states(storage, entry.state_pages, span.end, &states)?;
        Ok(entry.want_logits.then(|| self.last_logits(&x)))
    }

    /// The embedding rows of `tokens`, one after another.
    fn embed(&self, tokens: &[u32]) -> Vec<f32> {
        let d = self.config.d_model as usize;
        let mut x = vec![0.0f32; tokens.len() * d];
        for (x_t, &token) in x.chunks_exact_mut(d).zip(tokens) {
            let row = token as usize * d;
            x_t.copy_from_slice(&self.weights.embedding[row..row + d]);
        }
        x
    }

    /// The logits of the last token of `x` (rows of `d_model`) and their greedy pick.
    fn last_logits(&self, x: &[f32]) -> Logits {
        let d = self.config.d_model as usize;
        let mut x_norm = vec![0.0f32; d];
        rms_norm(&x[x.len() - d..], &mut x_norm);
        let mut values = vec![0.0f32; self.config.vocab as usize];
        vec_mat(&x_norm, &self.weights.unembedding, &mut values);
        // The vocabulary is never empty (validated) and the logits of a finite model are never all NaN.
        let next_token = argmax(&values).unwrap_or(0);
        Logits { values, next_token }
    }

    /// Reads slots `page_lo..read_hi` of `table` (every rank's share of each block), one `read_run` per
    /// run of consecutive page ids and rank (at most `RUN_PAGES_MAX` pages: one device transfer each), and
    /// zeroes the positions from `first` on in the last of them (a partial page may hold anything there).
    /// The runs read through one byte buffer split between them: the allocations are the same however
    /// many pages and runs the context has.
    fn load_kv(
        &self,
        storage: &dyn PageStorage,
        table: &[PageId],
        span: &Span,
        slots: Slots,
        n_layers: usize,
    ) -> ModelResult<KvPages> {
        let block = self.config.block_tokens() as usize;
        let inner = self.config.inner_dim();
        let page_floats = n_layers * 2 * block * inner;
        let rank_bytes = page_floats / self.config.context_parallel as usize * F32_BYTES;
        let mut floats = vec![0.0f32; (slots.page_hi - slots.page_lo) * page_floats];
        let n_read = slots.read_hi - slots.page_lo;
        let mut bytes = vec![0u8; n_read * rank_bytes];
        let table_runs = page_runs(&table[slots.page_lo..slots.read_hi]);
        let mut runs = Vec::with_capacity(table_runs.len());
        let mut rest = &mut floats[..n_read * page_floats];
        let mut rest_bytes = bytes.as_mut_slice();
        for run in table_runs {
            let (out, after) = rest.split_at_mut(run.len() * page_floats);
            let (run_bytes, after_bytes) = rest_bytes.split_at_mut(run.len() * rank_bytes);
            runs.push((run, out, run_bytes));
            rest = after;
            rest_bytes = after_bytes;
        }
        runs.into_par_iter()
            .try_for_each(|(run, out, bytes)| self.load_run(storage, run, out, bytes, n_layers))?;
        let first_slot = span.first % block;
        if first_slot != 0 {
            let page = &mut floats[(slots.write_lo - slots.page_lo) * page_floats..][..page_floats];
            for part in page.chunks_exact_mut(block * inner) {
                part[first_slot * inner..].fill(0.0);
            }
        }
        Ok(KvPages {
            floats,
            page_floats,
            n_layers,
        })
    }

    /// Reads the blocks of `run` (consecutive page ids) into `out`, block after block in the block layout:
    /// one `read_run` per rank into `bytes` (a rank's share of each block of the run), converted in place.
    fn load_run(
        &self,
        storage: &dyn PageStorage,
        run: &[PageId],
        out: &mut [f32],
        bytes: &mut [u8],
        n_layers: usize,
    ) -> ModelResult<()> {
        let Some(&first) = run.first() else {
            return Ok(());
        };
        let n_ranks = self.config.context_parallel;
        let inner = self.config.inner_dim();
        let page_floats = out.len() / run.len();
        let rank_bytes = bytes.len() / run.len();
        if n_ranks == 1 {
            // One rank holds each whole block in the block's own layout.
            storage.read_run(0, first, bytes)?;
            floats_from_bytes(bytes, out);
            return Ok(());
        }
        for rank in 0..n_ranks {
            storage.read_run(rank, first, bytes)?;
            let pages = bytes.chunks_exact(rank_bytes);
            for (page_bytes, block_out) in pages.zip(out.chunks_exact_mut(page_floats)) {
                self.for_each_rank_row(n_layers, rank, |block_at, rank_at| {
                    floats_from_bytes(
                        &page_bytes[rank_at * F32_BYTES..][..inner * F32_BYTES],
                        &mut block_out[block_at..][..inner],
                    );
                });
            }
        }
        Ok(())
    }

    /// Writes slots `write_lo..page_hi` of `table`, each rank its share: every position before `end`
    /// computed, the rest zero.
    fn store_kv(
        &self,
        storage: &dyn PageStorage,
        table: &[PageId],
        slots: Slots,
        kv: &KvPages,
    ) -> ModelResult<()> {
        let inner = self.config.inner_dim();
        let rank_floats = kv.page_floats / self.config.context_parallel as usize;
        let first_written = (slots.write_lo - slots.page_lo) * kv.page_floats;
        kv.floats[first_written..]
            .par_chunks(kv.page_floats)
            .zip(&table[slots.write_lo..slots.page_hi])
            .try_for_each_init(
                || {
                    (
                        vec![0u8; rank_floats * F32_BYTES],
                        vec![0.0f32; rank_floats],
                    )
                },
                |(bytes, rank_page), (block_in, &page)| -> ModelResult<()> {
                    if self.config.context_parallel == 1 {
                        floats_to_bytes(block_in, bytes);
                        storage.write(0, page, bytes)?;
                        return Ok(());
                    }
                    for rank in 0..self.config.context_parallel {
                        self.for_each_rank_row(kv.n_layers, rank, |block_at, rank_at| {
                            rank_page[rank_at..][..inner]
                                .copy_from_slice(&block_in[block_at..][..inner]);
                        });
                        floats_to_bytes(rank_page, bytes);
                        storage.write(rank, page, bytes)?;
                    }
                    Ok(())
                },
            )
    }

    /// Zeroes, in every block the entry writes, the positions before the window of the block's last written
    /// position: no later query reads them, and a page's bytes are then a function of the tokens alone,
    /// whatever a page held before (a block the engine allocates after a restore at a chunk boundary inside
    /// it, with nothing live in it, holds another request's bytes before that boundary). A recompute writes
    /// the same zeros. Only a chunk that is not a multiple of the block, or a window shorter than the block,
    /// has such positions.
    fn forget_before_window(&self, kv: &mut KvPages, slots: Slots, span: &Span, window: GroupKind) {
        let block = self.config.block_tokens() as usize;
        let inner = self.config.inner_dim();
        for slot in slots.write_lo..slots.page_hi {
            let block_start = slot * block;
            let last = span.end.min(block_start + block) - 1;
            let n_forgotten = first_key(window, last)
                .saturating_sub(block_start)
                .min(block);
            if n_forgotten == 0 {
                continue;
            }
            let page = &mut kv.floats[(slot - slots.page_lo) * kv.page_floats..][..kv.page_floats];
            for part in page.chunks_exact_mut(block * inner) {
                part[..n_forgotten * inner].fill(0.0);
            }
        }
    }

    /// Calls `f(block_offset, rank_offset)` for every token row (a key or a value of one token and layer)
    /// `rank` holds of a block of a group with `n_layers` layers: block slot `s` lives on rank
    /// `s % context_parallel` at slot `s / context_parallel` (the offsets are in floats; see `config`).
    fn for_each_rank_row(&self, n_layers: usize, rank: u32, mut f: impl FnMut(usize, usize)) {
        let tpp = self.config.tokens_per_page as usize;
        let n_ranks = self.config.context_parallel as usize;
        let block = tpp * n_ranks;
        let inner = self.config.inner_dim();
        for part in 0..2 * n_layers {
            for rank_slot in 0..tpp {
                let slot = rank_slot * n_ranks + rank as usize;
                f(
                    (part * block + slot) * inner,
                    (part * tpp + rank_slot) * inner,
                );
            }
        }
    }

    /// The recurrent states after `first_pos` tokens, group after group: zeros at position 0, else read from
    /// the state pages and checked against their headers.
    fn load_states(
        &self,
        storage: ModelStorage<'_>,
        entry_idx: usize,
        entry: &ForwardEntry<'_>,
    ) -> ModelResult<Vec<f32>> {
        let group_floats =
            self.config.n_recurrent_layers as usize * self.config.state_floats_per_layer();
        let mut states = vec![0.0f32; entry.state_pages.len() * group_floats];
        let Some(recurrent) = storage.recurrent else {
            return Ok(states);
        };
        if entry.first_pos == 0 {
            return Ok(states);
        }
        let mut bytes = vec![0u8; recurrent.bytes_per_page()];
        for (&page, state) in entry
            .state_pages
            .iter()
            .zip(states.chunks_exact_mut(group_floats))
        {
            recurrent.read(STATE_RANK, page, &mut bytes)?;
            let (header, body) = bytes.split_at(STATE_HEADER_BYTES);
            let mut position = [0u8; STATE_HEADER_BYTES];
            position.copy_from_slice(header);
            let found = u64::from_le_bytes(position);
            if found != u64::from(entry.first_pos) {
                return Err(ModelError::StatePosition {
                    entry: entry_idx,
                    page,
                    expected: entry.first_pos,
                    found,
                });
            }
            floats_from_bytes(body, state);
        }
        Ok(states)
    }

    /// Writes each group's state after `end` tokens into its page, the same bytes on every rank.
    fn store_states(
        &self,
        storage: ModelStorage<'_>,
        pages: &[PageId],
        end: usize,
        states: &[f32],
    ) -> ModelResult<()> {
        let Some(recurrent) = storage.recurrent else {
            return Ok(());
        };
        let group_floats =
            self.config.n_recurrent_layers as usize * self.config.state_floats_per_layer();
        let mut bytes = vec![0u8; recurrent.bytes_per_page()];
        for (&page, state) in pages.iter().zip(states.chunks_exact(group_floats)) {
            let (header, body) = bytes.split_at_mut(STATE_HEADER_BYTES);
            header.copy_from_slice(&(end as u64).to_le_bytes());
            floats_to_bytes(state, body);
            for rank in 0..self.config.context_parallel {
                recurrent.write(rank, page, &bytes)?;
            }
        }
        Ok(())
    }

    /// An attention layer of the group whose pages `kv` holds (`slots` of its table): project and rotate the
    /// new tokens' queries and keys, store their keys and values in `kv`, attend (per token and head) over
    /// every key before the query in its window (`w.group`: all of them under full attention) in position order, project back into `x`.
    fn attention_layer(
        &self,
        w: &AttentionWeights,
        span: &Span,
        slots: Slots,
        kv: &mut KvPages,
        x: &mut [f32],
    ) {
        let d = self.config.d_model as usize;
        let inner = self.config.inner_dim();
        let head_dim = self.config.head_dim as usize;
        let block = self.config.block_tokens() as usize;
        let n_tokens = x.len() / d;
        let mut q = vec![0.0f32; n_tokens * inner];
        let mut k = vec![0.0f32; n_tokens * inner];
        let mut v = vec![0.0f32; n_tokens * inner];
        x.par_chunks(d)
            .zip(q.par_chunks_mut(inner))
            .zip(k.par_chunks_mut(inner))
            .zip(v.par_chunks_mut(inner))
            .enumerate()
            .with_min_len(MIN_TASK_LEN)
            .for_each_init(
                || vec![0.0f32; d],
                |x_norm, (t, (((x_t, q_t), k_t), v_t))| {
                    let pos = (span.first + t) as u32;
                    rms_norm(x_t, x_norm);
                    vec_mat(x_norm, &w.wq, q_t);
                    vec_mat(x_norm, &w.wk, k_t);
                    vec_mat(x_norm, &w.wv, v_t);
                    rope(q_t, pos, &self.inv_freq);
                    rope(k_t, pos, &self.inv_freq);
                },
            );
        let layer_floats = block * inner;
        let keys_offset = 2 * w.attention_idx * layer_floats;
        let values_offset = keys_offset + layer_floats;
        for (t, (k_t, v_t)) in k.chunks_exact(inner).zip(v.chunks_exact(inner)).enumerate() {
            let rel = span.first + t - slots.page_lo * block;
            let slot = (rel / block) * kv.page_floats + (rel % block) * inner;
            kv.floats[slot + keys_offset..][..inner].copy_from_slice(k_t);
            kv.floats[slot + values_offset..][..inner].copy_from_slice(v_t);
        }
        let n_heads = self.config.n_heads as usize;
        let kv = &*kv;
        let mut attended = vec![0.0f32; n_tokens * inner];
        attended
            .par_chunks_mut(head_dim)
            .enumerate()
            .with_min_len(MIN_TASK_LEN)
            .for_each_init(Vec::new, |scores, (idx, out)| {
                let (t, head) = (idx / n_heads, idx % n_heads);
                let pos = span.first + t;
                let lo = first_key(w.group, pos);
                let head_kv = PagedKv {
                    floats: &kv.floats,
                    base_pos: slots.page_lo * block,
                    tokens_per_page: block,
                    page_floats: kv.page_floats,
                    inner,
                    key_offset: keys_offset + head * head_dim,
                    value_offset: values_offset + head * head_dim,
                };
                let q_head = &q[t * inner + head * head_dim..][..head_dim];
                attend(q_head, &head_kv, lo, pos, scores, out);
            });
        project_add(&attended, inner, &w.wo, x, d);
    }

    /// A gated linear recurrence layer: per head, `S = diag(a) S + k v^T` then `o = q S`, one token at a
    /// time in position order; `o * silu(g)` projected back into `x`.
    fn recurrent_layer(&self, w: &RecurrentWeights, state: &mut [f32], x: &mut [f32]) {
        let d = self.config.d_model as usize;
        let inner = self.config.inner_dim();
        let head_dim = self.config.head_dim as usize;
        let n_tokens = x.len() / d;
        let k_scale = 1.0 / (head_dim as f32).sqrt();
        // Per token: q, k, v, decay and output gate, `inner` each.
        let mut proj = vec![0.0f32; n_tokens * 5 * inner];
        x.par_chunks(d)
            .zip(proj.par_chunks_mut(5 * inner))
            .with_min_len(MIN_TASK_LEN)
            .for_each_init(
                || vec![0.0f32; d],
                |x_norm, (x_t, p)| {
                    rms_norm(x_t, x_norm);
                    let (q, rest) = p.split_at_mut(inner);
                    let (k, rest) = rest.split_at_mut(inner);
                    let (v, rest) = rest.split_at_mut(inner);
                    let (decay, gate) = rest.split_at_mut(inner);
                    vec_mat(x_norm, &w.wq, q);
                    vec_mat(x_norm, &w.wk, k);
                    k.iter_mut().for_each(|k_i| *k_i *= k_scale);
                    vec_mat(x_norm, &w.wv, v);
                    vec_mat(x_norm, &w.wa, decay);
                    for (a, b) in decay.iter_mut().zip(&w.ba) {
                        *a = sigmoid(*a + b);
                    }
                    vec_mat(x_norm, &w.wg, gate);
                    gate.iter_mut().for_each(|g| *g = silu(*g));
                },
            );
        let mut out = vec![0.0f32; n_tokens * inner];
        for (p, out_t) in proj
            .chunks_exact(5 * inner)
            .zip(out.chunks_exact_mut(inner))
        {
            let (q, rest) = p.split_at(inner);
            let (k, rest) = rest.split_at(inner);
            let (v, rest) = rest.split_at(inner);
            let (decay, gate) = rest.split_at(inner);
            let heads = state.chunks_exact_mut(head_dim * head_dim).enumerate();
            for (head, s) in heads {
                let h = head * head_dim;
                let v_h = &v[h..h + head_dim];
                let out_h = &mut out_t[h..h + head_dim];
                for (i, row) in s.chunks_exact_mut(head_dim).enumerate() {
                    let (a_i, k_i) = (decay[h + i], k[h + i]);
                    for (s_ij, v_j) in row.iter_mut().zip(v_h) {
                        *s_ij = a_i * *s_ij + k_i * v_j;
                    }
                    axpy(q[h + i], row, out_h);
                }
                for (o, g) in out_h.iter_mut().zip(&gate[h..h + head_dim]) {
                    *o *= g;
                }
            }
        }
        project_add(&out, inner, &w.wo, x, d);
    }

    /// The MLP: `x += silu(norm(x) W1) W2`, per token.
    fn mlp(&self, mlp: &Mlp, x: &mut [f32]) {
        let d = self.config.d_model as usize;
        let ffn = self.config.ffn_dim as usize;
        x.par_chunks_mut(d)
            .with_min_len(MIN_TASK_LEN)
            .for_each_init(
                || (vec![0.0f32; d], vec![0.0f32; ffn], vec![0.0f32; d]),
                |(x_norm, hidden, y), x_t| {
                    rms_norm(x_t, x_norm);
                    vec_mat(x_norm, &mlp.w1, hidden);
                    hidden.iter_mut().for_each(|h| *h = silu(*h));
                    vec_mat(hidden, &mlp.w2, y);
                    for (xi, yi) in x_t.iter_mut().zip(y.iter()) {
                        *xi += yi;
                    }
                },
            );
    }
}

/// `x_t += a_t W` for every token (`a`: `width` values a token, `x`: `d`).
fn project_add(a: &[f32], width: usize, w: &super::weights::Matrix, x: &mut [f32], d: usize) {
    x.par_chunks_mut(d)
        .zip(a.par_chunks(width))
        .with_min_len(MIN_TASK_LEN)
        .for_each_init(
            || vec![0.0f32; d],
            |y, (x_t, a_t)| {
                vec_mat(a_t, w, y);
                for (xi, yi) in x_t.iter_mut().zip(y.iter()) {
                    *xi += yi;
                }
            },
        );
}

/// `table` cut into runs of consecutive page ids, each at most `RUN_PAGES_MAX` long, in order.
fn page_runs(table: &[PageId]) -> Vec<&[PageId]> {
    // At most one run per page: one allocation whatever the number of runs.
    let mut runs = Vec::with_capacity(table.len());
    let mut start = 0;
    for end in 1..=table.len() {
        let ends = match (table.get(end - 1), table.get(end)) {
            (Some(prev), Some(next)) => prev.0.checked_add(1) != Some(next.0),
            _ => true,
        };
        if ends || end - start == RUN_PAGES_MAX {
            runs.push(&table[start..end]);
            start = end;
        }
    }
    runs
}
