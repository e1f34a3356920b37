//! A checkpoint boundary of one request: its pages and what recompute writes into each (E3).

use checkpoint_transfer::PageSlot;
use kv_pool::BlockKey;

use crate::executor::PageWrite;

/// A checkpoint boundary of one request: its pages (`GroupCoordinator::slots`) and their contents.
#[derive(Debug)]
pub(crate) struct Boundary<'a> {
    /// The pages, in payload order.
    pub(crate) slots: Vec<PageSlot>,
    /// The block each page holds (`None` for a fixed page).
    blocks: Vec<Option<u32>>,
    n_tokens: u32,
    block_tokens: u32,
    keys: &'a [BlockKey],
    /// The exact prefix key of the boundary's tokens.
    pub(crate) exact: BlockKey,
}

impl<'a> Boundary<'a> {
    /// The boundary at `n_tokens` of a request with `tokens` and full-block `keys` whose pages are `slots`
    /// (`GroupCoordinator::slots` or `import_slots`).
    pub(super) fn new(
        slots: Vec<(PageSlot, Option<u32>)>,
        tokens: &[u32],
        keys: &'a [BlockKey],
        salt: &[u8],
        n_tokens: u32,
        block_tokens: u32,
    ) -> Boundary<'a> {
        let (slots, blocks) = slots.into_iter().unzip();
        Boundary {
            slots,
            blocks,
            n_tokens,
            block_tokens,
            keys,
            exact: exact_prefix_key(tokens, keys, n_tokens, block_tokens, salt),
        }
    }

    /// Whether page `slot_idx` holds what recompute writes at exactly the boundary (a partial last page or a
    /// fixed page), not a full block: such pages are written when a checkpoint is captured.
    pub(crate) fn is_partial(&self, slot_idx: usize) -> bool {
        self.blocks[slot_idx].is_none_or(|block| (block + 1) * self.block_tokens > self.n_tokens)
    }

    /// The block page `slot_idx` holds (`None` for a fixed page).
    pub(crate) fn block(&self, slot_idx: usize) -> Option<u32> {
        self.blocks.get(slot_idx).copied().flatten()
    }

    /// What recompute writes into page `slot_idx` on `rank` (the page being `page`): a full block what its
    /// block key says; the partial last page, the state and auxiliary pages what the exact boundary says.
    pub(crate) fn write(&self, slot_idx: usize, rank: u32, page: kv_pool::PageId) -> PageWrite {
        let slot = self.slots[slot_idx];
        let block_tokens = self.block_tokens;
        let (first_pos, prefix_key) = match self.blocks[slot_idx] {
            // A full block.
            Some(block) if !self.is_partial(slot_idx) => {
                (block * block_tokens, self.keys[block as usize])
            }
            // A partial last page: its tokens start at the last block boundary.
            Some(block) => (block * block_tokens, self.exact),
            // A fixed page: its position in the payload, past the boundary.
            None => (self.n_tokens + slot_idx as u32, self.exact),
        };
        PageWrite {
            group: slot.group,
            rank,
            page,
            first_pos,
            prefix_key,
        }
    }
}

/// The key of exactly the first `n_tokens` of `tokens` (`keys` are its full blocks' keys): the block key when
/// `n_tokens` ends a block, else the last full block's key chained with the partial block's tokens.
pub(crate) fn exact_prefix_key(
    tokens: &[u32],
    keys: &[BlockKey],
    n_tokens: u32,
    block_tokens: u32,
    salt: &[u8],
) -> BlockKey {
    let n_full = (n_tokens / block_tokens) as usize;
    let tail = &tokens[n_full * block_tokens as usize..n_tokens as usize];
    if tail.is_empty() && n_full > 0 {
        return keys[n_full - 1];
    }
    let parent = n_full.checked_sub(1).map(|idx| &keys[idx]);
    BlockKey::chain(parent, tail, salt)
}

/// The key under which a published `pages-only` import's unkeyed page `slot_idx` stays findable in the
/// prefix cache until its consumer is admitted (its state is valid at exactly the boundary `exact` names).
pub(crate) fn slot_key(exact: BlockKey, slot_idx: usize) -> BlockKey {
    BlockKey::chain(Some(&exact), &[slot_idx as u32], b"kvgate-checkpoint-slot")
}

/// The key under which a full block `block_key` of windowed group `group` stays findable in the prefix cache
/// for local hybrid hits (H9): its bytes are a function of the block's prefix and the group alone (E3), like a
/// full-attention block's, so every snapshot holding that block shares one page.
pub(crate) fn window_block_key(group: u32, block_key: BlockKey) -> BlockKey {
    BlockKey::chain(Some(&block_key), &[group], b"kvgate-window-block")
}
