//! Request parsing: every field's bad values are 400s naming the parameter; good requests parse whole.

use serde_json::{Value, json};

use super::api::{GenRequest, Prompt, parse_chat, parse_completion};

const MODEL: &str = "m";

fn chat(extra: &Value) -> Value {
    let mut body = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]});
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    body
}

fn completion(extra: &Value) -> Value {
    let mut body = json!({"model": MODEL, "prompt": "hi"});
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    body
}

/// `body` is refused with a 400 naming `param`.
fn check_refused(
    parse: fn(&[u8]) -> Result<GenRequest, super::error::ApiError>,
    body: &Value,
    param: &str,
) {
    let error = parse(body.to_string().as_bytes()).expect_err(&body.to_string());
    assert_eq!(error.status.as_u16(), 400, "{body}: {error}");
    assert_eq!(error.param.as_deref(), Some(param), "{body}: {error}");
    assert!(!error.message.is_empty());
}

#[test]
fn chat_fields_out_of_range_or_of_the_wrong_type_are_refused_naming_the_field() {
    for (extra, param) in [
        (json!({"seed": "7"}), "seed"),
        (json!({"stop": 5}), "stop"),
        (json!({"stop": ["ok", 5]}), "stop"),
        (json!({"stop": [""]}), "stop"),
        (json!({"temperature": "hot"}), "temperature"),
        (json!({"temperature": -0.1}), "temperature"),
        (json!({"n": "one"}), "n"),
        (json!({"stream_options": true}), "stream_options"),
        (json!({"tools": [{"type": "function"}]}), "tools"),
        (json!({"logprobs": true}), "logprobs"),
        (json!({"max_completion_tokens": 0}), "max_tokens"),
        (json!({"model": 5}), "model"),
        (json!({"messages": [5]}), "messages.[0]"),
        (
            json!({"messages": [{"role": "user"}]}),
            "messages.[0].content",
        ),
        (json!({"messages": [{"content": "x"}]}), "messages.[0].role"),
        (
            json!({"messages": [{"role": "user", "content": "x", "mood": 1}]}),
            "messages.[0].mood",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            "messages.[0].content",
        ),
    ] {
        check_refused(parse_chat, &chat(&extra), param);
    }
}

#[test]
fn completion_fields_chat_does_not_have_are_checked_too() {
    for (extra, param) in [
        (json!({"echo": true}), "echo"),
        (json!({"best_of": 2}), "best_of"),
        (json!({"suffix": "x"}), "suffix"),
        (json!({"prompt": ["a", "b"]}), "prompt"),
        (json!({"prompt": []}), "prompt"),
        (json!({"prompt": [1, 1u64 << 40]}), "prompt"),
        (json!({"prompt": 5}), "prompt"),
        (json!({"messages": []}), "messages"),
    ] {
        check_refused(parse_completion, &completion(&extra), param);
    }
}

#[test]
fn good_requests_parse_whole() {
    let body = chat(&json!({
        "messages": [{"role": "system", "content": "be brief"},
                     {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                     {"role": "assistant", "content": null}],
        "max_tokens": 7, "temperature": 0, "seed": -3, "stop": "END", "stream": true, "n": 1,
        "top_p": 0.5, "user": "u", "stream_options": {"include_usage": true},
    }));
    let request = parse_chat(body.to_string().as_bytes()).unwrap();
    assert_eq!(
        request,
        GenRequest {
            model: MODEL.into(),
            prompt: Prompt::Chat(vec![
                ("system".into(), "be brief".into()),
                ("user".into(), "ab".into()),
                ("assistant".into(), String::new()),
            ]),
            max_tokens: Some(7),
            temperature: 0.0,
            seed: Some(-3),
            stop: vec!["END".into()],
            stream: true,
        }
    );
    let request = parse_completion(
        completion(&json!({"prompt": [1, 2, 3]}))
            .to_string()
            .as_bytes(),
    )
    .unwrap();
    assert_eq!(request.prompt, Prompt::Tokens(vec![1, 2, 3]));
    assert_eq!((request.max_tokens, request.stream), (None, false));
}
