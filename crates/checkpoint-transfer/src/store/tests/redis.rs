//! `RedisStore` against a real `redis-server` on a loopback port: sharing between two stores, and every fault
//! the remote tier must survive without a crash or a corrupt restore (a restart, a dropped connection, a slow
//! server, values written by another program, the server's memory limit). Each test prints that it skipped
//! when `redis-server` is not installed (and fails instead under `KVGATE_REQUIRE_REDIS=1`).
#![allow(
    clippy::disallowed_methods,
    reason = "tests against a real server time it"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{TEN_TOKEN_BYTES, checkpoint, find, tokens};
use crate::error::Error;
use crate::store::redis::{
    BREAKER_FAILURES, BREAKER_PROBE_INTERVAL, BREAKER_PROBE_INTERVAL_MAX, Breaker,
};
use crate::store::{CheckpointStore, DEFAULT_KEY_PREFIX, RedisStore, check_redis_url};

#[path = "../../../../../tests/support/redis_server.rs"]
mod redis_server;

use redis_server::RedisServer;

const TIMEOUT: Duration = Duration::from_millis(500);

fn open(server: &RedisServer) -> RedisStore {
    RedisStore::open(&server.url(), DEFAULT_KEY_PREFIX, 1 << 30, TIMEOUT).unwrap()
}

#[test]
fn redis_checkpoint_put_by_one_store_is_restored_by_another_byte_for_byte() {
    let Some(server) =
        RedisServer::start("redis_checkpoint_put_by_one_store_is_restored_by_another")
    else {
        return;
    };
    let mut a = open(&server);
    let mut b = open(&server);
    let written = checkpoint("turn", 1, &tokens(10));
    a.put(written.clone()).unwrap();
    assert_eq!(find(&mut b, &tokens(12)).as_deref(), Some("turn"));
    let read = b.get(&written.meta.id).unwrap();
    assert_eq!(read.meta, written.meta);
    assert_eq!(read.payload, written.payload);
    assert_eq!(b.stats().n_bytes, TEN_TOKEN_BYTES);
    // A newer generation from B supersedes A's: A finds it at its next lookup, its old payload is gone.
    b.put(checkpoint("turn", 2, &tokens(10))).unwrap();
    assert_eq!(find(&mut a, &tokens(12)).as_deref(), Some("turn"));
    assert_eq!(a.get(&written.meta.id).unwrap().meta.generation, 2);
    let old_payload = a.payload_key(&written.meta.id, 1);
    assert_eq!(server.command(&["EXISTS", &old_payload]).unwrap(), ":0");
    // A removal by one is seen by the other.
    assert!(a.remove(&written.meta.id).unwrap());
    assert_eq!(find(&mut b, &tokens(12)), None);
    a.check_invariants();
    b.check_invariants();
}

#[test]
fn redis_server_restart_loses_its_checkpoints_and_lookups_find_nothing() {
    let Some(mut server) = RedisServer::start("redis_server_restart_loses_its_checkpoints") else {
        return;
    };
    let mut store = open(&server);
    store.put(checkpoint("turn", 1, &tokens(10))).unwrap();
    let port = server.port();
    server.stop();
    // While it is down: lookups fall back on what was known, reads fail, nothing hangs or panics.
    let id = checkpoint("turn", 1, &tokens(10)).meta.id;
    assert!(matches!(store.get(&id), Err(Error::Remote { .. })));
    assert!(matches!(
        store.put(checkpoint("other", 1, &tokens(5))),
        Err(Error::Remote { .. })
    ));
    assert_eq!(store.stats().n_write_failures, 1);
    let _server = RedisServer::start_on(port);
    // Back, empty: the store reconnects and finds nothing, so the request recomputes; puts work again.
    assert_eq!(find(&mut store, &tokens(12)), None);
    assert_eq!(store.stats().n_checkpoints, 0);
    store.put(checkpoint("turn", 2, &tokens(10))).unwrap();
    assert_eq!(find(&mut store, &tokens(12)).as_deref(), Some("turn"));
    store.check_invariants();
}

