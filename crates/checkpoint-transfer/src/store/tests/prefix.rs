//! Block-prefix lookup (`CheckpointStore::find_longest_prefix`): the first blocks of a longer checkpoint for
//! attention-only layouts, whole checkpoints only for layouts with a recurrent or auxiliary group, recency,
//! both tiers (the disk store after reopen), and the block-key index staying in step with the stored
//! checkpoints through supersede, eviction and removal (a proptest against a scan).
#![allow(clippy::disallowed_methods, reason = "tests read PROPTEST_CASES")]

use kv_pool::BlockKey;
use proptest::prelude::*;

use super::{BYTES_PER_PAGE, TOKENS_PER_PAGE, checkpoint, find, layout, tokens};
use crate::checkpoint::{
    Checkpoint, CheckpointId, CheckpointKind, CheckpointMeta, CheckpointPayload, PageSlot,
    PrefixQuery,
};
use crate::error::Mismatch;
use kv_pool::GroupKind;

use crate::layout::LayoutDescriptor;
use crate::page_buf::RankPages;
use crate::store::{CheckpointStore, DiskStore, HostStore};

/// `(id, matching blocks)` of the block-prefix lookup for `request`.
fn find_prefix(store: &mut dyn CheckpointStore, request: &[u32]) -> Option<(String, u32)> {
    let keys = BlockKey::chain_all(request, TOKENS_PER_PAGE as usize, b"salt");
    let query = PrefixQuery {
        block_keys: &keys,
        tokens: request,
    };
    store
        .find_longest_prefix(&query)
        .map(|(meta, n_blocks)| (meta.id.as_str().to_string(), n_blocks))
}

/// `tokens(n)` with position `at` changed: requests that share exactly the blocks before `at`.
fn diverging(n: u32, at: usize) -> Vec<u32> {
    let mut request = tokens(n);
    request[at] = 0;
    request
}

/// A checkpoint of `tokens` for `groups`: group 0 is full attention (one keyed page per full block, an
/// unkeyed partial tail page); every other group gets the pages `extra` lists (`(group, key_idx)`).
fn checkpoint_for_groups(
    id: &str,
    tokens: &[u32],
    groups: Vec<GroupKind>,
    extra: &[(u32, Option<u32>)],
) -> Checkpoint {
    let layout = LayoutDescriptor { groups, ..layout() };
    let mut meta = CheckpointMeta::full_attention(
        CheckpointId::new(id).unwrap(),
        1,
        CheckpointKind::Response,
        tokens,
        b"salt",
        layout,
    );
    meta.pages.extend(
        extra
            .iter()
            .map(|&(group, key_idx)| PageSlot { group, key_idx }),
    );
    let page = vec![7u8; BYTES_PER_PAGE as usize];
    let ranks = (0..meta.layout.n_ranks)
        .map(|_| RankPages::from_pages(vec![&page[..]; meta.pages.len()], page.len()))
        .collect();
    Checkpoint {
        meta,
        payload: CheckpointPayload { ranks },
    }
}

#[test]
fn host_store_finds_the_matching_blocks_of_a_longer_checkpoint() {
    let mut store = HostStore::new(1 << 20);
    store.put(checkpoint("long", 1, &tokens(40))).unwrap();
    // The next turn shares the first 6 blocks, then its tokens differ: no whole checkpoint is a prefix.
    let next_turn = diverging(48, 25);
    assert_eq!(find(&mut store, &next_turn), None);
    assert_eq!(
        find_prefix(&mut store, &next_turn),
        Some(("long".to_string(), 6))
    );
    // A shorter request: only its full blocks count, never a partial tail.
    assert_eq!(
        find_prefix(&mut store, &tokens(10)),
        Some(("long".to_string(), 2))
    );
    // A longer one that extends it: the whole checkpoint.
    assert_eq!(
        find_prefix(&mut store, &tokens(60)),
        Some(("long".to_string(), 10))
    );
    assert_eq!(find_prefix(&mut store, &diverging(40, 0)), None);
    assert_eq!(find_prefix(&mut store, &tokens(3)), None, "no full block");
    // A checkpoint sharing more blocks wins; among equal runs the newest stored.
    store
        .put(checkpoint("branch", 1, &diverging(40, 30)))
        .unwrap();
    assert_eq!(
        find_prefix(&mut store, &diverging(48, 30)),
        Some(("branch".to_string(), 10))
    );
    assert_eq!(
        find_prefix(&mut store, &diverging(48, 33)),
        Some(("long".to_string(), 8))
    );
    assert_eq!(
        find_prefix(&mut store, &tokens(20)),
        Some(("branch".to_string(), 5))
    );
    store.check_invariants();
}

