//! The reference executor (L3): the [`ReferenceModel`] driven by the step loop. It computes real keys,
//! values and recurrent state into the pool's pages through each entry's page tables, returns the greedy
//! next token of every entry that samples, and measures its steps on the wall clock. Verification of a
//! restore (E3, L5) recomputes the same prefix into scratch storage and compares bytes.
//!
//! Geometry: the model's own (`ReferenceConfig::cache_groups`): one full-attention group and, with recurrent
//! layers, one recurrent group, on one rank, with the model's page width; the engine refuses anything else at
//! build. The pool's pages are as large as the larger of the model's two page kinds; a recurrent state page
//! uses its first `recurrent_bytes_per_page` bytes and the rest stays zero.
//!
//! Token ids: the model reads a token `t` as `t % vocab` (workloads draw ids from all of `u32`, and the stop
//! token is `u32::MAX`); the tokens it samples are below `vocab`.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use kv_pool::{GroupKind, HostStorage, PageId, PageStorage};

use super::{
    Executor, ForwardEntry, ModelStorage, PageTables, PageWrite, RecomputedPages, ReferenceConfig,
    ReferenceModel, StepBatch, StepOutput,
};
use crate::error::{Error, Result};
use crate::params::EngineParams;
use crate::request::RequestSpec;

/// Modeled restore copy bandwidth of the inline copy engine (host memory to host memory).
const COPY_BYTES_PER_S: f64 = 10e9;
/// Modeled latency of one restore copy of the inline copy engine.
const COPY_LATENCY_S: f64 = 10e-6;

/// The reference model as an [`Executor`].
#[derive(Debug)]
pub struct ReferenceExecutor {
    model: ReferenceModel,
    /// Bytes of one pool page: the larger of the model's attention and recurrent pages.
    bytes_per_page: u32,
    steps: u64,
    /// Tokens computed and wall seconds spent over every step so far: the measured cost of a token.
    tokens_computed: u64,
    seconds_spent: f64,
}

impl ReferenceExecutor {
    /// Builds the model of `config` (weights from its seed). Errors: `Error::Model` for an invalid config,
    /// `Error::InvalidParam` when its pages are larger than a pool page may be.
    pub fn new(config: ReferenceConfig) -> Result<ReferenceExecutor> {
        let model = ReferenceModel::new(config)?;
        let bytes = config
            .bytes_per_page()
            .max(config.recurrent_bytes_per_page());
        let bytes_per_page = u32::try_from(bytes)
            .ok()
            .filter(|&bytes| bytes <= EngineParams::SIM_BYTES_PER_PAGE_MAX)
            .ok_or_else(|| Error::InvalidParam {
                name: "reference model",
                reason: format!(
                    "its pages hold {bytes} bytes, more than {} a pool page may; use fewer tokens per page \
                     or a narrower model",
                    EngineParams::SIM_BYTES_PER_PAGE_MAX
                ),
            })?;
        Ok(ReferenceExecutor {
            model,
            bytes_per_page,
            steps: 0,
            tokens_computed: 0,
            seconds_spent: 0.0,
        })
    }

    /// The model's configuration.
    pub fn config(&self) -> &ReferenceConfig {
        self.model.config()
    }

    /// Steps executed so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The token the model reads for `token`.
    fn model_token(&self, token: u32) -> u32 {
        token % self.model.config().vocab
    }

