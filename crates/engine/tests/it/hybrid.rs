//! Geometries beyond one full-attention group on one rank (H1-H8): context parallelism for now.

use std::time::Duration;

use checkpoint_transfer::Fault;
use engine::{Engine, EngineParams, Error, FallbackReason, Policy};
use kv_pool::{CacheGroup, Geometry, GroupKind, RequestId, Timestamp};

use crate::agents::tokens;
use crate::contract::{metrics_of, seed_checkpoint, spec};

/// Tokens per page on each rank.
const TPP: u32 = 16;

/// `policy` on `n_ranks` context-parallel ranks of a `n_pages` pool, verifying every restored page (E3).
fn cp_params(policy: Policy, n_pages: u32, n_ranks: u32) -> EngineParams {
    let full = EngineParams::default().geometry.groups().to_vec();
    geometry_params(policy, n_pages, n_ranks, full)
}

/// A full-attention group, a recurrent group and an auxiliary group of two pages: the shape of a hybrid
/// model with draft hidden state.
pub(crate) fn hybrid_groups() -> Vec<CacheGroup> {
    let bytes_per_page = 4096;
    vec![
        CacheGroup {
            kind: GroupKind::Recurrent,
            bytes_per_page,
        },
        CacheGroup {
            kind: GroupKind::Full,
            bytes_per_page,
        },
        CacheGroup {
            kind: GroupKind::Auxiliary { pages: 2 },
            bytes_per_page,
        },
    ]
}

/// `policy` with cache `groups` on `n_ranks` ranks of a `n_pages` pool, verifying every restored page (E3).
pub(crate) fn geometry_params(
    policy: Policy,
    n_pages: u32,
    n_ranks: u32,
    groups: Vec<CacheGroup>,
) -> EngineParams {
    let defaults = crate::verified_defaults();
    EngineParams {
        geometry: Geometry::new(groups, TPP, n_ranks, defaults.geometry.max_model_len())
            .expect("a valid geometry"),
        policy,
        n_pages,
        max_running: 4,
        verify_restores: true,
        ..defaults
    }
}

/// What one step of a two-rank restore showed.
#[derive(Debug)]
struct Observed {
    /// The clock when the step started: it polled the copies then.
    polled_at: Timestamp,
    /// The clock after the step (moved to the next event when nothing ran).
    now: Timestamp,
    phase: &'static str,
    in_use: u32,
    copies: usize,
}

/// Seeds a 4-block checkpoint on 2 ranks, injects `faults`, submits its next turn (request 2) and steps to the
/// end, checking the invariants after every step. Returns what every step showed and the engine.
fn two_rank_restore(policy: Policy, faults: &[Fault]) -> (Vec<Observed>, Engine) {
    let mut engine = Engine::new(cp_params(policy, 129, 2)).expect("two ranks run");
    let block_tokens = engine.params().geometry.block_tokens();
    assert_eq!(block_tokens, 2 * TPP);
    let prompt = tokens(4, 0, 0, 4 * block_tokens);
    let _output = seed_checkpoint(&mut engine, 1, &prompt, 1);
    for &fault in faults {
        engine
            .inject_copy_fault(fault)
            .expect("inline copies take faults");
    }
    let mut turn = spec(2, [prompt, vec![7; 8]].concat(), 2, engine.now());
    turn.is_later_turn = true;
    engine.submit(turn).expect("submit");
    let mut observed = Vec::new();
    for _ in 0..10_000 {
        if engine.is_idle() {
            break;
        }
        let polled_at = engine.now();
        engine.step().expect("step");
        engine.check_invariants().expect("invariants");
        observed.push(Observed {
            polled_at,
            now: engine.now(),
            phase: engine
                .request(kv_pool::RequestId(2))
                .map_or("gone", |view| view.phase.name()),
            in_use: engine.pool().n_in_use(),
            copies: engine.restore_gauges().copies_in_flight,
        });
    }
    assert!(engine.is_idle(), "the turn ends: {observed:?}");
    assert_eq!(engine.leaked_pages(), 0);
    assert_eq!(engine.pool().n_in_use(), 0);
    (observed, engine)
}

#[test]
fn h4_publication_waits_for_the_last_rank_in_either_order() {
    let late_by = Duration::from_secs(5);
    for late in [0, 1] {
        for policy in [Policy::Reserved, Policy::PagesOnly, Policy::Ordinary] {
            let (observed, engine) = two_rank_restore(
                policy,
                &[Fault::DelayNext {
                    rank: late,
                    by: late_by,
                }],
            );
            let staged = observed
                .iter()
                .find(|step| step.copies > 0)
                .unwrap_or_else(|| panic!("{policy:?}: a copy ran: {observed:?}"));
            // The prompt is computed only once every rank's pages landed.
            let computing = observed
                .iter()
                .find(|step| step.copies == 0 && step.now > staged.now)
                .expect("the copies end");
            assert!(
                computing.now >= staged.now.after(late_by - Duration::from_millis(1)),
                "{policy:?}, rank {late} late: published before the late rank acknowledged: {observed:?}"
            );
            let turn = metrics_of(&engine, 2);
            assert!(turn.restored, "{policy:?}, rank {late} late: {turn:?}");
            assert_eq!(turn.prompt_tokens_restored, 4 * 2 * TPP, "{turn:?}");
            // Both ranks' pages were checked byte for byte against recompute (E3).
            assert_eq!(engine.pages_verified(), 4 * 2, "{policy:?}");
        }
    }
}

