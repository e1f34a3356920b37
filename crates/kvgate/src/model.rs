//! The real model as the engine's executor (issue 29, item 6): SmolLM2-135M-Instruct (`llama` crate) runs
//! each step's prefill chunks and decodes with its keys and values in the pool's pages. Each entry's
//! pages are loaded through its block table (`llama::PagedKv`, one read per page), the forward pass runs the
//! whole step as one batch, and the pages of the new positions are written back; the tokens it samples are
//! greedy (the largest logit) unless a [`SamplingTable`] gives a request a temperature and seed. A restore therefore feeds real keys and values to the model, and verification
//! (E3) recomputes the prefix into scratch pages of the same layout and compares bytes.
//!
//! Geometry: one full-attention group of `MODEL_TOKENS_PER_PAGE`-token pages, one rank; a page holds every
//! layer's keys and values of its positions in `f32` (`llama::PageLayout`: 720 KiB for this model). The
//! engine refuses anything else at build ([`Executor::check_params`]).
//!
//! The time verification takes is kept apart ([`VerifyTime`]): [`VerifyExcludedClock`] is the wall clock
//! less that time, so a `--verify` run's turn times are those of the serving path alone.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use engine::{Clock, EngineParams, RequestSpec};
use engine::{Executor, MeasuredCost, PageWrite, RecomputedPages, StepBatch, StepOutput};
use kv_pool::{CacheGroup, Geometry, GroupKind, PageId, PageStorage, Timestamp};
use llama::{
    ContiguousKv, Entry, KvStore, Llama, LlamaError, PageAccess, PageLayout, PagedKv, Tokenizer,
    argmax,
};

/// Tokens per page of a model run.
pub const MODEL_TOKENS_PER_PAGE: u32 = 16;
/// Tokens per pass when verification recomputes a prefix.
const RECOMPUTE_CHUNK: usize = 256;

/// Wall time spent verifying restores, shared between an executor and the clock that leaves it out.
#[derive(Clone, Debug, Default)]
pub struct VerifyTime(Arc<AtomicU64>);

impl VerifyTime {
    /// Time recorded so far.
    pub fn total(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::Relaxed))
    }

    /// Records `spent`.
    pub fn add(&self, spent: Duration) {
        let nanos = u64::try_from(spent.as_nanos()).unwrap_or(u64::MAX);
        self.0.fetch_add(nanos, Ordering::Relaxed);
    }
}

/// The wall clock less the time spent verifying restores: a live run's turn times without `--verify`'s
/// recompute (which runs on the engine thread and would otherwise be charged to every turn in flight).
#[derive(Debug)]
pub(crate) struct VerifyExcludedClock {
    start: Instant,
    verify: VerifyTime,
}

impl VerifyExcludedClock {
    /// A clock reading zero now that leaves out what `verify` records from now on.
    pub(crate) fn new(verify: VerifyTime) -> VerifyExcludedClock {
        #[allow(
            clippy::disallowed_methods,
            reason = "a live run's clock reads real time (L1)"
        )]
        let start = Instant::now();
        let mut clock = VerifyExcludedClock { start, verify };
        // Time recorded before the clock started is not in its readings either.
        clock.start = clock
            .start
            .checked_sub(clock.verify.total())
            .unwrap_or(start);
        clock
    }

    fn read(&self, now: Timestamp) -> Timestamp {
        now.max(Timestamp(
            self.start.elapsed().saturating_sub(self.verify.total()),
        ))
    }
}

impl Clock for VerifyExcludedClock {
    fn name(&self) -> &'static str {
        "wall"
    }

    fn step_start(&mut self, now: Timestamp) -> Timestamp {
        self.read(now)
    }

    fn after_step(&mut self, now: Timestamp, _duration: Duration) -> Timestamp {
        self.read(now)
    }

    fn idle_until(&mut self, now: Timestamp, next: Timestamp) -> Timestamp {
        let now = self.read(now);
        let wait = next.since(now).min(engine::WALL_IDLE_WAIT);
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
        self.read(now)
    }
}

