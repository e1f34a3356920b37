//! Contract behaviours pinned through the engine's public API: Q4-Q7, X1, X2, G1-G5, E1-E3.

use std::time::Duration;

use checkpoint_transfer::Fault;
use engine::{Engine, EngineParams, Error, FallbackReason, Policy, RequestSpec, StepReport};
use kv_pool::{RequestId, Timestamp};

use crate::agents::{Agents, run_agents, tokens};

pub(crate) const TPP: u32 = 16;

pub(crate) fn params(policy: Policy, n_pages: u32) -> EngineParams {
    EngineParams {
        policy,
        n_pages,
        max_running: 4,
        chunk_tokens: 512,
        ..crate::verified_defaults()
    }
}

pub(crate) fn spec(
    id: u64,
    prompt: Vec<u32>,
    max_output_tokens: u32,
    now: Timestamp,
) -> RequestSpec {
    let mut spec = RequestSpec::new(id, prompt, max_output_tokens, now);
    spec.salt = b"t".to_vec();
    spec
}

/// Steps until `done` holds (panics after `max_steps`), returning every report.
fn step_until(
    engine: &mut Engine,
    max_steps: u32,
    mut done: impl FnMut(&Engine, &StepReport) -> bool,
) -> Vec<StepReport> {
    let mut reports = Vec::new();
    for _ in 0..max_steps {
        let report = engine.step().expect("step");
        engine.check_invariants().expect("invariants");
        let stop = done(engine, &report);
        reports.push(report);
        if stop {
            return reports;
        }
    }
    panic!("condition not reached in {max_steps} steps; engine {engine:?}");
}

fn phase(engine: &Engine, id: u64) -> &'static str {
    engine
        .request(RequestId(id))
        .map_or("gone", |view| view.phase.name())
}

/// Runs `prompt` once as request `id` so its checkpoints land in the store, then drops the local prefix cache.
pub(crate) fn seed_checkpoint(
    engine: &mut Engine,
    id: u64,
    prompt: &[u32],
    max_output_tokens: u32,
) -> Vec<u32> {
    engine
        .submit(spec(id, prompt.to_vec(), max_output_tokens, engine.now()))
        .unwrap();
    let _steps = engine.run_until_idle(100_000).expect("run");
    let finished = engine.take_finished();
    let output = finished
        .iter()
        .find(|finished| finished.id == RequestId(id))
        .unwrap()
        .output
        .clone();
    engine.reset_prefix_cache().unwrap();
    output
}

/// A long-running decode holding about `n_pages` pages.
fn start_hog(engine: &mut Engine, id: u64, n_pages: u32) {
    start_hog_for(engine, id, n_pages, 60);
}

/// `start_hog` decoding `output_tokens` tokens; returns once it has decoded one.
fn start_hog_for(engine: &mut Engine, id: u64, n_pages: u32, output_tokens: u32) {
    engine
        .submit(spec(
            id,
            tokens(99, id as u32, 0, n_pages * TPP - 1),
            output_tokens,
            engine.now(),
        ))
        .unwrap();
    step_until(engine, 100, |engine, _| {
        engine
            .request(RequestId(id))
            .is_some_and(|view| view.n_output > 0)
    });
}

/// A paused streaming session holding about `n_pages` pages, so restores wait without any step running.
fn hold_with_paused_stream(engine: &mut Engine, id: u64, n_pages: u32) {
    let mut stream = spec(
        id,
        tokens(98, id as u32, 0, n_pages * TPP - 1),
        1,
        engine.now(),
    );
    stream.streaming = true;
    engine.submit(stream).unwrap();
    step_until(engine, 100, |engine, _| phase(engine, id) == "paused");
}

