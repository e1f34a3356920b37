//! The catalog's block-prefix index against a reference that scans every stored checkpoint, through puts
//! (supersedes, evictions), removals and lookups, with chained keys and with arbitrary ones.
#![allow(clippy::disallowed_methods, reason = "tests read PROPTEST_CASES")]

use std::sync::Arc;

use kv_pool::BlockKey;
use proptest::prelude::*;

use super::Catalog;
use crate::checkpoint::{CheckpointId, CheckpointKind, CheckpointMeta, PageSlot, PrefixQuery};
use kv_pool::GroupKind;

use crate::layout::LayoutDescriptor;

const TOKENS_PER_PAGE: u32 = 4;
const BYTES_PER_PAGE: u64 = 8;

/// A key of the small alphabet the tests draw from: repeated and shared keys are common.
fn key(symbol: u32) -> BlockKey {
    let mut bytes = [0u8; 32];
    for word in bytes.chunks_exact_mut(4) {
        word.copy_from_slice(&symbol.to_le_bytes());
    }
    BlockKey(bytes)
}

/// A checkpoint of `keys` (whole blocks, plus a partial tail when `tail`): group 0 full attention, and with
/// `window_pages` a sliding-window group 1 (two blocks of window) holding the blocks the mask names.
fn meta(
    id: u8,
    generation: u64,
    keys: &[u32],
    window_pages: Option<u16>,
    tail: bool,
) -> CheckpointMeta {
    let mut groups = vec![GroupKind::Full];
    let mut pages: Vec<PageSlot> = (0..keys.len() as u32)
        .map(|block| PageSlot {
            group: 0,
            key_idx: Some(block),
        })
        .collect();
    if let Some(mask) = window_pages {
        groups.push(GroupKind::SlidingWindow {
            window_tokens: 2 * TOKENS_PER_PAGE,
            retained_tail_tokens: 0,
        });
        pages.extend(
            (0..keys.len() as u32)
                .filter(|block| mask & (1 << (block % 16)) != 0)
                .map(|block| PageSlot {
                    group: 1,
                    key_idx: Some(block),
                }),
        );
    }
    let tail_tokens = if tail { vec![7] } else { Vec::new() };
    if tail {
        pages.push(PageSlot {
            group: 0,
            key_idx: None,
        });
    }
    CheckpointMeta {
        id: CheckpointId::new(format!("c{id}")).unwrap(),
        generation,
        kind: CheckpointKind::Prompt,
        n_tokens: keys.len() * TOKENS_PER_PAGE as usize + tail_tokens.len(),
        draft_prefix_len: 0,
        block_keys: keys.iter().map(|&symbol| key(symbol)).collect(),
        tail_tokens,
        layout: LayoutDescriptor {
            groups,
            bytes_per_page: BYTES_PER_PAGE,
            tokens_per_page: TOKENS_PER_PAGE,
            n_ranks: 1,
        },
        pages,
    }
}

/// What `find_longest_prefix` answers, by a scan: the longest run `n` of leading blocks some stored
/// checkpoint shares with the query and restores on its own, from the newest such checkpoint.
fn scan(stored: &[Arc<CheckpointMeta>], query: &PrefixQuery<'_>) -> Option<(CheckpointId, u32)> {
    let longest = stored.iter().map(|meta| meta.common_blocks(query)).max()?;
    (1..=longest).rev().find_map(|n_blocks| {
        stored
            .iter()
            .rev()
            .find(|meta| {
                meta.common_blocks(query) >= n_blocks && meta.restores_block_prefix(n_blocks)
            })
            .map(|meta| (meta.id.clone(), n_blocks as u32))
    })
}

fn query_of(keys: &[u32]) -> (Vec<BlockKey>, Vec<u32>) {
    let block_keys = keys.iter().map(|&symbol| key(symbol)).collect();
    (block_keys, vec![0; keys.len() * TOKENS_PER_PAGE as usize])
}

