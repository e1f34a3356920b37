//! Requests as the facade submits them, their deterministic output tokens, and what a finished request hands
//! back.

use std::sync::Arc;

use kv_pool::{BlockKey, RequestId, Timestamp};

use crate::error::{Error, Result};
use crate::metrics::RequestMetrics;

mod segments;

pub use segments::Segments;

/// A request (one turn of a session) as submitted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestSpec {
    /// Unique among live requests; may be reused after the request finished.
    pub id: RequestId,
    /// Cache salt (tenant): requests with different salts never share pages or checkpoints.
    pub salt: Vec<u8>,
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Output length cap.
    pub max_output_tokens: u32,
    /// Emit the stop token after this many output tokens (an early stop), if set.
    pub stop_after: Option<u32>,
    /// Arrival time; the request is not considered before it.
    pub arrival: Timestamp,
    /// Larger runs first when the engine schedules by priority; ties keep arrival order.
    pub priority: i32,
    /// Whether this is a later turn of a session (for the `later_turns` metrics).
    pub is_later_turn: bool,
    /// A streaming session: when its output is done it pauses holding its pages and resumes on more input
    /// (`Engine::resume`), bypassing the admission gate (Q7).
    pub streaming: bool,
    /// Whether the request's checkpoints carry saved logits (a full-prompt restore then needs only an
    /// isolated logits-only step, Q4).
    pub saved_logits: bool,
    /// Tokens of the prompt's instruction (system prompt) when it has one: the prompt is computed so that a
    /// chunk ends exactly there and a checkpoint of that boundary is published (H7). Between 1 and the
    /// prompt's length minus one.
    pub instruction_tokens: Option<u32>,
}

impl RequestSpec {
    /// A plain request: no salt, arrival at `arrival`, priority 0, not streaming.
    pub fn new(
        id: u64,
        prompt: Vec<u32>,
        max_output_tokens: u32,
        arrival: Timestamp,
    ) -> RequestSpec {
        RequestSpec {
            id: RequestId(id),
            salt: Vec::new(),
            prompt,
            max_output_tokens,
            stop_after: None,
            arrival,
            priority: 0,
            is_later_turn: false,
            streaming: false,
            saved_logits: false,
            instruction_tokens: None,
        }
    }

    /// This request marked as a later turn of a session (`is_later_turn`): the `later_turns` metrics count
    /// it, and a store miss counts as its restore fallback (a first turn has nothing to restore). The engine
    /// cannot tell a later turn from a new request sharing a prefix, so the caller says.
    pub fn later_turn(mut self) -> RequestSpec {
        self.is_later_turn = true;
        self
    }

    /// This request with its prompt's block keys computed for blocks of `block_tokens` tokens (the engine's
    /// `Geometry::block_tokens`), for [`Engine::submit_keyed`](crate::Engine::submit_keyed). Hashing a long
    /// prompt is most of a submit's cost; a caller that builds requests ahead, on another thread, pays it
    /// there (the trace replay does). The prompt also gets room for its output (up to its own length again),
    /// so the engine's first output token does not copy it.
    pub fn keyed(mut self, block_tokens: u32) -> KeyedRequest {
        self.prompt.reserve_exact(self.output_room());
        self.keyed_as_is(block_tokens)
    }

    /// The room `keyed` makes for the output: up to the prompt's own length again.
    fn output_room(&self) -> usize {
        (self.max_output_tokens as usize).min(self.prompt.len())
    }

    /// The keys of the prompt's full blocks (with room for the output's): `keyed` without touching the prompt.
    fn keyed_as_is(self, block_tokens: u32) -> KeyedRequest {
        let mut keys = Vec::new();
        if block_tokens > 0 {
            let block_tokens = block_tokens as usize;
            keys.reserve_exact((self.prompt.len() + self.output_room()) / block_tokens);
            BlockKey::extend_chain(&mut keys, &self.prompt, block_tokens, &self.salt);
        }
        KeyedRequest {
            spec: self,
            block_tokens,
            keys,
            deferred: None,
        }
    }

