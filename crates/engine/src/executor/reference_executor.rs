//! The reference executor (L3): the [`ReferenceModel`] driven by the step loop. It computes real keys,
//! values and recurrent state into the pool's pages through each entry's page tables, returns the greedy
//! next token of every entry that samples, and measures its steps on the wall clock. Verification of a
//! restore (E3, L5) recomputes the same prefix into scratch storage and compares bytes.
//!
//! Geometry: the model's own (`ReferenceConfig::cache_groups`): one full-attention group, with local layers
//! one sliding-window or chunked-local group, and one recurrent group per state page, on the model's
//! context-parallel ranks, with its page width; the engine refuses anything else at build. The pool's pages
//! are as large as the largest of the model's page kinds; a smaller page uses its first bytes and the rest
//! stays zero.
//!
//! Draft decoding: the model has no draft head, so it proposes no draft token. The engine budgets and
//! allocates the lookahead slots of a decode (and a restore's replay page, H5) as for any drafting model;
//! the model computes the pending token alone, which is what greedy speculative decoding accepts when every
//! draft is rejected: the tokens are those of plain greedy decoding, one a step (`draft_acceptance`, the
//! simulated acceptance, does not apply to an executor that samples its own tokens).
//!
//! Token ids: the model reads a token `t` as `t % vocab` (workloads draw ids from all of `u32`, and the stop
//! token is `u32::MAX`); the tokens it samples are below `vocab`.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use kv_pool::{GroupKind, HostStorage, PageId, PagePrefix, PageStorage};
use reference_model::{ForwardEntry, ModelError, ModelStorage, ReferenceConfig, ReferenceModel};

use super::{
    Executor, MeasuredCost, PageOnRanks, PageWrite, RecomputedPages, StepBatch, StepOutput,
};
use crate::error::{Error, Result};
use crate::params::EngineParams;
use crate::request::RequestSpec;

/// The reference model as an [`Executor`].
#[derive(Debug)]
pub struct ReferenceExecutor {
    model: ReferenceModel,
    /// Bytes of one pool page: the largest of the model's page kinds.
    bytes_per_page: u32,
    steps: u64,
    /// The measured cost of a token.
    measured: MeasuredCost,
}

