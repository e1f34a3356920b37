//! Errors of loading a model file, building its tokenizer and running it.

use std::path::PathBuf;

/// Why a model file could not be loaded, or a forward pass or a tokenizer call could not run. Each names
/// what is wrong: the offset, key or tensor, and what the file says against what it should.
#[derive(Debug, thiserror::Error)]
pub enum LlamaError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file: the magic is {found:02x?}, not \"GGUF\"")]
    NotGguf { found: Vec<u8> },
    /// A GGUF version this reader does not know (it reads 2 and 3).
    #[error("GGUF version {0} is not supported (2 and 3 are)")]
    Version(u32),
    /// The file ends before a structure it declares.
    #[error("truncated file: {what} at byte {offset} needs {needed} bytes, {available} remain")]
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        available: u64,
    },
    /// A header field is malformed (a bad value type, a string that is not UTF-8, a duplicate key, ...).
    #[error("malformed GGUF header: {0}")]
    Malformed(String),
    /// A metadata key the model needs is missing or of the wrong type.
    #[error("metadata key `{key}`: {problem}")]
    Metadata { key: String, problem: String },
    /// The file holds another architecture than `llama`.
    #[error("architecture `{0}` is not supported (only `llama` is)")]
    Architecture(String),
    /// A tensor's element type is not one this model reads.
    #[error(
        "tensor `{tensor}` has type {type_name} (id {type_id}), which is not supported here ({expected})"
    )]
    Quantization {
        tensor: String,
        type_id: u32,
        type_name: &'static str,
        expected: &'static str,
    },
    /// A tensor is missing, has the wrong shape, or its data lies outside the file or overlaps another's.
    #[error("tensor `{tensor}`: {problem}")]
    Tensor { tensor: String, problem: String },
    /// The hyperparameters are inconsistent (a head count that does not divide, a zero size, ...).
    #[error("invalid hyperparameters: {0}")]
    Hyperparameters(String),
    /// The tokenizer could not be built from the file's vocabulary, or failed on a text.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A forward pass was asked something impossible (a token outside the vocabulary, a position past the
    /// KV store's capacity, an empty entry).
    #[error("forward pass: {0}")]
    Forward(String),
    /// A paged KV store could not read or write its pages (a page table too short, pages too small for the
    /// layout, or the page storage's own error).
    #[error("KV pages: {0}")]
    Pages(String),
}

/// Result of this crate's fallible operations.
pub type LlamaResult<T> = Result<T, LlamaError>;
