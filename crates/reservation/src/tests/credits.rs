//! C1-C6: a consumer simulated chunk by chunk allocates from its credits while a greedy competitor takes every
//! spare page each step; the consumer must progress every step (zero preemptions), end with zero credits, and
//! leave the pool fully free once everyone frees.

use std::collections::VecDeque;

use kv_pool::{CacheGroup, Geometry, GroupKind, PageId, PagePool};

use crate::{ErrorKind, Ledger, LedgerConfig, Preflight, RestoreSpec};
use kv_pool::{AdmissionOrder, RequestId, Timestamp};

fn geometry(kinds: &[GroupKind], tokens_per_page: u32, context_parallel: u32) -> Geometry {
    let groups = kinds
        .iter()
        .map(|&kind| CacheGroup {
            kind,
            bytes_per_page: 64,
        })
        .collect();
    Geometry::new(groups, tokens_per_page, context_parallel, 1 << 16).expect("valid geometry")
}

fn sliding(window_tokens: u32, retained_tail_tokens: u32) -> GroupKind {
    GroupKind::SlidingWindow {
        window_tokens,
        retained_tail_tokens,
    }
}

fn spec(
    geometry: &Geometry,
    boundary: u32,
    prompt: u32,
    chunk: u32,
    draft: u32,
    captures: u32,
) -> RestoreSpec {
    RestoreSpec {
        draft_lookahead_tokens: draft,
        captures,
        ..RestoreSpec::for_geometry(geometry, boundary, prompt, chunk)
    }
}

/// Pages the consumer holds from its credits while it computes `[start, end)` (`after`: once it is done and
/// positions that left the window became null).
fn held_pages(geometry: &Geometry, spec: &RestoreSpec, start: u32, end: u32, after: bool) -> u32 {
    let prefix = spec.boundary_tokens;
    let write_end = end + spec.draft_lookahead_tokens;
    let replay = u32::from(
        spec.draft_lookahead_tokens > 0 && prefix > 0 && !geometry.ends_inside_page(prefix),
    );
    let live_at = if after { end } else { start };
    let mut pages = 0;
    for (group_idx, group) in geometry.groups().iter().enumerate() {
        pages += match group.kind {
            GroupKind::Full => geometry.span_pages(prefix, write_end) + replay,
            GroupKind::SlidingWindow { .. } | GroupKind::ChunkedLocal { .. } => {
                let live_start = geometry.live_tokens(group_idx, live_at).start.max(prefix);
                geometry.span_pages(live_start, write_end) + replay
            }
            GroupKind::Recurrent => 1,
            GroupKind::Auxiliary { pages } => pages,
        };
    }
    if end == spec.prompt_tokens {
        pages += spec.captures * geometry.capture_pages();
    }
    pages
}

#[derive(Debug, Default)]
struct Outcome {
    steps: u32,
    peak_held: u32,
    competitor_pages: u32,
}

/// Runs one restore's consumer on a pool `extra_pages` larger than its need, with a greedy competitor.
fn run_consumer(geometry: &Geometry, spec: &RestoreSpec, extra_pages: u32) -> Outcome {
    let request = RequestId(1);
    let need = spec.need(geometry).expect("valid spec");
    let n_usable = need.total_pages() + extra_pages;
    let mut pool = PagePool::new(1 + n_usable).expect("pool");
    let mut ledger = Ledger::new(geometry.clone(), LedgerConfig::new(4));
    let ticket = ledger
        .reserve(
            &mut pool,
            request,
            AdmissionOrder::fcfs(1),
            spec,
            &Preflight::default(),
            Timestamp::ZERO,
        )
        .expect("fits an empty pool");
    ledger.publish(request).expect("importing");
    for &page in &ticket.import_pages {
        pool.touch(page).expect("consumer acquires");
    }
    ledger.admit(request, &mut pool).expect("ready");

    let mut held: VecDeque<PageId> = VecDeque::new();
    let mut competitor: Vec<PageId> = Vec::new();
    let mut outcome = Outcome::default();
    let mut start = spec.boundary_tokens;
    loop {
        let end = (start + spec.chunk_tokens).min(spec.prompt_tokens);
        let target = held_pages(geometry, spec, start, end, false);
        let missing = target.saturating_sub(held.len() as u32);
        let pages = ledger
            .allocate(&mut pool, request, missing)
            .unwrap_or_else(|err| {
                panic!("consumer preempted at [{start}, {end}) of {spec:?}: {err}");
            });
        held.extend(pages);
        outcome.peak_held = outcome.peak_held.max(held.len() as u32);
        // The greedy competitor takes every page not protected by credits; a new admission then fails.
        let spare = pool.n_free().saturating_sub(ledger.credit_pages());
        competitor.extend(pool.allocate(spare).expect("spare pages are free"));
        assert_eq!(ledger.available_pages(&pool, &Preflight::default()), 0);
        assert!(
            ledger.credit_pages() <= pool.n_free(),
            "credits exceed free pages"
        );
        let keep = held_pages(geometry, spec, start, end, true);
        let drop = (held.len() as u32).saturating_sub(keep);
        for _ in 0..drop {
            pool.free(held.pop_front().expect("held")).expect("free");
        }
        ledger
            .release_window_pages(request, drop)
            .expect("admitted");
        ledger.check_invariants(&pool).unwrap();
        outcome.steps += 1;
        start = end;
        if end == spec.prompt_tokens {
            break;
        }
    }
    ledger.finish_prompt(request).expect("admitted");
    assert_eq!(ledger.credit_pages(), 0, "credits left after the prompt");
    assert!(!ledger.holds_anything(request));
    outcome.competitor_pages = competitor.len() as u32;
    let held: Vec<PageId> = held.into_iter().collect();
    pool.free_all(&held).expect("free");
    pool.free_all(&ticket.import_pages).expect("free");
    pool.free_all(&competitor).expect("free");
    assert_eq!(pool.n_free(), n_usable, "pool not fully free");
    pool.check_invariants().unwrap();
    outcome
}

