//! `RedisStore`: checkpoints on a Redis server that several engines share (the remote tier). It writes the
//! disk store's manifest format (`manifest`: checksummed metadata, the BLAKE3 of every page), so the same G6
//! rules apply: a value that is not a kvgate manifest, fails a checksum or does not match the engine is
//! never restored. Keys, under a prefix: `<prefix>p:<stem>:<generation>` the payload, `<prefix>m:<stem>` the
//! manifest, `<prefix>index` a hash of stem to generation and `<prefix>epoch` a counter bumped by every
//! change. The payload is written first, then the manifest, index and epoch in one MULTI/EXEC, so a manifest
//! never names a payload that is not there. Each engine keeps its own `Catalog` of what the server holds and
//! refreshes it on a lookup when the epoch moved, so a checkpoint put by one engine is found by another. Every
//! server call has a timeout (connect, each reply, each write; a pipeline stops at the first reply that does
//! not come in time); a failed call drops the connection, the next one reconnects. After `BREAKER_FAILURES`
//! calls in a row that could not reach the server (refused, dropped, timed out) the store fails fast: lookups
//! find nothing and other calls fail at once, but for one probe every so often (`Breaker`). A server that
//! restarted holds nothing, so lookups find nothing and requests recompute; a put refused by the server (its
//! `maxmemory` reached) fails and counts in `StoreStats::n_write_failures`. Values another program wrote cost
//! only recomputation: a foreign manifest or payload is never restored, a foreign epoch is reset and a
//! foreign index rebuilt from the manifests on the server, each warned about once and named in `rejected`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{Commands, Connection, ConnectionLike, RedisError, RedisResult, Value};

use crate::checkpoint::{Checkpoint, CheckpointId, CheckpointMeta, CheckpointPayload};
use crate::error::{Error, Result};
use crate::store::PutOutcome;
use crate::store::catalog::Catalog;
use crate::store::manifest::{self, MANIFEST_BYTES_MAX, ManifestBody, id_stem};
use crate::store::tier::Tier;

/// Key prefix when none is configured.
pub const DEFAULT_KEY_PREFIX: &str = "kvgate:";

/// Longest key prefix accepted, in bytes.
pub const KEY_PREFIX_BYTES_MAX: usize = 256;

/// Rejected values named one by one (later ones are counted, not kept).
const REJECTED_KEPT_MAX: usize = 64;

/// Payloads of failed puts kept for deletion at the next refresh, at most (later ones stay on the server).
const ORPHANS_MAX: usize = 1024;

/// Keys asked for per `SCAN` call while rebuilding a foreign index.
const SCAN_COUNT: usize = 1000;

/// Calls in a row that could not reach the server (refused, dropped, timed out) before the store fails fast.
pub(crate) const BREAKER_FAILURES: u32 = 3;

/// How long an open breaker first fails calls at once before one probes the server; doubled after each
/// failed probe.
pub(crate) const BREAKER_PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// Longest interval between two probes of an open breaker.
pub(crate) const BREAKER_PROBE_INTERVAL_MAX: Duration = Duration::from_secs(30);

/// A value found on the server that was not loaded, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RejectedKey {
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

/// Checkpoints on a Redis server, shared with every engine using the same URL and key prefix. A put the
/// server refuses (`Error::Remote`: maxmemory reached, no answer, the breaker open) leaves the checkpoint
/// unstored and counts in `StoreStats::n_write_failures`; the engine goes on without it.
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
    /// Control keys (epoch, index) repaired so far.
    n_repairs: u64,
    breaker: Breaker,
    /// What the last call that could not reach the server failed with.
    last_failure: String,
    /// The breaker's clock.
    clock: Clock,
    /// Payloads (stem, generation) of puts that failed while the server could not be reached: deleted at the
    /// next refresh unless the index names them.
    orphans: Vec<(String, u64)>,
}

/// A monotonic clock (not `Debug` itself).
struct Clock(Box<dyn Fn() -> Instant + Send>);

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Clock")
    }
}