#[test]
fn h4_a_failed_rank_publishes_nothing_and_releases_no_page_before_every_rank_drains() {
    let late_by = Duration::from_secs(5);
    // The failing rank fails early while the other is still copying, in both rank orders.
    for (failing, late) in [(0, 1), (1, 0)] {
        for policy in [Policy::Reserved, Policy::PagesOnly, Policy::Ordinary] {
            let faults = [
                Fault::FailNext { rank: failing },
                Fault::DelayNext {
                    rank: late,
                    by: late_by,
                },
            ];
            let (observed, engine) = two_rank_restore(policy, &faults);
            let staged = observed
                .iter()
                .position(|step| step.copies > 0)
                .unwrap_or_else(|| panic!("{policy:?}: a copy ran: {observed:?}"));
            let drained_at = observed[staged].polled_at.after(late_by);
            let window: Vec<&Observed> = observed[staged..]
                .iter()
                .take_while(|step| step.polled_at < drained_at)
                .collect();
            assert!(
                window.iter().any(|step| step.copies == 1),
                "{policy:?}: a step saw the failure while rank {late} still copied: {observed:?}"
            );
            for step in window {
                // The failed import's 4 pages stay held on every rank until the late rank drained.
                assert!(
                    step.in_use >= 4,
                    "{policy:?}, rank {failing} failed: pages released before rank {late} drained: {observed:?}"
                );
                assert!(
                    matches!(step.phase, "restoring" | "waiting" | "running"),
                    "{policy:?}: {observed:?}"
                );
            }
            let turn = metrics_of(&engine, 2);
            // Nothing of the failed import was published: what the turn restored (a shorter retry, O7) was
            // verified byte for byte on both ranks, and it restored less than the failed import's 4 blocks.
            assert!(
                turn.prompt_tokens_restored < 4 * 2 * TPP,
                "{policy:?}, rank {failing} failed: {turn:?}"
            );
            assert_eq!(
                u64::from(turn.prompt_tokens_restored / (2 * TPP)) * 2,
                engine.pages_verified(),
                "{policy:?}: every restored page verified on both ranks"
            );
            if !turn.restored {
                assert_eq!(turn.fallback, Some(FallbackReason::CopyFailed), "{turn:?}");
            }
        }
    }
}

#[test]
fn h4_a_corrupt_copy_on_the_second_rank_stops_the_run_naming_the_rank() {
    let mut engine = Engine::new(cp_params(Policy::Reserved, 129, 2)).expect("two ranks run");
    let block_tokens = engine.params().geometry.block_tokens();
    let prompt = tokens(5, 0, 0, 3 * block_tokens);
    let _output = seed_checkpoint(&mut engine, 1, &prompt, 1);
    engine
        .inject_copy_fault(Fault::CorruptNext { rank: 1, byte: 3 })
        .expect("inline copies take faults");
    let mut turn = spec(2, [prompt, vec![7; 8]].concat(), 2, engine.now());
    turn.is_later_turn = true;
    engine.submit(turn).expect("submit");
    let error = engine
        .run_until_idle(10_000)
        .expect_err("the corrupt page is caught");
    assert!(
        matches!(
            error,
            Error::RestoreMismatch {
                rank: 1,
                byte: 3,
                ..
            }
        ),
        "{error:?}"
    );
}

#[test]
fn context_parallel_ranks_run_multi_turn_sessions_with_every_page_verified() {
    for n_ranks in [2, 3] {
        let mut engine = Engine::new(cp_params(Policy::Reserved, 257, n_ranks)).expect("runs");
        let block_tokens = engine.params().geometry.block_tokens();
        let mut context = tokens(9, 0, 0, 3 * block_tokens + 5);
        for turn in 0..4u64 {
            let mut request = spec(turn + 1, context.clone(), 8, engine.now());
            request.is_later_turn = turn > 0;
            engine.submit(request).expect("submit");
            let _steps = engine.run_until_idle(100_000).expect("run");
            engine.check_invariants().expect("invariants");
            let finished = engine.take_finished();
            context.extend(&finished[0].output);
            context.extend(tokens(9, 0, turn as u32 + 1, block_tokens + 3));
            // Drop the local copy so the next turn must restore from the store.
            engine
                .reset_prefix_cache()
                .expect("nothing is in use between turns");
        }
        for turn in 2..=4 {
            let metrics = metrics_of(&engine, turn);
            assert!(
                metrics.restored,
                "{n_ranks} ranks, turn {turn}: {metrics:?}"
            );
        }
        assert!(engine.pages_verified() > 0);
        assert_eq!(
            engine.pages_verified() % u64::from(n_ranks),
            0,
            "every rank verified"
        );
        assert_eq!(engine.leaked_pages(), 0);
    }
}

/// Runs `turns` turns of one session (each turn's prompt is the last context plus `new` tokens), dropping the
/// local prefix cache between turns so that every later turn must restore. Returns the engine.
fn session(mut engine: Engine, turns: u64, first: u32, new: u32) -> Engine {
    let mut context = tokens(9, 0, 0, first);
    for turn in 0..turns {
        let mut request = spec(turn + 1, context.clone(), 8, engine.now());
        request.is_later_turn = turn > 0;
        engine.submit(request).expect("submit");
        while !engine.is_idle() {
            engine.step().expect("step");
            engine.check_invariants().expect("invariants");
        }
        let finished = engine.take_finished();
        context.extend(&finished[0].output);
        context.extend(tokens(9, 0, turn as u32 + 1, new));
        if engine.pool().n_in_use() == 0 {
            engine
                .reset_prefix_cache()
                .expect("nothing is in use between turns");
        }
    }
    assert_eq!(engine.leaked_pages(), 0);
    assert_eq!(engine.pool().n_in_use(), 0);
    engine
}

