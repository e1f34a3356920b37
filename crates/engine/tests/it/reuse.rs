//! L2 under real concurrency: no page is reused while a copy into it is in flight. The engine runs its copies
//! on `CopyEngineKind::Reordering`: worker threads doing real memcpy behind a seeded adversary that delays
//! every job's start and completion by a number of polls, reports completions out of submission order, lets a
//! cancelled copy still write its pages and a failed one write them before it fails, and notes every write by
//! anyone else into a page one of its copies owns (`Engine::check_invariants` fails on one, and on a page a
//! copy touches that no import holds). Every import state (copying; admitted and loading under `ordinary`;
//! published; draining after a cancel) meets every event (cancel, forced reset, copy failure, shutdown) under
//! `ordinary`, `pages-only` and `reserved`, with requests allocating pages all along so that a page freed too
//! early is reused at once; the invariants and the leak count are checked after every call.

use std::time::Duration;

use checkpoint_transfer::Fault;
use engine::{CopyEngineKind, Engine, EngineParams, Policy, RequestPhase};
use kv_pool::RequestId;
use proptest::prelude::*;

use crate::agents::tokens;
use crate::contract::{TPP, params, seed_checkpoint, spec};

const POLICIES: [Policy; 3] = [Policy::Ordinary, Policy::PagesOnly, Policy::Reserved];

/// Seeds of the reordering engine's schedule each scenario runs under.
const SEEDS: [u64; 3] = [1, 2, 3];

/// The restore the scenarios follow.
const RESTORE: RequestId = RequestId(2);

/// Where the followed restore's import is when the event comes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Its copy is in flight: staged (`pages-only`, `reserved`), or admitted and loading (`ordinary`).
    Copying,
    /// Published, not admitted yet: an owned ready import (`reserved`) or evictable cached pages
    /// (`pages-only`). `ordinary` admits before it copies, so it has no such state.
    Published,
    /// Cancelled while copying: its pages stay pinned until its copies drain (O5).
    Draining,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    /// Cancel the restore (draining: a new request reusing its id, cancelled in turn).
    Cancel,
    /// `force_reset_prefix_cache`.
    ForcedReset,
    /// Every copy in flight fails (after writing its pages), and so does the next one.
    CopyFailure,
    /// `Engine::shutdown`.
    Shutdown,
}

fn states(policy: Policy) -> &'static [State] {
    match policy {
        Policy::Ordinary => &[State::Copying, State::Draining],
        _ => &[State::Copying, State::Published, State::Draining],
    }
}

/// `policy` with reordered threaded copies from `seed`: four slots, a budget of 64 tokens a step (a long
/// prefill spends it, so a published import waits), every restore verified.
fn l2_params(policy: Policy, seed: u64) -> EngineParams {
    EngineParams {
        copy_engine: CopyEngineKind::Reordering { workers: 2, seed },
        verify_restores: true,
        max_running: 4,
        chunk_tokens: 64,
        max_batched_tokens: 64,
        ..params(policy, 160)
    }
}

/// Checks what must hold after every call: the engine's invariants (no page free or unheld under a copy, no
/// write by anyone else into a page a copy owns) and no leaked page.
fn check(engine: &Engine, context: &str) {
    if let Err(error) = engine.check_invariants() {
        panic!("{context}: {error}");
    }
    assert_eq!(engine.leaked_pages(), 0, "{context}: leaked pages");
}

fn checked_step(engine: &mut Engine, context: &str) {
    if let Err(error) = engine.step() {
        panic!("{context}: step: {error}");
    }
    check(engine, context);
}

/// Whether the followed restore is in `state` (for `Draining`: in its copying state, about to be cancelled).
fn in_state(engine: &Engine, state: State, seen_copying: bool) -> bool {
    let Some(view) = engine.request(RESTORE) else {
        return false;
    };
    let copying = view.loading || engine.restore_gauges().importing.contains(&RESTORE);
    match state {
        State::Copying | State::Draining => copying,
        State::Published => match engine.params().policy {
            Policy::PagesOnly => seen_copying && view.phase == RequestPhase::Waiting,
            _ => view.phase == RequestPhase::Ready,
        },
    }
}

