//! The deterministic page content the simulated executor writes (contract E3): a function of (cache group,
//! rank, first token position of the page, key of the token prefix through the page's last filled token). A restored
//! page can therefore be checked byte for byte against what recomputing the prefix would have written.

use kv_pool::BlockKey;

/// Fills `out` with the content recompute writes on `rank` for the page of `group` that starts at token
/// `first_pos` and whose filled tokens end the prefix identified by `prefix_key` (the chained block key, salt
/// included).
pub fn page_content(group: u32, rank: u32, first_pos: u32, prefix_key: &BlockKey, out: &mut [u8]) {
    const TAG: &[u8] = b"kvgate-sim-page-v2";
    // One contiguous message, hashed in one call (the same bytes as feeding the fields one by one).
    let mut message = [0u8; TAG.len() + 4 + 4 + 4 + 32];
    let (tag, rest) = message.split_at_mut(TAG.len());
    tag.copy_from_slice(TAG);
    rest[..4].copy_from_slice(&group.to_le_bytes());
    rest[4..8].copy_from_slice(&rank.to_le_bytes());
    rest[8..12].copy_from_slice(&first_pos.to_le_bytes());
    rest[12..].copy_from_slice(&prefix_key.0);
    if out.len() <= blake3::OUT_LEN {
        // The first 32 bytes of BLAKE3's output stream are its plain hash: the same bytes, without a
        // `Hasher` (whose chaining-value stack is initialized per call) or the output reader.
        out.copy_from_slice(&blake3::hash(&message).as_bytes()[..out.len()]);
        return;
    }
    let mut hasher = blake3::Hasher::new();
    hasher.update(&message);
    hasher.finalize_xof().fill(out);
}

#[cfg(test)]
mod tests {
    use kv_pool::BlockKey;

    use super::page_content;

    /// A page of at most 32 bytes is the plain hash's prefix, the same bytes as the output stream's.
    #[test]
    fn short_pages_are_the_prefix_of_the_long_output() {
        let key = BlockKey::chain(None, &[1, 2, 3], b"salt");
        let mut long = [0u8; 100];
        page_content(2, 1, 48, &key, &mut long);
        for len in [1, 16, 31, 32, 33] {
            let mut short = vec![0u8; len];
            page_content(2, 1, 48, &key, &mut short);
            assert_eq!(short[..], long[..len], "{len} bytes");
        }
    }
}