#[test]
fn hybrid_sessions_restore_every_later_turn_at_its_exact_boundary_under_every_policy() {
    for n_ranks in [1, 2] {
        for policy in [
            Policy::Ordinary,
            Policy::PagesOnly,
            Policy::Reserved,
            Policy::Oracle,
        ] {
            let engine = Engine::new(geometry_params(policy, 257, n_ranks, hybrid_groups()))
                .expect("a hybrid model runs");
            let engine = session(engine, 5, 70, 13);
            let mut boundaries_inside_a_page = 0;
            for turn in 2..=5 {
                let metrics = metrics_of(&engine, turn);
                assert!(
                    metrics.restored,
                    "{policy:?}, {n_ranks} ranks, turn {turn}: {metrics:?}"
                );
                // The previous turn's response-end checkpoint: its whole context but the last sampled
                // token, at its exact boundary (H6), never rounded down to a page.
                assert_eq!(
                    metrics.prompt_tokens_restored,
                    metrics.prompt_tokens - 13 - 1,
                    "{policy:?}, {n_ranks} ranks, turn {turn}: {metrics:?}"
                );
                assert_eq!(
                    metrics.prompt_tokens_restored + metrics.prompt_tokens_recomputed,
                    metrics.prompt_tokens,
                    "{metrics:?}"
                );
                boundaries_inside_a_page +=
                    u32::from(!metrics.prompt_tokens_restored.is_multiple_of(TPP * n_ranks));
                assert_eq!(
                    metrics.prompt_tokens_local_hit, 0,
                    "no local hit without state (H2)"
                );
            }
            assert!(
                boundaries_inside_a_page > 0,
                "the test restores partial pages"
            );
            assert!(engine.pages_verified() > 0, "{policy:?}");
        }
    }
}

/// A hybrid engine (`hybrid_groups`) under `policy` with a roomy pool.
fn hybrid_engine(policy: Policy) -> Engine {
    Engine::new(geometry_params(policy, 257, 1, hybrid_groups())).expect("a hybrid model runs")
}

#[test]
fn h2_a_hybrid_prefix_hit_is_a_whole_checkpoint_boundary_never_resident_blocks_past_it() {
    // Turn 1 computes prompt P (70 tokens: 4 full blocks and 6 tokens) and stays resident. Request 2 shares
    // P and continues differently: its blocks past P's boundary are nowhere, its first 4 blocks are resident.
    // An attention-only engine serves them as a local hit (64 tokens); a hybrid one serves exactly P's
    // prompt-end checkpoint (70 tokens, state included) and never the resident blocks without state. Both
    // orders: request 2 after turn 1 finished, and while turn 1 still decodes.
    let prompt = tokens(21, 0, 0, 70);
    let next = [prompt.clone(), tokens(21, 1, 0, 40)].concat();
    for while_running in [false, true] {
        for policy in [Policy::Ordinary, Policy::PagesOnly, Policy::Reserved] {
            let mut engine = hybrid_engine(policy);
            engine
                .submit(spec(1, prompt.clone(), 30, engine.now()))
                .unwrap();
            if while_running {
                // Until turn 1's prompt is computed and captured, then request 2 arrives.
                while engine.store_stats().n_checkpoints == 0 {
                    engine.step().expect("step");
                }
                assert!(
                    engine.request(kv_pool::RequestId(1)).is_some(),
                    "turn 1 still decodes"
                );
            } else {
                let _steps = engine.run_until_idle(10_000).expect("run");
            }
            let mut turn = spec(2, next.clone(), 4, engine.now());
            turn.is_later_turn = true;
            engine.submit(turn).unwrap();
            while !engine.is_idle() {
                engine.step().expect("step");
                engine.check_invariants().expect("invariants");
            }
            let metrics = metrics_of(&engine, 2);
            assert_eq!(
                metrics.prompt_tokens_local_hit, 0,
                "{policy:?}: {metrics:?}"
            );
            assert_eq!(
                metrics.prompt_tokens_restored, 70,
                "{policy:?}, while running {while_running}: exactly the prompt-end boundary: {metrics:?}"
            );
        }
    }
    // The same requests on one full-attention group: the resident blocks are a local hit.
    let mut engine = Engine::new(cp_params(Policy::Reserved, 257, 1)).unwrap();
    engine.submit(spec(1, prompt, 30, engine.now())).unwrap();
    let _steps = engine.run_until_idle(10_000).expect("run");
    engine.submit(spec(2, next, 4, engine.now())).unwrap();
    let _steps = engine.run_until_idle(10_000).expect("run");
    assert_eq!(metrics_of(&engine, 2).prompt_tokens_local_hit, 64);
}

#[test]
fn h6_a_boundary_inside_a_page_is_restored_whole_under_every_policy() {
    // A checkpoint at 70 tokens (page 4 holds 6 of its 16 tokens) restores 70 tokens, not 64, under every
    // policy, for two consumers one after the other: the partial page and the state come back byte for byte
    // (E3: 5 pages of the full group and 3 fixed pages verified per restore). Each consumer continues in
    // copies of them (C3): the ticket's credits, checked after every step, count those copies.
    let prompt = tokens(22, 0, 0, 70);
    for policy in [
        Policy::Ordinary,
        Policy::PagesOnly,
        Policy::Reserved,
        Policy::Oracle,
    ] {
        let mut engine = hybrid_engine(policy);
        let _output = seed_checkpoint(&mut engine, 1, &prompt, 1);
        for id in [2, 3] {
            let mut turn = spec(
                id,
                [prompt.clone(), tokens(22, id as u32, 0, 30)].concat(),
                4,
                engine.now(),
            );
            turn.is_later_turn = true;
            engine.submit(turn).unwrap();
            while !engine.is_idle() {
                engine.step().expect("step");
                engine.check_invariants().expect("invariants");
            }
            let metrics = metrics_of(&engine, id);
            assert_eq!(
                metrics.prompt_tokens_restored, 70,
                "{policy:?}: {metrics:?}"
            );
            engine.reset_prefix_cache().expect("idle");
        }
        assert_eq!(engine.pages_verified(), 2 * (5 + 3), "{policy:?}");
        assert_eq!(engine.leaked_pages(), 0);
    }
}

