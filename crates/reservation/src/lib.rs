//! The restore-admission ledger: tickets (running slot + execution credits + import ownership), capacity
//! waiters in order with their needs, and bounded-wait expiry against an injected clock. Sans-IO and
//! single-threaded; knows page counts, not bytes.

mod ids;

pub use ids::{RequestId, Timestamp};
