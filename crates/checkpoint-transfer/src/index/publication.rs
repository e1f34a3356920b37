//! Copy completions: polling the copy engine, a rank's acknowledgement, publication once every rank
//! acknowledged (O2), refusal when a destination page was invalidated mid-copy or a dependency was lost,
//! failure and drain (O5, O7), and the discard of an import that will not be published.

use kv_pool::Timestamp;
use kv_pool::{BlockKey, PagePool};

use super::{ImportEvent, ImportId, ImportState, ResidentIndex, release_page};
use crate::copy::{CopyCompletion, CopyEngine, CopyOutcome};

impl ResidentIndex {
    /// Polls the copy engine at `now` and applies its completions.
    pub fn poll(
        &mut self,
        pool: &mut PagePool,
        copies: &mut dyn CopyEngine,
        now: Timestamp,
    ) -> Vec<ImportEvent> {
        let completions = copies.poll(now);
        self.apply_completions(pool, copies, completions)
    }

    /// Waits for every copy in flight (`CopyEngine::wait_all`) and applies the completions.
    pub fn drain_all(
        &mut self,
        pool: &mut PagePool,
        copies: &mut dyn CopyEngine,
    ) -> Vec<ImportEvent> {
        let completions = copies.wait_all();
        self.apply_completions(pool, copies, completions)
    }

    /// Applies copy completions: a finished restore job is its rank's acknowledgement; the last one
    /// publishes (O2); a failure discards after the other ranks drain (O7); a cancelled import is discarded
    /// once drained (O5). Completions of jobs the index does not know are ignored.
    pub(crate) fn apply_completions(
        &mut self,
        pool: &mut PagePool,
        copies: &mut dyn CopyEngine,
        completions: Vec<CopyCompletion>,
    ) -> Vec<ImportEvent> {
        let mut events = Vec::new();
        for completion in completions {
            let Some(import_id) = self.by_job.remove(&completion.job) else {
                continue;
            };
            let Some(import) = self.imports.get_mut(&import_id) else {
                debug_assert!(false, "job of a missing import");
                continue;
            };
            import.jobs.retain(|job| *job != completion.job);
            if import.invalidated.is_none() {
                import.invalidated = completion.invalidated.first().copied();
            }
            match completion.outcome {
                CopyOutcome::Done => {
                    if import.state == ImportState::Staged {
                        import.acknowledged[completion.rank as usize] = true;
                        events.push(ImportEvent::Acknowledged {
                            request: import.request,
                            import: import_id,
                            rank: completion.rank,
                        });
                    }
                }
                CopyOutcome::Failed { reason } => {
                    if import.failure.is_none() {
                        import.failure = Some((completion.rank, reason));
                    }
                    if import.state == ImportState::Staged {
                        import.state = ImportState::Failed;
                        // The other ranks' copies are useless now: stop them early; they still drain.
                        for &job in &import.jobs {
                            copies.cancel(job);
                        }
                    }
                }
                CopyOutcome::Cancelled => {}
            }
            events.extend(self.settle(pool, import_id));
        }
        events
    }

    /// Acts on an import whose copies have all completed: publish, refuse publication, or discard.
    pub(super) fn settle(
        &mut self,
        pool: &mut PagePool,
        import_id: ImportId,
    ) -> Option<ImportEvent> {
        let import = self.imports.get(&import_id)?;
        if !import.jobs.is_empty() || import.state == ImportState::Published {
            return None;
        }
        let request = import.request;
        let event = match import.state {
            ImportState::Cancelled => ImportEvent::Drained {
                request,
                import: import_id,
            },
            ImportState::Failed => {
                let (rank, reason) = import.failure.clone().unwrap_or((0, "copy failed".into()));
                ImportEvent::Failed {
                    request,
                    import: import_id,
                    rank,
                    reason,
                    n_tokens: import.meta.n_tokens,
                }
            }
            ImportState::Staged => {
                debug_assert!(
                    import.acknowledged.iter().all(|acked| *acked),
                    "settled without acks"
                );
                let lost_dependency = import
                    .dependency_pages
                    .iter()
                    .find(|page| pool.ref_count(**page).unwrap_or(0) == 0)
                    .copied();
                match import.invalidated.or(lost_dependency) {
                    Some(page) => ImportEvent::Invalidated {
                        request,
                        import: import_id,
                        page,
                    },
                    None => return self.publish(pool, import_id),
                }
            }
            ImportState::Published => return None,
        };
        self.discard(pool, import_id);
        Some(event)
    }

    /// Registers the import's block keys: from now on a prefix lookup finds them (O2); the import keeps
    /// its references, so they are not evictable (O3). `None` when the index holds no such import.
    fn publish(&mut self, pool: &mut PagePool, import_id: ImportId) -> Option<ImportEvent> {
        let import = self.imports.get_mut(&import_id)?;
        import.state = ImportState::Published;
        let keyed: Vec<(usize, BlockKey)> = import.keyed_pages().collect();
        for (pos, key) in keyed {
            // `false`: another page already caches this block; the consumer's lookup finds that one.
            let registered = pool.cache_block(import.pages[pos], key);
            debug_assert!(
                registered.is_ok(),
                "cache_block of an owned fresh page: {registered:?}"
            );
        }
        Some(ImportEvent::Published {
            request: import.request,
            import: import_id,
            n_tokens: import.meta.n_tokens,
        })
    }

    /// Removes an import with no copy outstanding and drops its references.
    pub(super) fn discard(&mut self, pool: &mut PagePool, import_id: ImportId) {
        let Some(import) = self.remove_import(import_id) else {
            debug_assert!(false, "discard of a missing import {import_id:?}");
            return;
        };
        debug_assert!(import.jobs.is_empty(), "discard with copies outstanding");
        for &page in &import.pages {
            if import.state != ImportState::Published {
                // Never published: the bytes may be partial; make sure no key survives.
                let _uncached = pool.uncache(page);
            }
            release_page(pool, page);
        }
    }
}
