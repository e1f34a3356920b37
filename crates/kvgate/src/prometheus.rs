//! Prometheus metrics of running engines (`prometheus-client`), kept by the facade from what each step
//! reports: no lower layer knows Prometheus. `MetricFamilies::register` adds the families to a `Registry`
//! (every series labelled with the engine's `policy`); an `EngineMetrics` per engine is an `Observer` that
//! updates them after every step; `serve` answers `GET /metrics` over plain `std::net` (no async runtime), in
//! OpenMetrics or the classic text format as the scraper's `Accept` asks (`negotiate`, `encode`, for any
//! server showing a registry). Copies in flight, owned imports, capacity waiters and the restore
//! latency (from a copy's start to its end, on the engine clock) come from `Engine::restore_gauges`, under every
//! policy.

mod exposition;
mod http;

use std::collections::{HashMap, HashSet};

use engine::{Engine, Executor, StepReport};
use kv_pool::{RequestId, Timestamp};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

pub use self::exposition::{Format, encode};

pub use self::http::{MetricsServer, serve};
use crate::run::Observer;

/// Series of one engine.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PolicyLabels {
    /// The engine's admission policy.
    pub policy: String,
}

/// Restore fallbacks of one engine by reason (`FallbackReason::name`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReasonLabels {
    /// The engine's admission policy.
    pub policy: String,
    /// Why the restore fell back.
    pub reason: String,
}

/// Prompt tokens of one engine by source: `local_hit`, `restored`, `recomputed`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct SourceLabels {
    /// The engine's admission policy.
    pub policy: String,
    /// Where the tokens came from.
    pub source: String,
}

/// Pool pages of one engine by state: `free`, `credits` (free pages protected by credits), `owned_imports`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StateLabels {
    /// The engine's admission policy.
    pub policy: String,
    /// The pages' state.
    pub state: String,
}

type HistogramFamily = Family<PolicyLabels, Histogram, fn() -> Histogram>;

/// The metric families every engine of a registry updates.
#[derive(Clone, Debug)]
pub struct MetricFamilies {
    capacity_waits_started: Family<PolicyLabels, Counter>,
    capacity_waits_active: Family<PolicyLabels, Gauge>,
    capacity_wait_longest_seconds: Family<PolicyLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    restore_fallbacks: Family<ReasonLabels, Counter>,
    restore_fallback_events: Family<ReasonLabels, Counter>,
    prompt_tokens: Family<SourceLabels, Counter>,
    preemptions: Family<PolicyLabels, Counter>,
    pool_pages: Family<StateLabels, Gauge>,
    copies_in_flight: Family<PolicyLabels, Gauge>,
    restore_latency_seconds: HistogramFamily,
}

/// Buckets of the restore latency histogram: 1 ms to about 33 s, doubling.
fn restore_latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

impl MetricFamilies {
    /// Registers every family in `registry` under the prefix `kvgate_`.
    pub fn register(registry: &mut Registry) -> Self {
        let families = Self {
            capacity_waits_started: Family::default(),
            capacity_waits_active: Family::default(),
            capacity_wait_longest_seconds: Family::default(),
            restore_fallbacks: Family::default(),
            restore_fallback_events: Family::default(),
            prompt_tokens: Family::default(),
            preemptions: Family::default(),
            pool_pages: Family::default(),
            copies_in_flight: Family::default(),
            restore_latency_seconds: Family::new_with_constructor(restore_latency_histogram),
        };
        let registry = registry.sub_registry_with_prefix("kvgate");
        registry.register(
            "capacity_waits_started",
            "Restores refused for pressure that began a bounded capacity wait",
            families.capacity_waits_started.clone(),
        );
        registry.register(
            "capacity_waits_active",
            "Restores waiting for room now",
            families.capacity_waits_active.clone(),
        );
        registry.register(
            "capacity_wait_longest_seconds",
            "Longest capacity wait so far, in engine seconds (finished and ongoing waits)",
            families.capacity_wait_longest_seconds.clone(),
        );
        registry.register(
            "restore_fallbacks",
            "Finished later turns whose restore fell back to recomputation, by their first reason (the report's \
             restore fallbacks)",
            families.restore_fallbacks.clone(),
        );
        registry.register(
            "restore_fallback_events",
            "Every fallback to recomputation as it happens, by reason: a request may fall back more than once, \
             and first turns that find nothing in the store count (not_in_store)",
            families.restore_fallback_events.clone(),
        );
        registry.register(
            "prompt_tokens",
            "Prompt tokens of finished requests by source: local_hit, restored, recomputed",
            families.prompt_tokens.clone(),
        );
        registry.register(
            "preemptions",
            "Running requests preempted (forced prefix-cache resets included)",
            families.preemptions.clone(),
        );
        registry.register(
            "pool_pages",
            "KV pool pages by state: free, credits (free pages protected by credits), owned_imports",
            families.pool_pages.clone(),
        );
        registry.register(
            "copies_in_flight",
            "Restore imports whose page copies have not all completed",
            families.copies_in_flight.clone(),
        );
        registry.register(
            "restore_latency_seconds",
            "Engine seconds from a restore's reservation to its publication (copies done)",
            families.restore_latency_seconds.clone(),
        );
        families
    }

    /// The metrics of one engine running `policy`.
    pub fn engine(&self, policy: &str) -> EngineMetrics {
        EngineMetrics {
            families: self.clone(),
            policy: policy.to_string(),
            n_requests_seen: 0,
            waiters: HashSet::new(),
            importing_since: HashMap::new(),
            longest_wait_s: 0.0,
            waits_seen_starting: 0,
            waits_of_finished: 0,
            waits_counted: 0,
        }
    }
}

