//! A real model for the engine: SmolLM2-135M-Instruct (Llama architecture, Q4_1 weights in GGUF), with its
//! own tokenizer and chat template, checked against llama.cpp on the same file (`docs/model.md`).
//!
//! - [`Gguf`]: the container, read with every stated size checked against the file (hostile files are
//!   errors, never panics or allocations of the size they claim).
//! - [`Llama`]: hyperparameters from the file, Q4_1 and Q8_0 weights, the forward pass (RMSNorm, rotary
//!   attention with grouped KV heads, SwiGLU, tied embeddings) batched over sequences and parallel with
//!   rayon.
//! - [`KvStore`]: where a sequence's keys and values live; [`ContiguousKv`] is one buffer per layer, and a
//!   page-table store implements the same trait: [`PagedKv`], a sequence's pages in the engine's pool
//!   through a [`PageAccess`], in a [`PageLayout`].
//! - [`Tokenizer`]: the file's GPT-2 byte-level BPE and its ChatML template.
//!
//! **Batch invariance.** Every value a token produces (its keys, values and logits) is computed by one
//! fixed sequence of operations that depends only on the weights, the token and its sequence's earlier
//! positions: matrix products quantize each activation row on its own and sum each output over its own
//! row's blocks in order; attention visits positions in order; rayon splits rows, tokens and heads, never a
//! sum. So the bits of every KV entry and logit do not depend on batch composition, on how a prompt is split
//! into passes, or on the thread count. The rotary angles use the platform's `sin` and `cos`, so the
//! guarantee holds on one machine.

mod error;
mod generate;
mod gguf;
mod kernels;
mod kv;
mod model;
mod model_file;
mod paged;
mod quant;
mod tokenizer;

pub use error::{LlamaError, LlamaResult};
pub use generate::{Generation, generate_greedy};
pub use gguf::{Gguf, Value};
pub use kernels::argmax;
pub use kv::{ContiguousKv, KvStore};
pub use model::{Entry, Llama, LlamaConfig};
pub use model_file::{
    MODEL_DIR_ENV, MODEL_FILE, MODEL_SHA256, REQUIRE_MODEL_ENV, cached_model, model_dir,
};
pub use paged::{PageAccess, PageLayout, PagedKv};
pub use tokenizer::{ChatMessage, Tokenizer};