#[test]
fn q4_full_prompt_restore_with_saved_logits_gets_logits_only_step_behind_blocked_head() {
    let mut engine = Engine::new(params(Policy::Reserved, 41)).unwrap();
    let prompt = tokens(1, 0, 0, 4 * TPP);
    seed_checkpoint(&mut engine, 1, &prompt, 1);
    start_hog(&mut engine, 2, 28);
    engine
        .submit(spec(3, tokens(1, 3, 0, 20 * TPP), 4, engine.now()))
        .unwrap();
    // Its lookup answers a lookup latency later: nothing in the store.
    step_until(&mut engine, 10, |engine, _| phase(engine, 3) != "restoring");
    assert_eq!(phase(&engine, 3), "waiting", "the cold head is blocked");
    let mut restore = spec(4, prompt, 4, engine.now());
    restore.saved_logits = true;
    engine.submit(restore).unwrap();
    let reports = step_until(&mut engine, 50, |_, report| {
        report.logits_only.contains(&RequestId(4))
    });
    let last = reports.last().unwrap();
    assert_eq!(
        phase(&engine, 3),
        "waiting",
        "the ready import passed the blocked head"
    );
    assert!(
        last.prefills.is_empty() && last.decodes.is_empty(),
        "the logits-only step runs nothing else: {last:?}"
    );
    engine.cancel(RequestId(2)).unwrap();
    let _steps = engine.run_until_idle(100_000).expect("run");
    let metrics = engine
        .request_metrics()
        .iter()
        .find(|m| m.id == Some(RequestId(4)))
        .unwrap()
        .clone();
    assert_eq!(metrics.prompt_tokens_restored, 4 * TPP, "external hits");
    assert_eq!(metrics.prompt_tokens_local_hit, 0, "not local hits");
    assert_eq!(metrics.prompt_tokens_recomputed, 0);
}

#[test]
fn q4_ordinary_page_aligned_full_prompt_restore_with_saved_logits_samples_without_computing() {
    // The review's panic: under `ordinary` the restored request was scheduled a decode at a position past its
    // prompt. Page-aligned, 20 pages, restored at once, it samples from the saved logits.
    let mut engine = Engine::new(params(Policy::Ordinary, 64)).unwrap();
    let prompt = tokens(1, 0, 0, 20 * TPP);
    seed_checkpoint(&mut engine, 1, &prompt, 1);
    let mut restore = spec(4, prompt, 3, engine.now());
    restore.saved_logits = true;
    engine.submit(restore).unwrap();
    let reports = step_until(&mut engine, 100, |engine, _| {
        engine.request(RequestId(4)).is_none()
    });
    assert!(
        reports
            .iter()
            .any(|report| report.logits_only.contains(&RequestId(4))),
        "it sampled from its saved logits"
    );
    assert!(
        reports
            .iter()
            .all(|report| report.prefills.iter().all(|(id, _)| *id != RequestId(4))),
        "nothing of the prompt was computed"
    );
    let metrics = engine
        .request_metrics()
        .iter()
        .find(|m| m.id == Some(RequestId(4)))
        .unwrap()
        .clone();
    assert_eq!(metrics.prompt_tokens_restored, 20 * TPP);
    assert_eq!(metrics.prompt_tokens_recomputed, 0);
    assert_eq!(metrics.decode_tokens, 3);
    assert_eq!(engine.metrics().leaked_pages, 0);
}

#[test]
fn q5_ready_import_never_suppresses_the_decode_pass() {
    let mut engine = Engine::new(params(Policy::Reserved, 41)).unwrap();
    let prompt = tokens(1, 0, 0, 4 * TPP);
    seed_checkpoint(&mut engine, 1, &prompt, 1);
    start_hog(&mut engine, 2, 20);
    let mut restore = spec(4, prompt, 4, engine.now());
    restore.saved_logits = true;
    engine.submit(restore).unwrap();
    let reports = step_until(&mut engine, 50, |_, report| {
        report.logits_only.contains(&RequestId(4))
    });
    // Every step but the isolated logits-only one (Q4) schedules the running decode.
    let (isolated, others) = reports.split_last().expect("a step");
    assert!(isolated.decodes.is_empty() && isolated.prefills.is_empty());
    for report in others {
        assert!(
            report.decodes.contains(&RequestId(2)),
            "the running decode is scheduled every step: {report:?}"
        );
        assert!(report.preempted.is_empty());
    }
    let next = engine.step().expect("step");
    assert!(
        next.decodes.contains(&RequestId(2)) && next.decodes.contains(&RequestId(4)),
        "after the isolated step the decode pass runs, the restored request with it: {next:?}"
    );
}

