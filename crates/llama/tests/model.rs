//! Tests on the real model, SmolLM2-135M-Instruct Q4_1 (skipped without it; `cargo xtask model` fetches
//! it, and `KVGATE_REQUIRE_MODEL=1` makes its absence a failure).

mod common;

use llama::{ChatMessage, ContiguousKv, generate_greedy};

#[test]
fn the_model_file_has_smollm2_hyperparameters() {
    let Some((model, _)) = common::model("the_model_file_has_smollm2_hyperparameters") else {
        return;
    };
    let c = model.config();
    assert_eq!(
        (
            c.layers,
            c.embedding,
            c.feed_forward,
            c.heads,
            c.kv_heads,
            c.head_dim,
            c.vocab
        ),
        (30, 576, 1536, 9, 3, 64, 49152)
    );
    assert_eq!((c.rope_base, c.rms_eps, c.context), (100_000.0, 1e-5, 8192));
    assert!(c.tied_embeddings);
}

#[test]
fn a_greedy_chat_answer_stops_at_the_end_of_its_turn() {
    let Some((model, tok)) = common::model("a_greedy_chat_answer_stops_at_the_end_of_its_turn")
    else {
        return;
    };
    let c = model.config();
    let prompt = tok
        .encode_chat(&[ChatMessage::new("user", "Say hello.")])
        .unwrap();
    let mut kv = ContiguousKv::new(c.layers, c.kv_dim(), 256);
    let out = generate_greedy(model, &mut kv, &prompt, 64, 96, &|t| tok.is_end_of_turn(t)).unwrap();
    assert!(out.stopped, "{:?}", tok.decode(&out.tokens));
    assert_eq!(out.tokens.last(), Some(&tok.end_of_turn()));
}
