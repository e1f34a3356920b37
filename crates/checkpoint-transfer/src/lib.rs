//! The data side of a restore: the resident checkpoint index (stage, acknowledge, publish, acquire, discard
//! after drain), the external `CheckpointStore` tiers (host memory, disk) and the `CopyEngine` implementations
//! (inline simulated, threaded host, CUDA) with drain-before-release.