#[test]
fn h6_the_consumer_continues_in_copies_of_the_imported_partial_page_and_state() {
    // Reserved: while the import copies, the only pages in use are the import's. At admission the consumer
    // keeps its full blocks and takes copies of its partial page (block 4) and its three fixed pages.
    let prompt = tokens(23, 0, 0, 70);
    let mut engine = hybrid_engine(Policy::Reserved);
    let _output = seed_checkpoint(&mut engine, 1, &prompt, 1);
    let mut turn = spec(2, [prompt, tokens(23, 2, 0, 30)].concat(), 4, engine.now());
    turn.is_later_turn = true;
    engine.submit(turn).unwrap();
    let id = kv_pool::RequestId(2);
    while !engine.restore_gauges().importing.contains(&id) {
        engine.step().expect("step");
    }
    let pool = engine.pool();
    let imported: Vec<kv_pool::PageId> = (1..pool.n_total())
        .map(kv_pool::PageId)
        .filter(|&page| pool.ref_count(page).unwrap() > 0)
        .collect();
    assert_eq!(imported.len(), 5 + 3, "the import's pages: {imported:?}");
    while engine.request(id).expect("live").phase.name() != "running" {
        engine.step().expect("step");
        engine.check_invariants().expect("invariants");
    }
    let view = engine.request(id).expect("admitted");
    assert!(
        view.page_table[..4]
            .iter()
            .all(|page| imported.contains(page))
    );
    assert!(
        !imported.contains(&view.page_table[4]),
        "the partial page is a copy"
    );
    assert_eq!(view.fixed_pages.len(), 3);
    assert!(
        view.fixed_pages.iter().all(|page| !imported.contains(page)),
        "the state is a copy"
    );
    let _steps = engine.run_until_idle(10_000).expect("run");
    assert_eq!(engine.leaked_pages(), 0);
}

/// A full-attention group and a sliding window of `window` tokens (plus `tail` retained), or a chunked-local
/// group of `window` tokens when `chunked`.
fn windowed_groups(window: u32, tail: u32, chunked: bool) -> Vec<CacheGroup> {
    let kind = if chunked {
        GroupKind::ChunkedLocal {
            chunk_tokens: window,
        }
    } else {
        GroupKind::SlidingWindow {
            window_tokens: window,
            retained_tail_tokens: tail,
        }
    };
    vec![
        CacheGroup {
            kind: GroupKind::Full,
            bytes_per_page: 4096,
        },
        CacheGroup {
            kind,
            bytes_per_page: 4096,
        },
    ]
}

#[test]
fn h3_pages_that_leave_the_window_go_back_to_the_pool_while_the_request_runs() {
    // A 600-token prompt in chunks of 64 on a sliding window of 40 tokens (+8 retained) and on chunked-local
    // attention over 64 tokens: after every step the window table is null before the live window, the pool
    // counts exactly the pages the request holds (C4), and the window never holds more than its peak.
    for (window, tail, chunked) in [(40, 8, false), (64, 0, true)] {
        for policy in [Policy::Ordinary, Policy::Reserved] {
            let mut params =
                geometry_params(policy, 257, 1, windowed_groups(window, tail, chunked));
            params.chunk_tokens = 64;
            let mut engine = Engine::new(params).expect("a windowed model runs");
            let id = kv_pool::RequestId(1);
            engine
                .submit(spec(1, tokens(31, 0, 0, 600), 40, engine.now()))
                .unwrap();
            let mut released_while_running = false;
            while !engine.is_idle() {
                engine.step().expect("step");
                engine.check_invariants().expect("invariants");
                let Some(view) = engine.request(id) else {
                    continue;
                };
                let [table] = &view.window_tables[..] else {
                    continue;
                };
                let live = engine.params().geometry.live_tokens(1, view.n_computed);
                let first = (live.start / TPP) as usize;
                assert!(
                    table[..first.min(table.len())]
                        .iter()
                        .all(|page| page.is_null())
                );
                let held = table.iter().filter(|page| !page.is_null()).count();
                assert!(
                    held <= (window + tail + 64).div_ceil(TPP) as usize + 1,
                    "{held} window pages"
                );
                released_while_running |= first > 0;
                assert_eq!(
                    engine.pool().n_in_use() as usize,
                    view.page_table.len() + held,
                    "the pool counts the block table and the live window"
                );
            }
            assert!(released_while_running, "{policy:?}");
            assert_eq!(engine.leaked_pages(), 0);
        }
    }
}

#[test]
fn windowed_sessions_restore_their_live_window_at_the_exact_boundary_under_every_policy() {
    for (window, tail, chunked) in [(40, 8, false), (64, 0, true)] {
        for policy in [
            Policy::Ordinary,
            Policy::PagesOnly,
            Policy::Reserved,
            Policy::Oracle,
        ] {
            let params = geometry_params(policy, 257, 2, windowed_groups(window, tail, chunked));
            let engine = session(Engine::new(params).expect("runs"), 5, 150, 13);
            for turn in 2..=5 {
                let metrics = metrics_of(&engine, turn);
                assert_eq!(
                    metrics.prompt_tokens_restored,
                    metrics.prompt_tokens - 13 - 1,
                    "{policy:?}, turn {turn}: {metrics:?}"
                );
            }
            assert!(engine.pages_verified() > 0);
        }
    }
}

#[test]
fn h1_every_group_kind_mixed_runs_sessions_on_one_to_three_ranks() {
    let group = |kind| CacheGroup {
        kind,
        bytes_per_page: 4096,
    };
    let groups = vec![
        group(GroupKind::SlidingWindow {
            window_tokens: 48,
            retained_tail_tokens: 8,
        }),
        group(GroupKind::Full),
        group(GroupKind::ChunkedLocal { chunk_tokens: 64 }),
        group(GroupKind::Recurrent),
        group(GroupKind::Auxiliary { pages: 2 }),
    ];
    for n_ranks in 1..=3 {
        for policy in [
            Policy::Ordinary,
            Policy::PagesOnly,
            Policy::Reserved,
            Policy::Oracle,
        ] {
            let params = geometry_params(policy, 257, n_ranks, groups.clone());
            let engine = session(Engine::new(params).expect("every kind runs"), 4, 130, 21);
            for turn in 2..=4 {
                let metrics = metrics_of(&engine, turn);
                assert_eq!(
                    metrics.prompt_tokens_restored,
                    metrics.prompt_tokens - 21 - 1,
                    "{policy:?}, {n_ranks} ranks, turn {turn}: {metrics:?}"
                );
            }
            assert!(engine.pages_verified() > 0);
        }
    }
}

