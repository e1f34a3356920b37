//! Page-level work of the engine: allocation under credits (C1, C5), page bytes written by the executor,
//! block registration in the prefix index, checkpoint capture into the store (E2), byte-for-byte verification
//! of restores (E3), and the moves of a request between queues (preemption, fallback, release).

use checkpoint_transfer::{
    Checkpoint, CheckpointId, CheckpointKind, CheckpointMeta, CheckpointPayload, PageBuf, PageSlot,
};
use kv_pool::PageStorage;
use kv_pool::RequestId;

use super::req::{Phase, Restore};
use super::{Engine, StepReport};
use crate::error::{Error, Result};
use crate::executor::{Executor, PageWrite};
use crate::metrics::FallbackReason;

/// Failed store writes per warning after the first: a full disk fails every capture, the log stays short.
const STORE_WRITE_FAILURES_PER_WARNING: u64 = 100;

/// How an allocation may use credit-protected pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AllocKind {
    /// A running decode: may use credit-protected free pages (C5).
    Decode,
    /// Prefill or admission: only pages not protected for others (C1); a ticket draws its own credits.
    Prefill,
}

impl<E: Executor> Engine<E> {
    /// Pages a new non-ticket allocation may take: free minus every outstanding credit.
    pub(crate) fn unprotected_free(&self) -> u32 {
        let credits = self
            .ledger
            .as_ref()
            .map_or(0, |ledger| ledger.credit_pages());
        reservation::pages_unprotected(self.pool.n_free(), credits)
    }

    /// Grows `id`'s page table to hold `upto_tokens` tokens. `false` (and nothing changed) when the pages
    /// are not there for this kind of allocation.
    pub(crate) fn grow_pages(
        &mut self,
        id: RequestId,
        upto_tokens: u32,
        kind: AllocKind,
    ) -> Result<bool> {
        let tpp = self.params.geometry.tokens_per_page();
        let req = &self.reqs[&id];
        let need = upto_tokens
            .div_ceil(tpp)
            .saturating_sub(req.pages.len() as u32);
        if need == 0 {
            return Ok(true);
        }
        let pages = if self.holds_admitted_ticket(id) {
            let Some(ledger) = self.ledger.as_mut() else {
                return Err(Error::internal(format!(
                    "{id} has an admitted ticket but no ledger"
                )));
            };
            match ledger.allocate(&mut self.pool, id, need) {
                Ok(pages) => pages,
                Err(error) if error.kind() == reservation::ErrorKind::Pressure => return Ok(false),
                Err(error) => {
                    return Err(Error::internal(format!(
                        "ledger allocation for {id}: {error}"
                    )));
                }
            }
        } else {
            let available = match kind {
                AllocKind::Decode => reservation::pages_for_decode(self.pool.n_free()),
                AllocKind::Prefill => self.unprotected_free(),
            };
            if need > available {
                return Ok(false);
            }
            self.pool.allocate(need)?
        };
        super::req::live(&mut self.reqs, id)?.pages.extend(pages);
        Ok(true)
    }

    /// Writes the bytes of every page that tokens `[start, end)` of `id` (now computed) fill, and registers its
    /// newly full blocks in the prefix index. A page still partial after `end` is written once it fills: its
    /// bytes are read by nothing until then (captures, imports and E3 verification cover full blocks only,
    /// and only full blocks are cached and shared), and a decode would otherwise rewrite the last page at
    /// every token.
    pub(crate) fn write_computed(&mut self, id: RequestId, start: u32, end: u32) -> Result<()> {
        let tpp = self.params.geometry.tokens_per_page();
        let req = &self.reqs[&id];
        if end > start {
            for page_idx in start / tpp..end / tpp {
                let write = PageWrite {
                    group: 0,
                    page: req.pages[page_idx as usize],
                    first_pos: page_idx * tpp,
                    prefix_key: req.keys[page_idx as usize],
                };
                self.executor.fill_page(&write, &mut self.page_buf);
                self.storage.write(0, write.page, &self.page_buf)?;
            }
        }
        self.register_blocks(id)
    }

