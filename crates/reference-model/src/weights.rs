//! The reference model's weights, generated from its seed (nothing is downloaded): a splitmix64 stream per
//! tensor, uniform values scaled by the tensor's fan-in. Matrices are stored `[in][out]` row-major, so a
//! vector-matrix product accumulates every output in input order.

use kv_pool::GroupKind;

use super::config::ReferenceConfig;

/// A `[n_in][n_out]` row-major matrix.
#[derive(Debug)]
pub(crate) struct Matrix {
    pub(crate) n_in: usize,
    pub(crate) n_out: usize,
    pub(crate) values: Vec<f32>,
}

/// The MLP after every layer: `silu(x W1) W2`.
#[derive(Debug)]
pub(crate) struct Mlp {
    pub(crate) w1: Matrix,
    pub(crate) w2: Matrix,
}

/// Projections of one attention layer.
#[derive(Debug)]
pub(crate) struct AttentionWeights {
    /// The kind of the group whose pages hold the layer's keys and values: `GroupKind::Full`, or the local
    /// group's window (`ReferenceConfig::local`), which also says which keys a query attends to.
    pub(crate) group: GroupKind,
    /// Index among the group's layers (its slot in the group's page).
    pub(crate) attention_idx: usize,
    pub(crate) wq: Matrix,
    pub(crate) wk: Matrix,
    pub(crate) wv: Matrix,
    pub(crate) wo: Matrix,
}

/// Projections of one gated linear recurrence layer.
#[derive(Debug)]
pub(crate) struct RecurrentWeights {
    /// The recurrent group whose state page holds the layer's state.
    pub(crate) state_group: usize,
    /// Index among the group's layers (its slot in the state page).
    pub(crate) recurrent_idx: usize,
    pub(crate) wq: Matrix,
    pub(crate) wk: Matrix,
    pub(crate) wv: Matrix,
    /// Decay gate logits: `sigmoid(x Wa + ba)` per head and key dimension.
    pub(crate) wa: Matrix,
    pub(crate) ba: Vec<f32>,
    /// Output gate: `silu(x Wg)`.
    pub(crate) wg: Matrix,
    pub(crate) wo: Matrix,
}

/// One layer of the stack: its mixing block, then its MLP.
#[derive(Debug)]
pub(crate) enum Block {
    Attention(AttentionWeights),
    Recurrent(RecurrentWeights),
}

/// One layer: the mixing block and the MLP after it.
#[derive(Debug)]
pub(crate) struct Layer {
    pub(crate) block: Block,
    pub(crate) mlp: Mlp,
}

/// Every weight of the model.
#[derive(Debug)]
pub(crate) struct Weights {
    /// `[vocab][d_model]`.
    pub(crate) embedding: Vec<f32>,
    pub(crate) layers: Vec<Layer>,
    /// `[d_model][vocab]`.
    pub(crate) unembedding: Matrix,
}

impl Weights {
    /// Generates the weights of a validated `config` from its seed. Recurrent layers are spread evenly
    /// through the stack (the last layer is recurrent when there is one), group by group; local layers are
    /// spread evenly among the attention layers (the last attention layer is local when there is one).
    pub(crate) fn generate(config: &ReferenceConfig) -> Weights {
        let mut rng = Generator {
            seed: config.seed,
            next_tensor: 0,
        };
        let d = config.d_model as usize;
        let inner = config.inner_dim();
        let ffn = config.ffn_dim as usize;
        let vocab = config.vocab as usize;
        let embedding = rng.tensor(vocab * d, 1.0);
        let n_local = config.n_local_layers() as usize;
        let n_attention = config.n_attention_layers as usize + n_local;
        let n_recurrent = config.n_recurrent_layers_total() as usize;
        let layers_per_group = (config.n_recurrent_layers as usize).max(1);
        let n_layers = n_attention + n_recurrent;
        let mut layers = Vec::with_capacity(n_layers);
        let (mut full_idx, mut local_idx, mut attention_idx, mut recurrent_idx) = (0, 0, 0, 0);
        for layer_idx in 0..n_layers {
            let is_recurrent =
                (layer_idx + 1) * n_recurrent / n_layers > layer_idx * n_recurrent / n_layers;
            let block = if is_recurrent {
                recurrent_idx += 1;
                Block::Recurrent(RecurrentWeights {
                    state_group: (recurrent_idx - 1) / layers_per_group,
                    recurrent_idx: (recurrent_idx - 1) % layers_per_group,
                    wq: rng.matrix(d, inner),
                    wk: rng.matrix(d, inner),
                    wv: rng.matrix(d, inner),
                    wa: rng.matrix(d, inner),
                    // Decays mostly between 0.8 and 0.97: the state remembers tens of tokens.
                    ba: rng
                        .tensor(inner, 1.0)
                        .into_iter()
                        .map(|b| b + 2.5)
                        .collect(),
                    wg: rng.matrix(d, inner),
                    wo: rng.matrix(inner, d),
                })
            } else {
                let a = attention_idx;
                attention_idx += 1;
                let is_local = (a + 1) * n_local / n_attention > a * n_local / n_attention;
                let (group, idx) = match config.local {
                    Some(local) if is_local => {
                        local_idx += 1;
                        (local.window, local_idx - 1)
                    }
                    _ => {
                        full_idx += 1;
                        (GroupKind::Full, full_idx - 1)
                    }
                };
                Block::Attention(AttentionWeights {
                    group,
                    attention_idx: idx,
                    wq: rng.matrix(d, inner),
                    wk: rng.matrix(d, inner),
                    wv: rng.matrix(d, inner),
                    wo: rng.matrix(inner, d),
                })
            };
            let mlp = Mlp {
                w1: rng.matrix(d, ffn),
                w2: rng.matrix(ffn, d),
            };
            layers.push(Layer { block, mlp });
        }
        // Larger than fan-in scaling, so greedy decoding has clear winners.
        let unembedding = Matrix {
            n_in: d,
            n_out: vocab,
            values: rng.tensor(d * vocab, 0.5),
        };
        Weights {
            embedding,
            layers,
            unembedding,
        }
    }
}

/// A splitmix64 stream per tensor, keyed by the seed and the tensor's index.
#[derive(Debug)]
struct Generator {
    seed: u64,
    next_tensor: u64,
}

impl Generator {
    /// A matrix with values uniform in `±sqrt(3 / n_in)` (variance `1 / n_in`).
    fn matrix(&mut self, n_in: usize, n_out: usize) -> Matrix {
        let bound = (3.0 / n_in as f64).sqrt() as f32;
        Matrix {
            n_in,
            n_out,
            values: self.tensor(n_in * n_out, bound),
        }
    }

    /// `n` values uniform in `[-bound, bound)`.
    fn tensor(&mut self, n: usize, bound: f32) -> Vec<f32> {
        let mut state = splitmix64(&mut (self.seed ^ splitmix64(&mut self.next_tensor)));
        (0..n)
            .map(|_| {
                // 24 random bits: exact in an f32.
                let unit = (splitmix64(&mut state) >> 40) as f32 / (1u32 << 24) as f32;
                (2.0 * unit - 1.0) * bound
            })
            .collect()
    }
}

/// One step of splitmix64: advances `state` and returns the next value.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut x = *state;
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