#[test]
fn redis_connection_dropped_between_lookup_and_read_fails_the_read_and_a_retry_succeeds() {
    let Some(server) = RedisServer::start("redis_connection_dropped_between_lookup_and_read")
    else {
        return;
    };
    let mut store = open(&server);
    let written = checkpoint("turn", 1, &tokens(10));
    store.put(written.clone()).unwrap();
    assert_eq!(find(&mut store, &tokens(12)).as_deref(), Some("turn"));
    // Every client connection but the one asking is closed by the server.
    assert_eq!(
        server
            .command(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"])
            .unwrap(),
        ":1"
    );
    assert!(matches!(
        store.get(&written.meta.id),
        Err(Error::Remote { .. })
    ));
    // The restore looks up again (O7): the store reconnects and the checkpoint is whole.
    assert_eq!(find(&mut store, &tokens(12)).as_deref(), Some("turn"));
    assert_eq!(
        store.get(&written.meta.id).unwrap().payload,
        written.payload
    );
}

#[test]
fn redis_slow_server_times_out_instead_of_hanging() {
    let Some(server) = RedisServer::start("redis_slow_server_times_out_instead_of_hanging") else {
        return;
    };
    let mut store = open(&server);
    let written = checkpoint("turn", 1, &tokens(10));
    store.put(written.clone()).unwrap();
    assert_eq!(
        server.command(&["CLIENT", "PAUSE", "3000", "ALL"]).unwrap(),
        "+OK"
    );
    let started = Instant::now();
    let _known = find(&mut store, &tokens(12));
    let read = store.get(&written.meta.id);
    let elapsed = started.elapsed();
    assert!(
        matches!(read, Err(Error::Remote { ref reason, .. }) if reason.contains("in time")),
        "{read:?}"
    );
    assert!(
        elapsed < Duration::from_secs(2),
        "a paused server held the store {elapsed:?}"
    );
    assert_eq!(server.command(&["CLIENT", "UNPAUSE"]).unwrap(), "+OK");
    assert_eq!(find(&mut store, &tokens(12)).as_deref(), Some("turn"));
    assert_eq!(
        store.get(&written.meta.id).unwrap().payload,
        written.payload
    );
}

#[test]
fn g6_redis_values_written_by_another_program_are_never_restored() {
    let Some(server) = RedisServer::start("g6_redis_values_written_by_another_program") else {
        return;
    };
    let mut writer = open(&server);
    let written = checkpoint("turn", 1, &tokens(10));
    writer.put(written.clone()).unwrap();
    // A foreign index entry and manifest under the prefix, and a flipped payload byte of a real checkpoint.
    let index = writer.index_key();
    assert_eq!(
        server.command(&["HSET", &index, "ckpt-66", "1"]).unwrap(),
        ":1"
    );
    let foreign = format!("{DEFAULT_KEY_PREFIX}m:ckpt-66");
    assert_eq!(
        server
            .command(&["SET", &foreign, "not-a-manifest"])
            .unwrap(),
        "+OK"
    );
    let payload = writer.payload_key(&written.meta.id, 1);
    assert_eq!(
        server.command(&["SETRANGE", &payload, "0", "X"]).unwrap(),
        format!(":{}", TEN_TOKEN_BYTES)
    );

    let mut reader = open(&server);
    assert_eq!(reader.rejected().len(), 1, "{:?}", reader.rejected());
    assert_eq!(reader.rejected()[0].key, foreign);
    assert!(
        reader.rejected()[0]
            .reason
            .contains("not a kvgate checkpoint manifest")
    );
    assert_eq!(find(&mut reader, &tokens(12)).as_deref(), Some("turn"));
    let read = reader.get(&written.meta.id);
    assert!(
        matches!(read, Err(Error::CorruptValue { ref reason, .. }) if reason.contains("fails its checksum")),
        "{read:?}"
    );
    // A manifest overwritten by garbage is rejected too.
    let manifest = writer.manifest_key(&written.meta.id);
    assert_eq!(
        server.command(&["SET", &manifest, "garbage"]).unwrap(),
        "+OK"
    );
    let read = writer.get(&written.meta.id);
    assert!(matches!(read, Err(Error::CorruptValue { .. })), "{read:?}");
}

#[test]
fn redis_maxmemory_reached_fails_the_put_counts_it_and_the_store_goes_on() {
    let Some(server) = RedisServer::start("redis_maxmemory_reached_fails_the_put") else {
        return;
    };
    let mut store = open(&server);
    server.set_maxmemory("4mb");
    // 2 ranks x 64 bytes per 4 tokens: 8 MiB of payload.
    let big = checkpoint("big", 1, &tokens(256 * 1024));
    let put = store.put(big);
    assert!(
        matches!(put, Err(Error::Remote { ref reason, .. }) if reason.contains("maxmemory")),
        "{put:?}"
    );
    assert_eq!(store.stats().n_write_failures, 1);
    assert_eq!(store.stats().n_checkpoints, 0);
    store.put(checkpoint("small", 1, &tokens(10))).unwrap();
    assert_eq!(find(&mut store, &tokens(12)).as_deref(), Some("small"));
    store.check_invariants();
}

#[test]
fn redis_url_and_unreachable_server_are_errors_that_say_what_to_do() {
    assert!(
        check_redis_url("http://127.0.0.1:6379")
            .unwrap_err()
            .contains("redis://")
    );
    assert!(check_redis_url("redis://127.0.0.1:6379/0").is_ok());
    // Nothing listens on port 1 of the loopback: a connection error, at once.
    let started = Instant::now();
    let error = RedisStore::open(
        "redis://:secret@127.0.0.1:1/0",
        DEFAULT_KEY_PREFIX,
        1 << 20,
        TIMEOUT,
    )
    .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2));
    let message = error.to_string();
    assert!(
        message.contains("check that the server is running"),
        "{message}"
    );
    assert!(!message.contains("secret"), "{message}");
}