/// How one request picks its tokens: `temperature` 0 is greedy (the largest logit); above 0 it samples
/// from the softmax of the logits over `temperature`, drawing from a generator seeded by `seed` and the
/// token's position, so a seed gives the same answer whatever else runs in the batch (the logits are
/// batch-invariant) and whether or not the request was preempted and recomputed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// 0 for greedy; the softmax temperature otherwise.
    pub temperature: f64,
    /// The generator's seed.
    pub seed: u64,
}

/// The sampling of each live request, shared between the server's engine thread (which sets a request's
/// entry at submit and removes it when the request ends) and the executor; a request without an entry is
/// greedy.
#[derive(Clone, Debug, Default)]
pub(crate) struct SamplingTable(Arc<Mutex<HashMap<kv_pool::RequestId, Sampling>>>);

impl SamplingTable {
    /// Sets `request`'s sampling.
    pub(crate) fn set(&self, request: kv_pool::RequestId, sampling: Sampling) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(request, sampling);
    }

    /// Forgets `request` (it ended).
    pub(crate) fn remove(&self, request: kv_pool::RequestId) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&request);
    }

    /// Requests with an entry.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Whether no request has an entry.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The token `request` picks from `logits` at context position `position`.
    fn pick(&self, request: kv_pool::RequestId, position: u64, logits: &[f32]) -> Option<u32> {
        let sampling = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&request)
            .copied();
        match sampling {
            Some(sampling) if sampling.temperature > 0.0 => sample(logits, sampling, position),
            _ => argmax(logits),
        }
    }
}

/// SplitMix64: a well-mixed 64-bit value of `x` (the sampler's only randomness).
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A token drawn from the softmax of `logits / temperature`, the draw a uniform number made of the seed
/// and the position.
fn sample(logits: &[f32], sampling: Sampling, position: u64) -> Option<u32> {
    let max = logits
        .iter()
        .copied()
        .filter(|l| l.is_finite())
        .fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return argmax(logits);
    }
    let weight = |l: f32| {
        if l.is_finite() {
            ((f64::from(l) - f64::from(max)) / sampling.temperature).exp()
        } else {
            0.0
        }
    };
    let total: f64 = logits.iter().map(|&l| weight(l)).sum();
    let bits = splitmix64(splitmix64(sampling.seed) ^ position);
    let mut target = (bits >> 11) as f64 / (1u64 << 53) as f64 * total;
    let mut last = None;
    for (token, &l) in logits.iter().enumerate() {
        let w = weight(l);
        if w > 0.0 {
            last = u32::try_from(token).ok();
            if target < w {
                return last;
            }
            target -= w;
        }
    }
    last
}

/// The model and its tokenizer, loaded once and shared by the runs of every policy.
#[derive(Debug)]
pub struct LoadedModel {
    /// The file it was loaded from.
    pub path: std::path::PathBuf,
    /// The model.
    pub llama: Llama,
    /// Its tokenizer and chat template.
    pub tokenizer: Tokenizer,
}

