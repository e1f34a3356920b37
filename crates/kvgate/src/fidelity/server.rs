//! The server those experiments ran, as the simulated engine takes it: vLLM's scheduling knobs and the KV
//! pool vLLM derives from the model, the GPU's memory, `gpu_memory_utilization` and tensor parallelism.
//!
//! The pool, per GPU (vLLM V1, `vllm/v1/worker/gpu_worker.py::determine_available_memory` and
//! `vllm/v1/core/kv_cache_utils.py::get_num_blocks`):
//!
//! ```text
//! available = total_memory * gpu_memory_utilization - non_kv_memory
//! non_kv_memory = weights on the GPU + peak activations of the profile run + memory outside torch
//! num_gpu_blocks = available / (block_size * bytes per token of one layer on this GPU) / layers
//! bytes per token of one layer on this GPU = 2 (K and V) * max(kv_heads / tp, 1) * head_dim * 2 (bf16)
//! ```
//!
//! vLLM measures `non_kv_memory` with a profile run; here it is the weights' bytes plus
//! [`NON_WEIGHT_OVERHEAD_BYTES`], an estimate (CUDA context, cuBLAS and NCCL workspaces, the profile run's
//! activations at 2048 batched tokens, CUDA graphs). The total memory is what the driver reports for an
//! "80 GB" H100: [`usable_memory_bytes`]. Every GPU of a tensor-parallel group holds the same number of
//! blocks, each holding its share of the KV heads, so the engine's one pool of `num_gpu_blocks` pages is
//! the group's.

use engine::{CostModel, EngineParams, Policy, Preemption};
use kv_pool::{CacheGroup, Geometry, GroupKind};

use super::experiment::{Experiment, ModelShape};
use super::{FidelityError, Result};

/// Bytes of GPU memory outside the weights and the KV cache, per GPU (an estimate; vLLM measures it).
pub(crate) const NON_WEIGHT_OVERHEAD_BYTES: f64 = 1.5 * GIB;

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// Bytes of one bf16 value.
const BF16: f64 = 2.0;

/// The memory the CUDA driver reports for a GPU sold as `capacity_gb` GB: an H100 "80 GB" has 80 GiB of HBM
/// of which the driver reports 79.2 GiB (`torch.cuda.mem_get_info` on H100 SXM: 85 031 714 816 bytes).
pub(crate) fn usable_memory_bytes(capacity_gb: f64) -> f64 {
    capacity_gb * GIB * 0.99
}

impl ModelShape {
    /// Dimension of one attention head.
    pub(crate) fn head_dim(&self) -> u32 {
        self.hidden / self.heads
    }

    /// Parameters of one layer's attention (q, k, v, o projections).
    fn attention_params(&self) -> f64 {
        let h = f64::from(self.hidden);
        let q = f64::from(self.heads * self.head_dim());
        let kv = f64::from(self.kv_heads * self.head_dim());
        h * q + 2.0 * h * kv + q * h
    }

    /// Parameters of one expert's (or the dense) gated MLP.
    fn mlp_params(&self) -> f64 {
        3.0 * f64::from(self.hidden) * f64::from(self.intermediate)
    }

    /// Every parameter (embeddings and output head included).
    pub(crate) fn params(&self) -> f64 {
        let per_layer = self.attention_params()
            + f64::from(self.experts) * self.mlp_params()
            + if self.experts > 1 {
                f64::from(self.hidden * self.experts)
            } else {
                0.0
            }
            + 2.0 * f64::from(self.hidden);
        let embeddings = f64::from(self.vocab) * f64::from(self.hidden);
        let head = if self.tied_embeddings {
            0.0
        } else {
            embeddings
        };
        f64::from(self.layers) * per_layer + embeddings + head + f64::from(self.hidden)
    }

    /// Parameters one token multiplies by (a mixture of experts uses `experts_per_token` experts; the
    /// embedding lookup costs no multiply).
    pub(crate) fn active_params(&self) -> f64 {
        let per_layer =
            self.attention_params() + f64::from(self.experts_per_token) * self.mlp_params();
        f64::from(self.layers) * per_layer + f64::from(self.vocab) * f64::from(self.hidden)
    }

