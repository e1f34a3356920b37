//! `kvgate serve` over real HTTP: the answers and their SSE framing, every bad input (each an OpenAI-style
//! error and the server goes on), too many requests, a client that disconnects while a slow copy writes
//! into its pages (nothing freed before the copy drained), a bounded concurrent load whose counts `/metrics`
//! agrees with, and graceful shutdown of the binary on SIGTERM. The server speaks the real model's
//! tokenizer: without the model file these tests print that they skipped, and fail under
//! `KVGATE_REQUIRE_MODEL=1` (CI).
//!
//! A full engine queue (503) is not provoked here: the engine thread empties its queue every step, so no test
//! fills it deterministically, and that path is untested; the shutdown test checks the 503 of a server
//! that is draining.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kvgate::EngineConfig;
use kvgate::serve::client::ApiClient;
use kvgate::serve::{ServeOptions, Server};
use serde_json::{Value, json};

#[allow(clippy::print_stdout, reason = "a skipped test says so")]
/// The cached model file, or `None` after saying the test skipped (a failure under KVGATE_REQUIRE_MODEL=1).
fn model_file(test: &str) -> Option<PathBuf> {
    let path = llama::cached_model(
        std::env::var_os(llama::MODEL_DIR_ENV).as_deref(),
        std::env::var_os("HOME").as_deref(),
    );
    if path.is_none() {
        assert!(
            std::env::var(llama::REQUIRE_MODEL_ENV).as_deref() != Ok("1"),
            "{test}: the model file is missing and KVGATE_REQUIRE_MODEL=1; run `cargo xtask model`"
        );
        println!("{test}: skipped: no model file (run `cargo xtask model`)");
    }
    path
}

/// Options for a test server on a free port, keep-alives every 50 ms.
fn options(model: PathBuf) -> ServeOptions {
    let mut options = ServeOptions::new(model);
    options.addr = "127.0.0.1:0".into();
    options.keepalive = Duration::from_millis(50);
    options.shutdown_grace = Duration::from_secs(5);
    options
}

fn small_config() -> EngineConfig {
    let mut config = crate::verified_config();
    config.model.max_model_len = 4096;
    config
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A raw HTTP/1.0 exchange (the server then sends the body unchunked and closes): (status, head, body).
fn raw(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> (u16, String, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let head = format!(
        "{method} {path} HTTP/1.0\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    // A body the server refuses may be cut short: the server answers and closes without reading it all.
    let _ = stream.write_all(body);
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let text = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head.to_owned(), body.to_owned())
}

/// A bad-input case: what it is, the route, the body, the status and the `param` the error names.
type BadInput<'a> = (&'a str, &'a str, Vec<u8>, u16, Option<&'a str>);

fn post(addr: SocketAddr, path: &str, body: &Value) -> (u16, String, Value) {
    let (status, head, body) = raw(addr, "POST", path, body.to_string().as_bytes());
    (
        status,
        head,
        serde_json::from_str(&body).unwrap_or(Value::Null),
    )
}

fn chat(content: &str, max_tokens: u32) -> Value {
    json!({"model": kvgate::serve::MODEL_NAME, "messages": [{"role": "user", "content": content}],
           "max_tokens": max_tokens, "temperature": 0})
}

/// One metric's value from `/metrics` text (the first line starting with `name`).
fn metric(addr: SocketAddr, name: &str) -> f64 {
    let (_, _, text) = raw(addr, "GET", "/metrics", b"");
    text.lines()
        .find(|line| line.starts_with(name))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn serve_answers_chat_and_completions_with_usage() {
    let Some(model) = model_file("serve_answers_chat_and_completions_with_usage") else {
        return;
    };
    let server = Server::start(&small_config(), &options(model)).unwrap();
    let addr = server.local_addr();
    let (status, _, answer) = post(addr, "/v1/chat/completions", &chat("Hello there", 8));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["object"], "chat.completion");
    assert_eq!(answer["choices"][0]["message"]["role"], "assistant");
    assert_eq!(answer["choices"][0]["finish_reason"], "length");
    assert_eq!(answer["usage"]["completion_tokens"], 8);
    let prompt_tokens = answer["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt_tokens > 3, "{answer}");
    assert_eq!(
        answer["usage"]["total_tokens"].as_u64().unwrap(),
        prompt_tokens + 8
    );
    assert!(answer["usage"]["prompt_tokens_details"]["cached_tokens"].is_u64());

    let body =
        json!({"model": kvgate::serve::MODEL_NAME, "prompt": "Once upon a time", "max_tokens": 5});
    let (status, _, answer) = post(addr, "/v1/completions", &body);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["object"], "text_completion");
    assert!(answer["choices"][0]["text"].is_string());
    assert_eq!(answer["usage"]["completion_tokens"], 5);
    assert_eq!(answer["usage"]["prompt_tokens"], 4, "{answer}");

    let (status, _, body) = raw(addr, "GET", "/v1/models", b"");
    let models: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status, 200);
    assert_eq!(models["data"][0]["id"], kvgate::serve::MODEL_NAME);
    assert_eq!(models["data"][0]["executor"], "sim");
    assert_eq!(raw(addr, "GET", "/health", b"").0, 200);
    assert_eq!(
        metric(addr, "kvgate_requests_total{outcome=\"finished\"}"),
        2.0
    );
    assert_eq!(metric(addr, "kvgate_generation_tokens_total"), 13.0);
    assert_eq!(
        metric(addr, "kvgate_e2e_request_latency_seconds_count"),
        2.0
    );
    assert_eq!(
        metric(addr, "kvgate_time_to_first_token_seconds_count"),
        2.0
    );
    let report = server.shutdown().unwrap();
    assert_eq!(report.leaked_pages, 0);
}

