//! The workload those experiments ran: inference-perf's `shared_prefix` generator and its constant-rate
//! load stages, as kvgate requests.
//!
//! What inference-perf does (`inference_perf/datagen/shared_prefix_datagen.py`, the version whose
//! configuration matches the experiments' `results/config.yaml`: `num_groups`, `num_prompts_per_group`,
//! `system_prompt_len`, `question_len`, `output_len`, no multi-turn field):
//! - for each of `num_groups` groups it draws `system_prompt_len` random token ids and decodes them to text
//!   (the group's system prompt); for each of `num_prompts_per_group` prompts it draws `question_len` random
//!   ids, decodes them, and sends `system_text + " " + question_text`;
//! - the `num_groups * num_prompts_per_group` prompts are shuffled once, then request `i` sends prompt
//!   `i mod n` with `max_tokens = output_len`; the server ignores EOS (`ignore_eos: true`), so every request
//!   produces `output_len` tokens;
//! - a `constant` load stage of `rate` requests/s for `duration` s sends `rate * duration` requests, one
//!   every `1 / rate` s; stages follow each other.
//!
//! What could not be confirmed from inference-perf's code and is taken from the measurements instead: the
//! decoded random text re-tokenizes to more tokens than were drawn. Over the 16 experiments the server's
//! prompt length is `2 + 1.045 * (system_prompt_len + question_len)` within 0.4% (BOS and the joining
//! space, then 4.5% growth); [`RETOKENIZE_GROWTH`] is that constant, the same for every experiment, and each
//! question varies by up to [`RETOKENIZE_SPREAD`] around it (the measured spread of prompt lengths within a
//! stage). The experiments' `profile.yaml` asks for multi-turn chat with `num_unique_system_prompts` and
//! `num_users_per_system_prompt`, but the generator that ran did not know those fields: its configuration
//! dump shows the defaults (10 groups of 10 prompts) and no multi-turn, and the measured prompt lengths do
//! not grow turn by turn (their maximum is within 3% of their mean), so the single-turn generator is
//! what is reproduced. Multi-turn chat is refused rather than guessed.

use super::experiment::{Experiment, SharedPrefix, Stage};
use super::{FidelityError, Result};

/// Tokens per drawn token id after decoding and re-tokenizing random ids (measured; see the module doc).
pub(crate) const RETOKENIZE_GROWTH: f64 = 1.045;

/// Relative spread of a question's re-tokenized length around [`RETOKENIZE_GROWTH`].
pub(crate) const RETOKENIZE_SPREAD: f64 = 0.03;

/// Vocabulary the random ids are drawn from (Llama-2's and Mixtral's 32 000), less the three special ids.
const VOCAB: u64 = 32_000;
const FIRST_ID: u64 = 3;

/// One request of the generated workload.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Arrival {
    /// Seconds from the start of the run.
    pub at_s: f64,
    /// Index into [`Workload::prompts`].
    pub prompt: usize,
    /// The load stage it belongs to.
    pub stage: usize,
}

/// The generated workload.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    /// The distinct prompts, as token ids (BOS first), in the shuffled order requests cycle through.
    pub prompts: Vec<Vec<u32>>,
    /// Every request, in arrival order.
    pub arrivals: Vec<Arrival>,
    /// Output tokens of every request.
    pub output_len: u32,
    /// Seconds each stage starts at, and the run's end last.
    pub stage_bounds: Vec<f64>,
}

/// A small deterministic generator (SplitMix64).
#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn ids(&mut self, n: u32) -> impl Iterator<Item = u32> + '_ {
        (0..n).map(|_| (FIRST_ID + self.next() % (VOCAB - FIRST_ID)) as u32)
    }
}

/// Tokens `n` drawn ids re-tokenize to, scaled by `jitter`.
fn retokenized(n: u32, jitter: f64) -> u32 {
    (f64::from(n) * RETOKENIZE_GROWTH * jitter).round() as u32
}

/// The distinct prompts of `config`, shuffled as inference-perf shuffles them, from `seed`.
pub fn prompts(config: &SharedPrefix, seed: u64) -> Result<Vec<Vec<u32>>> {
    if config.multi_turn {
        return Err(FidelityError::Invalid {
            path: "data.shared_prefix".to_owned(),
            message: "multi-turn chat is not reproduced; run the single-turn generator (no \
                      enable_multi_turn_chat)"
                .to_owned(),
        });
    }
    let mut rng = Rng(seed);
    let mut prompts = Vec::new();
    for _ in 0..config.num_groups {
        let system: Vec<u32> = rng
            .ids(retokenized(config.system_prompt_len, 1.0))
            .collect();
        for _ in 0..config.num_prompts_per_group {
            let jitter = 1.0 + RETOKENIZE_SPREAD * (2.0 * rng.unit() - 1.0);
            // BOS, the system prompt, the joining space, the question.
            let mut prompt = Vec::with_capacity(system.len() + config.question_len as usize + 2);
            prompt.push(1);
            prompt.extend_from_slice(&system);
            prompt.push(29871);
            prompt.extend(rng.ids(retokenized(config.question_len, jitter)));
            prompts.push(prompt);
        }
    }
    // Fisher-Yates, as `random.shuffle`.
    for i in (1..prompts.len()).rev() {
        let j = (rng.next() % (i as u64 + 1)) as usize;
        prompts.swap(i, j);
    }
    Ok(prompts)
}

/// Every request of `stages`: `rate * duration` per stage, evenly spaced, cycling through `n_prompts`.
pub fn arrivals(stages: &[Stage], n_prompts: usize) -> (Vec<Arrival>, Vec<f64>) {
    let mut out = Vec::new();
    let mut bounds = vec![0.0];
    let mut start = 0.0;
    for (index, stage) in stages.iter().enumerate() {
        let count = (stage.rate * stage.duration_s).round() as usize;
        for j in 0..count {
            let prompt = out.len() % n_prompts.max(1);
            out.push(Arrival {
                at_s: start + j as f64 / stage.rate,
                prompt,
                stage: index,
            });
        }
        start += stage.duration_s;
        bounds.push(start);
    }
    (out, bounds)
}

/// The workload of `experiment`.
pub fn generate(experiment: &Experiment, seed: u64) -> Result<Workload> {
    let prompts = prompts(&experiment.workload, seed)?;
    let (arrivals, stage_bounds) = arrivals(&experiment.stages, prompts.len());
    Ok(Workload {
        prompts,
        arrivals,
        output_len: experiment.workload.output_len,
        stage_bounds,
    })
}
