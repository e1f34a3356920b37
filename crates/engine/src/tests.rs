//! Unit tests of the engine's parts that stand alone: policies, the cost model, page content, output tokens,
//! metric aggregation and the parameters' limits.

use std::time::Duration;

use kv_pool::BlockKey;
use kv_pool::{RequestId, Timestamp};

use crate::executor::{
    CostModel, DecodeWork, Executor, PageTables, PrefillWork, SimExecutor, StepBatch, page_content,
};
use crate::metrics::{FallbackReason, RequestMetrics, RunMetrics};
use crate::{EngineParams, Error, Policy, output_token};

#[test]
fn policy_names_round_trip_and_unknown_names_are_errors() {
    for policy in Policy::ALL {
        assert_eq!(policy.name().parse::<Policy>().unwrap(), policy);
    }
    let error = "greedy".parse::<Policy>().unwrap_err();
    assert!(matches!(error, Error::UnknownPolicy { ref name } if name == "greedy"));
    assert_eq!(
        error.to_string(),
        "unknown policy \"greedy\": expected ordinary, pages-only, reserved or oracle"
    );
    assert!(!Policy::Ordinary.uses_reservations() && !Policy::PagesOnly.uses_reservations());
}

#[test]
fn cost_model_grows_with_work_and_presets_resolve() {
    for name in CostModel::PRESETS {
        let cost = CostModel::preset(name).unwrap();
        assert!(
            cost.prefill_s(0, 512) < cost.prefill_s(8192, 512),
            "{name}: attention to context costs"
        );
        assert!(cost.decode_entry_s(1000, 1) < cost.decode_entry_s(100_000, 1));
        assert!(cost.copy_time(16) < cost.copy_time(1600));
    }
    assert!(CostModel::preset("tiny").is_none());
}

#[test]
fn a_cost_model_with_hostile_figures_is_refused_naming_the_field_and_never_panics() {
    type Set = fn(&mut CostModel, f64);
    let cases: [(Set, &str, f64); 8] = [
        (|c, v| c.copy_bytes_per_s = v, "cost.copy_bytes_per_s", 0.0),
        (
            |c, v| c.copy_bytes_per_s = v,
            "cost.copy_bytes_per_s",
            f64::NAN,
        ),
        (
            |c, v| c.prefill_s_per_token = v,
            "cost.prefill_s_per_token",
            f64::INFINITY,
        ),
        (
            |c, v| c.prefill_s_per_pair = v,
            "cost.prefill_s_per_pair",
            -1.0,
        ),
        (
            |c, v| c.copy_latency_s = v,
            "cost.copy_latency_s",
            f64::NEG_INFINITY,
        ),
        (
            |c, v| c.decode_weights_s = v,
            "cost.decode_weights_s",
            f64::NAN,
        ),
        (
            |c, v| c.draft_head_fraction = v,
            "cost.draft_head_fraction",
            1.5,
        ),
        (
            |c, v| c.draft_head_fraction = v,
            "cost.draft_head_fraction",
            f64::NAN,
        ),
    ];
    for (set, field, value) in cases {
        let mut cost = CostModel::small_8b_gpu();
        set(&mut cost, value);
        let params = EngineParams {
            cost: cost.clone(),
            ..EngineParams::default()
        };
        let error = params.validate().unwrap_err();
        assert!(
            matches!(error, Error::InvalidParam { name, .. } if name == field),
            "{field} = {value}: {error}"
        );
        // An executor built from an unchecked model saturates its times instead of panicking.
        let executor = SimExecutor::new(cost);
        for n_tokens in [0, 1, u32::MAX] {
            let _copy = executor.copy_time(n_tokens);
            let _recompute = executor.recompute_time(n_tokens);
        }
    }
    // The largest figures a check lets through still give times, the longest a `Duration` holds.
    let huge = CostModel {
        prefill_s_per_pair: f64::MAX,
        copy_latency_s: f64::MAX,
        ..CostModel::small_8b_gpu()
    };
    assert!(huge.check().is_ok());
    let executor = SimExecutor::new(huge);
    assert_eq!(executor.recompute_time(u32::MAX), Duration::MAX);
    assert_eq!(executor.copy_time(u32::MAX), Duration::MAX);
}

