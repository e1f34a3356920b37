//! A live request inside the engine: its tokens and block keys, its page table, where it is in the request
//! state machine, and its metrics.
use std::sync::Arc;

use checkpoint_transfer::{CheckpointMeta, ImportId, RankPages};
use kv_pool::{AdmissionOrder, Timestamp};
use kv_pool::{BlockKey, PageId};

use crate::error::{Error, Result};
use crate::metrics::{FallbackReason, RequestMetrics};
use crate::request::{OUTPUT_TOKEN_TAIL, RequestSpec, output_token_state};

use crate::engine::tokens::Tokens;

/// Position of a request in the waiting order: higher `RequestSpec::priority` first, then arrival.
pub(crate) fn admission_order(priority: i32, seq: u64) -> AdmissionOrder {
    AdmissionOrder {
        priority: (i64::from(i32::MAX) - i64::from(priority)) as u32,
        seq,
    }
}

use super::RequestPhase;
use crate::engine::restore_policy::TicketHandle;

/// Where a request is in its lifecycle, with the data that belongs to that phase alone; `kind` is the public
/// `RequestPhase`. Each phase names the one container that holds it (`table.rs` draws the edges and maps it
/// onto the ledger's and the index's states).
#[derive(Debug)]
pub(crate) enum Phase {
    Arriving,
    Waiting {
        /// The pages-only import published for it (unowned), to count restored hits at admission.
        published: Option<Published>,
    },
    Restoring {
        /// Its capacity wait, from its first reservation refused for pressure until it reserves or gives up.
        wait: Option<CapacityWait>,
    },
    Ready,
    Running {
        /// An `ordinary` restore copying into its pages: it is not scheduled until then.
        loading: Option<Loading>,
    },
    Paused,
    Resuming,
}

impl Phase {
    /// The phase without its data, as reported and traced.
    pub(crate) fn kind(&self) -> RequestPhase {
        match self {
            Phase::Arriving => RequestPhase::Arriving,
            Phase::Waiting { .. } => RequestPhase::Waiting,
            Phase::Restoring { .. } => RequestPhase::Restoring,
            Phase::Ready => RequestPhase::Ready,
            Phase::Running { .. } => RequestPhase::Running,
            Phase::Paused => RequestPhase::Paused,
            Phase::Resuming => RequestPhase::Resuming,
        }
    }
}

/// The pages a pages-only import published for a waiting request: evictable cached pages, found again at
/// admission unless evicted first.
#[derive(Debug)]
pub(crate) struct Published {
    /// The import's pages (block table, then a hybrid import's window and fixed pages).
    pub(crate) pages: Vec<PageId>,
    /// Tokens the import restores (a hybrid import's exact boundary).
    pub(crate) tokens: u32,
}

/// A capacity wait (G5): when it started, and when it was last logged.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CapacityWait {
    pub(crate) started: Timestamp,
    pub(crate) logged: Timestamp,
}

/// What the coordinator knows about a request's restore.
#[derive(Clone, Debug, Default)]
pub(crate) enum Restore {
    /// No restore in progress.
    #[default]
    Idle,
    /// A lookup was sent at `sent`; it is answered at `answer_at` (G2).
    Lookup {
        /// When it was sent.
        sent: Timestamp,
        /// When the store answers.
        answer_at: Timestamp,
        /// Only checkpoints shorter than this many tokens qualify (a retry after a failed copy, O7).
        limit_tokens: u32,
    },
    /// Answered: restore the first `tokens` tokens of `checkpoint` (whole blocks of an attention-only
    /// checkpoint, or a hybrid checkpoint's exact boundary).
    Answered {
        /// The checkpoint selected.
        checkpoint: Arc<CheckpointMeta>,
        /// Tokens to restore in all (local ones included).
        tokens: u32,
        /// When the answer came (for the G4 refresh).
        answered: Timestamp,
        /// Its last reservation was refused for pressure: what that refusal depended on (a poll skips the
        /// reservation while it would be refused again, Q8).
        refused: Option<Refused>,
    },
    /// An import of the first `tokens` tokens is copying or published.
    Importing {
        /// Tokens restored in all.
        tokens: u32,
        /// The import in the resident index.
        import: ImportId,
    },
}

/// A capacity waiter's last refusal for pressure. Nothing else decides the next answer while the request's
/// prompt is unchanged and nothing time-driven is due: while its policy still refuses `need_pages` before
/// counting earlier waiters' holds, a poll would be refused again and change nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Refused {
    /// Pages the reservation needs (the import and its credits, or the import alone under `pages-only`).
    pub(crate) need_pages: u32,
    /// The request's length and prompt end the need was computed for.
    pub(crate) request_tokens: u32,
    pub(crate) prompt_end: u32,
    /// The first moment something time-driven is due: the wait's expiry (W1), the lookup's refresh (G4) or
    /// the next wait log (G5).
    pub(crate) until: Timestamp,
}

