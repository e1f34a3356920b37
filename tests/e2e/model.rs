//! L4 on real weights (issue 29, item 6): the chat sessions on SmolLM2-135M-Instruct under every policy,
//! several requests in one batch, restores verified byte for byte against recompute, and every answer equal
//! to the model's own greedy answer computed alone (batch of one, contiguous KV, no engine). A kernel whose
//! bits depend on the batch, or a restore that feeds the model other keys and values, changes a token or a
//! page. Skips, saying so, without the cached model (`cargo xtask model`), unless `KVGATE_REQUIRE_MODEL=1`.
#![allow(clippy::print_stderr, reason = "the test says when it skips")]

use std::sync::Arc;

use engine::Policy;
use kvgate::model::{LoadedModel, ModelExecutor};
use kvgate::run::{self, ChatSpec, Observer};
use kvgate::{Engine, StepReport};
use llama::{ContiguousKv, MODEL_DIR_ENV, REQUIRE_MODEL_ENV};

fn model(test: &str) -> Option<Arc<LoadedModel>> {
    let dir = std::env::var_os(MODEL_DIR_ENV);
    let home = std::env::var_os("HOME");
    match llama::cached_model(dir.as_deref(), home.as_deref()) {
        Some(path) => Some(LoadedModel::load(&path).expect("the cached model loads")),
        None if std::env::var(REQUIRE_MODEL_ENV).as_deref() == Ok("1") => {
            panic!("{REQUIRE_MODEL_ENV}=1 but no cached model: run `cargo xtask model`")
        }
        None => {
            eprintln!("{test}: skipped: no cached model (run `cargo xtask model`)");
            None
        }
    }
}

/// The largest number of requests any step computed together.
#[derive(Default)]
struct LargestBatch(usize);

impl Observer<ModelExecutor> for LargestBatch {
    fn step(&mut self, _engine: &Engine<ModelExecutor>, report: &StepReport) {
        self.0 = self.0.max(report.prefills.len() + report.decodes.len());
    }
}

#[test]
fn l4_on_real_weights_every_policy_restores_exact_pages_and_answers_as_the_model_alone() {
    let Some(model) = model("l4_on_real_weights") else {
        return;
    };
    let spec = ChatSpec {
        n_agents: 4,
        turns: 2,
        answer_tokens: 4,
        think_s: 0.5,
    };
    let mut config = crate::verified_config();
    // 12 pages of 16 tokens: two chats run at once (the system prompt's 2 pages shared, ~5 pages each of
    // their own); the other two, admitted as they finish, evict their pages, so their second turns
    // restore from the store.
    config.pool.pages = 12;
    let mut expected = None;
    for policy in Policy::ALL {
        let mut batch = LargestBatch::default();
        let chat = run::run_chats_live(&config, &spec, &model, policy, &mut |_, _| {}, &mut batch)
            .unwrap_or_else(|e| panic!("{policy}: {e}"));
        let metrics = &chat.metrics;
        assert_eq!(metrics.leaked_pages, 0, "{policy}");
        assert_eq!(chat.answers.len(), 8, "{policy}: {:?}", chat.answers);
        assert!(batch.0 >= 2, "{policy}: no step computed several requests");
        if matches!(policy, Policy::Reserved) {
            assert!(metrics.prompt_tokens_restored > 0, "{policy}: {metrics:?}");
            assert!(!chat.verify.is_zero(), "{policy}: nothing verified");
        }
        let expected = expected.get_or_insert_with(|| alone(&model, &spec));
        assert_eq!(
            &chat.answers, expected,
            "{policy}: answers differ from the model alone"
        );
    }
}

/// Every turn's answer computed by the model alone: one sequence at a time, contiguous KV, greedy.
fn alone(model: &LoadedModel, spec: &ChatSpec) -> std::collections::BTreeMap<(u32, u32), Vec<u32>> {
    let config = model.llama.config();
    let mut answers = std::collections::BTreeMap::new();
    for agent in 0..spec.n_agents {
        let mut context = run::first_prompt(model, spec, agent).unwrap();
        for turn in 0..spec.turns {
            let mut kv = ContiguousKv::new(config.layers, config.kv_dim(), context.len() + 16);
            let answer = llama::generate_greedy(
                &model.llama,
                &mut kv,
                &context,
                64,
                spec.answer_tokens as usize,
                &|_| false,
            )
            .unwrap()
            .tokens;
            let next = (turn + 1 < spec.turns).then(|| spec.question(agent, turn + 1));
            run::extend_chat(model, &mut context, &answer, next).unwrap();
            answers.insert((agent, turn), answer);
        }
    }
    answers
}

#[test]
fn the_model_executor_refuses_another_geometry_draft_tokens_saved_logits_and_unknown_tokens() {
    use engine::Executor as _;
    let Some(model) = model("the_model_executor_refuses") else {
        return;
    };
    let executor = ModelExecutor::new(Arc::clone(&model), kvgate::model::VerifyTime::default());
    let config = crate::verified_config();
    let params = run::model_params(&config, &model, Policy::Reserved).unwrap();
    executor.check_params(&params).unwrap();
    let layout_bytes = model.layout().bytes_per_page() as u64;
    let group = |kind| kvgate::CacheGroup {
        kind,
        bytes_per_page: layout_bytes,
    };
    let cases = [
        (
            kvgate::Geometry::new(vec![group(kvgate::GroupKind::Full)], 32, 1, 1024).unwrap(),
            0,
            "32 tokens per page",
        ),
        (
            kvgate::Geometry::new(vec![group(kvgate::GroupKind::Full)], 16, 2, 1024).unwrap(),
            0,
            "2 context-parallel ranks",
        ),
        (params.geometry.clone(), 2, "2 draft tokens"),
    ];
    for (geometry, draft_tokens, what) in cases {
        let mut bad = params.clone();
        bad.geometry = geometry;
        bad.draft_tokens = draft_tokens;
        let err = executor.check_params(&bad).unwrap_err().to_string();
        assert!(err.contains(what), "{what}: {err}");
    }
    let vocab = model.llama.config().vocab as u32;
    let spec = kvgate::RequestSpec::new(1, vec![1, vocab], 4, kvgate::Timestamp::ZERO);
    let err = executor.check_request(&spec).unwrap_err().to_string();
    assert!(err.contains("outside the model's vocabulary"), "{err}");
    let mut spec = kvgate::RequestSpec::new(1, vec![1, 2], 4, kvgate::Timestamp::ZERO);
    spec.saved_logits = true;
    let err = executor.check_request(&spec).unwrap_err().to_string();
    assert!(err.contains("saved logits"), "{err}");
}
