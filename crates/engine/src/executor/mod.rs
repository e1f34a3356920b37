//! The `Executor` trait (the model's work for one step) and the simulated executor, the embedded default.

mod content;
mod measured;
mod reference_executor;
mod sim;

pub use crate::params::CostModel;
pub use content::page_content;
pub use measured::MeasuredCost;
pub use reference_executor::ReferenceExecutor;
pub use sim::SimExecutor;

use std::time::Duration;

use kv_pool::RequestId;
use kv_pool::{BlockKey, PageId, PageStorage};

use crate::error::Result;
use crate::params::EngineParams;
use crate::request::RequestSpec;

/// The pages one request holds, per kind of cache group (L3): what a real executor reads and writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageTables<'a> {
    /// The full-attention group's block table: page `i` holds block `i` (tokens `[i * B, (i + 1) * B)`,
    /// `B = Geometry::block_tokens`).
    pub block_table: &'a [PageId],
    /// One block-indexed table per sliding-window or chunked-local group, in group order; the null page
    /// before the live window.
    pub windows: &'a [Vec<PageId>],
    /// The recurrent and auxiliary pages, in group order.
    pub fixed: &'a [PageId],
}

/// One prefill chunk of a step: `n_tokens` prompt tokens of `request` starting at position `first_pos`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefillWork<'a> {
    /// The request computed.
    pub request: RequestId,
    /// Position of the chunk's first token (tokens before it are attended, not computed).
    pub first_pos: u32,
    /// Tokens computed.
    pub n_tokens: u32,
    /// Tokens the draft model recomputes before drafting resumes after a restore whose checkpoint carries
    /// no draft state (H5): the tokens of the last page; 0 otherwise.
    pub draft_replay_tokens: u32,
    /// The tokens computed (`n_tokens` of them, from `first_pos`).
    pub tokens: &'a [u32],
    /// The request's pages, grown to hold the chunk.
    pub pages: PageTables<'a>,
    /// Whether the chunk ends the prompt: the step then samples the request's next token.
    pub samples: bool,
}

/// One decode entry of a step: `request` reads `context_tokens` and computes `n_tokens`: its pending token and
/// the draft tokens proposed after it, which the step verifies (it yields 1 to `n_tokens` tokens).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeWork<'a> {
    /// The request decoded.
    pub request: RequestId,
    /// Context tokens read.
    pub context_tokens: u32,
    /// Tokens computed: the pending one, plus the draft tokens when draft decoding is on (each proposed by
    /// the draft head).
    pub n_tokens: u32,
    /// As `PrefillWork::draft_replay_tokens`.
    pub draft_replay_tokens: u32,
    /// The token computed: the pending one, at position `context_tokens`.
    pub tokens: &'a [u32],
    /// The request's pages, grown to hold the token.
    pub pages: PageTables<'a>,
}

/// A page the step fills: on `rank`, the page of cache group `group` whose first token is `first_pos` and
/// whose filled tokens end the prefix with key `prefix_key`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageWrite {
    /// Cache group index.
    pub group: u32,
    /// Context-parallel rank whose shard of the page is written.
    pub rank: u32,
    /// Destination page.
    pub page: PageId,
    /// Position of the page's first token.
    pub first_pos: u32,
    /// Key of the token prefix through the page's last filled token (salt included).
    pub prefix_key: BlockKey,
}

/// Everything one step computes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepBatch<'a> {
    /// Prefill chunks.
    pub prefills: Vec<PrefillWork<'a>>,
    /// Decode entries.
    pub decodes: Vec<DecodeWork<'a>>,
    /// Requests given an isolated logits-only step (a full-prompt restore with saved logits, Q4).
    pub logits_only: Vec<RequestId>,
}

impl StepBatch<'_> {
    /// Whether the step schedules nothing.
    pub fn is_empty(&self) -> bool {
        self.prefills.is_empty() && self.decodes.is_empty() && self.logits_only.is_empty()
    }
}

