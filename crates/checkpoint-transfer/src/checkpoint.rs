//! What a checkpoint is to this crate: its id, its manifest metadata (`CheckpointMeta`: boundary, kind,
//! generation, block keys of its token prefix, the layout and the pages it holds) and its page payload
//! (`CheckpointPayload`: bytes per rank and page). These are the serde types of the system.

use std::sync::Arc;

use kv_pool::BlockKey;
use serde::{Deserialize, Serialize};

use crate::error::{Invalid, Mismatch};
use kv_pool::GroupKind;

use crate::layout::{LayoutDescriptor, groups_to_string};
use crate::page_buf::RankPages;

/// Longest checkpoint id accepted, in bytes (hex-encoded file names must stay under 255 bytes).
pub(crate) const CHECKPOINT_ID_BYTES_MAX: usize = 100;

/// Names a checkpoint in a store (for example a session id plus a turn). Any printable text; the disk store
/// encodes it, so an id can never name a path outside the store's directory. Shared text: a store's indexes
/// each hold the id, and a clone costs a reference count, not an allocation.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CheckpointId(Arc<str>);

/// Serialized as its text, as a `String` is (manifests written before the id was shared read the same).
impl Serialize for CheckpointId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for CheckpointId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(|id| Self(id.into()))
    }
}

impl CheckpointId {
    /// A validated id: non-empty, at most `CHECKPOINT_ID_BYTES_MAX` bytes, no control characters.
    pub fn new(id: impl Into<String>) -> Result<Self, Invalid> {
        let id = id.into();
        let reason = if id.is_empty() {
            Some("it is empty")
        } else if id.len() > CHECKPOINT_ID_BYTES_MAX {
            Some("it is longer than 100 bytes")
        } else if id.chars().any(char::is_control) {
            Some("it contains control characters")
        } else {
            None
        };
        match reason {
            Some(reason) => Err(Invalid::CheckpointId { id, reason }),
            None => Ok(Self(id.into())),
        }
    }

    /// The id an engine gives the checkpoint of a prompt's first `n_tokens` tokens whose last block key is
    /// `key`: the key's first 12 bytes in hex, a dash and `n_tokens`. Valid by construction (at most 45 bytes
    /// of `[0-9a-f-]`), and built without a formatter call per byte: every capture makes one.
    pub fn of_prefix(key: &BlockKey, n_tokens: usize) -> Self {
        let digits = n_tokens.to_string();
        let mut id = String::with_capacity(2 * PREFIX_ID_KEY_BYTES + 1 + digits.len());
        push_hex(&mut id, &key.0[..PREFIX_ID_KEY_BYTES]);
        id.push('-');
        id.push_str(&digits);
        Self(id.into())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Bytes of a block key that name a prefix's checkpoint (`CheckpointId::of_prefix`).
const PREFIX_ID_KEY_BYTES: usize = 12;

/// Appends `bytes` to `out` in lower-case hex, two digits a byte.
pub(crate) fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for &byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
}

impl std::fmt::Display for CheckpointId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// Which point of a request a checkpoint was taken at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CheckpointKind {
    /// End of the system instruction.
    Instruction,
    /// End of the prompt.
    Prompt,
    /// End of the response.
    Response,
    /// The tail of a prefill chunk.
    PrefillTail,
    /// What a running request had computed when it was preempted (offloaded instead of recomputed).
    Preemption,
}

/// One page of a checkpoint: the cache group it belongs to and, for pages that are prefix-cache blocks, the
/// index of its block key in `CheckpointMeta::block_keys`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PageSlot {
    /// Index of the cache group in the layout.
    pub group: u32,
    /// Index into `block_keys` for a page registered in the prefix cache at publication; `None` for pages
    /// handed to the consumer directly (recurrent state, auxiliary, a partial last page).
    pub key_idx: Option<u32>,
}