impl Restore {
    /// The state's name, for diagnostics.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Restore::Idle => "idle",
            Restore::Lookup { .. } => "lookup",
            Restore::Answered { .. } => "answered",
            Restore::Importing { .. } => "importing",
        }
    }
}

/// An `ordinary` restore admitted at once: its import copies into the request's pages from `first_block` on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Loading {
    /// The import in the resident index.
    pub(crate) import: ImportId,
    /// Block index of the import's first page (the local prefix hits come before it).
    pub(crate) first_block: u32,
    /// Tokens restored in all (local hits included).
    pub(crate) tokens: u32,
}

/// A live request.
#[derive(Debug)]
pub(crate) struct Req {
    /// The request as submitted, but for its prompt, which moved into `tokens` (a prompt is a request's largest
    /// allocation: it is held once).
    pub(crate) spec: RequestSpec,
    /// Prompt, then output tokens (and streamed inputs appended on resume); a deferred prompt is generated
    /// when first read (`Engine::materialize`).
    pub(crate) tokens: Tokens,
    /// Length of the prompt as submitted: `tokens[..submitted_prompt_len]` is `RequestSpec::prompt`.
    pub(crate) submitted_prompt_len: u32,
    /// End of the current prompt (grows when a streaming session resumes).
    pub(crate) prompt_end: u32,
    /// Keys of every full block of `tokens` (`Geometry::block_tokens` tokens each: one page on every rank).
    pub(crate) keys: Vec<BlockKey>,
    /// Pages of the recurrent and auxiliary groups (`GroupCoordinator::slots` order): empty until the request
    /// first computes or is restored.
    pub(crate) fixed: Vec<PageId>,
    /// One table per windowed group (`GroupCoordinator::window_group` order), block-indexed like `pages`: the
    /// null page before the live window (those pages went back to the pool, H3).
    pub(crate) windows: Vec<Vec<PageId>>,
    /// Window pages it holds that were drawn from its ticket's credits: when they leave the window the
    /// credits come back (C4).
    pub(crate) window_credit_pages: Vec<PageId>,
    /// Whether the partial last page and the fixed pages came from a checkpoint (an import or a published
    /// pages-only import): the first allocation copies them on write into pages of its own (C3, H6).
    pub(crate) copy_on_write: bool,
    /// Tokens the draft model still replays after a restore whose checkpoint carried no draft state (H5),
    /// charged to its next computed step.
    pub(crate) draft_replay_tokens: u32,
    /// Whether that replay still needs its replay page: a copy on write of the last full page of every
    /// attention table, which the draft model writes into.
    pub(crate) replay_page: bool,
    /// Page table: page `i` holds tokens `[i * block_tokens, (i + 1) * block_tokens)`, on every rank the
    /// tokens of that block the rank holds.
    pub(crate) pages: Vec<PageId>,
    /// Tokens whose KV is written.
    pub(crate) n_computed: u32,
    /// Full blocks registered in the prefix index.
    pub(crate) n_registered: u32,
    /// Output tokens produced in the current answer (reset on resume).
    pub(crate) answer_tokens: u32,
    /// Output length cap of the current answer.
    pub(crate) answer_cap: u32,
    pub(crate) output: Vec<u32>,
    /// Its phase: written by `RequestTable::move_to` alone, with the container it names (`pub(super)`: the
    /// table is this module's parent); read elsewhere through `phase()` and the phase data's accessors.
    pub(super) phase: Phase,
    pub(crate) restore: Restore,
    /// Its reservation ticket, from the reservation until the ticket ends (released, or its prompt computed,
    /// C6): restoring, ready, then running on its credits. Only the lifecycle's edges and `after_compute` take
    /// it out, to end it.
    pub(crate) ticket: Option<TicketHandle>,
    pub(crate) order: AdmissionOrder,
    /// Its key in the arriving queue: arrival time (never before its submission) and sequence.
    pub(crate) arrival_key: (Timestamp, u64),
    /// Lookups sent (G2/O7: at most four).
    pub(crate) lookups: u32,
    /// Whether the request was admitted once.
    pub(crate) admitted_once: bool,
    /// Tokens it had computed when last preempted, not yet accounted: its next admission says how many came
    /// back from the prefix cache, from the store, or are computed again.
    pub(crate) preempted_tokens: u32,
    /// Whether a copy of its restore failed (O7): a retry that finds nothing falls back as `copy_failed`.
    pub(crate) copy_failed: bool,
    /// Tokens found resident when the coordinator last decided no restore was needed (a complete local hit):
    /// whole blocks, or a hybrid snapshot's boundary (H9).
    pub(crate) expected_local_tokens: u32,
    /// `request::output_token_state` of its submitted prompt, once its first output token needed it
    /// (`Req::output_token_state`).
    output_token_state: Option<u64>,
    /// The pages of its last capture held in one buffer per rank, and how many: its next capture shares them
    /// (`RankPages::extending`) instead of reading them again.
    pub(crate) last_capture: Option<(usize, Vec<RankPages>)>,
    /// Whether the prompt-end checkpoint of the current prompt was captured.
    pub(crate) prompt_captured: bool,
    /// Whether the instruction and prefill-tail checkpoints were captured (H7).
    pub(crate) instruction_captured: bool,
    pub(crate) prefill_tail_captured: bool,
    /// Whether the answer stopped on the stop token.
    pub(crate) stopped: bool,
    pub(crate) metrics: RequestMetrics,
}

