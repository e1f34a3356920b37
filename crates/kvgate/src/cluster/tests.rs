//! Tests of the cluster replay: each router's decisions, engines sharing a store restore each other's
//! checkpoints, every request runs exactly once, the run is deterministic, one engine replays as
//! `run_replay` does, and bad engine counts and router names are refused.

use checkpoint_transfer::HostStore;
use engine::{EngineParams, RequestSpec};

use super::*;
use crate::run::{later_turns, run_replay};
use crate::workload::mooncake::generate::{TraceShape, generate};

/// A small pool's config: 512 pages of 16 tokens.
fn small_config() -> EngineConfig {
    let mut config = EngineConfig::default();
    config.pool.pages = 512;
    config
}

fn params() -> EngineParams {
    small_config().engine_params(Policy::Reserved).unwrap()
}

/// An engine with a private store of its own.
fn engine_alone() -> Engine {
    Engine::builder(params())
        .store(Box::new(HostStore::new(1 << 30)))
        .build()
        .unwrap()
}

/// `n` tokens from `first` on.
fn tokens(first: u32, n: u32) -> Vec<u32> {
    (first..first + n).collect()
}

/// Runs `prompt` on `engine` to its end.
fn serve(engine: &mut Engine, id: u64, prompt: Vec<u32>) {
    let arrival = engine.now();
    engine
        .submit(RequestSpec::new(id, prompt, 4, arrival))
        .unwrap();
    engine.run_until_idle(100_000).unwrap();
    assert!(engine.is_idle());
}

/// Makes `engine` one request busier: a request arriving in a day.
fn load(engine: &mut Engine, id: u64) {
    let arrival = Timestamp(engine.now().0 + Duration::from_secs(86_400));
    engine
        .submit(RequestSpec::new(id, tokens(90_000, 32), 4, arrival))
        .unwrap();
}

fn empty_store() -> SharedStore {
    SharedStore::new(Box::new(HostStore::new(1 << 30)))
}

#[test]
fn round_robin_takes_engines_in_turn() {
    let engines = vec![engine_alone(), engine_alone(), engine_alone()];
    let mut router = RouterState::new(Router::RoundRobin);
    let chosen: Vec<usize> = (0..7)
        .map(|_| choose(&mut router, &engines, &mut empty_store(), &tokens(0, 64)))
        .collect();
    assert_eq!(chosen, vec![0, 1, 2, 0, 1, 2, 0]);
}

#[test]
fn least_loaded_takes_the_engine_with_fewest_live_requests_ties_to_the_lowest_index() {
    let mut engines = vec![engine_alone(), engine_alone(), engine_alone()];
    let mut router = RouterState::new(Router::LeastLoaded);
    let mut store = empty_store();
    assert_eq!(choose(&mut router, &engines, &mut store, &tokens(0, 64)), 0);
    load(&mut engines[0], 1);
    assert_eq!(choose(&mut router, &engines, &mut store, &tokens(0, 64)), 1);
    load(&mut engines[1], 2);
    load(&mut engines[1], 3);
    assert_eq!(choose(&mut router, &engines, &mut store, &tokens(0, 64)), 2);
    load(&mut engines[2], 4);
    assert_eq!(choose(&mut router, &engines, &mut store, &tokens(0, 64)), 0);
}

#[test]
fn cache_aware_follows_the_longest_resident_prefix_over_load() {
    let mut engines = vec![engine_alone(), engine_alone(), engine_alone()];
    let context = tokens(1_000, 256);
    serve(&mut engines[2], 1, context.clone());
    load(&mut engines[2], 2);
    let mut router = RouterState::new(Router::CacheAware);
    let mut store = empty_store();
    let mut next_turn = context.clone();
    next_turn.extend(tokens(5_000, 40));
    // Engine 2 holds the context in its pool: it wins although it is the busiest.
    assert_eq!(choose(&mut router, &engines, &mut store, &next_turn), 2);
    // Nothing resident anywhere: the least loaded, ties to the lowest index.
    assert_eq!(
        choose(&mut router, &engines, &mut store, &tokens(7_000, 300)),
        0
    );
    load(&mut engines[0], 3);
    assert_eq!(
        choose(&mut router, &engines, &mut store, &tokens(7_000, 300)),
        1
    );
}

