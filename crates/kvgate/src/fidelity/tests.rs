//! Tests of the fidelity tools. Those that need the measurements read `../shared/fidelity` (beside the
//! repository, as CI has it) and say they skipped when it is absent.

use std::path::PathBuf;

use super::FidelityError;
use super::calibrate::nnls_ridge;
use super::experiment::{self, Experiment, ModelShape};
use super::report::compare;
use super::server::kv_pool;
use super::step_model::{CostModelFile, FIT_ALL};
use super::workload;
use super::yaml;

/// The measurements' folder, if present.
fn data_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fidelity");
    if dir.join("experiments").is_dir() {
        Some(dir)
    } else {
        #[allow(clippy::print_stderr, reason = "a skipped test says so")]
        {
            eprintln!(
                "skipped: {} is absent (the fidelity measurements)",
                dir.display()
            );
        }
        None
    }
}

fn experiments() -> Option<Vec<Experiment>> {
    Some(experiment::load_all(&data_dir()?).expect("the measurements load"))
}

fn llama(layers: u32, hidden: u32, intermediate: u32, heads: u32, kv_heads: u32) -> ModelShape {
    ModelShape {
        name: "test".to_owned(),
        layers,
        hidden,
        intermediate,
        heads,
        kv_heads,
        vocab: 32_000,
        experts: 1,
        experts_per_token: 1,
        tied_embeddings: false,
    }
}

#[test]
fn fidelity_yaml_subset_reads_the_generator_dump() {
    let text = "data:\n  type: shared_prefix\n  shared_prefix:\n    num_groups: 10\n    output_len: 248\n\
                load:\n  type: constant\n  stages:\n  - rate: 8.0\n    duration: 600\n  - rate: 20.0\n    \
                duration: 600\n  sweep: null\n  circuit_breakers: []  # none\n";
    let doc = yaml::parse(text).expect("parses");
    assert_eq!(
        doc.get("data.shared_prefix.num_groups")
            .and_then(|v| v.as_f64()),
        Some(10.0)
    );
    let stages = doc
        .get("load.stages")
        .and_then(|v| v.as_seq())
        .expect("a sequence");
    assert_eq!(stages.len(), 2);
    assert_eq!(stages[1].get("rate").and_then(|v| v.as_f64()), Some(20.0));
    assert_eq!(doc.get("load.sweep"), Some(&yaml::Yaml::Null));
    let error = yaml::parse("a: {b: 1}\n").expect_err("flow style is refused");
    assert!(error.contains("line 1"), "{error}");
}

#[test]
fn fidelity_workload_reproduces_counts_and_lengths() {
    let Some(all) = experiments() else { return };
    assert_eq!(all.len(), 16);
    for e in &all {
        let generated = workload::generate(e, 1).expect("generates");
        let config = &e.workload;
        assert_eq!(
            generated.prompts.len(),
            (config.num_groups * config.num_prompts_per_group) as usize
        );
        assert_eq!(generated.output_len, config.output_len);
        for (stage, measured) in e.measured.iter().enumerate() {
            let sent = generated
                .arrivals
                .iter()
                .filter(|a| a.stage == stage)
                .count() as u64;
            // Every request of the stage was sent: the measured successes and failures add up to it.
            assert_eq!(
                sent,
                measured.successes + measured.failures,
                "{} stage {stage}",
                e.name
            );
            let lengths: Vec<f64> = generated
                .arrivals
                .iter()
                .filter(|a| a.stage == stage)
                .map(|a| generated.prompts[a.prompt].len() as f64)
                .collect();
            let mean = lengths.iter().sum::<f64>() / lengths.len() as f64;
            let error = (mean - measured.prompt_len_mean).abs() / measured.prompt_len_mean;
            assert!(
                error < 0.01,
                "{} stage {stage}: prompt mean {mean} against {}",
                e.name,
                measured.prompt_len_mean
            );
        }
        // Prompts of one group share their system prompt: more distinct first blocks than groups never.
        let mut firsts: Vec<&[u32]> = generated.prompts.iter().map(|p| &p[..16]).collect();
        firsts.sort_unstable();
        firsts.dedup();
        assert_eq!(firsts.len(), config.num_groups as usize, "{}", e.name);
    }
}

#[test]
fn fidelity_workload_cycles_prompts_at_a_constant_rate() {
    let stages = [
        experiment::Stage {
            rate: 8.0,
            duration_s: 2.0,
        },
        experiment::Stage {
            rate: 4.0,
            duration_s: 1.0,
        },
    ];
    let (arrivals, bounds) = workload::arrivals(&stages, 5);
    assert_eq!(arrivals.len(), 20);
    assert_eq!(bounds, vec![0.0, 2.0, 3.0]);
    assert!((arrivals[1].at_s - 0.125).abs() < 1e-12);
    assert!((arrivals[16].at_s - 2.0).abs() < 1e-12 && arrivals[16].stage == 1);
    assert_eq!(arrivals[7].prompt, 2);
}

