//! The two text formats a scraper may ask for, and which one it asked for: OpenMetrics 1.0 (what
//! `prometheus-client` writes) and the classic Prometheus text format 0.0.4, derived from it. Any HTTP server
//! that shows a `Registry` (the `/metrics` of `serve`, or an embedding server's own) calls [`negotiate`] on
//! the request's `Accept` header and [`encode`] with the answer.

use prometheus_client::registry::Registry;

/// A text exposition format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0 (`application/openmetrics-text; version=1.0.0`).
    OpenMetrics,
    /// The classic Prometheus text format (`text/plain; version=0.0.4`): a counter's `# HELP` and `# TYPE`
    /// name its `_total` series, and there is no `# EOF`.
    Classic,
}

impl Format {
    /// The `Content-Type` of a response in this format.
    pub(crate) fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Classic => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// The format an `Accept` header asks for: classic when it prefers `text/plain` (a higher `q` than any
/// OpenMetrics type, or no OpenMetrics type at all); OpenMetrics otherwise, and with no header.
pub(crate) fn negotiate(accept: Option<&str>) -> Format {
    let Some(accept) = accept else {
        return Format::OpenMetrics;
    };
    let mut openmetrics_q: Option<f64> = None;
    let mut text_q: Option<f64> = None;
    for range in accept.split(',') {
        let mut params = range.split(';').map(str::trim);
        let media_type = params.next().unwrap_or_default().to_ascii_lowercase();
        let q = params
            .filter_map(|param| param.strip_prefix("q="))
            .find_map(|value| value.trim().parse::<f64>().ok())
            .unwrap_or(1.0);
        let slot = match media_type.as_str() {
            "application/openmetrics-text" => &mut openmetrics_q,
            "text/plain" => &mut text_q,
            _ => continue,
        };
        *slot = Some(slot.map_or(q, |best: f64| best.max(q)));
    }
    match (openmetrics_q, text_q) {
        (_, Some(text)) if text > 0.0 && openmetrics_q.is_none_or(|open| text > open) => {
            Format::Classic
        }
        _ => Format::OpenMetrics,
    }
}

/// `registry` in `format`. Errors only when a metric cannot be written (`std::fmt::Error`).
pub fn encode(registry: &Registry, format: Format) -> Result<String, std::fmt::Error> {
    let mut openmetrics = String::new();
    prometheus_client::encoding::text::encode(&mut openmetrics, registry)?;
    Ok(match format {
        Format::OpenMetrics => openmetrics,
        Format::Classic => classic(&openmetrics),
    })
}

/// OpenMetrics text as the classic format: a counter family `x` is described as `x_total` (its series'
/// name), and `# UNIT` and `# EOF` lines, which the classic format lacks, are dropped.
fn classic(openmetrics: &str) -> String {
    let counters: Vec<&str> = openmetrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let described = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(&name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        match described {
            Some(renamed) => out.push_str(&renamed),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}