/// The wall clock: the store's timeouts and its breaker are wall time, like the server calls they bound.
#[allow(
    clippy::disallowed_methods,
    reason = "the redis store's breaker times real server calls"
)]
fn wall_clock() -> Instant {
    Instant::now()
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
            n_repairs: 0,
            breaker: Breaker::default(),
            last_failure: String::new(),
            clock: Clock(Box::new(wall_clock)),
            orphans: Vec::new(),
        };
        store.refresh()?;
        Ok(store)
    }

    /// Values found on the server that were not loaded (not a kvgate manifest, a failed checksum, another
    /// format version, a manifest that names another checkpoint, a value of another type) or that were
    /// repaired (a foreign epoch or index), at most the first 64.
    #[cfg(test)]
    pub(crate) fn rejected(&self) -> &[RejectedKey] {
        &self.rejected
    }

    /// Has the breaker read `clock` instead of the wall clock.
    #[cfg(test)]
    pub(crate) fn set_clock(&mut self, clock: impl Fn() -> Instant + Send + 'static) {
        self.clock = Clock(Box::new(clock));
    }

    /// The key of the manifest of `id`.
    pub(crate) fn manifest_key(&self, id: &CheckpointId) -> String {
        format!("{}m:{}", self.prefix, id_stem(id))
    }

    /// The key of the payload of generation `generation` of `id`.
    pub(crate) fn payload_key(&self, id: &CheckpointId, generation: u64) -> String {
        self.payload_key_of_stem(&id_stem(id), generation)
    }

    /// The key of the hash that maps each stored checkpoint to its generation.
    pub(crate) fn index_key(&self) -> String {
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
    /// (a reply that timed out may still arrive), so the next call starts clean. Fails at once while the
    /// breaker is open and no probe is due.
    fn call<T>(&mut self, op: impl FnOnce(&mut Connection) -> RedisResult<T>) -> Result<T> {
        self.admit_call()?;
        let result = match self.conn.as_mut() {
            Some(ConnectionSlot(conn)) => op(conn),
            None => self.connect().and_then(|mut conn| {
                let result = op(&mut conn);
                self.conn = Some(ConnectionSlot(conn));
                result
            }),
        };
        self.record(result.as_ref().err());
        result.map_err(|e| {
            self.conn = None;
            self.remote_error(&e)
        })
    }

    /// `Error::Remote` while the breaker is open and no probe is due.
    fn admit_call(&self) -> Result<()> {
        self.breaker.admit((self.clock.0)()).map_err(|wait| Error::Remote {
            url: self.url.clone(),
            reason: format!(
                "not asked: {} calls in a row could not reach the server, the last with \"{}\"; calls fail at \
                 once for {:.1} s more, then one probes the server",
                self.breaker.failures,
                self.last_failure,
                wait.as_secs_f64()
            ),
        })
    }

    /// Counts a call's outcome in the breaker: only a call that could not reach the server fails it.
    fn record(&mut self, error: Option<&RedisError>) {
        match error {
            Some(error) if error.is_io_error() => {
                self.last_failure = error.to_string();
                if self.breaker.failed((self.clock.0)()) {
                    tracing::warn!(
                        url = %self.url, %error, failures = BREAKER_FAILURES,
                        "redis checkpoint store unreachable: lookups find nothing and calls fail at once, \
                         but for one probe every few seconds"
                    );
                }
            }
            _ => {
                if self.breaker.succeeded() {
                    tracing::warn!(url = %self.url, "redis checkpoint store answers again");
                }
            }
        }
    }

    /// A connection with the timeout on every read and write. The connection's setup (AUTH, SELECT) is sent
    /// here, not by redis-rs, whose pipeline reader waits the whole timeout again for every reply after one
    /// that timed out; the library name is not sent, and RESP2 is spoken whatever the URL asks.
    fn connect(&self) -> RedisResult<Connection> {
        let info = self.client.get_connection_info();
        let settings = info.redis_settings();
        let bare = info
            .clone()
            .set_redis_settings(redis::RedisConnectionInfo::default().set_skip_set_lib_name());
        let mut conn = redis::Client::open(bare)?.get_connection_with_timeout(self.timeout)?;
        conn.set_read_timeout(Some(self.timeout))?;
        conn.set_write_timeout(Some(self.timeout))?;
        let mut setup = redis::pipe();
        if let Some(password) = settings.password() {
            setup.cmd("AUTH");
            if let Some(user) = settings.username() {
                setup.arg(user);
            }
            setup.arg(password);
        }
        if settings.db() != 0 {
            setup.cmd("SELECT").arg(settings.db());
        }
        if !setup.is_empty()
            && let Some(error) = exchange(&mut conn, &setup)?.iter().find_map(server_error)
        {
            return Err(error);
        }
        Ok(conn)
    }

    fn remote_error(&self, error: &RedisError) -> Error {
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
        let epoch = self.read_epoch()?;
        if self.synced_epoch == Some(epoch) && self.orphans.is_empty() {
            return Ok(());
        }
        let index = self.read_index()?;
        self.delete_orphans(&index)?;
        let stale: Vec<CheckpointId> = self
            .catalog
            .ids()
            .filter(|(id, generation)| index.get(&id_stem(id)) != Some(&generation.to_string()))
            .map(|(id, _)| id.clone())
            .collect();
        for id in stale {
            self.catalog.remove(&id);
        }
        self.load_new(index)?;
        self.synced_epoch = Some(epoch);
        Ok(())
    }

    /// Loads the index entries the catalog does not hold yet (and that were not rejected before).
    fn load_new(&mut self, index: HashMap<String, String>) -> Result<()> {
        let known: HashSet<String> = self.catalog.ids().map(|(id, _)| id_stem(id)).collect();
        let new: Vec<(String, String)> = index
            .into_iter()
            .filter(|entry| !known.contains(&entry.0) && !self.rejected_seen.contains(entry))
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        let keys: Vec<String> = new
            .iter()
            .map(|(stem, _)| format!("{}m:{stem}", self.prefix))
            .collect();
        let mut pipe = redis::pipe();
        for key in &keys {
            pipe.get(key);
        }
        let manifests = self.call(|c| exchange(c, &pipe))?;
        for ((entry, key), value) in new.into_iter().zip(keys).zip(manifests) {
            match bytes_of(value).and_then(|bytes| check_manifest(&entry, bytes.as_deref())) {
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
        Ok(())
    }

    /// The server's epoch (`None`: it holds none); a foreign value (not an integer) is reset first.
    fn read_epoch(&mut self) -> Result<Option<i64>> {
        let key = self.epoch_key();
        let value = self.call(|c| c.req_command(redis::cmd("GET").arg(&key)))?;
        match parse_epoch(value) {
            Ok(epoch) => Ok(epoch),
            Err(found) => {
                let found = match found {
                    Some(found) => found,
                    None => self.type_of(&key)?,
                };
                let fresh = fresh_epoch();
                self.call(|c| c.set::<_, _, ()>(&key, fresh))?;
                self.synced_epoch = None;
                self.repaired(
                    key,
                    format!("found {found} where the epoch counter belongs; reset it to {fresh}"),
                );
                Ok(Some(fresh))
            }
        }
    }

    /// The server's index (stem to generation); a foreign value (not a hash) is rebuilt first.
    fn read_index(&mut self) -> Result<HashMap<String, String>> {
        let key = self.index_key();
        let value = self.call(|c| c.req_command(redis::cmd("HGETALL").arg(&key)))?;
        if let Some(error) = server_error(&value) {
            return match self.type_of(&key)? {
                found if found.ends_with(" hash") => Err(self.remote_error(&error)),
                found => self.rebuild_index(key, &found),
            };
        }
        let index: HashMap<Vec<u8>, Vec<u8>> =
            redis::from_redis_value(value).map_err(|e| self.remote_error(&e.into()))?;
        Ok(index
            .into_iter()
            .map(|(stem, generation)| (lossy(&stem), lossy(&generation)))
            .collect())
    }

    /// What `key` holds, in words ("a value of type set").
    fn type_of(&mut self, key: &str) -> Result<String> {
        let kind: String = self.call(|c| redis::cmd("TYPE").arg(key).query(c))?;
        Ok(format!("a value of type {kind}"))
    }

    /// Replaces the foreign value at the index key `key` (`found` says what it is) by an index rebuilt from
    /// the manifests on the server, and bumps the epoch; the rebuilt index.
    fn rebuild_index(&mut self, key: String, found: &str) -> Result<HashMap<String, String>> {
        let entries = self.scan_manifests()?;
        let mut pipe = redis::pipe();
        pipe.atomic().del(&key);
        if !entries.is_empty() {
            let pairs: Vec<(&String, &String)> = entries.iter().collect();
            pipe.hset_multiple(&key, &pairs);
        }
        pipe.incr(self.epoch_key(), 1);
        let replies = self.call(|c| exchange(c, &pipe))?;
        if let Some(error) = replies.iter().find_map(server_error) {
            return Err(self.remote_error(&error));
        }
        self.synced_epoch = None;
        let reason = format!(
            "found {found} where the index hash belongs; rebuilt it from the {} manifests on the server",
            entries.len()
        );
        self.repaired(key, reason);
        Ok(entries)
    }

    /// Every checkpoint whose manifest on the server decodes and sits under its own key: stem to generation.
    fn scan_manifests(&mut self) -> Result<HashMap<String, String>> {
        let pattern = format!("{}m:*", glob_escape(&self.prefix));
        let (mut entries, mut cursor) = (HashMap::new(), 0_u64);
        loop {
            let (next, keys): (u64, Vec<Vec<u8>>) = self.call(|c| {
                redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(SCAN_COUNT)
                    .query(c)
            })?;
            if !keys.is_empty() {
                let mut pipe = redis::pipe();
                for key in &keys {
                    pipe.get(key);
                }
                let values = self.call(|c| exchange(c, &pipe))?;
                for (key, value) in keys.iter().zip(values) {
                    let Ok(Some(bytes)) = bytes_of(value) else {
                        continue;
                    };
                    let Ok(body) = check_manifest_bytes(&bytes) else {
                        continue;
                    };
                    let stem = id_stem(&body.meta.id);
                    if *key == format!("{}m:{stem}", self.prefix).into_bytes() {
                        entries.insert(stem, body.meta.generation.to_string());
                    }
                }
            }
            if next == 0 {
                return Ok(entries);
            }
            cursor = next;
        }
    }

    /// After a write a control key refused: repairs a foreign epoch or index; whether it repaired one.
    fn repair_controls(&mut self) -> Result<bool> {
        let before = self.n_repairs;
        self.read_epoch()?;
        let key = self.index_key();
        let found = self.type_of(&key)?;
        if !(found.ends_with(" hash") || found.ends_with(" none")) {
            self.rebuild_index(key, &found)?;
        }
        Ok(self.n_repairs > before)
    }

    /// A control key (the epoch, the index) held a value kvgate does not write and was repaired: warned once
    /// and named in `rejected`. Checkpoints it hid recompute.
    fn repaired(&mut self, key: String, reason: String) {
        tracing::warn!(%key, %reason, "foreign value on a control key of the redis checkpoint store, repaired");
        self.n_repairs += 1;
        if self.rejected.len() < REJECTED_KEPT_MAX {
            self.rejected.push(RejectedKey { key, reason });
        }
    }

    /// Runs the transaction `pipe`; when a command of it was refused (a foreign epoch or index), repairs the
    /// control keys and runs it once more. Its replies; `Error::Remote` naming the refusal otherwise.
    fn transact(&mut self, pipe: &redis::Pipeline) -> Result<Vec<Value>> {
        let mut repaired = false;
        loop {
            let replies = self.call(|c| exchange(c, pipe))?;
            let Some(error) = replies.iter().find_map(server_error) else {
                return Ok(replies);
            };
            if repaired || !self.repair_controls()? {
                return Err(self.remote_error(&error));
            }
            repaired = true;
        }
    }

    /// Deletes the payloads of failed puts that the server's index does not name.
    fn delete_orphans(&mut self, index: &HashMap<String, String>) -> Result<()> {
        let keys: Vec<String> = self
            .orphans
            .iter()
            .filter(|(stem, generation)| index.get(stem) != Some(&generation.to_string()))
            .map(|(stem, generation)| self.payload_key_of_stem(stem, *generation))
            .collect();
        if !keys.is_empty() {
            self.call(|c| c.del::<_, ()>(&keys))?;
        }
        self.orphans.clear();
        Ok(())
    }

    fn reject(&mut self, entry: (String, String), key: String, reason: String) {
        tracing::warn!(%key, %reason, "checkpoint value rejected, never restored (G6)");
        if self.rejected.len() < REJECTED_KEPT_MAX {
            self.rejected.push(RejectedKey { key, reason });
        }
        self.rejected_seen.insert(entry);
    }

    /// Refreshes before a lookup; `false` when the store is known to be failing (the breaker is open: the
    /// lookup finds nothing, at once). A refresh that failed otherwise leaves the catalog as it is (a later
    /// `get` fails and the restore recomputes).
    fn refresh_for_lookup(&mut self) -> bool {
        let Err(error) = self.refresh() else {
            return true;
        };
        self.synced_epoch = None;
        if self.breaker.is_open() {
            return false;
        }
        tracing::warn!(%error, "checkpoint store lookup without a refresh");
        true
    }

    /// Deletes the keys of `id` (generation `generation`) and bumps the epoch, in one transaction.
    fn delete_keys(&mut self, id: &CheckpointId, generation: u64) -> Result<()> {
        let (index_key, epoch_key) = (self.index_key(), self.epoch_key());
        let (manifest_key, payload_key) = (self.manifest_key(id), self.payload_key(id, generation));
        let mut pipe = redis::pipe();
        pipe.atomic()
            .hdel(&index_key, id_stem(id))
            .del(&manifest_key)
            .del(&payload_key)
            .incr(&epoch_key, 1);
        self.transact(&pipe).map(drop)
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
        let mut pipe = redis::pipe();
        pipe.atomic()
            .set(&manifest_key, bytes)
            .hset(&index_key, &stem, &generation);
        if let Some(old) = &old_payload {
            pipe.del(old);
        }
        pipe.incr(&epoch_key, 1);
        let replies = self.transact(&pipe)?;
        // Only this put moved the epoch since the last refresh: the catalog is still in line.
        if let Some(&Value::Int(epoch)) = replies.last()
            && self
                .synced_epoch
                .flatten()
                .map_or(epoch == 1, |synced| synced + 1 == epoch)
        {
            self.synced_epoch = Some(Some(epoch));
        }
        Ok(())
    }

    /// After a failed put: deletes what it may have left on the server. When the server could not be reached,
    /// nothing is asked now (each call would wait its timeout again): the new payload is deleted at the next
    /// refresh unless the index names it, and that refresh brings the catalog in line.
    fn clean_up_failed_put(&mut self, meta: &CheckpointMeta, superseded: Option<u64>) {
        let (id, generation) = (&meta.id, meta.generation);
        if self.breaker.failing() {
            if self.orphans.len() < ORPHANS_MAX {
                self.orphans.push((id_stem(id), generation));
            }
            self.synced_epoch = None;
            return;
        }
        let payload_key = self.payload_key(id, generation);
        let _ignored = self.call(|c| c.del::<_, ()>(&payload_key));
        if let Some(old) = superseded {
            let _ignored = self.delete_keys(id, old);
        }
    }
}

impl Tier for RedisStore {
    fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    fn catalog_mut(&mut self) -> &mut Catalog {
        &mut self.catalog
    }

    fn sync_for_lookup(&mut self) -> bool {
        self.refresh_for_lookup()
    }

    fn admit_put(&mut self) -> Result<()> {
        self.admit_call()
    }

    fn write(&mut self, checkpoint: Checkpoint, outcome: &PutOutcome) -> Result<CheckpointMeta> {
        let mut result = Ok(());
        for evicted in &outcome.evicted {
            // The catalog forgot it; its generation is on the server's index.
            result = result.and_then(|()| self.delete_evicted(evicted));
        }
        let result = result.and_then(|()| self.write_checkpoint(&checkpoint, outcome));
        if let Err(error) = result {
            self.clean_up_failed_put(&checkpoint.meta, outcome.superseded_generation);
            return Err(error);
        }
        Ok(checkpoint.meta)
    }

    /// Reads the manifest and payload of the catalogued `meta` and checks them (G6): the payload, or why it
    /// is unusable (`Error::CorruptValue` naming the key) or unread.
    fn read(&mut self, meta: &CheckpointMeta) -> Result<CheckpointPayload> {
        let id = &meta.id;
        let (manifest_key, payload_key) =
            (self.manifest_key(id), self.payload_key(id, meta.generation));
        let mut pipe = redis::pipe();
        pipe.get(&manifest_key).get(&payload_key);
        let mut replies = self.call(|c| exchange(c, &pipe))?.into_iter();
        let corrupt = |key: &str, reason: String| Error::CorruptValue {
            key: key.to_string(),
            reason,
        };
        let manifest_bytes = bytes_of(replies.next().unwrap_or(Value::Nil))
            .map_err(|r| corrupt(&manifest_key, r))?;
        let payload =
            bytes_of(replies.next().unwrap_or(Value::Nil)).map_err(|r| corrupt(&payload_key, r))?;
        let (Some(manifest_bytes), Some(payload)) = (manifest_bytes, payload) else {
            return Err(Error::NotFound { id: id.clone() });
        };
        let body = check_manifest_bytes(&manifest_bytes).map_err(|r| corrupt(&manifest_key, r))?;
        if body.meta != *meta {
            return Err(corrupt(
                &manifest_key,
                "the manifest changed on the server since it was looked up".to_string(),
            ));
        }
        body.verify_payload(&payload)
            .map_err(|r| corrupt(&payload_key, r))
    }

    fn read_failed(&mut self, id: &CheckpointId, error: &Error) {
        // Never restored (G6, a lost or unreachable checkpoint): forgotten until the next refresh.
        tracing::warn!(checkpoint = %id, %error, "checkpoint not read, recompute instead");
        self.synced_epoch = None;
    }

    fn delete(&mut self, meta: &CheckpointMeta) -> Result<()> {
        self.delete_keys(&meta.id, meta.generation)
    }
}

impl RedisStore {
    /// Deletes an evicted checkpoint's keys, whatever generation the server's index names. A foreign index
    /// is rebuilt instead (its keys stay on the server, out of the catalog).
    fn delete_evicted(&mut self, id: &CheckpointId) -> Result<()> {
        let (index_key, stem) = (self.index_key(), id_stem(id));
        let value = self.call(|c| c.req_command(redis::cmd("HGET").arg(&index_key).arg(&stem)))?;
        if let Some(error) = server_error(&value) {
            return match self.repair_controls()? {
                true => Ok(()),
                false => Err(self.remote_error(&error)),
            };
        }
        let generation = bytes_of(value).ok().flatten().map(|g| lossy(&g));
        match generation.and_then(|g| g.parse::<u64>().ok()) {
            Some(generation) => self.delete_keys(id, generation),
            None => Ok(()),
        }
    }
}

/// The circuit breaker of a store's calls: after `BREAKER_FAILURES` calls in a row that could not reach the
/// server it is open, and calls fail at once but for one probe every interval (`BREAKER_PROBE_INTERVAL`,
/// doubled after each failed probe up to `BREAKER_PROBE_INTERVAL_MAX`); a call that reaches the server closes
/// it. Time is passed in.
#[derive(Debug, Default)]
pub(crate) struct Breaker {
    /// Calls in a row that could not reach the server.
    failures: u32,
    /// While open: when the next probe may go, and the interval that set it.
    open: Option<(Instant, Duration)>,
}

impl Breaker {
    /// `Ok` when a call may go at `now`; else how long until the next probe.
    pub(crate) fn admit(&self, now: Instant) -> Result<(), Duration> {
        match self.open {
            Some((probe_at, _)) if now < probe_at => Err(probe_at - now),
            _ => Ok(()),
        }
    }

    /// A call that could not reach the server, at `now`; `true` when it opens the breaker.
    pub(crate) fn failed(&mut self, now: Instant) -> bool {
        self.failures = self.failures.saturating_add(1);
        let interval = match self.open {
            Some((_, interval)) => (interval * 2).min(BREAKER_PROBE_INTERVAL_MAX),
            None if self.failures >= BREAKER_FAILURES => BREAKER_PROBE_INTERVAL,
            None => return false,
        };
        let opens = self.open.is_none();
        self.open = Some((now.checked_add(interval).unwrap_or(now), interval));
        opens
    }

    /// A call that reached the server; `true` when it closes an open breaker.
    pub(crate) fn succeeded(&mut self) -> bool {
        self.failures = 0;
        self.open.take().is_some()
    }

    /// Whether calls fail at once (but for the probes).
    pub(crate) fn is_open(&self) -> bool {
        self.open.is_some()
    }

    /// Whether the last call could not reach the server.
    pub(crate) fn failing(&self) -> bool {
        self.failures > 0
    }
}

/// Sends `pipe` and reads its replies one by one, each within the connection's read timeout, stopping at the
/// first that fails: redis-rs's own pipeline reader goes on reading after a reply that timed out, each read
/// waiting the whole timeout again (a paused server held a six-reply transaction six timeouts). The replies
/// of its commands (a transaction's: the items of EXEC's reply), refusals among them as
/// `Value::ServerError`; a transaction the server would not queue fails with its first refusal.
fn exchange(conn: &mut Connection, pipe: &redis::Pipeline) -> RedisResult<Vec<Value>> {
    conn.send_packed_command(&pipe.get_packed_pipeline())?;
    if !pipe.is_transaction() {
        return (0..pipe.len()).map(|_| conn.recv_response()).collect();
    }
    // MULTI's reply and one per queued command, then EXEC's.
    let mut refused = None;
    for _ in 0..=pipe.len() {
        if let Some(error) = server_error(&conn.recv_response()?) {
            refused.get_or_insert(error);
        }
    }
    let exec = conn.recv_response()?;
    if let Some(error) = refused.or_else(|| server_error(&exec)) {
        return Err(error);
    }
    match exec {
        Value::Array(replies) => Ok(replies),
        other => Err(RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "EXEC did not answer an array",
            format!("{other:?}"),
        ))),
    }
}

