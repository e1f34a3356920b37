//! Imports in flight: a checkpoint's pages copied into destination pages, published on completion by
//! registering their block keys (O1, O2), owned until the consumer acquires them (O3, O4), and released only
//! after every submitted copy drained (O5, O7). The destination pages' references belong either to the import
//! (`ordinary`, `pages-only`: allocated by the engine) or to the reservation ledger's ticket (`reserved`: the
//! ticket holds them, and the ledger's release / drain gives them back).

use std::collections::BTreeMap;
use std::sync::Arc;

use checkpoint_transfer::{CopyEngine, CopyJob, CopyJobId, CopyOutcome, CopyWork};
use kv_pool::{BlockKey, PageId, PagePool};
use reservation::{RequestId, Timestamp};

use crate::error::Result;

/// What polling the copies produced for one import.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ImportEvent {
    /// Published: its keys are registered; it still owns its pages.
    Published { import: u64, request: RequestId },
    /// A copy failed (O7): pages discarded after draining.
    Failed { import: u64, request: RequestId },
    /// A destination page was invalidated before publication (O2): discarded; look up again.
    Invalidated { import: u64, request: RequestId },
    /// A cancelled import's copy drained: its pages may be released.
    Drained { import: u64, request: RequestId },
}

#[derive(Debug, PartialEq, Eq)]
enum State {
    Copying,
    Published,
    /// Cancelled while copying: pages stay pinned until the copy drains.
    Draining,
}

#[derive(Debug)]
struct Import {
    request: RequestId,
    /// Destination pages (one ref each) and the key each publishes.
    dest: Vec<(PageId, BlockKey)>,
    /// Whether the import holds the destination pages' references (else the ledger's ticket does).
    owns_pages: bool,
    /// Block index of the first destination page.
    first_block: u32,
    job: Option<CopyJobId>,
    state: State,
}

/// Every import staged, copying, published-and-owned or draining.
#[derive(Debug, Default)]
pub(crate) struct Imports {
    imports: BTreeMap<u64, Import>,
    by_job: BTreeMap<CopyJobId, u64>,
    next_id: u64,
}

impl Imports {
    /// Stages an import for `request`: `dest` pages (already allocated, ref 1, held by the import when
    /// `owns_pages`, else by the ledger's ticket) receive the given bytes and will publish the given keys.
    pub(crate) fn stage(
        &mut self,
        copies: &mut dyn CopyEngine,
        request: RequestId,
        dest: Vec<(PageId, BlockKey, Arc<[u8]>)>,
        first_block: u32,
        owns_pages: bool,
        now: Timestamp,
    ) -> Result<u64> {
        let id = self.next_id;
        self.next_id += 1;
        let pages = dest
            .iter()
            .map(|(page, _, bytes)| (Arc::clone(bytes), *page))
            .collect();
        let job = copies.submit(
            CopyJob {
                rank: 0,
                work: CopyWork::Restore { pages },
            },
            now,
        )?;
        self.by_job.insert(job, id);
        let dest = dest.into_iter().map(|(page, key, _)| (page, key)).collect();
        self.imports.insert(
            id,
            Import {
                request,
                dest,
                owns_pages,
                first_block,
                job: Some(job),
                state: State::Copying,
            },
        );
        Ok(id)
    }