/// A store whose circuit breaker reads `clock` (milliseconds past a fixed start), the timeout `timeout`.
fn open_with_clock(server: &RedisServer, timeout: Duration, clock: &Arc<AtomicU64>) -> RedisStore {
    let mut store = RedisStore::open(&server.url(), DEFAULT_KEY_PREFIX, 1 << 30, timeout).unwrap();
    let (start, clock) = (Instant::now(), Arc::clone(clock));
    store.set_clock(move || start + Duration::from_millis(clock.load(Ordering::Relaxed)));
    store
}

/// The one rejected value `store` reports under `key`, and its reason.
fn rejected_reason(store: &RedisStore, key: &str) -> String {
    let found: Vec<_> = store.rejected().iter().filter(|r| r.key == key).collect();
    assert_eq!(found.len(), 1, "{key}: {:?}", store.rejected());
    found[0].reason.clone()
}

#[test]
fn redis_foreign_epoch_is_reset_with_a_warning_and_never_stops_the_store() {
    let Some(server) = RedisServer::start("redis_foreign_epoch_is_reset_with_a_warning") else {
        return;
    };
    let epoch = format!("{DEFAULT_KEY_PREFIX}epoch");
    assert_eq!(
        server.command(&["SET", &epoch, "not-a-number"]).unwrap(),
        "+OK"
    );
    // At start: the store opens, names the key and what it found, and writes an integer back.
    let mut a = open(&server);
    let reason = rejected_reason(&a, &epoch);
    assert!(
        reason.contains("not-a-number") && reason.contains("reset"),
        "{reason}"
    );
    assert!(server.command(&["GET", &epoch]).unwrap().starts_with('$'));
    assert!(server.command(&["INCR", &epoch]).unwrap().starts_with(':'));
    a.put(checkpoint("turn", 1, &tokens(10))).unwrap();
    // Mid-run, as a string and as another type: lookups by another engine and puts go on.
    let foreign_values: [&[&str]; 2] = [
        &["SET", &epoch, "not-a-number"],
        &["HSET", &epoch, "field", "value"],
    ];
    for (i, foreign) in foreign_values.into_iter().enumerate() {
        let mut b = open(&server);
        assert_eq!(find(&mut b, &tokens(12)).as_deref(), Some("turn"));
        let _deleted = server.command(&["DEL", &epoch]).unwrap();
        assert!(server.command(foreign).unwrap().starts_with(['+', ':']));
        a.put(checkpoint("turn", 2 + i as u64, &tokens(10)))
            .unwrap();
        assert_eq!(find(&mut b, &tokens(12)).as_deref(), Some("turn"));
        let read = b.get(&checkpoint("turn", 1, &tokens(10)).meta.id).unwrap();
        assert_eq!(read.meta.generation, 2 + i as u64);
    }
    assert_eq!(a.stats().n_write_failures, 0);
    assert_eq!(a.rejected().len(), 3, "{:?}", a.rejected());
    assert!(
        a.rejected()[2].reason.contains("hash"),
        "{:?}",
        a.rejected()
    );
    a.check_invariants();
}

