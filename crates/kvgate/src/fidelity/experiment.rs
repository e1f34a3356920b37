//! One measured experiment as its folder holds it (the layout of `../shared/fidelity/experiments/`): the vLLM
//! server's arguments (`exp-config.yaml`), the load generator's configuration as it ran
//! (`results/config.yaml`, falling back to `profile.yaml`), the measured results of each load stage
//! (`results/stage_N_lifecycle_metrics.json`), and the model's `config.json` and the GPU's datasheet from the
//! folders beside `experiments/`.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::yaml::{self, Yaml};
use super::{FidelityError, Result};

/// The nine figures compared, in report order: (metric, statistic).
pub(crate) const FIGURES: [(Metric, Stat); 9] = [
    (Metric::Ttft, Stat::Mean),
    (Metric::Ttft, Stat::P90),
    (Metric::Ttft, Stat::P99),
    (Metric::Tpot, Stat::Mean),
    (Metric::Tpot, Stat::P90),
    (Metric::Tpot, Stat::P99),
    (Metric::E2e, Stat::Mean),
    (Metric::E2e, Stat::P90),
    (Metric::E2e, Stat::P99),
];

/// A latency metric of inference-perf's lifecycle report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Metric {
    /// `time_to_first_token`.
    Ttft,
    /// `time_per_output_token`.
    Tpot,
    /// `request_latency` (end to end).
    E2e,
}

impl Metric {
    /// The report's short name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Metric::Ttft => "ttft",
            Metric::Tpot => "tpot",
            Metric::E2e => "e2e",
        }
    }

    fn json_key(self) -> &'static str {
        match self {
            Metric::Ttft => "time_to_first_token",
            Metric::Tpot => "time_per_output_token",
            Metric::E2e => "request_latency",
        }
    }
}

/// A statistic over a stage's requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stat {
    /// The mean.
    Mean,
    /// The 90th percentile.
    P90,
    /// The 99th percentile.
    P99,
}

impl Stat {
    /// The report's short name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Stat::Mean => "mean",
            Stat::P90 => "p90",
            Stat::P99 => "p99",
        }
    }
}

/// The nine figures of one stage, in [`FIGURES`] order, in seconds.
pub(crate) type Figures = [f64; 9];

/// The vLLM server's arguments.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerArgs {
    /// The model's name (`meta-llama/Llama-2-7b-hf`); its last component names the folder under `models/`.
    pub model: String,
    /// Tensor parallelism.
    pub tensor_parallel: u32,
    /// `max_model_len`.
    pub max_model_len: u32,
    /// `max_num_batched_tokens`.
    pub max_num_batched_tokens: u32,
    /// `max_num_seqs`.
    pub max_num_seqs: u32,
    /// `gpu_memory_utilization` (vLLM's default 0.9 when the file does not set it).
    pub gpu_memory_utilization: f64,
    /// `block_size` (vLLM's default 16 on CUDA when the file does not set it).
    pub block_size: u32,
}

/// inference-perf's `shared_prefix` data configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct SharedPrefix {
    /// Groups, each with its own system prompt.
    pub num_groups: u32,
    /// Prompts (questions) per group.
    pub num_prompts_per_group: u32,
    /// System prompt length in generated token ids.
    pub system_prompt_len: u32,
    /// Question length in generated token ids.
    pub question_len: u32,
    /// `max_tokens` of every request (the server ignores EOS, so every request produces this many).
    pub output_len: u32,
    /// Multi-turn chat (each user's context grows turn by turn); `false` in the version that ran these
    /// experiments (its configuration has no such field).
    pub multi_turn: bool,
}

/// One constant-rate load stage.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stage {
    /// Requests per second.
    pub rate: f64,
    /// Seconds.
    pub duration_s: f64,
}

/// What was measured over one stage.
#[derive(Clone, Debug, PartialEq)]
pub struct MeasuredStage {
    /// Requests that succeeded.
    pub successes: u64,
    /// Requests that failed.
    pub failures: u64,
    /// Mean prompt length in tokens (the server's count).
    pub prompt_len_mean: f64,
    /// The nine figures, seconds.
    pub figures: Figures,
}

impl MeasuredStage {
    /// Failed requests as a fraction of all.
    pub(crate) fn failure_rate(&self) -> f64 {
        let total = self.successes + self.failures;
        if total == 0 {
            0.0
        } else {
            self.failures as f64 / total as f64
        }
    }
}