impl PageSlot {
    /// The pages of one full-attention group (group 0) holding `n_tokens` tokens: every full page is keyed
    /// by its block, a trailing partial page is not.
    pub(crate) fn full_attention(n_tokens: usize, tokens_per_page: usize) -> Vec<PageSlot> {
        let n_full = n_tokens / tokens_per_page;
        let n_pages = n_tokens.div_ceil(tokens_per_page);
        (0..n_pages)
            .map(|page_idx| PageSlot {
                group: 0,
                key_idx: (page_idx < n_full).then_some(page_idx as u32),
            })
            .collect()
    }
}

/// The manifest data of a checkpoint: everything but the page bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointMeta {
    /// Store id.
    pub id: CheckpointId,
    /// Generation: a newer capture of the same id supersedes an older one.
    pub generation: u64,
    /// Where in the request it was taken.
    pub kind: CheckpointKind,
    /// Token boundary `n`.
    pub n_tokens: usize,
    /// Tokens of the draft model's prefix, `<= n_tokens`.
    pub draft_prefix_len: usize,
    /// Block keys of the full blocks of `tokens[..n_tokens]`.
    #[serde(with = "block_keys_serde")]
    pub block_keys: Vec<BlockKey>,
    /// The tokens after the last full block (a partial last page), so a prefix match is exact.
    pub tail_tokens: Vec<u32>,
    /// The layout it was written for.
    pub layout: LayoutDescriptor,
    /// Its pages, in payload order.
    pub pages: Vec<PageSlot>,
}

/// Query for a checkpoint whose token prefix is a prefix of a request: the request's full-block keys and
/// its tokens (for the partial tail).
#[derive(Clone, Copy, Debug)]
pub struct PrefixQuery<'a> {
    /// Keys of the request's full blocks (`BlockKey::chain_all`).
    pub block_keys: &'a [BlockKey],
    /// The request's tokens.
    pub tokens: &'a [u32],
}

impl CheckpointMeta {
    /// Metadata for a checkpoint of `tokens` (its whole length is the boundary) with one full-attention
    /// group: block keys from `salt`, one keyed page per full block and an unkeyed partial tail page.
    pub fn full_attention(
        id: CheckpointId,
        generation: u64,
        kind: CheckpointKind,
        tokens: &[u32],
        salt: &[u8],
        layout: LayoutDescriptor,
    ) -> Self {
        let block_keys = BlockKey::chain_all(tokens, layout.tokens_per_page as usize, salt);
        Self::full_attention_keyed(id, generation, kind, tokens, block_keys, layout)
    }

    /// As [`CheckpointMeta::full_attention`], with the block keys of `tokens`' full blocks already computed
    /// (an engine keeps them per request; hashing them again dominated a capture's cost).
    pub(crate) fn full_attention_keyed(
        id: CheckpointId,
        generation: u64,
        kind: CheckpointKind,
        tokens: &[u32],
        block_keys: Vec<BlockKey>,
        layout: LayoutDescriptor,
    ) -> Self {
        let tokens_per_page = layout.tokens_per_page as usize;
        debug_assert_eq!(
            block_keys.len(),
            tokens.len() / tokens_per_page,
            "one key per full block"
        );
        let tail_tokens = tokens[block_keys.len() * tokens_per_page..].to_vec();
        Self::full_attention_parts(id, generation, kind, block_keys, tail_tokens, layout)
    }

    /// As [`CheckpointMeta::full_attention_keyed`] for a boundary at the end of the last of `block_keys`'
    /// blocks (no partial tail), which needs no token: `block_keys.len()` blocks of the layout's tokens per
    /// page.
    pub fn full_attention_blocks(
        id: CheckpointId,
        generation: u64,
        kind: CheckpointKind,
        block_keys: Vec<BlockKey>,
        layout: LayoutDescriptor,
    ) -> Self {
        Self::full_attention_parts(id, generation, kind, block_keys, Vec::new(), layout)
    }