#[test]
fn q5_isolated_steps_never_run_twice_in_a_row_while_requests_decode() {
    let mut engine = Engine::new(params(Policy::Reserved, 80)).unwrap();
    let prompts: Vec<Vec<u32>> = (0..2).map(|i| tokens(1, i, 0, 4 * TPP)).collect();
    for (i, prompt) in prompts.iter().enumerate() {
        seed_checkpoint(&mut engine, 10 + i as u64, prompt, 1);
    }
    start_hog(&mut engine, 2, 20);
    // The two restores become ready in different steps, each with its isolated step; a decode pass runs
    // between any two of them.
    for (i, prompt) in prompts.into_iter().enumerate() {
        let mut restore = spec(4 + i as u64, prompt, 4, engine.now());
        restore.saved_logits = true;
        engine.submit(restore).unwrap();
        engine
            .inject_copy_fault(Fault::DelayNext {
                rank: 0,
                by: Duration::from_millis(1 + 5 * i as u64),
            })
            .expect("inline copies take faults");
    }
    let reports = step_until(&mut engine, 200, |engine, _| {
        engine.request(RequestId(4)).is_none() && engine.request(RequestId(5)).is_none()
    });
    let isolated: Vec<bool> = reports
        .iter()
        .map(|report| !report.logits_only.is_empty())
        .collect();
    assert!(isolated.iter().any(|&isolated| isolated));
    for (pair, reports) in isolated.windows(2).zip(reports.windows(2)) {
        assert!(
            !(pair[0] && pair[1]),
            "two isolated steps in a row: {reports:?}"
        );
    }
    for report in reports
        .iter()
        .filter(|report| !report.logits_only.is_empty())
    {
        assert!(report.decodes.is_empty() && report.prefills.is_empty());
    }
}

#[test]
fn q6_reservations_never_preempt_running_decodes_and_contended_steps_schedule_work() {
    let mut engine = Engine::new(params(Policy::Reserved, 49)).unwrap();
    let prompt = tokens(1, 0, 0, 20 * TPP);
    seed_checkpoint(&mut engine, 1, &prompt, 1);
    start_hog_for(&mut engine, 2, 30, 40);
    engine
        .submit(spec(
            4,
            [prompt.clone(), vec![7; 8]].concat(),
            4,
            engine.now(),
        ))
        .unwrap();
    let reports = step_until(&mut engine, 10_000, |engine, _| {
        engine.request(RequestId(4)).is_none()
    });
    assert!(
        reports.iter().all(|report| report.preempted.is_empty()),
        "a reservation preempted a decode"
    );
    let waited = reports
        .iter()
        .filter(|report| !report.decodes.is_empty())
        .count();
    assert!(
        waited >= 30,
        "the decode kept running while the restore waited ({waited} steps)"
    );
    let metrics = engine
        .request_metrics()
        .iter()
        .find(|m| m.id == Some(RequestId(4)))
        .unwrap()
        .clone();
    assert!(
        metrics.restored && metrics.capacity_waits == 1,
        "{metrics:?}"
    );
}

#[test]
fn q7_streaming_resume_bypasses_the_admission_gate_ahead_of_a_capacity_waiter() {
    let mut engine = Engine::new(params(Policy::Reserved, 49)).unwrap();
    let prompt = tokens(1, 0, 0, 20 * TPP);
    seed_checkpoint(&mut engine, 1, &prompt, 1);
    let mut stream = spec(5, tokens(5, 5, 0, 6 * TPP), 2, engine.now());
    stream.streaming = true;
    engine.submit(stream).unwrap();
    step_until(&mut engine, 100, |engine, _| phase(engine, 5) == "paused");
    start_hog(&mut engine, 2, 24);
    engine
        .submit(spec(4, [prompt, vec![7; 8]].concat(), 4, engine.now()))
        .unwrap();
    step_until(&mut engine, 10, |engine, _| {
        engine
            .request(RequestId(4))
            .is_some_and(|view| view.is_waiter)
    });
    engine.resume(RequestId(5), &[3; 8], 2).unwrap();
    let report = engine.step().expect("step");
    assert!(
        report.prefills.iter().any(|(id, _)| *id == RequestId(5)),
        "the resume ran at once: {report:?}"
    );
    assert!(
        engine.request(RequestId(4)).unwrap().is_waiter,
        "ahead of the capacity waiter"
    );
    assert_eq!(
        engine
            .resume(RequestId(2), &[1], 1)
            .unwrap_err()
            .to_string(),
        "request req-2 is not a paused streaming session"
    );
}

