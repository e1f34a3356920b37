//! `RedisStore` against a real `redis-server` on a loopback port: sharing between two stores, and every fault
//! the remote tier must survive without a crash or a corrupt restore (a restart, a dropped connection, a slow
//! server, values written by another program, the server's memory limit). Each test prints that it skipped
//! when `redis-server` is not installed (and fails instead under `KVGATE_REQUIRE_REDIS=1`).
#![allow(
    clippy::disallowed_methods,
    reason = "tests against a real server time it"
)]

use std::time::{Duration, Instant};

use super::{TEN_TOKEN_BYTES, checkpoint, find, tokens};
use crate::error::Error;
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