/// The model's shape, from its Hugging Face `config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelShape {
    /// The folder name under `models/`.
    pub name: String,
    /// Transformer layers.
    pub layers: u32,
    /// Hidden size.
    pub hidden: u32,
    /// MLP intermediate size (per expert for a mixture of experts).
    pub intermediate: u32,
    /// Attention heads.
    pub heads: u32,
    /// Key-value heads.
    pub kv_heads: u32,
    /// Vocabulary size.
    pub vocab: u32,
    /// Experts per layer (1 for a dense model).
    pub experts: u32,
    /// Experts each token uses (1 for a dense model).
    pub experts_per_token: u32,
    /// Whether the input embedding and the output head share weights.
    pub tied_embeddings: bool,
}

/// The GPU's datasheet figures.
#[derive(Clone, Debug, PartialEq)]
pub struct Gpu {
    /// The datasheet's name.
    pub name: String,
    /// Dense bf16 tensor-core peak, FLOP/s (half the datasheet's figure when it is quoted with sparsity).
    pub peak_flops: f64,
    /// Memory bandwidth, bytes/s.
    pub bandwidth: f64,
    /// Memory capacity as the datasheet quotes it, GB.
    pub capacity_gb: f64,
}

/// One experiment, loaded.
#[derive(Clone, Debug, PartialEq)]
pub struct Experiment {
    /// The folder's name.
    pub name: String,
    /// The model's short name (`llama-2-7b`), from the folder name, for leave-one-model-out.
    pub model_key: String,
    /// The workload profile (`general`, `codegen`, `roleplay`, `reasoning`): the folder name's last part.
    pub profile: String,
    /// The server.
    pub server: ServerArgs,
    /// The workload.
    pub workload: SharedPrefix,
    /// The load stages, in order.
    pub stages: Vec<Stage>,
    /// What was measured, one per stage.
    pub measured: Vec<MeasuredStage>,
    /// The model.
    pub model: ModelShape,
    /// The GPU.
    pub gpu: Gpu,
}

impl Experiment {
    /// Whether stage `stage` ran overloaded: more than 10% of its requests failed (the source repository's
    /// own rule; those stages' measured latencies cover only the requests that got through).
    pub(crate) fn overloaded(&self, stage: usize) -> bool {
        self.measured
            .get(stage)
            .is_some_and(|m| m.failure_rate() > OVERLOAD_FAILURE_RATE)
    }
}

/// Failure rate above which a stage counts as overloaded.
pub(crate) const OVERLOAD_FAILURE_RATE: f64 = 0.10;

/// The datasheet read when nothing else is named: the experiments ran on H100 SXM.
pub(crate) const DEFAULT_GPU: &str = "h100-sxm";

/// Every experiment under `dir` (the data folder holding `experiments/`, `models/` and `hardware/`, or the
/// `experiments/` folder itself), in folder-name order.
pub(crate) fn load_all(dir: &Path) -> Result<Vec<Experiment>> {
    let (experiments_dir, root) = if dir.join("experiments").is_dir() {
        (dir.join("experiments"), dir.to_path_buf())
    } else {
        (
            dir.to_path_buf(),
            dir.parent().map_or_else(PathBuf::new, Path::to_path_buf),
        )
    };
    let entries = std::fs::read_dir(&experiments_dir).map_err(|source| FidelityError::Read {
        path: experiments_dir.display().to_string(),
        source,
    })?;
    let mut names: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.join("exp-config.yaml").is_file())
        .collect();
    names.sort();
    if names.is_empty() {
        return Err(FidelityError::Invalid {
            path: experiments_dir.display().to_string(),
            message:
                "no experiment folders (each with exp-config.yaml) found; give the folder holding \
                      experiments/, models/ and hardware/"
                    .to_owned(),
        });
    }
    let gpu = load_gpu(&root.join("hardware").join(format!("{DEFAULT_GPU}.json")))?;
    names
        .iter()
        .map(|path| load_one(path, &root, &gpu))
        .collect()
}

fn load_one(dir: &Path, root: &Path, gpu: &Gpu) -> Result<Experiment> {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let server = load_server(&dir.join("exp-config.yaml"))?;
    let (workload, stages) = load_workload(dir)?;
    let mut measured = Vec::new();
    for stage in 0..stages.len() {
        measured.push(load_measured(
            &dir.join("results")
                .join(format!("stage_{stage}_lifecycle_metrics.json")),
        )?);
    }
    let model_dir = server
        .model
        .rsplit('/')
        .next()
        .unwrap_or(&server.model)
        .to_owned();
    let model = load_model(
        &root.join("models").join(&model_dir).join("config.json"),
        &model_dir,
    )?;
    Ok(Experiment {
        model_key: model_key(&name),
        profile: name.rsplit('-').next().unwrap_or_default().to_owned(),
        name,
        server,
        workload,
        stages,
        measured,
        model,
        gpu: gpu.clone(),
    })
}

