//! `RedisStore`: checkpoints on a Redis server that several engines share (the remote tier). It writes the
//! disk store's manifest format (`manifest`: checksummed metadata, the BLAKE3 of every page), so the same G6
//! rules apply: a value that is not a kvgate manifest, fails a checksum or does not match the engine is
//! never restored. Keys, under a prefix: `<prefix>p:<stem>:<generation>` the payload, `<prefix>m:<stem>` the
//! manifest, `<prefix>index` a hash of stem to generation and `<prefix>epoch` a counter bumped by every
//! change. The payload is written first, then the manifest, index and epoch in one MULTI/EXEC, so a manifest
//! never names a payload that is not there. Each engine keeps its own `Catalog` of what the server holds and
//! refreshes it on a lookup when the epoch moved, so a checkpoint put by one engine is found by another. Every
//! server call has a timeout (connect, read, write); a failed call drops the connection, the next one
//! reconnects. A server that restarted holds nothing, so lookups find nothing and requests recompute; a put
//! refused by the server (its `maxmemory` reached) fails and counts in `StoreStats::n_write_failures`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use redis::{Commands, Connection, RedisResult};

use crate::checkpoint::{Checkpoint, CheckpointId, CheckpointMeta, PrefixQuery};
use crate::error::{Error, Result};
use crate::store::catalog::Catalog;
use crate::store::manifest::{self, MANIFEST_BYTES_MAX, ManifestBody, id_stem};
use crate::store::{CheckpointStore, PutOutcome, StoreStats};

/// Key prefix when none is configured.
pub const DEFAULT_KEY_PREFIX: &str = "kvgate:";

/// Longest key prefix accepted, in bytes.
pub const KEY_PREFIX_BYTES_MAX: usize = 256;

/// A manifest value as read, absent when the server does not hold it.
type ManifestValue = Option<Vec<u8>>;
/// A payload value as read, absent when the server does not hold it.
type PayloadValue = Option<Vec<u8>>;

/// Rejected values named one by one (later ones are counted, not kept).
const REJECTED_KEPT_MAX: usize = 64;

/// A value found on the server that was not loaded, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RejectedKey {
    /// The key.
    pub key: String,
    /// Why it was not loaded.
    pub reason: String,
}

/// Checks a store URL without connecting: `redis://[user:password@]host[:port][/db]` (or `redis+unix://`);
/// the reason it is unusable otherwise.
pub fn check_redis_url(url: &str) -> Result<(), String> {
    if !(url.starts_with("redis://") || url.starts_with("redis+unix://")) {
        return Err(
            "it must start with redis:// (for example redis://127.0.0.1:6379/0)".to_string(),
        );
    }
    redis::Client::open(url)
        .map(drop)
        .map_err(|e| format!("it does not parse as a Redis URL: {e}"))
}

/// Checkpoints on a Redis server, shared with every engine using the same URL and key prefix.
#[derive(Debug)]
pub struct RedisStore {
    client: redis::Client,
    url: String,
    prefix: String,
    timeout: Duration,
    conn: Option<ConnectionSlot>,
    catalog: Catalog,
    /// The server's epoch when the catalog was last refreshed: `None` before the first refresh, `Some(None)`
    /// when the server had no epoch (empty or restarted).
    synced_epoch: Option<Option<i64>>,
    /// Index entries (stem, generation) already rejected, so they are not fetched and reported again.
    rejected_seen: HashSet<(String, String)>,
    rejected: Vec<RejectedKey>,
    n_write_failures: u64,
}

/// A connection (not `Debug` itself).
struct ConnectionSlot(Connection);

impl std::fmt::Debug for ConnectionSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Connection")
    }
}

impl RedisStore {
    /// Connects to the server at `url` (see `check_redis_url`), keeping checkpoints under `key_prefix` and
    /// at most `capacity_bytes` of payload in this engine's view; every server call times out after
    /// `timeout`. Loads what the server already holds. `Error::Remote` when the URL or prefix is unusable or
    /// the server does not answer.
    pub fn open(
        url: &str,
        key_prefix: &str,
        capacity_bytes: u64,
        timeout: Duration,
    ) -> Result<Self> {
        let shown = redact(url);
        check_redis_url(url).map_err(|reason| Error::Remote {
            url: shown.clone(),
            reason,
        })?;
        if key_prefix.len() > KEY_PREFIX_BYTES_MAX || key_prefix.chars().any(char::is_control) {
            return Err(Error::Remote {
                url: shown,
                reason: format!(
                    "key prefix {key_prefix:?} is not usable: give at most {KEY_PREFIX_BYTES_MAX} bytes \
                     without control characters"
                ),
            });
        }
        if timeout.is_zero() {
            return Err(Error::Remote {
                url: shown,
                reason: "the timeout is zero; give a positive timeout".to_string(),
            });
        }
        let client = redis::Client::open(url).map_err(|e| Error::Remote {
            url: shown.clone(),
            reason: e.to_string(),
        })?;
        let mut store = Self {
            client,
            url: shown,
            prefix: key_prefix.to_string(),
            timeout,
            conn: None,
            catalog: Catalog::new(capacity_bytes),
            synced_epoch: None,
            rejected_seen: HashSet::new(),
            rejected: Vec::new(),
            n_write_failures: 0,
        };
        store.refresh()?;
        Ok(store)
    }