impl ReferenceExecutor {
    /// Builds the model of `config` (weights from its seed). Errors: `Error::Model` for an invalid config,
    /// `Error::InvalidParam` when its pages are larger than a pool page may be.
    pub fn new(config: ReferenceConfig) -> Result<ReferenceExecutor> {
        let model = ReferenceModel::new(config).map_err(model_error)?;
        let bytes = config.max_bytes_per_page();
        let bytes_per_page = u32::try_from(bytes)
            .ok()
            .filter(|&bytes| bytes <= EngineParams::PAGE_BYTES_MAX)
            .ok_or_else(|| Error::InvalidParam {
                name: "reference model",
                reason: format!(
                    "its pages hold {bytes} bytes, more than {} a pool page may; use fewer tokens per page \
                     or a narrower model",
                    EngineParams::PAGE_BYTES_MAX
                ),
            })?;
        Ok(ReferenceExecutor {
            model,
            bytes_per_page,
            steps: 0,
            measured: MeasuredCost::default(),
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

    /// The model's view of the pool storage: full-attention, local and recurrent pages of their own sizes.
    fn storages<'a>(&self, storage: &'a dyn PageStorage) -> Result<GroupViews<'a>> {
        let config = self.model.config();
        let view = |bytes_per_page| PagePrefix::new(storage, bytes_per_page);
        let optional =
            |present: bool, bytes_per_page| present.then(|| view(bytes_per_page)).transpose();
        Ok(GroupViews {
            attention: view(config.bytes_per_page())?,
            local: optional(config.local.is_some(), config.local_bytes_per_page())?,
            recurrent: optional(
                config.n_recurrent_layers > 0,
                config.recurrent_bytes_per_page(),
            )?,
        })
    }

    /// Runs `entries` in waves: an entry that reads a page an earlier entry of its wave writes (a block
    /// registered by a chunk of this step and hit by a later admission) starts the next wave. Batch
    /// invariance makes the bits the same as one pass.
    fn forward_in_waves(
        &self,
        storage: ModelStorage<'_>,
        entries: &[ForwardEntry<'_>],
    ) -> Result<Vec<Option<u32>>> {
        let tpp = self.model.config().block_tokens();
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
        let logits = self.model.forward(storage, entries).map_err(model_error)?;
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
                    local_pages: pages.windows.first().map_or(&[], Vec::as_slice),
                    // The model's geometry has no auxiliary group: the fixed pages are the state pages.
                    state_pages: pages.fixed,
                    want_logits: samples,
                },
            )
            .collect();
        let views = self.storages(storage)?;
        let next_tokens = self.forward_in_waves(views.model_storage(), &entries)?;
        self.measured.record(
            entries
                .iter()
                .map(|entry| entry.tokens.len() as u64)
                .sum::<u64>(),
            started.elapsed().as_secs_f64(),
        );
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
        let bytes = f64::from(n_tokens)
            * (config.bytes_per_page() + config.local_bytes_per_page()) as f64
            / f64::from(config.tokens_per_page);
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
                "cache groups {kinds:?}, but the model has {expected:?} (one full-attention group, a local group \
                 with local layers, and one recurrent group per state page)"
            ));
        }
        if geometry.tokens_per_page() != config.tokens_per_page {
            return unsupported(format!(
                "{} tokens per page, but the model's pages hold {}",
                geometry.tokens_per_page(),
                config.tokens_per_page
            ));
        }
        if geometry.context_parallel() != config.context_parallel {
            return unsupported(format!(
                "{} context-parallel ranks, but the model runs on {}",
                geometry.context_parallel(),
                config.context_parallel
            ));
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
        let n_ranks = config.context_parallel;
        let attention = HostStorage::new(n_ranks, n_blocks + 1, config.bytes_per_page())?;
        let local = config
            .local
            .map(|_| HostStorage::new(n_ranks, n_blocks + 1, config.local_bytes_per_page()))
            .transpose()?;
        let n_states = config.n_state_pages() as u32;
        let recurrent = (n_states > 0)
            .then(|| HostStorage::new(n_ranks, n_states + 1, config.recurrent_bytes_per_page()))
            .transpose()?;
        let tokens: Vec<u32> = prefix
            .iter()
            .map(|&token| self.model_token(token))
            .collect();
        let table: Vec<PageId> = (1..=n_blocks).map(PageId).collect();
        let state_pages: Vec<PageId> = (1..=n_states).map(PageId).collect();
        let entry = ForwardEntry {
            tokens: &tokens,
            first_pos: 0,
            attention_pages: &table,
            local_pages: if local.is_some() { &table } else { &[] },
            state_pages: &state_pages,
            want_logits: false,
        };
        let storage = ModelStorage {
            attention: &attention,
            local: local.as_ref().map(|l| l as &dyn PageStorage),
            recurrent: recurrent.as_ref().map(|r| r as &dyn PageStorage),
        };
        self.model.forward(storage, &[entry]).map_err(model_error)?;
        // Each page read in place into the first bytes of its returned buffer, allocated once at the pool's
        // page size (zeros after the model's page): no scratch buffer, no growth.
        let read_padded = |storage: &dyn PageStorage, page: PageId| -> Result<PageOnRanks> {
            (0..n_ranks)
                .map(|rank| {
                    let mut bytes = vec![0u8; bytes_per_page.max(storage.bytes_per_page())];
                    storage.read(rank, page, &mut bytes[..storage.bytes_per_page()])?;
                    bytes.truncate(bytes_per_page);
                    Ok(bytes)
                })
                .collect()
        };
        pages.blocks.reserve(table.len());
        for &page in &table {
            pages.blocks.push(read_padded(&attention, page)?);
        }
        if let Some(local) = &local {
            let window = table
                .iter()
                .map(|&page| read_padded(local, page))
                .collect::<Result<Vec<_>>>()?;
            pages.windows.push(window);
        }
        if let Some(recurrent) = &recurrent {
            for &page in &state_pages {
                pages.fixed.push(read_padded(recurrent, page)?);
            }
        }
        Ok(Some(pages))
    }
}

/// The model's views of the pool storage, one per page kind.
struct GroupViews<'a> {
    attention: PagePrefix<'a>,
    local: Option<PagePrefix<'a>>,
    recurrent: Option<PagePrefix<'a>>,
}

impl GroupViews<'_> {
    fn model_storage(&self) -> ModelStorage<'_> {
        ModelStorage {
            attention: &self.attention,
            local: self.local.as_ref().map(|l| l as &dyn PageStorage),
            recurrent: self.recurrent.as_ref().map(|r| r as &dyn PageStorage),
        }
    }
}

/// The model's error as the engine's: `Error::Model`, its source the `ModelError`, its message the model's.
fn model_error(error: ModelError) -> Error {
    Error::Model(Box::new(error))
}
