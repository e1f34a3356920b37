//! The real model against llama.cpp (issue 29, item 5): token ids and greedy continuations recorded by
//! `scripts/llama_cpp_vectors.py` (llama-cpp-python, same `.gguf`; `docs/model.md`) in
//! `llama_cpp_vectors.json`. Tokenization and the rendered chat prompts must be identical. Greedy
//! continuations: the target is 32 identical tokens per chat, which this model does not reach (see
//! `docs/model.md`: llama.cpp's AVX2 kernels sum in another float order, and the 8-bit activation
//! quantization of every product turns last-bit differences into logit differences of up to about 1.3);
//! the test asserts what holds: up to the first divergence every logit among llama.cpp's top five is within
//! `LOGIT_TOLERANCE` of ours, and a continuation diverges only where llama.cpp's own choice was a near-tie
//! (its top logit within `NEAR_TIE` of our choice's). It prints how far each chat agrees. The chats run as
//! one batch. Skipped without the cached model.

mod common;

use llama::{ChatMessage, ContiguousKv, Entry, argmax};
use serde_json::Value;

/// Largest difference allowed between our logit and llama.cpp's, over its top five, up to the first
/// divergence (observed: 1.34).
const LOGIT_TOLERANCE: f32 = 2.0;
/// Largest margin of llama.cpp's choice over ours (in its own logits) at a divergence (observed: 0.20).
const NEAR_TIE: f32 = 0.5;

fn vectors() -> Value {
    serde_json::from_str(include_str!("llama_cpp_vectors.json")).expect("the vectors are JSON")
}

fn ids(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .expect("an array of ids")
        .iter()
        .map(|v| v.as_u64().expect("an id") as u32)
        .collect()
}

#[test]
fn tokenization_matches_llama_cpp() {
    let Some((_, tok)) = common::model("tokenization_matches_llama_cpp") else {
        return;
    };
    let vectors = vectors();
    let mut failures = Vec::new();
    for case in vectors["strings"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let expected = ids(&case["ids"]);
        let got = tok.encode(text).unwrap();
        if got != expected {
            failures.push(format!(
                "{text:?}:\n  llama.cpp {expected:?}\n  ours      {got:?}"
            ));
        }
        assert_eq!(tok.decode(&got).unwrap(), text, "decoding round-trips");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn greedy_continuations_match_llama_cpp() {
    let Some((model, tok)) = common::model("greedy_continuations_match_llama_cpp") else {
        return;
    };
    let vectors = vectors();
    let chats = vectors["chats"].as_array().unwrap();
    let c = model.config();
    let mut prompts = Vec::new();
    for chat in chats {
        let messages: Vec<ChatMessage> = chat["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
            .collect();
        let rendered = tok.render_chat(&messages, true);
        assert_eq!(
            rendered,
            chat["prompt"].as_str().unwrap(),
            "the chat template"
        );
        let prompt = tok.encode_chat(&messages).unwrap();
        assert_eq!(prompt, ids(&chat["prompt_ids"]), "the prompt's ids");
        prompts.push(prompt);
    }
    let steps = ids(&chats[0]["continuation"]).len();
    let mut stores: Vec<ContiguousKv> = prompts
        .iter()
        .map(|p| ContiguousKv::new(c.layers, c.kv_dim(), p.len() + steps))
        .collect();
    // Every step's logits of every chat, the prompts prefilled together, then decoded together.
    let mut logits: Vec<Vec<Vec<f32>>> = vec![Vec::new(); prompts.len()];
    let mut batch: Vec<Entry<'_>> = prompts
        .iter()
        .zip(stores.iter_mut())
        .map(|(p, kv)| Entry {
            tokens: p,
            kv,
            want_logits: true,
        })
        .collect();
    for (l, out) in logits.iter_mut().zip(model.forward(&mut batch).unwrap()) {
        l.push(out.unwrap());
    }
    drop(batch);
    let mut ours: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    for step in 0..steps {
        let next: Vec<[u32; 1]> = logits
            .iter()
            .map(|l| [argmax(l.last().unwrap()).unwrap()])
            .collect();
        for (o, n) in ours.iter_mut().zip(&next) {
            o.push(n[0]);
        }
        if step + 1 == steps {
            break;
        }
        let mut batch: Vec<Entry<'_>> = stores
            .iter_mut()
            .zip(&next)
            .map(|(kv, t)| Entry {
                tokens: t,
                kv,
                want_logits: true,
            })
            .collect();
        for (l, out) in logits.iter_mut().zip(model.forward(&mut batch).unwrap()) {
            l.push(out.unwrap());
        }
    }
    let mut report = Vec::new();
    let mut problems = Vec::new();
    for (i, chat) in chats.iter().enumerate() {
        let theirs = ids(&chat["continuation"]);
        let agree = theirs
            .iter()
            .zip(&ours[i])
            .take_while(|(a, b)| a == b)
            .count();
        // The largest difference over llama.cpp's top logits, at each step up to the first divergence.
        let top = chat["top_logits"].as_array().unwrap();
        let mut max_diff = 0.0f32;
        for (step, l) in logits[i].iter().enumerate().take((agree + 1).min(steps)) {
            for pair in top[step].as_array().unwrap() {
                let id = pair[0].as_u64().unwrap() as usize;
                let value = pair[1].as_f64().unwrap() as f32;
                max_diff = max_diff.max((l[id] - value).abs());
            }
        }
        let mut line = format!(
            "chat {i}: {agree}/{steps} greedy tokens agree; largest top-5 logit difference up to there \
             {max_diff:.4}"
        );
        if agree < steps {
            let pairs = top[agree].as_array().unwrap();
            let (a, b) = (theirs[agree] as usize, ours[i][agree] as usize);
            let value = |id: usize| {
                pairs
                    .iter()
                    .find(|p| p[0].as_u64() == Some(id as u64))
                    .map(|p| p[1].as_f64().unwrap() as f32)
            };
            let l = &logits[i][agree];
            match (value(a), value(b)) {
                (Some(va), Some(vb)) if va - vb <= NEAR_TIE => {}
                _ => problems.push(format!(
                    "chat {i} diverges at step {agree} away from a near-tie"
                )),
            }
            line.push_str(&format!(
                "; at step {agree} llama.cpp chose {a} ({:?}, ours {:.4}), we chose {b} ({:?}, ours {:.4})",
                value(a),
                l[a],
                value(b),
                l[b]
            ));
        }
        if max_diff > LOGIT_TOLERANCE {
            problems.push(format!("chat {i}: logit difference {max_diff}"));
        }
        report.push(line);
    }
    #[allow(
        clippy::print_stderr,
        reason = "the test reports how far each chat agrees"
    )]
    {
        eprintln!("{}", report.join("\n"));
    }
    assert!(problems.is_empty(), "{problems:?}\n{}", report.join("\n"));
}