#[test]
fn h7_each_of_the_four_checkpoint_slots_is_published_and_restorable() {
    // A 300-token prompt with a 40-token instruction, in chunks of 64, on a hybrid model: checkpoints at the
    // instruction boundary (40: a chunk ends there), the prefill tail (296: where the last chunk starts), the
    // prompt end (300) and the response end. A later request sharing each boundary restores exactly it.
    let prompt = tokens(41, 0, 0, 300);
    let other = |n: u32| tokens(41, 9, n, 20);
    for policy in [Policy::Ordinary, Policy::PagesOnly, Policy::Reserved] {
        let mut params = geometry_params(policy, 257, 1, hybrid_groups());
        params.chunk_tokens = 64;
        params.capture_prefill_tail = true;
        let mut engine = Engine::new(params).expect("runs");
        let mut first = spec(1, prompt.clone(), 6, engine.now());
        first.instruction_tokens = Some(40);
        engine.submit(first).unwrap();
        let _steps = engine.run_until_idle(10_000).expect("run");
        let output = engine.take_finished()[0].output.clone();
        assert_eq!(
            engine.store_stats().n_checkpoints,
            4,
            "{policy:?}: four slots"
        );
        engine.reset_prefix_cache().expect("idle");
        let response_end = 300 + 6 - 1;
        let cases = [
            (2, [&prompt[..40], &other(2)[..]].concat(), 40),
            (3, [&prompt[..296], &other(3)[..]].concat(), 296),
            (4, [&prompt[..], &other(4)[..]].concat(), 300),
            (
                5,
                [&prompt[..], &output[..], &other(5)[..]].concat(),
                response_end,
            ),
        ];
        for (id, request, restored) in cases {
            let mut turn = spec(id, request, 2, engine.now());
            turn.is_later_turn = true;
            engine.submit(turn).unwrap();
            while !engine.is_idle() {
                engine.step().expect("step");
                engine.check_invariants().expect("invariants");
            }
            let metrics = metrics_of(&engine, id);
            assert_eq!(
                metrics.prompt_tokens_restored, restored,
                "{policy:?}: {metrics:?}"
            );
            let _finished = engine.take_finished();
            engine.reset_prefix_cache().expect("idle");
        }
        assert_eq!(engine.leaked_pages(), 0);
    }
}

#[test]
fn an_instruction_boundary_outside_the_prompt_is_refused_naming_it() {
    let mut engine = hybrid_engine(Policy::Reserved);
    for at in [0, 30, 31] {
        let mut request = spec(1, tokens(1, 0, 0, 30), 2, engine.now());
        request.instruction_tokens = Some(at);
        let error = engine.submit(request).expect_err("refused");
        assert!(
            matches!(
                error,
                Error::InvalidParam {
                    name: "instruction_tokens",
                    ..
                }
            ),
            "{error:?}"
        );
        assert!(
            error
                .to_string()
                .contains(&format!("an instruction of {at} tokens")),
            "{error}"
        );
    }
}

#[test]
fn h7_a_restore_budgets_a_capture_for_every_slot_ahead_of_it() {
    // Request 2 restores the 40-token instruction checkpoint of request 1; its own instruction (120) and a
    // prefill tail (the 220 tokens after it take several chunks of 64) and its prompt end are ahead: its
    // ticket's credits include three captures (C2).
    let prompt = tokens(42, 0, 0, 300);
    let mut params = geometry_params(Policy::Reserved, 257, 1, hybrid_groups());
    params.chunk_tokens = 64;
    params.capture_prefill_tail = true;
    let mut engine = Engine::new(params).expect("runs");
    let mut first = spec(1, prompt.clone(), 2, engine.now());
    first.instruction_tokens = Some(40);
    engine.submit(first).unwrap();
    let _steps = engine.run_until_idle(10_000).expect("run");
    engine.reset_prefix_cache().expect("idle");
    let request = [&prompt[..40], &tokens(42, 1, 0, 300)[..]].concat();
    let mut turn = spec(2, request, 2, engine.now());
    turn.is_later_turn = true;
    turn.instruction_tokens = Some(120);
    engine.submit(turn).unwrap();
    let ticket = loop {
        engine.step().expect("step");
        let snapshot = engine.ledger_snapshot().expect("reserved keeps a ledger");
        if let Some(ticket) = snapshot.tickets.first() {
            break *ticket;
        }
    };
    let geometry = &engine.params().geometry;
    let continuation = kv_pool::Continuation {
        prefix_tokens: 40,
        prompt_tokens: 340,
        chunk_tokens: 64,
        draft_lookahead_tokens: 0,
        captures: 3,
    };
    assert_eq!(
        ticket.peak_credit_pages,
        geometry.restore_need(&continuation).credit_pages
    );
    assert_eq!(
        geometry.restore_need(&continuation).credit_pages
            - geometry
                .restore_need(&kv_pool::Continuation {
                    captures: 0,
                    ..continuation
                })
                .credit_pages,
        3 * geometry.capture_pages()
    );
    let _steps = engine.run_until_idle(10_000).expect("run");
    assert_eq!(metrics_of(&engine, 2).prompt_tokens_restored, 40);
}