/// `llama-2-70b` from `20260217-203421-llama-2-70b-hf-tp4-codegen`: the words between the timestamp and
/// the `tpN` part, less a trailing `hf`.
fn model_key(name: &str) -> String {
    let words: Vec<&str> = name.split('-').skip(2).collect();
    let end = words
        .iter()
        .position(|w| w.starts_with("tp") && w[2..].parse::<u32>().is_ok());
    let mut model: Vec<&str> = words[..end.unwrap_or(words.len())].to_vec();
    if model.last() == Some(&"hf") {
        model.pop();
    }
    model.join("-")
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| FidelityError::Read {
        path: path.display().to_string(),
        source,
    })
}

fn invalid(path: &Path, message: impl Into<String>) -> FidelityError {
    FidelityError::Invalid {
        path: path.display().to_string(),
        message: message.into(),
    }
}

fn parse_yaml(path: &Path) -> Result<Yaml> {
    yaml::parse(&read(path)?).map_err(|message| invalid(path, message))
}

/// `field` of `node` as a whole number from `min` up.
fn whole(node: &Yaml, field: &str, path: &Path, min: u32) -> Result<u32> {
    let value = node.get(field).and_then(Yaml::as_f64);
    match value {
        Some(v) if v.fract() == 0.0 && v >= f64::from(min) && v <= f64::from(u32::MAX) => {
            Ok(v as u32)
        }
        _ => Err(invalid(
            path,
            format!(
                "`{field}` must be a whole number from {min} up (found {:?})",
                node.get(field)
            ),
        )),
    }
}

fn load_server(path: &Path) -> Result<ServerArgs> {
    let doc = parse_yaml(path)?;
    let model = doc
        .get("model")
        .and_then(Yaml::as_str)
        .ok_or_else(|| invalid(path, "`model` is missing; name the served model"))?
        .to_owned();
    let utilization = match doc.get("gpu_memory_utilization").and_then(Yaml::as_f64) {
        Some(u) if u > 0.0 && u <= 1.0 => u,
        Some(u) => {
            return Err(invalid(
                path,
                format!("`gpu_memory_utilization` = {u} must be in (0, 1]"),
            ));
        }
        None => 0.9,
    };
    let block_size = if doc.get("block_size").is_some() {
        whole(&doc, "block_size", path, 1)?
    } else {
        16
    };
    Ok(ServerArgs {
        model,
        tensor_parallel: whole(&doc, "tensor_parallelism", path, 1)?,
        max_model_len: whole(&doc, "max_model_len", path, 1)?,
        max_num_batched_tokens: whole(&doc, "max_num_batched_tokens", path, 1)?,
        max_num_seqs: whole(&doc, "max_num_seqs", path, 1)?,
        gpu_memory_utilization: utilization,
        block_size,
    })
}