/// The all-reduce term counts two all-reduces a layer, each waiting on `tp - 1` peers: none on one GPU,
/// three times as many peer waits at TP4 as at TP2.
#[test]
fn fidelity_allreduce_waits_scale_with_peers() {
    use super::step_model::Scales;
    use super::target::h100_sxm;
    let llama70 = llama(80, 8192, 28_672, 64, 8);
    let waits = |tp| Scales::for_shape(&llama70, &h100_sxm(), tp).allreduces;
    assert_eq!(waits(1), 0.0);
    assert_eq!(waits(2), 160.0);
    assert_eq!(waits(4), 480.0);
}

#[test]
fn fidelity_pool_derivation_gives_sensible_block_counts() {
    // Llama-2-7B on one H100 at 0.9: (79.2 GiB * 0.9 - 12.6 GiB of weights - 1.5 GiB) / 8 MiB per block.
    let llama7 = llama(32, 4096, 11_008, 32, 32);
    assert!(
        (llama7.params() / 1e9 - 6.74).abs() < 0.01,
        "{}",
        llama7.params()
    );
    let pool = kv_pool(&llama7, 80.0, 1, 0.9, 16).expect("fits");
    assert!((7_200..7_450).contains(&pool.num_gpu_blocks), "{pool:?}");
    // Llama-2-70B over four: 80 KiB of KV per token per GPU.
    let llama70 = llama(80, 8192, 28_672, 64, 8);
    assert_eq!(llama70.kv_bytes_per_token_per_gpu(4), 80.0 * 1024.0);
    let pool = kv_pool(&llama70, 80.0, 4, 0.9, 16).expect("fits");
    assert!((29_000..32_000).contains(&pool.num_gpu_blocks), "{pool:?}");
    // On one GPU its 138 GB of weights leave nothing: an error that says what to do.
    let error = kv_pool(&llama70, 80.0, 1, 0.9, 16).expect_err("does not fit");
    assert!(error.to_string().contains("use more GPUs"), "{error}");
    let Some(all) = experiments() else { return };
    for e in &all {
        let pool = kv_pool(
            &e.model,
            e.gpu.capacity_gb,
            e.server.tensor_parallel,
            0.9,
            16,
        )
        .expect("fits");
        // Every server holds at least its max_num_seqs requests of the longest prompt and output.
        assert!(pool.tokens > 100_000, "{}: {pool:?}", e.name);
    }
}

const GOOD: &str = "fitted_by = \"hand\"\n[fits.all]\noverhead_s = 0.003\nweights = 1.2\nallreduce_s = 2e-5\n\
                    flops = 2.0\nattention = 2.0\nkv_read = 1.2\nper_seq_s = 2e-5\nfirst_token_s = 0.005\n\
                    first_token_steps = 1.0\n";

fn refused(text: &str) -> String {
    match CostModelFile::parse(text, "bad.toml") {
        Err(error @ FidelityError::CostModel { .. }) => error.to_string(),
        other => panic!("expected a cost-model error, got {other:?}"),
    }
}

#[test]
fn fidelity_hostile_cost_model_names_the_field() {
    assert!(CostModelFile::parse(GOOD, "good.toml").is_ok());
    let missing = refused(&GOOD.replace("flops = 2.0\n", ""));
    assert!(missing.contains("missing field `flops`"), "{missing}");
    for (from, to, field) in [
        ("kv_read = 1.2", "kv_read = -1.2", "fits.all.kv_read"),
        ("weights = 1.2", "weights = nan", "fits.all.weights"),
        (
            "overhead_s = 0.003",
            "overhead_s = 1e300",
            "fits.all.overhead_s",
        ),
        ("per_seq_s = 2e-5", "per_seq_s = inf", "fits.all.per_seq_s"),
        (
            "first_token_steps = 1.0",
            "first_token_steps = -0.0001",
            "fits.all.first_token_steps",
        ),
    ] {
        let message = refused(&GOOD.replace(from, to));
        assert!(
            message.contains(field) && message.contains("refit"),
            "{message}"
        );
    }
    let unknown = refused(&GOOD.replace("flops = 2.0", "flops = 2.0\nflopz = 1.0"));
    assert!(unknown.contains("flopz"), "{unknown}");
    let no_all = refused(&GOOD.replace("[fits.all]", "[fits.mine]"));
    assert!(no_all.contains(&format!("fits.{FIT_ALL}")), "{no_all}");
    // The committed file is valid.
    CostModelFile::committed().expect("the committed fit loads");
}