#[test]
fn redis_index_of_the_wrong_type_is_recreated_and_never_stops_the_store() {
    let Some(server) = RedisServer::start("redis_index_of_the_wrong_type_is_recreated") else {
        return;
    };
    let mut a = open(&server);
    a.put(checkpoint("turn", 1, &tokens(10))).unwrap();
    let index = a.index_key();
    for (i, foreign) in [["SET", &index, "foo"], ["SADD", &index, "foo"]]
        .into_iter()
        .enumerate()
    {
        let _deleted = server.command(&["DEL", &index]).unwrap();
        assert!(server.command(&foreign).unwrap().starts_with(['+', ':']));
        // Another engine opens on it: it rebuilds the index from the manifests on the server, saying what it
        // found; this one writes through it.
        let mut b = open(&server);
        let reason = rejected_reason(&b, &index);
        assert!(
            reason.contains(["string", "set"][i]) && reason.contains("rebuilt"),
            "{reason}"
        );
        a.put(checkpoint("other", 1 + i as u64, &tokens(5)))
            .unwrap();
        assert_eq!(server.command(&["TYPE", &index]).unwrap(), "+hash");
        assert_eq!(server.command(&["HLEN", &index]).unwrap(), ":2");
        assert_eq!(find(&mut b, &tokens(12)).as_deref(), Some("turn"));
        assert_eq!(find(&mut a, &tokens(12)).as_deref(), Some("turn"));
    }
    // Mid-run, met by a write: the writer rebuilds it and its put goes through.
    assert_eq!(server.command(&["SET", &index, "foo"]).unwrap(), "+OK");
    a.put(checkpoint("other", 3, &tokens(5))).unwrap();
    assert_eq!(server.command(&["HLEN", &index]).unwrap(), ":2");
    assert!(rejected_reason(&a, &index).contains("string"));
    assert_eq!(
        find(&mut open(&server), &tokens(12)).as_deref(),
        Some("turn")
    );
    assert_eq!(a.stats().n_write_failures, 0);
    a.check_invariants();
}

#[test]
fn redis_manifest_or_payload_of_the_wrong_type_is_rejected_naming_its_key() {
    let Some(server) = RedisServer::start("redis_manifest_or_payload_of_the_wrong_type") else {
        return;
    };
    let mut a = open(&server);
    let (turn, other) = (
        checkpoint("turn", 1, &tokens(10)),
        checkpoint("other", 1, &tokens(5)),
    );
    a.put(turn.clone()).unwrap();
    a.put(other.clone()).unwrap();
    let manifest = a.manifest_key(&other.meta.id);
    let _deleted = server.command(&["DEL", &manifest]).unwrap();
    assert_eq!(
        server.command(&["HSET", &manifest, "f", "v"]).unwrap(),
        ":1"
    );
    // A new engine loads the rest and rejects that one, naming its key.
    let mut b = open(&server);
    assert!(rejected_reason(&b, &manifest).contains("another type"));
    assert_eq!(b.stats().n_checkpoints, 1);
    assert_eq!(find(&mut b, &tokens(12)).as_deref(), Some("turn"));
    // A payload of another type: an unusable value named by its key, not a failing server.
    let payload = a.payload_key(&turn.meta.id, 1);
    let _deleted = server.command(&["DEL", &payload]).unwrap();
    assert_eq!(server.command(&["SADD", &payload, "x"]).unwrap(), ":1");
    let read = b.get(&turn.meta.id);
    assert!(
        matches!(read, Err(Error::CorruptValue { ref key, ref reason }) if *key == payload && reason.contains("another type")),
        "{read:?}"
    );
}

