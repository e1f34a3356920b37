//! `EngineParams`: everything an engine is built from, a plain struct with documented defaults.

use std::time::Duration;

use kv_pool::{CacheGroup, Geometry, GroupKind, HostStorage, PagePool};

use crate::error::{Error, Result};
use crate::policy::Policy;

pub(crate) mod cost;
pub use cost::CostModel;

/// The default latency of a store lookup: 200 us, the round trip Redis's documentation gives as typical of a
/// 1 Gbit/s network ("Diagnosing latency issues", section "Latency induced by network and communication":
/// "the typical latency of a 1 Gbit/s network is about 200 us, while the latency with a Unix domain socket
/// can be as low as 30 us"). The checkpoint store is external to the engine; the embedded host store stands
/// in for one across the network.
pub const LOOKUP_LATENCY_DEFAULT: Duration = Duration::from_micros(200);

/// The default budget of local hybrid snapshots (`EngineParams::state_snapshot_pages`): 512 pages, an eighth
/// of the default pool. Snapshot pages are free cached pages like any other, evicted as the pool needs pages:
/// the budget bounds what snapshots keep, never what a request can allocate.
pub const STATE_SNAPSHOT_PAGES_DEFAULT: u32 = 512;

/// Which copy engine the engine opens to move a restore's pages into page storage (L1). A device's own copy
/// engine (CUDA streams) is opened by its caller with the device storage and given to `Builder::page_storage`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CopyEngineKind {
    /// Modeled time on the engine clock: deterministic, with fault injection. The default.
    #[default]
    Inline,
    /// Worker threads doing real memcpy into page storage while steps go on; completions are polled every
    /// step, and a step with nothing else to run waits for the copies in flight. On the simulated clock a
    /// copy lasts as many steps as it takes in real time, so its modeled duration depends on the machine and
    /// on load: this exercises real concurrency; figures come from the inline engine until the wall clock
    /// exists (issue 11).
    Threaded {
        /// Worker threads (1 to 64).
        workers: u32,
    },
    /// Threaded copies behind a seeded adversary (`checkpoint_transfer::ReorderingCopyEngine`), for tests of
    /// L2: each job starts and reports its completion a number of polls after its submission drawn from
    /// `seed`, out of submission order; a cancelled job may still write all its pages; failures can be
    /// injected. It checks that nobody else writes a page while a copy owns it, and `Engine::check_invariants`
    /// fails on any such write.
    Reordering {
        /// Worker threads (1 to 64).
        workers: u32,
        /// The seed of the delays and the order.
        seed: u64,
    },
}

/// What a running request preempted for pages (Q6) leaves behind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Preemption {
    /// Its KV is dropped (its full blocks stay in the prefix cache until evicted) and it computes again
    /// what the cache and its earlier checkpoints no longer hold.
    Recompute,
    /// Its computed KV is first captured to the checkpoint store when copying it out and back costs less
    /// than recomputing it (`Executor::recompute_time` against `Executor::copy_time` twice plus the lookup
    /// latency); it then comes back through the restore path of its policy. The default.
    #[default]
    Offload,
}

impl Preemption {
    /// Both, in the order the command line lists them.
    pub const ALL: [Preemption; 2] = [Preemption::Offload, Preemption::Recompute];

    /// Its name in configs and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Preemption::Recompute => "recompute",
            Preemption::Offload => "offload",
        }
    }
}

impl std::str::FromStr for Preemption {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        Preemption::ALL
            .into_iter()
            .find(|kind| kind.name() == name)
            .ok_or_else(|| Error::InvalidParam {
                name: "preemption",
                reason: format!("unknown preemption {name:?}; use offload or recompute"),
            })
    }
}

/// Which clock the engine runs on (L1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ClockKind {
    /// Time advances by each step's duration and jumps to the next event when nothing runs: deterministic
    /// with the simulated executor. The default.
    #[default]
    Simulated,
    /// Time is the wall clock's: copies run while steps run, an idle step waits (at most
    /// `WALL_IDLE_WAIT`) instead of jumping, arrivals come at their wall time.
    Wall,
}

