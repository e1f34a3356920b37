//! The restore-admission ledger: tickets (running slot + execution credits + import ownership), capacity
//! waiters in order with their needs, and bounded-wait expiry against an injected clock. Sans-IO and
//! single-threaded; knows page counts, not bytes.

mod config;
mod error;
mod ledger;
mod rules;
mod spec;
#[cfg(test)]
mod tests;

pub use config::{LedgerConfig, Preflight};
pub use error::{Error, ErrorKind, Result};
pub use ledger::{Ledger, LedgerSnapshot, Released, Ticket, TicketState, TicketView, WaiterView};
pub use rules::{pages_available_to_admit, pages_for_decode, pages_unprotected};
pub use spec::RestoreSpec;
