//! Tests of page ids and block keys: the null page, and the BLAKE3 chain (deterministic, order-, parent-,
//! token- and salt-sensitive, unambiguous field boundaries).

use super::{BlockKey, PageId};

#[test]
fn null_page_is_page_zero() {
    assert!(PageId::NULL.is_null());
    assert_eq!(PageId::NULL, PageId(0));
    assert!(!PageId(1).is_null());
    assert_eq!(PageId(7).idx(), 7);
}

#[test]
fn chain_is_deterministic_and_depends_on_every_input() {
    let root = BlockKey::chain(None, &[1, 2, 3], b"salt");
    assert_eq!(root, BlockKey::chain(None, &[1, 2, 3], b"salt"));
    assert_ne!(root, BlockKey::chain(None, &[1, 2, 4], b"salt"));
    assert_ne!(root, BlockKey::chain(None, &[3, 2, 1], b"salt"));
    assert_ne!(root, BlockKey::chain(None, &[1, 2, 3], b"other"));
    assert_ne!(root, BlockKey::chain(None, &[1, 2, 3], b""));
    let child = BlockKey::chain(Some(&root), &[4], b"salt");
    assert_ne!(
        child,
        BlockKey::chain(None, &[4], b"salt"),
        "parent matters"
    );
    let other_root = BlockKey::chain(None, &[9], b"salt");
    assert_ne!(child, BlockKey::chain(Some(&other_root), &[4], b"salt"));
    // A later block's key commits to the salt through its parent's.
    let other_salt_root = BlockKey::chain(None, &[1, 2, 3], b"other");
    assert_ne!(
        child,
        BlockKey::chain(Some(&other_salt_root), &[4], b"other")
    );
}

#[test]
fn chain_fields_cannot_run_into_each_other() {
    // Salt bytes that look like a token must not collide with a shorter salt plus that token.
    let token_bytes = 5u32.to_le_bytes();
    let mut long_salt = b"s".to_vec();
    long_salt.extend_from_slice(&token_bytes);
    assert_ne!(
        BlockKey::chain(None, &[], &long_salt),
        BlockKey::chain(None, &[5], b"s")
    );
    // No parent is distinct from a parent of all zeros.
    let zero = BlockKey([0; 32]);
    assert_ne!(
        BlockKey::chain(None, &[1], b""),
        BlockKey::chain(Some(&zero), &[1], b"")
    );
}

/// Extending keys a few tokens at a time, in any split, gives `chain_all`'s keys; keys already there are not
/// hashed again (a wrong first key stays wrong).
#[test]
fn extend_chain_equals_chain_all_in_any_split() {
    let tokens: Vec<u32> = (0..37).collect();
    let all = BlockKey::chain_all(&tokens, 4, b"t");
    for step in [1, 3, 4, 5, 37] {
        let mut keys = Vec::new();
        let mut end = 0;
        while end < tokens.len() {
            end = (end + step).min(tokens.len());
            BlockKey::extend_chain(&mut keys, &tokens[..end], 4, b"t");
        }
        assert_eq!(keys, all, "steps of {step}");
    }
    let mut keys = vec![BlockKey([7; 32])];
    BlockKey::extend_chain(&mut keys, &tokens[..8], 4, b"t");
    assert_eq!(keys[0], BlockKey([7; 32]));
    assert_eq!(
        keys[1],
        BlockKey::chain(Some(&keys[0]), &tokens[4..8], b"t")
    );
    // More keys than full blocks: nothing to add, nothing panics.
    let mut keys = all.clone();
    BlockKey::extend_chain(&mut keys, &tokens[..4], 4, b"t");
    assert_eq!(keys, all);
}

