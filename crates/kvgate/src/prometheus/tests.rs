//! The `/metrics` endpoint of a small agents run, scraped over HTTP and parsed as the text format: every
//! family is there, and under every policy the counters equal the run's own report; the classic format is
//! served to a scraper that asks for it (and passes `promtool check metrics`); a live run (the reference model
//! on the wall clock) is scraped while it runs.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use engine::Policy;
use prometheus_client::registry::Registry;

use super::exposition::negotiate;
use super::{Format, MetricFamilies, encode, serve};
use crate::config::EngineConfig;
use crate::run;
use crate::workload::agents::AgentsSpec;

/// `GET path` on `addr`: (status line, body).
fn get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    let (head, body) = get_with(addr, path, "");
    (head.lines().next().unwrap().to_string(), body)
}

/// `GET path` on `addr` with extra header lines (each ending in CRLF): (response head, body).
fn get_with(addr: std::net::SocketAddr, path: &str, headers: &str) -> (String, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: test\r\n{headers}\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    (head.to_string(), body.to_string())
}

/// Parses the text exposition format: series (name and labels as written) to value.
fn parse(text: &str) -> HashMap<String, f64> {
    let mut series = HashMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (name, value) = line.rsplit_once(' ').unwrap();
        let value: f64 = value.parse().unwrap_or_else(|e| panic!("{line}: {e}"));
        series.insert(name.to_string(), value);
    }
    assert!(text.ends_with("# EOF\n"), "no EOF marker");
    series
}

