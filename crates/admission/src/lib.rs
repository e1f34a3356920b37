//! Admission gates: the waiting queue (FCFS or priority) and the ready-import list, the admission context
//! (slots, free pages, credits, watermark), the blocked head that only ready imports owning their capacity may
//! pass, and the answers admit / pressure / impossible, with restores at once for hosts without reservations.
//! The host (the engine) carries out each admission as the step takes it. A step's cost does not grow with the
//! waiting queue.

mod error;
mod host;
mod queue;
mod step;
#[cfg(test)]
mod tests;

pub use error::{Error, Result};
pub use host::{AdmissionHost, Admit, Candidate, FallbackCause, HostState};
pub use queue::{QueuePolicy, WaitingQueue};
pub use step::{BlockReason, BlockedHead, Decision, StepContext, StepDecisions, schedule_step};
