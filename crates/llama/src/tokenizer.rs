//! The model's tokenizer, built from the GGUF's own vocabulary and merges (`tokenizer.ggml.*`: the GPT-2
//! byte-level BPE it declares) with the `tokenizers` crate, and its ChatML chat template.
//!
//! Pre-tokenization is SmolLM's (llama.cpp's `smollm` pre-tokenizer, Hugging Face's `tokenizer.json`):
//! every digit alone, then the GPT-2 split regex, then the byte-to-character map. Control tokens (type 3,
//! such as `<|im_start|>`) are special: [`Tokenizer::encode_chat`] and [`Tokenizer::encode_with_special`]
//! recognise them in text, [`Tokenizer::encode`] treats them as plain text.

use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{AddedToken, PreTokenizerWrapper};

use crate::error::{LlamaError, LlamaResult};
use crate::gguf::{Gguf, Value};

/// GGUF token type of a control token.
const TOKEN_TYPE_CONTROL: u64 = 3;
/// GGUF token type of a user-defined token.
const TOKEN_TYPE_USER_DEFINED: u64 = 4;
/// The end-of-turn token of ChatML.
const END_OF_TURN: &str = "<|im_end|>";
/// The start-of-turn token of ChatML.
const START_OF_TURN: &str = "<|im_start|>";

/// One message of a chat: its role (`system`, `user`, `assistant`) and text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    /// A message of `role` saying `content`.
    pub fn new(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.to_string(),
            content: content.to_string(),
        }
    }
}

/// The tokenizer and chat template of a model file.
#[derive(Debug)]
pub struct Tokenizer {
    /// Control tokens recognised in text.
    special: tokenizers::Tokenizer,
    /// Control tokens encoded as the text they are.
    plain: tokenizers::Tokenizer,
    end_of_turn: u32,
    eos: Option<u32>,
    /// The system prompt the template inserts when the chat does not start with one.
    default_system: Option<String>,
}

