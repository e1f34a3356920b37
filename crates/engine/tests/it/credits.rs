//! Credits at the engine level (C1-C6): a restored consumer keeps its credits until its prompt is computed,
//! whichever of it and a competing prefill was admitted first, for several chunk sizes and restored prefix
//! lengths on a small pool, on one full-attention group and on every other group kind (C1-C4: its credits
//! cover its windows, state and captures, and its partial pages' copies on write).

use engine::{Engine, EngineParams, Policy};
use kv_pool::{CacheGroup, Continuation, Geometry, GroupKind, RequestId};

use crate::agents::tokens;
use crate::contract::{TPP, seed_checkpoint, spec};

/// Who is admitted first: the competing cold prefill or the restored consumer.
#[derive(Clone, Copy, Debug)]
enum Order {
    CompetitorFirst,
    ConsumerFirst,
}

/// Runs a restored consumer of `restored_pages` pages plus `new_pages` of new prompt against a competitor
/// whose prompt alone nearly fills the pool, and checks every step: while the consumer holds its ticket it is
/// never preempted and the free pages never drop below the outstanding credits (no running decode competes
/// here, so nobody may dip into them, C1). Both finish; the consumer restored its whole checkpoint.
fn consumer_keeps_its_credits(order: Order, chunk_tokens: u32, restored_pages: u32) {
    let groups = EngineParams::default().geometry.groups().to_vec();
    consumer_keeps_its_credits_on(&groups, order, chunk_tokens, restored_pages);
}

/// `consumer_keeps_its_credits` on a model with cache `groups`: the pool is sized from the geometry's own
/// arithmetic so that it is as tight for every group kind (the consumer's restore need plus 6 pages, the
/// competitor's prompt as long as its peak leaves 4).
fn consumer_keeps_its_credits_on(
    groups: &[CacheGroup],
    order: Order,
    chunk_tokens: u32,
    restored_pages: u32,
) {
    // Tight: once the consumer is admitted, fewer pages are free beyond its credits than its credits, so the
    // competitor runs out of unprotected pages while the consumer still computes its prompt.
    let new_pages = 12;
    let geometry = Geometry::new(groups.to_vec(), TPP, 1, 131_072).expect("a valid geometry");
    let prompt_tokens = (restored_pages + new_pages) * TPP - 3;
    let need = geometry.restore_need(&Continuation {
        prefix_tokens: restored_pages * TPP,
        prompt_tokens,
        chunk_tokens,
        draft_lookahead_tokens: 0,
        // Capture credits are never drawn (a capture copies out of the request's own pages): without them
        // one full-attention group gets the pool of the review's report, 28 pages for 10 restored.
        captures: 0,
    });
    let n_usable = need.total_pages() + 6;
    let mut competitor_tokens = TPP;
    while geometry.request_peak_pages(competitor_tokens + TPP, chunk_tokens, 0) + 4 <= n_usable {
        competitor_tokens += TPP;
    }
    let params = EngineParams {
        geometry,
        policy: Policy::Reserved,
        n_pages: n_usable + 1,
        max_running: 4,
        chunk_tokens,
        ..crate::verified_defaults()
    };
    let mut engine = Engine::new(params).expect("valid params");
    let history = tokens(7, 1, 0, restored_pages * TPP);
    let _output = seed_checkpoint(&mut engine, 1, &history, 1);
    let mut prompt = history;
    prompt.extend(tokens(7, 1, 1, new_pages * TPP - 3));
    let competitor = spec(2, tokens(8, 2, 0, competitor_tokens), 8, engine.now());
    let consumer = spec(3, prompt, 8, engine.now());
    match order {
        // Together: the consumer reserves when its lookup is answered, the competitor is admitted cold in
        // the same step and runs ahead of the consumer from then on.
        Order::CompetitorFirst => {
            engine.submit(consumer).expect("submit");
            engine.submit(competitor).expect("submit");
        }
        Order::ConsumerFirst => {
            engine.submit(consumer).expect("submit");
            while engine
                .request(RequestId(3))
                .is_some_and(|view| view.phase != engine::RequestPhase::Running)
            {
                engine.step().expect("step");
            }
            engine.submit(competitor).expect("submit");
        }
    }
    let label = format!(
        "{order:?}, chunk {chunk_tokens}, {restored_pages} restored pages, groups {:?}",
        groups.iter().map(|group| group.kind).collect::<Vec<_>>()
    );
    for _ in 0..10_000 {
        if engine.is_idle() {
            break;
        }
        let consumer_holds_ticket = engine
            .request(RequestId(3))
            .is_some_and(|view| view.has_ticket);
        let report = engine.step().expect("step");
        engine.check_invariants().expect("invariants");
        if consumer_holds_ticket {
            assert!(
                !report.preempted.contains(&RequestId(3)),
                "{label}: the consumer was preempted while it held credits"
            );
        }
        if engine
            .request(RequestId(3))
            .is_some_and(|view| view.has_ticket)
        {
            assert!(
                report.free_pages >= report.credit_pages,
                "{label}: {} free pages < {} credits: a prefill took protected pages",
                report.free_pages,
                report.credit_pages
            );
        }
    }
    assert!(engine.is_idle(), "{label}: the run did not finish");
    let metrics = |id: u64| {
        engine
            .request_metrics()
            .iter()
            .find(|m| m.id == Some(RequestId(id)))
            .cloned()
            .expect("finished")
    };
    let consumer = metrics(3);
    assert!(!consumer.cancelled && !metrics(2).cancelled, "{label}");
    // Its final admission (after a preemption in decode, if any) served at least the checkpoint from cache.
    assert!(
        consumer.prompt_tokens_restored + consumer.prompt_tokens_local_hit >= restored_pages * TPP,
        "{label}: the consumer's prefix came from cache: {consumer:?}"
    );
    assert_eq!(engine.metrics().leaked_pages, 0, "{label}");
    assert_eq!(engine.pool().n_in_use(), 0, "{label}: every page is free");
}