fn found(catalog: &mut Catalog, keys: &[u32]) -> Option<(String, u32)> {
    let (block_keys, tokens) = query_of(keys);
    let query = PrefixQuery {
        block_keys: &block_keys,
        tokens: &tokens,
    };
    catalog
        .find_longest_prefix(&query)
        .map(|(meta, n_blocks)| (meta.id.as_str().to_string(), n_blocks))
}

fn put(catalog: &mut Catalog, meta: CheckpointMeta) {
    let n_bytes = meta.payload_bytes();
    let _outcome = catalog.plan_put(&meta, n_bytes).unwrap();
    catalog.insert(Arc::new(meta), n_bytes);
    catalog.check_invariants();
}

#[test]
fn trie_splits_where_chains_part_and_merges_when_a_branch_goes() {
    let mut catalog = Catalog::new(1 << 20);
    put(&mut catalog, meta(0, 1, &[1, 2, 3, 4], None, false));
    put(&mut catalog, meta(1, 1, &[1, 2, 5], None, false));
    assert_eq!(found(&mut catalog, &[1, 2, 3, 9]), Some(("c0".into(), 3)));
    assert_eq!(found(&mut catalog, &[1, 2, 5, 6]), Some(("c1".into(), 3)));
    // The shared run [1, 2]: the newest holder.
    assert_eq!(found(&mut catalog, &[1, 2, 9]), Some(("c1".into(), 2)));
    // A chain ending inside a run, then one ending where another does.
    put(&mut catalog, meta(2, 1, &[1], None, true));
    put(&mut catalog, meta(3, 1, &[1, 2, 5], None, false));
    assert_eq!(found(&mut catalog, &[1, 2, 5]), Some(("c3".into(), 3)));
    assert_eq!(found(&mut catalog, &[1, 8]), Some(("c3".into(), 1)));
    for id in [3u8, 1, 2] {
        catalog.remove(&CheckpointId::new(format!("c{id}")).unwrap());
        catalog.check_invariants();
    }
    assert_eq!(found(&mut catalog, &[1, 2, 5]), Some(("c0".into(), 2)));
    assert_eq!(found(&mut catalog, &[2]), None);
    // A chain without a full block is no holder.
    put(&mut catalog, meta(4, 1, &[], None, true));
    assert_eq!(found(&mut catalog, &[1]), Some(("c0".into(), 1)));
    catalog.remove(&CheckpointId::new("c0").unwrap());
    catalog.check_invariants();
    assert_eq!(found(&mut catalog, &[1]), None);
}

#[test]
fn a_holder_whose_window_pages_are_missing_gives_way_to_an_older_one() {
    let mut catalog = Catalog::new(1 << 20);
    put(&mut catalog, meta(0, 1, &[1, 2, 3, 4], Some(0xffff), false));
    // Newer, but without the window pages of blocks 1 and 2: it cannot restore 3 blocks.
    put(&mut catalog, meta(1, 1, &[1, 2, 3, 5], Some(0b1001), false));
    assert_eq!(found(&mut catalog, &[1, 2, 3, 9]), Some(("c0".into(), 3)));
    catalog.remove(&CheckpointId::new("c0").unwrap());
    // Only c1 now: 2 blocks need blocks 0 and 1 of the window, 1 block block 0.
    assert_eq!(found(&mut catalog, &[1, 2, 3, 9]), Some(("c1".into(), 1)));
    catalog.check_invariants();
}

#[derive(Clone, Debug)]
enum Op {
    Put {
        id: u8,
        keys: Vec<u32>,
        window_pages: Option<u16>,
        tail: bool,
    },
    Remove {
        id: u8,
    },
    Find {
        keys: Vec<u32>,
    },
}