    /// [`RequestSpec::keyed`] for the prompt `source` generates, which the request then holds as `source`
    /// instead of its tokens: it costs its block keys, its prompt's last few tokens and what `source` holds,
    /// not four bytes a token. An engine that reads whole prompts (an executor that reads tokens, a hybrid
    /// model) generates it again at submit; otherwise only a restore into it that is verified does, and the
    /// simulated executor on one full-attention group without verification never does. `source` must generate
    /// the same tokens every time: the engine checks a fingerprint of what it generates later. A source whose
    /// segments key the prompt's blocks ([`PromptSource::segments`]) is not generated here at all but for its
    /// last tokens (its keys come from the segments), and what it generates later is checked against those
    /// and its length. Errors: `InvalidParam "prompt"` when the spec has a prompt of its own (a source or
    /// tokens, not both); `InvalidParam "prompt_source"` when a source with segments generates other than its
    /// segments' length.
    pub fn keyed_from_source(
        self,
        block_tokens: u32,
        source: Arc<dyn PromptSource>,
    ) -> Result<KeyedRequest> {
        self.keyed_from_source_in(block_tokens, source, &mut Vec::new())
    }

    /// [`RequestSpec::keyed_from_source`], generating the prompt into `scratch` (cleared first), which gets the
    /// buffer back afterwards: a caller that keys many requests reuses one buffer instead of allocating a
    /// prompt's worth of memory for each. Errors as `keyed_from_source`.
    pub fn keyed_from_source_in(
        mut self,
        block_tokens: u32,
        source: Arc<dyn PromptSource>,
        scratch: &mut Vec<u32>,
    ) -> Result<KeyedRequest> {
        if !self.prompt.is_empty() {
            return Err(Error::InvalidParam {
                name: "prompt",
                reason: format!(
                    "{} has {} prompt tokens and a prompt source; give one or the other",
                    self.id,
                    self.prompt.len()
                ),
            });
        }
        if let Some(segments) = source.segments()
            && segments.key_blocks_of(block_tokens)
        {
            return self.keyed_by_segments(block_tokens, &source, segments);
        }
        scratch.clear();
        source.generate(scratch);
        std::mem::swap(&mut self.prompt, scratch);
        // The prompt goes back to `scratch` once keyed, so it gets no room for the output: the deferred tail
        // gets its own.
        let mut keyed = self.keyed_as_is(block_tokens);
        *scratch = keyed.defer(source);
        Ok(keyed)
    }

    /// `keyed_from_source` for a source whose `segments` key blocks of `block_tokens`: keys from the segments,
    /// and only the tokens the request holds (from `DeferredPrompt::tail_start` on) generated.
    fn keyed_by_segments(
        self,
        block_tokens: u32,
        source: &Arc<dyn PromptSource>,
        segments: Segments<'_>,
    ) -> Result<KeyedRequest> {
        let len = segments.len;
        let room = (self.max_output_tokens as usize).min(len);
        let mut keys = Vec::with_capacity((len + room) / block_tokens as usize);
        segments.extend_keys(&mut keys, block_tokens, &self.salt);
        let tail_start = tail_start(keys.len() * block_tokens as usize, len);
        let mut tail = Vec::with_capacity(len - tail_start + room);
        source.generate_from(tail_start, &mut tail);
        if tail_start + tail.len() != len {
            return Err(Error::InvalidParam {
                name: "prompt_source",
                reason: format!(
                    "{}: the prompt source's segments give {len} tokens but it generated {} from token \
                     {tail_start} on",
                    self.id,
                    tail.len()
                ),
            });
        }
        Ok(KeyedRequest {
            spec: self,
            block_tokens,
            keys,
            deferred: Some(DeferredPrompt {
                source: SourcedPrompt {
                    len,
                    fingerprint: None,
                    source: Arc::clone(source),
                },
                tail_start,
                tail,
            }),
        })
    }
}