    /// Registers `id`'s computed full blocks in the prefix index.
    pub(crate) fn register_blocks(&mut self, id: RequestId) -> Result<()> {
        let n_computed = self.reqs[&id].n_computed;
        self.register_blocks_upto(id, n_computed)
    }

    /// Registers `id`'s full blocks below `upto_tokens` in the prefix index. The step registers a prefill
    /// chunk's blocks when it schedules the chunk (same-pass visibility, as vLLM and the peer simulator do):
    /// a request considered later in the same step hits them, and the step computes them before anything
    /// reads them (preemptions come before the step's admissions, cancellations between steps).
    pub(crate) fn register_blocks_upto(&mut self, id: RequestId, upto_tokens: u32) -> Result<()> {
        let tpp = self.params.geometry.tokens_per_page();
        let req = super::req::live(&mut self.reqs, id)?;
        let full = (upto_tokens / tpp).min(req.pages.len() as u32);
        for block in req.n_registered..full {
            // `false`: another page already caches this block; ours stays private.
            let _registered = self
                .pool
                .cache_block(req.pages[block as usize], req.keys[block as usize])?;
        }
        req.n_registered = req.n_registered.max(full);
        Ok(())
    }

    /// Captures `id`'s computed page-aligned prefix into the store (E2): at prompt end and at response end,
    /// always, whatever ended the response.
    pub(crate) fn capture(&mut self, id: RequestId, kind: CheckpointKind) -> Result<()> {
        let tpp = self.params.geometry.tokens_per_page();
        let req = &self.reqs[&id];
        let n_blocks = (req.n_computed / tpp).min(req.pages.len() as u32) as usize;
        if n_blocks == 0 {
            return Ok(());
        }
        let n_tokens = n_blocks * tpp as usize;
        let last_key = req.keys[n_blocks - 1];
        let hex: String = last_key.0[..12]
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        let checkpoint_id =
            CheckpointId::new(format!("{hex}-{n_tokens}")).expect("hex ids are valid");
        self.generation += 1;
        let meta = CheckpointMeta::full_attention_keyed(
            checkpoint_id,
            self.generation,
            kind,
            &req.tokens[..n_tokens],
            req.keys[..n_blocks].to_vec(),
            self.layout.clone(),
        );
        let capacity_bytes = self.store.stats().capacity_bytes;
        if meta.payload_bytes() > capacity_bytes {
            // What `put` would refuse (`Error::TooLarge`, before it looks at the pages): no page is read.
            tracing::debug!(
                request = %id,
                bytes = meta.payload_bytes(),
                capacity_bytes,
                "checkpoint not stored: larger than the store"
            );
            return Ok(());
        }
        // One buffer for the whole checkpoint, one shared view per page: one allocation per capture.
        let bytes_per_page = self.page_buf.len();
        let mut bytes = vec![0u8; n_blocks * bytes_per_page];
        for (&page, dst) in req.pages[..n_blocks]
            .iter()
            .zip(bytes.chunks_exact_mut(bytes_per_page))
        {
            self.storage.read(0, page, dst)?;
        }
        let checkpoint = Checkpoint {
            meta,
            payload: CheckpointPayload {
                ranks: vec![PageBuf::split(bytes, bytes_per_page)],
            },
        };
        match self.store.put(checkpoint) {
            Ok(_outcome) => {}
            // The store could not write (disk full, read-only file system, permission; a Redis server
            // unreachable, slow or full): the engine goes on without this checkpoint; `store_write_failures`
            // counts it, the log says so rate-limited.
            Err(
                error @ (checkpoint_transfer::Error::Write { .. }
                | checkpoint_transfer::Error::Io { .. }
                | checkpoint_transfer::Error::Remote { .. }),
            ) => {
                let n_failures = self.store.stats().n_write_failures;
                if n_failures <= 1 || n_failures.is_multiple_of(STORE_WRITE_FAILURES_PER_WARNING) {
                    tracing::warn!(
                        request = %id,
                        %error,
                        n_failures,
                        "checkpoint not stored: the store cannot write (logged for the first failure and \
                         every {STORE_WRITE_FAILURES_PER_WARNING}th)"
                    );
                }
            }
            // A capture too large for the store, or an older generation: nothing to restore later.
            Err(error) => tracing::debug!(request = %id, %error, "checkpoint not stored"),
        }
        Ok(())
    }

