//! The calibrated step model outside the measured experiments: `kvgate agents|replay --cost-model FILE`.
//!
//! A fit's coefficients are efficiencies (multipliers of datasheet peaks) and fixed times, so they price
//! the steps of any model whose shape is known, on any GPU whose datasheet is known. A cost preset of the
//! simulated executor names one model on one GPU (`crates/engine/src/params/cost.rs`); this module
//! gives that model's shape and GPU and prices its steps with the file's fit on every experiment
//! ([`FIT_ALL`]). Only `small-8b-gpu` has a calibrated shape: its model (Llama-3-8B) is a dense
//! transformer on one H100 SXM, the kind of server the calibration measured. `glm-like-moe` (a GLM
//! mixture of experts with MLA attention, on two DGX Spark units) has none: the step model has no term
//! for MLA's compressed cache or for a GPU the calibration never saw, and `docs/presets.md` says what a
//! back-of-envelope from public figures gives instead.

use engine::CostModel;

use super::experiment::{Gpu, ModelShape};
use super::step_model::{CostModelFile, FIT_ALL, Scales};
use super::{FidelityError, Result};

/// Meta-Llama-3-8B, from its `config.json` as Meta publishes it: 32 layers, hidden 4096, MLP 14 336,
/// 32 query heads and 8 key-value heads of 128, a 128 256-token vocabulary, untied embeddings.
pub(crate) fn llama_3_8b() -> ModelShape {
    ModelShape {
        name: "Meta-Llama-3-8B".to_owned(),
        layers: 32,
        hidden: 4096,
        intermediate: 14_336,
        heads: 32,
        kv_heads: 8,
        vocab: 128_256,
        experts: 1,
        experts_per_token: 1,
        tied_embeddings: false,
    }
}

/// H100 SXM from NVIDIA's datasheet (the figures `../shared/fidelity/hardware/h100-sxm.json` holds):
/// 1979 TFLOP/s of bf16 with sparsity, so 989.5 dense; 3.35 TB/s of HBM3; 80 GB.
pub(crate) fn h100_sxm() -> Gpu {
    Gpu {
        name: "H100 SXM".to_owned(),
        peak_flops: 989.5e12,
        bandwidth: 3.35e12,
        capacity_gb: 80.0,
    }
}

/// The model, GPU and tensor parallelism a cost preset stands for, where the calibration applies.
pub(crate) fn shape_of(cost_preset: &str) -> Option<(ModelShape, Gpu, u32)> {
    match cost_preset {
        "small-8b-gpu" => Some((llama_3_8b(), h100_sxm(), 1)),
        _ => None,
    }
}

/// The cost model of `cost_preset`'s model priced by `file`'s fit on every experiment (read from `path`):
/// the steps from the fit, the restore copies (PCIe bandwidth and latency) from the preset. Errors: a
/// preset with no calibrated shape, named with the ones that have one.
pub fn calibrated(file: &CostModelFile, path: &str, cost_preset: &str) -> Result<CostModel> {
    let (Some((model, gpu, tp)), Some(preset)) =
        (shape_of(cost_preset), CostModel::preset(cost_preset))
    else {
        return Err(FidelityError::CostModel {
            path: path.to_owned(),
            field: String::new(),
            message: format!(
                "has no calibrated shape for cost preset {cost_preset}; allowed with --cost-model: \
                 small-8b-gpu (Llama-3-8B on one H100 SXM) or a model preset built on it (linear-hybrid, \
                 sliding-window)"
            ),
        });
    };
    let fit = file
        .fits
        .get(FIT_ALL)
        .ok_or_else(|| FidelityError::CostModel {
            path: path.to_owned(),
            field: format!("fits.{FIT_ALL}"),
            message: "is missing; every file needs the fit on all experiments".to_owned(),
        })?;
    Ok(CostModel {
        name: "calibrated",
        copy_bytes_per_s: preset.copy_bytes_per_s,
        copy_latency_s: preset.copy_latency_s,
        ..fit.cost_model_for(&Scales::for_shape(&model, &gpu, tp))
    })
}