    /// The server's URL, its password hidden.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The key prefix.
    pub fn key_prefix(&self) -> &str {
        &self.prefix
    }

    /// Values found on the server that were not loaded (not a kvgate manifest, a failed checksum, another
    /// format version, a manifest that names another checkpoint), at most the first 64.
    pub fn rejected(&self) -> &[RejectedKey] {
        &self.rejected
    }

    /// The key of the manifest of `id`.
    pub fn manifest_key(&self, id: &CheckpointId) -> String {
        format!("{}m:{}", self.prefix, id_stem(id))
    }

    /// The key of the payload of generation `generation` of `id`.
    pub fn payload_key(&self, id: &CheckpointId, generation: u64) -> String {
        self.payload_key_of_stem(&id_stem(id), generation)
    }

    /// The key of the hash that maps each stored checkpoint to its generation.
    pub fn index_key(&self) -> String {
        format!("{}index", self.prefix)
    }

    fn payload_key_of_stem(&self, stem: &str, generation: u64) -> String {
        format!("{}p:{stem}:{generation}", self.prefix)
    }

    fn epoch_key(&self) -> String {
        format!("{}epoch", self.prefix)
    }

    /// Asserts the catalog's indexes agree with its entries.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        self.catalog.check_invariants();
    }

    /// Runs `op` on the connection, connecting first when there is none; any failure drops the connection
    /// (a reply that timed out may still arrive), so the next call starts clean.
    fn call<T>(&mut self, op: impl FnOnce(&mut Connection) -> RedisResult<T>) -> Result<T> {
        let result = match self.conn.as_mut() {
            Some(ConnectionSlot(conn)) => op(conn),
            None => self.connect().and_then(|mut conn| {
                let result = op(&mut conn);
                self.conn = Some(ConnectionSlot(conn));
                result
            }),
        };
        result.map_err(|e| {
            self.conn = None;
            self.remote_error(&e)
        })
    }

    fn connect(&self) -> RedisResult<Connection> {
        let conn = self.client.get_connection_with_timeout(self.timeout)?;
        conn.set_read_timeout(Some(self.timeout))?;
        conn.set_write_timeout(Some(self.timeout))?;
        Ok(conn)
    }

    fn remote_error(&self, error: &redis::RedisError) -> Error {
        let hint = if error.code() == Some("OOM") {
            "the server's maxmemory is reached; raise it or store less"
        } else if error.is_timeout() {
            "the server did not answer in time"
        } else {
            "check that the server is running and reachable"
        };
        Error::Remote {
            url: self.url.clone(),
            reason: format!("{error}; {hint}"),
        }
    }

    /// Brings the catalog in line with the server's index when its epoch moved: forgets what the server no
    /// longer holds (a restart, another engine's eviction) and loads what other engines stored.
    fn refresh(&mut self) -> Result<()> {
        let epoch_key = self.epoch_key();
        let epoch: Option<i64> = self.call(|c| c.get(&epoch_key))?;
        if self.synced_epoch == Some(epoch) {
            return Ok(());
        }
        let index_key = self.index_key();
        let index: HashMap<String, String> = self.call(|c| c.hgetall(&index_key))?;
        let stale: Vec<CheckpointId> = self
            .catalog
            .ids()
            .filter(|(id, generation)| index.get(&id_stem(id)) != Some(&generation.to_string()))
            .map(|(id, _)| id.clone())
            .collect();
        for id in stale {
            self.catalog.remove(&id);
        }
        let known: HashSet<String> = self.catalog.ids().map(|(id, _)| id_stem(id)).collect();
        let new: Vec<(String, String)> = index
            .into_iter()
            .filter(|entry| !known.contains(&entry.0) && !self.rejected_seen.contains(entry))
            .collect();
        if !new.is_empty() {
            let keys: Vec<String> = new
                .iter()
                .map(|(stem, _)| format!("{}m:{stem}", self.prefix))
                .collect();
            let manifests: Vec<Option<Vec<u8>>> = self.call(|c| {
                let mut pipe = redis::pipe();
                for key in &keys {
                    pipe.get(key);
                }
                pipe.query(c)
            })?;
            for ((entry, key), bytes) in new.into_iter().zip(keys).zip(manifests) {
                match check_manifest(&entry, bytes.as_deref()) {
                    Ok(body) => {
                        // Beyond this engine's capacity: forgotten here, left on the server.
                        if self
                            .catalog
                            .plan_put(&body.meta, body.payload_bytes)
                            .is_ok()
                        {
                            self.catalog.insert(Arc::new(body.meta), body.payload_bytes);
                        }
                    }
                    Err(reason) => self.reject(entry, key, reason),
                }
            }
        }
        self.synced_epoch = Some(epoch);
        Ok(())
    }

    fn reject(&mut self, entry: (String, String), key: String, reason: String) {
        tracing::warn!(%key, %reason, "checkpoint value rejected, never restored (G6)");
        if self.rejected.len() < REJECTED_KEPT_MAX {
            self.rejected.push(RejectedKey { key, reason });
        }
        self.rejected_seen.insert(entry);
    }

    /// Refreshes before a lookup; a server that does not answer leaves the catalog as it is (a later `get`
    /// fails and the restore recomputes).
    fn refresh_for_lookup(&mut self) {
        if let Err(error) = self.refresh() {
            tracing::warn!(%error, "checkpoint store lookup without a refresh");
            self.synced_epoch = None;
        }
    }

    /// Deletes the keys of `id` (generation `generation`) and bumps the epoch, in one transaction.
    fn delete_keys(&mut self, id: &CheckpointId, generation: u64) -> Result<()> {
        let (index_key, epoch_key) = (self.index_key(), self.epoch_key());
        let (manifest_key, payload_key) = (self.manifest_key(id), self.payload_key(id, generation));
        let stem = id_stem(id);
        self.call(|c| {
            redis::pipe()
                .atomic()
                .hdel(&index_key, &stem)
                .del(&manifest_key)
                .del(&payload_key)
                .incr(&epoch_key, 1)
                .ignore()
                .query::<()>(c)
        })
    }

    /// Writes the payload, then the manifest, index entry and epoch together; removes the superseded
    /// generation's payload.
    fn write_checkpoint(&mut self, checkpoint: &Checkpoint, outcome: &PutOutcome) -> Result<()> {
        let meta = &checkpoint.meta;
        let bytes =
            manifest::encode(&ManifestBody::of(checkpoint)).map_err(|reason| Error::Remote {
                url: self.url.clone(),
                reason,
            })?;
        let payload: Vec<u8> = checkpoint
            .payload
            .ranks
            .iter()
            .flat_map(crate::page_buf::RankPages::pages)
            .flatten()
            .copied()
            .collect();
        let payload_key = self.payload_key(&meta.id, meta.generation);
        self.call(|c| c.set::<_, _, ()>(&payload_key, payload))?;
        let (index_key, epoch_key, manifest_key) = (
            self.index_key(),
            self.epoch_key(),
            self.manifest_key(&meta.id),
        );
        let (stem, generation) = (id_stem(&meta.id), meta.generation.to_string());
        let old_payload = outcome
            .superseded_generation
            .map(|old| self.payload_key(&meta.id, old));
        let epoch: i64 = self.call(|c| {
            let mut pipe = redis::pipe();
            pipe.atomic()
                .set(&manifest_key, bytes)
                .ignore()
                .hset(&index_key, &stem, &generation)
                .ignore();
            if let Some(old) = &old_payload {
                pipe.del(old).ignore();
            }
            let (epoch,): (i64,) = pipe.incr(&epoch_key, 1).query(c)?;
            Ok(epoch)
        })?;
        // Only this put moved the epoch since the last refresh: the catalog is still in line.
        if self
            .synced_epoch
            .flatten()
            .map_or(epoch == 1, |synced| synced + 1 == epoch)
        {
            self.synced_epoch = Some(Some(epoch));
        }
        Ok(())
    }
}

