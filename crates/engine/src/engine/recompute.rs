//! E3 and L5 for executors with a model (L3): a restored page is checked against what a recompute of the
//! same prefix into scratch storage writes, byte for byte; a mismatch names the request, the page and the
//! first differing byte.

use kv_pool::{PageId, RequestId};

use super::Engine;
use crate::error::{Error, Result};
use crate::executor::Executor;

impl<E: Executor> Engine<E> {
    /// Checks every page `dest` of `request`'s import of `tokens` tokens, or of a snapshot it is admitted on
    /// (`GroupCoordinator::import_slots`:
    /// its blocks from `first_block` on; hybrid: the whole checkpoint, its windowed groups' live pages and its
    /// fixed pages included), on every rank, against a recompute of its first `tokens` tokens.
    pub(crate) fn verify_by_recompute(
        &mut self,
        request: RequestId,
        first_block: u32,
        tokens: u32,
        dest: &[PageId],
    ) -> Result<()> {
        let block_tokens = self.params.geometry.block_tokens();
        let prefix = self
            .table
            .get(request)?
            .tokens
            .get(request)?
            .get(..tokens as usize)
            .ok_or_else(|| Error::internal(format!("{request}: an import past its tokens")))?
            .to_vec();
        let bytes_per_page = self.storage.bytes_per_page();
        let Some(expected) = self.executor.recompute(&prefix, bytes_per_page)? else {
            return Err(Error::internal(format!(
                "{request}: executor {} writes its pages but recomputes none",
                self.executor.name()
            )));
        };
        // (slot index for the error, page, expected bytes on every rank)
        let mut checks: Vec<(u32, PageId, &[Vec<u8>])> = Vec::with_capacity(dest.len());
        let slots = self.groups.import_slots(first_block, tokens, block_tokens);
        if slots.len() != dest.len() {
            return Err(Error::internal(format!(
                "{request}: an import of {} pages for {} slots",
                dest.len(),
                slots.len()
            )));
        }
        let mut fixed = expected.fixed.iter();
        for (slot_idx, ((slot, block), &page)) in slots.iter().zip(dest).enumerate() {
            let bytes = match block {
                Some(block) if slot.group == self.groups.full() => {
                    expected.blocks.get(*block as usize)
                }
                Some(block) => (0..self.groups.n_windows())
                    .position(|window| self.groups.window_group(window) == slot.group)
                    .and_then(|window| expected.windows.get(window))
                    .and_then(|pages| pages.get(*block as usize)),
                None => fixed.next(),
            };
            // Its block from `first_block` on; at an exact boundary (from block 0) its checkpoint slot.
            let label = first_block + slot_idx as u32;
            let bytes = bytes.ok_or_else(|| {
                Error::internal(format!(
                    "{request}: no recomputed page for import page {label}"
                ))
            })?;
            checks.push((label, page, bytes));
        }
        self.compare_with_recompute(request, checks)
    }

    /// Reads each checked page on every rank and compares it with the recomputed bytes; the first
    /// difference is a [`Error::RestoreMismatch`].
    fn compare_with_recompute(
        &mut self,
        request: RequestId,
        checks: Vec<(u32, PageId, &[Vec<u8>])>,
    ) -> Result<()> {
        let n_ranks = self.storage.n_ranks();
        for (block, page, ranks) in checks {
            if ranks.len() != n_ranks as usize {
                return Err(Error::internal(format!(
                    "{request}: recompute gave {} ranks of page {page:?}, the storage has {n_ranks}",
                    ranks.len()
                )));
            }
            for (rank, bytes) in (0..n_ranks).zip(ranks) {
                self.storage.read(rank, page, &mut self.scratch.page_buf)?;
                if let Some(byte) = self
                    .scratch
                    .page_buf
                    .iter()
                    .zip(bytes)
                    .position(|(a, b)| a != b)
                {
                    return Err(Error::RestoreMismatch {
                        request,
                        block,
                        rank,
                        page,
                        byte,
                    });
                }
                self.tally.pages_verified += 1;
            }
        }
        Ok(())
    }
}