#[test]
fn sim_executor_is_deterministic_and_empty_steps_take_no_time() {
    let mut executor = SimExecutor::new(CostModel::glm_like_moe());
    let storage = kv_pool::HostStorage::new(1, 2, 32).unwrap();
    let mut run = |batch: &StepBatch<'_>| executor.execute(batch, &storage).unwrap().duration;
    assert_eq!(run(&StepBatch::default()), Duration::ZERO);
    let batch = StepBatch {
        prefills: vec![PrefillWork {
            request: RequestId(1),
            first_pos: 0,
            n_tokens: 512,
            draft_replay_tokens: 0,
            tokens: &[],
            pages: PageTables::default(),
            samples: false,
        }],
        decodes: vec![DecodeWork {
            request: RequestId(2),
            context_tokens: 4000,
            n_tokens: 1,
            draft_replay_tokens: 0,
            tokens: &[],
            pages: PageTables::default(),
        }],
        logits_only: Vec::new(),
    };
    let first = run(&batch);
    assert_eq!(first, run(&batch));
    assert!(first > Duration::ZERO);
    assert_eq!(executor.steps(), 2);
}

#[test]
fn draft_work_is_priced_as_the_draft_head_not_the_full_model() {
    let cost = CostModel::glm_like_moe();
    let mut executor = SimExecutor::new(cost.clone());
    let storage = kv_pool::HostStorage::new(1, 2, 32).unwrap();
    let decode = |n_tokens, draft_replay_tokens| DecodeWork {
        request: RequestId(2),
        context_tokens: 4000,
        n_tokens,
        draft_replay_tokens,
        tokens: &[],
        pages: PageTables::default(),
    };
    let mut run = |work: DecodeWork<'static>| {
        let batch = StepBatch {
            decodes: vec![work],
            ..StepBatch::default()
        };
        executor
            .execute(&batch, &storage)
            .unwrap()
            .duration
            .as_secs_f64()
    };
    let (plain, drafting, replaying) = (run(decode(1, 0)), run(decode(4, 0)), run(decode(4, 64)));
    // Three drafts: the full model verifies four tokens, the draft head proposes three (its weights and its
    // share of each pass).
    let proposals = cost.draft_weights_s(3) + cost.draft_entry_s(4000, 3);
    let verify = cost.decode_entry_s(4000, 4) - cost.decode_entry_s(4000, 1);
    assert!((drafting - plain - verify - proposals).abs() < 1e-8);
    assert!(proposals < 0.05 * (cost.decode_weights_s + cost.decode_entry_s(4000, 1)) * 3.0);
    // A replay of a 64-token page after a restore: the draft head's prefill of it, 3.6% of the model's.
    let replay = replaying - drafting;
    assert!((replay - cost.draft_replay_s(4000 - 64, 64)).abs() < 1e-8);
    assert!(replay < 0.05 * cost.prefill_s(4000 - 64, 64));
    assert!(replay > 0.0);
}

#[test]
fn page_content_depends_on_group_rank_position_and_prefix() {
    let key = BlockKey::chain(None, &[1, 2, 3], b"salt");
    let other = BlockKey::chain(None, &[1, 2, 4], b"salt");
    let mut a = [0u8; 32];
    let mut b = [0u8; 32];
    page_content(0, 0, 0, &key, &mut a);
    page_content(0, 0, 0, &key, &mut b);
    assert_eq!(a, b);
    for (group, rank, pos, key) in [
        (1, 0, 0, key),
        (0, 1, 0, key),
        (0, 0, 16, key),
        (0, 0, 0, other),
    ] {
        page_content(group, rank, pos, &key, &mut b);
        assert_ne!(a, b);
    }
}

#[test]
fn output_tokens_are_a_function_of_content_not_of_the_id() {
    let prompt = [5, 6, 7];
    assert_eq!(
        output_token(b"s", &prompt, 3),
        output_token(b"s", &prompt, 3)
    );
    assert_ne!(
        output_token(b"s", &prompt, 3),
        output_token(b"s", &prompt, 4)
    );
    assert_ne!(
        output_token(b"s", &prompt, 3),
        output_token(b"t", &prompt, 3)
    );
}

