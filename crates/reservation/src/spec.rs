//! `RestoreSpec`: what a restore asks for (checkpoint boundary, prompt, chunking, draft, captures and the
//! checkpoint's layout), validated against the pool's `Geometry` into a `RestoreNeed` (contract R4, C1-C4).

use kv_pool::{Continuation, Geometry, RestoreNeed};

use crate::error::{Error, Result};

/// A restore request as the engine describes it, from the checkpoint's manifest and the request's prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RestoreSpec {
    /// The checkpoint's token boundary `n` (restored prefix).
    pub boundary_tokens: u32,
    /// The request's prompt length `L`.
    pub prompt_tokens: u32,
    /// The checkpoint's draft prefix (`<= boundary_tokens`).
    pub draft_prefix_tokens: u32,
    /// Largest prefill chunk of the engine.
    pub chunk_tokens: u32,
    /// Draft lookahead tokens (0 without draft decoding).
    pub draft_lookahead_tokens: u32,
    /// Checkpoints the consumer may publish during its continuation.
    pub captures: u32,
    /// Ranks the checkpoint was written on.
    pub n_ranks: u32,
    /// Tokens per page of the checkpoint.
    pub tokens_per_page: u32,
    /// Cache groups of the checkpoint.
    pub n_groups: u32,
}

impl RestoreSpec {
    /// A spec matching `geometry`'s layout (ranks, page width, groups), with no draft and no captures.
    pub fn for_geometry(
        geometry: &Geometry,
        boundary_tokens: u32,
        prompt_tokens: u32,
        chunk_tokens: u32,
    ) -> Self {
        RestoreSpec {
            boundary_tokens,
            prompt_tokens,
            draft_prefix_tokens: 0,
            chunk_tokens,
            draft_lookahead_tokens: 0,
            captures: 0,
            n_ranks: geometry.context_parallel(),
            tokens_per_page: geometry.tokens_per_page(),
            n_groups: geometry.groups().len() as u32,
        }
    }

    /// The continuation this restore budgets.
    pub fn continuation(&self) -> Continuation {
        Continuation {
            prefix_tokens: self.boundary_tokens,
            prompt_tokens: self.prompt_tokens,
            chunk_tokens: self.chunk_tokens,
            draft_lookahead_tokens: self.draft_lookahead_tokens,
            captures: self.captures,
        }
    }

    /// Validates the spec against `geometry` (R4) and computes the import pages and credits it needs.
    pub fn need(&self, geometry: &Geometry) -> Result<RestoreNeed> {
        self.validate(geometry)?;
        Ok(geometry.restore_need(&self.continuation()))
    }

    fn validate(&self, geometry: &Geometry) -> Result<()> {
        if self.boundary_tokens == 0 || self.prompt_tokens == 0 {
            return Err(Error::ZeroTokens {
                boundary_tokens: self.boundary_tokens,
                prompt_tokens: self.prompt_tokens,
            });
        }
        if self.boundary_tokens > self.prompt_tokens {
            return Err(Error::BoundaryPastPrompt {
                boundary_tokens: self.boundary_tokens,
                prompt_tokens: self.prompt_tokens,
            });
        }
        if self.draft_prefix_tokens > self.boundary_tokens {
            return Err(Error::DraftPrefixPastBoundary {
                draft_prefix_tokens: self.draft_prefix_tokens,
                boundary_tokens: self.boundary_tokens,
            });
        }
        if self.prompt_tokens > geometry.max_model_len() {
            return Err(Error::PromptPastModelLen {
                prompt_tokens: self.prompt_tokens,
                max_model_len: geometry.max_model_len(),
            });
        }
        if self.chunk_tokens == 0 {
            return Err(Error::ZeroChunk);
        }
        if self.n_ranks == 0 {
            return Err(Error::ZeroRanks);
        }
        if self.n_ranks != geometry.context_parallel() {
            return Err(Error::RanksMismatch {
                ranks: self.n_ranks,
                pool_ranks: geometry.context_parallel(),
            });
        }
        if self.tokens_per_page != geometry.tokens_per_page() {
            return Err(Error::PageWidthMismatch {
                tokens_per_page: self.tokens_per_page,
                pool_tokens_per_page: geometry.tokens_per_page(),
            });
        }
        let pool_n_groups = geometry.groups().len() as u32;
        if self.n_groups != pool_n_groups {
            return Err(Error::GroupsMismatch {
                n_groups: self.n_groups,
                pool_n_groups,
            });
        }
        Ok(())
    }
}
