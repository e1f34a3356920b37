//! Where `reserved`'s capacity waits go on the agents workload: how full the pool is while restores wait, and
//! whether any waiter could have been admitted into the pages that were free. It runs `kvgate agents`'s
//! default sessions (the same spec and seed) under `reserved` and under the unbounded-pool `oracle`, watching
//! every step, and prints, weighted by engine time:
//! - the pages in use (held by requests) and the pages free (cached or empty), against the usable pool;
//! - the time with at least one live capacity waiter, the waiters and free pages meanwhile;
//! - of that time, how long the smallest waiter's need fit in the pages free less outstanding credits
//!   ("some waiter fits"), and how long a later waiter fit while the earliest did not: the only time in which
//!   another admission order could have admitted anyone without preempting a running request; Q2 holds those
//!   later waiters back;
//! - how far the smallest need was above the free pages, on average;
//! - an estimate, not a bound: the mean turn time if the run's page-seconds (pages in use times engine time)
//!   were packed into the pool with no page idle, every session ending together: the packed span less a
//!   session's mean think time, over its turns.
//!
//! Run it with `cargo run --release -p kvgate --bin capacity_waits [-- --pool-pages N] [--turn-priority
//! arrival|progress]`.
#![allow(
    clippy::print_stderr,
    reason = "an example says on stderr why it cannot write its report"
)]

use std::fmt::Write as _;
use std::io::Write as _;

use kvgate::run::{self, Observer};
use kvgate::workload::agents::{AgentsSpec, TurnPriority};
use kvgate::{Engine, EngineConfig, Policy, StepReport, Timestamp};

/// Engine-time integrals over a run, each state weighted by the time until the next step.
#[derive(Default)]
struct Waits {
    last: Option<(Timestamp, State)>,
    span_s: f64,
    in_use_page_s: f64,
    waiting_s: f64,
    waiting_free_page_s: f64,
    waiter_s: f64,
    some_fit_s: f64,
    later_fit_s: f64,
    short_page_s: f64,
}

/// What one step left behind.
#[derive(Clone)]
struct State {
    in_use: u32,
    free: u32,
    /// Free pages less outstanding credits: what a new reservation may take (R2, without the watermark).
    admissible: u32,
    /// Needs of the live (not expired) capacity waiters, in admission order.
    needs: Vec<u32>,
}

impl Waits {
    fn add(&mut self, state: &State, dt: f64) {
        self.span_s += dt;
        self.in_use_page_s += f64::from(state.in_use) * dt;
        let Some(&smallest) = state.needs.iter().min() else {
            return;
        };
        self.waiting_s += dt;
        self.waiting_free_page_s += f64::from(state.free) * dt;
        self.waiter_s += state.needs.len() as f64 * dt;
        if smallest <= state.admissible {
            self.some_fit_s += dt;
            if state.needs[0] > state.admissible {
                self.later_fit_s += dt;
            }
        } else {
            self.short_page_s += f64::from(smallest - state.admissible) * dt;
        }
    }
}

impl Observer for Waits {
    fn step(&mut self, engine: &Engine, report: &StepReport) {
        let needs = engine
            .ledger_snapshot()
            .map(|ledger| {
                ledger
                    .waiters
                    .iter()
                    .filter(|waiter| !waiter.expired)
                    .map(|waiter| waiter.need_pages)
                    .collect()
            })
            .unwrap_or_default();
        let state = State {
            in_use: engine.pool().n_in_use(),
            free: report.free_pages,
            admissible: report.free_pages.saturating_sub(report.credit_pages),
            needs,
        };
        if let Some((at, previous)) = self.last.take() {
            self.add(&previous, report.now.since(at).as_secs_f64());
        }
        self.last = Some((report.now, state));
    }
}

fn main() {
    if let Err(error) = run_example() {
        eprintln!("capacity_waits: {error}");
        std::process::exit(1);
    }
}