#[test]
fn x1_forced_reset_preempts_releases_imports_and_frees_every_page() {
    let mut engine = Engine::new(params(Policy::Reserved, 129)).unwrap();
    let prompt = tokens(1, 0, 0, 8 * TPP);
    seed_checkpoint(&mut engine, 1, &prompt, 1);
    start_hog(&mut engine, 2, 20);
    engine
        .inject_copy_fault(Fault::DelayNext {
            rank: 0,
            by: Duration::from_secs(5),
        })
        .expect("inline copies take faults");
    engine
        .submit(spec(4, [prompt, vec![7; 8]].concat(), 4, engine.now()))
        .unwrap();
    step_until(&mut engine, 10, |engine, _| {
        engine
            .request(RequestId(4))
            .is_some_and(|view| view.has_ticket)
    });
    engine.force_reset_prefix_cache().unwrap();
    assert_eq!(
        phase(&engine, 2),
        "waiting",
        "running requests are preempted"
    );
    assert_eq!(
        phase(&engine, 4),
        "waiting",
        "the import's request falls back to an ordinary lookup"
    );
    assert_eq!(engine.ledger_snapshot().unwrap().tickets.len(), 0);
    engine.check_invariants().expect("invariants");
    let report = engine.step().expect("step");
    assert!(
        report
            .prefills
            .iter()
            .any(|(id, n)| *id == RequestId(2) && *n > 0),
        "the next step recomputes"
    );
    engine.cancel(RequestId(2)).unwrap();
    engine.cancel(RequestId(4)).unwrap();
    let _steps = engine.run_until_idle(1000).expect("run");
    assert!(engine.is_idle());
    engine.force_reset_prefix_cache().unwrap();
    assert_eq!(
        engine.pool().n_free(),
        engine.pool().n_usable(),
        "every page but the null page is free"
    );
    assert_eq!(engine.pool().n_cached_free(), 0);
}

#[test]
fn x2_non_forced_reset_fails_while_an_import_is_staged_and_changes_nothing() {
    let mut engine = Engine::new(params(Policy::Reserved, 129)).unwrap();
    let prompt = tokens(1, 0, 0, 8 * TPP);
    seed_checkpoint(&mut engine, 1, &prompt, 1);
    engine
        .inject_copy_fault(Fault::DelayNext {
            rank: 0,
            by: Duration::from_secs(5),
        })
        .expect("inline copies take faults");
    engine
        .submit(spec(4, [prompt, vec![7; 8]].concat(), 4, engine.now()))
        .unwrap();
    step_until(&mut engine, 10, |engine, _| {
        engine
            .request(RequestId(4))
            .is_some_and(|view| view.has_ticket)
    });
    let (free, cached) = (engine.pool().n_free(), engine.pool().n_cached_free());
    let error = engine.reset_prefix_cache().unwrap_err();
    assert!(
        matches!(error, Error::ResetRefusedImports { n_imports: 1 }),
        "{error}"
    );
    assert_eq!(
        (engine.pool().n_free(), engine.pool().n_cached_free()),
        (free, cached)
    );
    let _steps = engine.run_until_idle(100_000).expect("run");
    let metrics = engine
        .request_metrics()
        .iter()
        .find(|m| m.id == Some(RequestId(4)))
        .unwrap()
        .clone();
    assert!(metrics.restored, "the restore went on");
}

#[test]
fn g1_without_the_contract_pressure_admits_and_recomputes() {
    for policy in [Policy::Ordinary, Policy::PagesOnly] {
        let mut engine = Engine::new(EngineParams {
            restore_max_wait: Duration::ZERO,
            ..params(policy, 49)
        })
        .unwrap();
        let prompt = tokens(1, 0, 0, 20 * TPP);
        seed_checkpoint(&mut engine, 1, &prompt, 1);
        start_hog(&mut engine, 2, 30);
        engine
            .submit(spec(4, [prompt, vec![7; 8]].concat(), 4, engine.now()))
            .unwrap();
        let _steps = engine.run_until_idle(100_000).expect("run");
        assert!(
            engine.ledger_snapshot().is_none(),
            "{policy}: no ledger, no reservation call"
        );
        let metrics = engine
            .request_metrics()
            .iter()
            .find(|m| m.id == Some(RequestId(4)))
            .unwrap()
            .clone();
        assert!(!metrics.restored, "{policy}: {metrics:?}");
        assert!(metrics.fallback.is_some(), "{policy}: {metrics:?}");
        assert!(
            metrics.prompt_tokens_recomputed >= 20 * TPP,
            "{policy}: recomputed the prefix"
        );
    }
}

