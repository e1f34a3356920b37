//! A live request's tokens: held, or deferred to a [`PromptSource`](crate::PromptSource) while the request
//! waits (a waiting request then costs its keys, not four bytes a token) and generated when first needed.

use kv_pool::RequestId;

use crate::error::{Error, Result};
use crate::request::{DeferredPrompt, fingerprint};

/// Prompt, then output tokens (and streamed inputs appended on resume). While deferred it holds only its
/// length: reading the tokens is an internal error until [`Tokens::materialize`] generated them, so a path
/// that reads a deferred prompt fails loudly instead of seeing none.
#[derive(Debug)]
pub(crate) struct Tokens {
    held: Vec<u32>,
    deferred: Option<DeferredPrompt>,
}

impl Tokens {
    /// Tokens held from the start.
    pub(crate) fn held(tokens: Vec<u32>) -> Tokens {
        Tokens {
            held: tokens,
            deferred: None,
        }
    }

    /// A prompt held as its source until [`Tokens::materialize`].
    pub(crate) fn deferred(prompt: DeferredPrompt) -> Tokens {
        Tokens {
            held: Vec::new(),
            deferred: Some(prompt),
        }
    }

    /// Number of tokens, held or deferred.
    pub(crate) fn len(&self) -> usize {
        self.deferred
            .as_ref()
            .map_or(self.held.len(), |deferred| deferred.len as usize)
    }

    /// Whether the tokens are still deferred.
    pub(crate) fn is_deferred(&self) -> bool {
        self.deferred.is_some()
    }

    /// The tokens; an internal error while they are deferred.
    pub(crate) fn get(&self, id: RequestId) -> Result<&[u32]> {
        if self.deferred.is_some() {
            return Err(Error::internal(format!(
                "{id}: its deferred prompt was read before it was generated"
            )));
        }
        Ok(&self.held)
    }

    /// Generates a deferred prompt (a no-op once held). Errors: `InvalidParam "prompt_source"` when the
    /// source generates other tokens than it did when the prompt was deferred (it stays deferred).
    pub(crate) fn materialize(&mut self, id: RequestId) -> Result<()> {
        let Some(deferred) = &self.deferred else {
            return Ok(());
        };
        let mut tokens = Vec::with_capacity(deferred.len as usize + deferred.room as usize);
        deferred.source.generate(&mut tokens);
        if tokens.len() != deferred.len as usize || fingerprint(&tokens) != deferred.fingerprint {
            return Err(Error::InvalidParam {
                name: "prompt_source",
                reason: format!(
                    "{id}: the prompt source generated {} tokens that are not the {} it generated when the \
                     prompt was deferred; a source must generate the same tokens on every call",
                    tokens.len(),
                    deferred.len
                ),
            });
        }
        self.held = tokens;
        self.deferred = None;
        Ok(())
    }

    /// Appends tokens (generating a deferred prompt first).
    pub(crate) fn extend(&mut self, id: RequestId, new_tokens: &[u32]) -> Result<&[u32]> {
        self.materialize(id)?;
        self.held.extend_from_slice(new_tokens);
        Ok(&self.held)
    }
}