#[test]
fn block_prefix_lookup_refreshes_recency() {
    let mut store = HostStore::new(2 * 10 * 2 * BYTES_PER_PAGE);
    store.put(checkpoint("a", 1, &tokens(40))).unwrap();
    store.put(checkpoint("b", 1, &[9; 40])).unwrap();
    assert_eq!(
        find_prefix(&mut store, &diverging(40, 12)),
        Some(("a".to_string(), 3))
    );
    let outcome = store.put(checkpoint("c", 1, &[8; 40])).unwrap();
    assert_eq!(outcome.evicted, vec![CheckpointId::new("b").unwrap()]);
    store.check_invariants();
}

#[test]
fn g6_a_layout_with_a_recurrent_or_auxiliary_group_never_restores_a_strict_prefix() {
    for groups in [
        vec![GroupKind::Full, GroupKind::Recurrent],
        vec![GroupKind::Full, GroupKind::Auxiliary { pages: 1 }],
    ] {
        let mut store = HostStore::new(1 << 20);
        // The boundary state (recurrent or auxiliary page) is valid only at exactly 40 tokens.
        let stored = checkpoint_for_groups("hybrid", &tokens(40), groups.clone(), &[(1, None)]);
        assert!(!stored.meta.layout.is_attention_only());
        assert!(!stored.meta.restores_block_prefix(6));
        assert!(
            stored.meta.restores_block_prefix(10),
            "the whole checkpoint"
        );
        store.put(stored.clone()).unwrap();
        assert_eq!(find_prefix(&mut store, &diverging(48, 25)), None);
        assert_eq!(
            find_prefix(&mut store, &tokens(60)),
            Some(("hybrid".to_string(), 10)),
            "a whole checkpoint ending on a block boundary"
        );
        // Whole-checkpoint semantics stay available.
        assert_eq!(find(&mut store, &tokens(60)).as_deref(), Some("hybrid"));
        let keys = BlockKey::chain_all(&tokens(48), TOKENS_PER_PAGE as usize, b"salt");
        let query = PrefixQuery {
            block_keys: &keys,
            tokens: &tokens(48),
        };
        assert!(matches!(
            stored
                .meta
                .check_block_prefix_restorable(&stored.meta.layout, &query, 6),
            Err(Mismatch::BlockPrefix { n_blocks: 6, .. })
        ));
        assert_eq!(
            stored
                .meta
                .check_block_prefix_restorable(&stored.meta.layout, &query, 10),
            Ok(())
        );
    }
    assert!(layout().is_attention_only());
}

#[test]
fn sliding_window_prefix_needs_the_window_pages_at_its_boundary() {
    let window = GroupKind::SlidingWindow {
        window_tokens: 8,
        retained_tail_tokens: 0,
    };
    // At 40 tokens the window group holds blocks 8 and 9 only: a prefix at 9 blocks needs blocks 7 and 8.
    let late = checkpoint_for_groups(
        "late",
        &tokens(40),
        vec![GroupKind::Full, window],
        &[(1, Some(8)), (1, Some(9))],
    );
    assert!(late.meta.layout.is_attention_only());
    assert!(!late.meta.restores_block_prefix(9));
    assert!(late.meta.restores_block_prefix(10));
    // One that kept every window page (and a chunked-local group) restores any prefix.
    let kept: Vec<(u32, Option<u32>)> = (0..10).map(|block| (1, Some(block))).collect();
    let all = checkpoint_for_groups("all", &tokens(40), vec![GroupKind::Full, window], &kept);
    assert!((1..=10).all(|n_blocks| all.meta.restores_block_prefix(n_blocks)));
    let chunked = checkpoint_for_groups(
        "chunked",
        &tokens(40),
        vec![
            GroupKind::Full,
            GroupKind::ChunkedLocal { chunk_tokens: 16 },
        ],
        &[(1, Some(8)), (1, Some(9))],
    );
    assert!(chunked.meta.restores_block_prefix(9), "chunk [32, 36)");
    assert!(!chunked.meta.restores_block_prefix(7), "chunk [16, 28)");
    let mut store = HostStore::new(1 << 20);
    store.put(late).unwrap();
    assert_eq!(find_prefix(&mut store, &diverging(48, 37)), None);
    store.put(all).unwrap();
    assert_eq!(
        find_prefix(&mut store, &diverging(48, 37)),
        Some(("all".to_string(), 9))
    );
    store.check_invariants();
}