#[test]
fn redis_paused_server_every_call_kind_times_out_within_its_timeout() {
    let Some(server) = RedisServer::start("redis_paused_server_every_call_kind_times_out") else {
        return;
    };
    let timeout = Duration::from_millis(200);
    // A database other than 0 has redis-rs's connection setup send SELECT.
    let url = server.url().replace("/0", "/1");
    let kinds = ["open", "lookup", "get", "put", "evicting put", "remove"];
    let written = checkpoint("turn", 1, &tokens(10));
    // A store per kind, holding one checkpoint (an evicting put makes room for another first).
    let mut stores: Vec<RedisStore> = kinds
        .iter()
        .map(|kind| {
            let prefix = format!("{}:", kind.replace(' ', "-"));
            let capacity = if *kind == "evicting put" {
                TEN_TOKEN_BYTES
            } else {
                1 << 30
            };
            let mut store = RedisStore::open(&url, &prefix, capacity, timeout).unwrap();
            store.put(written.clone()).unwrap();
            store
        })
        .collect();
    // Paused longer than every call together may take (this server's UNPAUSE waits for the pause's end).
    assert_eq!(
        server.command(&["CLIENT", "PAUSE", "3000", "ALL"]).unwrap(),
        "+OK"
    );
    let paused = Instant::now();
    for (kind, store) in kinds.into_iter().zip(&mut stores) {
        let started = Instant::now();
        let outcome = match kind {
            "open" => RedisStore::open(&url, "open:", 1 << 30, timeout).map(drop),
            "lookup" => match find(store, &tokens(12)) {
                None | Some(_) => Ok(()),
            },
            "get" => store.get(&written.meta.id).map(drop),
            "put" => store.put(checkpoint("turn", 2, &tokens(10))).map(drop),
            "evicting put" => store.put(checkpoint("other", 1, &tokens(10))).map(drop),
            _ => store.remove(&written.meta.id).map(drop),
        };
        let elapsed = started.elapsed();
        assert!(
            elapsed < timeout * 2 && paused.elapsed() < Duration::from_millis(2900),
            "{kind}: a server paused for 3 s held the call {elapsed:?} (timeout {timeout:?})"
        );
        if kind != "lookup" {
            assert!(
                matches!(outcome, Err(Error::Remote { ref reason, .. }) if reason.contains("in time")),
                "{kind}: {outcome:?}"
            );
        }
    }
    assert_eq!(server.command(&["CLIENT", "UNPAUSE"]).unwrap(), "+OK");
    // Every store answers again (the server may still run a write whose reply timed out: the removal).
    for (kind, store) in kinds.into_iter().zip(&mut stores) {
        let found = find(store, &tokens(12));
        assert!(
            found.as_deref() == Some("turn") || kind == "remove",
            "{kind}: {found:?}"
        );
        store.check_invariants();
    }
}

#[test]
fn redis_failing_store_fails_fast_and_probes_again() {
    let Some(server) = RedisServer::start("redis_failing_store_fails_fast_and_probes_again") else {
        return;
    };
    let timeout = Duration::from_millis(200);
    let clock = Arc::new(AtomicU64::new(0));
    let mut store = open_with_clock(&server, timeout, &clock);
    let (written, side) = (
        checkpoint("turn", 1, &tokens(10)),
        checkpoint("side", 1, &tokens(5)),
    );
    store.put(written.clone()).unwrap();
    store.put(side.clone()).unwrap();
    assert_eq!(
        server.command(&["CLIENT", "PAUSE", "2000", "ALL"]).unwrap(),
        "+OK"
    );
    // Calls time out until BREAKER_FAILURES of them failed in a row (lookups answer what was known).
    for failure in 1..=BREAKER_FAILURES {
        let started = Instant::now();
        let found = find(&mut store, &tokens(12));
        assert!(started.elapsed() >= timeout / 2, "not asked");
        assert_eq!(found.is_some(), failure < BREAKER_FAILURES);
    }
    // Open: every kind of call answers at once, saying why.
    let started = Instant::now();
    assert_eq!(find(&mut store, &tokens(12)), None);
    let read = store.get(&written.meta.id);
    let put = store.put(checkpoint("other", 1, &tokens(5)));
    let removed = store.remove(&side.meta.id);
    let elapsed = started.elapsed();
    assert!(
        elapsed < timeout / 2,
        "an open breaker still waited {elapsed:?}"
    );
    for outcome in [read.map(drop), put.map(drop), removed.map(drop)] {
        assert!(
            matches!(outcome, Err(Error::Remote { ref reason, .. }) if reason.contains("in a row")),
            "{outcome:?}"
        );
    }
    assert_eq!(store.stats().n_write_failures, 1);
    // The probe is due: one call asks the server (still paused: it times out), the next fail at once again.
    clock.fetch_add(BREAKER_PROBE_INTERVAL.as_millis() as u64, Ordering::Relaxed);
    let started = Instant::now();
    assert_eq!(find(&mut store, &tokens(12)), None);
    assert!(started.elapsed() >= timeout / 2, "no probe");
    let started = Instant::now();
    assert_eq!(find(&mut store, &tokens(12)), None);
    assert!(started.elapsed() < timeout / 2, "probed again at once");
    // Back (this server's UNPAUSE waits for the pause's end): the next probe, after a doubled interval,
    // closes the breaker and the store answers again.
    assert_eq!(server.command(&["CLIENT", "UNPAUSE"]).unwrap(), "+OK");
    clock.fetch_add(BREAKER_PROBE_INTERVAL.as_millis() as u64, Ordering::Relaxed);
    assert_eq!(find(&mut store, &tokens(12)), None, "the interval doubled");
    clock.fetch_add(BREAKER_PROBE_INTERVAL.as_millis() as u64, Ordering::Relaxed);
    assert_eq!(find(&mut store, &tokens(12)).as_deref(), Some("turn"));
    assert_eq!(
        store.get(&written.meta.id).unwrap().payload,
        written.payload
    );
    store.put(checkpoint("turn", 2, &tokens(10))).unwrap();
    assert_eq!(store.get(&written.meta.id).unwrap().meta.generation, 2);
    store.check_invariants();
}