#[test]
fn c1_credits_cover_the_continuation_for_any_chunk_draft_and_cp() {
    for cp in [1, 2] {
        let geo = geometry(&[GroupKind::Full, GroupKind::Recurrent], 16, cp);
        for (boundary, prompt) in [(64, 400), (70, 400), (96, 97)] {
            for chunk in [1, 16, 33, 127] {
                for draft in [0, 3] {
                    let spec = spec(&geo, boundary, prompt, chunk, draft, 0);
                    let outcome = run_consumer(&geo, &spec, 2);
                    let expected_steps = (prompt - boundary).div_ceil(chunk);
                    assert_eq!(outcome.steps, expected_steps, "{spec:?}");
                }
            }
        }
    }
}

#[test]
fn c1_competitor_fails_when_free_pages_equal_credits() {
    let geo = geometry(&[GroupKind::Full], 4, 1);
    let mut pool = PagePool::new(1 + 6).expect("pool");
    let mut ledger = Ledger::new(geo.clone(), LedgerConfig::new(4));
    let first = RestoreSpec::for_geometry(&geo, 4, 16, 16); // 1 import + 3 credits
    let _ticket = ledger
        .reserve(
            &mut pool,
            RequestId(1),
            AdmissionOrder::fcfs(1),
            &first,
            &Preflight::default(),
            Timestamp::ZERO,
        )
        .expect("fits");
    let _decode = pool.allocate(2).expect("unprotected pages");
    assert_eq!(pool.n_free(), ledger.credit_pages());
    assert_eq!(ledger.available_pages(&pool, &Preflight::default()), 0);
    let tiny = RestoreSpec::for_geometry(&geo, 1, 1, 16);
    let err = ledger
        .reserve(
            &mut pool,
            RequestId(2),
            AdmissionOrder::fcfs(2),
            &tiny,
            &Preflight::default(),
            Timestamp::ZERO,
        )
        .expect_err("credit-protected");
    assert_eq!(err.kind(), ErrorKind::Pressure);
}

#[test]
fn c2_captures_are_budgeted_and_a_short_suffix_needs_only_private_pages() {
    let geo = geometry(
        &[
            GroupKind::Full,
            sliding(32, 0),
            GroupKind::Recurrent,
            GroupKind::Recurrent,
        ],
        16,
        1,
    );
    assert_eq!(geo.capture_pages(), 4);
    // Suffix of one token: two private recurrent states, one attention page per attention group, captures.
    for captures in [0, 1, 2] {
        for boundary in [64, 70] {
            let spec = spec(&geo, boundary, boundary + 1, 16, 0, captures);
            let need = spec.need(&geo).expect("valid");
            assert_eq!(need.credit_pages, 2 + 2 + captures * 4, "{spec:?}");
            let _outcome = run_consumer(&geo, &spec, 1);
        }
    }
    // Zero-token suffix (a full-prompt restore): only the private states and captures.
    let full_prompt = spec(&geo, 64, 64, 16, 0, 1);
    assert_eq!(full_prompt.need(&geo).expect("valid").credit_pages, 2 + 4);
    // Longer continuations: captures add on top of the execution pages.
    let base = spec(&geo, 64, 400, 33, 0, 0);
    let captured = spec(&geo, 64, 400, 33, 0, 3);
    let delta = captured.need(&geo).expect("valid").credit_pages
        - base.need(&geo).expect("valid").credit_pages;
    assert_eq!(delta, 3 * 4);
    let _outcome = run_consumer(&geo, &captured, 0);
}