/// The refusal a reply is, if it is one.
fn server_error(value: &Value) -> Option<RedisError> {
    match value {
        Value::ServerError(error) => Some(error.clone().into()),
        _ => None,
    }
}

/// A string value's bytes (`None`: the server holds no such key), or why it is not one.
fn bytes_of(value: Value) -> Result<Option<Vec<u8>>, String> {
    match value {
        Value::Nil => Ok(None),
        Value::BulkString(bytes) => Ok(Some(bytes)),
        Value::ServerError(error) => Err(format!(
            "it holds another type of value than the string kvgate writes (the server answered {error})"
        )),
        other => Err(format!("the server answered {other:?}, not a string")),
    }
}

/// The epoch a GET answered (`None`: no epoch yet); else what was found instead, in words, or `None` when the
/// key holds another type than a string.
fn parse_epoch(value: Value) -> Result<Option<i64>, Option<String>> {
    let Ok(bytes) = bytes_of(value) else {
        return Err(None);
    };
    let Some(bytes) = bytes else {
        return Ok(None);
    };
    let text = lossy(&bytes);
    match text.parse::<i64>() {
        Ok(epoch) => Ok(Some(epoch)),
        Err(_) => {
            let shown: String = text.chars().take(64).collect();
            Err(Some(format!("the string {shown:?}")))
        }
    }
}