    /// A full-attention checkpoint of `block_keys`' blocks followed by `tail_tokens`.
    fn full_attention_parts(
        id: CheckpointId,
        generation: u64,
        kind: CheckpointKind,
        block_keys: Vec<BlockKey>,
        tail_tokens: Vec<u32>,
        layout: LayoutDescriptor,
    ) -> Self {
        let tokens_per_page = layout.tokens_per_page as usize;
        let n_tokens = block_keys.len() * tokens_per_page + tail_tokens.len();
        Self {
            id,
            generation,
            kind,
            n_tokens,
            draft_prefix_len: 0,
            block_keys,
            tail_tokens,
            pages: PageSlot::full_attention(n_tokens, tokens_per_page),
            layout,
        }
    }

    /// Bytes of its payload over all ranks.
    pub fn payload_bytes(&self) -> u64 {
        self.pages.len() as u64 * self.layout.bytes_per_page * u64::from(self.layout.n_ranks)
    }

    /// Whether its token prefix is a prefix of the query's request (and not longer than it).
    pub(crate) fn is_prefix_of(&self, query: &PrefixQuery<'_>) -> bool {
        let n_full = self.block_keys.len();
        let tail_start = n_full * self.layout.tokens_per_page as usize;
        self.n_tokens <= query.tokens.len()
            && n_full <= query.block_keys.len()
            && self.block_keys[..] == query.block_keys[..n_full]
            && tail_start + self.tail_tokens.len() == self.n_tokens
            && query.tokens.get(tail_start..self.n_tokens) == Some(&self.tail_tokens[..])
    }

    /// Whether its first `n_blocks` full blocks are a valid checkpoint at `n_blocks * tokens_per_page` on their
    /// own. Always for the whole checkpoint (`n_tokens` is exactly `n_blocks` blocks). For a strict prefix only
    /// when the layout is attention-only (`LayoutDescriptor::is_attention_only`) and every group holds the
    /// keyed pages of its live window at that boundary: a full group blocks `[0, n_blocks)`, a sliding-window
    /// group the blocks of its window plus retained tail, a chunked-local group those of the current chunk.
    /// Never for `n_blocks == 0` or more blocks than it has. Costs one pass over its pages.
    pub(crate) fn restores_block_prefix(&self, n_blocks: usize) -> bool {
        let tokens_per_page = self.layout.tokens_per_page as usize;
        if n_blocks == 0 || n_blocks > self.block_keys.len() || tokens_per_page == 0 {
            return false;
        }
        let boundary = n_blocks * tokens_per_page;
        if boundary == self.n_tokens {
            return true;
        }
        self.layout
            .groups
            .iter()
            .enumerate()
            .all(|(group_idx, kind)| {
                let live_start = match *kind {
                    GroupKind::Full => 0,
                    GroupKind::SlidingWindow {
                        window_tokens,
                        retained_tail_tokens,
                    } => boundary
                        .saturating_sub(window_tokens as usize + retained_tail_tokens as usize),
                    GroupKind::ChunkedLocal { chunk_tokens } => {
                        let chunk = (chunk_tokens as usize).max(1);
                        boundary / chunk * chunk
                    }
                    GroupKind::Recurrent | GroupKind::Auxiliary { .. } => return false,
                };
                let first_needed = live_start / tokens_per_page;
                let mut held = vec![false; n_blocks - first_needed];
                for slot in &self.pages {
                    if slot.group as usize == group_idx
                        && let Some(key_idx) = slot.key_idx
                        && let Some(needed) = (key_idx as usize)
                            .checked_sub(first_needed)
                            .and_then(|offset| held.get_mut(offset))
                    {
                        *needed = true;
                    }
                }
                held.iter().all(|&is_held| is_held)
            })
    }

    /// How many leading full blocks it shares with the query's request (block keys compared).
    pub(crate) fn common_blocks(&self, query: &PrefixQuery<'_>) -> usize {
        self.block_keys
            .iter()
            .zip(query.block_keys)
            .take_while(|(ours, theirs)| ours == theirs)
            .count()
    }

