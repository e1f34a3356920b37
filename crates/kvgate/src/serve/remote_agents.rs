//! `kvgate agents --target URL`: the agents workload as a real client of any OpenAI-compatible server.
//! Each session is a chat that resends its whole history every turn (its input as a user message of about
//! as many words as the workload's turn has tokens, the server's answers as assistant messages), streamed,
//! with the workload's think times in real seconds. The table comes from what the client measured: time to
//! first token, turn time, and tokens from cache from `usage.prompt_tokens_details.cached_tokens`. Against a
//! kvgate server it also checks that `/metrics` counted what the client counted.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::client::{ApiClient, StreamedAnswer};
use crate::error::{Error, Result};
use crate::workload::agents::AgentsSpec;

/// Words a session's text is drawn from: common English words, each one token with its leading space in
/// most vocabularies.
const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
    "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "file", "test", "build",
    "error", "line", "code", "run",
];

/// Longest pause after a refusal that gave no `Retry-After`.
const RETRY_DEFAULT: Duration = Duration::from_secs(1);

/// One turn as the client saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct TurnRecord {
    /// Session.
    pub agent: u32,
    /// Turn within the session.
    pub turn: u32,
    /// Seconds to the first content chunk.
    pub ttft_s: f64,
    /// Seconds from sending to the end of the stream.
    pub turn_s: f64,
    /// `usage.prompt_tokens`.
    pub prompt_tokens: u64,
    /// `usage.prompt_tokens_details.cached_tokens`.
    pub cached_tokens: u64,
    /// `usage.completion_tokens`, or the content chunks when the stream carried no usage.
    pub completion_tokens: u64,
    /// Whether the stream carried `usage` (servers that do not send it leave the cache share unknown).
    pub has_usage: bool,
}

/// What a remote agents run did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RemoteRun {
    /// The server's base URL.
    pub target: String,
    /// The model asked for.
    pub model: String,
    /// Turns answered.
    pub turns: Vec<TurnRecord>,
    /// Turns asked for (answered, failed or not started before the time bound).
    pub turns_planned: u64,
    /// Refusals (429 or 503 with `Retry-After` and an error body), each retried.
    pub refused: u64,
    /// Answers that were neither a complete stream nor a proper refusal, with what was wrong.
    pub failures: Vec<String>,
    /// Seconds the run took.
    pub wall_s: f64,
    /// What the server's `/metrics` counted during the run (a kvgate server): finished requests and output
    /// tokens.
    pub server_counts: Option<(u64, u64)>,
}

/// Runs `spec`'s sessions against `target`, starting no turn after `duration` when given; `model` defaults
/// to the first model the server lists.
pub fn run_remote_agents(
    target: &str,
    spec: &AgentsSpec,
    model: Option<&str>,
    duration: Option<Duration>,
) -> Result<RemoteRun> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::Client(format!("cannot start the async runtime: {e}")))?;
    runtime.block_on(drive(target, spec, model, duration))
}

async fn drive(
    target: &str,
    spec: &AgentsSpec,
    model: Option<&str>,
    duration: Option<Duration>,
) -> Result<RemoteRun> {
    let client = ApiClient::new(target)?;
    let model = match model {
        Some(model) => model.to_owned(),
        None => client.first_model().await?,
    };
    let before = server_counts(&client).await;
    let start = Instant::now();
    let deadline = duration.map(|d| start + d);
    let mut sessions = Vec::new();
    for agent in 0..spec.n_agents {
        let (client, spec, model) = (client.clone(), spec.clone(), model.clone());
        sessions.push(tokio::spawn(async move {
            session(&client, &spec, &model, agent, deadline).await
        }));
    }
    let mut run = RemoteRun {
        target: target.to_owned(),
        model,
        turns_planned: u64::from(spec.n_agents) * u64::from(spec.turns),
        ..RemoteRun::default()
    };
    for session in sessions {
        let (turns, refused, failures) = session
            .await
            .map_err(|e| Error::Client(format!("a session task failed: {e}")))?;
        run.turns.extend(turns);
        run.refused += refused;
        run.failures.extend(failures);
    }
    run.wall_s = start.elapsed().as_secs_f64();
    let after = server_counts(&client).await;
    run.server_counts = before
        .zip(after)
        .map(|(b, a)| (a.0.saturating_sub(b.0), a.1.saturating_sub(b.1)));
    Ok(run)
}