/// An epoch to reset a foreign one to: random, so no engine holds it as the epoch it last saw (which would
/// hide the changes in between from it), and far from overflowing as it is incremented.
fn fresh_epoch() -> i64 {
    use std::hash::BuildHasher;
    let random = std::collections::hash_map::RandomState::new().hash_one(0_u8);
    (1_i64 << 40) + (random >> 24) as i64
}

/// `bytes` as text, invalid UTF-8 replaced.
fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `text` with the characters a `SCAN MATCH` pattern treats specially escaped.
fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// Decodes and checks the manifest an index entry names; the reason it is unusable otherwise (G6).
fn check_manifest(entry: &(String, String), bytes: Option<&[u8]>) -> Result<ManifestBody, String> {
    let (stem, generation) = entry;
    let bytes = bytes.ok_or("the index names a manifest the server does not hold")?;
    let body = check_manifest_bytes(bytes)?;
    if id_stem(&body.meta.id) != *stem || body.meta.generation.to_string() != *generation {
        return Err(format!(
            "manifest names checkpoint {} generation {}, the index entry {stem} generation {generation}",
            body.meta.id, body.meta.generation
        ));
    }
    Ok(body)
}

/// Decodes a manifest no larger than `MANIFEST_BYTES_MAX`; the reason it is unusable otherwise (G6).
fn check_manifest_bytes(bytes: &[u8]) -> Result<ManifestBody, String> {
    if bytes.len() > MANIFEST_BYTES_MAX {
        return Err(format!(
            "manifest is {} bytes, more than {MANIFEST_BYTES_MAX}",
            bytes.len()
        ));
    }
    manifest::decode(bytes)
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