    /// G6 for a block prefix: `Ok` when its first `n_blocks` blocks may be restored for the query's request
    /// into an engine with `engine` layout: the layout matches, those blocks are the request's first blocks
    /// and they are a checkpoint of their own (`restores_block_prefix`); otherwise what differs.
    pub fn check_block_prefix_restorable(
        &self,
        engine: &LayoutDescriptor,
        query: &PrefixQuery<'_>,
        n_blocks: usize,
    ) -> Result<(), Mismatch> {
        self.layout.check_matches(engine)?;
        if n_blocks > query.block_keys.len()
            || self.common_blocks(query) < n_blocks
            || !self.restores_block_prefix(n_blocks)
        {
            return Err(Mismatch::BlockPrefix {
                n_blocks,
                groups: groups_to_string(&self.layout.groups),
            });
        }
        Ok(())
    }

    /// G6: `Ok` when this checkpoint may be restored for the query's request into an engine with `engine`
    /// layout; otherwise what differs (rank count, groups, page width, tokens per page, token prefix).
    pub fn check_restorable(
        &self,
        engine: &LayoutDescriptor,
        query: &PrefixQuery<'_>,
    ) -> Result<(), Mismatch> {
        self.layout.check_matches(engine)?;
        if !self.is_prefix_of(query) {
            return Err(Mismatch::TokenPrefix {
                n_tokens: self.n_tokens,
            });
        }
        Ok(())
    }
}

/// Page bytes of a checkpoint: `ranks[rank].page(page_idx)`, each exactly `bytes_per_page` long. A rank's
/// pages are shared buffers, so a store hands them to a copy engine without copying.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckpointPayload {
    /// Per rank, the checkpoint's pages.
    pub ranks: Vec<RankPages>,
}

impl CheckpointPayload {
    /// Total bytes.
    pub fn n_bytes(&self) -> u64 {
        self.ranks.iter().map(|pages| pages.n_bytes() as u64).sum()
    }

    /// `Ok` when it holds `meta.layout.n_ranks` ranks of `meta.pages.len()` pages of `bytes_per_page` bytes.
    pub(crate) fn check_shape(&self, meta: &CheckpointMeta) -> Result<(), Invalid> {
        let expected = meta.pages.len();
        if self.ranks.len() != meta.layout.n_ranks as usize {
            return Err(Invalid::PayloadShape {
                rank: self.ranks.len(),
                expected,
                found: 0,
            });
        }
        for (rank, pages) in self.ranks.iter().enumerate() {
            if pages.len() != expected {
                return Err(Invalid::PayloadShape {
                    rank,
                    expected,
                    found: pages.len(),
                });
            }
            let uniform = pages.bytes_per_page() as u64 == meta.layout.bytes_per_page
                && pages.n_bytes() as u64 == expected as u64 * meta.layout.bytes_per_page;
            if !uniform
                && let Some(bad) = pages
                    .pages()
                    .position(|page| page.len() as u64 != meta.layout.bytes_per_page)
            {
                return Err(Invalid::PayloadShape {
                    rank,
                    expected,
                    found: bad,
                });
            }
        }
        Ok(())
    }
}

/// A whole checkpoint: manifest data and page bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// Its manifest data.
    pub meta: CheckpointMeta,
    /// Its page bytes.
    pub payload: CheckpointPayload,
}

mod block_keys_serde {
    //! Serializes `Vec<BlockKey>` as a sequence of 32-byte arrays (kv-pool has no serde).
    use kv_pool::BlockKey;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(crate) fn serialize<S: Serializer>(
        keys: &[BlockKey],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let raw: Vec<[u8; 32]> = keys.iter().map(|key| key.0).collect();
        raw.serialize(serializer)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<BlockKey>, D::Error> {
        let raw = Vec::<[u8; 32]>::deserialize(deserializer)?;
        Ok(raw.into_iter().map(BlockKey).collect())
    }
}
