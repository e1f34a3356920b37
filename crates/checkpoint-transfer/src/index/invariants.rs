//! `ResidentIndex::check_invariants`: the index's bookkeeping checked against the pool, for tests and
//! simulations.

use crate::error::Result;
use kv_pool::PagePool;
use kv_pool::{ensure, ensure_eq};

use super::{ImportState, ResidentIndex};

impl ResidentIndex {
    /// Checks the index's invariants against the pool (`InvariantBroken` names the first that fails) (for tests and simulations): every page an import
    /// holds has a reference (so no page is freed while a copy into it is outstanding), pages belong to one
    /// import, a published import has no copy outstanding, and the maps agree.
    pub fn check_invariants(&self, pool: &PagePool) -> Result<()> {
        let mut n_owned_pages = 0;
        for (&import_id, import) in &self.imports {
            for &page in &import.pages {
                let ref_count = pool.ref_count(page).unwrap_or(0);
                ensure!(
                    ref_count >= 1,
                    "page {page:?} of import {import_id:?} has no reference"
                );
                ensure_eq!(
                    self.page_owner.get(&page),
                    Some(&import_id),
                    "page owner map disagrees"
                );
                n_owned_pages += 1;
            }
            for job in &import.jobs {
                ensure_eq!(self.by_job.get(job), Some(&import_id), "job map disagrees");
            }
            match import.state {
                ImportState::Published => {
                    ensure!(
                        import.jobs.is_empty(),
                        "published import with copies outstanding"
                    );
                }
                ImportState::Cancelled => {
                    ensure!(
                        !import.jobs.is_empty(),
                        "drained cancelled import not discarded"
                    );
                }
                ImportState::Staged | ImportState::Failed => {
                    ensure!(!import.jobs.is_empty(), "settled import still staged");
                }
            }
            let mapped = self.by_request.get(&import.request) == Some(&import_id);
            ensure_eq!(
                mapped,
                import.state != ImportState::Cancelled,
                "request map disagrees"
            );
        }
        ensure_eq!(
            n_owned_pages,
            self.page_owner.len(),
            "page owner map has stale pages"
        );
        ensure_eq!(
            self.by_job.len(),
            self.imports
                .values()
                .map(|import| import.jobs.len())
                .sum::<usize>(),
            "job map has stale jobs"
        );
        Ok(())
    }
}