impl CheckpointStore for RedisStore {
    fn find_longest(&mut self, query: &PrefixQuery<'_>) -> Option<Arc<CheckpointMeta>> {
        self.refresh_for_lookup();
        self.catalog.find_longest(query)
    }

    fn find_longest_prefix(
        &mut self,
        query: &PrefixQuery<'_>,
    ) -> Option<(Arc<CheckpointMeta>, u32)> {
        self.refresh_for_lookup();
        self.catalog.find_longest_prefix(query)
    }

    /// A put the server refuses (`Error::Remote`: maxmemory reached, no answer) leaves the checkpoint
    /// unstored and counts in `StoreStats::n_write_failures`; the engine goes on without it.
    fn put(&mut self, checkpoint: Checkpoint) -> Result<PutOutcome> {
        checkpoint.payload.check_shape(&checkpoint.meta)?;
        let n_bytes = checkpoint.payload.n_bytes();
        let outcome = self.catalog.plan_put(&checkpoint.meta, n_bytes)?;
        let mut result = Ok(());
        for evicted in &outcome.evicted {
            // The catalog forgot it; its generation is on the server's index.
            result = result.and_then(|()| self.delete_evicted(evicted));
        }
        let result = result.and_then(|()| self.write_checkpoint(&checkpoint, &outcome));
        if let Err(error) = result {
            self.n_write_failures += 1;
            let id = &checkpoint.meta.id;
            let payload_key = self.payload_key(id, checkpoint.meta.generation);
            let _ignored = self.call(|c| c.del::<_, ()>(&payload_key));
            if let Some(old) = outcome.superseded_generation {
                let _ignored = self.delete_keys(id, old);
            }
            return Err(error);
        }
        self.catalog.insert(Arc::new(checkpoint.meta), n_bytes);
        Ok(outcome)
    }