    /// The model's view of the pool storage: attention and recurrent pages of their own sizes.
    fn storages<'a>(
        &self,
        storage: &'a dyn PageStorage,
    ) -> (PagePrefix<'a>, Option<PagePrefix<'a>>) {
        let config = self.model.config();
        let attention = PagePrefix {
            inner: storage,
            bytes_per_page: config.bytes_per_page(),
        };
        let recurrent = (config.n_recurrent_layers > 0).then(|| PagePrefix {
            inner: storage,
            bytes_per_page: config.recurrent_bytes_per_page(),
        });
        (attention, recurrent)
    }

    /// Runs `entries` in waves: an entry that reads a page an earlier entry of its wave writes (a block
    /// registered by a chunk of this step and hit by a later admission) starts the next wave. Batch
    /// invariance makes the bits the same as one pass.
    fn forward_in_waves(
        &self,
        storage: ModelStorage<'_>,
        entries: &[ForwardEntry<'_>],
    ) -> Result<Vec<Option<u32>>> {
        let tpp = self.model.config().tokens_per_page;
        let mut next_tokens = Vec::with_capacity(entries.len());
        let mut wave_start = 0;
        let mut written: HashSet<PageId> = HashSet::new();
        for (idx, entry) in entries.iter().enumerate() {
            let write_lo = (entry.first_pos / tpp) as usize;
            let reads = &entry.attention_pages[..write_lo.min(entry.attention_pages.len())];
            if reads.iter().any(|page| written.contains(page)) {
                self.forward_wave(storage, &entries[wave_start..idx], &mut next_tokens)?;
                wave_start = idx;
                written.clear();
            }
            let end = entry.first_pos as usize + entry.tokens.len();
            let write_hi = end.div_ceil(tpp as usize).min(entry.attention_pages.len());
            written.extend(&entry.attention_pages[write_lo.min(write_hi)..write_hi]);
        }
        self.forward_wave(storage, &entries[wave_start..], &mut next_tokens)?;
        Ok(next_tokens)
    }

    fn forward_wave(
        &self,
        storage: ModelStorage<'_>,
        entries: &[ForwardEntry<'_>],
        next_tokens: &mut Vec<Option<u32>>,
    ) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let logits = self.model.forward(storage, entries)?;
        next_tokens.extend(
            logits
                .into_iter()
                .map(|logits| logits.map(|l| l.next_token)),
        );
        Ok(())
    }
}

impl Executor for ReferenceExecutor {
    fn name(&self) -> &str {
        "reference"
    }