/// What an executed step gives back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepOutput {
    /// How long the step took: modeled (simulated executor) or measured (a real one).
    pub duration: Duration,
    /// The model's next token for each entry that samples, when the executor has a model; the engine
    /// samples the rest itself (`output_token`).
    pub tokens: Vec<(RequestId, u32)>,
}

/// One page's bytes on every context-parallel rank, in rank order.
pub type PageOnRanks = Vec<Vec<u8>>;

/// The pages a recompute of a prefix writes, in the storage's page size, on every rank: what a restore of
/// that prefix must hold byte for byte (E3, L4).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecomputedPages {
    /// The full-attention group's pages, one per block of the prefix (a partial last one included).
    pub blocks: Vec<PageOnRanks>,
    /// Each windowed group's pages (sliding window, chunked local), in group order: one per block of the
    /// prefix, those that left the window included (a checkpoint holds only the live ones).
    pub windows: Vec<Vec<PageOnRanks>>,
    /// The fixed pages (recurrent state), in group order.
    pub fixed: Vec<PageOnRanks>,
}

/// Does the model's work for a step and says how long it took. Implementations: [`SimExecutor`] (the
/// default: modeled durations, the engine fills page bytes with [`page_content`] and samples with
/// `output_token`) and [`ReferenceExecutor`] (a real model: it reads and writes the KV cache and recurrent
/// state in pool storage through each entry's page tables, and returns the tokens it samples).
pub trait Executor {
    /// The executor's name for reports.
    fn name(&self) -> &str;

    /// Runs `batch` against the pool's page bytes `storage` and returns its duration and the tokens it
    /// sampled. Errors: a batch the executor cannot run (a real model's refusal or a storage failure).
    fn execute(&mut self, batch: &StepBatch<'_>, storage: &dyn PageStorage) -> Result<StepOutput>;

    /// The bytes a computed page holds: what recompute writes for `write` (contract E3). Used only by
    /// executors that do not write pages themselves ([`Executor::writes_pages`] is `false`).
    fn fill_page(&self, write: &PageWrite, out: &mut [u8]);

    /// Time to copy `n_tokens` tokens of checkpointed KV cache into the pool.
    fn copy_time(&self, n_tokens: u32) -> Duration;

    /// Time to compute a context of `n_tokens` tokens again from its first token: what a preemption by
    /// recompute costs, weighed against offloading (`Preemption::Offload`).
    fn recompute_time(&self, n_tokens: u32) -> Duration;

    /// Whether `execute` reads its entries' tokens. When `false` the engine passes them none, and a request
    /// whose prompt is deferred (`RequestSpec::keyed_from_source`) runs without generating it.
    fn reads_tokens(&self) -> bool {
        true
    }

    /// Whether `execute` writes the pages itself; when `false` the engine fills them with
    /// [`Executor::fill_page`] once full (and partial and fixed pages at a capture).
    fn writes_pages(&self) -> bool {
        false
    }

    /// The bytes of one pool page the executor needs (`None`: the engine's `page_bytes`).
    fn bytes_per_page(&self) -> Option<u32> {
        None
    }

    /// Checks that the executor runs an engine built from `params` (its geometry, draft tokens).
    fn check_params(&self, _params: &EngineParams) -> Result<()> {
        Ok(())
    }

    /// Checks that the executor runs `spec` (an executor with a model has no saved logits to sample from).
    fn check_request(&self, _spec: &RequestSpec) -> Result<()> {
        Ok(())
    }

    /// Recomputes the first `prefix.len()` tokens into scratch storage and returns the pages they fill, each
    /// `bytes_per_page` long (E3 verification of a restore). `None` when the executor has no model: the engine
    /// checks against [`Executor::fill_page`].
    fn recompute(
        &mut self,
        _prefix: &[u32],
        _bytes_per_page: usize,
    ) -> Result<Option<RecomputedPages>> {
        Ok(None)
    }
}