#[test]
fn cache_aware_sends_a_prompt_the_store_covers_to_the_least_loaded() {
    let store = empty_store();
    let context = tokens(1_000, 256);
    // Engine 0 holds only the first block of the context, and is busy.
    let mut engines = vec![engine_alone(), engine_alone()];
    let mut first_block_only = context[..16].to_vec();
    first_block_only.extend(tokens(60_000, 64));
    serve(&mut engines[0], 1, first_block_only);
    load(&mut engines[0], 2);
    // A third engine captured the whole context into the shared store.
    let mut capturer = Engine::builder(params())
        .store(Box::new(store.clone()))
        .build()
        .unwrap();
    serve(&mut capturer, 3, context.clone());
    assert!(store.stats().n_checkpoints > 0);
    let mut next_turn = context;
    next_turn.extend(tokens(5_000, 40));
    let mut router = RouterState::new(Router::CacheAware);
    // Without the store, engine 0's one resident block decides.
    assert_eq!(
        choose(&mut router, &engines, &mut empty_store(), &next_turn),
        0
    );
    // With it, both engines can serve the context (one by restoring it): the least loaded takes it.
    assert_eq!(
        choose(&mut router, &engines, &mut store.clone(), &next_turn),
        1
    );
}

#[test]
fn engines_sharing_a_store_restore_each_others_checkpoints() {
    let store = empty_store();
    let mut params = params();
    params.verify_restores = true;
    let mut a = Engine::builder(params.clone())
        .store(Box::new(store.clone()))
        .build()
        .unwrap();
    let mut b = Engine::builder(params)
        .store(Box::new(store.clone()))
        .build()
        .unwrap();
    let context = tokens(1_000, 640);
    serve(&mut a, 1, context.clone());
    assert!(store.stats().n_checkpoints > 0, "a captured its context");
    let mut next_turn = context;
    next_turn.extend(tokens(5_000, 40));
    let mut spec = RequestSpec::new(2, next_turn, 4, b.now());
    spec.is_later_turn = true;
    b.submit(spec).unwrap();
    b.run_until_idle(100_000).unwrap();
    let metrics = b.metrics();
    assert_eq!(metrics.requests_finished, 1);
    assert_eq!(metrics.later_turns_restored, 1, "{metrics:?}");
    assert_eq!(metrics.prompt_tokens_restored, 640);
    assert_eq!(metrics.prompt_tokens_local_hit, 0);
    assert!(
        b.pages_verified() > 0,
        "restored pages checked against recompute"
    );
    assert_eq!(metrics.leaked_pages, 0);
}

/// A generated trace of `n` requests: long prompts, high reuse, 4 arrivals a second (the conversation
/// trace's rate is 3.4).
fn generated_trace(n: u32) -> Vec<TraceRequest> {
    let shape = TraceShape {
        n_requests: n,
        rate_per_s: 4.0,
        ..TraceShape::default()
    };
    generate(&shape).unwrap()
}

/// `trace` replayed under `reserved` on `n_engines` engines with `config`, at the trace's own rate.
fn replay_with(
    config: &EngineConfig,
    trace: &[TraceRequest],
    n_engines: u32,
    router: Router,
) -> ClusterRun {
    let later = later_turns(trace);
    let spec = ClusterSpec { n_engines, router };
    run_cluster_replay(
        config,
        trace,
        &later,
        1.0,
        Policy::Reserved,
        spec,
        &mut |_, _| {},
    )
    .unwrap()
}

/// A config for the generated traces: 8192 pages of 16 tokens, twice their longest prompt.
fn trace_config() -> EngineConfig {
    let mut config = EngineConfig::default();
    config.pool.pages = 8192;
    config
}

fn replay(trace: &[TraceRequest], n_engines: u32, router: Router) -> ClusterRun {
    let mut run = replay_with(&trace_config(), trace, n_engines, router);
    run.total.wall_seconds = 0.0;
    for engine in &mut run.engines {
        engine.wall_seconds = 0.0;
    }
    run
}

