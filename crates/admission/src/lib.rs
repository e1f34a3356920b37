//! Admission gates: the waiting queue (FCFS or priority), the admission context (slots, free pages, credits,
//! watermark), the blocked head that only ready imports owning their capacity may pass, and the three answers
//! admit / pressure / impossible. A step's cost does not grow with the waiting queue.

mod error;
mod queue;
mod step;
#[cfg(test)]
mod tests;

pub use error::{Error, Result};
pub use queue::{QueuePolicy, WaitingQueue};
pub use step::{
    Admission, AdmissionHost, BlockReason, BlockedHead, Candidate, Decision, StepContext,
    StepDecisions,
};
