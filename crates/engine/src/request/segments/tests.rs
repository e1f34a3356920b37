//! Keys by segment against the token chain: the same prefixes shared, the same count, no key shared across
//! salts, and the chain where segments are not whole blocks.

use kv_pool::BlockKey;
use proptest::prelude::*;

use super::{Segments, extend_keys};

/// Token `offset` of the segment named `id`: a function of the two alone, as `Segments` requires.
fn token(id: u64, offset: usize) -> u32 {
    (id.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as u32
        ^ (offset as u32).wrapping_mul(2_654_435_761)
}

/// The prompt of at most `len` tokens made of the segments `ids`, `segment` tokens each.
fn prompt(ids: &[u64], segment: usize, len: usize) -> Vec<u32> {
    let mut tokens = Vec::new();
    for &id in ids {
        let n = len.saturating_sub(tokens.len()).min(segment);
        tokens.extend((0..n).map(|offset| token(id, offset)));
    }
    tokens
}

fn keys(
    ids: &[u64],
    segment: u32,
    tokens: &[u32],
    block_tokens: u32,
    salt: &[u8],
) -> Vec<BlockKey> {
    let mut keys = Vec::new();
    extend_keys(
        &mut keys,
        tokens,
        Some(Segments {
            ids,
            tokens: segment,
        }),
        block_tokens,
        salt,
    );
    keys
}

fn common(a: &[BlockKey], b: &[BlockKey]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[test]
fn a_segment_cut_short_keeps_its_first_keys_and_a_longer_one_reads_on() {
    let full = prompt(&[7, 8], 64, 128);
    let cut = prompt(&[7, 8], 64, 64 + 40);
    let (full_keys, cut_keys) = (
        keys(&[7, 8], 64, &full, 16, b""),
        keys(&[7, 8], 64, &cut, 16, b""),
    );
    assert_eq!((full_keys.len(), cut_keys.len()), (8, 6));
    assert_eq!(full_keys[..6], cut_keys[..]);
    // 40 blocks of one token: more than one read of BLAKE3's output.
    let one = prompt(&[7], 64, 64);
    let many = keys(&[7], 64, &one, 1, b"");
    assert_eq!(many.len(), 64);
    assert_eq!(many[..16], keys(&[7], 64, &one[..16], 1, b"")[..]);
    let distinct: std::collections::HashSet<_> = many.iter().collect();
    assert_eq!(distinct.len(), 64);
}

#[test]
fn segments_that_are_not_whole_blocks_are_chained_over_the_tokens() {
    let tokens = prompt(&[1, 2, 3], 40, 120);
    assert_eq!(
        keys(&[1, 2, 3], 40, &tokens, 16, b""),
        BlockKey::chain_all(&tokens, 16, b"")
    );
    assert_eq!(
        keys(&[1, 2, 3], 0, &tokens, 16, b""),
        BlockKey::chain_all(&tokens, 16, b"")
    );
    let mut without = Vec::new();
    extend_keys(&mut without, &tokens, None, 16, b"");
    assert_eq!(without, BlockKey::chain_all(&tokens, 16, b""));
}

#[test]
fn a_prompt_longer_than_its_segments_chains_the_rest() {
    let mut tokens = prompt(&[4], 64, 64);
    tokens.extend([9; 40]);
    let keyed = keys(&[4], 64, &tokens, 16, b"");
    assert_eq!(keyed.len(), 6);
    let mut chained = keyed[..4].to_vec();
    BlockKey::extend_chain(&mut chained, &tokens, 16, b"");
    assert_eq!(keyed, chained);
}

proptest! {
    /// Keys by segment share exactly the prefixes the token chain's share: for any two prompts drawn from few
    /// segment ids (shared prefixes, repeated ids, cut short anywhere) and any salts, as many leading keys
    /// agree one way as the other; a prompt has one key a full block, all distinct.
    #[test]
    fn prop_segment_keys_share_what_the_chain_shares(
        prompts in prop::collection::vec(
            (prop::collection::vec(0u64..4, 0..5), 0usize..6 * 64, any::<bool>()),
            2..10,
        ),
        block_tokens in prop::sample::select(vec![1u32, 16, 24, 32, 64]),
    ) {
        let segment = 64u32;
        let keyed: Vec<_> = prompts
            .iter()
            .map(|(ids, len, salted)| {
                let tokens = prompt(ids, segment as usize, *len);
                let salt: &[u8] = if *salted { b"tenant" } else { b"" };
                let by_segment = keys(ids, segment, &tokens, block_tokens, salt);
                let chained = BlockKey::chain_all(&tokens, block_tokens as usize, salt);
                (by_segment, chained)
            })
            .collect();
        for (by_segment, chained) in &keyed {
            prop_assert_eq!(by_segment.len(), chained.len());
            let distinct: std::collections::HashSet<_> = by_segment.iter().collect();
            prop_assert_eq!(distinct.len(), by_segment.len());
        }
        for (a, b) in keyed.iter().zip(keyed.iter().skip(1)) {
            prop_assert_eq!(common(&a.0, &b.0), common(&a.1, &b.1));
            let shared_anywhere = a.0.iter().filter(|key| b.0.contains(key)).count();
            prop_assert_eq!(shared_anywhere, common(&a.0, &b.0), "a key names one prefix");
        }
    }
}