impl Req {
    /// Its phase's kind.
    pub(crate) fn phase(&self) -> RequestPhase {
        self.phase.kind()
    }

    /// A new request from its spec and its prompt's block keys (`RequestSpec::keyed`).
    pub(crate) fn new(
        spec: RequestSpec,
        keys: Vec<BlockKey>,
        tokens: Tokens,
        seq: u64,
        arrival: Timestamp,
    ) -> Req {
        let metrics = RequestMetrics {
            id: Some(spec.id),
            prompt_tokens: tokens.len() as u32,
            is_later_turn: spec.is_later_turn,
            arrival: spec.arrival,
            ..RequestMetrics::default()
        };
        Req {
            submitted_prompt_len: tokens.len() as u32,
            prompt_end: tokens.len() as u32,
            tokens,
            keys,
            pages: Vec::new(),
            fixed: Vec::new(),
            windows: Vec::new(),
            window_credit_pages: Vec::new(),
            copy_on_write: false,
            draft_replay_tokens: 0,
            replay_page: false,
            n_computed: 0,
            n_registered: 0,
            answer_tokens: 0,
            answer_cap: spec.max_output_tokens,
            output: Vec::new(),
            phase: Phase::Arriving,
            restore: Restore::Idle,
            ticket: None,
            order: admission_order(spec.priority, seq),
            arrival_key: (arrival, seq),
            lookups: 0,
            admitted_once: false,
            preempted_tokens: 0,
            copy_failed: false,
            last_capture: None,
            output_token_state: None,
            prompt_captured: false,
            instruction_captured: false,
            prefill_tail_captured: false,
            expected_local_tokens: 0,
            stopped: false,
            metrics,
            spec,
        }
    }

    /// Appends tokens, extending the block keys.
    pub(crate) fn push_tokens(&mut self, new_tokens: &[u32], block_tokens: u32) -> Result<()> {
        self.tokens.extend(new_tokens);
        // A deferred prompt holds its partial last block, so every unkeyed block is held.
        let (held, held_start) = self.tokens.held_part();
        if !BlockKey::extend_chain_from(
            &mut self.keys,
            held,
            held_start,
            block_tokens as usize,
            &self.spec.salt,
        ) {
            return Err(Error::internal(format!(
                "{}: its unkeyed blocks start before its held tokens (from {held_start})",
                self.spec.id
            )));
        }
        Ok(())
    }

    /// Its submitted prompt's share of every output token (`request::output_token_state`), hashed once: the
    /// submitted prompt never changes.
    pub(crate) fn output_token_state(&mut self) -> Result<u64> {
        if let Some(state) = self.output_token_state {
            return Ok(state);
        }
        let id = self.spec.id;
        let prompt_len = self.submitted_prompt_len as usize;
        let tail_start = prompt_len.saturating_sub(OUTPUT_TOKEN_TAIL);
        let tail = self
            .tokens
            .suffix(id, tail_start)?
            .get(..prompt_len - tail_start)
            .ok_or_else(|| Error::internal(format!("{id}: fewer tokens than its prompt")))?;
        let state = output_token_state(&self.spec.salt, prompt_len, tail);
        self.output_token_state = Some(state);
        Ok(state)
    }

    /// The ordinary restore copying into its pages, while it runs.
    pub(crate) fn loading(&self) -> Option<&Loading> {
        match &self.phase {
            Phase::Running { loading } => loading.as_ref(),
            _ => None,
        }
    }

    /// Its capacity wait, while it restores.
    pub(crate) fn capacity_wait(&self) -> Option<CapacityWait> {
        match &self.phase {
            Phase::Restoring { wait } => *wait,
            _ => None,
        }
    }

    /// The pages-only import published for it, while it waits.
    pub(crate) fn published(&self) -> Option<&Published> {
        match &self.phase {
            Phase::Waiting { published } => published.as_ref(),
            _ => None,
        }
    }