/// Where a deferred prompt of `len` tokens whose full blocks end at `keyed` starts holding its tokens: the
/// partial last block (the first output block's key hashes it) and the tokens an output token is a function
/// of.
fn tail_start(keyed: usize, len: usize) -> usize {
    keyed.min(len.saturating_sub(OUTPUT_TOKEN_TAIL)).min(len)
}

/// A request with its prompt's block keys ([`RequestSpec::keyed`], [`RequestSpec::keyed_from_source`]). The
/// keys were computed from the spec's own prompt and salt, and neither can change afterwards, so they always
/// match them; the engine refuses a keyed request whose block size is not its own.
#[derive(Clone, Debug)]
pub struct KeyedRequest {
    spec: RequestSpec,
    block_tokens: u32,
    keys: Vec<BlockKey>,
    deferred: Option<DeferredPrompt>,
}

impl KeyedRequest {
    /// The request (its prompt empty when it is held as a source: [`KeyedRequest::prompt_len`] is its length).
    pub fn spec(&self) -> &RequestSpec {
        &self.spec
    }

    /// Tokens per block its keys were computed for.
    pub fn block_tokens(&self) -> u32 {
        self.block_tokens
    }

    /// Keys of the prompt's full blocks.
    pub fn keys(&self) -> &[BlockKey] {
        &self.keys
    }

    /// Tokens in the prompt, held or deferred.
    pub fn prompt_len(&self) -> usize {
        self.deferred
            .as_ref()
            .map_or(self.spec.prompt.len(), |deferred| deferred.source.len())
    }

    /// Makes this request hold `source` instead of its prompt's tokens (`RequestSpec::keyed_from_source`);
    /// returns the prompt it held.
    fn defer(&mut self, source: Arc<dyn PromptSource>) -> Vec<u32> {
        // The room `keyed` makes for the output (the generated prompt's own capacity may be larger).
        let room = self.spec.output_room();
        let prompt = std::mem::take(&mut self.spec.prompt);
        let tail_start = tail_start(self.keys.len() * self.block_tokens as usize, prompt.len());
        let mut tail = Vec::with_capacity(prompt.len() - tail_start + room);
        tail.extend_from_slice(&prompt[tail_start..]);
        self.deferred = Some(DeferredPrompt {
            source: SourcedPrompt {
                len: prompt.len(),
                fingerprint: Some(fingerprint(&prompt)),
                source,
            },
            tail_start,
            tail,
        });
        prompt
    }

    /// The request, the keys of its prompt's full blocks, and its deferred prompt if it has one.
    pub(crate) fn into_parts(self) -> (RequestSpec, Vec<BlockKey>, Option<DeferredPrompt>) {
        (self.spec, self.keys, self.deferred)
    }
}

/// A prompt its caller can generate again, exactly, on demand: a trace request's prompt from its hash ids.
/// [`RequestSpec::keyed_from_source`] hands one to the engine instead of the tokens.
pub trait PromptSource: Send + Sync + std::fmt::Debug {
    /// Appends the prompt's tokens to `out`: the same tokens on every call.
    fn generate(&self, out: &mut Vec<u32>);

    /// Appends the prompt's tokens from position `start` on to `out` (none when `start` is past its end): what
    /// `generate` appends after its first `start`. The default generates the whole prompt and copies the end.
    fn generate_from(&self, start: usize, out: &mut Vec<u32>) {
        let mut all = Vec::new();
        self.generate(&mut all);
        out.extend_from_slice(all.get(start..).unwrap_or_default());
    }

    /// The prompt as segments, when each segment's tokens are a function of its id and the offset in it
    /// alone (a trace request's hash ids): its blocks are then keyed one segment at a time
    /// ([`BlockKey::extend_segment`]), one hash a segment instead of one a block. `None` (the default) when
    /// the prompt has no such structure. A source whose tokens do not follow the segments it gives gets keys
    /// that name other prompts.
    fn segments(&self) -> Option<Segments<'_>> {
        None
    }
}

/// A prompt held as its source: the source, and its tokens from `tail_start` on (held, with the room the
/// prompt had for its output).
#[derive(Clone, Debug)]
pub(crate) struct DeferredPrompt {
    pub(crate) source: SourcedPrompt,
    pub(crate) tail_start: usize,
    pub(crate) tail: Vec<u32>,
}

