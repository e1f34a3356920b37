//! The deterministic page content the simulated executor writes (contract E3): a function of (cache group,
//! rank, first token position of the page, key of the token prefix through the page's last filled token). A restored
//! page can therefore be checked byte for byte against what recompute writes.
//!
//! The prefix key is already a BLAKE3 digest, uniform over its 32 bytes, so the content needs no second
//! cryptographic hash: the key's four words and the page's coordinates are folded into a 64-bit fingerprint by
//! a bijective mixer, which then seeds a splitmix64 stream that fills the page. Two pages that differ in any
//! input agree with probability 2^-64 per fingerprint, which is what a check for copy bugs needs (E3 guards
//! against bugs, not adversaries: an adversary would have to forge the restored bytes, not the key). BLAKE3 here
//! took about a sixth of a trace replay's time.

use kv_pool::BlockKey;

/// Golden-ratio increment of splitmix64.
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// The splitmix64 finalizer: a bijection on 64-bit words that spreads every input bit over the output.
#[inline]
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Fills `out` with the content recompute writes on `rank` for the page of `group` that starts at token
/// `first_pos` and whose filled tokens end the prefix identified by `prefix_key` (the chained block key, salt
/// included).
pub fn page_content(group: u32, rank: u32, first_pos: u32, prefix_key: &BlockKey, out: &mut [u8]) {
    // Version tag of this content function: change it when the function changes.
    const TAG: u64 = 0x6b76_6761_7465_7633; // "kvgatev3"
    // Each fold is a bijection of the word it takes in, given the state before it.
    let mut fingerprint = mix(TAG ^ (u64::from(group) << 32 | u64::from(rank)));
    fingerprint = mix(fingerprint.wrapping_add(GOLDEN) ^ u64::from(first_pos));
    for word in prefix_key.0.chunks_exact(8) {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(word);
        fingerprint = mix(fingerprint.wrapping_add(GOLDEN) ^ u64::from_le_bytes(bytes));
    }
    let mut state = fingerprint;
    let mut chunks = out.chunks_exact_mut(8);
    for chunk in &mut chunks {
        state = state.wrapping_add(GOLDEN);
        chunk.copy_from_slice(&mix(state).to_le_bytes());
    }
    let rest = chunks.into_remainder();
    if !rest.is_empty() {
        state = state.wrapping_add(GOLDEN);
        let len = rest.len();
        rest.copy_from_slice(&mix(state).to_le_bytes()[..len]);
    }
}

#[cfg(test)]
mod tests {
    use kv_pool::BlockKey;

    use super::page_content;

    /// A short page is the prefix of a longer page's content: the stream does not depend on the page size.
    #[test]
    fn short_pages_are_the_prefix_of_the_long_output() {
        let key = BlockKey::chain(None, &[1, 2, 3], b"salt");
        let mut long = [0u8; 100];
        page_content(2, 1, 48, &key, &mut long);
        for len in [1, 7, 8, 9, 16, 31, 32, 33] {
            let mut short = vec![0u8; len];
            page_content(2, 1, 48, &key, &mut short);
            assert_eq!(short[..], long[..len], "{len} bytes");
        }
    }

    /// Every input moves the content: every byte of the key, and each coordinate, even in the high bits
    /// where a careless fold of group, rank and position would let them cancel.
    #[test]
    fn every_input_bit_changes_the_content() {
        let key = BlockKey::chain(None, &[1, 2, 3], b"salt");
        let mut base = [0u8; 32];
        page_content(3, 5, 4096, &key, &mut base);
        let mut other = [0u8; 32];
        for byte in 0..32 {
            for bit in 0..8 {
                let mut flipped = key;
                flipped.0[byte] ^= 1 << bit;
                page_content(3, 5, 4096, &flipped, &mut other);
                assert_ne!(base, other, "key byte {byte} bit {bit}");
            }
        }
        for bit in 0..32 {
            page_content(3 ^ (1 << bit), 5, 4096, &key, &mut other);
            assert_ne!(base, other, "group bit {bit}");
            page_content(3, 5 ^ (1 << bit), 4096, &key, &mut other);
            assert_ne!(base, other, "rank bit {bit}");
            page_content(3, 5, 4096 ^ (1 << bit), &key, &mut other);
            assert_ne!(base, other, "position bit {bit}");
        }
    }
}
