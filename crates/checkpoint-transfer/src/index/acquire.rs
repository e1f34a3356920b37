//! Taking imports out of the index: `acquire` by the consumer through the prefix-hit path (O4), `cancel`
//! (O5, O6) and the prefix-cache reset gate `clear` (O3, X1, X2).

use kv_pool::RequestId;
use kv_pool::{BlockKey, PagePool};

use super::{AcquiredImport, CancelOutcome, ImportId, ImportState, ResidentIndex, release_page};
use crate::copy::CopyEngine;
use crate::error::{Error, Result};

impl ResidentIndex {
    /// The consumer takes a ready import at admission (O4): every keyed block is acquired through the
    /// ordinary prefix-hit path (`longest_prefix` + `touch`), unkeyed pages are handed over, and the
    /// import's own references are dropped. Afterwards the pages are the consumer's; freed, they enter the
    /// LRU as ordinary cached pages. Errors: unknown request, an import not published, `Invalidated` (a
    /// block is no longer a hit; the import is released, look up again).
    pub fn acquire(&mut self, pool: &mut PagePool, request: RequestId) -> Result<AcquiredImport> {
        let import_id = self.ready_import(request)?;
        let import = &self.imports[&import_id];
        let keyed: Vec<(usize, BlockKey)> = import.keyed_pages().collect();
        // A block whose key another page held at publication may have been evicted since: our own copy
        // holds the same bytes, register it so the prefix lookup finds it.
        for &(pos, key) in &keyed {
            if pool.lookup(&key).is_none() {
                let _registered = pool.cache_block(import.pages[pos], key)?;
            }
        }
        let keys: Vec<BlockKey> = keyed.iter().map(|(_, key)| *key).collect();
        let hits = pool.longest_prefix(&keys);
        if hits.len() < keys.len() {
            let page = import.pages[keyed[hits.len()].0];
            self.discard(pool, import_id);
            return Err(Error::Invalidated { request, page });
        }
        let mut pages = import.pages.clone();
        for (&(pos, _), &hit) in keyed.iter().zip(&hits) {
            pool.touch(hit)?;
            // The import's reference on its own page is dropped below; the consumer holds `hit`.
            pages[pos] = hit;
        }
        let Some(import) = self.remove_import(import_id) else {
            return Err(Error::UnknownImport { request });
        };
        let keyed_positions: Vec<usize> = keyed.iter().map(|(pos, _)| *pos).collect();
        for pos in keyed_positions {
            release_page(pool, import.pages[pos]);
        }
        Ok(AcquiredImport {
            import: import_id,
            meta: import.meta,
            pages,
            n_hit_pages: hits.len(),
        })
    }

    /// Cancels the request's import. Copying: the request id is free at once, the pages stay pinned until
    /// every submitted copy drained (O5). Ready: its references are dropped at once and its pages become
    /// evictable cached pages (O6).
    pub fn cancel(
        &mut self,
        pool: &mut PagePool,
        copies: &mut dyn CopyEngine,
        request: RequestId,
    ) -> Result<CancelOutcome> {
        let import_id = *self
            .by_request
            .get(&request)
            .ok_or(Error::UnknownImport { request })?;
        let import = self
            .imports
            .get_mut(&import_id)
            .ok_or(Error::UnknownImport { request })?;
        if import.state == ImportState::Published {
            let n_pages = import.pages.len();
            self.discard(pool, import_id);
            return Ok(CancelOutcome::Released {
                import: import_id,
                n_pages,
            });
        }
        import.state = ImportState::Cancelled;
        for &job in &import.jobs {
            copies.cancel(job);
        }
        let n_jobs = import.jobs.len();
        self.by_request.remove(&request);
        let _drained_now = self.settle(pool, import_id);
        Ok(CancelOutcome::Draining {
            import: import_id,
            n_jobs,
        })
    }

    /// Prefix-cache reset gate (O3, X1, X2). Not forced: refused while any import is staged or owned,
    /// changing nothing. Forced: every ready import is released and every copying one cancelled (its pages
    /// drain first); returns the requests that lost their import (they fall back to an ordinary lookup).
    pub fn clear(
        &mut self,
        pool: &mut PagePool,
        copies: &mut dyn CopyEngine,
        force: bool,
    ) -> Result<Vec<RequestId>> {
        let (n_staged, n_owned) = (self.n_staged(), self.n_owned());
        if !force {
            if n_staged + n_owned > 0 {
                return Err(Error::ResetRefused { n_staged, n_owned });
            }
            return Ok(Vec::new());
        }
        let mut requests: Vec<RequestId> = self.by_request.keys().copied().collect();
        requests.sort();
        for &request in &requests {
            self.cancel(pool, copies, request)?;
        }
        Ok(requests)
    }

    fn ready_import(&self, request: RequestId) -> Result<ImportId> {
        let import_id = *self
            .by_request
            .get(&request)
            .ok_or(Error::UnknownImport { request })?;
        let state = self.imports[&import_id].state;
        if state != ImportState::Published {
            return Err(Error::WrongState {
                request,
                state: state.name(),
                needed: "published",
            });
        }
        Ok(import_id)
    }
}