    /// KV-cache bytes of one token over every layer, on one GPU of a `tp`-way group.
    pub(crate) fn kv_bytes_per_token_per_gpu(&self, tp: u32) -> f64 {
        let heads = (self.kv_heads / tp.max(1)).max(1);
        2.0 * f64::from(self.layers) * f64::from(heads) * f64::from(self.head_dim()) * BF16
    }

    /// FLOPs of attention per (query token, context token) pair over every layer: QK^T and PV, two
    /// multiply-adds per head dimension each.
    pub(crate) fn attention_flops_per_pair(&self) -> f64 {
        4.0 * f64::from(self.layers) * f64::from(self.heads * self.head_dim())
    }
}

/// The KV pool vLLM would allocate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KvPool {
    /// Bytes each GPU gives the KV cache.
    pub available_bytes: f64,
    /// Blocks (pages) of `block_size` tokens.
    pub num_gpu_blocks: u32,
    /// Tokens the pool holds.
    pub tokens: u64,
}

/// The pool of `model` on GPUs of `capacity_gb` GB, `tp`-way tensor parallel, at `utilization`, with
/// blocks of `block_size` tokens. Errors: weights that leave no memory for the cache.
pub fn kv_pool(
    model: &ModelShape,
    capacity_gb: f64,
    tp: u32,
    utilization: f64,
    block_size: u32,
) -> Result<KvPool> {
    let weights = model.params() * BF16 / f64::from(tp.max(1));
    let available =
        usable_memory_bytes(capacity_gb) * utilization - weights - NON_WEIGHT_OVERHEAD_BYTES;
    let block_bytes = model.kv_bytes_per_token_per_gpu(tp) * f64::from(block_size);
    if available.is_nan() || available <= block_bytes {
        return Err(FidelityError::Invalid {
            path: model.name.clone(),
            message: format!(
                "the weights ({:.1} GiB per GPU) leave no memory for the KV cache at tensor parallelism {tp}; \
                 use more GPUs or a higher gpu_memory_utilization",
                weights / GIB
            ),
        });
    }
    let blocks = (available / block_bytes)
        .floor()
        .min(f64::from(EngineParams::N_PAGES_MAX - 1)) as u32;
    Ok(KvPool {
        available_bytes: available,
        num_gpu_blocks: blocks,
        tokens: u64::from(blocks) * u64::from(block_size),
    })
}

/// The engine as vLLM ran `experiment`, its steps priced by `cost`: `max_num_seqs` running slots, a step
/// budget of `max_num_batched_tokens` that one prompt's chunk may fill alone (vLLM V1's chunked prefill,
/// on by default, with no per-request chunk cap), prefix caching (always on in the engine's pool, as in
/// vLLM V1 by default), `max_model_len`, the derived pool, preemption by recompute (vLLM V1's only kind),
/// and the `ordinary` policy: no checkpoint store takes part.
pub fn engine_params(experiment: &Experiment, cost: CostModel) -> Result<EngineParams> {
    let server = &experiment.server;
    let pool = kv_pool(
        &experiment.model,
        experiment.gpu.capacity_gb,
        server.tensor_parallel,
        server.gpu_memory_utilization,
        server.block_size,
    )?;
    let bytes_per_page = (experiment
        .model
        .kv_bytes_per_token_per_gpu(server.tensor_parallel)
        * f64::from(server.block_size)) as u64;
    let geometry = Geometry::new(
        vec![CacheGroup {
            kind: GroupKind::Full,
            bytes_per_page,
        }],
        server.block_size,
        1,
        server.max_model_len,
    )
    .map_err(|e| FidelityError::Invalid {
        path: experiment.name.clone(),
        message: format!("the server's geometry is not valid: {e}"),
    })?;
    Ok(EngineParams {
        geometry,
        n_pages: pool.num_gpu_blocks + 1,
        max_running: server.max_num_seqs,
        max_batched_tokens: server.max_num_batched_tokens,
        chunk_tokens: server.max_num_batched_tokens,
        policy: Policy::Ordinary,
        preemption: Preemption::Recompute,
        verify_restores: false,
        stall_timeout: std::time::Duration::from_secs(1_000_000),
        cost,
        ..EngineParams::default()
    })
}
