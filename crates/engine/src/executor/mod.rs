//! The `Executor` trait (the model's work for one step) and the simulated executor, the embedded default.

mod content;
mod cost;
mod reference;
mod sim;

pub use content::page_content;
pub use cost::CostModel;
pub use reference::{
    ForwardEntry, Logits, ModelError, ModelResult, ModelStorage, ReferenceConfig, ReferenceModel,
};
pub use sim::SimExecutor;

use std::time::Duration;

use kv_pool::RequestId;
use kv_pool::{BlockKey, PageId};

/// One prefill chunk of a step: `n_tokens` prompt tokens of `request` starting at position `first_pos`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefillWork {
    /// The request computed.
    pub request: RequestId,
    /// Position of the chunk's first token (tokens before it are attended, not computed).
    pub first_pos: u32,
    /// Tokens computed.
    pub n_tokens: u32,
    /// Tokens the draft model recomputes before drafting resumes after a restore whose checkpoint carries
    /// no draft state (H5): the tokens of the last page; 0 otherwise.
    pub draft_replay_tokens: u32,
}

/// One decode entry of a step: `request` reads `context_tokens` and produces `n_tokens` (1 + draft tokens).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeWork {
    /// The request decoded.
    pub request: RequestId,
    /// Context tokens read.
    pub context_tokens: u32,
    /// Tokens produced (one, plus draft lookahead tokens when configured).
    pub n_tokens: u32,
    /// As `PrefillWork::draft_replay_tokens`.
    pub draft_replay_tokens: u32,
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
pub struct StepBatch {
    /// Prefill chunks.
    pub prefills: Vec<PrefillWork>,
    /// Decode entries.
    pub decodes: Vec<DecodeWork>,
    /// Requests given an isolated logits-only step (a full-prompt restore with saved logits, Q4).
    pub logits_only: Vec<RequestId>,
}

impl StepBatch {
    /// Whether the step schedules nothing.
    pub fn is_empty(&self) -> bool {
        self.prefills.is_empty() && self.decodes.is_empty() && self.logits_only.is_empty()
    }
}

/// Does the model's work for a step and says how long it took. Implementations: [`SimExecutor`] (virtual
/// clock, cost model, deterministic page bytes); later a reference transformer on CPU and GPU.
pub trait Executor {
    /// The executor's name for reports.
    fn name(&self) -> &str;

    /// Runs `batch` and returns its duration on the engine's clock.
    fn execute(&mut self, batch: &StepBatch) -> Duration;

    /// The bytes a computed page holds: what recompute writes for `write` (contract E3).
    fn fill_page(&self, write: &PageWrite, out: &mut [u8]);

    /// Time to copy `n_tokens` tokens of checkpointed KV cache into the pool.
    fn copy_time(&self, n_tokens: u32) -> Duration;
}
