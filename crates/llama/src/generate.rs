//! Greedy generation: a prompt prefilled in chunks, then one token at a time until the end of the turn.

use crate::error::{LlamaError, LlamaResult};
use crate::kernels::argmax;
use crate::kv::KvStore;
use crate::model::{Entry, Llama};

/// What a greedy generation produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Generation {
    /// The generated tokens, the stopping token included when it came.
    pub tokens: Vec<u32>,
    /// Whether generation stopped at a token `stop` accepted (else it ran out of `max_new`).
    pub stopped: bool,
}

/// Prefills `prompt` after what `kv` holds, in passes of at most `chunk` tokens, then appends greedy
/// tokens (the largest logit, ties to the lowest id) until `stop` accepts one or `max_new` are made. Each
/// generated token but the last is fed back, so `kv` ends holding the prompt and all but the last token.
/// Errors: `Forward` for an empty prompt or a zero chunk, and those of [`Llama::forward`].
pub fn generate_greedy(
    model: &Llama,
    kv: &mut dyn KvStore,
    prompt: &[u32],
    chunk: usize,
    max_new: usize,
    stop: &dyn Fn(u32) -> bool,
) -> LlamaResult<Generation> {
    if prompt.is_empty() || chunk == 0 {
        return Err(LlamaError::Forward(
            "a generation needs a prompt and a chunk of at least one token".into(),
        ));
    }
    let mut logits = Vec::new();
    let chunks: Vec<&[u32]> = prompt.chunks(chunk).collect();
    for (idx, tokens) in chunks.iter().enumerate() {
        let want_logits = idx + 1 == chunks.len();
        let mut batch = [Entry {
            tokens,
            kv: &mut *kv,
            want_logits,
        }];
        if let Some(l) = model.forward(&mut batch)?.pop().flatten() {
            logits = l;
        }
    }
    let mut out = Generation {
        tokens: Vec::new(),
        stopped: false,
    };
    while out.tokens.len() < max_new {
        let next = argmax(&logits).ok_or_else(|| LlamaError::Forward("no logits".into()))?;
        out.tokens.push(next);
        if stop(next) {
            out.stopped = true;
            break;
        }
        if out.tokens.len() == max_new {
            break;
        }
        let mut batch = [Entry {
            tokens: &[next],
            kv: &mut *kv,
            want_logits: true,
        }];
        logits = model
            .forward(&mut batch)?
            .pop()
            .flatten()
            .ok_or_else(|| LlamaError::Forward("no logits".into()))?;
    }
    Ok(out)
}