#[test]
fn g2_unanswered_lookup_defers_until_the_timeout_then_recomputes() {
    let params = EngineParams {
        lookup_latency: Duration::from_secs(100),
        ..params(Policy::Reserved, 129)
    };
    let mut engine = Engine::new(params).unwrap();
    let prompt = tokens(1, 0, 0, 8 * TPP);
    seed_checkpoint(&mut engine, 1, &prompt, 1);
    let start = engine.now();
    engine
        .submit(spec(4, [prompt, vec![7; 8]].concat(), 4, start))
        .unwrap();
    let _steps = engine.run_until_idle(100_000).expect("run");
    let metrics = engine
        .request_metrics()
        .iter()
        .find(|m| m.id == Some(RequestId(4)))
        .unwrap()
        .clone();
    assert_eq!(metrics.fallback, Some(FallbackReason::LookupTimeout));
    assert!(metrics.first_token.unwrap().since(start) >= Duration::from_secs(60));
}

#[test]
fn g2_complete_local_hit_is_admitted_without_the_store() {
    let mut engine = Engine::new(params(Policy::Reserved, 129)).unwrap();
    let prompt = tokens(1, 0, 0, 8 * TPP);
    let output = seed_checkpoint(&mut engine, 1, &prompt, 16);
    engine
        .submit(spec(2, prompt.clone(), 16, engine.now()))
        .unwrap();
    let _steps = engine.run_until_idle(100_000).expect("run");
    let next = [prompt, output].concat();
    engine.submit(spec(3, next, 4, engine.now())).unwrap();
    let _steps = engine.run_until_idle(100_000).expect("run");
    let metrics = engine
        .request_metrics()
        .iter()
        .find(|m| m.id == Some(RequestId(3)))
        .unwrap()
        .clone();
    assert!(
        metrics.complete_local_hit && !metrics.restored,
        "{metrics:?}"
    );
}

#[test]
fn g2_copy_tasks_at_their_limit_wait_for_a_copy_slot() {
    let params = EngineParams {
        copy_task_limit: 1,
        ..params(Policy::Reserved, 257)
    };
    let mut engine = Engine::new(params).unwrap();
    let (a, b) = (tokens(1, 0, 0, 8 * TPP), tokens(2, 0, 0, 8 * TPP));
    seed_checkpoint(&mut engine, 1, &a, 1);
    seed_checkpoint(&mut engine, 2, &b, 1);
    engine
        .inject_copy_fault(Fault::DelayNext {
            rank: 0,
            by: Duration::from_secs(5),
        })
        .expect("inline copies take faults");
    engine
        .submit(spec(3, [a, vec![7; 8]].concat(), 4, engine.now()))
        .unwrap();
    engine
        .submit(spec(4, [b, vec![7; 8]].concat(), 4, engine.now()))
        .unwrap();
    step_until(&mut engine, 10, |engine, _| {
        engine.request(RequestId(3)).unwrap().has_ticket
    });
    assert!(
        !engine.request(RequestId(4)).unwrap().has_ticket,
        "waits for a copy slot"
    );
    let _steps = engine.run_until_idle(100_000).expect("run");
    assert!(
        engine
            .request_metrics()
            .iter()
            .all(|m| m.id.unwrap().0 < 3 || m.restored)
    );
}

/// A restore of a 20-page checkpoint (request 4) submitted behind a paused stream that holds 30 of the pool's
/// 48 usable pages, so it must wait for capacity; `reserved`, a 600 s bounded wait. Returns the engine and
/// when request 4 was submitted.
fn restore_behind_a_paused_stream() -> (Engine, Timestamp) {
    let params = EngineParams {
        restore_max_wait: Duration::from_secs(600),
        ..params(Policy::Reserved, 49)
    };
    let mut engine = Engine::new(params).unwrap();
    let prompt = tokens(1, 0, 0, 20 * TPP);
    seed_checkpoint(&mut engine, 1, &prompt, 1);
    hold_with_paused_stream(&mut engine, 2, 30);
    let submitted = engine.now();
    engine
        .submit(spec(4, [prompt, vec![7; 8]].concat(), 4, submitted))
        .unwrap();
    (engine, submitted)
}

/// Steps until request `id` is a capacity waiter.
fn step_until_waiter(engine: &mut Engine, id: u64) {
    step_until(engine, 100, |engine, _| {
        engine
            .request(RequestId(id))
            .is_some_and(|view| view.is_waiter)
    });
}