#[test]
fn h5_a_restore_without_draft_state_replays_its_last_page_into_a_replay_page() {
    // One full-attention group, three draft tokens. A checkpoint at 64 tokens (a block boundary) restores
    // without the draft model's state: the draft model replays the last page (16 tokens) into a replay page,
    // a copy on write of the shared last block, which the ticket's credits budget (the geometry's replay
    // page, checked after every step). Inside a page (70 tokens) it replays the 6 tokens of the partial page.
    for (prompt_len, replayed) in [(64, TPP), (70, 70 % TPP)] {
        for policy in [Policy::Ordinary, Policy::PagesOnly, Policy::Reserved] {
            let mut params = geometry_params(policy, 257, 1, windowed_groups(40, 0, false));
            params.draft_tokens = 3;
            let mut engine = Engine::new(params).expect("runs");
            let prompt = tokens(51, 0, 0, prompt_len);
            let _output = seed_checkpoint(&mut engine, 1, &prompt, 1);
            let mut turn = spec(2, [prompt, tokens(51, 1, 0, 20)].concat(), 4, engine.now());
            turn.is_later_turn = true;
            engine.submit(turn).unwrap();
            let id = kv_pool::RequestId(2);
            // While the import copies, the pages in use are its own (every policy).
            for _ in 0..10_000 {
                if engine.restore_gauges().copies_in_flight > 0 {
                    break;
                }
                engine.step().expect("step");
            }
            let pool = engine.pool();
            let imported: Vec<kv_pool::PageId> = (1..pool.n_total())
                .map(kv_pool::PageId)
                .filter(|&page| pool.ref_count(page).unwrap() > 0)
                .collect();
            for _ in 0..10_000 {
                let view = engine.request(id).expect("live");
                if view.phase.name() == "running" && view.n_computed > prompt_len {
                    break;
                }
                engine.step().expect("step");
                engine.check_invariants().expect("invariants");
            }
            let view = engine.request(id).expect("running");
            let last = (prompt_len / TPP - 1) as usize;
            let replay_page_copied = !imported.contains(&view.page_table[last]);
            assert_eq!(
                replay_page_copied,
                prompt_len % TPP == 0,
                "{policy:?}, {prompt_len}: the replay page is a copy exactly on a block boundary"
            );
            let _steps = engine.run_until_idle(10_000).expect("run");
            let metrics = metrics_of(&engine, 2);
            assert_eq!(
                metrics.prompt_tokens_restored, prompt_len,
                "{policy:?}: {metrics:?}"
            );
            assert_eq!(
                metrics.draft_replay_tokens, replayed,
                "{policy:?}, {prompt_len}"
            );
            assert_eq!(engine.leaked_pages(), 0);
        }
    }
}

#[test]
fn h5_a_checkpoint_with_draft_state_resumes_drafting_without_a_replay() {
    // The auxiliary group holds the draft hidden state: it is captured and restored with the checkpoint, so
    // drafting resumes at once, on a block boundary or inside a page.
    for prompt_len in [64, 70] {
        for policy in [Policy::Ordinary, Policy::PagesOnly, Policy::Reserved] {
            let mut params = geometry_params(policy, 257, 1, hybrid_groups());
            params.draft_tokens = 3;
            let mut engine = Engine::new(params).expect("runs");
            let prompt = tokens(52, 0, 0, prompt_len);
            let _output = seed_checkpoint(&mut engine, 1, &prompt, 1);
            let mut turn = spec(2, [prompt, tokens(52, 1, 0, 20)].concat(), 4, engine.now());
            turn.is_later_turn = true;
            engine.submit(turn).unwrap();
            while !engine.is_idle() {
                engine.step().expect("step");
                engine.check_invariants().expect("invariants");
            }
            let metrics = metrics_of(&engine, 2);
            assert_eq!(
                metrics.prompt_tokens_restored, prompt_len,
                "{policy:?}: {metrics:?}"
            );
            assert_eq!(metrics.draft_replay_tokens, 0, "{policy:?}: no replay");
            // Both fixed-page kinds came back byte for byte: the recurrent state and the two draft pages.
            assert_eq!(
                engine.pages_verified(),
                u64::from(prompt_len.div_ceil(TPP)) + 3
            );
        }
    }
}

/// Cache groups of each kind a local hybrid hit must serve (H9): recurrent and auxiliary state, a sliding
/// window (40 tokens, 8 retained) and chunked-local attention (64 tokens).
fn local_hit_geometries() -> [Vec<CacheGroup>; 3] {
    [
        hybrid_groups(),
        windowed_groups(40, 8, false),
        windowed_groups(64, 0, true),
    ]
}

/// Runs `engine` until idle, checking the invariants (H10's budget among them) after every step.
fn run_checked(engine: &mut Engine) {
    while !engine.is_idle() {
        engine.step().expect("step");
        engine.check_invariants().expect("invariants");
    }
}

/// Submits request `id` with `prompt` as a later turn and runs it to the end; its metrics.
fn later_turn(engine: &mut Engine, id: u64, prompt: Vec<u32>) -> engine::RequestMetrics {
    let mut turn = spec(id, prompt, 4, engine.now());
    turn.is_later_turn = true;
    engine.submit(turn).unwrap();
    run_checked(engine);
    metrics_of(engine, id)
}

#[test]
fn h9_a_later_turn_hits_the_finished_turns_boundary_locally_in_both_orders() {
    // Turn 1: a 70-token prompt, 30 output tokens: it finishes at 99 computed tokens (the last sampled token
    // is not computed), inside its seventh block. Once it finished, a turn extending its whole context hits
    // exactly those 99 tokens locally, every group served (state, window, partial pages), verified like a
    // restore: a complete local hit, though the store holds the same boundary. While it still decodes there is no such boundary yet: a turn
    // arriving then restores the prompt-end checkpoint (H2), and a turn after the finish still hits locally.
    for groups in local_hit_geometries() {
        for policy in [Policy::Ordinary, Policy::PagesOnly, Policy::Reserved] {
            for while_running in [false, true] {
                let label = format!("{:?}, {policy:?}, while running {while_running}", groups[1]);
                let mut engine = Engine::new(geometry_params(policy, 257, 1, groups.clone()))
                    .expect("a hybrid model runs");
                let prompt = tokens(41, 0, 0, 70);
                engine
                    .submit(spec(1, prompt.clone(), 30, engine.now()))
                    .unwrap();
                if while_running {
                    while engine.store_stats().n_checkpoints == 0 {
                        engine.step().expect("step");
                    }
                    let early = [prompt.clone(), tokens(41, 2, 0, 40)].concat();
                    let metrics = later_turn(&mut engine, 2, early);
                    assert_eq!(metrics.prompt_tokens_local_hit, 0, "{label}: {metrics:?}");
                    assert_eq!(metrics.prompt_tokens_restored, 70, "{label}: {metrics:?}");
                }
                run_checked(&mut engine);
                assert!(engine.snapshot_pages() > 0, "{label}: no snapshot");
                let output = engine
                    .take_finished()
                    .into_iter()
                    .find(|finished| finished.id == kv_pool::RequestId(1))
                    .expect("turn 1 finished")
                    .output;
                let verified = engine.pages_verified();
                let next = [prompt, output, tokens(41, 1, 0, 13)].concat();
                let metrics = later_turn(&mut engine, 3, next);
                assert_eq!(metrics.prompt_tokens_local_hit, 99, "{label}: {metrics:?}");
                assert_eq!(metrics.prompt_tokens_restored, 0, "{label}: {metrics:?}");
                assert!(metrics.complete_local_hit, "{label}: {metrics:?}");
                assert!(
                    engine.pages_verified() > verified,
                    "{label}: hit not verified"
                );
                assert_eq!(engine.leaked_pages(), 0);
            }
        }
    }
}

