//! The server's own Prometheus metrics: request latency histograms shaped as vLLM's (its
//! `vllm:time_to_first_token_seconds`, `vllm:time_per_output_token_seconds` and
//! `vllm:e2e_request_latency_seconds`, here `kvgate_`-prefixed, with vLLM's buckets), requests by outcome,
//! output tokens, and requests refused before they reached the engine, by status.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// vLLM's time-to-first-token buckets, in seconds.
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's time-per-output-token buckets, in seconds.
const TPOT_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM's end-to-end latency buckets, in seconds.
const E2E_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// One label: an outcome or a status.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OutcomeLabels {
    /// `finished`, `cancelled`, `rejected` or `failed`; or an HTTP status.
    pub outcome: String,
}

/// The server's metrics, registered once and shared by the engine thread and the handlers.
#[derive(Clone, Debug)]
pub(crate) struct ServeMetrics {
    time_to_first_token: Histogram,
    time_per_output_token: Histogram,
    e2e_request_latency: Histogram,
    requests: Family<OutcomeLabels, Counter>,
    generation_tokens: Counter,
    refused: Family<OutcomeLabels, Counter>,
}

impl ServeMetrics {
    /// Registers the server's metrics in `registry` under the `kvgate_` prefix.
    pub(crate) fn register(registry: &mut Registry) -> ServeMetrics {
        let metrics = ServeMetrics {
            time_to_first_token: Histogram::new(TTFT_BUCKETS.iter().copied()),
            time_per_output_token: Histogram::new(TPOT_BUCKETS.iter().copied()),
            e2e_request_latency: Histogram::new(E2E_BUCKETS.iter().copied()),
            requests: Family::default(),
            generation_tokens: Counter::default(),
            refused: Family::default(),
        };
        let registry = registry.sub_registry_with_prefix("kvgate");
        registry.register(
            "time_to_first_token_seconds",
            "Time from a request's arrival to its first output token (vLLM: vllm:time_to_first_token_seconds)",
            metrics.time_to_first_token.clone(),
        );
        registry.register(
            "time_per_output_token_seconds",
            "Mean time between a request's output tokens after the first (vLLM: vllm:time_per_output_token_seconds)",
            metrics.time_per_output_token.clone(),
        );
        registry.register(
            "e2e_request_latency_seconds",
            "Time from a request's arrival to its end (vLLM: vllm:e2e_request_latency_seconds)",
            metrics.e2e_request_latency.clone(),
        );
        registry.register(
            "requests",
            "Requests the engine ended, by outcome: finished, cancelled, rejected, failed",
            metrics.requests.clone(),
        );
        registry.register(
            "generation_tokens",
            "Output tokens of the requests the engine ended",
            metrics.generation_tokens.clone(),
        );
        registry.register(
            "requests_refused",
            "Requests refused before they reached the engine, by HTTP status",
            metrics.refused.clone(),
        );
        metrics
    }

    /// A request's first output token came `after` its arrival.
    pub(crate) fn observe_first_token(&self, after: Duration) {
        self.time_to_first_token.observe(after.as_secs_f64());
    }

    /// A request ended `e2e` after its arrival, `decode` after its first token, with `n_output` tokens.
    pub(crate) fn observe_finished(
        &self,
        e2e: Duration,
        decode: Duration,
        n_output: u32,
        cancelled: bool,
    ) {
        self.e2e_request_latency.observe(e2e.as_secs_f64());
        if n_output > 1 {
            self.time_per_output_token
                .observe(decode.as_secs_f64() / f64::from(n_output - 1));
        }
        self.generation_tokens.inc_by(u64::from(n_output));
        self.count_request(if cancelled { "cancelled" } else { "finished" });
    }

    /// Counts a request the engine ended with `outcome`.
    pub(crate) fn count_request(&self, outcome: &str) {
        self.requests
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// Counts a request refused with `status` before it reached the engine.
    pub(crate) fn count_refused(&self, status: u16) {
        self.refused
            .get_or_create(&OutcomeLabels {
                outcome: status.to_string(),
            })
            .inc();
    }
}