impl Tokenizer {
    /// Builds the tokenizer of `gguf`. Errors: `Metadata` for a missing or mistyped key; `Tokenizer` for a
    /// model other than `gpt2`, a malformed merge, a vocabulary without `<|im_end|>`, a chat template that
    /// is not ChatML, or the `tokenizers` crate refusing the vocabulary.
    pub fn from_gguf(gguf: &Gguf) -> LlamaResult<Tokenizer> {
        let model = gguf.get_str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(LlamaError::Tokenizer(format!(
                "tokenizer model `{model}` is not supported (only GPT-2 byte-level BPE, `gpt2`)"
            )));
        }
        let tokens = strings(gguf, "tokenizer.ggml.tokens")?;
        let types = gguf.get_array("tokenizer.ggml.token_type")?;
        if types.len() != tokens.len() {
            return Err(LlamaError::Metadata {
                key: "tokenizer.ggml.token_type".into(),
                problem: format!("{} types for {} tokens", types.len(), tokens.len()),
            });
        }
        let merges = strings(gguf, "tokenizer.ggml.merges")?
            .into_iter()
            .map(|merge| {
                merge
                    .split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .ok_or_else(|| {
                        LlamaError::Tokenizer(format!("merge `{merge}` is not two tokens"))
                    })
            })
            .collect::<LlamaResult<Vec<_>>>()?;
        let vocab: Vocab = tokens
            .iter()
            .enumerate()
            .map(|(id, t)| (t.to_string(), id as u32))
            .collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| LlamaError::Tokenizer(format!("BPE from the file's vocabulary: {e}")))?;
        let mut special = tokenizers::Tokenizer::new(bpe);
        let pre: Vec<PreTokenizerWrapper> = vec![
            Digits::new(true).into(),
            ByteLevel::new(false, true, true).into(),
        ];
        special.with_pre_tokenizer(Some(Sequence::new(pre)));
        special.with_decoder(Some(ByteLevel::default()));
        let specials: Vec<AddedToken> = tokens
            .iter()
            .zip(types)
            .filter(|(_, ty)| {
                matches!(
                    ty.as_u64(),
                    Some(TOKEN_TYPE_CONTROL | TOKEN_TYPE_USER_DEFINED)
                )
            })
            .map(|(t, _)| AddedToken::from(t.to_string(), true))
            .collect();
        special.add_special_tokens(&specials);
        let mut plain = special.clone();
        plain.set_encode_special_tokens(true);
        let end_of_turn = tokens
            .iter()
            .position(|t| *t == END_OF_TURN)
            .ok_or_else(|| LlamaError::Tokenizer(format!("no `{END_OF_TURN}` token")))?
            as u32;
        let eos = match gguf.metadata.get("tokenizer.ggml.eos_token_id") {
            Some(_) => Some(gguf.get_u64("tokenizer.ggml.eos_token_id")? as u32),
            None => None,
        };
        let default_system = chat_template_system(gguf.get_str("tokenizer.chat_template")?)?;
        Ok(Tokenizer {
            special,
            plain,
            end_of_turn,
            eos,
            default_system,
        })
    }

    /// The token ids of `text`, control tokens' text encoded as plain text (no token added).
    pub fn encode(&self, text: &str) -> LlamaResult<Vec<u32>> {
        encode(&self.plain, text)
    }

    /// The token ids of `text`, control tokens (`<|im_start|>`, ...) recognised as such.
    pub fn encode_with_special(&self, text: &str) -> LlamaResult<Vec<u32>> {
        encode(&self.special, text)
    }

    /// The text of `ids`, control tokens included as their text.
    pub fn decode(&self, ids: &[u32]) -> LlamaResult<String> {
        self.special
            .decode(ids, false)
            .map_err(|e| LlamaError::Tokenizer(format!("decoding {} ids: {e}", ids.len())))
    }

    /// `messages` rendered by the file's ChatML template: the template's system prompt first when the chat
    /// does not start with one, each message as `<|im_start|>{role}\n{content}<|im_end|>\n`, then
    /// `<|im_start|>assistant\n` when `add_generation_prompt`.
    pub fn render_chat(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> String {
        let mut out = String::new();
        if let Some(system) = &self.default_system
            && messages.first().is_some_and(|m| m.role != "system")
        {
            out.push_str(&format!("{START_OF_TURN}system\n{system}{END_OF_TURN}\n"));
        }
        for m in messages {
            out.push_str(&format!(
                "{START_OF_TURN}{}\n{}{END_OF_TURN}\n",
                m.role, m.content
            ));
        }
        if add_generation_prompt {
            out.push_str(&format!("{START_OF_TURN}assistant\n"));
        }
        out
    }

    /// The token ids of `messages` rendered with the generation prompt, ready for the model's answer.
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> LlamaResult<Vec<u32>> {
        self.encode_with_special(&self.render_chat(messages, true))
    }

    /// Whether `token` ends the model's turn (`<|im_end|>`, or the file's end-of-sequence token).
    pub fn is_end_of_turn(&self, token: u32) -> bool {
        token == self.end_of_turn || Some(token) == self.eos
    }

    /// The `<|im_end|>` token.
    pub fn end_of_turn(&self) -> u32 {
        self.end_of_turn
    }
}

fn encode(tokenizer: &tokenizers::Tokenizer, text: &str) -> LlamaResult<Vec<u32>> {
    tokenizer
        .encode(text, false)
        .map(|e| e.get_ids().to_vec())
        .map_err(|e| LlamaError::Tokenizer(format!("encoding {} bytes: {e}", text.len())))
}

/// The strings of array `key`.
fn strings<'a>(gguf: &'a Gguf, key: &str) -> LlamaResult<Vec<&'a str>> {
    gguf.get_array(key)?
        .iter()
        .enumerate()
        .map(|(idx, v)| match v {
            Value::String(s) => Ok(s.as_str()),
            _ => Err(LlamaError::Metadata {
                key: key.into(),
                problem: format!("element {idx} is not a string"),
            }),
        })
        .collect()
}

/// Checks that `template` is ChatML (each message as `'<|im_start|>' + message['role'] + '\n' +
/// message['content'] + '<|im_end|>'`, the generation prompt `<|im_start|>assistant\n`) and returns the
/// system prompt it inserts when the chat has none. The template is Jinja; rather than a Jinja engine, this
/// recognises the one family of templates the renderer implements and refuses the rest.
fn chat_template_system(template: &str) -> LlamaResult<Option<String>> {
    let message = "'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>'";
    let generation = "'<|im_start|>assistant\n'";
    if !template.contains(message) || !template.contains(generation) {
        return Err(LlamaError::Tokenizer(format!(
            "the chat template is not ChatML: {:?}",
            template.chars().take(200).collect::<String>()
        )));
    }
    let marker = "{{ '<|im_start|>system\n";
    Ok(template.find(marker).and_then(|start| {
        let rest = &template[start + marker.len()..];
        rest.find(END_OF_TURN).map(|end| rest[..end].to_string())
    }))
}