#[test]
fn h9_a_boundary_is_a_hit_only_for_a_prompt_that_holds_it_exactly() {
    // Turn 1 finishes at 99 tokens. A prompt that leaves its context at token 97 (inside the boundary's
    // partial block), and the same context under another salt, find no local hit: never a boundary the
    // prompt does not hold, never blocks or a window without their state. Both restore the prompt-end
    // checkpoint (70 tokens) when it is theirs, and nothing under another salt.
    for groups in local_hit_geometries() {
        for policy in [Policy::Ordinary, Policy::PagesOnly, Policy::Reserved] {
            let label = format!("{:?}, {policy:?}", groups[1]);
            let mut engine = Engine::new(geometry_params(policy, 257, 1, groups.clone()))
                .expect("a hybrid model runs");
            let prompt = tokens(43, 0, 0, 70);
            let output = seed_output(&mut engine, &prompt);
            let context = [prompt, output].concat();
            let diverged = [&context[..97], &tokens(43, 1, 0, 20)[..]].concat();
            let metrics = later_turn(&mut engine, 2, diverged);
            assert_eq!(metrics.prompt_tokens_local_hit, 0, "{label}: {metrics:?}");
            assert_eq!(metrics.prompt_tokens_restored, 70, "{label}: {metrics:?}");
            let mut salted = spec(
                3,
                [&context[..], &tokens(43, 2, 0, 9)].concat(),
                4,
                engine.now(),
            );
            salted.salt = b"another tenant".to_vec();
            salted.is_later_turn = true;
            engine.submit(salted).unwrap();
            run_checked(&mut engine);
            let metrics = metrics_of(&engine, 3);
            assert_eq!(
                metrics.prompt_tokens_local_hit + metrics.prompt_tokens_restored,
                0,
                "{label}: another salt was served: {metrics:?}"
            );
        }
    }
}

/// Runs request 1 with `prompt` (30 output tokens) to its finish, leaving its snapshot; its output.
fn seed_output(engine: &mut Engine, prompt: &[u32]) -> Vec<u32> {
    engine
        .submit(spec(1, prompt.to_vec(), 30, engine.now()))
        .unwrap();
    run_checked(engine);
    engine
        .take_finished()
        .into_iter()
        .find(|finished| finished.id == kv_pool::RequestId(1))
        .expect("request 1 finished")
        .output
}

#[test]
fn h10_snapshots_stay_within_their_budget_and_the_oldest_lose_their_keys() {
    // `hybrid_groups` at 99 tokens: a snapshot keys 4 pages of its own (the partial last page, the state and
    // two auxiliary pages; its full blocks are cached as always). A budget of 4 pages keeps one session's
    // boundary: session A's is dropped when session B's is taken, so B's next turn hits locally while A's
    // restores its response checkpoint from the store, verified. A budget of 0 keeps none.
    for policy in [Policy::Ordinary, Policy::PagesOnly, Policy::Reserved] {
        for budget in [4, 0] {
            let label = format!("{policy:?}, budget {budget}");
            let mut params = geometry_params(policy, 257, 1, hybrid_groups());
            params.state_snapshot_pages = budget;
            let mut engine = Engine::new(params).expect("a hybrid model runs");
            let prompts = [tokens(47, 0, 0, 70), tokens(47, 1, 0, 70)];
            let mut contexts = Vec::new();
            for (session, prompt) in prompts.iter().enumerate() {
                let id = 1 + session as u64;
                engine
                    .submit(spec(id, prompt.clone(), 30, engine.now()))
                    .unwrap();
                run_checked(&mut engine);
                assert!(engine.snapshot_pages() <= budget, "{label}");
                let output = engine.take_finished().remove(0).output;
                contexts.push([&prompt[..], &output, &tokens(47, 2, id as u32, 13)].concat());
            }
            assert_eq!(engine.snapshot_pages(), budget, "{label}");
            let b = later_turn(&mut engine, 3, contexts[1].clone());
            let (local, restored) = if budget > 0 { (99, 0) } else { (0, 99) };
            assert_eq!(b.prompt_tokens_local_hit, local, "{label}: {b:?}");
            assert_eq!(b.prompt_tokens_restored, restored, "{label}: {b:?}");
            let verified = engine.pages_verified();
            let a = later_turn(&mut engine, 4, contexts[0].clone());
            assert_eq!(a.prompt_tokens_local_hit, 0, "{label}: {a:?}");
            assert_eq!(a.prompt_tokens_restored, 99, "{label}: {a:?}");
            assert!(engine.pages_verified() > verified, "{label}");
        }
    }
}