    /// E3: checks that every page of `id`'s published import (its blocks from `first_block` on) holds what
    /// recomputing its prefix writes.
    pub(crate) fn verify_import(&mut self, id: RequestId, first_block: u32) -> Result<()> {
        if !self.params.verify_restores {
            return Ok(());
        }
        let tpp = self.params.geometry.tokens_per_page();
        let dest = self
            .index
            .pages(id)
            .ok_or_else(|| Error::internal(format!("{id}: verifying an import the index lacks")))?
            .to_vec();
        let keys = &self.reqs[&id].keys[first_block as usize..];
        let mut expected = vec![0u8; self.page_buf.len()];
        for ((block, page), key) in (first_block..).zip(&dest).zip(keys) {
            let write = PageWrite {
                group: 0,
                page: *page,
                first_pos: block * tpp,
                prefix_key: *key,
            };
            self.executor.fill_page(&write, &mut expected);
            self.storage.read(0, *page, &mut self.page_buf)?;
            if let Some(byte) = self
                .page_buf
                .iter()
                .zip(&expected)
                .position(|(a, b)| a != b)
            {
                return Err(Error::RestoreMismatch {
                    request: id,
                    block,
                    page: *page,
                    byte,
                });
            }
            self.pages_verified += 1;
        }
        Ok(())
    }

    /// Frees `id`'s pages (cached blocks stay findable until evicted) and resets its progress.
    pub(crate) fn free_request_pages(&mut self, id: RequestId) -> Result<()> {
        self.register_blocks(id)?;
        let req = super::req::live(&mut self.reqs, id)?;
        let pages = std::mem::take(&mut req.pages);
        req.n_computed = 0;
        req.n_registered = 0;
        self.pool.free_all(&pages)?;
        Ok(())
    }

    /// Preempts running `id` by recompute from the running pass (Q6): its pages are freed (their blocks stay
    /// cached), its ticket released, and it asks the store again as a newly arrived request would (its
    /// prompt-end checkpoint may restore it; within its lookup budget, K3), at its place in the order.
    pub(crate) fn preempt(&mut self, id: RequestId, report: &mut StepReport) -> Result<()> {
        self.give_up_running(id)?;
        report.preempted.push(id);
        self.on_arrival(id)
    }

    /// Preempts running `id` for a forced reset (X1): as `preempt`, but straight back to the waiting queue,
    /// since the reset empties the cache a lookup would read.
    pub(crate) fn preempt_for_reset(&mut self, id: RequestId) -> Result<()> {
        self.give_up_running(id)?;
        self.enqueue_waiting(id, None)
    }

    /// What both preemptions do: cancel a restore at once still copying, release the ticket, free the pages,
    /// count the preemption.
    fn give_up_running(&mut self, id: RequestId) -> Result<()> {
        self.cancel_loading(id)?;
        self.release_ticket(id);
        self.free_request_pages(id)?;
        let req = super::req::live(&mut self.reqs, id)?;
        req.metrics.preemptions += 1;
        req.restore = Restore::Idle;
        Ok(())
    }

    /// Cancels an `ordinary` restore still copying into `id`'s pages: they hold nothing valid yet, so they
    /// are never registered as cached blocks; the index keeps them pinned until the copy drains (O5).
    pub(crate) fn cancel_loading(&mut self, id: RequestId) -> Result<()> {
        let tpp = self.params.geometry.tokens_per_page();
        let req = super::req::live(&mut self.reqs, id)?;
        if req.loading.take().is_some() {
            req.n_computed = req.n_registered * tpp;
            let _draining = self.index.cancel(&mut self.pool, &mut *self.copies, id)?;
        }
        Ok(())
    }