    fn get(&mut self, id: &CheckpointId) -> Result<Checkpoint> {
        let meta = self
            .catalog
            .meta(id)
            .ok_or_else(|| Error::NotFound { id: id.clone() })?;
        let (manifest_key, payload_key) =
            (self.manifest_key(id), self.payload_key(id, meta.generation));
        let read: Result<(ManifestValue, PayloadValue)> =
            self.call(|c| redis::pipe().get(&manifest_key).get(&payload_key).query(c));
        let checked = read.and_then(|(manifest_bytes, payload)| {
            let (Some(manifest_bytes), Some(payload)) = (manifest_bytes, payload) else {
                return Err(Error::NotFound { id: id.clone() });
            };
            let corrupt = |key: &str, reason: String| Error::CorruptValue {
                key: key.to_string(),
                reason,
            };
            if manifest_bytes.len() > MANIFEST_BYTES_MAX {
                return Err(corrupt(&manifest_key, "manifest is too large".to_string()));
            }
            let body = manifest::decode(&manifest_bytes).map_err(|r| corrupt(&manifest_key, r))?;
            if body.meta != *meta {
                return Err(corrupt(
                    &manifest_key,
                    "the manifest changed on the server since it was looked up".to_string(),
                ));
            }
            body.verify_payload(&payload)
                .map_err(|r| corrupt(&payload_key, r))
        });
        match checked {
            Ok(payload) => {
                self.catalog.touch(id);
                Ok(Checkpoint {
                    meta: CheckpointMeta::clone(&meta),
                    payload,
                })
            }
            Err(err) => {
                // Never restored (G6, a lost or unreachable checkpoint): forget it until the next refresh.
                tracing::warn!(checkpoint = %id, error = %err, "checkpoint not read, recompute instead");
                self.catalog.remove(id);
                self.synced_epoch = None;
                Err(err)
            }
        }
    }

    fn meta(&self, id: &CheckpointId) -> Option<Arc<CheckpointMeta>> {
        self.catalog.meta(id)
    }

    fn remove(&mut self, id: &CheckpointId) -> Result<bool> {
        let Some(meta) = self.catalog.remove(id) else {
            return Ok(false);
        };
        self.delete_keys(id, meta.generation)?;
        Ok(true)
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            n_write_failures: self.n_write_failures,
            ..self.catalog.stats()
        }
    }
}

impl RedisStore {
    /// Deletes an evicted checkpoint's keys, whatever generation the server's index names.
    fn delete_evicted(&mut self, id: &CheckpointId) -> Result<()> {
        let (index_key, stem) = (self.index_key(), id_stem(id));
        let generation: Option<String> = self.call(|c| c.hget(&index_key, &stem))?;
        match generation.and_then(|g| g.parse::<u64>().ok()) {
            Some(generation) => self.delete_keys(id, generation),
            None => Ok(()),
        }
    }
}

/// Decodes and checks the manifest an index entry names; the reason it is unusable otherwise (G6).
fn check_manifest(entry: &(String, String), bytes: Option<&[u8]>) -> Result<ManifestBody, String> {
    let (stem, generation) = entry;
    let bytes = bytes.ok_or("the index names a manifest the server does not hold")?;
    if bytes.len() > MANIFEST_BYTES_MAX {
        return Err(format!(
            "manifest is {} bytes, more than {MANIFEST_BYTES_MAX}",
            bytes.len()
        ));
    }
    let body = manifest::decode(bytes)?;
    if id_stem(&body.meta.id) != *stem || body.meta.generation.to_string() != *generation {
        return Err(format!(
            "manifest names checkpoint {} generation {}, the index entry {stem} generation {generation}",
            body.meta.id, body.meta.generation
        ));
    }
    Ok(body)
}

/// `url` with its password, if any, replaced by `***`.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{user}:***{}", &url[..scheme_end + 3], &url[at..])
        }
        _ => url.to_string(),
    }
}