/// Everything an engine is built from. `EngineParams::default()` is a small single-GPU setup.
#[derive(Clone, Debug)]
pub struct EngineParams {
    /// Cache groups, page width and model length. Default: one full-attention group, 16 tokens per page,
    /// `kv_bytes_per_token * 16` bytes per page, context parallelism 1, 131 072 tokens.
    pub geometry: Geometry,
    /// Pages in the pool, the null page included. Default 4096. Ignored by `Policy::Oracle` (unbounded).
    pub n_pages: u32,
    /// Running slots. Default 64.
    pub max_running: u32,
    /// Token budget of one step (prefill chunks plus decode tokens). Default 2048.
    pub max_batched_tokens: u32,
    /// Largest prefill chunk of one request in one step. Default 512.
    pub chunk_tokens: u32,
    /// Draft (speculative) lookahead tokens per decode step; 0 disables draft decoding. Default 0.
    pub draft_tokens: u32,
    /// The model's end-of-turn token: an answer whose executor samples it ends there, as at its cap, and
    /// leaves its response checkpoint (E2). Default `None`: only the cap and `RequestSpec::stop_after` end
    /// an answer.
    pub stop_token: Option<u32>,
    /// Probability that a draft token is accepted given that the one before it was (the usual
    /// speculative-decoding analysis: a decode step then yields `(1 - a^(k+1)) / (1 - a)` tokens on average,
    /// between 1 and `1 + draft_tokens`). Which drafts a step accepts is drawn from a hash of `seed`, the
    /// request and the position (`accepted_drafts`), so a request's outcome never depends on its batch. It
    /// applies where the engine draws the tokens (the simulated executor); an executor that samples its own
    /// tokens (the reference model, which has no draft head) yields one token a step. From 0 to 1; default 0
    /// (every draft rejected).
    pub draft_acceptance: f64,
    /// The policy switch. Default `Reserved`.
    pub policy: Policy,
    /// Bounded wait of a restore (W1). Default 60 s; 0 = recompute at once.
    pub restore_max_wait: Duration,
    /// Time a store lookup may stay unanswered before the restore recomputes (G2). Default 60 s.
    pub lookup_timeout: Duration,
    /// Latency of a store lookup on the engine clock. Default `LOOKUP_LATENCY_DEFAULT` (200 us: a store on
    /// the other end of a 1 Gbit/s network); 0 answers within the step.
    pub lookup_latency: Duration,
    /// Copy tasks in flight at most (G2). Default 32.
    pub copy_task_limit: u32,
    /// Admission watermark in pages, applied to new admissions only while other work is scheduled (R2).
    /// Default 0.
    pub watermark_pages: u32,
    /// Checkpoint store capacity in pages (each checkpoint costs one page per full block). Default 1 Mi pages.
    pub store_capacity_pages: u64,
    /// Bytes each page really holds, on every rank: with the simulated executor the fingerprint it writes and
    /// restores copy (its cost model uses the model's real KV bytes); an executor with pages of its own size (a
    /// real model, `Executor::bytes_per_page`) sets it at build. Default 32.
    pub page_bytes: u32,
    /// The step-time cost model. Default `CostModel::small_8b_gpu()`.
    pub cost: CostModel,
    /// Verify every restored page against what recompute would write (E3, L5). Default: on in debug builds
    /// and in the crate's own tests; integration tests turn it on explicitly.
    pub verify_restores: bool,
    /// Seed of the run (fault injection and anything random in the engine). Default 0.
    pub seed: u64,
    /// The copy engine (L1). Default `Inline`.
    pub copy_engine: CopyEngineKind,
    /// Whether a prompt computed in several chunks publishes a checkpoint where its last chunk starts (the
    /// prefill-tail slot, H7). Default false: the instruction slot (`RequestSpec::instruction_tokens`), the
    /// prompt end and the response end are captured always.
    pub capture_prefill_tail: bool,
    /// Pool pages the local snapshots of a hybrid model may hold (H9, H10): when a hybrid request finishes,
    /// its pages at its exact boundary stay findable in the prefix cache (its windows' live blocks as cached
    /// blocks, its partial last pages and its state as the snapshot's own), so that a later turn of the
    /// session gets a local hit; past this many pages of their own, the oldest snapshots lose them. 0 turns
    /// local hybrid hits off; full attention ignores it. At most `N_PAGES_MAX`. Default
    /// `STATE_SNAPSHOT_PAGES_DEFAULT`.
    pub state_snapshot_pages: u32,
    /// The clock (L1). Default `Simulated`.
    pub clock: ClockKind,
    /// What a preemption leaves behind (Q6). Default `Offload`.
    pub preemption: Preemption,
    /// The liveness watchdog (K3): when live requests exist and none produced a token or ended for this long
    /// on the engine clock, or for `STALL_STEPS_MAX` steps, `Engine::step` fails with `Error::Stalled`
    /// naming the stuck requests. Default 1 hour.
    pub stall_timeout: Duration,
}