/// A prompt's source, with the length and fingerprint of the tokens it generated first (no fingerprint when
/// it was keyed by its segments and never generated whole: its held tokens are then the check).
#[derive(Clone, Debug)]
pub(crate) struct SourcedPrompt {
    source: Arc<dyn PromptSource>,
    len: usize,
    fingerprint: Option<u64>,
}

impl SourcedPrompt {
    /// The prompt's length.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The prompt generated again, into a vector of `capacity`. Errors: `changed` when the source generates
    /// other tokens than it did first.
    pub(crate) fn generate(&self, request: RequestId, capacity: usize) -> Result<Vec<u32>> {
        let mut tokens = Vec::with_capacity(capacity);
        self.source.generate(&mut tokens);
        if tokens.len() != self.len
            || self
                .fingerprint
                .is_some_and(|first| first != fingerprint(&tokens))
        {
            return Err(self.changed(request, tokens.len()));
        }
        Ok(tokens)
    }

    /// `InvalidParam "prompt_source"`: the source generated `n_generated` tokens that are not those it generated
    /// first.
    pub(crate) fn changed(&self, request: RequestId, n_generated: usize) -> Error {
        Error::InvalidParam {
            name: "prompt_source",
            reason: format!(
                "{request}: the prompt source generated {n_generated} tokens that are not the {} it generated when \
                 the prompt was deferred; a source must generate the same tokens on every call",
                self.len
            ),
        }
    }
}

/// How many of the prompt's last tokens an output token is a function of ([`output_token`]).
pub(crate) const OUTPUT_TOKEN_TAIL: usize = 8;

/// A fixed-seed 64-bit hash of `tokens` (foldhash; not keyed per process, so a deferred prompt's
/// fingerprint means the same thing on every thread).
fn fingerprint(tokens: &[u32]) -> u64 {
    use std::hash::BuildHasher;
    foldhash::fast::FixedState::with_seed(0x6b76_6761_7465).hash_one(tokens)
}

/// The stop token the simulated model emits when a request stops early.
pub const STOP_TOKEN: u32 = u32::MAX;

/// The output token a request with this salt and prompt produces at output position `index`: a deterministic
/// function of the request's content (not its id), so a workload can build the next turn's prompt (previous
/// prompt + response + new input) and share the prefix.
pub fn output_token(salt: &[u8], prompt: &[u32], index: u32) -> u32 {
    let tail = &prompt[prompt.len().saturating_sub(OUTPUT_TOKEN_TAIL)..];
    output_token_at(output_token_state(salt, prompt.len(), tail), index)
}

/// What [`output_token`] computes of the salt, the prompt's length and its last `OUTPUT_TOKEN_TAIL` tokens
/// (all of them when it is shorter), all it depends on besides the index: the same for every output token of
/// a request.
pub(crate) fn output_token_state(salt: &[u8], prompt_len: usize, tail: &[u32]) -> u64 {
    // FNV-1a over the salt and the last few prompt tokens, then (`output_token_at`) the index: cheap and
    // stable.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in salt
        .iter()
        .copied()
        .chain((prompt_len as u32).to_le_bytes())
    {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    for token in tail {
        hash = (hash ^ u64::from(*token)).wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// The output token at `index` from its request's [`output_token_state`].
pub(crate) fn output_token_at(state: u64, index: u32) -> u32 {
    let hash = (state ^ u64::from(index)).wrapping_mul(0x0100_0000_01b3);
    (hash % 50_000) as u32
}

/// What the engine hands back for a finished or cancelled request.
#[derive(Clone, Debug, PartialEq)]
pub struct FinishedRequest {
    /// The request.
    pub id: RequestId,
    /// Output tokens produced (ending with [`STOP_TOKEN`] when it stopped early).
    pub output: Vec<u32>,
    /// Whether it was cancelled.
    pub cancelled: bool,
    /// Its metrics.
    pub metrics: RequestMetrics,
}