#[test]
fn metrics_are_served_over_http_in_the_text_format() {
    let (config, spec) = run::small_agents();
    let mut registry = Registry::default();
    let families = MetricFamilies::register(&mut registry);
    let server = serve("127.0.0.1:0", Arc::new(registry)).unwrap();
    let mut runs = Vec::new();
    for policy in Policy::ALL {
        let mut metrics = families.engine(policy.name());
        runs.push(
            run::run_agents_observed(&config, &spec, policy, &mut |_, _| {}, &mut metrics).unwrap(),
        );
    }
    let (status, body) = get(server.local_addr(), "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    let series = parse(&body);
    for family in [
        "kvgate_capacity_waits_started_total",
        "kvgate_capacity_waits_active",
        "kvgate_capacity_wait_longest_seconds",
        "kvgate_restore_fallbacks_total",
        "kvgate_restore_fallback_events_total",
        "kvgate_prompt_tokens_total",
        "kvgate_preemptions_total",
        "kvgate_pool_pages",
        "kvgate_copies_in_flight",
        "kvgate_restore_latency_seconds_count",
    ] {
        assert!(
            series
                .keys()
                .any(|name| name.starts_with(&format!("{family}{{"))),
            "no {family} series in\n{body}"
        );
    }
    for run in &runs {
        let policy = &run.policy;
        let tokens = |source: &str| {
            series
                [&format!("kvgate_prompt_tokens_total{{policy=\"{policy}\",source=\"{source}\"}}")]
        };
        assert_eq!(
            tokens("local_hit"),
            run.prompt_tokens_local_hit as f64,
            "{policy}"
        );
        assert_eq!(
            tokens("restored"),
            run.prompt_tokens_restored as f64,
            "{policy}"
        );
        assert_eq!(
            tokens("recomputed"),
            run.prompt_tokens_recomputed as f64,
            "{policy}"
        );
        // The report's restore fallbacks, reason by reason, and no reason the report lacks.
        for (reason, n) in &run.restore_fallbacks {
            let served = series[&format!(
                "kvgate_restore_fallbacks_total{{policy=\"{policy}\",reason=\"{reason}\"}}"
            )];
            assert_eq!(served, f64::from(*n), "{policy} {reason}");
        }
        let served_total: f64 = series
            .iter()
            .filter(|(name, _)| {
                name.starts_with(&format!(
                    "kvgate_restore_fallbacks_total{{policy=\"{policy}\""
                ))
            })
            .map(|(_, value)| value)
            .sum();
        let reported: u32 = run.restore_fallbacks.values().sum();
        assert_eq!(served_total, f64::from(reported), "{policy}");
        // The precondition: ordinary falls back under this pressure, so the comparison compares something.
        assert!(
            policy != "ordinary" || reported > 0,
            "ordinary fell back nowhere"
        );
        let preemptions = series[&format!("kvgate_preemptions_total{{policy=\"{policy}\"}}")];
        assert_eq!(preemptions, run.preemptions as f64, "{policy}");
        let waits = series[&format!("kvgate_capacity_waits_started_total{{policy=\"{policy}\"}}")];
        assert!(
            waits >= f64::from(run.capacity_waits),
            "{policy}: {waits} waits, the run counted {}",
            run.capacity_waits
        );
    }
    let restores = series["kvgate_restore_latency_seconds_count{policy=\"reserved\"}"];
    assert!(restores > 0.0, "no restore latency observed");
    assert_eq!(
        get(server.local_addr(), "/other").0,
        "HTTP/1.1 404 Not Found"
    );
}

#[test]
fn a_live_run_serves_its_metrics_while_it_runs() {
    let mut config = EngineConfig::default();
    config.pool.pages = 96;
    let spec = AgentsSpec {
        n_agents: 3,
        turns: 3,
        think_s: 0.05,
        ..run::live_agents_spec()
    };
    let mut registry = Registry::default();
    let families = MetricFamilies::register(&mut registry);
    let server = serve("127.0.0.1:0", Arc::new(registry)).unwrap();
    let mut metrics = families.engine(Policy::Reserved.name());
    let live = std::thread::spawn(move || {
        run::run_agents_live_observed(
            &config,
            &spec,
            Policy::Reserved,
            &mut |_, _| {},
            &mut metrics,
        )
    });
    // Scrape until the run's first steps show, while it still runs.
    let mut while_running = None;
    while !live.is_finished() {
        let (status, body) = get(server.local_addr(), "/metrics");
        assert_eq!(status, "HTTP/1.1 200 OK");
        if body.contains("kvgate_pool_pages{") && !live.is_finished() {
            while_running = Some(parse(&body));
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let (run, _verify) = live.join().unwrap().unwrap();
    let series = while_running.expect("the live run was scraped while it ran");
    let free = series["kvgate_pool_pages{policy=\"reserved\",state=\"free\"}"];
    assert!(free > 0.0 && free <= 96.0, "{free} free pages");
    assert!(series.contains_key("kvgate_copies_in_flight{policy=\"reserved\"}"));
    // At the end, the tokens by source are the run's own.
    let series = parse(&get(server.local_addr(), "/metrics").1);
    for (source, n) in [
        ("local_hit", run.prompt_tokens_local_hit),
        ("restored", run.prompt_tokens_restored),
        ("recomputed", run.prompt_tokens_recomputed),
    ] {
        let key = format!("kvgate_prompt_tokens_total{{policy=\"reserved\",source=\"{source}\"}}");
        assert_eq!(series[&key], n as f64, "{source}");
    }
    assert!(run.prompt_tokens_restored > 0, "{run:?}");
    assert!(series["kvgate_restore_latency_seconds_count{policy=\"reserved\"}"] > 0.0);
}

#[test]
fn the_format_follows_the_accept_header() {
    let check = |accept: Option<&str>, expect: Format| {
        assert_eq!(negotiate(accept), expect, "{accept:?}");
    };
    check(None, Format::OpenMetrics);
    check(Some("*/*"), Format::OpenMetrics);
    check(Some("text/plain"), Format::Classic);
    check(Some("text/plain; version=0.0.4"), Format::Classic);
    check(Some("TEXT/PLAIN;version=0.0.4"), Format::Classic);
    check(
        Some("application/openmetrics-text; version=1.0.0"),
        Format::OpenMetrics,
    );
    // What a Prometheus server sends: OpenMetrics first, text as the fallback.
    check(
        Some(
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,\
             text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
        ),
        Format::OpenMetrics,
    );
    // A scraper that prefers the classic format.
    check(
        Some("text/plain;version=0.0.4,application/openmetrics-text;q=0.5"),
        Format::Classic,
    );
    // A refused type (q=0) is not asked for; a malformed q counts as 1.
    check(Some("text/plain;q=0"), Format::OpenMetrics);
    check(Some("text/plain;q=x"), Format::Classic);
    check(Some(""), Format::OpenMetrics);
}

/// A registry holding one engine's families after a small run under `policy`.
fn registry_after(policy: Policy) -> Registry {
    let (config, spec) = run::small_agents();
    let mut registry = Registry::default();
    let families = MetricFamilies::register(&mut registry);
    let mut metrics = families.engine(policy.name());
    run::run_agents_observed(&config, &spec, policy, &mut |_, _| {}, &mut metrics).unwrap();
    registry
}

#[test]
fn the_classic_format_describes_each_counter_by_its_series_name() {
    let registry = registry_after(Policy::Ordinary);
    let openmetrics = encode(&registry, Format::OpenMetrics).unwrap();
    let classic = encode(&registry, Format::Classic).unwrap();
    assert!(openmetrics.contains("# TYPE kvgate_preemptions counter\n"));
    assert!(classic.contains("# TYPE kvgate_preemptions_total counter\n"));
    assert!(classic.contains("# HELP kvgate_preemptions_total Running requests preempted"));
    assert!(!classic.contains("# EOF"), "{classic}");
    // Every sample has a HELP and a TYPE line naming its family (the histogram's by its base name).
    let described: Vec<&str> = classic
        .lines()
        .filter_map(|line| line.strip_prefix("# HELP "))
        .filter_map(|rest| rest.split_once(' ').map(|(name, _)| name))
        .collect();
    let typed: Vec<&str> = classic
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_once(' ').map(|(name, _)| name))
        .collect();
    assert_eq!(described, typed);
    for line in classic.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap();
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .filter(|base| described.contains(base))
            .unwrap_or(name);
        assert!(described.contains(&family), "{line}: no HELP for {family}");
    }
    // The samples themselves are the same in both formats.
    let samples = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(samples(&openmetrics), samples(&classic));
}

#[test]
fn a_scraper_asking_for_the_classic_format_gets_it() {
    let registry = registry_after(Policy::Reserved);
    let server = serve("127.0.0.1:0", Arc::new(registry)).unwrap();
    let (head, body) = get_with(
        server.local_addr(),
        "/metrics",
        "Accept: text/plain;version=0.0.4\r\n",
    );
    assert!(
        head.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8"),
        "{head}"
    );
    assert!(body.contains("# TYPE kvgate_prompt_tokens_total counter\n"));
    let (head, body) = get_with(server.local_addr(), "/metrics", "");
    assert!(
        head.contains("Content-Type: application/openmetrics-text; version=1.0.0"),
        "{head}"
    );
    assert!(body.ends_with("# EOF\n"));
}

/// `promtool check metrics` (Debian's `prometheus` package) on the classic scrape of a run under every
/// policy: no lint problem. Without promtool it prints that it skipped, and fails under
/// `KVGATE_REQUIRE_PROMTOOL=1` (set by `.ci/run`, which installs it).
#[test]
fn promtool_accepts_the_classic_scrape() {
    #[allow(
        clippy::disallowed_methods,
        reason = "the test reads whether CI requires promtool"
    )]
    let required = std::env::var("KVGATE_REQUIRE_PROMTOOL").is_ok_and(|v| v == "1");
    let promtool = std::process::Command::new("promtool")
        .arg("--version")
        .output();
    if promtool.is_err() {
        assert!(
            !required,
            "promtool is not installed and KVGATE_REQUIRE_PROMTOOL=1"
        );
        #[allow(clippy::print_stderr, reason = "a skipped test says so")]
        {
            eprintln!("skipped: promtool is not installed (Debian's prometheus package has it)");
        }
        return;
    }
    let (config, spec) = run::small_agents();
    let mut registry = Registry::default();
    let families = MetricFamilies::register(&mut registry);
    for policy in Policy::ALL {
        let mut metrics = families.engine(policy.name());
        run::run_agents_observed(&config, &spec, policy, &mut |_, _| {}, &mut metrics).unwrap();
    }
    let server = serve("127.0.0.1:0", Arc::new(registry)).unwrap();
    let (_, body) = get_with(server.local_addr(), "/metrics", "Accept: text/plain\r\n");
    let mut check = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    check
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let output = check.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "promtool check metrics: {}{}\n{body}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