impl LoadedModel {
    /// Loads the model file at `path` and builds its tokenizer. Errors: `Model`.
    pub fn load(path: &Path) -> crate::Result<Arc<LoadedModel>> {
        let llama = Llama::load(path).map_err(|source| crate::Error::Model {
            path: path.to_path_buf(),
            source,
        })?;
        let tokenizer =
            Tokenizer::from_gguf(llama.gguf()).map_err(|source| crate::Error::Model {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(Arc::new(LoadedModel {
            path: path.to_path_buf(),
            llama,
            tokenizer,
        }))
    }

    /// The page layout of this model in `MODEL_TOKENS_PER_PAGE`-token pages.
    pub fn layout(&self) -> PageLayout {
        let config = self.llama.config();
        PageLayout {
            layers: config.layers,
            kv_dim: config.kv_dim(),
            block_tokens: MODEL_TOKENS_PER_PAGE as usize,
        }
    }

    /// The engine geometry of this model: one full-attention group of its pages, one rank, contexts of up
    /// to `max_model_len` tokens. Errors: what `Geometry::new` refuses.
    pub fn geometry(&self, max_model_len: u32) -> kv_pool::Result<Geometry> {
        Geometry::new(
            vec![CacheGroup {
                kind: GroupKind::Full,
                bytes_per_page: self.layout().bytes_per_page() as u64,
            }],
            MODEL_TOKENS_PER_PAGE,
            1,
            max_model_len,
        )
    }
}

/// The real model as an [`Executor`] (see the module docs).
#[derive(Debug)]
pub struct ModelExecutor {
    model: Arc<LoadedModel>,
    layout: PageLayout,
    verify: VerifyTime,
    sampling: SamplingTable,
    steps: u64,
    /// The measured cost of a token.
    measured: MeasuredCost,
}

/// A model error as an engine error: the executor could not run a batch.
#[allow(clippy::needless_pass_by_value, reason = "passed to map_err by name")]
fn model_error(error: LlamaError) -> engine::Error {
    engine::Error::InvalidParam {
        name: "model executor",
        reason: error.to_string(),
    }
}

/// One entry's pages: its block table over the pool storage, rank 0.
struct TablePages<'a> {
    storage: &'a dyn PageStorage,
    table: &'a [PageId],
}

impl PageAccess for TablePages<'_> {
    fn n_pages(&self) -> usize {
        self.table.len()
    }

    fn page_bytes(&self) -> usize {
        self.storage.bytes_per_page()
    }

    fn read(&self, index: usize, dst: &mut [u8]) -> llama::LlamaResult<()> {
        let page = self.page(index)?;
        self.storage
            .read(0, page, dst)
            .map_err(|e| LlamaError::Pages(e.to_string()))
    }

    fn write(&self, index: usize, src: &[u8]) -> llama::LlamaResult<()> {
        let page = self.page(index)?;
        self.storage
            .write(0, page, src)
            .map_err(|e| LlamaError::Pages(e.to_string()))
    }
}

impl TablePages<'_> {
    fn page(&self, index: usize) -> llama::LlamaResult<PageId> {
        self.table.get(index).copied().ok_or_else(|| {
            LlamaError::Pages(format!(
                "page {index} of a table of {} pages",
                self.table.len()
            ))
        })
    }
}

/// One entry of a step: its new tokens from `first_pos`, its block table, whether it samples.
struct Work<'a> {
    request: kv_pool::RequestId,
    first_pos: u32,
    tokens: &'a [u32],
    table: &'a [PageId],
    samples: bool,
}

impl ModelExecutor {
    /// The executor of `model`, recording verification time into `verify`.
    pub fn new(model: Arc<LoadedModel>, verify: VerifyTime) -> ModelExecutor {
        let layout = model.layout();
        ModelExecutor {
            model,
            layout,
            verify,
            sampling: SamplingTable::default(),
            steps: 0,
            measured: MeasuredCost::default(),
        }
    }

    /// This executor, picking each request's tokens as `sampling` says (greedy without an entry).
    #[must_use]
    pub(crate) fn with_sampling(mut self, sampling: SamplingTable) -> ModelExecutor {
        self.sampling = sampling;
        self
    }

