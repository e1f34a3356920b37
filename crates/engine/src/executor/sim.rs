//! The simulated executor: step durations from a [`CostModel`], page bytes from [`page_content`].

use std::time::Duration;

use kv_pool::PageStorage;

use super::{CostModel, Executor, PageWrite, StepBatch, StepOutput, page_content};
use crate::error::Result;
use crate::params::cost::seconds;

/// The embedded default executor. Deterministic: the same batches give the same durations and bytes.
#[derive(Clone, Debug, Default)]
pub struct SimExecutor {
    cost: CostModel,
    steps: u64,
}

impl SimExecutor {
    /// A simulated executor with the step-time model `cost`.
    pub fn new(cost: CostModel) -> SimExecutor {
        SimExecutor { cost, steps: 0 }
    }

    /// The cost model in use.
    pub fn cost(&self) -> &CostModel {
        &self.cost
    }

    /// Steps executed so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }
}

impl Executor for SimExecutor {
    fn name(&self) -> &str {
        self.cost.name
    }

    /// It prices a step by its token counts alone.
    fn reads_tokens(&self) -> bool {
        false
    }

    fn execute(&mut self, batch: &StepBatch<'_>, _storage: &dyn PageStorage) -> Result<StepOutput> {
        Ok(StepOutput {
            duration: self.modeled_duration(batch),
            tokens: Vec::new(),
        })
    }

    fn fill_page(&self, write: &PageWrite, out: &mut [u8]) {
        page_content(
            write.group,
            write.rank,
            write.first_pos,
            &write.prefix_key,
            out,
        );
    }

    fn copy_time(&self, n_tokens: u32) -> Duration {
        self.cost.copy_time(n_tokens)
    }

    fn recompute_time(&self, n_tokens: u32) -> Duration {
        seconds(self.cost.prefill_s(0, n_tokens))
    }
}

impl SimExecutor {
    /// The modeled duration of `batch` (zero when it is empty); counts the step.
    fn modeled_duration(&mut self, batch: &StepBatch<'_>) -> Duration {
        if batch.is_empty() {
            return Duration::ZERO;
        }
        self.steps += 1;
        let cost = &self.cost;
        let mut seconds = cost.step_overhead_s;
        for prefill in &batch.prefills {
            seconds += cost.prefill_s(prefill.first_pos, prefill.n_tokens);
        }
        // Draft work is the draft head's (`CostModel::draft_head_fraction`): its replay of a restored page
        // (H5), charged to the entry's step...
        let replays = batch
            .prefills
            .iter()
            .map(|work| (work.first_pos, work.draft_replay_tokens))
            .chain(
                batch
                    .decodes
                    .iter()
                    .map(|work| (work.context_tokens, work.draft_replay_tokens)),
            );
        for (before, tokens) in replays {
            if tokens > 0 {
                seconds += cost.draft_replay_s(before.saturating_sub(tokens), tokens);
            }
        }
        if !batch.decodes.is_empty() || !batch.logits_only.is_empty() {
            seconds += cost.decode_weights_s;
        }
        // ...and its proposals: `n_tokens - 1` drafts after each decode entry's pending token, which the full
        // model verifies with it (`decode_entry_s`).
        let depth = batch
            .decodes
            .iter()
            .map(|decode| decode.n_tokens.saturating_sub(1))
            .max()
            .unwrap_or(0);
        if depth > 0 {
            seconds += cost.draft_weights_s(depth);
        }
        for decode in &batch.decodes {
            seconds += cost.decode_entry_s(decode.context_tokens, decode.n_tokens);
            let drafts = decode.n_tokens.saturating_sub(1);
            if drafts > 0 {
                seconds += cost.draft_entry_s(decode.context_tokens, drafts);
            }
        }
        seconds += batch.logits_only.len() as f64 * cost.decode_s_per_seq;
        crate::params::cost::seconds(seconds)
    }
}
