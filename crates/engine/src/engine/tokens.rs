//! A live request's tokens: held, or with its prompt deferred to a [`PromptSource`](crate::PromptSource)
//! (`RequestSpec::keyed_from_source`). A deferred prompt's tokens before `start` are not held: the request
//! keeps its tokens from `start` on (the prompt's partial last block and last few tokens, then its output and
//! any streamed input), which is all the engine reads of a full-attention request on the simulated executor,
//! and generates the rest only where it is read (`Tokens::materialize`: at submit on an engine that reads
//! whole prompts, at a verified restore otherwise).

use kv_pool::RequestId;

use crate::error::{Error, Result};
use crate::request::{DeferredPrompt, SourcedPrompt};

/// Prompt, then output tokens (and streamed inputs appended on resume). While its prompt is deferred it holds
/// tokens `[start, len)`: reading one before `start` is an internal error until [`Tokens::materialize`]
/// generated them, so a path that reads a deferred prompt fails loudly instead of seeing none.
#[derive(Debug)]
pub(crate) struct Tokens {
    /// Tokens `[start, len)`; `start` is 0 once nothing is deferred.
    held: Vec<u32>,
    start: usize,
    /// The source of tokens `[0, start)`, while they are deferred.
    deferred: Option<SourcedPrompt>,
}

impl Tokens {
    /// Tokens held from the start.
    pub(crate) fn held(tokens: Vec<u32>) -> Tokens {
        Tokens {
            held: tokens,
            start: 0,
            deferred: None,
        }
    }

    /// A prompt held from its `tail_start` on, the rest deferred to its source.
    pub(crate) fn deferred(prompt: DeferredPrompt) -> Tokens {
        Tokens {
            held: prompt.tail,
            start: prompt.tail_start,
            deferred: Some(prompt.source),
        }
    }

    /// Number of tokens, held or deferred.
    pub(crate) fn len(&self) -> usize {
        self.start + self.held.len()
    }

    /// Whether part of the prompt is still deferred.
    pub(crate) fn is_deferred(&self) -> bool {
        self.deferred.is_some()
    }

    /// Every token; an internal error while part of the prompt is deferred.
    pub(crate) fn get(&self, request: RequestId) -> Result<&[u32]> {
        self.suffix(request, 0)
    }

    /// Tokens `[from, len)`; an internal error when some of them are deferred.
    pub(crate) fn suffix(&self, request: RequestId, from: usize) -> Result<&[u32]> {
        if from < self.start {
            return Err(Error::internal(format!(
                "{request}: token {from} of its deferred prompt was read before it was generated (tokens from {} \
                 on are held)",
                self.start
            )));
        }
        Ok(self.held.get(from - self.start..).unwrap_or_default())
    }

    /// Generates the deferred part of the prompt (a no-op once nothing is deferred). Errors: `InvalidParam
    /// "prompt_source"` when the source generates other tokens than it did when the prompt was deferred (it
    /// stays deferred).
    pub(crate) fn materialize(&mut self, request: RequestId) -> Result<()> {
        let Some(deferred) = &self.deferred else {
            return Ok(());
        };
        let mut tokens = deferred.generate(request, self.start + self.held.capacity())?;
        let held_prompt = deferred
            .len()
            .saturating_sub(self.start)
            .min(self.held.len());
        if tokens.get(self.start..) != self.held.get(..held_prompt) {
            return Err(deferred.changed(request, tokens.len()));
        }
        tokens.extend_from_slice(&self.held[held_prompt..]);
        self.held = tokens;
        self.start = 0;
        self.deferred = None;
        Ok(())
    }

    /// The held tokens and the position of the first of them.
    pub(crate) fn held_part(&self) -> (&[u32], usize) {
        (&self.held, self.start)
    }

    /// Appends tokens.
    pub(crate) fn extend(&mut self, new_tokens: &[u32]) {
        self.held.extend_from_slice(new_tokens);
    }
}