#[test]
fn g3_a_waiting_restore_is_not_revalidated_while_its_checkpoint_exists() {
    let (mut engine, _submitted) = restore_behind_a_paused_stream();
    step_until(&mut engine, 200, |_, report| {
        report.now.as_secs_f64() > 40.0
    });
    let view = engine.request(RequestId(4)).unwrap();
    assert!(view.is_waiter, "{view:?}");
    assert_eq!(
        view.lookups, 1,
        "the refresh is no re-validation: one lookup while waiting"
    );
    engine.close_stream(RequestId(2)).unwrap();
    let _steps = engine.run_until_idle(1000).expect("run");
    assert!(
        engine
            .request_metrics()
            .iter()
            .find(|m| m.id == Some(RequestId(4)))
            .unwrap()
            .restored
    );
}

/// G3 (issue 27, item 1): a checkpoint lost between the lookup's answer and the reservation (the store
/// evicted it, or failed) is found missing only after the ticket took its pages. No copy ever received them,
/// so the release frees them at once (it used to move them to a drain nobody needed and log "a released
/// ticket still held its import's pages"), and every invariant holds after every step.
#[test]
fn g3_a_checkpoint_lost_after_its_reservation_frees_the_tickets_pages_at_once() {
    let (mut engine, _submitted) = restore_behind_a_paused_stream();
    step_until_waiter(&mut engine, 4);
    // The store loses the checkpoint while the answered restore waits; then its capacity frees, so the
    // next step reserves before any refresh could notice.
    engine.forget_checkpoints().unwrap();
    engine.close_stream(RequestId(2)).unwrap();
    let logs = crate::restart::captured_logs(|| {
        let reports = step_until(&mut engine, 1000, |_, report| !report.fallbacks.is_empty());
        assert_eq!(
            reports.last().unwrap().fallbacks,
            vec![(RequestId(4), FallbackReason::NotInStore)]
        );
    });
    assert!(!logs.contains("ERROR"), "{logs}");
    let view = engine.request(RequestId(4)).unwrap();
    assert_eq!(
        view.lookups, 2,
        "the lost checkpoint was looked up again: {view:?}"
    );
    let _steps = engine.run_until_idle(10_000).expect("run");
    assert_eq!(
        engine.ledger_snapshot().map(|ledger| ledger.tickets.len()),
        Some(0)
    );
    assert_eq!((engine.leaked_pages(), engine.pool().n_in_use()), (0, 0));
}

#[test]
fn g4_refresh_after_half_the_lookup_timeout_finds_the_checkpoint_gone_and_recomputes() {
    let (mut engine, start) = restore_behind_a_paused_stream();
    step_until_waiter(&mut engine, 4);
    engine.forget_checkpoints().unwrap();
    let reports = step_until(&mut engine, 1000, |_, report| !report.fallbacks.is_empty());
    let report = reports.last().unwrap();
    assert_eq!(
        report.fallbacks,
        vec![(RequestId(4), FallbackReason::NotInStore)]
    );
    let waited = report.now.since(start).as_secs_f64();
    assert!(
        (30.0..31.0).contains(&waited),
        "refreshed after half the timeout, not before: {waited}"
    );
}

#[test]
fn g5_capacity_waits_are_counted_with_the_longest_wait() {
    let mut engine = Engine::new(params(Policy::Reserved, 49)).unwrap();
    let prompt = tokens(1, 0, 0, 20 * TPP);
    seed_checkpoint(&mut engine, 1, &prompt, 1);
    start_hog_for(&mut engine, 2, 30, 40);
    engine
        .submit(spec(4, [prompt, vec![7; 8]].concat(), 4, engine.now()))
        .unwrap();
    let _steps = engine.run_until_idle(100_000).expect("run");
    let metrics = engine.metrics();
    assert_eq!(metrics.capacity_waits, 1);
    assert!(metrics.longest_capacity_wait_s > 0.0);
}