#[test]
fn c3_partial_page_copy_and_replay_page_are_budgeted() {
    let geo = geometry(&[GroupKind::Full], 16, 1);
    // Boundary inside a page: pages 4..=6 for [70, 100) include the copy-on-write of page 4.
    assert!(geo.ends_inside_page(70));
    assert_eq!(
        spec(&geo, 70, 100, 16, 0, 0)
            .need(&geo)
            .expect("valid")
            .credit_pages,
        3
    );
    // On a boundary: pages 4..=6 for [64, 100); with draft decoding the replay page is added.
    assert!(!geo.ends_inside_page(64));
    assert_eq!(
        spec(&geo, 64, 100, 16, 0, 0)
            .need(&geo)
            .expect("valid")
            .credit_pages,
        3
    );
    assert_eq!(
        spec(&geo, 64, 100, 16, 1, 0)
            .need(&geo)
            .expect("valid")
            .credit_pages,
        3 + 1
    );
    // CP 2: 70 tokens = 35 per rank, inside a page; 64 = 32 per rank, a boundary.
    let cp2 = geometry(&[GroupKind::Full], 16, 2);
    assert!(cp2.ends_inside_page(70) && !cp2.ends_inside_page(64));
    assert_eq!(
        spec(&cp2, 64, 100, 16, 1, 0)
            .need(&cp2)
            .expect("valid")
            .credit_pages,
        2 + 1
    );
    for (boundary, draft) in [(70, 0), (70, 2), (64, 0), (64, 2)] {
        for geo in [&geo, &cp2] {
            let _outcome = run_consumer(geo, &spec(geo, boundary, 200, 33, draft, 1), 0);
        }
    }
}

#[test]
fn c4_windowed_credits_cover_the_live_window_and_progress_under_greedy_competition() {
    let kinds = [
        vec![sliding(32, 0)],
        vec![sliding(32, 16)],
        vec![GroupKind::ChunkedLocal { chunk_tokens: 64 }],
        vec![
            GroupKind::Full,
            sliding(48, 8),
            GroupKind::ChunkedLocal { chunk_tokens: 32 },
            GroupKind::Recurrent,
        ],
    ];
    for kinds in &kinds {
        for cp in [1, 2] {
            let geo = geometry(kinds, 16, cp);
            for (boundary, prompt) in [(64, 600), (70, 600), (64, 65), (70, 71)] {
                for chunk in [1, 16, 33, 127] {
                    for draft in [0, 2] {
                        let spec = spec(&geo, boundary, prompt, chunk, draft, 0);
                        let outcome = run_consumer(&geo, &spec, 1);
                        assert_eq!(
                            outcome.steps,
                            (prompt - boundary).div_ceil(chunk),
                            "{spec:?}"
                        );
                        assert!(
                            outcome.competitor_pages >= 1,
                            "the competitor always finds the spare page"
                        );
                    }
                }
            }
        }
    }
    // The window, not the suffix: a long suffix through a 32-token window needs a handful of pages.
    let geo = geometry(&[sliding(32, 0)], 16, 1);
    let need = spec(&geo, 64, 4096, 16, 0, 0).need(&geo).expect("valid");
    assert_eq!(need.credit_pages, 4);
    assert_eq!(geo.span_pages(64, 4096), 252);
}

#[test]
fn c5_running_decodes_may_use_credit_protected_pages_without_preemption() {
    let geo = geometry(&[GroupKind::Full], 4, 1);
    let mut pool = PagePool::new(1 + 8).expect("pool");
    let mut ledger = Ledger::new(geo.clone(), LedgerConfig::new(4));
    let spec = RestoreSpec::for_geometry(&geo, 4, 24, 16); // 1 import + 5 credits
    let _ticket = ledger
        .reserve(
            &mut pool,
            RequestId(1),
            AdmissionOrder::fcfs(1),
            &spec,
            &Preflight::default(),
            Timestamp::ZERO,
        )
        .expect("fits");
    // Decodes allocate without the credit check, eating into protected pages.
    let decode = pool.allocate(4).expect("decode pages");
    assert!(pool.n_free() < ledger.credit_pages());
    ledger.check_invariants(&pool).unwrap();
    assert_eq!(ledger.available_pages(&pool, &Preflight::default()), 0);
    // The ledger keeps its ticket (nothing is revoked, nobody is asked to preempt) and refuses newcomers.
    assert_eq!(ledger.credit_pages_of(RequestId(1)), 5);
    let other = RestoreSpec::for_geometry(&geo, 1, 1, 16);
    let err = ledger
        .reserve(
            &mut pool,
            RequestId(2),
            AdmissionOrder::fcfs(2),
            &other,
            &Preflight::default(),
            Timestamp::ZERO,
        )
        .expect_err("no unprotected page");
    assert_eq!(err.kind(), ErrorKind::Pressure);
    pool.free_all(&decode).expect("free");
    ledger.check_invariants(&pool).unwrap();
}

#[test]
fn c6_ticket_ends_with_the_prompt_and_the_pool_returns_to_its_start() {
    let geo = geometry(
        &[
            GroupKind::Full,
            GroupKind::Recurrent,
            GroupKind::Auxiliary { pages: 2 },
        ],
        16,
        1,
    );
    let spec = spec(&geo, 70, 300, 33, 2, 1);
    let outcome = run_consumer(&geo, &spec, 3);
    assert_eq!(outcome.steps, 230u32.div_ceil(33));
    let need = spec.need(&geo).expect("valid");
    assert!(outcome.peak_held <= need.credit_pages);
}
