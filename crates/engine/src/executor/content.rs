//! The deterministic page content the simulated executor writes (contract E3): a function of (cache group,
//! first token position of the page, key of the token prefix through the page's last filled token). A restored
//! page can therefore be checked byte for byte against what recomputing the prefix would have written.

use kv_pool::BlockKey;

/// Fills `out` with the content recompute writes for the page of `group` that starts at token `first_pos` and
/// whose filled tokens end the prefix identified by `prefix_key` (the chained block key, salt included).
pub fn page_content(group: u32, first_pos: u32, prefix_key: &BlockKey, out: &mut [u8]) {
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"kvgate-sim-page-v1");
    hasher.update(&group.to_le_bytes());
    hasher.update(&first_pos.to_le_bytes());
    hasher.update(&prefix_key.0);
    hasher.finalize_xof().fill(out);
}