/// Requests that allocate pages all along (a long decode, a long chunked prefill): a page freed under a copy
/// would be reused at once.
fn start_background(engine: &mut Engine, context: &str) {
    engine
        .submit(spec(10, tokens(21, 10, 0, 3 * TPP), 300, engine.now()))
        .unwrap();
    engine
        .submit(spec(11, tokens(21, 11, 0, 30 * TPP), 4, engine.now()))
        .unwrap();
    check(engine, context);
}

/// Brings a fresh engine to the point where the followed restore is in `state`: two checkpoints in the store,
/// a long decode and a long chunked prefill running, the followed restore and a second one submitted.
fn reach(policy: Policy, state: State, seed: u64) -> Engine {
    let context = format!("{policy} {state:?} seed {seed}");
    let mut engine = Engine::new(l2_params(policy, seed)).expect("valid params");
    let history = tokens(21, 0, 0, 12 * TPP);
    let other = tokens(21, 1, 0, 9 * TPP);
    seed_checkpoint(&mut engine, 100, &history, 1);
    seed_checkpoint(&mut engine, 101, &other, 1);
    check(&engine, &context);
    // A ready import under `reserved` is admitted in the step that publishes it, unless it is published by
    // an idle step waiting for the copies: the background starts once it is ready.
    let background_first = !(policy == Policy::Reserved && state == State::Published);
    if background_first {
        start_background(&mut engine, &context);
    }
    engine
        .submit(spec(
            RESTORE.0,
            [history, tokens(21, 0, 1, 8)].concat(),
            6,
            engine.now(),
        ))
        .unwrap();
    engine
        .submit(spec(
            3,
            [other, tokens(21, 1, 1, 8)].concat(),
            6,
            engine.now(),
        ))
        .unwrap();
    let mut seen_copying = false;
    for _ in 0..2_000 {
        if in_state(&engine, state, seen_copying) {
            break;
        }
        seen_copying |= in_state(&engine, State::Copying, false);
        checked_step(&mut engine, &context);
    }
    assert!(
        in_state(&engine, state, seen_copying),
        "{context}: the restore never reached the state: {:?}",
        engine.request(RESTORE)
    );
    if !background_first {
        start_background(&mut engine, &context);
    }
    if state == State::Draining {
        engine.cancel(RESTORE).unwrap();
        check(&engine, &format!("{context}: cancelled while copying"));
        assert!(
            engine.restore_gauges().copies_in_flight > 0,
            "{context}: the cancelled copy drains"
        );
    }
    engine
}

/// Applies `event` to the followed restore in `state`.
fn apply(engine: &mut Engine, state: State, event: Event, context: &str) {
    match event {
        Event::Cancel if state == State::Draining => {
            // O5: a new request reusing the id inherits nothing from the draining import.
            let prompt = [tokens(21, 0, 0, 12 * TPP), tokens(21, 0, 2, 8)].concat();
            engine
                .submit(spec(RESTORE.0, prompt, 6, engine.now()))
                .unwrap();
            check(engine, context);
            checked_step(engine, context);
            engine.cancel(RESTORE).unwrap();
        }
        Event::Cancel => engine.cancel(RESTORE).unwrap(),
        Event::ForcedReset => engine.force_reset_prefix_cache().unwrap(),
        Event::CopyFailure => {
            engine
                .inject_copy_fault(Fault::FailInFlight { rank: 0 })
                .expect("the reordering engine takes failures");
            engine
                .inject_copy_fault(Fault::FailNext { rank: 0 })
                .expect("the reordering engine takes failures");
        }
        Event::Shutdown => {
            let report = engine.shutdown().expect("shutdown");
            assert!(report.cancelled.len() >= 2, "{context}: {report:?}");
            assert_eq!(engine.pool().n_in_use(), 0, "{context}: every page is free");
            assert_eq!(engine.restore_gauges().copies_in_flight, 0, "{context}");
        }
    }
    check(engine, &format!("{context}: after the event"));
}

