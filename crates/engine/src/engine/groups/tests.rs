//! The coordinator and the managers against the geometry's page arithmetic, and their combined answers.

use kv_pool::{BlockKey, CacheGroup, Geometry, GroupKind, PagePool};

use super::managers::manager;
use super::{GroupCoordinator, RestoreBoundary};
use crate::error::Error;

const KINDS: [GroupKind; 6] = [
    GroupKind::Full,
    GroupKind::SlidingWindow {
        window_tokens: 7,
        retained_tail_tokens: 3,
    },
    GroupKind::SlidingWindow {
        window_tokens: 16,
        retained_tail_tokens: 0,
    },
    GroupKind::ChunkedLocal { chunk_tokens: 12 },
    GroupKind::Recurrent,
    GroupKind::Auxiliary { pages: 2 },
];

fn geometry(kinds: &[GroupKind]) -> Geometry {
    let groups = kinds
        .iter()
        .map(|&kind| CacheGroup {
            kind,
            bytes_per_page: 64,
        })
        .collect();
    Geometry::new(groups, 4, 1, 256).unwrap()
}

#[test]
fn every_manager_keeps_the_live_tokens_the_geometry_says() {
    let geometry = geometry(&KINDS);
    for (idx, group) in geometry.groups().iter().enumerate() {
        let manager = manager(idx as u32, group.kind);
        for n_tokens in 0..100 {
            assert_eq!(
                manager.live_tokens(n_tokens),
                geometry.live_tokens(idx, n_tokens),
                "{} at {n_tokens}",
                group.kind
            );
        }
    }
}

#[test]
fn checkpoint_slots_count_the_pages_the_geometry_says() {
    let geometry = geometry(&KINDS);
    let groups = GroupCoordinator::new(&geometry).unwrap();
    for n_tokens in 1..100 {
        let slots = groups.slots(n_tokens, geometry.block_tokens());
        assert_eq!(
            slots.len() as u32,
            geometry.checkpoint_pages(n_tokens),
            "at {n_tokens}"
        );
        // Payload order: the block table, the windows, the fixed pages.
        let order: Vec<u32> = slots.iter().map(|(slot, _)| slot.group).collect();
        assert!(order.is_sorted(), "{order:?}");
        let block_tokens = geometry.block_tokens();
        for (idx, group) in geometry.groups().iter().enumerate() {
            let ours: Vec<_> = slots
                .iter()
                .filter(|(slot, _)| slot.group == idx as u32)
                .map(|(slot, block)| (slot.key_idx, *block))
                .collect();
            let live = geometry.live_tokens(idx, n_tokens);
            let first = if live.is_empty() {
                n_tokens.div_ceil(block_tokens)
            } else {
                live.start / block_tokens
            };
            let expected: Vec<_> = match group.kind {
                // Full blocks keyed, a partial last one not.
                GroupKind::Full => (0..n_tokens.div_ceil(block_tokens))
                    .map(|block| {
                        (
                            (block < n_tokens / block_tokens).then_some(block),
                            Some(block),
                        )
                    })
                    .collect(),
                GroupKind::Recurrent => vec![(None, None)],
                GroupKind::Auxiliary { pages } => vec![(None, None); pages as usize],
                _ => (first..n_tokens.div_ceil(block_tokens))
                    .map(|block| (None, Some(block)))
                    .collect(),
            };
            assert_eq!(ours, expected, "{} at {n_tokens}", group.kind);
        }
    }
}

#[test]
fn a_geometry_without_one_full_group_is_refused_naming_why() {
    for kinds in [
        &[GroupKind::Recurrent][..],
        &[GroupKind::Full, GroupKind::Recurrent, GroupKind::Full][..],
    ] {
        let error = GroupCoordinator::new(&geometry(kinds)).unwrap_err();
        let Error::UnsupportedGeometry { reason } = error else {
            panic!("{error:?}");
        };
        assert!(reason.contains("full-attention group"), "{reason}");
    }
    let error = GroupCoordinator::new(&geometry(&[GroupKind::Full, GroupKind::Full])).unwrap_err();
    assert!(format!("{error}").contains("cache group 1"), "{error}");
}

#[test]
fn restores_are_exact_once_any_group_is_beyond_full_attention() {
    let full = GroupCoordinator::new(&geometry(&[GroupKind::Full])).unwrap();
    assert_eq!(full.restore_boundary(), RestoreBoundary::Block);
    // Block boundaries: whole blocks of all but the last token, or all of a block-aligned prompt with
    // saved logits.
    assert_eq!(full.restorable_tokens(10, false, 4), 8);
    assert_eq!(full.restorable_tokens(8, false, 4), 4);
    assert_eq!(full.restorable_tokens(8, true, 4), 8);
    assert_eq!(full.restorable_tokens(10, true, 4), 8);
    for kind in &KINDS[1..] {
        let hybrid = GroupCoordinator::new(&geometry(&[GroupKind::Full, *kind])).unwrap();
        assert_eq!(hybrid.restore_boundary(), RestoreBoundary::Exact, "{kind}");
        assert_eq!(hybrid.restorable_tokens(10, false, 4), 9);
        assert_eq!(hybrid.restorable_tokens(10, true, 4), 10);
        assert_eq!(
            hybrid.carries_draft_state(),
            matches!(kind, GroupKind::Auxiliary { .. })
        );
    }
}

#[test]
fn a_local_hit_is_the_shortest_any_group_serves() {
    let mut pool = PagePool::new(8).unwrap();
    let tokens: Vec<u32> = (0..16).collect();
    let keys = BlockKey::chain_all(&tokens, 4, b"tenant");
    let pages = pool.allocate(3).unwrap();
    for (&page, &key) in pages.iter().zip(&keys) {
        assert_eq!(pool.cache_block(page, key), Ok(true));
    }
    let full = GroupCoordinator::new(&geometry(&[GroupKind::Full])).unwrap();
    assert_eq!(full.local_hit(&pool, &keys), pages);
    assert_eq!(full.local_hit(&pool, &keys[..2]), pages[..2]);
    // No window or state is cached (H2): a hybrid geometry has no local hit.
    for kind in &KINDS[1..] {
        let hybrid = GroupCoordinator::new(&geometry(&[GroupKind::Full, *kind])).unwrap();
        assert!(hybrid.local_hit(&pool, &keys).is_empty(), "{kind}");
    }
}