#[test]
fn a_cluster_replay_runs_every_request_once_and_is_deterministic() {
    let trace = generated_trace(60);
    for router in Router::ALL {
        let run = replay(&trace, 3, router);
        assert_eq!(run.routed.iter().sum::<u64>(), 60, "{router}");
        assert_eq!(run.total.requests_finished, 60, "{router}");
        assert_eq!(run.total.requests_cancelled, 0, "{router}");
        let per_engine: Vec<u64> = run
            .engines
            .iter()
            .map(|engine| u64::from(engine.requests_finished))
            .collect();
        assert_eq!(
            per_engine, run.routed,
            "{router}: each engine ran what it was sent"
        );
        assert_eq!(
            run.total.prompt_tokens,
            trace
                .iter()
                .map(|request| u64::from(request.input_length))
                .sum::<u64>()
        );
        assert_eq!(run.total.leaked_pages, 0);
        assert_eq!(run, replay(&trace, 3, router), "{router}: same run twice");
    }
    let round_robin = replay(&trace, 3, Router::RoundRobin);
    assert_eq!(round_robin.routed, vec![20, 20, 20]);
}

#[test]
fn one_engine_replays_as_run_replay_does() {
    let trace = generated_trace(40);
    let later = later_turns(&trace);
    let mut alone = run_replay(
        &trace_config(),
        &trace,
        &later,
        1.0,
        Policy::Reserved,
        &mut |_, _| {},
    )
    .unwrap();
    alone.wall_seconds = 0.0;
    for router in Router::ALL {
        let cluster = replay(&trace, 1, router);
        assert_eq!(cluster.engines, vec![alone.clone()], "{router}");
        assert_eq!(cluster.total, alone, "{router}");
        assert_eq!(cluster.routed, vec![40]);
    }
}

#[test]
fn keep_up_compares_the_traces_rate_with_the_clusters() {
    let trace = generated_trace(40);
    let run = replay(&trace, 2, Router::LeastLoaded);
    let keep_up = &run.keep_up;
    let span_s = (trace[39].timestamp - trace[0].timestamp) as f64 / 1000.0;
    assert!((keep_up.trace_span_s - span_s).abs() < 1e-9);
    assert_eq!(keep_up.trace_requests, 40);
    assert!((keep_up.needed_requests_per_s - 40.0 / span_s).abs() < 1e-9);
    assert!(keep_up.served_span_s >= keep_up.trace_span_s);
    assert!(
        (keep_up.drain_s - (keep_up.served_span_s - keep_up.trace_span_s)).abs() < 1e-6,
        "{keep_up:?}"
    );
    assert_eq!(keep_up.meets_ttft_slo, keep_up.p99_ttft_s <= TTFT_SLO_P99_S);
    let table = crate::report::cluster_table(&run);
    let header = table.lines().nth(1).unwrap();
    assert!(
        header.contains("engine 0") && header.contains("engine 1"),
        "{table}"
    );
    assert!(header.trim_end().ends_with("total"), "{table}");
    assert!(table.contains("trace: 40 requests over"), "{table}");
    let verdict = if keep_up.meets_ttft_slo {
        "(met)"
    } else {
        "(missed)"
    };
    assert!(table.contains(verdict), "{table}");
    assert!(
        table.contains(&format!("lag: last finish {:.1} s", keep_up.drain_s))
            && table.contains(&format!(
                "p99 ttft {:.2} s against an SLO of 10 s",
                keep_up.p99_ttft_s
            )),
        "{table}"
    );
}

#[test]
fn routers_parse_by_name_and_an_unknown_one_is_refused() {
    for router in Router::ALL {
        assert_eq!(router.name().parse::<Router>().unwrap(), router);
    }
    let error = "random".parse::<Router>().unwrap_err().to_string();
    assert_eq!(
        error,
        "--router random is invalid; allowed: round-robin, least-loaded or cache-aware"
    );
}