impl Default for EngineParams {
    fn default() -> Self {
        let cost = CostModel::small_8b_gpu();
        let tokens_per_page = 16;
        let geometry = Geometry::new(
            vec![CacheGroup {
                kind: GroupKind::Full,
                bytes_per_page: cost.kv_bytes_per_token * u64::from(tokens_per_page),
            }],
            tokens_per_page,
            1,
            131_072,
        )
        .expect("the default geometry is valid");
        EngineParams {
            geometry,
            n_pages: 4096,
            max_running: 64,
            max_batched_tokens: 2048,
            chunk_tokens: 512,
            draft_tokens: 0,
            stop_token: None,
            draft_acceptance: 0.0,
            policy: Policy::Reserved,
            restore_max_wait: Duration::from_secs(60),
            lookup_timeout: Duration::from_secs(60),
            lookup_latency: LOOKUP_LATENCY_DEFAULT,
            copy_task_limit: 32,
            watermark_pages: 0,
            store_capacity_pages: 1 << 20,
            page_bytes: 32,
            cost,
            verify_restores: cfg!(any(debug_assertions, test)),
            seed: 0,
            stall_timeout: Duration::from_secs(3600),
            capture_prefill_tail: false,
            state_snapshot_pages: STATE_SNAPSHOT_PAGES_DEFAULT,
            copy_engine: CopyEngineKind::Inline,
            clock: ClockKind::Simulated,
            preemption: Preemption::Offload,
        }
    }
}

impl EngineParams {
    /// Pages of a pool at most, the null page included: 4 Mi pages (64 Mi tokens of 16-token pages, far above
    /// any GPU's KV cache). Every page costs the pool and the page storage some bytes of bookkeeping.
    pub const N_PAGES_MAX: u32 = 1 << 22;
    /// Bytes each page holds at most (`page_bytes`): 1 MiB.
    pub const PAGE_BYTES_MAX: u32 = 1 << 20;
    /// Bytes of page storage of one engine at most: the pool's pages (`pool_pages`, so the
    /// oracle's larger pool counts) times its ranks times `page_bytes`, 1 GiB. Host storage allocates
    /// pages as they are first written, so this bounds what a run that touches every page holds.
    pub const STORAGE_BYTES_MAX: u64 = 1 << 30;
    /// Bytes of pool memory every engine of a process may take together, at most (`pool_memory_bytes`:
    /// page storage as host storage allocates it, and the pool's per-page bookkeeping), counted as if every
    /// page were touched, though pools and host storage allocate only the pages their requests touch: 8 GiB.
    /// The largest engine `validate` allows under each of the four policies side by side fits, and so do the
    /// four policies' default pools on 64 engines (4.9 GiB, the oracle's 524 353-page pools nearly all of
    /// it); 64 engines of 4 Mi pages (40 GiB a policy) do not. `validate` checks an engine alone; a caller
    /// that builds several at once (a cluster, policies side by side) checks their sum against it.
    pub const POOL_MEMORY_BYTES_MAX: u64 = 8 << 30;