/// The workload as it ran: `results/config.yaml` (the load generator's own dump), else `profile.yaml`.
fn load_workload(dir: &Path) -> Result<(SharedPrefix, Vec<Stage>)> {
    let ran = dir.join("results").join("config.yaml");
    let (path, doc) = if ran.is_file() {
        (ran.clone(), parse_yaml(&ran)?)
    } else {
        let profile = dir.join("profile.yaml");
        let text = read(&profile)?;
        let doc = match serde_json::from_str::<Value>(&text) {
            Ok(json) => json_to_yaml(&json),
            Err(_) => yaml::parse(&text).map_err(|m| invalid(&profile, m))?,
        };
        (profile, doc)
    };
    let kind = doc
        .get("data.type")
        .and_then(Yaml::as_str)
        .unwrap_or_default();
    if kind != "shared_prefix" {
        return Err(invalid(
            &path,
            format!("data.type `{kind}` is not supported; only shared_prefix is"),
        ));
    }
    let sp = doc
        .get("data.shared_prefix")
        .ok_or_else(|| invalid(&path, "data.shared_prefix is missing"))?;
    let workload = SharedPrefix {
        num_groups: whole(sp, "num_groups", &path, 1)?,
        num_prompts_per_group: whole(sp, "num_prompts_per_group", &path, 1)?,
        system_prompt_len: whole(sp, "system_prompt_len", &path, 0)?,
        question_len: whole(sp, "question_len", &path, 1)?,
        output_len: whole(sp, "output_len", &path, 1)?,
        multi_turn: sp.get("enable_multi_turn_chat").and_then(Yaml::as_str) == Some("true"),
    };
    let load_type = doc
        .get("load.type")
        .and_then(Yaml::as_str)
        .unwrap_or_default();
    if load_type != "constant" {
        return Err(invalid(
            &path,
            format!("load.type `{load_type}` is not supported; only constant is"),
        ));
    }
    let stages = doc
        .get("load.stages")
        .and_then(Yaml::as_seq)
        .ok_or_else(|| invalid(&path, "load.stages is missing"))?
        .iter()
        .map(|stage| {
            let rate = stage.get("rate").and_then(Yaml::as_f64);
            let duration = stage.get("duration").and_then(Yaml::as_f64);
            match (rate, duration) {
                (Some(r), Some(d)) if r > 0.0 && r <= 1e4 && d > 0.0 && d <= 1e6 => {
                    Ok(Stage { rate: r, duration_s: d })
                }
                _ => Err(invalid(
                    &path,
                    "every load stage needs a rate in (0, 1e4] requests/s and a duration in (0, 1e6] s",
                )),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    if stages.is_empty() {
        return Err(invalid(
            &path,
            "load.stages is empty; give at least one stage",
        ));
    }
    Ok((workload, stages))
}

/// A JSON document as the YAML tree (numbers and booleans as scalars).
fn json_to_yaml(value: &Value) -> Yaml {
    match value {
        Value::Null => Yaml::Null,
        Value::Bool(b) => Yaml::Scalar(b.to_string()),
        Value::Number(n) => Yaml::Scalar(n.to_string()),
        Value::String(s) => Yaml::Scalar(s.clone()),
        Value::Array(items) => Yaml::Seq(items.iter().map(json_to_yaml).collect()),
        Value::Object(map) => Yaml::Map(
            map.iter()
                .map(|(k, v)| (k.clone(), json_to_yaml(v)))
                .collect(),
        ),
    }
}

fn load_json(path: &Path) -> Result<Value> {
    serde_json::from_str(&read(path)?).map_err(|e| invalid(path, format!("not valid JSON: {e}")))
}

fn number(doc: &Value, pointer: &str, path: &Path) -> Result<f64> {
    doc.pointer(pointer)
        .and_then(Value::as_f64)
        .filter(|v| v.is_finite() && *v >= 0.0)
        .ok_or_else(|| invalid(path, format!("`{pointer}` must be a number from 0 up")))
}

fn load_measured(path: &Path) -> Result<MeasuredStage> {
    let doc = load_json(path)?;
    let mut figures = [0.0; 9];
    for (slot, (metric, stat)) in figures.iter_mut().zip(FIGURES) {
        let pointer = format!("/successes/latency/{}/{}", metric.json_key(), stat.name());
        *slot = number(&doc, &pointer, path)?;
    }
    Ok(MeasuredStage {
        successes: number(&doc, "/successes/count", path)? as u64,
        failures: doc
            .pointer("/failures/count")
            .and_then(Value::as_u64)
            .unwrap_or(0),
        prompt_len_mean: number(&doc, "/successes/prompt_len/mean", path)?,
        figures,
    })
}

fn load_model(path: &Path, name: &str) -> Result<ModelShape> {
    let doc = load_json(path)?;
    let field = |key: &str| -> Result<u32> {
        doc.get(key)
            .and_then(Value::as_u64)
            .filter(|v| (1..=u64::from(u32::MAX)).contains(v))
            .map(|v| v as u32)
            .ok_or_else(|| invalid(path, format!("`{key}` must be a whole number from 1 up")))
    };
    let heads = field("num_attention_heads")?;
    let optional = |key: &str, default: u32| {
        doc.get(key)
            .and_then(Value::as_u64)
            .map_or(default, |v| v as u32)
    };
    Ok(ModelShape {
        name: name.to_owned(),
        layers: field("num_hidden_layers")?,
        hidden: field("hidden_size")?,
        intermediate: field("intermediate_size")?,
        heads,
        kv_heads: optional("num_key_value_heads", heads).max(1),
        vocab: field("vocab_size")?,
        experts: optional("num_local_experts", 1).max(1),
        experts_per_token: optional("num_experts_per_tok", 1).max(1),
        tied_embeddings: doc
            .get("tie_word_embeddings")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    })
}

fn load_gpu(path: &Path) -> Result<Gpu> {
    let doc = load_json(path)?;
    let sparse = doc
        .get("compute")
        .and_then(|c| c.get("with_sparsity"))
        .and_then(Value::as_bool);
    let bf16 = number(&doc, "/compute/bf16_tensor_core", path)?;
    let tflops = if sparse.unwrap_or(false) {
        bf16 / 2.0
    } else {
        bf16
    };
    Ok(Gpu {
        name: doc
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("gpu")
            .to_owned(),
        peak_flops: tflops * 1e12,
        bandwidth: number(&doc, "/memory/bandwidth_tb_s", path)? * 1e12,
        capacity_gb: number(&doc, "/memory/capacity_gb", path)?,
    })
}