    /// Steps executed so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Runs `works` in waves: an entry that reads a page an earlier entry of its wave writes (a block
    /// registered by a chunk of this step and hit by a later admission) starts the next wave, since each
    /// wave's pages are loaded before it runs. Batch invariance makes the bits the same as one pass.
    fn run_in_waves(
        &self,
        storage: &dyn PageStorage,
        works: &[Work<'_>],
    ) -> engine::Result<Vec<Option<u32>>> {
        let tpp = self.layout.block_tokens;
        let mut next_tokens = Vec::with_capacity(works.len());
        let mut wave_start = 0;
        let mut written: HashSet<PageId> = HashSet::new();
        for (idx, work) in works.iter().enumerate() {
            let write_lo = (work.first_pos as usize / tpp).min(work.table.len());
            let reads = work.table.get(..write_lo).unwrap_or_default();
            if reads.iter().any(|page| written.contains(page)) {
                let wave = works.get(wave_start..idx).unwrap_or_default();
                next_tokens.extend(self.run_wave(storage, wave)?);
                wave_start = idx;
                written.clear();
            }
            let end = work.first_pos as usize + work.tokens.len();
            let write_hi = end.div_ceil(tpp).min(work.table.len());
            written.extend(work.table.get(write_lo..write_hi).unwrap_or_default());
        }
        let wave = works.get(wave_start..).unwrap_or_default();
        next_tokens.extend(self.run_wave(storage, wave)?);
        Ok(next_tokens)
    }

    /// Loads the pages of `works`, runs them as one batch, writes their new pages back.
    fn run_wave(
        &self,
        storage: &dyn PageStorage,
        works: &[Work<'_>],
    ) -> engine::Result<Vec<Option<u32>>> {
        if works.is_empty() {
            return Ok(Vec::new());
        }
        let accesses: Vec<TablePages<'_>> = works
            .iter()
            .map(|work| TablePages {
                storage,
                table: work.table,
            })
            .collect();
        let mut stores = works
            .iter()
            .zip(&accesses)
            .map(|(work, access)| PagedKv::load(self.layout, access, work.first_pos as usize))
            .collect::<llama::LlamaResult<Vec<_>>>()
            .map_err(model_error)?;
        let mut batch: Vec<Entry<'_>> = works
            .iter()
            .zip(stores.iter_mut())
            .map(|(work, kv)| Entry {
                tokens: work.tokens,
                kv,
                want_logits: work.samples,
            })
            .collect();
        let logits = self.model.llama.forward(&mut batch).map_err(model_error)?;
        drop(batch);
        for kv in &stores {
            kv.flush().map_err(model_error)?;
        }
        Ok(logits
            .iter()
            .zip(works)
            .map(|(logits, work)| {
                let position = u64::from(work.first_pos) + work.tokens.len() as u64;
                logits
                    .as_deref()
                    .and_then(|logits| self.sampling.pick(work.request, position, logits))
            })
            .collect())
    }
}

impl Executor for ModelExecutor {
    fn name(&self) -> &str {
        "model"
    }

    fn execute(
        &mut self,
        batch: &StepBatch<'_>,
        storage: &dyn PageStorage,
    ) -> engine::Result<StepOutput> {
        if batch.is_empty() {
            return Ok(StepOutput::default());
        }
        if let Some(&request) = batch.logits_only.first() {
            return Err(engine::Error::InvalidParam {
                name: "saved_logits",
                reason: format!(
                    "{request} has a logits-only step, but the model executor's checkpoints carry no logits"
                ),
            });
        }
        #[allow(
            clippy::disallowed_methods,
            reason = "the model executor measures its step on the wall clock"
        )]
        let started = Instant::now();
        self.steps += 1;
        let prefills = batch.prefills.iter().map(|work| Work {
            request: work.request,
            first_pos: work.first_pos,
            tokens: work.tokens,
            table: work.pages.block_table,
            samples: work.samples,
        });
        let decodes = batch.decodes.iter().map(|work| Work {
            request: work.request,
            first_pos: work.context_tokens,
            tokens: work.tokens,
            table: work.pages.block_table,
            samples: true,
        });
        let works: Vec<Work<'_>> = prefills.chain(decodes).collect();
        let next_tokens = self.run_in_waves(storage, &works)?;
        self.measured.record(
            works.iter().map(|w| w.tokens.len() as u64).sum::<u64>(),
            started.elapsed().as_secs_f64(),
        );
        let tokens = works
            .iter()
            .zip(next_tokens)
            .filter_map(|(work, token)| token.map(|token| (work.request, token)))
            .collect();
        Ok(StepOutput {
            duration: started.elapsed(),
            tokens,
        })
    }

    fn fill_page(&self, _write: &PageWrite, out: &mut [u8]) {
        // Never called: the model executor writes its pages itself (`writes_pages`).
        out.fill(0);
    }

    fn copy_time(&self, n_tokens: u32) -> Duration {
        let bytes = f64::from(n_tokens) * self.layout.bytes_per_page() as f64
            / self.layout.block_tokens as f64;
        MeasuredCost::copy_time(bytes)
    }