    /// Takes the ordinary restore copying into its pages (its copy landed, failed or was cancelled).
    pub(crate) fn take_loading(&mut self) -> Option<Loading> {
        let Phase::Running { loading } = &mut self.phase else {
            return None;
        };
        loading.take()
    }

    /// Its capacity wait, mutably: `Error::Internal` unless it restores (only a restoring request waits).
    pub(crate) fn capacity_wait_mut(&mut self) -> Result<&mut Option<CapacityWait>> {
        let id = self.spec.id;
        match &mut self.phase {
            Phase::Restoring { wait } => Ok(wait),
            phase => Err(Error::internal(format!(
                "{id} waits for capacity while {:?}",
                phase.kind()
            ))),
        }
    }

    /// Takes the pages-only import published for it (it is admitted).
    pub(crate) fn take_published(&mut self) -> Option<Published> {
        let Phase::Waiting { published } = &mut self.phase else {
            return None;
        };
        published.take()
    }

    /// Forgets what a restore's copy brought into its pages (the copy failed or was cancelled, or the pages
    /// are freed): no copy on write of them, no draft replay; it has computed `n_computed` tokens.
    pub(crate) fn forget_copy(&mut self, n_computed: u32) {
        self.copy_on_write = false;
        self.draft_replay_tokens = 0;
        self.replay_page = false;
        self.n_computed = n_computed;
    }

    /// Tokens `[first_pos, first_pos + n)` (fewer if the request holds fewer).
    pub(crate) fn tokens_at(&self, first_pos: u32, n: u32) -> Result<&[u32]> {
        let tokens = self.tokens.suffix(self.spec.id, first_pos as usize)?;
        Ok(&tokens[..(n as usize).min(tokens.len())])
    }

    /// The request's page tables, as an executor reads them (L3).
    pub(crate) fn page_tables(&self) -> crate::executor::PageTables<'_> {
        crate::executor::PageTables {
            block_table: &self.pages,
            windows: &self.windows,
            fixed: &self.fixed,
        }
    }

    /// Tokens still to compute before the next sample (1 in decode).
    pub(crate) fn n_to_compute(&self) -> u32 {
        self.tokens.len() as u32 - self.n_computed
    }

    /// Whether the request is still computing its prompt (more than the one pending token).
    pub(crate) fn in_prefill(&self) -> bool {
        self.n_computed < self.prompt_end
    }

    /// Records what this admission served from cache: the first `local_tokens` of the prompt from the local
    /// prefix cache and the next `restored_tokens` from a restore, capped at the prompt. What counts is what
    /// the request never computed: the admission that served the least, so a prefix recomputed after a
    /// preemption counts as recomputed, and a request restoring what it computed itself before a preemption
    /// does not count its own work as a cache hit. A restore that served it clears an earlier fallback.
    pub(crate) fn record_served(&mut self, local_tokens: u32, restored_tokens: u32) {
        self.account_preempted(local_tokens, restored_tokens);
        let prompt = self.metrics.prompt_tokens;
        let local = local_tokens.min(prompt);
        let restored = restored_tokens.min(prompt - local);
        let served_before =
            self.metrics.prompt_tokens_local_hit + self.metrics.prompt_tokens_restored;
        if self.admitted_once && local + restored >= served_before {
            return;
        }
        self.admitted_once = true;
        self.metrics.prompt_tokens_local_hit = local;
        self.metrics.prompt_tokens_restored = restored;
        self.metrics.restored = restored > 0;
        if self.metrics.restored {
            self.metrics.fallback = None;
        }
    }

    /// Splits what it computed before its last preemption by where this admission takes it from: the
    /// local prefix cache first, then the restore, the rest computed again.
    fn account_preempted(&mut self, local_tokens: u32, restored_tokens: u32) {
        let preempted = std::mem::take(&mut self.preempted_tokens);
        let local = local_tokens.min(preempted);
        let restored = restored_tokens.min(preempted - local);
        let metrics = &mut self.metrics;
        metrics.preempted_tokens_local_hit += local;
        metrics.preempted_tokens_restored += restored;
        metrics.preempted_tokens_recomputed += preempted - local - restored;
    }

    /// Records a restore fallback (the first reason wins). A store without a checkpoint for a request that is
    /// not a later turn (a session's first turn) is no fallback: nothing was there to restore.
    pub(crate) fn fall_back(&mut self, reason: FallbackReason) {
        let nothing_to_restore =
            reason == FallbackReason::NotInStore && !self.metrics.is_later_turn;
        if self.metrics.fallback.is_none() && !nothing_to_restore {
            self.metrics.fallback = Some(reason);
        }
    }
}