/// One session's turns: (answered turns, refusals, failures).
async fn session(
    client: &ApiClient,
    spec: &AgentsSpec,
    model: &str,
    agent: u32,
    deadline: Option<Instant>,
) -> (Vec<TurnRecord>, u64, Vec<String>) {
    let mut messages: Vec<Value> = Vec::new();
    let (mut turns, mut refused, mut failures) = (Vec::new(), 0, Vec::new());
    for turn in 0..spec.turns {
        messages.push(json!({"role": "user", "content": words(spec, agent, turn)}));
        let body = json!({
            "model": model,
            "messages": messages,
            "max_tokens": spec.response_len(agent, turn),
            "temperature": 0,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        let answer = loop {
            if deadline.is_some_and(|at| Instant::now() >= at) {
                return (turns, refused, failures);
            }
            match client.stream("/v1/chat/completions", &body).await {
                Ok(answer) if is_refusal(&answer) => {
                    refused += 1;
                    let wait = answer
                        .retry_after_s
                        .map_or(RETRY_DEFAULT, Duration::from_secs);
                    tokio::time::sleep(wait.min(RETRY_DEFAULT * 10)).await;
                }
                Ok(answer) => break answer,
                Err(error) => {
                    failures.push(format!("session {agent} turn {turn}: {error}"));
                    return (turns, refused, failures);
                }
            }
        };
        if let Some(problem) = problem(&answer) {
            failures.push(format!("session {agent} turn {turn}: {problem}"));
            return (turns, refused, failures);
        }
        turns.push(TurnRecord {
            agent,
            turn,
            ttft_s: answer.ttft_s.unwrap_or(answer.total_s),
            turn_s: answer.total_s,
            prompt_tokens: answer.prompt_tokens(),
            cached_tokens: answer.cached_tokens(),
            completion_tokens: if answer.usage.is_some() {
                answer.completion_tokens()
            } else {
                u64::from(answer.n_chunks)
            },
            has_usage: answer.usage.is_some(),
        });
        messages.push(json!({"role": "assistant", "content": answer.text}));
        let think = Duration::from_secs_f64(spec.think_s(agent, turn).clamp(0.0, 3600.0));
        tokio::time::sleep(think).await;
    }
    (turns, refused, failures)
}

/// A proper refusal: 429 or 503 with `Retry-After` and an OpenAI error body.
fn is_refusal(answer: &StreamedAnswer) -> bool {
    matches!(answer.status, 429 | 503)
        && answer.retry_after_s.is_some()
        && answer
            .error
            .as_ref()
            .is_some_and(|e| e["error"]["message"].is_string())
}

/// What is wrong with an answer that is no refusal, if anything.
fn problem(answer: &StreamedAnswer) -> Option<String> {
    if answer.status != 200 {
        return Some(format!("status {} with {:?}", answer.status, answer.error));
    }
    if let Some(error) = &answer.error {
        return Some(format!("an error event: {error}"));
    }
    if !answer.done {
        return Some("the stream ended without data: [DONE]".into());
    }
    None
}

/// The user message of `turn`: as many words as the workload's input of that turn has tokens.
fn words(spec: &AgentsSpec, agent: u32, turn: u32) -> String {
    let n = spec.input_len(agent, turn) as usize;
    let mut state =
        spec.seed ^ (u64::from(agent) << 32) ^ u64::from(turn).wrapping_mul(0x9e37_79b9);
    let mut text = String::with_capacity(n * 5);
    for idx in 0..n {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        if idx > 0 {
            text.push(' ');
        }
        text.push_str(
            WORDS
                .get((z % WORDS.len() as u64) as usize)
                .unwrap_or(&"the"),
        );
    }
    text
}

/// `kvgate_requests_total{outcome="finished"}` and `kvgate_generation_tokens_total` from `/metrics`, when
/// the server has them.
async fn server_counts(client: &ApiClient) -> Option<(u64, u64)> {
    let (status, text) = client.get("/metrics").await.ok()?;
    if status != 200 {
        return None;
    }
    let value = |prefix: &str| {
        text.lines()
            .find(|line| line.starts_with(prefix))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    let finished = value("kvgate_requests_total{outcome=\"finished\"}").unwrap_or(0.0);
    let tokens = value("kvgate_generation_tokens_total ")?;
    Some((finished as u64, tokens as u64))
}

/// The percentile `pct` of `values` (nearest rank), 0 when empty.
fn percentile(values: &mut [f64], pct: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((pct / 100.0) * values.len() as f64).ceil() as usize;
    values
        .get(rank.clamp(1, values.len()) - 1)
        .copied()
        .unwrap_or(0.0)
}

/// The run's table, as the client measured it.
pub fn table(run: &RemoteRun) -> String {
    let answered = run.turns.len() as u64;
    let prompt: u64 = run.turns.iter().map(|t| t.prompt_tokens).sum();
    let cached: u64 = run.turns.iter().map(|t| t.cached_tokens).sum();
    let output: u64 = run.turns.iter().map(|t| t.completion_tokens).sum();
    let mean_turn = run.turns.iter().map(|t| t.turn_s).sum::<f64>() / answered.max(1) as f64;
    let mut ttft: Vec<f64> = run.turns.iter().map(|t| t.ttft_s).collect();
    let later: Vec<&TurnRecord> = run.turns.iter().filter(|t| t.turn > 0).collect();
    let later_prompt: u64 = later.iter().map(|t| t.prompt_tokens).sum();
    let later_cached: u64 = later.iter().map(|t| t.cached_tokens).sum();
    let pct = |part: u64, whole: u64| 100.0 * part as f64 / whole.max(1) as f64;
    let mut out = String::new();
    let mut row = |name: &str, value: String| {
        let _ = writeln!(out, "{name:<34}{value}");
    };
    row("target", format!("{} ({})", run.target, run.model));
    row(
        "turns answered",
        format!("{answered}/{}", run.turns_planned),
    );
    row("refused (429/503, retried)", run.refused.to_string());
    row("failed", run.failures.len().to_string());
    row(
        "prompt tokens from cache",
        format!("{:.1}%", pct(cached, prompt)),
    );
    row(
        "  of later turns",
        format!("{:.1}%", pct(later_cached, later_prompt)),
    );
    row("mean turn time", format!("{mean_turn:.2} s"));
    row(
        "p50 / p99 time to first token",
        format!(
            "{:.3} s / {:.3} s",
            percentile(&mut ttft, 50.0),
            percentile(&mut ttft, 99.0)
        ),
    );
    row(
        "aggregate decode",
        format!("{:.1} tok/s", output as f64 / run.wall_s.max(1e-9)),
    );
    row(
        "prompt / cached / output tokens",
        format!("{prompt} / {cached} / {output}"),
    );
    row("wall time", format!("{:.1} s", run.wall_s));
    if let Some((finished, tokens)) = run.server_counts {
        let agrees = finished == answered && tokens == output;
        row(
            "server /metrics counted",
            format!(
                "{finished} finished, {tokens} output tokens: {}",
                if agrees {
                    "agrees"
                } else {
                    "DISAGREES with the client"
                }
            ),
        );
    }
    for failure in &run.failures {
        let _ = writeln!(out, "failure: {failure}");
    }
    out
}