    /// Releases everything `id` holds in the ledger, if there is one: its waiter, or its ticket's slot and
    /// credits. A ticket holds no page references once its import is staged (they were handed to the index,
    /// which alone pins and drains them, O5), so a release never leaves the ledger a drain.
    pub(crate) fn release_ticket(&mut self, id: RequestId) {
        let Some(ledger) = self.ledger.as_mut() else {
            return;
        };
        let released = ledger.release(id, &mut self.pool);
        if let Some(drain) = released.drain {
            // Unreachable: every ticket hands its pages over when its import is staged. Settled rather than
            // leaked, and reported.
            tracing::error!(request = %id, "a released ticket still held its import's pages");
            if let Err(error) = ledger.pages_drained(drain, &mut self.pool) {
                tracing::error!(request = %id, %error, "settling a ticket's drain");
            }
        }
    }

    /// Puts `id` in the ordinary waiting queue, recording a restore fallback if given.
    pub(crate) fn enqueue_waiting(
        &mut self,
        id: RequestId,
        fallback: Option<FallbackReason>,
    ) -> Result<()> {
        let req = super::req::live(&mut self.reqs, id)?;
        if let Some(reason) = fallback {
            req.fall_back(reason);
            req.restore = Restore::Idle;
        }
        self.move_to(id, Phase::Waiting)
    }

    /// Drops whatever restore `id` has in progress: its ticket or waiter (slot and credits at once), its
    /// import (drained before its pages are released, O5; released at once when ready, O6).
    pub(crate) fn drop_restore(&mut self, id: RequestId) -> Result<()> {
        let req = super::req::live(&mut self.reqs, id)?;
        let restore = std::mem::take(&mut req.restore);
        self.release_ticket(id);
        if matches!(restore, Restore::Importing { .. }) && self.index.state(id).is_some() {
            let _outcome = self.index.cancel(&mut self.pool, &mut *self.copies, id)?;
        }
        Ok(())
    }

    /// The part of `stored` covering blocks `[first_block, end_block)`: what an import of those blocks copies
    /// into the pool and publishes (one keyed page per block; the engine's checkpoints have one
    /// full-attention group and their keyed pages first).
    pub(crate) fn checkpoint_part(
        &self,
        stored: &Checkpoint,
        first_block: u32,
        end_block: u32,
    ) -> Checkpoint {
        let tpp = self.params.geometry.tokens_per_page() as usize;
        let blocks = first_block as usize..end_block as usize;
        debug_assert!(blocks.end <= stored.meta.block_keys.len());
        let meta = CheckpointMeta {
            n_tokens: blocks.end * tpp,
            draft_prefix_len: stored.meta.draft_prefix_len.min(blocks.end * tpp),
            block_keys: stored.meta.block_keys[blocks.clone()].to_vec(),
            tail_tokens: Vec::new(),
            pages: (0..blocks.len() as u32)
                .map(|key_idx| PageSlot {
                    group: 0,
                    key_idx: Some(key_idx),
                })
                .collect(),
            ..stored.meta.clone()
        };
        let ranks = stored
            .payload
            .ranks
            .iter()
            .map(|pages| pages[blocks.clone()].to_vec())
            .collect();
        Checkpoint {
            meta,
            payload: CheckpointPayload { ranks },
        }
    }

    /// Ends `id`'s capacity wait, if any, recording its length.
    pub(crate) fn end_wait(&mut self, id: RequestId) {
        let now = self.now;
        if let Some(req) = self.reqs.get_mut(&id)
            && let Some(started) = req.wait_started.take()
        {
            let waited_s = now.since(started).as_secs_f64();
            req.metrics.longest_capacity_wait_s = req.metrics.longest_capacity_wait_s.max(waited_s);
        }
    }
}
