//! Page-level work of the engine: allocation under credits (C1, C5), page bytes written by the executor,
//! block registration in the prefix index, checkpoint capture into the store (E2), byte-for-byte verification
//! of restores (E3), and the moves of a request between queues (preemption, fallback, release).

use checkpoint_transfer::{
    Checkpoint, CheckpointId, CheckpointKind, CheckpointMeta, CheckpointPayload, RankPages,
};
use kv_pool::RequestId;
use kv_pool::{BlockKey, PageId};

use super::Engine;
use super::groups::RestoreBoundary;
use crate::error::{Error, Result};
use crate::executor::{Executor, PageWrite};
use crate::params::ClockKind;

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
        reservation::pages_unprotected(self.pool.n_free(), self.policy.credit_pages())
    }

    /// Grows `request`'s page table to hold `upto_tokens` tokens. `false` (and nothing changed) when the pages
    /// are not there for this kind of allocation.
    pub(crate) fn grow_pages(
        &mut self,
        request: RequestId,
        upto_tokens: u32,
        kind: AllocKind,
    ) -> Result<bool> {
        let need = self.grow_need(request, upto_tokens)?;
        if need == 0 {
            return Ok(true);
        }
        let pages = if self.policy.holds_admitted_ticket(request) {
            match self
                .policy
                .allocate_from_ticket(&mut self.pool, request, need)?
            {
                Some(pages) => pages,
                None => return Ok(false),
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
        self.take_new_pages(request, pages, upto_tokens)?;
        Ok(true)
    }

    /// Pages `request` still needs to hold tokens up to `upto_tokens`: its block table's new pages, its windowed
    /// tables' new pages, plus (hybrid) its fixed pages when it has none yet, the copies on write of an
    /// imported partial last page and imported fixed pages (C3, H6), and a pending replay page (H5).
    pub(crate) fn grow_need(&self, request: RequestId, upto_tokens: u32) -> Result<u32> {
        Ok(self.need_of(&self.held(request)?, upto_tokens))
    }

    /// `request`'s tables as allocation sees them.
    fn held(&self, request: RequestId) -> Result<Held<'_>> {
        let req = self.table.get(request)?;
        Ok(Held {
            pages: &req.pages,
            windows: &req.windows,
            fixed_len: req.fixed.len(),
            n_computed: req.n_computed,
            copy_on_write: req.copy_on_write,
            replay_page: req.replay_page,
        })
    }

    /// What `grow_need` counts, for the tables `held`.
    pub(crate) fn need_of(&self, held: &Held<'_>, upto_tokens: u32) -> u32 {
        let block_tokens = self.params.geometry.block_tokens();
        let upto_blocks = upto_tokens.div_ceil(block_tokens);
        let blocks = upto_blocks.saturating_sub(held.pages.len() as u32);
        let window_blocks: u32 = (0..self.groups.n_windows())
            .map(|window| {
                let len = held.windows.get(window).map_or(0, Vec::len) as u32;
                upto_blocks.saturating_sub(len)
            })
            .sum();
        let fixed = if held.fixed_len == 0 {
            self.groups.n_fixed()
        } else {
            0
        };
        blocks + window_blocks + fixed + held.copied_on_write(block_tokens).len() as u32
    }

    /// Whether a draft replay follows a restore of `n_tokens` (H5): the tokens it replays and whether it needs
    /// a replay page, or `None`.
    pub(crate) fn draft_replay_after(&self, n_tokens: u32) -> Option<(u32, bool)> {
        if self.params.draft_tokens == 0 || self.groups.carries_draft_state() || n_tokens == 0 {
            return None;
        }
        let block_tokens = self.params.geometry.block_tokens();
        let aligned = n_tokens.is_multiple_of(block_tokens);
        let tokens = if aligned {
            block_tokens
        } else {
            n_tokens % block_tokens
        };
        Some((tokens, aligned))
    }

    /// Starts the draft replay of `request`, restored up to its computed tokens, when drafting is on and its
    /// checkpoint carried no draft state (H5): the draft model recomputes the last page's tokens (a whole page
    /// on a block boundary, into a replay page copied on write; the partial page, already its own, inside
    /// one).
    pub(crate) fn begin_draft_replay(&mut self, request: RequestId) -> Result<()> {
        let n_computed = self.table.get(request)?.n_computed;
        if let Some((tokens, page)) = self.draft_replay_after(n_computed) {
            let req = self.table.get_mut(request)?;
            req.draft_replay_tokens = tokens;
            req.replay_page = page;
        }
        Ok(())
    }

    /// Gives `request` the pages `grow_pages` allocated (`grow_need` of them): first the copies on write of its
    /// imported partial last page and fixed pages (each rank's bytes copied, the imported page released),
    /// then fixed pages it lacks, then new pages of its block table.
    fn take_new_pages(
        &mut self,
        request: RequestId,
        pages: Vec<PageId>,
        upto_tokens: u32,
    ) -> Result<()> {
        let block_tokens = self.params.geometry.block_tokens();
        let n_fixed = self.groups.n_fixed() as usize;
        let mut pages = pages.into_iter();
        let mut released = Vec::new();
        let ticket = self.policy.holds_admitted_ticket(request);
        let copied = self.held(request)?.copied_on_write(block_tokens);
        let req = self.table.get_mut(request)?;
        req.copy_on_write = false;
        req.replay_page = false;
        for slot in copied {
            let target = match slot {
                CopySlot::Block(block) => req.pages.get_mut(block),
                CopySlot::Window { window, block } => req
                    .windows
                    .get_mut(window)
                    .and_then(|table| table.get_mut(block)),
                CopySlot::Fixed(idx) => req.fixed.get_mut(idx),
            }
            .ok_or_else(|| {
                Error::internal(format!("{request}: no page {slot:?} to copy on write"))
            })?;
            let fresh = pages.next().ok_or_else(|| {
                Error::internal(format!("{request}: too few pages to copy on write"))
            })?;
            for rank in 0..self.storage.n_ranks() {
                self.storage.copy(rank, *target, fresh)?;
            }
            released.push(std::mem::replace(target, fresh));
            if ticket && matches!(slot, CopySlot::Window { .. }) {
                // Its credits come back when it leaves the window (C4).
                req.window_credit_pages.push(fresh);
            }
        }
        if req.fixed.is_empty() && n_fixed > 0 {
            req.fixed.extend(pages.by_ref().take(n_fixed));
        }
        // The rest: new blocks of the block table, then of every windowed table.
        let upto_blocks = upto_tokens.div_ceil(block_tokens) as usize;
        if req.windows.len() < self.groups.n_windows() {
            req.windows.resize(self.groups.n_windows(), Vec::new());
        }
        let new_blocks = upto_blocks.saturating_sub(req.pages.len());
        req.pages.extend(pages.by_ref().take(new_blocks));
        for table in &mut req.windows {
            let take = upto_blocks.saturating_sub(table.len());
            table.extend(pages.by_ref().take(take));
            if ticket {
                req.window_credit_pages
                    .extend_from_slice(&table[table.len() - take..]);
            }
        }
        if pages.next().is_some() {
            return Err(Error::internal(format!(
                "{request}: allocated pages left over"
            )));
        }
        self.pool.free_all(&released)?;
        Ok(())
    }

    /// Gives the pages of `request`'s windowed tables that left the window at its computed tokens back to the pool
    /// (null in the tables, H3); the credits of those its ticket paid for come back (C4).
    pub(crate) fn release_left_window(&mut self, request: RequestId) -> Result<()> {
        if self.groups.n_windows() == 0 {
            return Ok(());
        }
        let ticket = self.policy.holds_admitted_ticket(request);
        let n_computed = self.table.get(request)?.n_computed;
        let firsts: Vec<u32> = (0..self.groups.n_windows())
            .map(|window| self.groups.window_first_block(window, n_computed))
            .collect();
        let req = self.table.get_mut(request)?;
        let mut released = Vec::new();
        for (table, first) in req.windows.iter_mut().zip(firsts) {
            for page in table.iter_mut().take(first as usize) {
                if !page.is_null() {
                    released.push(std::mem::replace(page, PageId::NULL));
                }
            }
        }
        if released.is_empty() {
            return Ok(());
        }
        let before = req.window_credit_pages.len();
        req.window_credit_pages
            .retain(|page| !released.contains(page));
        let credited = (before - req.window_credit_pages.len()) as u32;
        self.pool.free_all(&released)?;
        if ticket && credited > 0 {
            self.policy.release_window_pages(request, credited)?;
        }
        Ok(())
    }

    /// Whether the engine writes the executor's page content ([`Executor::fill_page`]): not when the executor
    /// wrote its pages itself (L3), nor when nothing may check the bytes (`Restores::page_content_read`).
    pub(crate) fn fills_pages(&self) -> bool {
        !self.executor.writes_pages() && self.restores.page_content_read
    }

    /// Writes the bytes of every page that tokens `[start, end)` of `request` (now computed) fill, and registers its
    /// newly full blocks in the prefix index. A page still partial after `end` is written once it fills: its
    /// bytes are read by nothing until then (captures, imports and E3 verification cover full blocks only,
    /// and only full blocks are cached and shared), and a decode would otherwise rewrite the last page at
    /// every token.
    pub(crate) fn write_computed(
        &mut self,
        request: RequestId,
        start: u32,
        end: u32,
    ) -> Result<()> {
        let block_tokens = self.params.geometry.block_tokens();
        let req = &self.table.get(request)?;
        // An executor with a model wrote its pages itself (L3).
        if end > start && self.fills_pages() {
            for page_idx in start / block_tokens..end / block_tokens {
                for rank in 0..self.storage.n_ranks() {
                    let write = PageWrite {
                        group: self.groups.full(),
                        rank,
                        page: req.pages[page_idx as usize],
                        first_pos: page_idx * block_tokens,
                        prefix_key: req.keys[page_idx as usize],
                    };
                    self.executor.fill_page(&write, &mut self.scratch.page_buf);
                    self.storage
                        .write(rank, write.page, &self.scratch.page_buf)?;
                    for (window, table) in req.windows.iter().enumerate() {
                        // Written in the step that computed it: it is still in the window.
                        let write = PageWrite {
                            group: self.groups.window_group(window),
                            page: table[page_idx as usize],
                            ..write
                        };
                        self.executor.fill_page(&write, &mut self.scratch.page_buf);
                        self.storage
                            .write(rank, write.page, &self.scratch.page_buf)?;
                    }
                }
            }
        }
        self.register_blocks(request)?;
        self.release_left_window(request)
    }

    /// Registers `request`'s computed full blocks in the prefix index.
    pub(crate) fn register_blocks(&mut self, request: RequestId) -> Result<()> {
        let n_computed = self.table.get(request)?.n_computed;
        self.register_blocks_upto(request, n_computed)
    }

    /// Registers `request`'s full blocks below `upto_tokens` in the prefix index. The step registers a prefill
    /// chunk's blocks when it schedules the chunk (same-pass visibility, as vLLM and the peer simulator do):
    /// a request considered later in the same step hits them, and the step computes them before anything
    /// reads them (preemptions come before the step's admissions, cancellations between steps).
    pub(crate) fn register_blocks_upto(
        &mut self,
        request: RequestId,
        upto_tokens: u32,
    ) -> Result<()> {
        let block_tokens = self.params.geometry.block_tokens();
        let req = self.table.get_mut(request)?;
        let full = (upto_tokens / block_tokens).min(req.pages.len() as u32);
        let first = req.n_registered;
        for block in first..full {
            // `false`: another page already caches this block; ours stays private.
            let _registered = self
                .pool
                .cache_block(req.pages[block as usize], req.keys[block as usize])?;
        }
        req.n_registered = req.n_registered.max(full);
        self.absorb_prefix_changes(&mut [(request, first as usize)]);
        Ok(())
    }

    /// Captures `request`'s computed page-aligned prefix into the store (E2): at prompt end and at response end,
    /// always, whatever ended the response. `true` when it was sent to the store (`put_checkpoint`).
    pub(crate) fn capture(&mut self, request: RequestId, kind: CheckpointKind) -> Result<bool> {
        if self.groups.restore_boundary() == RestoreBoundary::Exact {
            return self.capture_hybrid(request, kind);
        }
        let block_tokens = self.params.geometry.block_tokens();
        let req = &self.table.get(request)?;
        let n_blocks = (req.n_computed / block_tokens).min(req.pages.len() as u32) as usize;
        if n_blocks == 0 {
            return Ok(false);
        }
        let n_tokens = n_blocks * block_tokens as usize;
        let checkpoint_id = CheckpointId::of_prefix(&req.keys[n_blocks - 1], n_tokens);
        let generation = self.ids.next_generation();
        // A page-aligned boundary: its meta needs the keys alone, so a deferred prompt stays deferred.
        let meta = CheckpointMeta::full_attention_blocks(
            checkpoint_id,
            generation,
            kind,
            req.keys[..n_blocks].to_vec(),
            self.restores.layout.clone(),
        );
        if self.too_large_for_the_store(request, &meta) {
            return Ok(false);
        }
        // One buffer per rank, the pages read straight into it; or the pages of this request's last capture
        // that it extends, shared, and a buffer of the pages after them (a response capture reads its
        // response's pages only). A full block's bytes never change once computed: its content is a
        // function of its prefix, recomputed or restored alike (E3).
        let bytes_per_page = self.scratch.page_buf.len();
        let n_ranks = self.storage.n_ranks() as usize;
        let extended = req
            .last_capture
            .as_ref()
            .filter(|(n_prev, prev)| *n_prev <= n_blocks && prev.len() == n_ranks);
        let mut ranks = Vec::with_capacity(n_ranks);
        let (storage, pages) = (&self.storage, &req.pages);
        for rank in 0..self.storage.n_ranks() {
            // Reads pages `[from, n_blocks)` of the request into a buffer of that many pages.
            let read_from = |from: usize| {
                move |bytes: &mut [u8]| -> Result<()> {
                    for (&page, dst) in pages[from..n_blocks]
                        .iter()
                        .zip(bytes.chunks_exact_mut(bytes_per_page))
                    {
                        storage.read(rank, page, dst)?;
                    }
                    Ok(())
                }
            };
            let shared = extended.and_then(|(n_prev, prev)| {
                RankPages::extending(
                    &prev[rank as usize],
                    n_blocks,
                    bytes_per_page,
                    read_from(*n_prev),
                )
            });
            ranks.push(match shared {
                Some(pages) => pages?,
                None => RankPages::filled(n_blocks, bytes_per_page, read_from(0))?,
            });
        }
        if extended.is_none() {
            // One buffer per rank: the next capture of this request extends it.
            self.table.get_mut(request)?.last_capture = Some((n_blocks, ranks.clone()));
        }
        Ok(self.put_checkpoint(
            request,
            Checkpoint {
                meta,
                payload: CheckpointPayload { ranks },
            },
        ))
    }

    /// Whether a checkpoint of `meta` is larger than the whole store: `put` would refuse it
    /// (`Error::TooLarge`, before it looks at the pages), so no page is read.
    fn too_large_for_the_store(&self, request: RequestId, meta: &CheckpointMeta) -> bool {
        let capacity_bytes = self.restores.store.stats().capacity_bytes;
        if meta.payload_bytes() <= capacity_bytes {
            return false;
        }
        tracing::debug!(
            request = %request,
            bytes = meta.payload_bytes(),
            capacity_bytes,
            "checkpoint not stored: larger than the store"
        );
        true
    }

    /// Whether `req`'s tables hold every page of the exact boundary at its computed tokens (some computed): its
    /// block table up to the last partial page, every windowed table and its fixed pages.
    pub(crate) fn tables_hold_computed_boundary(&self, req: &super::req::Req) -> bool {
        let n_pages = req.n_computed.div_ceil(self.params.geometry.block_tokens()) as usize;
        req.n_computed > 0
            && req.pages.len() >= n_pages
            && req.fixed.len() == self.groups.n_fixed() as usize
            && req.windows.len() == self.groups.n_windows()
    }

    /// Captures hybrid `request` at exactly its computed tokens `n` (H2, H6): its block table's pages, the partial
    /// last one included, every windowed table's live pages and its fixed pages (state, auxiliary). The
    /// partial pages and the fixed pages are written first with what recompute writes at `n` (see
    /// `groups.rs`).
    fn capture_hybrid(&mut self, request: RequestId, kind: CheckpointKind) -> Result<bool> {
        let block_tokens = self.params.geometry.block_tokens();
        let req = &self.table.get(request)?;
        let n_tokens = req.n_computed;
        if !self.tables_hold_computed_boundary(req) {
            return Ok(false);
        }
        let n_full = (n_tokens / block_tokens) as usize;
        let tokens = req.tokens.get(request)?;
        let boundary =
            self.groups
                .boundary(tokens, &req.keys, &req.spec.salt, n_tokens, block_tokens);
        let exact = boundary.exact;
        let pages = self.boundary_pages(request, n_tokens)?;
        if pages.len() != boundary.slots.len() {
            return Err(Error::internal(format!(
                "{request}: {} pages for a checkpoint of {} pages at {n_tokens} tokens",
                pages.len(),
                boundary.slots.len()
            )));
        }
        let checkpoint_id = CheckpointId::of_prefix(&exact, n_tokens as usize);
        let meta = CheckpointMeta {
            id: checkpoint_id,
            generation: self.ids.next_generation(),
            kind,
            n_tokens: n_tokens as usize,
            // An auxiliary group carries the draft model's state at exactly `n` (H5).
            draft_prefix_len: if self.groups.carries_draft_state() {
                n_tokens as usize
            } else {
                0
            },
            block_keys: req.keys[..n_full].to_vec(),
            tail_tokens: tokens[n_full * block_tokens as usize..n_tokens as usize].to_vec(),
            layout: self.restores.layout.clone(),
            pages: boundary.slots.clone(),
        };
        if self.too_large_for_the_store(request, &meta) {
            return Ok(false);
        }
        let bytes_per_page = self.scratch.page_buf.len();
        let mut ranks = Vec::with_capacity(self.storage.n_ranks() as usize);
        for rank in 0..self.storage.n_ranks() {
            let mut bytes = vec![0u8; pages.len() * bytes_per_page];
            for ((slot_idx, &page), dst) in pages
                .iter()
                .enumerate()
                .zip(bytes.chunks_exact_mut(bytes_per_page))
            {
                if boundary.is_partial(slot_idx) && self.fills_pages() {
                    // The partial pages and the fixed pages hold what recompute writes at exactly `n`.
                    let write = boundary.write(slot_idx, rank, page);
                    self.executor.fill_page(&write, dst);
                    self.storage.write(rank, page, dst)?;
                } else {
                    self.storage.read(rank, page, dst)?;
                }
            }
            ranks.push(RankPages::new(bytes, bytes_per_page));
        }
        Ok(self.put_checkpoint(
            request,
            Checkpoint {
                meta,
                payload: CheckpointPayload { ranks },
            },
        ))
    }

    /// `request`'s pages of a checkpoint at `n_tokens` (its computed tokens), in `GroupCoordinator::slots` order: the
    /// block table's, every windowed table's live ones, the fixed pages.
    pub(crate) fn boundary_pages(&self, request: RequestId, n_tokens: u32) -> Result<Vec<PageId>> {
        let block_tokens = self.params.geometry.block_tokens();
        let req = &self.table.get(request)?;
        let n_pages = n_tokens.div_ceil(block_tokens) as usize;
        let mut pages: Vec<PageId> = req.pages[..n_pages].to_vec();
        for (window, table) in req.windows.iter().enumerate() {
            let first = self.groups.window_checkpoint_first_block(window, n_tokens) as usize;
            let live = table.get(first..n_pages).ok_or_else(|| {
                Error::internal(format!(
                    "{request}: window {window} lacks blocks {first}..{n_pages}"
                ))
            })?;
            if live.iter().any(|page| page.is_null()) {
                return Err(Error::internal(format!(
                    "{request}: window {window} released a live block of {first}..{n_pages}"
                )));
            }
            pages.extend_from_slice(live);
        }
        pages.extend_from_slice(&req.fixed);
        Ok(pages)
    }

    /// Gives `request` the pages of a checkpoint at `tokens` (`GroupCoordinator::slots` order, `pages` empty for none): its
    /// block table, every windowed table (null before the window at `tokens`) and its fixed pages.
    pub(crate) fn assign_checkpoint_pages(
        &mut self,
        request: RequestId,
        pages: Vec<PageId>,
        tokens: u32,
    ) -> Result<()> {
        let (table, windows, fixed) = self.checkpoint_tables(request, pages, tokens)?;
        let req = self.table.get_mut(request)?;
        req.pages = table;
        req.windows = windows;
        req.window_credit_pages.clear();
        req.fixed = fixed;
        Ok(())
    }

    /// The tables the pages of a checkpoint at `tokens` (`GroupCoordinator::slots` order, empty for none) make:
    /// the block table, every windowed table (null before the window at `tokens`) and the fixed pages.
    pub(crate) fn checkpoint_tables(
        &self,
        request: RequestId,
        pages: Vec<PageId>,
        tokens: u32,
    ) -> Result<CheckpointTables> {
        let block_tokens = self.params.geometry.block_tokens();
        let n_pages = tokens.div_ceil(block_tokens) as usize;
        let mut windows = Vec::with_capacity(self.groups.n_windows());
        let mut pages = pages.into_iter();
        let table: Vec<PageId> = pages.by_ref().take(n_pages).collect();
        if !table.is_empty() || tokens == 0 {
            for window in 0..self.groups.n_windows() {
                let first = self.groups.window_checkpoint_first_block(window, tokens) as usize;
                let imported = n_pages.saturating_sub(first);
                // Nothing live (a chunked-local group at a chunk boundary): the table stops before the
                // block the next token writes, which the first allocation then takes.
                let nulls = if imported == 0 {
                    (tokens / block_tokens) as usize
                } else {
                    first
                };
                let mut window_table = vec![PageId::NULL; nulls];
                window_table.extend(pages.by_ref().take(imported));
                windows.push(window_table);
            }
        }
        let fixed: Vec<PageId> = pages.collect();
        if table.len() != n_pages && !table.is_empty() {
            return Err(Error::internal(format!(
                "{request}: {} pages for a block table of {n_pages}",
                table.len()
            )));
        }
        Ok((table, windows, fixed))
    }

    /// Sends a captured checkpoint to the store: on the simulated clock over the capture link, arriving once
    /// its copy out is through (`CaptureLink`); on the wall clock at once. `true` when it is on its way (or,
    /// on the wall clock, stored).
    fn put_checkpoint(&mut self, request: RequestId, checkpoint: Checkpoint) -> bool {
        if self.params.clock == ClockKind::Wall {
            return self.store_checkpoint(request, checkpoint);
        }
        let n_tokens = u32::try_from(checkpoint.meta.n_tokens).unwrap_or(u32::MAX);
        let duration = self.executor.copy_time(n_tokens);
        self.restores
            .captures
            .send(self.time.now, duration, request, checkpoint);
        true
    }

    /// Puts the captures that reached the store by now into it, and logs the puts a store on its own thread
    /// refused since the last step.
    pub(crate) fn deliver_captures(&mut self) {
        while let Some((id, checkpoint)) = self.restores.captures.arrived(self.time.now) {
            let _stored = self.store_checkpoint(id, checkpoint);
        }
        for (id, error) in self.restores.store.take_put_failures() {
            self.log_put_failure(id, &error);
        }
    }

    /// Puts a captured checkpoint into the store; a store that cannot take it is counted and logged, never
    /// an error of the step. `true` when the store took it (or, on its own thread, queued it).
    pub(crate) fn store_checkpoint(&mut self, request: RequestId, checkpoint: Checkpoint) -> bool {
        match self.restores.store.put(request, checkpoint) {
            Ok(_outcome) => true,
            Err(error) => {
                self.log_put_failure(request, &error);
                false
            }
        }
    }

    /// Logs a put the store refused.
    fn log_put_failure(&self, request: RequestId, error: &checkpoint_transfer::Error) {
        match error {
            // The store could not write (disk full, read-only file system, permission; a Redis server
            // unreachable, slow or full; its thread gone): the engine goes on without this checkpoint;
            // `store_write_failures` counts it, the log says so rate-limited.
            checkpoint_transfer::Error::Write { .. }
            | checkpoint_transfer::Error::Io { .. }
            | checkpoint_transfer::Error::Remote { .. }
            | checkpoint_transfer::Error::StoreUnavailable { .. } => {
                let n_failures = self.restores.store.stats().n_write_failures;
                if n_failures <= 1 || n_failures.is_multiple_of(STORE_WRITE_FAILURES_PER_WARNING) {
                    tracing::warn!(
                        request = %request,
                        %error,
                        n_failures,
                        "checkpoint not stored: the store cannot write (logged for the first failure and \
                         every {STORE_WRITE_FAILURES_PER_WARNING}th)"
                    );
                }
            }
            // A capture too large for the store, or an older generation: nothing to restore later.
            _ => tracing::debug!(request = %request, %error, "checkpoint not stored"),
        }
    }

    /// E3: checks that every page of `request`'s published import of `tokens` tokens (`GroupCoordinator::
    /// import_slots`: its blocks from `first_block` on, or at an exact boundary the whole checkpoint, partial
    /// and fixed pages included) holds what recomputing its prefix writes, on every rank.
    pub(crate) fn verify_import(
        &mut self,
        request: RequestId,
        first_block: u32,
        tokens: u32,
    ) -> Result<()> {
        if !self.params.verify_restores {
            return Ok(());
        }
        let dest = self.verified_import_pages(request)?;
        self.verify_pages(request, first_block, tokens, &dest)
    }

    /// E3 for a local hybrid hit (H9): checks that every page of the snapshot `pages` at boundary `tokens`
    /// that `request` is admitted on holds what recomputing its prefix writes, on every rank, as a restore's.
    pub(crate) fn verify_local_hit(
        &mut self,
        request: RequestId,
        pages: &[PageId],
        tokens: u32,
    ) -> Result<()> {
        if !self.params.verify_restores {
            return Ok(());
        }
        self.verify_pages(request, 0, tokens, pages)
    }

    /// Checks `dest`, the pages of an import of `tokens` tokens from block `first_block` on
    /// (`GroupCoordinator::import_slots` order), against what recompute writes.
    fn verify_pages(
        &mut self,
        request: RequestId,
        first_block: u32,
        tokens: u32,
        dest: &[PageId],
    ) -> Result<()> {
        // Recompute reads the restored prefix's tokens.
        self.materialize(request)?;
        if self.executor.writes_pages() {
            return self.verify_by_recompute(request, first_block, tokens, dest);
        }
        let block_tokens = self.params.geometry.block_tokens();
        let req = &self.table.get(request)?;
        let boundary = self.groups.import_boundary(
            req.tokens.get(request)?,
            &req.keys,
            &req.spec.salt,
            first_block,
            tokens,
            block_tokens,
        );
        if boundary.slots.len() != dest.len() {
            return Err(Error::internal(format!(
                "{request}: an import of {} pages for a boundary of {} pages",
                dest.len(),
                boundary.slots.len()
            )));
        }
        let mut expected = vec![0u8; self.scratch.page_buf.len()];
        for (slot_idx, &page) in dest.iter().enumerate() {
            for rank in 0..self.storage.n_ranks() {
                let write = boundary.write(slot_idx, rank, page);
                self.executor.fill_page(&write, &mut expected);
                self.storage.read(rank, page, &mut self.scratch.page_buf)?;
                if let Some(byte) = self
                    .scratch
                    .page_buf
                    .iter()
                    .zip(&expected)
                    .position(|(a, b)| a != b)
                {
                    return Err(Error::RestoreMismatch {
                        request,
                        block: first_block + slot_idx as u32,
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

    /// The pages of `request`'s import being verified (E3), as the index holds them.
    pub(crate) fn verified_import_pages(&self, request: RequestId) -> Result<Vec<PageId>> {
        self.restores
            .index
            .pages(request)
            .map(<[PageId]>::to_vec)
            .ok_or_else(|| {
                Error::internal(format!("{request}: verifying an import the index lacks"))
            })
    }

    /// The keys a pages-only import published for hybrid `request` is found again under, slot by slot: a full
    /// block's own key, the slot key of every other page (`key_unkeyed_slots`).
    pub(crate) fn published_slot_keys(
        &self,
        request: RequestId,
        tokens: u32,
    ) -> Result<Vec<BlockKey>> {
        let block_tokens = self.params.geometry.block_tokens();
        let req = &self.table.get(request)?;
        let boundary = self.groups.boundary(
            req.tokens.get(request)?,
            &req.keys,
            &req.spec.salt,
            tokens,
            block_tokens,
        );
        let exact = boundary.exact;
        Ok(boundary
            .slots
            .iter()
            .enumerate()
            .map(|(slot_idx, slot)| match slot.key_idx {
                Some(key_idx) => req.keys[key_idx as usize],
                None => super::groups::slot_key(exact, slot_idx),
            })
            .collect())
    }

    /// Registers the unkeyed pages (partial last page, state) of the pages-only import `published` of hybrid
    /// `request` at boundary `tokens` under their slot keys, so that once the index lets go of them they are cached
    /// pages like its blocks: found again at admission unless evicted first.
    pub(crate) fn key_unkeyed_slots(
        &mut self,
        request: RequestId,
        published: &[PageId],
        tokens: u32,
    ) -> Result<()> {
        let keys = self.published_slot_keys(request, tokens)?;
        let slots = self
            .groups
            .slots(tokens, self.params.geometry.block_tokens());
        for (((slot, _block), key), &page) in slots.iter().zip(keys).zip(published) {
            if slot.key_idx.is_none() {
                // `false`: a page of an earlier publication of the same boundary holds the key; ours is freed.
                let _registered = self.pool.cache_block(page, key)?;
            }
        }
        Ok(())
    }

    /// Frees `request`'s pages (cached blocks stay findable until evicted) and resets its progress.
    pub(crate) fn free_request_pages(&mut self, request: RequestId) -> Result<()> {
        self.register_blocks(request)?;
        let req = self.table.get_mut(request)?;
        let mut pages = std::mem::take(&mut req.pages);
        pages.append(&mut req.fixed);
        for table in std::mem::take(&mut req.windows) {
            pages.extend(table.into_iter().filter(|page| !page.is_null()));
        }
        req.window_credit_pages.clear();
        req.forget_copy(0);
        req.n_registered = 0;
        self.pool.free_all(&pages)?;
        Ok(())
    }

    /// The part of `stored` an import of its first `tokens` tokens from block `first_block` on copies into
    /// the pool and publishes (`GroupCoordinator::import_part`).
    pub(crate) fn checkpoint_part(
        &self,
        stored: &Checkpoint,
        first_block: u32,
        tokens: u32,
    ) -> Result<Checkpoint> {
        let block_tokens = self.params.geometry.block_tokens();
        self.groups
            .import_part(stored, first_block, tokens, block_tokens)
    }
}

/// A request's block table, windowed tables and fixed pages.
pub(crate) type CheckpointTables = (Vec<PageId>, Vec<Vec<PageId>>, Vec<PageId>);

/// A request's tables as allocation sees them (its own, or those a restore would give it).
#[derive(Debug)]
pub(crate) struct Held<'a> {
    /// The block table.
    pub(crate) pages: &'a [PageId],
    /// The windowed tables.
    pub(crate) windows: &'a [Vec<PageId>],
    /// Fixed pages held.
    pub(crate) fixed_len: usize,
    /// Tokens computed (or restored).
    pub(crate) n_computed: u32,
    /// Whether the partial last pages and fixed pages came from a checkpoint.
    pub(crate) copy_on_write: bool,
    /// Whether a draft replay still needs its replay page.
    pub(crate) replay_page: bool,
}

impl Held<'_> {
    /// The pages the next allocation copies on write, in the order it takes them: the imported partial last
    /// page of the block table and of every windowed table holding it and the imported fixed pages (C3, H6),
    /// then a pending draft replay's page: the last full page of every attention table (H5).
    fn copied_on_write(&self, block_tokens: u32) -> Vec<CopySlot> {
        let mut slots = Vec::new();
        if !self.copy_on_write && !self.replay_page {
            return slots;
        }
        let at_block = |block: usize, slots: &mut Vec<CopySlot>| {
            if block < self.pages.len() {
                slots.push(CopySlot::Block(block));
            }
            for (window, table) in self.windows.iter().enumerate() {
                if table.len() == self.pages.len()
                    && table.get(block).is_some_and(|page| !page.is_null())
                {
                    slots.push(CopySlot::Window { window, block });
                }
            }
        };
        let n = self.n_computed;
        if self.copy_on_write {
            if !n.is_multiple_of(block_tokens) {
                at_block((n / block_tokens) as usize, &mut slots);
            }
            slots.extend((0..self.fixed_len).map(CopySlot::Fixed));
        }
        if self.replay_page
            && let Some(last) = ((n / block_tokens) as usize).checked_sub(1)
        {
            at_block(last, &mut slots);
        }
        slots
    }
}

/// A page of a request's tables: the next allocation copies it on write (`Held::copied_on_write`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CopySlot {
    /// A block of the block table.
    Block(usize),
    /// Block `block` of windowed table `window`.
    Window {
        /// The windowed table.
        window: usize,
        /// The block.
        block: usize,
    },
    /// A fixed page, by its index.
    Fixed(usize),
}