    /// Measured: the wall seconds per token of every step so far (`MeasuredCost`).
    fn recompute_time(&self, n_tokens: u32) -> Duration {
        self.measured.recompute_time(n_tokens)
    }

    fn writes_pages(&self) -> bool {
        true
    }

    fn bytes_per_page(&self) -> Option<u32> {
        u32::try_from(self.layout.bytes_per_page()).ok()
    }

    fn check_params(&self, params: &EngineParams) -> engine::Result<()> {
        let geometry = &params.geometry;
        let kinds: Vec<GroupKind> = geometry.groups().iter().map(|group| group.kind).collect();
        let reason = if kinds != [GroupKind::Full] {
            format!("cache groups {kinds:?}, but the model has one full-attention group")
        } else if geometry.tokens_per_page() != MODEL_TOKENS_PER_PAGE {
            format!(
                "{} tokens per page, but its pages hold {MODEL_TOKENS_PER_PAGE}",
                geometry.tokens_per_page()
            )
        } else if geometry.context_parallel() != 1 {
            format!(
                "{} context-parallel ranks, but it runs on one",
                geometry.context_parallel()
            )
        } else if params.draft_tokens != 0 {
            format!(
                "{} draft tokens, but it has no draft head",
                params.draft_tokens
            )
        } else {
            return Ok(());
        };
        Err(engine::Error::UnsupportedGeometry {
            reason: format!("the model executor runs its model's own geometry: {reason}"),
        })
    }

    fn check_request(&self, spec: &RequestSpec) -> engine::Result<()> {
        let vocab = self.model.llama.config().vocab;
        if spec.saved_logits {
            return Err(engine::Error::InvalidParam {
                name: "saved_logits",
                reason: format!(
                    "{} asks to sample from saved logits, but the model executor's checkpoints carry none",
                    spec.id
                ),
            });
        }
        match spec.prompt.iter().find(|&&t| t as usize >= vocab) {
            Some(token) => Err(engine::Error::InvalidParam {
                name: "prompt",
                reason: format!(
                    "{}: token {token} is outside the model's vocabulary of {vocab}",
                    spec.id
                ),
            }),
            None => Ok(()),
        }
    }

    fn recompute(
        &mut self,
        prefix: &[u32],
        bytes_per_page: usize,
    ) -> engine::Result<Option<RecomputedPages>> {
        #[allow(
            clippy::disallowed_methods,
            reason = "verification is timed apart from the turns"
        )]
        let started = Instant::now();
        let pages = self.recompute_pages(prefix, bytes_per_page);
        self.verify.add(started.elapsed());
        pages.map(Some)
    }
}

impl ModelExecutor {
    /// The pages a recompute of `prefix` from its first token fills, each `bytes_per_page` long.
    fn recompute_pages(
        &self,
        prefix: &[u32],
        bytes_per_page: usize,
    ) -> engine::Result<RecomputedPages> {
        let layout = self.layout;
        if bytes_per_page < layout.bytes_per_page() {
            return Err(engine::Error::InvalidParam {
                name: "bytes_per_page",
                reason: format!(
                    "{bytes_per_page} bytes cannot hold a page of {}",
                    layout.bytes_per_page()
                ),
            });
        }
        let mut kv = ContiguousKv::new(layout.layers, layout.kv_dim, prefix.len());
        for chunk in prefix.chunks(RECOMPUTE_CHUNK) {
            let mut batch = [Entry {
                tokens: chunk,
                kv: &mut kv,
                want_logits: false,
            }];
            self.model.llama.forward(&mut batch).map_err(model_error)?;
        }
        let mut pages = RecomputedPages::default();
        for first in (0..kv.len()).step_by(layout.block_tokens) {
            let mut page = vec![0u8; bytes_per_page];
            layout.encode(&kv, first, first + layout.block_tokens, &mut page);
            pages.blocks.push(vec![page]);
        }
        Ok(pages)
    }
}

/// Any executor, with the time its restore verification (`Executor::recompute`) takes recorded into a
/// [`VerifyTime`]: the reference executor of a live run, whose clock then leaves that time out.
#[derive(Debug)]
pub struct VerifyTimed<E> {
    inner: E,
    verify: VerifyTime,
}

