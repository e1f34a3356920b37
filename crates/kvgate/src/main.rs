//! The `kvgate` command line: `agents` (the main job), `replay TRACE`, `trace generate` and `scenario FILE`.
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::disallowed_methods,
    reason = "a command-line tool prints its results, reads its environment and times its runs"
)]

/// `println!` to stdout, except that a closed pipe (`kvgate ... | head`) ends the program quietly instead of
/// panicking: the reader has all it wanted.
macro_rules! outln {
    ($($arg:tt)*) => { emit_stdout(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `print!` to stdout, as `outln!` without the newline.
macro_rules! out {
    ($($arg:tt)*) => { emit_stdout(format_args!($($arg)*)) };
}

/// `eprintln!` to stderr, ignoring a closed stderr (progress and errors have nowhere else to go).
macro_rules! errln {
    ($($arg:tt)*) => { emit_stderr(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `eprint!` to stderr, as `errln!` without the newline.
macro_rules! err {
    ($($arg:tt)*) => { emit_stderr(format_args!($($arg)*)) };
}

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Args, Parser, Subcommand};
use engine::{Policy, RunMetrics};
use kvgate::plot::{self, Timeline};
use kvgate::setup::{self, AgentsHeader, config_of, policies, ranks_suffix, stores_at_start};
use kvgate::workload::agents::{AgentsSpec, TurnPriority};
use kvgate::workload::mooncake::{self, generate};
use kvgate::{EngineConfig, cluster, prometheus, report, run};

/// mimalloc instead of the system allocator: a long replay frees checkpoints of every size while new ones
/// arrive, and glibc's malloc then spends a growing share of the run sorting its free lists (see
/// `docs/benchmarks.md`, growth). Built with `no_thp`: mimalloc otherwise asks Linux for transparent huge pages
/// on its segments; a replay then kept whole 2 MiB pages resident (peak RSS 10-23% higher) and spent about
/// 0.8 s more kernel time on the conversation trace (`docs/benchmarks.md`, issue 34 part 4).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The environment variables every command reads, shown under each `--help`.
const ENV_HELP: &str = "Environment:\n  KVGATE_LOG                 log filter for stderr (default warn; e.g. info shows every \
capacity wait)\n  KVGATE_RESTORE_MAX_WAIT_S  overrides [restore] max_wait_s of the config, in seconds (0 to 1e9)";

/// kvgate: restore-admission for LLM serving, on a simulated engine.
#[derive(Debug, Parser)]
#[command(name = "kvgate", version, about, after_help = ENV_HELP)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Agent sessions whose contexts outgrow the pool, under every policy side by side (the main job).
    #[command(after_help = ENV_HELP)]
    Agents(AgentsArgs),
    /// Replay a Mooncake-format JSONL trace by its timestamps.
    #[command(after_help = ENV_HELP)]
    Replay(ReplayArgs),
    /// Serve an OpenAI-compatible HTTP API (chat and text completions, streamed or not) from one engine.
    Serve(ServeArgs),
    /// Mooncake-format traces: `trace generate` writes a seeded one on stdout.
    #[command(subcommand)]
    Trace(TraceCommand),
    /// Simulate measured vLLM experiments and print predicted against measured, with the errors (issue 31).
    Fidelity(kvgate::fidelity::cli::FidelityArgs),
    /// Fit the step-time coefficients on measured vLLM experiments and write them (TOML).
    Calibrate(kvgate::fidelity::cli::CalibrateArgs),
    /// Run a scripted timeline and print what each request went through (--json: the per-step trace,
    /// format in docs/scenarios.md).
    #[command(after_help = ENV_HELP)]
    Scenario {
        /// Print the per-step trace as JSON instead of the summary.
        #[arg(long, conflicts_with = "suite")]
        json: bool,
        /// The scenario file (JSON).
        #[arg(required_unless_present = "suite")]
        file: Option<PathBuf>,
        /// Preset replacing the file's model: a cost model (small-8b-gpu, glm-like-moe) or a model preset
        /// (glm-mla-hybrid, linear-hybrid, sliding-window).
        #[arg(long, conflicts_with = "suite")]
        preset: Option<String>,
        /// Instead of one file: run every *.json scenario of DIR under each policy it names, check its
        /// expectations, and print one line per case and policy (exit 1 if any fails).
        #[arg(long, value_name = "DIR", conflicts_with = "file")]
        suite: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum TraceCommand {
    /// Write a seeded Mooncake-format trace (JSON lines) on stdout: chat sessions whose later turns extend
    /// their earlier turns' hash ids, behind shared system prompts. The same options give the same trace.
    Generate(GenerateArgs),
}

#[derive(Debug, Args)]
struct GenerateArgs {
    /// Seed of the trace.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Requests in the trace (1 to 1000000).
    #[arg(long, default_value_t = 1_000)]
    requests: u32,
    /// Prompt lengths: short (a system prompt of 1-2 blocks of 512 tokens, a first message of 64-1536
    /// tokens) or long (2-6 blocks, 2048-20480 tokens).
    #[arg(long, default_value = "long")]
    prompt: String,
    /// Prefix reuse: low (sessions of 1-2 turns behind 64 system prompts, half behind none) or high
    /// (sessions of 2-10 turns behind 4 shared system prompts, three requests in four a later turn).
    #[arg(long, default_value = "high")]
    reuse: String,
    /// Arrivals: steady (Poisson) or bursty (bursts of 8-32 requests at 10x the rate, then a pause).
    #[arg(long, default_value = "steady")]
    arrival: String,
    /// Mean arrivals per second (0.01 to 1e6).
    #[arg(long, default_value_t = 1.0)]
    rate: f64,
}

/// Options every run command shares.
#[derive(Debug, Args)]
struct RunArgs {
    /// Engine config file (TOML; every field with its default, unit and limits in docs/kvgate.toml);
    /// KVGATE_RESTORE_MAX_WAIT_S overrides its restore.max_wait_s, and the options below override it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Print the config this command would run (TOML: the file, the environment and the options applied)
    /// and exit without running; --config reads it back. [pool] pages is left out when neither the file nor
    /// --pool-pages sets it (the command sizes the pool).
    #[arg(long)]
    print_config: bool,
    /// Usable pages in the KV pool. Default: the config file's [pool] pages when it sets them, else the
    /// run's own: for agents 16384 tokens of the model's pages per rank (1024 pages of 16 tokens), 192
    /// pages with --executor reference, 16 with --executor model; for replay 4095.
    #[arg(long)]
    pool_pages: Option<u32>,
    /// Checkpoint store capacity in pages.
    #[arg(long)]
    store_pages: Option<u64>,
    /// Preset: a cost model (small-8b-gpu, glm-like-moe), or a model preset that also sets the cache
    /// groups, tokens per page, ranks and draft tokens (glm-mla-hybrid, linear-hybrid, sliding-window).
    #[arg(long)]
    preset: Option<String>,
    /// Step-time coefficients (TOML, as `kvgate calibrate` writes; crates/kvgate/src/fidelity/h100-vllm.toml
    /// is the committed H100 fit): the steps of the cost preset's model priced by the file's fit on every
    /// experiment instead of the preset's own figures. Only small-8b-gpu (Llama-3-8B on one H100 SXM) and
    /// the model presets built on it have a calibrated shape (docs/presets.md).
    #[arg(long, value_name = "FILE")]
    cost_model: Option<PathBuf>,
    /// Seed of the run.
    #[arg(long)]
    seed: Option<u64>,
    /// What a running request preempted for pages leaves behind: offload (its KV goes to the store when that
    /// is cheaper than recomputing it; the default) or recompute ([scheduler] preemption).
    #[arg(long)]
    preemption: Option<String>,
    /// Where page bytes live ([pool] storage): host (the default) or cuda (device memory of the GPU [pool]
    /// cuda_device names; needs an NVIDIA driver, and says so without one).
    #[arg(long, value_name = "host|cuda")]
    storage: Option<String>,
    /// The copy engine ([restore] copy_engine): inline (the default), threaded, reordering or cuda (needs
    /// --storage cuda).
    #[arg(long, value_name = "NAME")]
    copy_engine: Option<String>,
    /// Policies to run (repeat or comma-separate): ordinary, pages-only, reserved, oracle. Default: all.
    #[arg(long, value_delimiter = ',')]
    policy: Vec<String>,
    /// Print JSON on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// Check every restored page byte for byte against recompute ([restore] verify; always on in debug
    /// builds); a mismatch stops the run naming the request, the page and the byte.
    #[arg(long)]
    verify: bool,
    /// Write an SVG chart of the runs, policies side by side, into this directory (`agents.svg` or
    /// `replay.svg`): prompt tokens from cache per turn, the turn-time CDF, capacity waiters and pool pages
    /// over time.
    #[arg(long, value_name = "DIR")]
    plot: Option<PathBuf>,
    /// Serve Prometheus metrics of the running engines at http://ADDR/metrics while the run lasts (for
    /// example 127.0.0.1:9464; port 0 picks a free one, named on stderr): OpenMetrics, or the classic text
    /// format when the scraper's Accept header prefers text/plain.
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<String>,
    /// Keep serving the metrics this many seconds after the run has printed its report, so a scraper sees
    /// the final counts (needs --metrics-addr).
    #[arg(long, value_name = "SECONDS", requires = "metrics_addr")]
    metrics_linger: Option<f64>,
}

#[derive(Debug, Args)]
struct AgentsArgs {
    #[command(flatten)]
    run: RunArgs,
    /// Agent sessions. Default 8; 4 with `--executor model`.
    #[arg(long)]
    agents: Option<u32>,
    /// Turns per session. Default 32; 8 with `--executor reference`, 3 with `--executor model`.
    #[arg(long)]
    turns: Option<u32>,
    /// Think time between turns, in seconds. Default 2 (engine time); 0.5 (wall time) with
    /// `--executor reference`.
    #[arg(long)]
    think_s: Option<f64>,
    /// The priority each turn asks for, which orders the restores waiting for pool capacity (contract Q1:
    /// priority, then arrival): `arrival` (every turn alike, FCFS; the default) or `progress` (a turn's
    /// index in its session: sessions further along go first). The same under every policy.
    #[arg(long, value_enum, default_value_t = TurnPriority::Arrival)]
    turn_priority: TurnPriority,
    /// The executor: `sim` (the default: modeled step times on a simulated clock, fingerprint page bytes) or
    /// `reference` (a live run: a small seeded transformer computes real KV and recurrent state into the
    /// pool, threaded copies move real bytes from the host store, on the wall clock, decode tok/s measured;
    /// its own geometry, or a model preset's shape scaled down with --preset, 192 16-token pages' worth of
    /// tokens unless --pool-pages, shorter sessions by default: 8 x 8 turns of 1024-token first prompts,
    /// 48-token responses, well under a minute on 2 cores).
    /// `model`: chats on the real model, SmolLM2-135M-Instruct (`cargo xtask model` fetches it; --model
    /// names another copy), its keys and values in the pool's pages: 4 chats x 3 turns, answers of at most
    /// 16 tokens, 16 pages of 16 tokens unless --pool-pages, a few minutes on 2 cores. Live runs run each
    /// policy alone, one after another, and time --verify's recompute apart from the turns.
    #[arg(long, value_enum, default_value_t = ExecutorArg::Sim)]
    executor: ExecutorArg,
    /// Run the sessions as a client of the OpenAI-compatible server at this URL (http://HOST:PORT: `kvgate
    /// serve`, or any other) instead of an engine in this process: streamed chat completions, each turn
    /// resending the whole chat, think times in real seconds; the table is what the client measured.
    #[arg(long, value_name = "URL")]
    target: Option<String>,
    /// With --target: the model to ask for (default: the first the server lists).
    #[arg(long, requires = "target")]
    model_name: Option<String>,
    /// With --target: start no turn after this many seconds (a bounded load run).
    #[arg(long, requires = "target")]
    duration_s: Option<f64>,
    /// With --target: response tokens a turn asks for (default 224).
    #[arg(long, requires = "target")]
    response_tokens: Option<u32>,
    /// With --target: new input tokens (words) of each later turn (default 32).
    #[arg(long, requires = "target")]
    turn_input_tokens: Option<u32>,
    /// With --target: tokens (words) of each session's first prompt (default 1024).
    #[arg(long, requires = "target")]
    first_prompt_tokens: Option<u32>,
    /// The model file of `--executor model` (GGUF). Default: the cached SmolLM2-135M-Instruct.
    #[arg(long, value_name = "PATH")]
    model: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct ServeArgs {
    #[command(flatten)]
    run: RunArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8000")]
    addr: String,
    /// The GGUF model file whose tokenizer and chat template the server speaks, and whose model answers
    /// with `--executor model`. Default: the cached SmolLM2-135M-Instruct (`cargo xtask model`).
    #[arg(long)]
    model: Option<PathBuf>,
    /// The model's name in requests and /v1/models.
    #[arg(long, default_value = kvgate::serve::MODEL_NAME)]
    model_name: String,
    /// The executor: `sim` (modeled step times, slept in real time; its tokens are no language model's),
    /// `reference` (the small reference transformer computing real KV into the pool) or `model` (the real
    /// model answers: real text, its KV in the pool's pages; a pool of 16 pages unless told otherwise).
    #[arg(long, value_enum, default_value_t = ExecutorArg::Sim)]
    executor: ExecutorArg,
    /// Requests in flight at most; more get 429 with Retry-After.
    #[arg(long, default_value_t = 256)]
    max_in_flight: usize,
    /// Requests queued for the engine at most; more get 503 with Retry-After.
    #[arg(long, default_value_t = 256)]
    queue: usize,
    /// Largest request body in bytes; larger get 413.
    #[arg(long, default_value_t = 4 << 20)]
    body_limit: usize,
    /// Output tokens of a request that gives no max_tokens.
    #[arg(long, default_value_t = 256)]
    default_max_tokens: u32,
    /// On SIGTERM, seconds running requests get to finish before they are cancelled.
    #[arg(long, default_value_t = 30.0)]
    shutdown_grace_s: f64,
}

/// Which executor an agents run drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ExecutorArg {
    /// The simulated executor.
    Sim,
    /// The reference model, live on the wall clock.
    Reference,
    /// The real model (SmolLM2-135M-Instruct), live on the wall clock.
    Model,
}

#[derive(Debug, Args)]
struct ReplayArgs {
    /// The trace (JSONL, Mooncake format).
    trace: PathBuf,
    #[command(flatten)]
    run: RunArgs,
    /// Replay only the first N requests.
    #[arg(long)]
    limit: Option<usize>,
    /// Stretch the trace's arrival times by this factor (the trace came from a cluster; one simulated
    /// engine keeps up with it only stretched).
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Replay on this many engines sharing one simulated clock and one checkpoint store (1 to 64); with more
    /// than one, the report has a column per engine and the cluster's total, the cluster's lag behind the
    /// trace's last arrival and its p99 time to first token against a 10 s objective.
    #[arg(long, default_value_t = 1)]
    engines: u32,
    /// How a request picks its engine: round-robin, least-loaded (fewest live requests) or cache-aware (the
    /// engine whose pool, or the shared store, holds most of its prompt; ties to the least loaded).
    #[arg(long, default_value = "cache-aware")]
    router: String,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = init_logging().and_then(|()| match cli.command {
        Command::Agents(args) => agents(&args),
        Command::Replay(args) => replay(&args),
        Command::Serve(args) => serve(&args),
        Command::Trace(TraceCommand::Generate(args)) => generate_trace(&args),
        Command::Fidelity(args) => kvgate::fidelity::cli::fidelity(&args)
            .map(|text| outln!("{text}"))
            .map_err(Into::into),
        Command::Calibrate(args) => kvgate::fidelity::cli::calibrate_to_file(&args)
            .map(|text| errln!("{text}"))
            .map_err(Into::into),
        Command::Scenario {
            suite: Some(dir), ..
        } => kvgate::scenario::suite::run_suite(&dir).and_then(|runs| {
            out!("{}", kvgate::scenario::suite::report(&runs));
            kvgate::scenario::suite::verdict(&dir, &runs)
        }),
        Command::Scenario {
            file, preset, json, ..
        } => scenario(&file.unwrap_or_default(), preset.as_deref(), json),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            errln!("kvgate: {}", clipped(&error.to_string()));
            ExitCode::FAILURE
        }
    }
}

/// `kvgate scenario FILE`: the summary, or with `json` the per-step trace.
fn scenario(file: &std::path::Path, preset: Option<&str>, json: bool) -> kvgate::Result<()> {
    let trace = kvgate::scenario::run_file_with_preset(file, preset)?;
    if json {
        outln!("{trace}");
        return Ok(());
    }
    let trace: serde_json::Value = serde_json::from_str(&trace)
        .map_err(|e| kvgate::Error::Internal(format!("the scenario trace does not parse: {e}")))?;
    out!(
        "{}(--json prints the per-step trace; docs/scenarios.md)\n",
        kvgate::scenario::summary(&trace)
    );
    Ok(())
}

/// At most `ERROR_CHARS_MAX` characters of `message`: an error quotes the value it refuses, which may be huge.
fn clipped(message: &str) -> String {
    const ERROR_CHARS_MAX: usize = 2000;
    match message.char_indices().nth(ERROR_CHARS_MAX) {
        Some((end, _)) => format!(
            "{}... ({} more bytes)",
            &message[..end],
            message.len() - end
        ),
        None => message.to_string(),
    }
}

/// The environment variable holding the log filter.
const LOG_ENV: &str = "KVGATE_LOG";

/// Engine logs (bounded-wait expiries, capacity waits, store failures) go to stderr, coloured only when
/// stderr is a terminal; `KVGATE_LOG` sets the filter (`warn` by default; e.g. `KVGATE_LOG=info` shows every
/// capacity wait as it starts). A filter that does not parse is an error, not ignored.
fn init_logging() -> kvgate::Result<()> {
    let invalid = |value: String| kvgate::Error::Env {
        name: LOG_ENV,
        value,
        allowed: "a log filter such as warn, info or debug (tracing EnvFilter syntax)",
    };
    let filter = match std::env::var(LOG_ENV) {
        Ok(value) => {
            tracing_subscriber::EnvFilter::try_new(&value).map_err(|_| invalid(value.clone()))?
        }
        Err(std::env::VarError::NotPresent) => tracing_subscriber::EnvFilter::new("warn"),
        Err(std::env::VarError::NotUnicode(value)) => {
            return Err(invalid(value.to_string_lossy().into_owned()));
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
    Ok(())
}

fn agents(args: &AgentsArgs) -> kvgate::Result<()> {
    if let Some(target) = &args.target {
        return remote_agents(args, target);
    }
    if args.executor == ExecutorArg::Model {
        return agents_model(args);
    }
    let live = args.executor == ExecutorArg::Reference;
    let (mut config, pool_pages_set) = load_config(&args.run)?;
    if args.run.print_config {
        return print_config(&config, pool_pages_set);
    }
    let agents_options = setup::AgentsOptions {
        agents: args.agents,
        turns: args.turns,
        think_s: args.think_s,
        turn_priority: args.turn_priority,
    };
    let spec = setup::agents_spec(&mut config, pool_pages_set, &agents_options, live)?;
    let policies = policies(&args.run.policy)?;
    let header = AgentsHeader::new(&config, &spec, live, stores_at_start(&config, &policies)?);
    let plot = args.run.plot.is_some();
    let mut registry = prometheus_client::registry::Registry::default();
    let families = prometheus::MetricFamilies::register(&mut registry);
    let server = MetricsEndpoint::start(&args.run, registry)?;
    let serving = server.is_some();
    let runs = run_policies(&policies, live, |policy, progress| {
        let config = config_of(&config, policy);
        let spec_of_turn = spec.clone();
        let mut timeline = Timeline::new(policy.name(), move |id| {
            run::agent_turn(&spec_of_turn, id).1
        });
        let mut engine_metrics = families.engine(policy.name());
        let (metrics, verify) = if live {
            // The same observers watch the live run: the chart and `/metrics` while it runs.
            let mut observers: Vec<&mut dyn run::Observer<run::LiveReference>> = Vec::new();
            if plot {
                observers.push(&mut timeline);
            }
            if serving {
                observers.push(&mut engine_metrics);
            }
            let (metrics, verify) =
                run::run_agents_live_observed(&config, &spec, policy, progress, &mut observers)?;
            (metrics, Some(verify))
        } else {
            let mut observers: Vec<&mut dyn run::Observer> = Vec::new();
            if plot {
                observers.push(&mut timeline);
            }
            if serving {
                observers.push(&mut engine_metrics);
            }
            let metrics =
                run::run_agents_observed(&config, &spec, policy, progress, &mut observers)?;
            (metrics, None)
        };
        Ok(((metrics, timeline), verify))
    })?;
    let (runs, verify): (Vec<_>, Vec<_>) = runs.into_iter().unzip();
    let runs = write_plot(
        args.run.plot.as_deref(),
        "agents",
        &format!(
            "kvgate agents: {} sessions x {} turns, pool {} pages of {} tokens",
            spec.n_agents, spec.turns, config.pool.pages, header.tokens_per_page
        ),
        "turn",
        runs,
    )?;
    let verify: Option<Vec<f64>> = verify
        .into_iter()
        .map(|v| v.map(|d| d.as_secs_f64()))
        .collect();
    let verify = verify.filter(|_| config.restore.verify);
    if args.run.json {
        let mut extra = header.json();
        extra.extend(report::live_json(&runs, live, verify.as_deref()));
        outln!("{}", report::runs_json(&runs, &extra));
    } else {
        outln!("{}\n", header.text());
        out!("{}", report::table(&runs));
        if live {
            out!("{}", report::live_note(&runs, verify.as_deref()));
        }
    }
    MetricsEndpoint::linger(server);
    Ok(())
}

/// `kvgate agents --target URL`: the sessions as a client of a server.
fn remote_agents(args: &AgentsArgs, target: &str) -> kvgate::Result<()> {
    let run = &args.run;
    let engine_options = [
        ("--config", run.config.is_some()),
        ("--pool-pages", run.pool_pages.is_some()),
        ("--store-pages", run.store_pages.is_some()),
        ("--preset", run.preset.is_some()),
        ("--cost-model", run.cost_model.is_some()),
        ("--preemption", run.preemption.is_some()),
        ("--storage", run.storage.is_some()),
        ("--copy-engine", run.copy_engine.is_some()),
        ("--policy", !run.policy.is_empty()),
        ("--json", run.json),
        ("--verify", run.verify),
        ("--plot", run.plot.is_some()),
        ("--executor", args.executor != ExecutorArg::Sim),
        ("--metrics-addr", args.run.metrics_addr.is_some()),
    ];
    if let Some((name, _)) = engine_options.iter().find(|(_, given)| *given) {
        return Err(kvgate::Error::InvalidArgument {
            name,
            value: "with --target".into(),
            allowed: "none of the engine's options with --target: the server runs the engine (give them to \
                      `kvgate serve`)",
        });
    }
    let defaults = AgentsSpec::default();
    let spec = AgentsSpec {
        n_agents: args.agents.unwrap_or(defaults.n_agents),
        turns: args.turns.unwrap_or(defaults.turns),
        think_s: args.think_s.unwrap_or(defaults.think_s),
        response_tokens: args.response_tokens.unwrap_or(defaults.response_tokens),
        turn_input_tokens: args.turn_input_tokens.unwrap_or(defaults.turn_input_tokens),
        first_prompt_tokens: args
            .first_prompt_tokens
            .unwrap_or(defaults.first_prompt_tokens),
        seed: args.run.seed.unwrap_or(defaults.seed),
        turn_priority: args.turn_priority,
    };
    spec.validate()?;
    let duration = match args.duration_s {
        Some(s) if s.is_finite() && s > 0.0 && s <= kvgate::limits::SECONDS_MAX => {
            Some(std::time::Duration::from_secs_f64(s))
        }
        Some(s) => {
            return Err(kvgate::Error::InvalidArgument {
                name: "--duration-s",
                value: s.to_string(),
                allowed: "a number of seconds above 0, at most 1e9",
            });
        }
        None => None,
    };
    let run = kvgate::serve::remote_agents::run_remote_agents(
        target,
        &spec,
        args.model_name.as_deref(),
        duration,
    )?;
    outln!(
        "{} sessions x {} turns over HTTP ({} first-prompt words, about {} new words and {} response tokens a turn)\n",
        spec.n_agents,
        spec.turns,
        spec.first_prompt_tokens,
        spec.turn_input_tokens,
        spec.response_tokens
    );
    out!("{}", kvgate::serve::remote_agents::table(&run));
    let disagrees = run.server_counts.is_some_and(|(finished, tokens)| {
        finished != run.turns.len() as u64
            || tokens != run.turns.iter().map(|t| t.completion_tokens).sum::<u64>()
    });
    if !run.failures.is_empty() || disagrees {
        return Err(kvgate::Error::Client(format!(
            "{} failed request(s){}",
            run.failures.len(),
            if disagrees {
                "; the server's /metrics disagree with the client's counts"
            } else {
                ""
            }
        )));
    }
    Ok(())
}

/// `kvgate serve`: serves until SIGTERM or SIGINT, then drains and reports.
fn serve(args: &ServeArgs) -> kvgate::Result<()> {
    let (mut config, pool_pages_set) = load_config(&args.run)?;
    if args.executor == ExecutorArg::Model && !pool_pages_set {
        config.pool.pages = run::MODEL_POOL_PAGES;
    }
    let policy = match args.run.policy.as_slice() {
        [] => Policy::Reserved,
        [name] => name.parse::<Policy>()?,
        _ => {
            return Err(kvgate::Error::InvalidArgument {
                name: "--policy",
                value: args.run.policy.join(","),
                allowed: "one policy: a server runs one engine",
            });
        }
    };
    if args.run.json || args.run.plot.is_some() {
        return Err(kvgate::Error::InvalidArgument {
            name: "--json/--plot",
            value: String::new(),
            allowed: "neither: serve prints no report (see /metrics)",
        });
    }
    let model = match &args.model {
        Some(path) => path.clone(),
        None => llama::cached_model(
            std::env::var_os(llama::MODEL_DIR_ENV).as_deref(),
            std::env::var_os("HOME").as_deref(),
        )
        .ok_or_else(|| {
            kvgate::Error::ModelFile(format!("{} is not in the model cache", llama::MODEL_FILE))
        })?,
    };
    if !(args.shutdown_grace_s.is_finite() && (0.0..=3600.0).contains(&args.shutdown_grace_s)) {
        return Err(kvgate::Error::InvalidArgument {
            name: "--shutdown-grace-s",
            value: args.shutdown_grace_s.to_string(),
            allowed: "0 to 3600 seconds",
        });
    }
    let mut options = kvgate::serve::ServeOptions::new(model);
    options.addr.clone_from(&args.addr);
    options.model_name.clone_from(&args.model_name);
    options.executor = match args.executor {
        ExecutorArg::Sim => kvgate::serve::ExecutorKind::Sim,
        ExecutorArg::Reference => kvgate::serve::ExecutorKind::Reference,
        ExecutorArg::Model => kvgate::serve::ExecutorKind::Model,
    };
    options.policy = policy;
    options.max_in_flight = args.max_in_flight;
    options.queue_capacity = args.queue;
    options.body_limit_bytes = args.body_limit;
    options.default_max_tokens = args.default_max_tokens;
    options.shutdown_grace = std::time::Duration::from_secs_f64(args.shutdown_grace_s);
    let server = kvgate::serve::Server::start(&config, &options)?;
    errln!(
        "kvgate: serving {} (executor {}, policy {}) at http://{}",
        options.model_name,
        options.executor.name(),
        policy.name(),
        server.local_addr()
    );
    let report = server.run_until_signal()?;
    errln!(
        "kvgate: stopped: {} request(s) cancelled, {} copies drained, {} leaked pages",
        report.cancelled,
        report.copies_drained,
        report.leaked_pages
    );
    if report.leaked_pages > 0 {
        return Err(kvgate::Error::Internal(format!(
            "{} pages leaked",
            report.leaked_pages
        )));
    }
    Ok(())
}

/// `trace generate`: the trace on stdout.
fn generate_trace(args: &GenerateArgs) -> kvgate::Result<()> {
    let shape = generate::TraceShape {
        seed: args.seed,
        n_requests: args.requests,
        prompt: args.prompt.parse()?,
        reuse: args.reuse.parse()?,
        arrival: args.arrival.parse()?,
        rate_per_s: args.rate,
    };
    let trace = generate::generate(&shape)?;
    out!("{}", generate::to_jsonl(&trace));
    Ok(())
}

/// `kvgate agents --executor model`: the chat sessions on the real model, each policy alone in turn.
fn agents_model(args: &AgentsArgs) -> kvgate::Result<()> {
    let (mut config, pool_pages_set) = load_config(&args.run)?;
    if !pool_pages_set {
        config.pool.pages = run::MODEL_POOL_PAGES;
    }
    let defaults = run::ChatSpec::default();
    let spec = run::ChatSpec {
        n_agents: args.agents.unwrap_or(defaults.n_agents),
        turns: args.turns.unwrap_or(defaults.turns),
        think_s: args.think_s.unwrap_or(defaults.think_s),
        ..defaults
    };
    spec.validate()?;
    let path = match &args.model {
        Some(path) => path.clone(),
        None => default_model_path()?,
    };
    let model = kvgate::model::LoadedModel::load(&path)?;
    let policies = policies(&args.run.policy)?;
    let plot = args.run.plot.is_some();
    let mut registry = prometheus_client::registry::Registry::default();
    let families = prometheus::MetricFamilies::register(&mut registry);
    let server = MetricsEndpoint::start(&args.run, registry)?;
    let serving = server.is_some();
    let runs = run_policies(&policies, true, |policy, progress| {
        let config = config_of(&config, policy);
        let turns = spec.turns;
        let mut timeline = Timeline::new(policy.name(), move |id| (id.0 % u64::from(turns)) as u32);
        let mut engine_metrics = families.engine(policy.name());
        let mut observers: Vec<&mut dyn run::Observer<kvgate::model::ModelExecutor>> = Vec::new();
        if plot {
            observers.push(&mut timeline);
        }
        if serving {
            observers.push(&mut engine_metrics);
        }
        let chat = run::run_chats_live(&config, &spec, &model, policy, progress, &mut observers)?;
        Ok(((chat.metrics, timeline), Some(chat.verify)))
    })?;
    let (runs, verify): (Vec<_>, Vec<_>) = runs.into_iter().unzip();
    let runs = write_plot(
        args.run.plot.as_deref(),
        "agents",
        &format!(
            "kvgate agents --executor model: {} chats x {} turns, pool {} pages of {} tokens",
            spec.n_agents,
            spec.turns,
            config.pool.pages,
            kvgate::model::MODEL_TOKENS_PER_PAGE
        ),
        "turn",
        runs,
    )?;
    let verify: Option<Vec<f64>> = config.restore.verify.then(|| {
        verify
            .iter()
            .map(|v| v.map_or(0.0, |d| d.as_secs_f64()))
            .collect()
    });
    if args.run.json {
        let mut extra = vec![("model", serde_json::json!(path.display().to_string()))];
        extra.extend(report::live_json(&runs, true, verify.as_deref()));
        outln!("{}", report::runs_json(&runs, &extra));
    } else {
        outln!(
            "{} chats x {} turns (a shared system prompt, a task each, then follow-up questions; answers of \
             at most {} tokens), pool {} pages of {} tokens, {} live on the wall clock ({} layers, {} KV heads \
             of {}: {} KiB a page)\n",
            spec.n_agents,
            spec.turns,
            spec.answer_tokens,
            config.pool.pages,
            kvgate::model::MODEL_TOKENS_PER_PAGE,
            path.file_name().map_or_else(
                || path.display().to_string(),
                |n| n.to_string_lossy().into_owned()
            ),
            model.llama.config().layers,
            model.llama.config().kv_heads,
            model.llama.config().head_dim,
            model.layout().bytes_per_page() / 1024,
        );
        out!("{}", report::table(&runs));
        out!("{}", report::live_note(&runs, verify.as_deref()));
    }
    MetricsEndpoint::linger(server);
    Ok(())
}

/// The cached model file (`cargo xtask model`). Errors: `InvalidArgument` when it is not there.
fn default_model_path() -> kvgate::Result<PathBuf> {
    let dir = std::env::var_os(llama::MODEL_DIR_ENV);
    let home = std::env::var_os("HOME");
    llama::cached_model(dir.as_deref(), home.as_deref()).ok_or(kvgate::Error::InvalidArgument {
        name: "--model",
        value: "(the cached model)".to_string(),
        allowed: "a GGUF file: `cargo xtask model` fetches SmolLM2-135M-Instruct into ~/.cache/kvgate/models \
                  (or $KVGATE_MODEL_DIR), or name one with --model PATH",
    })
}

/// The trace `args` names, cut to its first `--limit` requests. Errors: `InvalidArgument` for `--limit 0`
/// (a replay of nothing), and whatever reading the trace gives.
fn replay_trace(args: &ReplayArgs) -> kvgate::Result<Vec<mooncake::TraceRequest>> {
    if args.limit == Some(0) {
        return Err(kvgate::Error::InvalidArgument {
            name: "--limit",
            value: "0".to_string(),
            allowed: "at least 1 request",
        });
    }
    let mut trace = mooncake::read_trace(&args.trace)?;
    if let Some(limit) = args.limit {
        trace.truncate(limit);
    }
    Ok(trace)
}

fn replay(args: &ReplayArgs) -> kvgate::Result<()> {
    let (config, pool_pages_set) = load_config(&args.run)?;
    if args.run.print_config {
        return print_config(&config, pool_pages_set);
    }
    run::check_time_scale(args.time_scale)?;
    let router: cluster::Router = args.router.parse()?;
    cluster::check_engines(args.engines)?;
    // Every policy's engines run side by side: their pools together must fit before any is built.
    cluster::check_memory(&config, &policies(&args.run.policy)?, args.engines)?;
    if args.engines > 1 {
        return replay_cluster(args, &config, router);
    }
    let trace = replay_trace(args)?;
    let max_hit_pct = mooncake::theoretical_max_hit_pct(&trace);
    let later = run::later_turns(&trace);
    let policies = policies(&args.run.policy)?;
    let stores = stores_at_start(&config, &policies)?;
    let plot = args.run.plot.is_some();
    let mut registry = prometheus_client::registry::Registry::default();
    let families = prometheus::MetricFamilies::register(&mut registry);
    let server = MetricsEndpoint::start(&args.run, registry)?;
    let serving = server.is_some();
    // The cache-share chart's x axis: the trace in arrival order, in 40 buckets.
    let bucket = (trace.len() as u64).div_ceil(REPLAY_BUCKETS).max(1);
    let runs = run_policies(&policies, false, |policy, progress| {
        let config = config_of(&config, policy);
        let mut timeline = Timeline::new(policy.name(), move |id| (id.0 / bucket) as u32);
        let mut engine_metrics = families.engine(policy.name());
        let mut observers: Vec<&mut dyn run::Observer> = Vec::new();
        if plot {
            observers.push(&mut timeline);
        }
        if serving {
            observers.push(&mut engine_metrics);
        }
        let metrics = run::run_replay_observed(
            &config,
            &trace,
            &later,
            args.time_scale,
            policy,
            progress,
            &mut observers,
        )?;
        Ok((metrics, timeline))
    })?;
    let runs = write_plot(
        args.run.plot.as_deref(),
        "replay",
        &format!(
            "kvgate replay: {} requests, arrivals stretched {}x, pool {} pages",
            trace.len(),
            args.time_scale,
            config.pool.pages
        ),
        &format!("trace bucket ({bucket} requests each, arrival order)"),
        runs,
    )?;
    let warm = stores.iter().any(|(_, store)| store.warm());
    for run in &runs {
        // No engine can serve more from cache than the trace allows; more would be a counting bug. The
        // maximum counts every request of the trace, so it bounds a run only when none was rejected (K1) and
        // the store started empty.
        let rejected: u32 = run.rejected_requests.values().sum();
        if warm {
            continue;
        }
        if rejected > 0 {
            errln!(
                "kvgate: {}: {rejected} request(s) rejected as never runnable; the trace's maximum counts them",
                run.policy
            );
        } else if run.prompt_tokens_from_cache_pct > max_hit_pct + 1e-9 {
            return Err(kvgate::Error::Internal(format!(
                "{} reports {:.3}% from cache, above the trace's maximum {max_hit_pct:.3}%: a counting bug",
                run.policy, run.prompt_tokens_from_cache_pct
            )));
        }
    }
    // The trace's first and last arrival on the engine clock: whether each engine kept up with them.
    let arrival_s = |ms: u64| ms as f64 / 1000.0 * args.time_scale;
    let first_s = trace
        .iter()
        .map(|r| r.timestamp)
        .min()
        .map_or(0.0, arrival_s);
    let last_s = trace
        .iter()
        .map(|r| r.timestamp)
        .max()
        .map_or(0.0, arrival_s);
    if args.run.json {
        let extra = setup::replay_header_json(&runs, &trace, args.time_scale, &config, &stores);
        outln!("{}", report::runs_json(&runs, &extra));
    } else {
        let ceiling = if warm {
            format!(
                "the store started warm, so the trace's theoretical maximum prompt cache hit ({max_hit_pct:.1}%, \
                 a cold store's) does not apply"
            )
        } else {
            format!("theoretical maximum prompt cache hit {max_hit_pct:.1}%")
        };
        outln!(
            "{} requests, arrivals stretched {}x, pool {} pages of {} tokens{}, preset {}, seed {}; {ceiling}\n{}\n",
            trace.len(),
            args.time_scale,
            config.pool.pages,
            config.model.tokens_per_page,
            ranks_suffix(config.model.context_parallel),
            config.preset_label(),
            config.seed,
            run::describe_stores(&stores),
        );
        out!("{}", report::table(&runs));
        out!("\n{}", report::replay_keep_up(&runs, first_s, last_s));
    }
    MetricsEndpoint::linger(server);
    incomplete(&runs)
}

/// `Error::Incomplete` naming the runs the watchdog stopped, once their report is out; `Ok` when none was.
fn incomplete(runs: &[RunMetrics]) -> kvgate::Result<()> {
    let stopped: Vec<&str> = runs
        .iter()
        .filter(|run| run.stopped.is_some())
        .map(|run| run.policy.as_str())
        .collect();
    if stopped.is_empty() {
        return Ok(());
    }
    Err(kvgate::Error::Incomplete {
        policies: stopped.join(", "),
    })
}

/// `replay` on a cluster of `args.engines` engines: a table per policy with a column per engine and the
/// total, and the cluster's lag and p99 time to first token against its objective.
fn replay_cluster(
    args: &ReplayArgs,
    config: &EngineConfig,
    router: cluster::Router,
) -> kvgate::Result<()> {
    if args.run.plot.is_some() {
        return Err(kvgate::Error::InvalidArgument {
            name: "--plot",
            value: format!("with --engines {}", args.engines),
            allowed: "a chart of a replay on one engine (--engines 1)",
        });
    }
    if args.run.metrics_addr.is_some() {
        return Err(kvgate::Error::InvalidArgument {
            name: "--metrics-addr",
            value: format!("with --engines {}", args.engines),
            allowed: "metrics of a replay on one engine (--engines 1)",
        });
    }
    let trace = replay_trace(args)?;
    let max_hit_pct = mooncake::theoretical_max_hit_pct(&trace);
    let later = run::later_turns(&trace);
    let policies = policies(&args.run.policy)?;
    let spec = cluster::ClusterSpec {
        n_engines: args.engines,
        router,
    };
    let runs = run_policies(&policies, false, |policy, progress| {
        let config = config_of(config, policy);
        cluster::run_cluster_replay(
            &config,
            &trace,
            &later,
            args.time_scale,
            policy,
            spec,
            progress,
        )
    })?;
    for run in &runs {
        let rejected: u32 = run.total.rejected_requests.values().sum();
        if rejected > 0 {
            errln!(
                "kvgate: {}: {rejected} request(s) rejected as never runnable; the trace's maximum counts them",
                run.total.policy
            );
        } else if run.total.prompt_tokens_from_cache_pct > max_hit_pct + 1e-9 {
            return Err(kvgate::Error::Internal(format!(
                "{} reports {:.3}% from cache, above the trace's maximum {max_hit_pct:.3}%: a counting bug",
                run.total.policy, run.total.prompt_tokens_from_cache_pct
            )));
        }
    }
    if args.run.json {
        let runs: Vec<serde_json::Value> = runs.iter().map(report::cluster_json).collect();
        outln!(
            "{}",
            serde_json::json!({
                "theoretical_max_hit_pct": (max_hit_pct * 1000.0).round() / 1000.0,
                "engines": args.engines,
                "router": router.name(),
                "time_scale": args.time_scale,
                "runs": runs,
            })
        );
    } else {
        outln!(
            "{} requests, arrivals stretched {}x, {} engines sharing one checkpoint store, router {router}, \
             pool {} pages of {} tokens{} each; theoretical maximum prompt cache hit {max_hit_pct:.1}%\n",
            trace.len(),
            args.time_scale,
            args.engines,
            config.pool.pages,
            config.model.tokens_per_page,
            ranks_suffix(config.model.context_parallel)
        );
        for run in &runs {
            outln!("{}", report::cluster_table(run));
        }
    }
    let totals: Vec<RunMetrics> = runs.iter().map(|run| run.total.clone()).collect();
    incomplete(&totals)
}

/// The `/metrics` endpoint of a run (`--metrics-addr`) and how long it stays up once the run has reported
/// (`--metrics-linger`).
#[derive(Debug)]
struct MetricsEndpoint {
    server: prometheus::MetricsServer,
    linger: std::time::Duration,
}

impl MetricsEndpoint {
    /// Serves `registry` where `args` asks, saying where on stderr; `None` without `--metrics-addr`. Errors:
    /// `InvalidArgument` for a `--metrics-linger` that is not 0 to 1e9 seconds, `Metrics` when the address
    /// cannot be bound.
    fn start(
        args: &RunArgs,
        registry: prometheus_client::registry::Registry,
    ) -> kvgate::Result<Option<MetricsEndpoint>> {
        let Some(addr) = &args.metrics_addr else {
            return Ok(None);
        };
        let linger_s = args.metrics_linger.unwrap_or(0.0);
        let linger = kvgate::limits::duration_s(linger_s, false).map_err(|allowed| {
            kvgate::Error::InvalidArgument {
                name: "--metrics-linger",
                value: kvgate::limits::show(linger_s),
                allowed,
            }
        })?;
        let server = prometheus::serve(addr, std::sync::Arc::new(registry))?;
        errln!(
            "kvgate: serving metrics at http://{}/metrics",
            server.local_addr()
        );
        Ok(Some(MetricsEndpoint { server, linger }))
    }

    /// Keeps serving for the `--metrics-linger` seconds, saying so on stderr, then stops.
    fn linger(endpoint: Option<MetricsEndpoint>) {
        if let Some(endpoint) = endpoint
            && !endpoint.linger.is_zero()
        {
            errln!(
                "kvgate: the run is over; metrics stay at http://{}/metrics for {} s",
                endpoint.server.local_addr(),
                endpoint.linger.as_secs_f64()
            );
            std::thread::sleep(endpoint.linger);
        }
    }
}

/// Buckets of a replay's requests on the cache-share chart's x axis.
const REPLAY_BUCKETS: u64 = 40;

/// Writes the chart of `runs` into `dir` when one is asked for (saying where on stderr); their metrics.
fn write_plot(
    dir: Option<&std::path::Path>,
    name: &str,
    title: &str,
    turn_label: &str,
    runs: Vec<(RunMetrics, Timeline)>,
) -> kvgate::Result<Vec<RunMetrics>> {
    let (metrics, timelines): (Vec<RunMetrics>, Vec<Timeline>) = runs.into_iter().unzip();
    if let Some(dir) = dir {
        let path = plot::write_svg(dir, name, title, turn_label, &timelines)?;
        errln!("kvgate: chart written to {}", path.display());
    }
    Ok(metrics)
}

/// The config of a run (`setup::load_config` of the command line's options); and whether `--pool-pages` or
/// the file set the pool's pages.
fn load_config(args: &RunArgs) -> kvgate::Result<(EngineConfig, bool)> {
    setup::load_config(&run_options(args))
}

/// The shared options as the facade takes them.
fn run_options(args: &RunArgs) -> setup::RunOptions {
    setup::RunOptions {
        config: args.config.clone().map(setup::ConfigSource::File),
        pool_pages: args.pool_pages,
        store_pages: args.store_pages,
        preset: args.preset.clone(),
        seed: args.seed,
        preemption: args.preemption.clone(),
        storage: args.storage.clone(),
        copy_engine: args.copy_engine.clone(),
        cost_model: args.cost_model.clone(),
        verify: args.verify,
    }
}

/// Prints `config` as TOML (`--print-config`), without `[pool] pages` unless `pool_pages_set`: the command
/// sizes its pool where neither the file nor `--pool-pages` did.
fn print_config(config: &EngineConfig, pool_pages_set: bool) -> kvgate::Result<()> {
    if config.calibrated_cost.is_some() {
        outln!("# --cost-model FILE is not a config field: give it again beside --config");
    }
    let text = config.to_toml()?;
    if pool_pages_set {
        out!("{text}");
        return Ok(());
    }
    let mut table: toml::Table = toml::from_str(&text)
        .map_err(|e| kvgate::Error::Internal(format!("a written config does not parse: {e}")))?;
    if let Some(pool) = table.get_mut("pool").and_then(toml::Value::as_table_mut) {
        pool.remove("pages");
    }
    let text = toml::to_string(&table)
        .map_err(|e| kvgate::Error::Internal(format!("a config that TOML cannot hold: {e}")))?;
    out!("{text}");
    Ok(())
}

/// Seconds between progress lines when stderr is not a terminal.
const PROGRESS_EVERY_S: f64 = 10.0;

/// Runs every policy: side by side on threads of their own (runs are independent engines) when
/// `one_after_another` is false, else each alone on this thread in turn (a live run, whose timings would
/// otherwise share the cores). Shows progress on stderr: one line per policy redrawn on a terminal after a
/// second, elsewhere a line every `PROGRESS_EVERY_S` seconds.
fn run_policies<T: Send>(
    policies: &[Policy],
    one_after_another: bool,
    run: impl Fn(Policy, run::Progress<'_>) -> kvgate::Result<T> + Sync,
) -> kvgate::Result<Vec<T>> {
    let started = Instant::now();
    let show = std::io::stderr().is_terminal();
    let run_one = |policy: Policy| {
        let mut next_line_s = PROGRESS_EVERY_S;
        let mut progress = |done: u64, total: u64| {
            let elapsed_s = started.elapsed().as_secs_f64();
            if show && elapsed_s > 1.0 {
                err!("\r{policy:>10}: {done}/{total} requests finished   ");
            } else if !show && elapsed_s >= next_line_s {
                errln!("kvgate: {policy}: {done}/{total} requests finished after {elapsed_s:.0} s");
                next_line_s = elapsed_s + PROGRESS_EVERY_S;
            }
        };
        let result = run(policy, &mut progress);
        if show && one_after_another && started.elapsed().as_secs_f64() > 1.0 {
            errln!("");
        }
        result
    };
    let results: Vec<kvgate::Result<T>> = if one_after_another {
        policies.iter().map(|&policy| run_one(policy)).collect()
    } else {
        std::thread::scope(|scope| {
            let handles: Vec<_> = policies
                .iter()
                .map(|&policy| {
                    let run_one = &run_one;
                    scope.spawn(move || run_one(policy))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a policy run panicked"))
                .collect()
        })
    };
    if show && started.elapsed().as_secs_f64() > 1.0 {
        errln!(
            "\r{:60}\rdone in {:.1} s",
            "",
            started.elapsed().as_secs_f64()
        );
    }
    results.into_iter().collect()
}

fn emit_stdout(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let written = stdout.write_fmt(args).and_then(|()| stdout.flush());
    if let Err(error) = written {
        if error.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        let _ignored = writeln!(std::io::stderr(), "kvgate: cannot write to stdout: {error}");
        std::process::exit(1);
    }
}

fn emit_stderr(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ignored = std::io::stderr().lock().write_fmt(args);
}