#[test]
fn redis_breaker_opens_after_consecutive_failures_and_backs_off_its_probes() {
    let start = Instant::now();
    let at = |ms: u64| start + Duration::from_millis(ms);
    let interval = BREAKER_PROBE_INTERVAL.as_millis() as u64;
    let mut breaker = Breaker::default();
    // Failures apart from each other do not open it.
    for _ in 0..BREAKER_FAILURES - 1 {
        breaker.failed(at(0));
    }
    breaker.succeeded();
    for _ in 0..BREAKER_FAILURES - 1 {
        breaker.failed(at(0));
        assert_eq!(breaker.admit(at(0)), Ok(()));
    }
    breaker.failed(at(0));
    assert_eq!(breaker.admit(at(0)), Err(BREAKER_PROBE_INTERVAL));
    assert_eq!(
        breaker.admit(at(interval - 1)),
        Err(Duration::from_millis(1))
    );
    // Each failed probe doubles the interval, up to its cap.
    let mut now = interval;
    let mut expected = BREAKER_PROBE_INTERVAL;
    for _ in 0..10 {
        assert_eq!(breaker.admit(at(now)), Ok(()), "the probe at {now} ms");
        breaker.failed(at(now));
        expected = (expected * 2).min(BREAKER_PROBE_INTERVAL_MAX);
        assert_eq!(breaker.admit(at(now)), Err(expected));
        now += expected.as_millis() as u64;
    }
    assert_eq!(expected, BREAKER_PROBE_INTERVAL_MAX);
    // A probe that succeeds closes it.
    assert_eq!(breaker.admit(at(now)), Ok(()));
    breaker.succeeded();
    breaker.failed(at(now));
    assert_eq!(breaker.admit(at(now)), Ok(()));
}

#[test]
fn redis_password_user_and_database_of_the_url_are_used() {
    let Some(server) = RedisServer::start("redis_password_user_and_database_of_the_url_are_used")
    else {
        return;
    };
    let port = server.port();
    let mut store = RedisStore::open(
        &format!("redis://127.0.0.1:{port}/2"),
        DEFAULT_KEY_PREFIX,
        1 << 30,
        TIMEOUT,
    )
    .unwrap();
    store.put(checkpoint("turn", 1, &tokens(10))).unwrap();
    assert_eq!(
        server.command(&["DBSIZE"]).unwrap(),
        ":0",
        "written to database 2"
    );
    assert_eq!(
        server
            .command(&["CONFIG", "SET", "requirepass", "secret"])
            .unwrap(),
        "+OK"
    );
    for url in [
        format!("redis://:secret@127.0.0.1:{port}/2"),
        format!("redis://default:secret@127.0.0.1:{port}/2"),
    ] {
        let mut reader = RedisStore::open(&url, DEFAULT_KEY_PREFIX, 1 << 30, TIMEOUT).unwrap();
        assert_eq!(
            find(&mut reader, &tokens(12)).as_deref(),
            Some("turn"),
            "{url}"
        );
    }
    let wrong = RedisStore::open(
        &format!("redis://:wrong@127.0.0.1:{port}/2"),
        DEFAULT_KEY_PREFIX,
        1 << 30,
        TIMEOUT,
    )
    .unwrap_err()
    .to_string();
    assert!(
        wrong.contains("WRONGPASS") && !wrong.contains(":wrong@"),
        "{wrong}"
    );
}