    fn execute(&mut self, batch: &StepBatch<'_>, storage: &dyn PageStorage) -> Result<StepOutput> {
        if batch.is_empty() {
            return Ok(StepOutput::default());
        }
        if let Some(&request) = batch.logits_only.first() {
            return Err(Error::InvalidParam {
                name: "saved_logits",
                reason: format!(
                    "{request} has a logits-only step, but the reference executor's checkpoints carry no logits"
                ),
            });
        }
        #[allow(
            clippy::disallowed_methods,
            reason = "the reference executor measures its step on the wall clock"
        )]
        let started = Instant::now();
        self.steps += 1;
        let prefills = batch.prefills.iter().map(|work| {
            (
                work.request,
                work.first_pos,
                work.tokens,
                work.pages,
                work.samples,
            )
        });
        let decodes = batch.decodes.iter().map(|work| {
            (
                work.request,
                work.context_tokens,
                work.tokens,
                work.pages,
                true,
            )
        });
        let works: Vec<_> = prefills.chain(decodes).collect();
        let tokens: Vec<Vec<u32>> = works
            .iter()
            .map(|work| {
                work.2
                    .iter()
                    .map(|&token| self.model_token(token))
                    .collect()
            })
            .collect();
        let entries: Vec<ForwardEntry<'_>> = works
            .iter()
            .zip(&tokens)
            .map(
                |(&(_, first_pos, _, pages, samples), tokens)| ForwardEntry {
                    tokens,
                    first_pos,
                    attention_pages: pages.block_table,
                    recurrent_page: recurrent_page(self.model.config(), pages),
                    want_logits: samples,
                },
            )
            .collect();
        let (attention, recurrent) = self.storages(storage);
        let model_storage = ModelStorage {
            attention: &attention,
            recurrent: recurrent.as_ref().map(|r| r as &dyn PageStorage),
        };
        let next_tokens = self.forward_in_waves(model_storage, &entries)?;
        self.tokens_computed += entries
            .iter()
            .map(|entry| entry.tokens.len() as u64)
            .sum::<u64>();
        self.seconds_spent += started.elapsed().as_secs_f64();
        let tokens = works
            .iter()
            .zip(next_tokens)
            .filter_map(|(work, token)| token.map(|token| (work.0, token)))
            .collect();
        Ok(StepOutput {
            duration: started.elapsed(),
            tokens,
        })
    }

    fn fill_page(&self, _write: &PageWrite, out: &mut [u8]) {
        // Never called: the reference executor writes its pages itself (`writes_pages`).
        out.fill(0);
    }

    fn copy_time(&self, n_tokens: u32) -> Duration {
        let config = self.model.config();
        let bytes = f64::from(n_tokens) * config.bytes_per_page() as f64
            / f64::from(config.tokens_per_page);
        Duration::from_secs_f64(COPY_LATENCY_S + bytes / COPY_BYTES_PER_S)
    }

    /// Measured: the wall seconds per token of every step so far. Before the first step nothing is known,
    /// and a copy of bytes is taken to be cheaper than running the model over them.
    fn recompute_time(&self, n_tokens: u32) -> Duration {
        if self.tokens_computed == 0 {
            return Duration::MAX;
        }
        let s_per_token = self.seconds_spent / self.tokens_computed as f64;
        Duration::try_from_secs_f64(s_per_token * f64::from(n_tokens)).unwrap_or(Duration::MAX)
    }

    fn writes_pages(&self) -> bool {
        true
    }

    fn bytes_per_page(&self) -> Option<u32> {
        Some(self.bytes_per_page)
    }

    fn check_params(&self, params: &EngineParams) -> Result<()> {
        let config = self.model.config();
        let geometry = &params.geometry;
        let unsupported = |reason: String| {
            Err(Error::UnsupportedGeometry {
                reason: format!("the reference executor runs its model's own geometry: {reason}"),
            })
        };
        let kinds: Vec<GroupKind> = geometry.groups().iter().map(|group| group.kind).collect();
        let expected: Vec<GroupKind> = config
            .cache_groups()
            .iter()
            .map(|group| group.kind)
            .collect();
        if kinds != expected {
            return unsupported(format!(
                "cache groups {kinds:?}, but the model has {expected:?} (one full-attention group, and one \
                 recurrent group when it has recurrent layers)"
            ));
        }
        if geometry.tokens_per_page() != config.tokens_per_page {
            return unsupported(format!(
                "{} tokens per page, but the model's pages hold {}",
                geometry.tokens_per_page(),
                config.tokens_per_page
            ));
        }
        if geometry.context_parallel() != 1 {
            return unsupported(format!(
                "{} context-parallel ranks, but the model runs on one",
                geometry.context_parallel()
            ));
        }
        if params.draft_tokens != 0 {
            return Err(Error::InvalidParam {
                name: "draft_tokens",
                reason: format!(
                    "{} draft tokens, but the reference model has no draft head; use 0",
                    params.draft_tokens
                ),
            });
        }
        Ok(())
    }

    fn check_request(&self, spec: &RequestSpec) -> Result<()> {
        if spec.saved_logits {
            return Err(Error::InvalidParam {
                name: "saved_logits",
                reason: format!(
                    "{} asks to sample from saved logits, but the reference executor's checkpoints carry none; \
                     submit it without saved logits",
                    spec.id
                ),
            });
        }
        Ok(())
    }

    fn recompute(
        &mut self,
        prefix: &[u32],
        bytes_per_page: usize,
    ) -> Result<Option<RecomputedPages>> {
        let config = *self.model.config();
        let mut pages = RecomputedPages::default();
        if prefix.is_empty() {
            return Ok(Some(pages));
        }
        let n_tokens = u32::try_from(prefix.len()).map_err(|_| Error::InvalidParam {
            name: "prefix",
            reason: format!("{} tokens do not fit a position", prefix.len()),
        })?;
        let n_blocks = config.pages_for_tokens(n_tokens);
        let attention = HostStorage::new(1, n_blocks + 1, config.bytes_per_page())?;
        let recurrent = (config.n_recurrent_layers > 0)
            .then(|| HostStorage::new(1, 2, config.recurrent_bytes_per_page()))
            .transpose()?;
        let tokens: Vec<u32> = prefix
            .iter()
            .map(|&token| self.model_token(token))
            .collect();
        let table: Vec<PageId> = (1..=n_blocks).map(PageId).collect();
        let entry = ForwardEntry {
            tokens: &tokens,
            first_pos: 0,
            attention_pages: &table,
            recurrent_page: recurrent.as_ref().map(|_| PageId(1)),
            want_logits: false,
        };
        let storage = ModelStorage {
            attention: &attention,
            recurrent: recurrent.as_ref().map(|r| r as &dyn PageStorage),
        };
        self.model.forward(storage, &[entry])?;
        let read_padded = |storage: &dyn PageStorage, page: PageId| -> Result<Vec<u8>> {
            let mut bytes = vec![0u8; storage.bytes_per_page()];
            storage.read(0, page, &mut bytes)?;
            bytes.resize(bytes_per_page, 0);
            Ok(bytes)
        };
        for &page in &table {
            pages.blocks.push(read_padded(&attention, page)?);
        }
        if let Some(recurrent) = &recurrent {
            pages.fixed.push(read_padded(recurrent, PageId(1))?);
        }
        Ok(Some(pages))
    }
}