#[test]
fn c1_a_competing_prefill_never_takes_credit_protected_pages_in_either_admission_order() {
    for order in [Order::CompetitorFirst, Order::ConsumerFirst] {
        for chunk_tokens in [16, 32, 48, 512] {
            for restored_pages in [3, 10] {
                consumer_keeps_its_credits(order, chunk_tokens, restored_pages);
            }
        }
    }
}

#[test]
fn c6_a_credit_holder_is_never_preempted_before_its_prompt_is_computed() {
    // The order of the review's report: the competitor is admitted first and runs ahead of the consumer,
    // so a preemption from the tail would pick the consumer.
    consumer_keeps_its_credits(Order::CompetitorFirst, 32, 10);
    consumer_keeps_its_credits(Order::CompetitorFirst, 16, 3);
}

#[test]
fn c1_to_c4_a_consumer_keeps_its_credits_on_every_group_kind_in_either_admission_order() {
    let group = |kind| CacheGroup {
        kind,
        bytes_per_page: 4096,
    };
    let full = group(GroupKind::Full);
    let kinds = [
        vec![
            full,
            group(GroupKind::SlidingWindow {
                window_tokens: 40,
                retained_tail_tokens: 8,
            }),
        ],
        vec![full, group(GroupKind::ChunkedLocal { chunk_tokens: 48 })],
        vec![group(GroupKind::Recurrent), full],
        vec![full, group(GroupKind::Auxiliary { pages: 2 })],
    ];
    for groups in &kinds {
        for order in [Order::CompetitorFirst, Order::ConsumerFirst] {
            for chunk_tokens in [16, 48, 512] {
                consumer_keeps_its_credits_on(groups, order, chunk_tokens, 10);
            }
        }
    }
}