/// One engine's view of the families; an `Observer` that updates them after every step.
#[derive(Debug)]
pub struct EngineMetrics {
    families: MetricFamilies,
    policy: String,
    /// Finished requests already counted (`Engine::request_metrics` only grows).
    n_requests_seen: usize,
    /// Capacity waiters after the previous step.
    waiters: HashSet<RequestId>,
    /// Tickets still importing, with the time they were first seen.
    importing_since: HashMap<RequestId, Timestamp>,
    longest_wait_s: f64,
    /// Capacity waits seen starting in the gauges, and counted by finished requests (a wait that starts and
    /// ends between two steps is seen by the latter only); the counter follows the larger.
    waits_seen_starting: u64,
    waits_of_finished: u64,
    waits_counted: u64,
}

impl EngineMetrics {
    fn labels(&self) -> PolicyLabels {
        PolicyLabels {
            policy: self.policy.clone(),
        }
    }

    fn source(&self, source: &str) -> SourceLabels {
        SourceLabels {
            policy: self.policy.clone(),
            source: source.to_string(),
        }
    }

    fn state(&self, state: &str) -> StateLabels {
        StateLabels {
            policy: self.policy.clone(),
            state: state.to_string(),
        }
    }

    /// Prompt tokens and waits of the requests that finished since the last call.
    fn count_finished<E: Executor>(&mut self, engine: &Engine<E>) {
        let done = engine.request_metrics();
        for request in &done[self.n_requests_seen.min(done.len())..] {
            let tokens = [
                ("local_hit", request.prompt_tokens_local_hit),
                ("restored", request.prompt_tokens_restored),
                ("recomputed", request.prompt_tokens_recomputed),
            ];
            for (source, n) in tokens {
                self.families
                    .prompt_tokens
                    .get_or_create(&self.source(source))
                    .inc_by(u64::from(n));
            }
            self.longest_wait_s = self.longest_wait_s.max(request.longest_capacity_wait_s);
            self.waits_of_finished += u64::from(request.capacity_waits);
            // What `RunMetrics::restore_fallbacks` counts: a finished request's first fallback reason.
            if let Some(reason) = request.fallback {
                self.families
                    .restore_fallbacks
                    .get_or_create(&ReasonLabels {
                        policy: self.policy.clone(),
                        reason: reason.name().to_string(),
                    })
                    .inc();
            }
        }
        self.n_requests_seen = done.len();
        let waits = self.waits_seen_starting.max(self.waits_of_finished);
        self.families
            .capacity_waits_started
            .get_or_create(&self.labels())
            .inc_by(waits - self.waits_counted);
        self.waits_counted = waits;
    }

    /// Waiters, copies in flight, restores copying (their latency) and pages owned by ready imports, from the
    /// engine's restore gauges (every policy).
    fn read_gauges<E: Executor>(&mut self, engine: &Engine<E>, now: Timestamp) {
        let gauges = engine.restore_gauges();
        let waiters: HashSet<RequestId> = gauges.waiters.iter().map(|(id, _)| *id).collect();
        self.waits_seen_starting += waiters.difference(&self.waiters).count() as u64;
        for (_, since) in &gauges.waiters {
            self.longest_wait_s = self
                .longest_wait_s
                .max(now.as_secs_f64() - since.as_secs_f64());
        }
        self.waiters = waiters;
        let importing: HashSet<RequestId> = gauges.importing.iter().copied().collect();
        for id in &importing {
            self.importing_since.entry(*id).or_insert(now);
        }
        let histogram = self
            .families
            .restore_latency_seconds
            .get_or_create(&self.labels());
        self.importing_since.retain(|id, since| {
            let still = importing.contains(id);
            if !still {
                histogram.observe(now.as_secs_f64() - since.as_secs_f64());
            }
            still
        });
        self.families
            .copies_in_flight
            .get_or_create(&self.labels())
            .set(gauges.copies_in_flight as i64);
        self.families
            .capacity_waits_active
            .get_or_create(&self.labels())
            .set(self.waiters.len() as i64);
        self.families
            .pool_pages
            .get_or_create(&self.state("owned_imports"))
            .set(i64::from(gauges.owned_import_pages));
    }
}

impl<E: Executor> Observer<E> for EngineMetrics {
    fn step(&mut self, engine: &Engine<E>, report: &StepReport) {
        let labels = self.labels();
        let preempted = report.preempted.len() + report.reset_preempted.len();
        self.families
            .preemptions
            .get_or_create(&labels)
            .inc_by(preempted as u64);
        for (_, reason) in &report.fallbacks {
            self.families
                .restore_fallback_events
                .get_or_create(&ReasonLabels {
                    policy: self.policy.clone(),
                    reason: reason.name().to_string(),
                })
                .inc();
        }
        // The copy gauges first: a scrape that sees pages come back also sees the copy that held them drained.
        self.read_gauges(engine, report.now);
        self.families
            .pool_pages
            .get_or_create(&self.state("free"))
            .set(i64::from(report.free_pages));
        self.families
            .pool_pages
            .get_or_create(&self.state("credits"))
            .set(i64::from(report.credit_pages));
        self.count_finished(engine);
        self.families
            .capacity_wait_longest_seconds
            .get_or_create(&labels)
            .set(self.longest_wait_s);
    }

    fn finish(&mut self, engine: &Engine<E>) {
        self.count_finished(engine);
    }
}

#[cfg(test)]
mod tests;