/// The recurrent state page of an entry: its first fixed page when the model has recurrent layers.
fn recurrent_page(config: &ReferenceConfig, pages: PageTables<'_>) -> Option<PageId> {
    if config.n_recurrent_layers == 0 {
        return None;
    }
    // A missing page is refused by the model's batch check (`RecurrentPage`).
    pages.fixed.first().copied()
}

/// The first `bytes_per_page` bytes of every page of `inner`: a model's page kind inside larger pool pages.
/// A write zeroes the rest of the page.
struct PagePrefix<'a> {
    inner: &'a dyn PageStorage,
    bytes_per_page: usize,
}

impl PageStorage for PagePrefix<'_> {
    fn n_ranks(&self) -> u32 {
        self.inner.n_ranks()
    }

    fn n_pages(&self) -> u32 {
        self.inner.n_pages()
    }

    fn bytes_per_page(&self) -> usize {
        self.bytes_per_page
    }

    fn read(&self, rank: u32, page: PageId, dst: &mut [u8]) -> kv_pool::Result<()> {
        if self.bytes_per_page == self.inner.bytes_per_page() {
            return self.inner.read(rank, page, dst);
        }
        check_len(dst.len(), self.bytes_per_page)?;
        let mut whole = vec![0u8; self.inner.bytes_per_page()];
        self.inner.read(rank, page, &mut whole)?;
        dst.copy_from_slice(&whole[..self.bytes_per_page]);
        Ok(())
    }

    fn write(&self, rank: u32, page: PageId, src: &[u8]) -> kv_pool::Result<()> {
        if self.bytes_per_page == self.inner.bytes_per_page() {
            return self.inner.write(rank, page, src);
        }
        check_len(src.len(), self.bytes_per_page)?;
        let mut whole = vec![0u8; self.inner.bytes_per_page()];
        whole[..self.bytes_per_page].copy_from_slice(src);
        self.inner.write(rank, page, &whole)
    }

    fn copy(&self, rank: u32, src: PageId, dst: PageId) -> kv_pool::Result<()> {
        self.inner.copy(rank, src, dst)
    }
}

fn check_len(len: usize, bytes_per_page: usize) -> kv_pool::Result<()> {
    if len == bytes_per_page {
        Ok(())
    } else {
        Err(kv_pool::Error::BufferLength {
            len,
            bytes_per_page,
        })
    }
}