/// Extending from a suffix of the tokens that starts at or before the unkeyed blocks gives the same keys;
/// one that starts past them changes nothing and says so. Worst values: a start past every token, a page
/// size of 0.
#[test]
fn extend_chain_from_a_suffix_equals_extend_chain_and_refuses_a_suffix_past_the_unkeyed_blocks() {
    let tokens: Vec<u32> = (0..37).collect();
    let all = BlockKey::chain_all(&tokens, 4, b"t");
    for (n_keyed, start) in [(0, 0), (2, 0), (2, 5), (2, 8), (9, 36)] {
        let mut keys = all[..n_keyed].to_vec();
        assert!(BlockKey::extend_chain_from(
            &mut keys,
            &tokens[start..],
            start,
            4,
            b"t"
        ));
        assert_eq!(keys, all, "{n_keyed} keys, tokens from {start}");
    }
    for start in [9, 37, usize::MAX] {
        let mut keys = all[..2].to_vec();
        let from = start.min(tokens.len());
        assert!(!BlockKey::extend_chain_from(
            &mut keys,
            &tokens[from..],
            start,
            4,
            b"t"
        ));
        assert_eq!(keys, all[..2], "tokens from {start}: nothing added");
    }
    let mut keys = Vec::new();
    assert!(BlockKey::extend_chain_from(
        &mut keys,
        &tokens[..3],
        0,
        0,
        b"t"
    ));
    assert_eq!(
        keys,
        BlockKey::chain_all(&tokens[..3], 1, b"t"),
        "a page size of 0 counts as 1"
    );
}

#[test]
fn chain_all_keys_full_blocks_only_and_chains_them() {
    let tokens: Vec<u32> = (0..10).collect();
    let keys = BlockKey::chain_all(&tokens, 4, b"t");
    assert_eq!(keys.len(), 2, "the partial block of 2 tokens has no key");
    assert_eq!(keys[0], BlockKey::chain(None, &tokens[0..4], b"t"));
    assert_eq!(
        keys[1],
        BlockKey::chain(Some(&keys[0]), &tokens[4..8], b"t")
    );
    assert!(BlockKey::chain_all(&tokens[..3], 4, b"t").is_empty());
    // A shared prefix shares keys; a different salt shares none.
    let longer: Vec<u32> = (0..16).collect();
    assert_eq!(BlockKey::chain_all(&longer, 4, b"t")[..2], keys[..]);
    let salted = BlockKey::chain_all(&longer, 4, b"u");
    assert!(salted.iter().all(|key| !keys.contains(key)));
}

#[test]
fn block_key_debug_is_short_hex() {
    let key = BlockKey([0xab; 32]);
    assert_eq!(format!("{key:?}"), "BlockKey(abababababab..)");
}

/// The key by its definition, the tokens fed to BLAKE3 one at a time: keyed by the parent's key, or for a first
/// block by the key `derive_key` gives the salt.
fn chain_by_fields(parent: Option<&BlockKey>, tokens: &[u32], salt: &[u8]) -> BlockKey {
    let key = parent.map_or_else(
        || blake3::derive_key(super::ROOT_KEY_CONTEXT, salt),
        |parent| parent.0,
    );
    let mut hasher = blake3::Hasher::new_keyed(&key);
    for token in tokens {
        hasher.update(&token.to_le_bytes());
    }
    BlockKey(*hasher.finalize().as_bytes())
}

#[test]
fn chain_hashes_the_same_message_on_the_stack_and_on_the_heap() {
    let parent = BlockKey([7; 32]);
    let long_salt = vec![3u8; 300];
    let tokens: Vec<u32> = (0..100u32).map(|t| t.wrapping_mul(2_654_435_761)).collect();
    for (parent, tokens, salt) in [
        (None, &tokens[..16], &b"salt"[..]),
        (Some(&parent), &tokens[..16], &b""[..]),
        (Some(&parent), &tokens[..], &b"salt"[..]),
        (None, &tokens[..16], &long_salt[..]),
        (None, &tokens[..0], &b""[..]),
    ] {
        assert_eq!(
            BlockKey::chain(parent, tokens, salt),
            chain_by_fields(parent, tokens, salt)
        );
    }
}

#[test]
fn extend_chain_counts_a_block_of_zero_tokens_as_one_and_does_not_panic() {
    let tokens = [5, 6, 7];
    let mut zero = Vec::new();
    BlockKey::extend_chain(&mut zero, &tokens, 0, b"t");
    let mut one = Vec::new();
    BlockKey::extend_chain(&mut one, &tokens, 1, b"t");
    assert_eq!(zero.len(), 3);
    assert_eq!(zero, one);
    assert_eq!(zero, BlockKey::chain_all(&tokens, 0, b"t"));
    let mut from = Vec::new();
    assert!(BlockKey::extend_chain_from(&mut from, &tokens, 0, 0, b"t"));
    assert_eq!(from, zero);
}