/// Keys from an alphabet of `symbols`; chained keys (a key names its whole prefix) are keys of a prefix tree,
/// drawn as a walk down a tree of fan-out `symbols`.
fn keys(symbols: u32, chained: bool) -> impl Strategy<Value = Vec<u32>> {
    proptest::collection::vec(0..symbols, 0..10).prop_map(move |walk| {
        if !chained {
            return walk;
        }
        // Node ids of a complete tree: the child `s` of node `n` is `n * symbols + s + 1`.
        let mut node = 0u32;
        walk.iter()
            .map(|&step| {
                node = node * symbols + step + 1;
                node
            })
            .collect()
    })
}

fn op(chained: bool) -> impl Strategy<Value = Op> {
    let symbols = if chained { 2 } else { 3 };
    prop_oneof![
        4 => (0..8u8, keys(symbols, chained), proptest::option::weighted(0.3, any::<u16>()), any::<bool>())
            .prop_map(|(id, keys, window_pages, tail)| Op::Put { id, keys, window_pages, tail }),
        1 => (0..8u8).prop_map(|id| Op::Remove { id }),
        3 => keys(symbols, chained).prop_map(|keys| Op::Find { keys }),
    ]
}

fn run_ops(ops: Vec<Op>) -> Result<(), TestCaseError> {
    // Room for about five checkpoints of 10 pages: puts evict.
    let mut catalog = Catalog::new(5 * 11 * BYTES_PER_PAGE);
    let mut stored: Vec<Arc<CheckpointMeta>> = Vec::new();
    let mut generation = 0;
    for op in ops {
        match op {
            Op::Put {
                id,
                keys,
                window_pages,
                tail,
            } => {
                generation += 1;
                let meta = meta(id, generation, &keys, window_pages, tail);
                let n_bytes = meta.payload_bytes();
                let outcome = catalog.plan_put(&meta, n_bytes).unwrap();
                stored.retain(|other| other.id != meta.id && !outcome.evicted.contains(&other.id));
                let meta = Arc::new(meta);
                catalog.insert(Arc::clone(&meta), n_bytes);
                stored.push(meta);
            }
            Op::Remove { id } => {
                let id = CheckpointId::new(format!("c{id}")).unwrap();
                let removed = catalog.remove(&id);
                prop_assert_eq!(removed.is_some(), stored.iter().any(|meta| meta.id == id));
                stored.retain(|meta| meta.id != id);
            }
            Op::Find { keys } => {
                let (block_keys, tokens) = query_of(&keys);
                let query = PrefixQuery {
                    block_keys: &block_keys,
                    tokens: &tokens,
                };
                let expected = scan(&stored, &query);
                let answer = catalog
                    .find_longest_prefix(&query)
                    .map(|(meta, n_blocks)| (meta.id.clone(), n_blocks));
                prop_assert_eq!(answer, expected);
            }
        }
        catalog.check_invariants();
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        // PROPTEST_CASES overrides the count (e.g. 10x before a release).
        std::env::var("PROPTEST_CASES").ok().and_then(|cases| cases.parse().ok()).unwrap_or(256)
    ))]

    /// With chained block keys (each key names its whole prefix, as `BlockKey::chain` makes them), through any
    /// sequence of puts (supersedes, evictions), removals and lookups, the block trie holds exactly the stored
    /// checkpoints' chains in its canonical shape, and the block-prefix lookup answers what a scan of every
    /// stored checkpoint answers: the longest run of leading blocks a checkpoint shares and restores on its
    /// own, from the newest such checkpoint (sliding-window checkpoints missing window pages included).
    #[test]
    fn prop_block_trie_matches_a_scan_with_chained_keys(ops in proptest::collection::vec(op(true), 1..60)) {
        run_ops(ops)?;
    }

    /// The same with arbitrary keys (repeated within a chain, shared at different positions, as a hostile
    /// manifest could carry): nothing panics, the trie keeps its shape, and lookups match the scan.
    #[test]
    fn prop_block_trie_matches_a_scan_with_arbitrary_keys(ops in proptest::collection::vec(op(false), 1..60)) {
        run_ops(ops)?;
    }
}