#[test]
fn serve_streams_server_sent_events() {
    let Some(model) = model_file("serve_streams_server_sent_events") else {
        return;
    };
    let server = Server::start(&small_config(), &options(model)).unwrap();
    let addr = server.local_addr();
    let mut body = chat("Stream me a few tokens", 6);
    body["stream"] = json!(true);
    let (status, head, text) = raw(
        addr,
        "POST",
        "/v1/chat/completions",
        body.to_string().as_bytes(),
    );
    assert_eq!(status, 200);
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/event-stream"),
        "{head}"
    );
    assert!(text.ends_with("data: [DONE]\n\n"), "{text:?}");
    let events: Vec<&str> = text
        .split("\n\n")
        .filter(|event| !event.is_empty() && !event.starts_with(':'))
        .collect();
    assert!(
        events.iter().all(|event| event.starts_with("data: ")),
        "{events:?}"
    );
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|event| serde_json::from_str(&event["data: ".len()..]).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    let usage = &chunks[chunks.len() - 1];
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 6);
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert!(!text.is_empty());
    // The same through the client, which counts the pieces as they come.
    let answer = runtime().block_on(async {
        let client = ApiClient::new(&format!("http://{addr}")).unwrap();
        client.stream("/v1/chat/completions", &body).await.unwrap()
    });
    assert!(
        answer.done && answer.n_chunks >= 1 && answer.ttft_s.is_some(),
        "{answer:?}"
    );
    assert_eq!(
        answer.text, text,
        "greedy answers to the same chat are the same"
    );
    server.shutdown().unwrap();
}