impl<E: Executor> VerifyTimed<E> {
    /// `inner`, recording its verification time into `verify`.
    pub(crate) fn new(inner: E, verify: VerifyTime) -> VerifyTimed<E> {
        VerifyTimed { inner, verify }
    }
}

impl<E: Executor> Executor for VerifyTimed<E> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn execute(
        &mut self,
        batch: &StepBatch<'_>,
        storage: &dyn PageStorage,
    ) -> engine::Result<StepOutput> {
        self.inner.execute(batch, storage)
    }

    fn fill_page(&self, write: &PageWrite, out: &mut [u8]) {
        self.inner.fill_page(write, out);
    }

    fn copy_time(&self, n_tokens: u32) -> Duration {
        self.inner.copy_time(n_tokens)
    }

    fn recompute_time(&self, n_tokens: u32) -> Duration {
        self.inner.recompute_time(n_tokens)
    }

    fn reads_tokens(&self) -> bool {
        self.inner.reads_tokens()
    }

    fn writes_pages(&self) -> bool {
        self.inner.writes_pages()
    }

    fn bytes_per_page(&self) -> Option<u32> {
        self.inner.bytes_per_page()
    }

    fn check_params(&self, params: &EngineParams) -> engine::Result<()> {
        self.inner.check_params(params)
    }

    fn check_request(&self, spec: &RequestSpec) -> engine::Result<()> {
        self.inner.check_request(spec)
    }

    fn recompute(
        &mut self,
        prefix: &[u32],
        bytes_per_page: usize,
    ) -> engine::Result<Option<RecomputedPages>> {
        #[allow(
            clippy::disallowed_methods,
            reason = "verification is timed apart from the turns"
        )]
        let started = Instant::now();
        let pages = self.inner.recompute(prefix, bytes_per_page);
        self.verify.add(started.elapsed());
        pages
    }
}

#[cfg(test)]
mod sampling_tests {
    use super::{Sampling, SamplingTable, sample};
    use kv_pool::RequestId;

    const LOGITS: [f32; 4] = [1.0, 3.0, 2.5, f32::NEG_INFINITY];

    #[test]
    fn a_seed_and_position_give_the_same_token_and_the_draws_follow_the_softmax() {
        let sampling = |seed| Sampling {
            temperature: 1.0,
            seed,
        };
        let mut counts = [0u32; 4];
        for position in 0..4000 {
            let token = sample(&LOGITS, sampling(7), position).unwrap();
            assert_eq!(sample(&LOGITS, sampling(7), position), Some(token));
            counts[token as usize] += 1;
        }
        // softmax(1, 3, 2.5): 0.078, 0.575, 0.348; the -inf logit is never drawn.
        assert_eq!(counts[3], 0, "{counts:?}");
        for (count, p) in counts.iter().zip([0.078, 0.575, 0.348]) {
            let share = f64::from(*count) / 4000.0;
            assert!((share - p).abs() < 0.03, "{counts:?}");
        }
        let other: Vec<_> = (0..64).map(|p| sample(&LOGITS, sampling(8), p)).collect();
        let same: Vec<_> = (0..64).map(|p| sample(&LOGITS, sampling(7), p)).collect();
        assert_ne!(other, same, "two seeds drew the same 64 tokens");
    }

    #[test]
    fn greedy_without_an_entry_or_at_temperature_0_and_entries_are_forgotten() {
        let table = SamplingTable::default();
        let id = RequestId(3);
        assert_eq!(table.pick(id, 0, &LOGITS), Some(1));
        table.set(
            id,
            Sampling {
                temperature: 0.0,
                seed: 1,
            },
        );
        assert_eq!(table.pick(id, 0, &LOGITS), Some(1));
        assert_eq!(table.len(), 1);
        table.remove(id);
        assert!(table.is_empty());
        // All logits non-finite: no distribution; the largest logit's rule decides.
        let none = [f32::NEG_INFINITY; 3];
        let hot = Sampling {
            temperature: 1.0,
            seed: 1,
        };
        assert_eq!(sample(&none, hot, 0), super::argmax(&none));
    }
}
