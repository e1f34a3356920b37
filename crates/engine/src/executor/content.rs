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
    let mut hasher = blake3::Hasher::new();
    hasher.update(&message);
    hasher.finalize_xof().fill(out);
}
