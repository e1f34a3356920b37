//! KV events in vLLM's format (`Engine::take_kv_events`): a router that applies every event holds exactly the
//! engine's cached blocks after every step, under every policy, through evictions, restores and resets; every
//! stored block's hash is the chain of its parent hash and its token ids; a hybrid model's events name its
//! full-attention group; a full log drops its oldest events and counts them.

use std::collections::HashSet;

use engine::{Engine, Error, KvEvent, Policy};
use kv_pool::BlockKey;

use crate::agents::tokens;
use crate::contract::{TPP, params, spec};
use crate::hybrid::{geometry_params, hybrid_groups};

const SALT: &[u8] = b"t";

/// A router's view of the cache: applies `events` to `cached`, checking every stored block's hash against
/// its parent's and its tokens (`block_size` each), and that a removed block was stored. Returns the
/// number of blocks stored.
fn apply(cached: &mut HashSet<BlockKey>, events: &[KvEvent], group: u32) -> usize {
    let mut n_stored = 0;
    for event in events {
        match event {
            KvEvent::BlockStored(stored) => {
                assert_eq!(stored.group_idx, Some(group));
                assert_eq!(stored.medium, Some("GPU"));
                assert_eq!(stored.kv_cache_spec_kind, Some("full_attention"));
                let size = stored.block_size as usize;
                assert_eq!(stored.token_ids.len(), size * stored.block_hashes.len());
                let mut parent = stored.parent_block_hash;
                for (hash, block) in stored
                    .block_hashes
                    .iter()
                    .zip(stored.token_ids.chunks(size))
                {
                    assert_eq!(*hash, BlockKey::chain(parent.as_ref(), block, SALT));
                    parent = Some(*hash);
                    assert!(cached.insert(*hash), "stored twice: {hash:?}");
                    n_stored += 1;
                }
            }
            KvEvent::BlockRemoved(removed) => {
                assert_eq!(removed.group_idx, Some(group));
                for hash in &removed.block_hashes {
                    assert!(cached.remove(hash), "removed, never stored: {hash:?}");
                }
            }
            KvEvent::AllBlocksCleared => cached.clear(),
        }
    }
    n_stored
}

/// Runs `agents` sessions of `turns` turns (each turn the last context, its answer and 40 new tokens),
/// following the engine's cache through its events after every step and checking it equals the engine's
/// cached blocks (`whole`), or is a subset of them. Returns the blocks stored and the events seen.
fn follow(
    mut engine: Engine,
    (agents, turns): (u32, u32),
    group: u32,
    whole: bool,
) -> (usize, Vec<KvEvent>) {
    engine.enable_kv_events(1 << 20).expect("a new engine");
    let mut cached = HashSet::new();
    let mut seen = Vec::new();
    let mut n_stored = 0;
    let mut contexts: Vec<Vec<u32>> = (0..agents).map(|a| tokens(5, a, 0, 100)).collect();
    let mut id = 0;
    for turn in 0..turns {
        for context in &contexts {
            id += 1;
            let mut request = spec(id, context.clone(), 8, engine.now());
            request.is_later_turn = turn > 0;
            engine.submit(request).expect("submit");
        }
        while !engine.is_idle() {
            engine.step().expect("step");
            let events = engine.take_kv_events();
            n_stored += apply(&mut cached, &events, group);
            seen.extend(events);
            let resident: HashSet<BlockKey> = engine.cached_block_hashes().into_iter().collect();
            if whole {
                assert_eq!(cached, resident, "turn {turn}: the router disagrees");
            } else {
                assert!(
                    cached.is_subset(&resident),
                    "turn {turn}: the router disagrees"
                );
            }
        }
        for (finished, context) in engine.take_finished().into_iter().zip(&mut contexts) {
            context.extend(&finished.output);
        }
        for (agent, context) in contexts.iter_mut().enumerate() {
            context.extend(tokens(5, agent as u32, turn + 1, 40));
        }
    }
    engine.force_reset_prefix_cache().expect("reset");
    let events = engine.take_kv_events();
    assert_eq!(events.last(), Some(&KvEvent::AllBlocksCleared));
    let _ = apply(&mut cached, &events, group);
    assert!(cached.is_empty() && engine.cached_block_hashes().is_empty());
    seen.extend(events);
    assert_eq!(engine.kv_events_dropped(), 0);
    (n_stored, seen)
}

#[test]
fn a_router_following_the_events_holds_the_engines_cached_blocks_after_every_step() {
    for policy in [Policy::Ordinary, Policy::PagesOnly, Policy::Reserved] {
        // 4 sessions outgrow 48 pages of 16 tokens: blocks are evicted and later turns restore.
        let (n_stored, seen) = follow(Engine::new(params(policy, 48)).unwrap(), (4, 4), 0, true);
        let removed = seen
            .iter()
            .any(|event| matches!(event, KvEvent::BlockRemoved(_)));
        assert!(removed, "{policy}: nothing was evicted");
        assert!(n_stored > 48, "{policy}: {n_stored} blocks stored");
        let chained = seen.iter().any(|event| {
            matches!(event, KvEvent::BlockStored(stored) if stored.parent_block_hash.is_some())
        });
        assert!(chained, "{policy}: no event continues a chain");
    }
}

#[test]
fn a_hybrid_models_events_name_its_full_attention_group() {
    // `hybrid_groups`: recurrent, full attention (group 1), auxiliary. Pages-only keys an import's partial
    // page and state under slot keys, and a finished request's snapshot (H9) its partial page and state: no
    // blocks of a token chain, so no events, and the router's set is then a subset of the keys the pool
    // holds; without snapshots the other policies are compared whole.
    for policy in [Policy::Ordinary, Policy::PagesOnly, Policy::Reserved] {
        for snapshot_pages in [0, 512] {
            let mut params = geometry_params(policy, 96, 1, hybrid_groups());
            params.state_snapshot_pages = snapshot_pages;
            let whole = policy != Policy::PagesOnly && snapshot_pages == 0;
            let (n_stored, _) = follow(Engine::new(params).unwrap(), (3, 3), 1, whole);
            assert!(n_stored > 0, "{policy}: no block stored");
        }
    }
}

#[test]
fn events_are_off_by_default_and_enabled_only_on_a_new_engine() {
    let mut engine = Engine::new(params(Policy::Reserved, 64)).unwrap();
    engine
        .submit(spec(1, tokens(1, 0, 0, 4 * TPP), 2, engine.now()))
        .unwrap();
    let _steps = engine.run_until_idle(10_000).expect("run");
    assert!(!engine.cached_block_hashes().is_empty());
    assert!(engine.take_kv_events().is_empty(), "off by default");
    let refused = engine.enable_kv_events(16).unwrap_err();
    assert!(
        matches!(
            refused,
            Error::InvalidParam {
                name: "kv_events",
                ..
            }
        ),
        "{refused}"
    );
}

#[test]
fn a_full_log_drops_its_oldest_events_and_counts_them() {
    let mut engine = Engine::new(params(Policy::Reserved, 256)).unwrap();
    engine.enable_kv_events(2).unwrap();
    // Three requests with unrelated prompts: three chains, three events, the first dropped.
    for id in 1..=3u64 {
        let prompt = tokens(id, 0, 0, 4 * TPP);
        engine.submit(spec(id, prompt, 2, engine.now())).unwrap();
        let _steps = engine.run_until_idle(10_000).expect("run");
    }
    let events = engine.take_kv_events();
    assert_eq!(events.len(), 2);
    assert_eq!(engine.kv_events_dropped(), 1);
}
