//! Workloads the facade drives through the engine: closed-loop agent sessions (`agents`) and the
//! open-loop Mooncake trace (`replay`). Each yields turns with their full token ids, so prefix sharing is
//! exactly what the workload says and nothing is assumed about the cache.

pub mod agents;
pub mod mooncake;

/// Deterministic token id `index` of a stream named by `seed`: a cheap 64-bit mix (splitmix64) folded into
/// a 32-bit vocabulary. Streams with different seeds share no structure, so they share no cache blocks.
pub fn token(seed: u64, index: u64) -> u32 {
    let mut z = seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) as u32
}