#[test]
fn h10_the_budget_counts_partial_pages_and_state_never_a_windows_blocks() {
    // At 99 tokens a windowed snapshot owns the partial last page of the block table and of the window (2
    // pages); the window's live full blocks are cached blocks, as full attention's, outside the budget.
    for groups in [windowed_groups(40, 8, false), windowed_groups(64, 0, true)] {
        let label = format!("{:?}", groups[1]);
        let mut engine = Engine::new(geometry_params(Policy::Reserved, 257, 1, groups))
            .expect("a windowed model runs");
        let _output = seed_output(&mut engine, &tokens(59, 0, 0, 70));
        assert_eq!(engine.snapshot_pages(), 2, "{label}");
    }
    let mut engine = Engine::new(geometry_params(Policy::Reserved, 257, 1, hybrid_groups()))
        .expect("a hybrid model runs");
    let _output = seed_output(&mut engine, &tokens(59, 0, 0, 70));
    assert_eq!(
        engine.snapshot_pages(),
        4,
        "the partial page, the state, two auxiliary pages"
    );
}

#[test]
fn h10_a_snapshot_the_pool_evicted_is_a_miss_never_a_partial_hit() {
    // Turn 1 finishes at 99 tokens on a 48-page pool; a 560-token prompt of another session (chunks of 64)
    // then needs 35 blocks, its live window or state besides: more pages than the pool holds uncached, so
    // it evicts some of the snapshot's (some of its pages may stay). The next turn finds no local hit and
    // restores the response checkpoint whole from the store, verified.
    for groups in local_hit_geometries() {
        for policy in [Policy::Ordinary, Policy::PagesOnly, Policy::Reserved] {
            let label = format!("{:?}, {policy:?}", groups[1]);
            let mut params = geometry_params(policy, 48, 1, groups.clone());
            params.chunk_tokens = 64;
            let mut engine = Engine::new(params).expect("a hybrid model runs");
            let prompt = tokens(53, 0, 0, 70);
            let output = seed_output(&mut engine, &prompt);
            let pages = engine.snapshot_pages();
            assert!(pages > 0, "{label}");
            engine
                .submit(spec(2, tokens(53, 1, 0, 560), 8, engine.now()))
                .unwrap();
            run_checked(&mut engine);
            let _other = engine.take_finished();
            let next = [prompt, output, tokens(53, 2, 0, 13)].concat();
            let metrics = later_turn(&mut engine, 3, next);
            assert_eq!(metrics.prompt_tokens_local_hit, 0, "{label}: {metrics:?}");
            assert_eq!(metrics.prompt_tokens_restored, 99, "{label}: {metrics:?}");
            assert_eq!(engine.leaked_pages(), 0);
        }
    }
}

#[test]
fn a_snapshot_budget_above_the_pool_limit_is_refused_naming_it() {
    let mut params = geometry_params(Policy::Reserved, 257, 1, hybrid_groups());
    params.state_snapshot_pages = EngineParams::N_PAGES_MAX + 1;
    let error = Engine::new(params).expect_err("a budget above the pool limit");
    assert!(
        matches!(&error, Error::InvalidParam { name: "state_snapshot_pages", reason } if reason.contains("above the limit")),
        "{error}"
    );
}

#[test]
fn h10_a_snapshot_evicted_between_arrival_and_admission_is_looked_up_again_never_a_partial_hit() {
    // Turn 1 finishes at 99 tokens on a 48-page pool with one running slot. Another session's 560-token
    // prompt and the next turn then arrive together, the other first: the store's answer to the turn finds
    // its boundary whole in the pool (a complete local hit: no restore), then the turn waits for the slot
    // while the other prompt's 35 blocks evict the snapshot. At admission the hit is gone: `reserved` and
    // `pages-only` ask the store again and restore the response checkpoint whole; `ordinary`, which does not
    // ask again (G1), recomputes. Never a partial hit, nothing leaked, every step's invariants hold.
    for groups in local_hit_geometries() {
        for policy in [Policy::Ordinary, Policy::PagesOnly, Policy::Reserved] {
            let label = format!("{:?}, {policy:?}", groups[1]);
            let mut params = geometry_params(policy, 48, 1, groups.clone());
            params.chunk_tokens = 64;
            params.max_running = 1;
            let mut engine = Engine::new(params).expect("a hybrid model runs");
            let prompt = tokens(61, 0, 0, 70);
            let output = seed_output(&mut engine, &prompt);
            assert!(engine.snapshot_pages() > 0, "{label}");
            let now = engine.now();
            engine
                .submit(spec(2, tokens(61, 1, 0, 560), 8, now))
                .unwrap();
            let next = [prompt, output, tokens(61, 2, 0, 13)].concat();
            let mut turn = spec(3, next, 4, now);
            turn.is_later_turn = true;
            engine.submit(turn).unwrap();
            // Precondition: the store's answer (the response checkpoint, 99 tokens) found the boundary whole in
            // the pool, a complete local hit: the turn waits with no restore, behind the other session.
            let view = |engine: &Engine| engine.request(RequestId(3)).expect("live");
            while matches!(
                view(&engine).phase,
                engine::RequestPhase::Arriving | engine::RequestPhase::Restoring
            ) {
                engine.step().expect("step");
                engine.check_invariants().expect("invariants");
            }
            let waiting = view(&engine);
            assert_eq!(waiting.phase, engine::RequestPhase::Waiting, "{label}");
            assert_eq!(waiting.lookups, 1, "{label}: {waiting:?}");
            assert_eq!(waiting.n_computed, 0, "{label}: {waiting:?}");
            run_checked(&mut engine);
            let other = metrics_of(&engine, 2);
            let turn = metrics_of(&engine, 3);
            assert!(
                turn.first_token > other.finished,
                "{label}: the turn ran before the other session finished: {turn:?}"
            );
            assert!(turn.complete_local_hit, "{label}: {turn:?}");
            assert_eq!(turn.prompt_tokens_local_hit, 0, "{label}: {turn:?}");
            let restored = if policy == Policy::Ordinary { 0 } else { 99 };
            assert_eq!(turn.prompt_tokens_restored, restored, "{label}: {turn:?}");
            assert_eq!(
                turn.lookups,
                1 + u32::from(restored > 0),
                "{label}: {turn:?}"
            );
            assert_eq!(engine.leaked_pages(), 0, "{label}");
        }
    }
}