#[test]
fn engine_counts_out_of_range_are_refused() {
    assert!(check_engines(1).is_ok());
    assert!(check_engines(ENGINES_MAX).is_ok());
    for bad in [0, ENGINES_MAX + 1, u32::MAX] {
        let error = check_engines(bad).unwrap_err().to_string();
        assert_eq!(
            error,
            format!(
                "--engines {bad} is invalid; allowed: a number of engines from 1 to {ENGINES_MAX}"
            )
        );
    }
}

#[test]
fn a_cluster_replay_refuses_zero_engines_before_building_any() {
    let trace = generated_trace(2);
    let later = later_turns(&trace);
    let spec = ClusterSpec {
        n_engines: 0,
        router: Router::RoundRobin,
    };
    let error = run_cluster_replay(
        &trace_config(),
        &trace,
        &later,
        1.0,
        Policy::Reserved,
        spec,
        &mut |_, _| {},
    )
    .unwrap_err();
    assert!(
        error.to_string().starts_with("--engines 0 is invalid"),
        "{error}"
    );
}

/// `RouterState::choose` for `prompt`, keyed as the replay keys it (16-token blocks, no salt).
fn choose(
    router: &mut RouterState,
    engines: &[Engine],
    store: &mut SharedStore,
    prompt: &[u32],
) -> usize {
    let block_tokens = engines[0].params().geometry.block_tokens() as usize;
    let keys = BlockKey::chain_all(prompt, block_tokens, &[]);
    router.choose(engines, store, &keys)
}

/// The largest pool a config allows: 4 Mi pages, the null page included.
fn largest_pool_config() -> EngineConfig {
    let mut config = EngineConfig::default();
    config.pool.pages = EngineParams::N_PAGES_MAX - 1;
    config
}

#[test]
fn a_cluster_whose_pools_pass_the_memory_limit_is_refused_naming_what_to_lower() {
    // `replay --engines 64 --pool-pages 4194303`: 152 bytes a page (88 of bookkeeping, a 64-byte line of
    // storage), 637 534 208 bytes an engine and policy (the oracle's pool is capped at 1 Mi pages).
    let error = check_memory(&largest_pool_config(), &Policy::ALL, ENGINES_MAX)
        .unwrap_err()
        .to_string();
    assert_eq!(
        error,
        "--engines 64 (pools of ordinary 4194304, pages-only 4194304, reserved 4194304, oracle 1048576 pages \
         an engine: up to 132607115264 bytes of page storage and bookkeeping in all; at most 4 fit) is invalid; \
         allowed: engines whose pools, every policy's together, take at most 8589934592 bytes (8 GiB) of page \
         storage and bookkeeping, every page counted; lower --engines, --pool-pages (pool.pages) or \
         pool.page_bytes, or run fewer policies (--policy; the oracle's pool holds max_running \
         requests of max_model_len tokens)"
    );
    assert!(MEMORY_ALLOWED.contains(&EngineParams::POOL_MEMORY_BYTES_MAX.to_string()));
    // One policy: 13 engines of 4 Mi pages fit, 14 do not.
    assert!(check_memory(&largest_pool_config(), &[Policy::Reserved], 13).is_ok());
    let error = check_memory(&largest_pool_config(), &[Policy::Reserved], 14)
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with(
            "--engines 14 (pools of reserved 4194304 pages an engine: up to 8925478912 bytes of page storage \
             and bookkeeping in all; at most 13 fit) is invalid"
        ),
        "{error}"
    );
    // The default pools fit on the most engines a cluster has, under every policy (the oracle's the largest).
    assert!(check_memory(&EngineConfig::default(), &Policy::ALL, ENGINES_MAX).is_ok());
}

#[test]
fn a_cluster_replay_refuses_pools_past_the_memory_limit_before_building_any() {
    let trace = generated_trace(2);
    let later = later_turns(&trace);
    let spec = ClusterSpec {
        n_engines: ENGINES_MAX,
        router: Router::RoundRobin,
    };
    let run = run_cluster_replay(
        &largest_pool_config(),
        &trace,
        &later,
        1.0,
        Policy::Reserved,
        spec,
        &mut |_, _| {},
    );
    let Err(error) = run else {
        panic!("64 engines of 4 Mi pages were built and ran");
    };
    assert!(
        error.to_string().starts_with(
            "--engines 64 (pools of reserved 4194304 pages an engine: up to 40802189312 bytes"
        ),
        "{error}"
    );
}

