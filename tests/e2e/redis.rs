//! The engine on a Redis checkpoint store (a real `redis-server` on a loopback port): engine A finishes a
//! turn and engine B, sharing the server, restores it byte for byte (E3, verified by the engine in debug
//! builds); the conversation trace replays with the Redis store; a server lost mid-run or full makes requests
//! recompute, never crash; a server holding checkpoints is named warm. Each test prints that it skipped
//! without `redis-server` (and fails instead under `KVGATE_REQUIRE_REDIS=1`).

use engine::Policy;
use kvgate::workload::mooncake::generate::{TraceShape, generate};
use kvgate::{Engine, EngineBuilder, EngineConfig, RequestSpec, RunMetrics, Timestamp, run};

#[path = "../support/redis_server.rs"]
mod redis_server;

use redis_server::RedisServer;

fn config(server: &RedisServer) -> EngineConfig {
    let mut config = crate::verified_config();
    config.pool.pages = 256;
    config.store.url = Some(server.url());
    config.restore.lookup_timeout_s = 1.0;
    config
}

fn first_prompt() -> Vec<u32> {
    (0..2_000).map(|i| (i * 7919 % 50_000) as u32).collect()
}

/// Runs `spec` on `engine` to the end; its output tokens.
fn run_one(engine: &mut Engine, spec: RequestSpec) -> Vec<u32> {
    let id = spec.id;
    engine.submit(spec).unwrap();
    let mut output = Vec::new();
    while !engine.is_idle() {
        engine.step().unwrap();
        for done in engine.take_finished() {
            if done.id == id {
                output = done.output;
            }
        }
    }
    output
}

/// The second turn of the session whose first turn was `first_prompt()` and answered `output`.
fn second_turn(engine: &Engine, output: &[u32]) -> RequestSpec {
    let mut prompt = first_prompt();
    prompt.extend(output);
    prompt.extend((0..64).map(|i| 40_000 + i));
    let mut turn = RequestSpec::new(2, prompt, 16, engine.now());
    turn.is_later_turn = true;
    turn
}

#[test]
fn e3_engine_b_restores_through_redis_the_turn_engine_a_finished() {
    let Some(server) = RedisServer::start("e3_engine_b_restores_through_redis") else {
        return;
    };
    let mut a = EngineBuilder::new(config(&server)).build().unwrap();
    let output = run_one(
        &mut a,
        RequestSpec::new(1, first_prompt(), 32, Timestamp::ZERO),
    );
    assert_eq!(output.len(), 32);
    drop(a);
    // A fresh engine with an empty pool: the prefix can only come from the server.
    let mut b = EngineBuilder::new(config(&server)).build().unwrap();
    let turn = second_turn(&b, &output);
    run_one(&mut b, turn);
    let metrics = b.metrics();
    assert!(
        metrics.prompt_tokens_restored >= 2_000,
        "engine B restored {} tokens",
        metrics.prompt_tokens_restored
    );
    assert_eq!(metrics.later_turns_restored, 1);
    assert_eq!(metrics.leaked_pages, 0);
}

#[test]
fn a_redis_server_lost_mid_run_makes_the_next_turn_recompute() {
    let Some(mut server) = RedisServer::start("a_redis_server_lost_mid_run") else {
        return;
    };
    let mut engine = EngineBuilder::new(config(&server)).build().unwrap();
    let output = run_one(
        &mut engine,
        RequestSpec::new(1, first_prompt(), 32, Timestamp::ZERO),
    );
    let port = server.port();
    server.stop();
    // Down: nothing can be read, the turn recomputes and its capture fails, counted.
    let turn = second_turn(&engine, &output);
    run_one(&mut engine, turn);
    let down = engine.metrics();
    assert_eq!(down.later_turns_restored, 0);
    assert!(down.store_write_failures >= 1);
    assert_eq!(down.leaked_pages, 0);
    // Restarted empty: still nothing to restore, and the engine stores again once the store's breaker (open
    // since the failed calls above) lets its probe through, 1 s of wall time after it opened.
    let _server = RedisServer::start_on(port);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let failures = down.store_write_failures;
    let mut turn = RequestSpec::new(3, first_prompt(), 8, engine.now());
    turn.is_later_turn = true;
    run_one(&mut engine, turn);
    let after = engine.metrics();
    assert_eq!(after.later_turns_restored, 0);
    assert_eq!(after.store_write_failures, failures);
}

#[test]
fn a_full_redis_server_fails_the_puts_and_the_engine_goes_on() {
    let Some(server) = RedisServer::start("a_full_redis_server_fails_the_puts") else {
        return;
    };
    // Below what the server already uses: every write is refused.
    server.set_maxmemory("1");
    let mut engine = EngineBuilder::new(config(&server)).build().unwrap();
    let output = run_one(
        &mut engine,
        RequestSpec::new(1, first_prompt(), 32, Timestamp::ZERO),
    );
    let turn = second_turn(&engine, &output);
    run_one(&mut engine, turn);
    let metrics: RunMetrics = engine.metrics();
    assert!(metrics.store_write_failures >= 1);
    assert_eq!(metrics.later_turns_restored, 0);
    assert_eq!(metrics.leaked_pages, 0);
}

#[test]
fn a_generated_trace_replays_with_the_redis_store() {
    let Some(server) = RedisServer::start("a_generated_trace_replays_with_the_redis_store") else {
        return;
    };
    let shape = TraceShape {
        n_requests: 200,
        rate_per_s: 4.0,
        ..TraceShape::default()
    };
    let trace = generate(&shape).unwrap();
    let later = run::later_turns(&trace);
    let mut config = config(&server);
    config.pool.pages = 16_384;
    let metrics = run::run_replay(
        &config,
        &trace,
        &later,
        3.0,
        Policy::Reserved,
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!(metrics.leaked_pages, 0);
    assert_eq!(metrics.store_write_failures, 0);
    assert!(
        metrics.prompt_tokens_restored + metrics.prompt_tokens_local_hit > 0,
        "{metrics:?}"
    );
}

#[test]
fn a_redis_store_holding_checkpoints_is_named_warm() {
    let Some(server) = RedisServer::start("a_redis_store_holding_checkpoints_is_named_warm") else {
        return;
    };
    let config = config(&server);
    let cold = run::store_at_start(&config, Policy::Reserved).unwrap();
    assert_eq!((cold.kind, cold.checkpoints), ("redis", 0), "{cold:?}");
    let mut engine = EngineBuilder::new(config.clone())
        .policy(Policy::Reserved)
        .build()
        .unwrap();
    run_one(
        &mut engine,
        RequestSpec::new(1, first_prompt(), 8, Timestamp::ZERO),
    );
    drop(engine);
    let warm = run::store_at_start(&config, Policy::Reserved).unwrap();
    assert!(warm.warm(), "{warm:?}");
    assert!(warm.location.starts_with(&server.url()), "{warm:?}");
    assert!(
        run::describe_stores(&[("reserved".to_string(), warm)]).contains("started warm"),
        "the report names a warm store"
    );
}
