//! Bench: decode throughput of the real model (written below).
fn main() {}