#[test]
fn run_metrics_aggregate_hits_restores_and_percentiles() {
    let at = |s: f64| Timestamp(Duration::from_secs_f64(s));
    let base = RequestMetrics {
        prompt_tokens: 100,
        arrival: at(0.0),
        decode_tokens: 10,
        ..RequestMetrics::default()
    };
    let requests = [
        RequestMetrics {
            prompt_tokens_local_hit: 50,
            first_token: Some(at(1.0)),
            finished: Some(at(2.0)),
            ..base.clone()
        },
        RequestMetrics {
            prompt_tokens_restored: 96,
            restored: true,
            is_later_turn: true,
            first_token: Some(at(3.0)),
            finished: Some(at(4.0)),
            ..base.clone()
        },
        RequestMetrics {
            is_later_turn: true,
            fallback: Some(FallbackReason::WaitExpired),
            first_token: Some(at(5.0)),
            finished: Some(at(6.0)),
            ..base.clone()
        },
        RequestMetrics {
            cancelled: true,
            finished: Some(at(1.0)),
            decode_tokens: 0,
            ..base
        },
    ];
    let run = RunMetrics::aggregate(
        "reserved",
        &requests,
        Duration::from_secs(10),
        Duration::ZERO,
        0,
    );
    assert_eq!((run.requests_finished, run.requests_cancelled), (3, 1));
    assert_eq!(run.prompt_tokens, 300);
    assert!((run.prompt_tokens_from_cache_pct - 146.0 / 3.0).abs() < 1e-9);
    assert_eq!((run.later_turns, run.later_turns_restored), (2, 1));
    assert_eq!(run.restore_fallbacks.get("wait_expired"), Some(&1));
    assert!((run.mean_turn_s - 4.0).abs() < 1e-9);
    assert!((run.p50_ttft_s - 3.0).abs() < 1e-9 && (run.p99_ttft_s - 5.0).abs() < 1e-9);
    assert!((run.mean_ttft_s - 3.0).abs() < 1e-9, "{}", run.mean_ttft_s);
    assert!((run.aggregate_decode_tok_s - 3.0).abs() < 1e-9);
}

/// `validate`'s message for `params`, which must be refused.
fn refusal(params: &EngineParams) -> String {
    params.validate().unwrap_err().to_string()
}

#[test]
fn pools_too_big_to_allocate_are_refused_before_anything_is_allocated() {
    let mut params = EngineParams {
        n_pages: u32::MAX,
        ..EngineParams::default()
    };
    assert_eq!(
        refusal(&params),
        "invalid engine parameter n_pages: 4294967295 is above the limit of 4194304 pages; use a smaller pool"
    );
    params.n_pages = 200_000_000;
    assert!(refusal(&params).contains("200000000 is above the limit of 4194304 pages"));
    params.n_pages = EngineParams::N_PAGES_MAX;
    params.validate().unwrap();
    params.n_pages = 4096;
    params.page_bytes = u32::MAX;
    assert_eq!(
        refusal(&params),
        "invalid engine parameter page_bytes: 4294967295 is above the limit of 1048576 bytes"
    );
    // The oracle's pool is larger than n_pages: its storage counts.
    params.page_bytes = 1 << 20;
    params.policy = Policy::Oracle;
    assert_eq!(params.pool_pages(), 524_353);
    assert_eq!(
        refusal(&params),
        "invalid engine parameter page_bytes: 524353 pages of 1048576 bytes make 549823971328 bytes \
         of page storage, above the limit of 1073741824 bytes; use fewer pages or fewer bytes per page"
    );
    params.policy = Policy::Reserved;
    assert_eq!(params.pool_pages(), 4096);
    assert!(refusal(&params).contains("4096 pages of 1048576 bytes make 4294967296 bytes"));
    params.page_bytes = 1 << 18;
    params.validate().unwrap();
}

#[test]
fn the_builder_uses_a_given_clock_in_place_of_the_one_the_params_name() {
    let params = EngineParams {
        clock: crate::ClockKind::Wall,
        ..EngineParams::default()
    };
    let named = crate::Engine::builder(params.clone()).build().unwrap();
    assert_eq!(named.clock_name(), "wall");
    let given = crate::Engine::builder(params)
        .clock(Box::new(crate::SimClock))
        .build()
        .unwrap();
    assert_eq!(given.clock_name(), "simulated");
}

#[test]
fn an_engine_can_move_to_another_thread() {
    // A server or a Python binding runs the engine on a thread of its own: every part must be `Send`.
    fn is_send<T: Send>() {}
    is_send::<crate::Engine>();
    is_send::<crate::Engine<crate::ReferenceExecutor>>();
}