#[test]
fn e1_sessions_rotating_through_a_small_pool_restore_every_later_turn_in_fifo_order() {
    // Lookups answered within the step, a network's latency later, and several steps later: a session whose
    // prefix is still resident asks no lookup, and must not pass the earlier ones still waiting for theirs.
    let latencies = [
        Duration::ZERO,
        engine::LOOKUP_LATENCY_DEFAULT,
        Duration::from_millis(20),
    ];
    let cases = [1, 2, 3]
        .into_iter()
        .flat_map(|seed| latencies.map(|latency| (seed, latency)));
    for (seed, lookup_latency) in cases {
        let n_sessions = 8u64;
        let params = EngineParams {
            n_pages: 129,
            max_running: 1,
            seed,
            lookup_latency,
            ..params(Policy::Reserved, 129)
        };
        let mut engine = Engine::new(params).unwrap();
        let mut contexts: Vec<Vec<u32>> = (0..n_sessions)
            .map(|s| tokens(seed, s as u32, 0, 40 * TPP + 5))
            .collect();
        for round in 0..4u64 {
            let ids: Vec<RequestId> = (0..n_sessions)
                .map(|s| RequestId(round * 100 + s))
                .collect();
            for (session, id) in ids.iter().enumerate() {
                let mut spec = spec(id.0, contexts[session].clone(), 8, engine.now());
                spec.is_later_turn = round > 0;
                engine.submit(spec).unwrap();
            }
            let mut order = Vec::new();
            let mut steps = 0;
            while order.len() < ids.len() {
                engine.step().expect("step");
                engine.check_invariants().expect("invariants");
                steps += 1;
                assert!(
                    steps < 100_000,
                    "seed {seed} round {round} did not progress"
                );
                for finished in engine.take_finished() {
                    let session = (finished.id.0 % 100) as usize;
                    contexts[session].extend(&finished.output);
                    contexts[session].extend(tokens(seed, session as u32, round as u32 + 1, 3));
                    order.push(finished.id);
                }
            }
            assert_eq!(
                order, ids,
                "seed {seed} round {round}: completion order is FIFO"
            );
        }
        let metrics = engine.metrics();
        let unrestored: Vec<_> = engine
            .request_metrics()
            .iter()
            .filter(|m| m.is_later_turn && !m.restored)
            .collect();
        assert_eq!(
            metrics.later_turns_restored, metrics.later_turns,
            "seed {seed}: {unrestored:#?}"
        );
        for request in engine.request_metrics().iter().filter(|m| m.is_later_turn) {
            let restorable = (request.prompt_tokens - 1) / TPP * TPP;
            let checkpointed = (request.prompt_tokens - 3) / TPP * TPP;
            assert!(
                request.prompt_tokens_restored + request.prompt_tokens_local_hit
                    >= restorable.min(checkpointed),
                "seed {seed}: {request:?}"
            );
        }
        assert_eq!(metrics.leaked_pages, 0);
        assert_eq!(engine.pool().n_in_use(), 0);
    }
}

#[test]
fn e2_response_checkpoint_is_reusable_after_a_stop_token_or_a_length_cap() {
    for stop_after in [Some(3), None] {
        let mut engine = Engine::new(params(Policy::Reserved, 129)).unwrap();
        let prompt = tokens(1, 0, 0, 8 * TPP + 4);
        let mut first = spec(1, prompt.clone(), 2 * TPP, engine.now());
        first.stop_after = stop_after;
        engine.submit(first).unwrap();
        let _steps = engine.run_until_idle(100_000).expect("run");
        let output = engine.take_finished().pop().unwrap().output;
        assert_eq!(
            output.len(),
            stop_after.map_or(2 * TPP as usize, |stop| stop as usize)
        );
        engine.reset_prefix_cache().unwrap();
        let next = [prompt, output, vec![9; 20]].concat();
        let response_blocks = (next.len() as u32 - 20 - 1) / TPP;
        engine.submit(spec(2, next, 2, engine.now())).unwrap();
        let _steps = engine.run_until_idle(100_000).expect("run");
        let metrics = engine
            .request_metrics()
            .iter()
            .find(|m| m.id == Some(RequestId(2)))
            .unwrap()
            .clone();
        assert!(metrics.restored);
        assert_eq!(
            metrics.prompt_tokens_restored,
            response_blocks * TPP,
            "{stop_after:?}: the response checkpoint"
        );
    }
}

#[test]
fn e3_every_restored_page_equals_what_recompute_writes() {
    let agents = Agents {
        n_agents: 4,
        turns: 6,
        first_prompt_tokens: 200,
        turn_input_tokens: 20,
        response_tokens: 40,
        think_s: 0.5,
        seed: 3,
    };
    for policy in [Policy::Ordinary, Policy::PagesOnly, Policy::Reserved] {
        let params = EngineParams {
            policy,
            n_pages: 48,
            verify_restores: true,
            ..crate::verified_defaults()
        };
        let run = run_agents(params, agents, 1);
        assert!(
            run.metrics.prompt_tokens_restored > 0,
            "{policy}: something was restored"
        );
        assert!(
            run.pages_verified >= run.metrics.prompt_tokens_restored / u64::from(TPP),
            "{policy}: every restored page verified"
        );
    }
}