#[test]
fn serve_refuses_bad_input_with_openai_errors() {
    let Some(model) = model_file("serve_refuses_bad_input_with_openai_errors") else {
        return;
    };
    let mut options = options(model);
    options.body_limit_bytes = 64 << 10;
    let server = Server::start(&small_config(), &options).unwrap();
    let addr = server.local_addr();
    let name = kvgate::serve::MODEL_NAME;
    let long_prompt: Vec<u32> = (0..4096).map(|i| 100 + i % 1000).collect();
    let cases: Vec<BadInput<'_>> = vec![
        ("malformed JSON", "/v1/chat/completions", b"{\"model\": ".to_vec(), 400, None),
        ("not an object", "/v1/chat/completions", b"[1, 2]".to_vec(), 400, None),
        ("messages not a list", "/v1/chat/completions",
         json!({"model": name, "messages": "hi"}).to_string().into_bytes(), 400, Some("messages")),
        ("max_tokens a string", "/v1/chat/completions",
         json!({"model": name, "messages": [{"role": "user", "content": "x"}], "max_tokens": "8"})
             .to_string().into_bytes(), 400, Some("max_tokens")),
        ("stream not a boolean", "/v1/completions",
         json!({"model": name, "prompt": "x", "stream": "yes"}).to_string().into_bytes(), 400, Some("stream")),
        ("unknown field", "/v1/chat/completions",
         json!({"model": name, "messages": [{"role": "user", "content": "x"}], "colour": 1})
             .to_string().into_bytes(), 400, Some("colour")),
        ("unknown role", "/v1/chat/completions",
         json!({"model": name, "messages": [{"role": "wizard", "content": "x"}]}).to_string().into_bytes(),
         400, Some("messages.[0].role")),
        ("unknown model", "/v1/chat/completions",
         json!({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}).to_string().into_bytes(),
         404, Some("model")),
        ("missing model", "/v1/completions", json!({"prompt": "x"}).to_string().into_bytes(), 400, Some("model")),
        ("max_tokens 0", "/v1/completions",
         json!({"model": name, "prompt": "x", "max_tokens": 0}).to_string().into_bytes(), 400, Some("max_tokens")),
        ("max_tokens negative", "/v1/completions",
         json!({"model": name, "prompt": "x", "max_tokens": -5}).to_string().into_bytes(), 400, Some("max_tokens")),
        ("max_tokens huge", "/v1/completions",
         json!({"model": name, "prompt": "x", "max_tokens": 1u64 << 40}).to_string().into_bytes(), 400,
         Some("max_tokens")),
        ("max_tokens past the context", "/v1/completions",
         json!({"model": name, "prompt": "x", "max_tokens": 5000}).to_string().into_bytes(), 400,
         Some("max_tokens")),
        ("prompt longer than the context", "/v1/completions",
         json!({"model": name, "prompt": long_prompt}).to_string().into_bytes(), 400, Some("prompt")),
        ("token id beyond the vocabulary", "/v1/completions",
         json!({"model": name, "prompt": [1, 999_999]}).to_string().into_bytes(), 400, Some("prompt")),
        ("n of 2", "/v1/completions",
         json!({"model": name, "prompt": "x", "n": 2}).to_string().into_bytes(), 400, Some("n")),
        ("temperature 3", "/v1/completions",
         json!({"model": name, "prompt": "x", "temperature": 3}).to_string().into_bytes(), 400,
         Some("temperature")),
        ("five stop sequences", "/v1/completions",
         json!({"model": name, "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}).to_string().into_bytes(),
         400, Some("stop")),
        ("empty messages", "/v1/chat/completions",
         json!({"model": name, "messages": []}).to_string().into_bytes(), 400, Some("messages")),
        ("body over the limit", "/v1/completions",
         json!({"model": name, "prompt": "x ".repeat(40_000)}).to_string().into_bytes(), 413, None),
        ("unknown route", "/v1/embeddings", b"{}".to_vec(), 404, None),
    ];
    for (what, path, body, status, param) in cases {
        let (got, _, text) = raw(addr, "POST", path, &body);
        assert_eq!(got, status, "{what}: {text}");
        let error: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{what}: {e}: {text}"));
        let error = &error["error"];
        assert!(
            error["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}: {error}"
        );
        assert!(error["type"].is_string(), "{what}: {error}");
        assert!(
            error.get("param").is_some() && error.get("code").is_some(),
            "{what}: {error}"
        );
        if let Some(param) = param {
            assert_eq!(error["param"], param, "{what}: {error}");
        }
        // The server goes on.
        assert_eq!(raw(addr, "GET", "/health", b"").0, 200, "after {what}");
    }
    let (status, _, answer) = post(addr, "/v1/chat/completions", &chat("still here?", 2));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(server.shutdown().unwrap().leaked_pages, 0);
}

#[test]
fn serve_refuses_requests_past_the_in_flight_limit_with_retry_after() {
    let Some(model) =
        model_file("serve_refuses_requests_past_the_in_flight_limit_with_retry_after")
    else {
        return;
    };
    let mut options = options(model);
    options.max_in_flight = 1;
    let server = Server::start(&small_config(), &options).unwrap();
    let addr = server.local_addr();
    // A long streamed answer holds the one slot while the second request arrives.
    let mut long = chat("a long answer please", 2000);
    long["stream"] = json!(true);
    let mut stream = TcpStream::connect(addr).unwrap();
    let body = long.to_string();
    write!(
        stream,
        "POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut first = [0u8; 64];
    stream.read_exact(&mut first).unwrap();
    let (status, head, error) = post(addr, "/v1/chat/completions", &chat("me too", 2));
    assert_eq!(status, 429, "{error}");
    assert!(
        head.to_ascii_lowercase().contains("retry-after: 1"),
        "{head}"
    );
    assert_eq!(error["error"]["type"], "rate_limit_error");
    assert_eq!(
        metric(addr, "kvgate_requests_refused_total{outcome=\"429\"}"),
        1.0
    );
    drop(stream);
    // The slot comes back once the disconnected stream is cancelled.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, _, answer) = post(addr, "/v1/chat/completions", &chat("me too", 2));
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "still refused: {answer}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(server.shutdown().unwrap().leaked_pages, 0);
}

#[test]
fn serve_disconnect_mid_restore_frees_pages_only_after_the_copy_drained() {
    let test = "serve_disconnect_mid_restore_frees_pages_only_after_the_copy_drained";
    let Some(model) = model_file(test) else {
        return;
    };
    let mut config = small_config();
    config.pool.pages = 64;
    let mut options = options(model);
    options.copy_delay = Duration::from_secs(2);
    let server = Server::start(&config, &options).unwrap();
    let addr = server.local_addr();
    let name = kvgate::serve::MODEL_NAME;
    let session: Vec<u32> = (0..600).map(|i| 1000 + i % 500).collect();
    let other: Vec<u32> = (0..900).map(|i| 3000 + i % 700).collect();
    for prompt in [&session, &other] {
        let body = json!({"model": name, "prompt": prompt, "max_tokens": 4});
        let (status, _, answer) = post(addr, "/v1/completions", &body);
        assert_eq!(status, 200, "{answer}");
    }
    // The session's next turn: its prefix was evicted by the other prompt and comes back from the store
    // through a slow copy.
    let mut next = session.clone();
    next.extend((0..48).map(|i| 2000 + i));
    let body = json!({"model": name, "prompt": next, "max_tokens": 64, "stream": true}).to_string();
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut first = [0u8; 64];
    stream.read_exact(&mut first).unwrap();
    let copies = "kvgate_copies_in_flight{";
    let free = "kvgate_pool_pages{policy=\"reserved\",state=\"free\"}";
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(addr, copies) < 1.0 {
        assert!(
            Instant::now() < deadline,
            "{test}: the restore never copied"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let free_at_cancel = metric(addr, free);
    drop(stream);
    let mut polls_during_copy = 0;
    while metric(addr, copies) >= 1.0 {
        // Each scrape is a separate request and the engine steps between them: a count of free pages is
        // judged only when a later scrape still shows the copy in flight (the engine sets the copy gauge
        // before the pool's, and a drained copy never comes back).
        let free_now = metric(addr, free);
        assert!(
            free_now <= free_at_cancel || metric(addr, copies) < 1.0,
            "{test}: pages came back while the copy into them was in flight"
        );
        polls_during_copy += 1;
        assert!(
            Instant::now() < deadline + Duration::from_secs(10),
            "{test}: the copy never drained"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        polls_during_copy > 0,
        "{test}: the copy drained before the client went away"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(addr, "kvgate_requests_total{outcome=\"cancelled\"}") < 1.0 {
        assert!(
            Instant::now() < deadline,
            "{test}: the request was never cancelled"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        metric(addr, free) > free_at_cancel,
        "{test}: the pages never came back"
    );
    assert_eq!(server.shutdown().unwrap().leaked_pages, 0);
}

#[test]
fn serve_under_concurrent_streamed_sessions_counts_what_the_clients_count() {
    let test = "serve_under_concurrent_streamed_sessions_counts_what_the_clients_count";
    let Some(model) = model_file(test) else {
        return;
    };
    let mut options = options(model);
    options.max_in_flight = 8;
    let server = Server::start(&small_config(), &options).unwrap();
    let addr = server.local_addr();
    let spec = kvgate::workload::agents::AgentsSpec {
        n_agents: 16,
        turns: 3,
        first_prompt_tokens: 200,
        turn_input_tokens: 20,
        response_tokens: 16,
        think_s: 0.05,
        ..Default::default()
    };
    let run = kvgate::serve::remote_agents::run_remote_agents(
        &format!("http://{addr}"),
        &spec,
        None,
        Some(Duration::from_secs(120)),
    )
    .unwrap();
    let table = kvgate::serve::remote_agents::table(&run);
    assert!(run.failures.is_empty(), "{table}");
    assert_eq!(run.turns.len(), 48, "{table}");
    assert!(run.turns.iter().all(|t| t.has_usage), "{table}");
    let output: u64 = run.turns.iter().map(|t| t.completion_tokens).sum();
    assert_eq!(run.server_counts, Some((48, output)), "{table}");
    // Later turns resend their history: most of it comes from the prefix cache.
    for turn in run.turns.iter().filter(|t| t.turn > 0) {
        assert!(
            turn.cached_tokens * 2 > turn.prompt_tokens,
            "{turn:?}\n{table}"
        );
    }
    let refused = metric(addr, "kvgate_requests_refused_total{outcome=\"429\"}");
    assert_eq!(refused as u64, run.refused, "{table}");
    let report = server.shutdown().unwrap();
    assert_eq!(report.leaked_pages, 0);
}

#[test]
fn serve_binary_drains_and_exits_0_on_sigterm() {
    let test = "serve_binary_drains_and_exits_0_on_sigterm";
    let Some(_) = model_file(test) else {
        return;
    };
    use std::io::BufRead;
    let mut child = std::process::Command::new(crate::kvgate_exe())
        .args(["serve", "--addr", "127.0.0.1:0", "--shutdown-grace-s", "3"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    // The address is on the line that says it is serving (a log line may come first).
    let mut line = String::new();
    while !line.contains("serving") {
        line.clear();
        if stderr.read_line(&mut line).unwrap() == 0 {
            break;
        }
    }
    let addr: SocketAddr = line
        .trim()
        .rsplit("http://")
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("{test}: no address in {line:?}"));
    // A stream longer than the grace time: cancelled at shutdown, its stream closed properly.
    let body = {
        let mut body = chat("talk for a long time", 4000);
        body["stream"] = json!(true);
        body.to_string()
    };
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut first = [0u8; 64];
    stream.read_exact(&mut first).unwrap();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    // While the running stream has its grace time, new requests are refused with 503 and Retry-After.
    let deadline = Instant::now() + Duration::from_secs(2);
    while raw(addr, "GET", "/health", b"").0 != 503 {
        assert!(
            Instant::now() < deadline,
            "{test}: /health never said it is shutting down"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let (status, head, error) = post(addr, "/v1/chat/completions", &chat("too late", 2));
    assert_eq!(status, 503, "{error}");
    assert!(
        head.to_ascii_lowercase().contains("retry-after: 1"),
        "{head}"
    );
    assert_eq!(error["error"]["type"], "server_error");
    let mut rest = String::new();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let _ = stream.read_to_string(&mut rest);
    assert!(
        rest.contains("\"finish_reason\":\"abort\""),
        "{test}: {rest:?}"
    );
    assert!(rest.ends_with("data: [DONE]\n\n"), "{test}: {rest:?}");
    let exit = child.wait().unwrap();
    let mut tail = String::new();
    let _ = stderr.read_to_string(&mut tail);
    assert!(exit.success(), "{test}: {exit:?} {tail}");
    assert!(
        tail.contains("1 request(s) cancelled") && tail.contains("0 leaked pages"),
        "{tail}"
    );
}

#[test]
fn serve_ends_the_answer_before_a_stop_sequence() {
    let Some(model) = model_file("serve_ends_the_answer_before_a_stop_sequence") else {
        return;
    };
    let server = Server::start(&small_config(), &options(model)).unwrap();
    let addr = server.local_addr();
    let (status, _, whole) = post(addr, "/v1/chat/completions", &chat("say something", 24));
    assert_eq!(status, 200, "{whole}");
    let text = whole["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    // A stop sequence from the middle of the greedy answer: the same chat now ends just before it.
    let chars: Vec<char> = text.chars().collect();
    assert!(chars.len() >= 8, "{text:?}");
    let start = chars.len() / 2;
    let stop: String = chars[start..start + 3].iter().collect();
    let before = &text[..text.find(&stop).unwrap()];
    let mut completion_tokens = whole["usage"]["completion_tokens"].as_u64().unwrap();
    for stream in [false, true] {
        let mut body = chat("say something", 24);
        body["stop"] = json!([stop]);
        body["stream"] = json!(stream);
        let (got, finish, usage) = if stream {
            let answer = runtime().block_on(async {
                let client = ApiClient::new(&format!("http://{addr}")).unwrap();
                client.stream("/v1/chat/completions", &body).await.unwrap()
            });
            (
                answer.text.clone(),
                answer.finish_reason.clone().unwrap(),
                answer.usage.clone().unwrap(),
            )
        } else {
            let (_, _, answer) = post(addr, "/v1/chat/completions", &body);
            let choice = &answer["choices"][0];
            (
                choice["message"]["content"].as_str().unwrap().to_owned(),
                choice["finish_reason"].as_str().unwrap().to_owned(),
                answer["usage"].clone(),
            )
        };
        assert_eq!(got, before, "stream {stream}: stop {stop:?} in {text:?}");
        assert_eq!(finish, "stop", "stream {stream}");
        assert!(
            usage["completion_tokens"].as_u64().unwrap() < 24,
            "stream {stream}: {usage}"
        );
        completion_tokens += usage["completion_tokens"].as_u64().unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    // An answer that ended at a stop sequence finished: `/metrics` counts it so, with the tokens its
    // `usage` gave, not the ones the engine made before the stop reached it.
    while metric(addr, "kvgate_requests_total{outcome=\"finished\"}") < 3.0 {
        assert!(
            Instant::now() < deadline,
            "the stopped requests were not ended in the engine"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        metric(addr, "kvgate_requests_total{outcome=\"cancelled\"}"),
        0.0
    );
    assert_eq!(
        metric(addr, "kvgate_generation_tokens_total"),
        completion_tokens as f64
    );
    assert_eq!(server.shutdown().unwrap().leaked_pages, 0);
}

#[test]
fn agents_target_refuses_engine_options_and_other_schemes() {
    let run = |args: &[&str]| {
        let output = std::process::Command::new(crate::kvgate_exe())
            .args(args)
            .output()
            .unwrap();
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (ok, stderr) = run(&[
        "agents",
        "--target",
        "http://127.0.0.1:1",
        "--policy",
        "reserved",
    ]);
    assert!(
        !ok && stderr.contains("--policy with --target is invalid"),
        "{stderr}"
    );
    let (ok, stderr) = run(&["agents", "--target", "ftp://127.0.0.1:1"]);
    assert!(
        !ok && stderr.contains("the target must be http://HOST:PORT"),
        "{stderr}"
    );
    let (ok, stderr) = run(&[
        "agents",
        "--target",
        "http://127.0.0.1:1",
        "--duration-s",
        "0",
    ]);
    assert!(
        !ok && stderr.contains("--duration-s 0 is invalid"),
        "{stderr}"
    );
    let (ok, stderr) = run(&[
        "agents",
        "--target",
        "http://127.0.0.1:1",
        "--agents",
        "1",
        "--turns",
        "1",
    ]);
    assert!(
        !ok && stderr.contains("client:"),
        "a server that is not there: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// What the model itself answers to `messages` outside any server: the chat template, then greedy tokens
/// (llama crate) until its end of turn or `max_tokens`: (prompt tokens, text, completion tokens, finish
/// reason).
fn greedy_outside(
    model: &kvgate::model::LoadedModel,
    messages: &[(&str, String)],
    max_tokens: usize,
) -> (usize, String, usize, &'static str) {
    let chat: Vec<llama::ChatMessage> = messages
        .iter()
        .map(|(role, content)| llama::ChatMessage::new(role, content))
        .collect();
    let prompt = model.tokenizer.encode_chat(&chat).unwrap();
    let config = model.llama.config();
    let mut kv =
        llama::ContiguousKv::new(config.layers, config.kv_dim(), prompt.len() + max_tokens);
    let tokenizer = &model.tokenizer;
    let generation = llama::generate_greedy(&model.llama, &mut kv, &prompt, 64, max_tokens, &|t| {
        tokenizer.is_end_of_turn(t)
    })
    .unwrap();
    let shown = if generation.stopped {
        &generation.tokens[..generation.tokens.len() - 1]
    } else {
        &generation.tokens[..]
    };
    let text = tokenizer.decode(shown).unwrap();
    let finish = if generation.stopped { "stop" } else { "length" };
    (prompt.len(), text, generation.tokens.len(), finish)
}

fn messages_json(messages: &[(&str, String)]) -> Value {
    messages
        .iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect()
}

#[test]
fn serve_model_answers_a_two_turn_chat_as_the_model_greedily_does() {
    let test = "serve_model_answers_a_two_turn_chat_as_the_model_greedily_does";
    let Some(path) = model_file(test) else {
        return;
    };
    let model = kvgate::model::LoadedModel::load(&path).unwrap();
    let mut config = crate::verified_config();
    config.pool.pages = 32;
    let mut options = options(path);
    options.executor = kvgate::serve::ExecutorKind::Model;
    let server = Server::start(&config, &options).unwrap();
    let addr = server.local_addr();
    let (_, _, body) = raw(addr, "GET", "/v1/models", b"");
    let models: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(models["data"][0]["id"], kvgate::serve::MODEL_NAME);
    assert_eq!(models["data"][0]["executor"], "model");

    let max_tokens = 12;
    let mut messages = vec![
        ("system", "Answer in one short sentence.".to_owned()),
        ("user", "What is a cache?".to_owned()),
    ];
    let mut cached = Vec::new();
    for turn in 0..2 {
        let (prompt_len, text, completion, finish) =
            greedy_outside(&model, &messages, max_tokens as usize);
        let body = json!({"model": kvgate::serve::MODEL_NAME, "messages": messages_json(&messages),
                          "max_tokens": max_tokens, "temperature": 0, "stream": true,
                          "stream_options": {"include_usage": true}});
        let client = ApiClient::new(&format!("http://{addr}")).unwrap();
        let answer = runtime()
            .block_on(client.stream("/v1/chat/completions", &body))
            .unwrap();
        assert_eq!(answer.status, 200, "turn {turn}: {answer:?}");
        assert!(answer.done, "turn {turn}: {answer:?}");
        assert_eq!(answer.text, text, "turn {turn}: the server's text");
        assert_eq!(answer.finish_reason.as_deref(), Some(finish), "turn {turn}");
        assert_eq!(answer.prompt_tokens(), prompt_len as u64, "turn {turn}");
        assert_eq!(answer.completion_tokens(), completion as u64, "turn {turn}");
        cached.push(answer.cached_tokens());
        messages.push(("assistant", text));
        messages.push(("user", "Say it more simply.".to_owned()));
    }
    assert!(
        cached[1] > cached[0] && cached[1] >= 16,
        "cached_tokens over the turns: {cached:?}"
    );

    // A stop string cuts the (greedy, so known) text before it, and the answer stopped.
    let first = messages[..2].to_vec();
    let (_, text, _, _) = greedy_outside(&model, &first, max_tokens as usize);
    let cut = text.char_indices().nth(text.chars().count() / 2).unwrap().0;
    let stop: String = text[cut..].chars().take(3).collect();
    let at = text.find(&stop).unwrap();
    let body = json!({"model": kvgate::serve::MODEL_NAME, "messages": messages_json(&first),
                      "max_tokens": max_tokens, "temperature": 0, "stop": [stop]});
    let (status, _, answer) = post(addr, "/v1/chat/completions", &body);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["choices"][0]["message"]["content"], text[..at]);
    assert_eq!(answer["choices"][0]["finish_reason"], "stop");

    // Sampling with a seed gives the same answer each time.
    let sampled = |seed: u64| {
        let body = json!({"model": kvgate::serve::MODEL_NAME, "messages": messages_json(&first),
                          "max_tokens": 6, "temperature": 1.0, "seed": seed});
        let (status, _, answer) = post(addr, "/v1/chat/completions", &body);
        assert_eq!(status, 200, "{answer}");
        answer["choices"][0]["message"]["content"].clone()
    };
    assert_eq!(sampled(11), sampled(11));
    let report = server.shutdown().unwrap();
    assert_eq!(report.leaked_pages, 0);
}