#[test]
fn a_cluster_of_big_pools_allocates_only_what_its_requests_touch() {
    // 13 engines of 4 Mi pages each (what the memory limit allows under one policy) replay two requests:
    // their pools and page storage hold what those touch, not the 8.3 GB of every page.
    let trace = generated_trace(2);
    let later = later_turns(&trace);
    let config = largest_pool_config();
    let params = config.engine_params(Policy::Reserved).unwrap();
    let mut store = SharedStore::new(crate::builder::open_store(&config, &params).unwrap());
    let mut engines: Vec<Engine> = (0..13)
        .map(|_| {
            Engine::builder(params.clone())
                .store(Box::new(store.clone()))
                .build()
                .unwrap()
        })
        .collect();
    let mut router = RouterState::new(Router::RoundRobin);
    let block_tokens = params.geometry.block_tokens();
    let mut scratch = Vec::new();
    let arrivals = replay_arrivals(&trace, &later, 1.0).unwrap();
    for (i, request) in trace.iter().enumerate() {
        let keyed = keyed_trace_request(
            i,
            request,
            arrivals[i],
            later[i],
            block_tokens,
            &mut scratch,
        )
        .unwrap();
        let target = router.choose(&engines, &mut store, keyed.keys());
        submit_keyed_or_reject(&mut engines[target], keyed).unwrap();
    }
    while engines.iter().any(|engine| !engine.is_idle()) {
        for engine in engines.iter_mut().filter(|engine| !engine.is_idle()) {
            engine.step().unwrap();
        }
    }
    let touched: usize = engines
        .iter()
        .map(|engine| engine.pool().bookkeeping_bytes())
        .sum();
    assert!(
        touched < 16 << 20,
        "13 engines hold {touched} bytes of pool bookkeeping"
    );
}

/// Issue 27, item 4, on a cluster: an engine the liveness watchdog stops ends the replay with the report of
/// what the cluster did until then, marked stopped (naming the engine), and not kept up.
#[test]
fn a_cluster_replay_the_watchdog_stops_keeps_its_report_marked_stopped() {
    let mut config = trace_config();
    config.scheduler.stall_timeout_s = 1e-6;
    let run = replay_with(&config, &generated_trace(8), 2, Router::RoundRobin);
    let stopped = run
        .total
        .stopped
        .as_deref()
        .expect("stopped by the watchdog");
    assert!(
        stopped.starts_with("engine 0: no progress for"),
        "{stopped}"
    );
    assert!(!run.keep_up.meets_ttft_slo);
    assert!(
        crate::report::cluster_table(&run).contains("INCOMPLETE: reserved stopped early: engine 0")
    );
    assert_eq!(
        crate::report::cluster_json(&run)["stopped"],
        serde_json::json!(stopped)
    );
}

#[test]
fn an_observer_stops_a_cluster_replay_at_the_step_it_asks() {
    struct StopAfter(u64);
    impl Observer for StopAfter {
        fn step(&mut self, _engine: &Engine, _report: &engine::StepReport) {
            self.0 = self.0.saturating_sub(1);
        }
        fn stop(&mut self) -> bool {
            self.0 == 0
        }
    }
    let trace = generated_trace(60);
    let later = later_turns(&trace);
    let spec = ClusterSpec {
        n_engines: 2,
        router: Router::RoundRobin,
    };
    let run = (1.0, Policy::Reserved, spec);
    let mut stop = StopAfter(4);
    let config = trace_config();
    let stopped =
        run_cluster_replay_observed(&config, &trace, &later, run, &mut |_, _| {}, &mut stop);
    assert!(matches!(stopped, Err(Error::Interrupted)), "{stopped:?}");
    assert_eq!(stop.0, 0);
}