    /// Observes finished copies: publishes, discards failed or invalidated imports, frees drained ones.
    pub(crate) fn poll(
        &mut self,
        pool: &mut PagePool,
        copies: &mut dyn CopyEngine,
        now: Timestamp,
    ) -> Result<Vec<ImportEvent>> {
        let mut events = Vec::new();
        for completion in copies.poll(now) {
            let Some(id) = self.by_job.remove(&completion.job) else {
                continue;
            };
            let import = self
                .imports
                .get_mut(&id)
                .expect("a job maps to a live import");
            import.job = None;
            let request = import.request;
            let discard = match (&import.state, &completion.outcome) {
                (State::Draining, _) => {
                    events.push(ImportEvent::Drained {
                        import: id,
                        request,
                    });
                    true
                }
                (State::Copying, CopyOutcome::Done { .. }) if completion.invalidated.is_empty() => {
                    // O2: published on the (last) acknowledgement; keys become visible to prefix lookups.
                    for (page, key) in &import.dest {
                        pool.cache_block(*page, *key)?;
                    }
                    import.state = State::Published;
                    events.push(ImportEvent::Published {
                        import: id,
                        request,
                    });
                    false
                }
                (State::Copying, CopyOutcome::Done { .. }) => {
                    events.push(ImportEvent::Invalidated {
                        import: id,
                        request,
                    });
                    true
                }
                (State::Copying, _) => {
                    events.push(ImportEvent::Failed {
                        import: id,
                        request,
                    });
                    true
                }
                (State::Published, _) => unreachable!("a published import has no copy in flight"),
            };
            if discard {
                let import = self.imports.remove(&id).expect("present");
                free_import(pool, &import)?;
            }
        }
        Ok(events)
    }

    /// Releases a published import's ownership (its consumer acquired the pages, or it is cancelled while
    /// ready, O6): the pages stay cached and become evictable once nobody else holds them.
    pub(crate) fn release_owned(&mut self, pool: &mut PagePool, id: u64) -> Result<()> {
        let import = self.imports.remove(&id).expect("release of a live import");
        debug_assert_eq!(import.state, State::Published);
        free_import(pool, &import)
    }

    /// Cancels an import: a published one is released at once (O6); a copying one keeps its pages pinned
    /// until its copy drains (O5).
    pub(crate) fn cancel(
        &mut self,
        pool: &mut PagePool,
        copies: &mut dyn CopyEngine,
        id: u64,
    ) -> Result<()> {
        let Some(import) = self.imports.get_mut(&id) else {
            return Ok(());
        };
        match import.state {
            State::Published => self.release_owned(pool, id),
            State::Copying => {
                import.state = State::Draining;
                if let Some(job) = import.job {
                    copies.cancel(job);
                }
                Ok(())
            }
            State::Draining => Ok(()),
        }
    }

    /// Imports staged (copying) or published and owned: what a non-forced reset refuses (X2, O3).
    pub(crate) fn n_staged_or_owned(&self) -> usize {
        self.imports
            .values()
            .filter(|import| import.state != State::Draining)
            .count()
    }

    /// Imports still copying or draining.
    pub(crate) fn n_copying(&self) -> usize {
        self.imports
            .values()
            .filter(|import| import.job.is_some())
            .count()
    }

    /// Destination pages of every live import, whoever holds their references.
    pub(crate) fn all_dest_pages(&self) -> impl Iterator<Item = PageId> + '_ {
        self.imports
            .values()
            .flat_map(|import| import.dest.iter().map(|(page, _)| *page))
    }

    /// Block index of a live import's first destination page.
    pub(crate) fn first_block(&self, id: u64) -> u32 {
        self.imports[&id].first_block
    }

    /// The destination pages and keys of a live import.
    pub(crate) fn dest(&self, id: u64) -> &[(PageId, BlockKey)] {
        &self.imports[&id].dest
    }

    /// Asserts that no destination page with a copy in flight is free.
    pub(crate) fn check_invariants(&self, pool: &PagePool) {
        for import in self.imports.values() {
            for (page, _) in &import.dest {
                let refs = pool.ref_count(*page).expect("destination page in range");
                assert!(
                    refs >= 1,
                    "destination page {page:?} of {} freed under a live import",
                    import.request
                );
            }
        }
    }
}

fn free_import(pool: &mut PagePool, import: &Import) -> Result<()> {
    if import.owns_pages {
        for (page, _) in &import.dest {
            pool.free(*page)?;
        }
    }
    Ok(())
}