    /// Pages the engine's pool holds, the null page included: `n_pages`, except under `Policy::Oracle`, whose
    /// pool has room for every running slot at the model's length (at least `n_pages`, at most 1 Mi pages).
    pub fn pool_pages(&self) -> u32 {
        match self.policy {
            Policy::Oracle => {
                let block_tokens = self.geometry.block_tokens().max(1);
                let per_request = self.geometry.max_model_len().div_ceil(block_tokens) + 1;
                self.n_pages
                    .max(
                        per_request
                            .saturating_mul(self.max_running)
                            .saturating_add(1),
                    )
                    .min(1 << 20)
            }
            _ => self.n_pages,
        }
    }

    /// Bytes of page storage the engine holds once every page is written:
    /// `pool_pages() * context_parallel * page_bytes` (one shard per rank).
    pub fn storage_bytes(&self) -> u64 {
        u64::from(self.pool_pages())
            * u64::from(self.geometry.context_parallel())
            * u64::from(self.page_bytes)
    }

    /// The checkpoint store's capacity in payload bytes: `store_capacity_pages` pages of `page_bytes`.
    pub fn store_capacity_bytes(&self) -> u64 {
        self.store_capacity_pages
            .saturating_mul(u64::from(self.page_bytes))
    }

    /// Bytes of host memory the engine's pool and page storage take at most, when every page has been
    /// handed out and written: per page, the pool's bookkeeping
    /// (`kv_pool::PagePool::BOOKKEEPING_BYTES_PER_PAGE_MAX`) and what each rank's shard of host storage
    /// allocates for it (`kv_pool::HostStorage::allocated_bytes_per_page`: a 64-byte line for a page of at
    /// most 64 bytes, else its buffer and lock). Page storage given to `Builder::page_storage` (a device's)
    /// is counted as host storage would be: an upper bound.
    pub fn pool_memory_bytes(&self) -> u64 {
        let storage_per_page = u64::from(self.geometry.context_parallel())
            * HostStorage::allocated_bytes_per_page(self.page_bytes as usize) as u64;
        u64::from(self.pool_pages()) * (PagePool::BOOKKEEPING_BYTES_PER_PAGE_MAX + storage_per_page)
    }

    /// One full-attention group of `tokens_per_page` tokens per page sized from `cost`, `max_model_len` tokens.
    pub fn full_attention_geometry(
        cost: &CostModel,
        tokens_per_page: u32,
        max_model_len: u32,
    ) -> Result<Geometry> {
        Geometry::new(
            vec![CacheGroup {
                kind: GroupKind::Full,
                bytes_per_page: cost.kv_bytes_per_token * u64::from(tokens_per_page.max(1)),
            }],
            tokens_per_page,
            1,
            max_model_len,
        )
        .map_err(|error| Error::InvalidParam {
            name: "geometry",
            reason: error.to_string(),
        })
    }

    /// Checks every field's range; the error names the field and what is allowed.
    pub fn validate(&self) -> Result<()> {
        let invalid = |name: &'static str, reason: &str| {
            Err(Error::InvalidParam {
                name,
                reason: reason.to_owned(),
            })
        };
        if self.n_pages < 2 {
            return invalid("n_pages", "at least 2 (the null page and one usable page)");
        }
        if self.n_pages > Self::N_PAGES_MAX {
            return invalid(
                "n_pages",
                &format!(
                    "{} is above the limit of {} pages; use a smaller pool",
                    self.n_pages,
                    Self::N_PAGES_MAX
                ),
            );
        }
        if self.max_running == 0 {
            return invalid("max_running", "at least 1");
        }
        if let Err((field, reason)) = self.cost.check() {
            return invalid(field, &reason);
        }
        if self.max_batched_tokens == 0 {
            return invalid("max_batched_tokens", "at least 1");
        }
        if self.chunk_tokens == 0 {
            return invalid("chunk_tokens", "at least 1");
        }
        if let CopyEngineKind::Threaded { workers } | CopyEngineKind::Reordering { workers, .. } =
            self.copy_engine
            && !(1..=64).contains(&workers)
        {
            return invalid("copy_engine", "threaded with 1 to 64 workers");
        }
        if self.stall_timeout.is_zero() {
            return invalid("stall_timeout", "more than 0 s");
        }
        if self.state_snapshot_pages > Self::N_PAGES_MAX {
            return invalid(
                "state_snapshot_pages",
                &format!(
                    "{} is above the limit of {} pages",
                    self.state_snapshot_pages,
                    Self::N_PAGES_MAX
                ),
            );
        }
        if self.copy_task_limit == 0 {
            return invalid("copy_task_limit", "at least 1");
        }
        if self.page_bytes == 0 {
            return invalid("page_bytes", "at least 1");
        }
        if self.page_bytes > Self::PAGE_BYTES_MAX {
            return invalid(
                "page_bytes",
                &format!(
                    "{} is above the limit of {} bytes",
                    self.page_bytes,
                    Self::PAGE_BYTES_MAX
                ),
            );
        }
        self.check_memory()?;
        self.check_drafts()?;
        check_geometry_runs(&self.geometry)?;
        Ok(())
    }
}