pub(crate) fn metrics_of<E: engine::Executor>(
    engine: &Engine<E>,
    id: u64,
) -> engine::RequestMetrics {
    engine
        .request_metrics()
        .iter()
        .find(|m| m.id == Some(RequestId(id)))
        .unwrap()
        .clone()
}

#[test]
fn g2_empty_lookup_is_a_restore_fallback_only_for_a_later_turn() {
    let mut engine = Engine::new(params(Policy::Reserved, 129)).unwrap();
    let first_turn = spec(1, tokens(1, 0, 0, 4 * TPP), 2, engine.now());
    let mut later_turn = spec(2, tokens(1, 1, 0, 4 * TPP), 2, engine.now());
    later_turn.is_later_turn = true;
    engine.submit(first_turn).unwrap();
    engine.submit(later_turn).unwrap();
    let _steps = engine.run_until_idle(10_000).expect("run");
    assert_eq!(
        metrics_of(&engine, 1).fallback,
        None,
        "nothing was there to restore"
    );
    assert_eq!(
        metrics_of(&engine, 2).fallback,
        Some(FallbackReason::NotInStore)
    );
    let fallbacks = engine.metrics().restore_fallbacks;
    assert_eq!(fallbacks.get("not_in_store"), Some(&1), "{fallbacks:?}");
}

#[test]
fn o7_failed_copy_whose_retry_finds_nothing_falls_back_as_copy_failed() {
    let mut engine = Engine::new(params(Policy::Reserved, 129)).unwrap();
    // One block: no shorter prefix of it is left to retry (see `prefix` for the retry of a shorter one).
    let prompt = tokens(1, 0, 0, TPP);
    seed_checkpoint(&mut engine, 1, &prompt, 1);
    engine
        .inject_copy_fault(Fault::FailNext { rank: 0 })
        .expect("inline copies take faults");
    let mut turn = spec(4, [prompt, vec![7; 8]].concat(), 4, engine.now());
    turn.is_later_turn = true;
    engine.submit(turn).unwrap();
    let _steps = engine.run_until_idle(10_000).expect("run");
    let metrics = metrics_of(&engine, 4);
    assert!(!metrics.restored);
    assert_eq!(metrics.fallback, Some(FallbackReason::CopyFailed));
}

#[test]
fn g2_a_complete_local_hit_evicted_before_admission_asks_the_store_again() {
    // 64 usable pages. Turn 1 leaves 20 cached pages; a hog then holds 42 pages and grows while turn 2 waits
    // behind it, evicting turn 2's cached tail. Turn 2's lookup found its whole checkpoint resident (a
    // complete local hit, G2), so it waited without the store; once its pages are gone it must ask again
    // and restore them, not recompute them silently.
    let mut engine = Engine::new(params(Policy::Reserved, 65)).unwrap();
    let prompt = tokens(7, 0, 0, 20 * TPP);
    engine
        .submit(spec(1, prompt.clone(), 1, engine.now()))
        .unwrap();
    let _steps = engine.run_until_idle(10_000).expect("run");
    let output = engine.take_finished()[0].output.clone();
    engine
        .submit(spec(2, tokens(98, 2, 0, 42 * TPP - 1), 100, engine.now()))
        .unwrap();
    step_until(&mut engine, 10, |engine, _| phase(engine, 2) == "running");
    let turn = [prompt, output, tokens(7, 0, 1, 3 * TPP)].concat();
    engine.submit(spec(3, turn, 2, engine.now())).unwrap();
    step_until(&mut engine, 10, |engine, _| phase(engine, 3) != "restoring");
    assert_eq!(
        phase(&engine, 3),
        "waiting",
        "a complete local hit waits for space"
    );
    let _steps = engine.run_until_idle(10_000).expect("run");
    let turn = metrics_of(&engine, 3);
    assert!(
        turn.restored,
        "the evicted prefix came back from the store: {turn:?}"
    );
    assert_eq!(
        turn.prompt_tokens_local_hit + turn.prompt_tokens_restored,
        20 * TPP,
        "every block of the checkpoint was served from cache: {turn:?}"
    );
    assert_eq!(engine.leaked_pages(), 0);
}