/// Parses the arguments, runs both policies and writes the report.
fn run_example() -> Result<(), kvgate::Error> {
    let mut args = std::env::args().skip(1);
    let mut config = EngineConfig::default();
    config.pool.pages = run::agents_pool_pages(&config);
    let mut turn_priority = TurnPriority::Arrival;
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--pool-pages", Some(pages)) => {
                config.pool.pages = pages.parse().map_err(|_| kvgate::Error::InvalidArgument {
                    name: "--pool-pages",
                    value: pages.clone(),
                    allowed: "a count of pages",
                })?;
            }
            ("--turn-priority", Some(order)) => {
                turn_priority = clap::ValueEnum::from_str(&order, false).map_err(|_| {
                    kvgate::Error::InvalidArgument {
                        name: "--turn-priority",
                        value: order.clone(),
                        allowed: "arrival or progress",
                    }
                })?;
            }
            _ => {
                return Err(kvgate::Error::InvalidArgument {
                    name: "argument",
                    value: arg,
                    allowed: "--pool-pages N or --turn-priority arrival|progress",
                });
            }
        }
    }
    // The spec and seed of `kvgate agents`.
    let spec = AgentsSpec {
        seed: run::agents_seed(&config),
        turn_priority,
        ..AgentsSpec::default()
    };
    // The report is written at the end, at once: a reader that closed the pipe early ends it quietly.
    let mut out = String::new();
    let _ = writeln!(
        out,
        "agents: {} sessions x {} turns, pool of {} pages, turn priority {:?}",
        spec.n_agents, spec.turns, config.pool.pages, spec.turn_priority
    );
    let think_s = (0..spec.n_agents)
        .map(|agent| {
            (0..spec.turns - 1)
                .map(|turn| spec.think_s(agent, turn))
                .sum::<f64>()
        })
        .sum::<f64>()
        / f64::from(spec.n_agents);
    let pool_pages = f64::from(config.pool.pages);
    for policy in [Policy::Reserved, Policy::Oracle] {
        let mut waits = Waits::default();
        let metrics = run::run_agents_observed(&config, &spec, policy, &mut |_, _| {}, &mut waits)?;
        let per_wait = |value: f64| {
            if waits.waiting_s > 0.0 {
                value / waits.waiting_s
            } else {
                0.0
            }
        };
        let _ = writeln!(
            out,
            "{policy:>8}: mean turn {:.2} s over {:.1} s of engine time; pages in use {:.0} on average",
            metrics.mean_turn_s,
            waits.span_s,
            waits.in_use_page_s / waits.span_s.max(f64::MIN_POSITIVE),
        );
        if waits.waiting_s > 0.0 {
            let _ = writeln!(
                out,
                "          live capacity waiters {:.1} s ({:.0}% of the time): {:.2} waiters and {:.0} free pages \
                 on average",
                waits.waiting_s,
                100.0 * waits.waiting_s / waits.span_s.max(f64::MIN_POSITIVE),
                per_wait(waits.waiter_s),
                per_wait(waits.waiting_free_page_s),
            );
            let _ = writeln!(
                out,
                "          some waiter fits {:.2} s ({:.1}% of the wait), a later one but not the earliest {:.2} s \
                 ({:.1}%); otherwise the smallest need is {:.0} pages above what is free, on average",
                waits.some_fit_s,
                100.0 * per_wait(waits.some_fit_s),
                waits.later_fit_s,
                100.0 * per_wait(waits.later_fit_s),
                waits.short_page_s / (waits.waiting_s - waits.some_fit_s).max(f64::MIN_POSITIVE),
            );
        }
        let packed_s = waits.in_use_page_s / pool_pages;
        let _ = if packed_s > think_s {
            writeln!(
                out,
                "          its page-seconds packed into {pool_pages} pages: {packed_s:.1} s, a mean turn of about \
                 {:.2} s (a session thinks {think_s:.1} s in all)",
                (packed_s - think_s) / f64::from(spec.turns),
            )
        } else {
            writeln!(
                out,
                "          its page-seconds packed into {pool_pages} pages: {packed_s:.1} s, less than a session \
                 thinks ({think_s:.1} s): the pool bounds no turn"
            )
        };
    }
    match std::io::stdout().lock().write_all(out.as_bytes()) {
        Err(error) if error.kind() != std::io::ErrorKind::BrokenPipe => {
            eprintln!("capacity_waits: cannot write the report: {error}");
            std::process::exit(1);
        }
        _ => Ok(()),
    }
}