/// Runs one scenario to the end: the event, a request allocating at once, every request to completion, then
/// a shutdown that finds every page free.
fn scenario(policy: Policy, state: State, event: Event, seed: u64) {
    let context = format!("{policy} {state:?} {event:?} seed {seed}");
    let mut engine = reach(policy, state, seed);
    apply(&mut engine, state, event, &context);
    // A request that allocates at once: it would take any page freed while still copied into.
    engine
        .submit(spec(20, tokens(21, 20, 0, 6 * TPP), 8, engine.now()))
        .unwrap();
    check(&engine, &context);
    for _ in 0..20_000 {
        if engine.is_idle() {
            break;
        }
        checked_step(&mut engine, &context);
    }
    assert!(engine.is_idle(), "{context}: the run ends");
    let finished = engine.take_finished();
    let done = |id: u64| {
        finished
            .iter()
            .any(|done| done.id == RequestId(id) && !done.cancelled && !done.output.is_empty())
    };
    assert!(done(20), "{context}: the late request finished");
    if event != Event::Shutdown {
        assert!(done(3), "{context}: the second restore finished");
        assert!(done(10) && done(11), "{context}: the background finished");
    }
    if matches!(event, Event::ForcedReset | Event::CopyFailure) && state != State::Draining {
        assert!(done(RESTORE.0), "{context}: the followed restore finished");
    }
    let report = engine.shutdown().expect("shutdown");
    assert!(report.cancelled.is_empty(), "{context}: {report:?}");
    assert_eq!(engine.pool().n_in_use(), 0, "{context}: every page is free");
    assert_eq!(engine.metrics().leaked_pages, 0, "{context}");
    check(&engine, &context);
}

fn every_state_and_seed(event: Event) {
    for policy in POLICIES {
        for &state in states(policy) {
            for seed in SEEDS {
                scenario(policy, state, event, seed);
            }
        }
    }
}

#[test]
fn l2_cancel_in_every_import_state_reuses_no_page_under_a_copy() {
    every_state_and_seed(Event::Cancel);
}

#[test]
fn l2_forced_reset_in_every_import_state_reuses_no_page_under_a_copy() {
    every_state_and_seed(Event::ForcedReset);
}

#[test]
fn l2_copy_failure_in_every_import_state_reuses_no_page_under_a_copy() {
    every_state_and_seed(Event::CopyFailure);
}

#[test]
fn l2_shutdown_in_every_import_state_drains_and_frees_every_page() {
    every_state_and_seed(Event::Shutdown);
}

#[test]
fn l2_the_reordering_engine_restores_real_bytes_under_every_policy() {
    // Without any event the reordered copies land, verified byte for byte (E3), and the state matrix above
    // does reach every state.
    for policy in POLICIES {
        for &state in states(policy) {
            let mut engine = reach(policy, state, 7);
            for _ in 0..20_000 {
                if engine.is_idle() {
                    break;
                }
                checked_step(&mut engine, &format!("{policy} {state:?}"));
            }
            assert!(engine.is_idle(), "{policy} {state:?}");
            assert_eq!(engine.pool().n_in_use(), 0, "{policy} {state:?}");
            if state != State::Draining {
                assert!(engine.pages_verified() > 0, "{policy}: restores landed");
            }
        }
    }
}

/// One call of the public API in the L2 property test.
#[derive(Clone, Debug)]
enum Call {
    /// A later turn of history `history` plus `extra` new tokens: a restore; with `until_copying`, then steps
    /// until a copy is in flight (at most 40 steps), so the next call meets it.
    Restore {
        id: u64,
        history: u32,
        extra: u32,
        until_copying: bool,
    },
    /// A cold request of `pages` pages.
    Cold {
        id: u64,
        pages: u32,
    },
    Cancel {
        id: u64,
    },
    /// Steps until a copy is in flight (at most 40 steps), then cancels a request whose restore copies.
    CancelCopying,
    ForcedReset,
    FailInFlight,
    FailNext,
    Shutdown,
    Steps {
        n: u32,
    },
    Advance {
        ms: u64,
    },
}

fn call() -> impl Strategy<Value = Call> {
    let id = 0u64..6;
    prop_oneof![
        6 => (id.clone(), 0u32..HISTORIES, 1u32..40, any::<bool>()).prop_map(
            |(id, history, extra, until_copying)| Call::Restore { id, history, extra, until_copying }
        ),
        2 => (id.clone(), 1u32..12).prop_map(|(id, pages)| Call::Cold { id, pages }),
        1 => id.prop_map(|id| Call::Cancel { id }),
        2 => Just(Call::CancelCopying),
        1 => Just(Call::ForcedReset),
        1 => Just(Call::FailInFlight),
        1 => Just(Call::FailNext),
        1 => Just(Call::Shutdown),
        4 => (1u32..6).prop_map(|n| Call::Steps { n }),
        1 => (0u64..3000).prop_map(|ms| Call::Advance { ms }),
    ]
}