#[test]
fn disk_store_finds_block_prefixes_after_reopen_and_keeps_its_index_through_supersede_and_eviction()
{
    let dir = tempfile::tempdir().unwrap();
    // Room for two 10-block checkpoints.
    let capacity = 2 * 10 * 2 * BYTES_PER_PAGE;
    {
        let mut store = DiskStore::open(dir.path(), capacity).unwrap();
        store.put(checkpoint("a", 1, &tokens(40))).unwrap();
        store.put(checkpoint("b", 1, &[5; 40])).unwrap();
        // Supersede "a" with a checkpoint of other tokens: its old blocks leave the index.
        store.put(checkpoint("a", 2, &diverging(40, 20))).unwrap();
        store.check_invariants();
        assert_eq!(
            find_prefix(&mut store, &diverging(48, 30)),
            Some(("a".to_string(), 5))
        );
    }
    let mut store = DiskStore::open(dir.path(), capacity).unwrap();
    store.check_invariants();
    assert_eq!(
        find_prefix(&mut store, &diverging(48, 30)),
        Some(("a".to_string(), 5))
    );
    assert_eq!(
        find_prefix(&mut store, &[5; 44]),
        Some(("b".to_string(), 10))
    );
    // "a" was just used: "b" is evicted, and its blocks leave the index.
    assert_eq!(
        find_prefix(&mut store, &tokens(12)),
        Some(("a".to_string(), 3))
    );
    let outcome = store.put(checkpoint("c", 1, &[6; 40])).unwrap();
    assert_eq!(outcome.evicted, vec![CheckpointId::new("b").unwrap()]);
    store.check_invariants();
    assert_eq!(find_prefix(&mut store, &[5; 44]), None);
    assert!(store.remove(&CheckpointId::new("a").unwrap()).unwrap());
    store.check_invariants();
    assert_eq!(find_prefix(&mut store, &tokens(12)), None);
}

#[derive(Clone, Debug)]
enum Op {
    /// Put checkpoint `id` (new generation) of `blocks` blocks of branch `branch` (branches share a stem).
    Put {
        id: u8,
        branch: u8,
        blocks: u8,
    },
    Remove {
        id: u8,
    },
    Find {
        branch: u8,
        blocks: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..6u8, 0..4u8, 1..12u8).prop_map(|(id, branch, blocks)| Op::Put { id, branch, blocks }),
        1 => (0..6u8).prop_map(|id| Op::Remove { id }),
        3 => (0..4u8, 1..14u8).prop_map(|(branch, blocks)| Op::Find { branch, blocks }),
    ]
}

/// Tokens of `blocks` blocks of `branch`: branches share their first `branch + 1` blocks.
fn branch_tokens(branch: u8, blocks: u8) -> Vec<u32> {
    (0..u32::from(blocks) * TOKENS_PER_PAGE)
        .map(|pos| {
            if pos / TOKENS_PER_PAGE <= u32::from(branch) {
                pos
            } else {
                1000 * (u32::from(branch) + 1) + pos
            }
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        // PROPTEST_CASES overrides the count (e.g. 10x before a release).
        std::env::var("PROPTEST_CASES").ok().and_then(|cases| cases.parse().ok()).unwrap_or(128)
    ))]

    /// Through any sequence of puts (supersedes, evictions of a small store), removals and lookups, the
    /// block-key index holds exactly the stored checkpoints' keys, and the block-prefix lookup answers the
    /// longest run of leading blocks a scan of every stored checkpoint finds, naming a stored checkpoint
    /// that shares that run.
    #[test]
    fn prop_block_index_stays_in_step_and_lookups_match_a_scan(ops in proptest::collection::vec(op(), 1..60)) {
        // Room for about three checkpoints of 11 blocks: puts evict.
        let mut store = HostStore::new(3 * 11 * 2 * BYTES_PER_PAGE);
        let mut generation = 0;
        for op in ops {
            match op {
                Op::Put { id, branch, blocks } => {
                    generation += 1;
                    let _outcome = store
                        .put(checkpoint(&format!("c{id}"), generation, &branch_tokens(branch, blocks)))
                        .unwrap();
                }
                Op::Remove { id } => {
                    let _was_stored = store.remove(&CheckpointId::new(format!("c{id}")).unwrap()).unwrap();
                }
                Op::Find { branch, blocks } => {
                    let request = branch_tokens(branch, blocks);
                    let keys = BlockKey::chain_all(&request, TOKENS_PER_PAGE as usize, b"salt");
                    let query = PrefixQuery { block_keys: &keys, tokens: &request };
                    let scan = (0..6u8)
                        .filter_map(|id| store.meta(&CheckpointId::new(format!("c{id}")).unwrap()))
                        .map(|meta| meta.common_blocks(&query))
                        .max()
                        .unwrap_or(0);
                    match store.find_longest_prefix(&query) {
                        None => prop_assert_eq!(scan, 0),
                        Some((meta, n_blocks)) => {
                            prop_assert_eq!(n_blocks as usize, scan);
                            prop_assert!(meta.common_blocks(&query) >= scan);
                            prop_assert_eq!(store.meta(&meta.id), Some(meta));
                        }
                    }
                }
            }
            store.check_invariants();
        }
    }
}
