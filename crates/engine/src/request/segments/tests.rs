//! Keys by segment against the token chain: the same prefixes shared, the same count, no key shared across
//! salts; which segments key which blocks.

use kv_pool::BlockKey;
use proptest::prelude::*;

use super::Segments;

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

/// The keys of `tokens` (made of the segments `ids`, `segment` tokens each) by segment.
fn keys(
    ids: &[u64],
    segment: u32,
    tokens: &[u32],
    block_tokens: u32,
    salt: &[u8],
) -> Vec<BlockKey> {
    let segments = Segments {
        ids,
        tokens: segment,
        len: tokens.len(),
    };
    assert!(segments.key_blocks_of(block_tokens));
    let mut keys = Vec::new();
    segments.extend_keys(&mut keys, block_tokens, salt);
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
    // 64 blocks of one token: more than one read of BLAKE3's output.
    let one = prompt(&[7], 64, 64);
    let many = keys(&[7], 64, &one, 1, b"");
    assert_eq!(many.len(), 64);
    assert_eq!(many[..16], keys(&[7], 64, &one[..16], 1, b"")[..]);
    let distinct: std::collections::HashSet<_> = many.iter().collect();
    assert_eq!(distinct.len(), 64);
    assert!(
        BlockKey::chain_all(&full, 16, b"")
            .iter()
            .all(|key| !full_keys.contains(key)),
        "other keys than the chain's"
    );
}

#[test]
fn segments_key_whole_blocks_of_a_prompt_they_cover() {
    let segments = |ids: &'static [u64], tokens, len| Segments { ids, tokens, len };
    assert!(segments(&[1, 2], 64, 128).key_blocks_of(16));
    assert!(segments(&[1, 2], 64, 65).key_blocks_of(64));
    assert!(segments(&[], 64, 0).key_blocks_of(16));
    assert!(
        !segments(&[1, 2], 64, 129).key_blocks_of(16),
        "past the segments"
    );
    assert!(
        !segments(&[1, 2], 64, 128).key_blocks_of(24),
        "not whole blocks"
    );
    assert!(!segments(&[1, 2], 64, 128).key_blocks_of(0));
    assert!(!segments(&[1, 2], 0, 0).key_blocks_of(16));
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
        block_tokens in prop::sample::select(vec![1u32, 16, 32, 64]),
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
