//! The key memo against `BlockKey::chain_all`: shared segments, salts, block sizes that do not divide a segment,
//! and eviction.

use kv_pool::BlockKey;
use proptest::prelude::*;

use super::{KeyMemo, Segments};

/// Token `offset` of the segment named `id`: a function of the two alone, as `Segments` requires.
fn token(id: u64, offset: usize) -> u32 {
    (id.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as u32
        ^ (offset as u32).wrapping_mul(2_654_435_761)
}

/// The prompt of `len` tokens made of the segments `ids`, `segment` tokens each.
fn prompt(ids: &[u64], segment: usize, len: usize) -> Vec<u32> {
    let mut tokens = Vec::with_capacity(len);
    for &id in ids {
        let n = (len - tokens.len()).min(segment);
        tokens.extend((0..n).map(|offset| token(id, offset)));
    }
    tokens
}

fn memo_keys(
    memo: &mut KeyMemo,
    ids: &[u64],
    segment: u32,
    tokens: &[u32],
    block_tokens: u32,
    salt: &[u8],
) -> Vec<BlockKey> {
    let mut keys = Vec::new();
    let segments = Segments {
        ids,
        tokens: segment,
    };
    memo.extend(&mut keys, tokens, Some(segments), block_tokens, salt);
    keys
}

#[test]
fn a_shared_segment_is_remembered_and_gives_the_chained_keys() {
    let mut memo = KeyMemo::new();
    let first = prompt(&[7, 8, 9], 64, 3 * 64);
    let keys = memo_keys(&mut memo, &[7, 8, 9], 64, &first, 16, b"");
    assert_eq!(keys, BlockKey::chain_all(&first, 16, b""));
    assert_eq!(memo.len(), 3);
    // A later prompt sharing the first two segments, then another: one segment more remembered.
    let second = prompt(&[7, 8, 5], 64, 3 * 64 - 5);
    let keys = memo_keys(&mut memo, &[7, 8, 5], 64, &second, 16, b"");
    assert_eq!(keys, BlockKey::chain_all(&second, 16, b""));
    assert_eq!(memo.len(), 4);
    // The same segment id after another parent is another segment.
    let third = prompt(&[8, 7], 64, 2 * 64);
    let keys = memo_keys(&mut memo, &[8, 7], 64, &third, 16, b"");
    assert_eq!(keys, BlockKey::chain_all(&third, 16, b""));
    assert_eq!(memo.len(), 6);
}

#[test]
fn another_salt_or_block_size_starts_over() {
    let mut memo = KeyMemo::new();
    let tokens = prompt(&[1, 2], 64, 128);
    let _ = memo_keys(&mut memo, &[1, 2], 64, &tokens, 16, b"a");
    assert_eq!(
        memo_keys(&mut memo, &[1, 2], 64, &tokens, 16, b"b"),
        BlockKey::chain_all(&tokens, 16, b"b")
    );
    assert_eq!(
        memo_keys(&mut memo, &[1, 2], 64, &tokens, 32, b"b"),
        BlockKey::chain_all(&tokens, 32, b"b")
    );
    assert_eq!(memo.len(), 2, "only the last salt and size are remembered");
}

#[test]
fn segments_that_are_not_whole_blocks_are_hashed_block_by_block() {
    let mut memo = KeyMemo::new();
    let tokens = prompt(&[1, 2, 3], 40, 120);
    assert_eq!(
        memo_keys(&mut memo, &[1, 2, 3], 40, &tokens, 16, b""),
        BlockKey::chain_all(&tokens, 16, b"")
    );
    assert!(memo.is_empty());
    assert_eq!(
        memo_keys(&mut memo, &[1, 2, 3], 0, &tokens, 16, b""),
        BlockKey::chain_all(&tokens, 16, b"")
    );
    assert!(memo.is_empty());
}

proptest! {
    /// Whatever the memo holds (a tiny one evicts all the time), the keys are `chain_all`'s: prompts drawn from
    /// few segment ids (shared prefixes, repeated ids), any length (segments cut short, ids left over or too
    /// few), any block size dividing the segment or not.
    #[test]
    fn prop_memo_keys_are_the_chained_keys(
        prompts in prop::collection::vec(
            (prop::collection::vec(0u64..6, 0..6), 0usize..7 * 64, any::<bool>()),
            1..24,
        ),
        capacity in 2usize..12,
        block_tokens in prop::sample::select(vec![1u32, 8, 16, 24, 64]),
    ) {
        let segment = 64u32;
        let mut memo = KeyMemo::with_capacity(capacity);
        for (ids, len, salted) in prompts {
            let tokens = prompt(&ids, segment as usize, len);
            let salt: &[u8] = if salted { b"tenant" } else { b"" };
            let keys = memo_keys(&mut memo, &ids, segment, &tokens, block_tokens, salt);
            prop_assert_eq!(keys, BlockKey::chain_all(&tokens, block_tokens as usize, salt));
            prop_assert!(memo.len() <= capacity.max(2));
        }
    }
}
