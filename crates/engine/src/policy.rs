//! The admission policy switch: one engine, three mechanisms (and an unbounded-pool upper bound).

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// How a restore is admitted. Policies differ only by mechanism; no outcome is hard-coded per policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Policy {
    /// How engines behaved before the contract: a restore that cannot get its pages at once is admitted as an
    /// ordinary request and recomputes its prefix. No reservation operation is ever called (G1).
    Ordinary,
    /// The naive fix: reserve only the imported pages. No running slot, no execution credits, and no ownership
    /// once published: the restored pages are evictable and competitors can take the continuation's space.
    PagesOnly,
    /// The contract: ledger tickets (pages + slot + credits), ownership until admission, capacity waiters and
    /// a bounded wait.
    Reserved,
    /// `Reserved` with an unbounded pool: the upper bound, for reports only.
    Oracle,
}

impl Policy {
    /// Every policy, in report order.
    pub const ALL: [Policy; 4] = [
        Policy::Ordinary,
        Policy::PagesOnly,
        Policy::Reserved,
        Policy::Oracle,
    ];

    /// The policy's command-line and report name.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Ordinary => "ordinary",
            Policy::PagesOnly => "pages-only",
            Policy::Reserved => "reserved",
            Policy::Oracle => "oracle",
        }
    }

    /// Whether the policy uses the reservation contract (tickets, credits, ownership, capacity waits).
    pub fn uses_reservations(self) -> bool {
        matches!(self, Policy::Reserved | Policy::Oracle)
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Policy {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Policy::ALL
            .into_iter()
            .find(|policy| policy.name() == name)
            .ok_or_else(|| Error::UnknownPolicy {
                name: name.to_owned(),
            })
    }
}