impl EngineParams {
    /// Refuses a draft depth that fills the step's token budget and an acceptance that is not a probability
    /// (NaN included).
    fn check_drafts(&self) -> Result<()> {
        let invalid =
            |name: &'static str, reason: String| Err(Error::InvalidParam { name, reason });
        if self.draft_tokens >= self.max_batched_tokens {
            return invalid("draft_tokens", "smaller than max_batched_tokens".to_owned());
        }
        if !(0.0..=1.0).contains(&self.draft_acceptance) {
            return invalid(
                "draft_acceptance",
                format!("{} is not a probability from 0 to 1", self.draft_acceptance),
            );
        }
        Ok(())
    }

    /// Refuses page storage above `STORAGE_BYTES_MAX` and pool memory above `POOL_MEMORY_BYTES_MAX`.
    fn check_memory(&self) -> Result<()> {
        let ranks = self.geometry.context_parallel();
        // One rank says nothing of ranks, as before ranks counted.
        let (on_ranks, what) = if ranks > 1 {
            (
                format!(" on {ranks} ranks"),
                "fewer pages, ranks or bytes per page",
            )
        } else {
            (String::new(), "fewer pages or fewer bytes per page")
        };
        let pages = self.pool_pages();
        let bytes_per_page = self.page_bytes;
        if self.storage_bytes() > Self::STORAGE_BYTES_MAX {
            return Err(Error::InvalidParam {
                name: "page_bytes",
                reason: format!(
                    "{pages} pages of {bytes_per_page} bytes{on_ranks} make {} bytes of page storage, above \
                     the limit of {} bytes; use {what}",
                    self.storage_bytes(),
                    Self::STORAGE_BYTES_MAX
                ),
            });
        }
        if self.pool_memory_bytes() > Self::POOL_MEMORY_BYTES_MAX {
            return Err(Error::InvalidParam {
                name: "n_pages",
                reason: format!(
                    "{pages} pages of {bytes_per_page} bytes{on_ranks} take up to {} bytes of page storage \
                     and bookkeeping, above the limit of {} bytes; use {what}",
                    self.pool_memory_bytes(),
                    Self::POOL_MEMORY_BYTES_MAX
                ),
            });
        }
        Ok(())
    }
}

/// H1's refusal: names the first cache group the step loop cannot run and why. The step loop keeps one block
/// table, so a geometry needs exactly one full-attention group (`GroupCoordinator::new` relies on it).
pub(crate) fn check_geometry_runs(geometry: &Geometry) -> Result<()> {
    let mut full = geometry
        .groups()
        .iter()
        .enumerate()
        .filter(|(_, group)| group.kind == GroupKind::Full);
    if full.next().is_none() {
        return Err(Error::UnsupportedGeometry {
            reason:
                "no cache group is full attention: the step loop needs one for the block table \
                     (add a full-attention group)"
                    .to_owned(),
        });
    }
    if let Some((idx, _)) = full.next() {
        return Err(Error::UnsupportedGeometry {
            reason: format!(
                "cache group {idx} is a second full-attention group: the step loop keeps one block table; \
                 give the layers of both one group"
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