/// Checkpoints in the store at the start of each case, of 4 to 18 pages: the pool keeps few of them
/// resident, so most later turns restore.
const HISTORIES: u32 = 8;

fn history(index: u32) -> Vec<u32> {
    tokens(22, index, 0, (4 + 2 * index) * TPP)
}

fn step_until_copying(engine: &mut Engine) {
    for _ in 0..40 {
        if engine.restore_gauges().copies_in_flight > 0 {
            return;
        }
        engine.step().unwrap();
        check(engine, "a step");
    }
}

fn apply_call(engine: &mut Engine, call: &Call) {
    match *call {
        Call::Restore {
            id,
            history: h,
            extra,
            until_copying,
        } => {
            let prompt = [history(h), tokens(22, h, 1 + id as u32, extra)].concat();
            let _result = engine.submit(spec(id, prompt, 6, engine.now()));
            if until_copying {
                step_until_copying(engine);
            }
        }
        Call::Cold { id, pages } => {
            let prompt = tokens(23, id as u32, pages, pages * TPP - 3);
            let _result = engine.submit(spec(id, prompt, 12, engine.now()));
        }
        Call::Cancel { id } => {
            let _result = engine.cancel(RequestId(id));
        }
        Call::ForcedReset => engine.force_reset_prefix_cache().unwrap(),
        Call::FailInFlight => engine
            .inject_copy_fault(Fault::FailInFlight { rank: 0 })
            .unwrap(),
        Call::FailNext => engine
            .inject_copy_fault(Fault::FailNext { rank: 0 })
            .unwrap(),
        Call::Shutdown => {
            let _report = engine.shutdown().unwrap();
            assert_eq!(engine.pool().n_in_use(), 0, "a shutdown frees every page");
        }
        Call::Steps { n } => {
            for _ in 0..n {
                engine.step().unwrap();
                check(engine, "a step");
            }
        }
        Call::CancelCopying => {
            step_until_copying(engine);
            let loading = (0..6)
                .map(RequestId)
                .find(|&id| engine.request(id).is_some_and(|view| view.loading));
            let copying = engine
                .restore_gauges()
                .importing
                .first()
                .copied()
                .or(loading);
            if let Some(id) = copying {
                engine.cancel(id).unwrap();
            }
        }
        Call::Advance { ms } => {
            let to = engine.now().after(Duration::from_millis(ms));
            engine.advance_clock(to);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        // PROPTEST_CASES overrides the count (e.g. 10x before a release).
        std::env::var("PROPTEST_CASES").ok().and_then(|cases| cases.parse().ok()).unwrap_or(24)
    ))]

    /// L2: under any interleaving of restores, cold requests, cancels, forced resets, copy failures,
    /// shutdowns, steps and clock jumps, with copies delayed and reordered from any seed, no page is freed,
    /// unheld or written by anyone else while a copy owns it, no page leaks after any call, and once the
    /// calls stop the engine runs idle and a shutdown finds every page free.
    #[test]
    fn l2_random_interleavings_never_reuse_a_page_under_a_copy(
        seed in any::<u64>(),
        calls in proptest::collection::vec(call(), 1..60),
    ) {
        for policy in POLICIES {
            let mut engine = Engine::new(EngineParams {
                max_running: 3,
                chunk_tokens: 48,
                max_batched_tokens: 64,
                restore_max_wait: Duration::from_millis(500),
                n_pages: 64,
                ..l2_params(policy, seed)
            }).unwrap();
            for index in 0..HISTORIES {
                seed_checkpoint(&mut engine, 50 + u64::from(index), &history(index), 1);
            }
            for call in &calls {
                apply_call(&mut engine, call);
                check(&engine, &format!("{policy} seed {seed} after {call:?}"));
            }
            for _ in 0..50_000 {
                if engine.is_idle() {
                    break;
                }
                engine.step().unwrap();
                check(&engine, &format!("{policy} seed {seed} draining"));
            }
            prop_assert!(engine.is_idle(), "{policy} seed {seed}");
            let _report = engine.shutdown().unwrap();
            prop_assert_eq!(engine.pool().n_in_use(), 0);
            prop_assert_eq!(engine.metrics().leaked_pages, 0);
            check(&engine, &format!("{policy} seed {seed} at the end"));
        }
    }
}