#[test]
fn fidelity_nnls_recovers_a_nonnegative_fit() {
    // y = 2 a + 0 b, with b's column pushing the unconstrained fit negative.
    let rows: Vec<([f64; 2], f64)> = vec![
        ([1.0, 1.0], 1.9),
        ([2.0, 1.0], 3.9),
        ([3.0, 1.0], 5.9),
        ([4.0, 1.0], 7.9),
    ];
    let [a, b] = nnls_ridge(&rows, &[1.0, 1.0], 0.0);
    assert!((a - 1.98).abs() < 0.02 && b == 0.0, "{a} {b}");
}

/// The fidelity table on the measurements with the committed fit: its headline figures are pinned (rerun
/// `kvgate fidelity ../shared/fidelity` and update them with the fit).
#[test]
fn fidelity_table_on_the_measurements() {
    let Some(all) = experiments() else { return };
    let file = CostModelFile::committed().expect("the committed fit loads");
    let report = compare(&all, &file).expect("compares");
    let table = report.table();
    #[allow(clippy::print_stderr, reason = "the table is the test's evidence")]
    {
        eprintln!("{table}");
    }
    assert_eq!(
        report.overloaded_experiments,
        [
            "20260217-170634-llama-2-7b-tp1-reasoning",
            "20260218-065057-llama-2-70b-hf-tp4-reasoning",
            "20260218-135247-mixtral-8x7b-v0-1-tp2-reasoning",
        ]
    );
    let pinned = [
        (report.fitted_median_ape_pct, PINNED_FITTED),
        (report.held_out_median_ape_pct, PINNED_HELD_OUT),
    ];
    for (got, want) in pinned {
        assert!(
            (got - want).abs() < 0.05,
            "median APE {got:.2} against the pinned {want:.2}\n{table}"
        );
    }
    assert_eq!(
        report.held_out_figures_over_25_pct, PINNED_OVER_25,
        "{table}"
    );
}

/// Median APEs of the committed fit (`kvgate fidelity ../shared/fidelity`).
const PINNED_FITTED: f64 = 5.085;
const PINNED_HELD_OUT: f64 = 6.281;
/// Held-out figures above 25% (of 378), overloaded stages apart.
const PINNED_OVER_25: usize = 49;

/// `--cost-model` outside the experiments: small-8b-gpu's model (Llama-3-8B on one H100 SXM) priced by the
/// committed fit keeps the preset's KV bytes per token (so every pool geometry stays) and restore copies,
/// and its step figures are the fit's coefficients times the shape's physical scales.
#[test]
fn calibrated_small_8b_gpu_is_the_fit_on_llama_3_8b() {
    use super::step_model::Scales;
    use super::target::{calibrated, h100_sxm, llama_3_8b};
    let file = CostModelFile::committed().expect("the committed fit loads");
    let cost =
        calibrated(&file, "h100-vllm.toml", "small-8b-gpu").expect("small-8b-gpu has a shape");
    let preset = engine::CostModel::small_8b_gpu();
    assert_eq!(cost.kv_bytes_per_token, preset.kv_bytes_per_token);
    assert_eq!(cost.copy_bytes_per_s, preset.copy_bytes_per_s);
    assert_eq!(cost.copy_latency_s, preset.copy_latency_s);
    let fit = &file.fits[FIT_ALL];
    let scales = Scales::for_shape(&llama_3_8b(), &h100_sxm(), 1);
    // 8.03e9 parameters in bf16 over 3.35 TB/s: 4.8 ms to stream the weights once.
    assert!((scales.weights_s - 4.79e-3).abs() < 0.05e-3, "{scales:?}");
    let overhead = fit.overhead_s + fit.weights * scales.weights_s;
    assert!((cost.step_overhead_s - overhead).abs() < 1e-12, "{cost:?}");
    assert!((cost.decode_s_per_token_read - fit.kv_read * scales.kv_s_per_token).abs() < 1e-18);
    assert_ne!(cost.prefill_s_per_token, preset.prefill_s_per_token);
    cost.check().expect("a valid cost model");
    for preset in ["glm-like-moe", "no-such-preset"] {
        let error = calibrated(&file, "h100-vllm.toml", preset)
            .expect_err("no calibrated shape")
            .to_string();
        assert!(
            error.contains(preset) && error.contains("small-8b-gpu"),
            "{error}"
        );
    }
}
