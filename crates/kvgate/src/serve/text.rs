//! Text to tokens and back with the real model's tokenizer (SmolLM2's byte-level BPE and ChatML template,
//! from the `llama` crate): a chat is rendered by the template and encoded; output tokens are decoded as
//! they stream, never splitting a character, and watched for stop sequences.

use std::path::Path;

use engine::STOP_TOKEN;
use llama::{ChatMessage, Gguf, Tokenizer};

use super::api::Prompt;
use super::error::ApiError;
use crate::error::{Error, Result};

/// The tokenizer and chat template the server speaks.
#[derive(Debug)]
pub(crate) struct TextCodec {
    tokenizer: Tokenizer,
    vocab: u32,
    /// The model's end-of-turn token, when a real model answers.
    end_of_turn: Option<u32>,
}

impl TextCodec {
    /// The tokenizer of the GGUF model file at `path`. Errors: `Io` when it cannot be read, `Model` when it
    /// is not a model file whose tokenizer this crate builds.
    pub(crate) fn from_model_file(path: &Path) -> Result<TextCodec> {
        let bytes = std::fs::read(path).map_err(|source| Error::ReadFile {
            path: path.display().to_string(),
            source,
        })?;
        let model = |e: llama::LlamaError| Error::ModelFile(format!("{}: {e}", path.display()));
        let gguf = Gguf::parse(&bytes).map_err(model)?;
        let vocab = gguf
            .get_array("tokenizer.ggml.tokens")
            .map_err(model)?
            .len() as u32;
        let tokenizer = Tokenizer::from_gguf(&gguf).map_err(model)?;
        Ok(TextCodec {
            tokenizer,
            vocab,
            end_of_turn: None,
        })
    }

    /// This codec for a real model's answers: `end_of_turn` ends one (and is not shown).
    #[must_use]
    pub(crate) fn ending_at(mut self, end_of_turn: u32) -> TextCodec {
        self.end_of_turn = Some(end_of_turn);
        self
    }

    /// The prompt's token ids: a chat rendered by the template with the generation prompt, text as it is.
    pub(crate) fn encode(&self, prompt: &Prompt) -> Result<Vec<u32>, ApiError> {
        let internal = |e: llama::LlamaError| {
            ApiError::status(
                axum::http::StatusCode::BAD_REQUEST,
                format!("the prompt cannot be tokenized: {e}"),
            )
        };
        match prompt {
            Prompt::Chat(messages) => {
                let messages: Vec<ChatMessage> = messages
                    .iter()
                    .map(|(role, content)| ChatMessage::new(role, content))
                    .collect();
                self.tokenizer.encode_chat(&messages).map_err(internal)
            }
            Prompt::Text(text) => self.tokenizer.encode(text).map_err(internal),
            Prompt::Tokens(ids) => match ids.iter().find(|id| **id >= self.vocab) {
                Some(id) => Err(ApiError::invalid(
                    "prompt",
                    format!("token id {id} is not below the vocabulary's {}", self.vocab),
                )),
                None => Ok(ids.clone()),
            },
        }
    }

    /// Whether `token` ends the answer: the engine's stop token, or a real model's end of turn (the engine
    /// thread stops the request there). The simulated and reference executors' tokens are no language
    /// model's, so with them an id that happens to be `<|im_end|>` ends nothing.
    pub(crate) fn is_stop(&self, token: u32) -> bool {
        token == STOP_TOKEN || Some(token) == self.end_of_turn
    }

    /// The vocabulary id an output token is shown as: the executors other than a real model draw ids from
    /// a wider range (the simulated one below 50 000), so an id beyond the vocabulary wraps around.
    fn shown(&self, token: u32) -> u32 {
        token % self.vocab.max(1)
    }

    fn decode(&self, ids: &[u32]) -> String {
        let shown: Vec<u32> = ids.iter().map(|id| self.shown(*id)).collect();
        self.tokenizer.decode(&shown).unwrap_or_default()
    }
}

/// Output text as tokens come: decodes a window of the last tokens and hands out only complete characters
/// (a byte-level token may end inside one), then cuts the text at the first stop sequence.
#[derive(Debug)]
pub(crate) struct Detokenizer {
    tokens: Vec<u32>,
    /// Start of the window decoded as context for the next piece.
    prefix_offset: usize,
    /// End of the tokens already handed out as text.
    read_offset: usize,
    stops: Vec<String>,
    /// Text handed out or held back for a possible stop sequence.
    text: String,
    /// Bytes of `text` handed out.
    emitted: usize,
    stopped: bool,
}

impl Detokenizer {
    /// A detokenizer watching for `stops`.
    pub(crate) fn new(stops: Vec<String>) -> Detokenizer {
        Detokenizer {
            tokens: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
            stops,
            text: String::new(),
            emitted: 0,
            stopped: false,
        }
    }

    /// Whether a stop sequence appeared (the text ends before it).
    pub(crate) fn stopped(&self) -> bool {
        self.stopped
    }

    /// Output tokens taken so far.
    pub(crate) fn n_tokens(&self) -> usize {
        self.tokens.len()
    }

    /// Takes one output token (not a stop token); returns the text now safe to hand out.
    pub(crate) fn push(&mut self, codec: &TextCodec, token: u32) -> String {
        if self.stopped {
            return String::new();
        }
        self.tokens.push(token);
        let prefix = codec.decode(self.window(self.read_offset));
        let full = codec.decode(self.window(self.tokens.len()));
        if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') {
            if let Some(piece) = full.get(prefix.len()..) {
                self.text.push_str(piece);
            }
            self.prefix_offset = self.read_offset;
            self.read_offset = self.tokens.len();
        }
        self.release(false)
    }

    /// The text held back at the end: tokens that ended inside a character (decoded as they are) and a
    /// partial stop sequence that never completed.
    pub(crate) fn finish(&mut self, codec: &TextCodec) -> String {
        if !self.stopped && self.read_offset < self.tokens.len() {
            let prefix = codec.decode(self.window(self.read_offset));
            let full = codec.decode(self.window(self.tokens.len()));
            if let Some(piece) = full.get(prefix.len()..) {
                self.text.push_str(piece);
            }
            self.read_offset = self.tokens.len();
        }
        self.release(true)
    }

    /// The tokens from the decoding window's start to `end`.
    fn window(&self, end: usize) -> &[u32] {
        self.tokens.get(self.prefix_offset..end).unwrap_or_default()
    }

    /// Hands out what no stop sequence can still claim.
    fn release(&mut self, at_end: bool) -> String {
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|stop| self.text.find(stop.as_str()))
            .min()
        {
            self.stopped = true;
            self.text.truncate(at.max(self.emitted));
            return self.take_to(self.text.len());
        }
        let hold = if at_end {
            0
        } else {
            self.stops
                .iter()
                .map(|stop| stop.len().saturating_sub(1))
                .max()
                .unwrap_or(0)
        };
        let mut end = self.text.len().saturating_sub(hold).max(self.emitted);
        while !self.text.is_char_boundary(end) {
            end -= 1;
        }
        self.take_to(end.max(self.emitted))
    }

    fn take_to(&mut self, end: usize) -> String {
        let piece = self
            .text
            .get(self.emitted..end)
            .unwrap_or_default()
            .to_owned();
        self.emitted = end.max(self.emitted);
        piece
    }
}
