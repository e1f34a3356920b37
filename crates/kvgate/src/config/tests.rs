//! Tests of config loading: defaults, TOML round trip, every bad value naming its field and limit, and the
//! environment override.

use std::time::Duration;

use super::*;
use crate::EngineBuilder;

fn err(text: &str) -> String {
    EngineConfig::from_toml(text).unwrap_err().to_string()
}

#[test]
fn the_default_is_valid_and_round_trips_through_toml() {
    let config = EngineConfig::default();
    config.validate().unwrap();
    let text = toml::to_string(&config).unwrap();
    assert_eq!(EngineConfig::from_toml(&text).unwrap(), config);
    assert_eq!(EngineConfig::from_toml("").unwrap(), config);
}

#[test]
fn groups_of_every_kind_parse() {
    let config = EngineConfig::from_toml(
        r#"
        [model]
        tokens_per_page = 16
        groups = [
          { kind = "full" },
          { kind = "sliding_window", window_tokens = 128, retained_tail_tokens = 16 },
          { kind = "chunked_local", chunk_tokens = 256 },
          { kind = "recurrent", bytes_per_page = 4096 },
          { kind = "auxiliary", pages = 1 },
        ]
        "#,
    )
    .unwrap();
    assert_eq!(config.geometry().unwrap().groups().len(), 5);
}

#[test]
fn every_group_kind_round_trips_through_toml_with_its_page_size() {
    let kinds = [
        GroupKind::Full,
        GroupKind::SlidingWindow {
            window_tokens: 128,
            retained_tail_tokens: 16,
        },
        GroupKind::ChunkedLocal { chunk_tokens: 256 },
        GroupKind::Recurrent,
        GroupKind::Auxiliary { pages: 2 },
    ];
    for (idx, kind) in kinds.into_iter().enumerate() {
        let mut config = EngineConfig::default();
        config.model.groups = vec![
            GroupConfig::new(GroupKind::Full),
            GroupConfig {
                kind,
                bytes_per_page: (idx % 2 == 0).then_some(4096),
            },
        ];
        let text = toml::to_string(&config).unwrap();
        assert_eq!(EngineConfig::from_toml(&text).unwrap(), config, "{text}");
    }
}

#[test]
fn a_group_missing_its_kinds_field_or_given_another_kinds_field_is_refused_naming_both() {
    for (group, message) in [
        (
            "{ kind = \"sliding_window\" }",
            "a group of kind `sliding_window` needs `window_tokens`",
        ),
        (
            "{ kind = \"chunked_local\", window_tokens = 64 }",
            "a group of kind `chunked_local` needs `chunk_tokens`",
        ),
        (
            "{ kind = \"auxiliary\" }",
            "a group of kind `auxiliary` needs `pages`",
        ),
        (
            "{ kind = \"full\", window_tokens = 64 }",
            "a group of kind `full` has no field `window_tokens`",
        ),
        (
            "{ kind = \"recurrent\", pages = 1 }",
            "a group of kind `recurrent` has no field `pages`",
        ),
        (
            "{ kind = \"sliding_window\", window_tokens = 64, chunk_tokens = 64 }",
            "a group of kind `sliding_window` has no field `chunk_tokens`",
        ),
        ("{ window_tokens = 64 }", "missing field `kind`"),
        (
            "{ kind = \"full\", windw_tokens = 64 }",
            "unknown field `windw_tokens`",
        ),
    ] {
        let error = err(&format!("[model]\ngroups = [{group}]"));
        assert!(error.contains(message), "{group}: {error}");
    }
}

#[test]
fn a_draft_acceptance_that_is_not_a_probability_is_refused_naming_the_field() {
    for (value, shown) in [
        ("-0.1", "-0.1"),
        ("1.5", "1.5"),
        ("nan", "NaN"),
        ("inf", "inf"),
    ] {
        assert_eq!(
            err(&format!("[scheduler]\ndraft_acceptance = {value}")),
            format!(
                "config: `scheduler.draft_acceptance` = {shown} is out of range; allowed: a probability \
                 from 0 to 1"
            ),
            "{value}"
        );
    }
    for value in ["0.0", "0.85", "1.0"] {
        let config = EngineConfig::from_toml(&format!(
            "[scheduler]\ndraft_tokens = 3\ndraft_acceptance = {value}"
        ))
        .unwrap();
        let params = config.engine_params(Policy::Reserved).unwrap();
        assert_eq!(params.draft_acceptance, value.parse::<f64>().unwrap());
    }
}

#[test]
fn out_of_range_values_name_the_field_and_range() {
    assert_eq!(
        err("[pool]\npages = 0"),
        "config: `pool.pages` = 0 is out of range; allowed: 1..=4194303"
    );
    assert_eq!(
        err("[scheduler]\ndraft_tokens = 17"),
        "config: `scheduler.draft_tokens` = 17 is out of range; allowed: 0..=16"
    );
    assert_eq!(
        err("[restore]\nmax_wait_s = -1.0"),
        "config: `restore.max_wait_s` = -1 is out of range; allowed: a number of seconds from 0 to 1e9"
    );
    assert_eq!(
        err("[model]\npreset = \"gpt-9\""),
        "config: `model.preset` = gpt-9 is out of range; allowed: one of small-8b-gpu, glm-like-moe (cost presets), glm-mla-hybrid, linear-hybrid, sliding-window (model presets)"
    );
    assert!(
        err("[model]\ngroups = [{ kind = \"sliding_window\", window_tokens = 0 }]")
            .contains("model.groups")
    );
}

#[test]
fn unknown_fields_and_bad_syntax_are_rejected() {
    assert!(
        err("[pool]\npagez = 3").contains("unknown field `pagez`"),
        "{}",
        err("[pool]\npagez = 3")
    );
    assert!(err("[pool\n").starts_with("<config>: "));
    assert!(err("[model]\ngroups = [{ kind = \"quantum\" }]").contains(
        "unknown variant `quantum`, expected one of `full`, `sliding_window`, `chunked_local`, \
             `recurrent`, `auxiliary`"
    ));
}

#[test]
fn preemption_by_offload_is_the_default_and_recompute_can_be_chosen() {
    let params = EngineConfig::default()
        .engine_params(Policy::Reserved)
        .unwrap();
    assert_eq!(params.preemption, engine::Preemption::Offload);
    let config = EngineConfig::from_toml("[scheduler]\npreemption = \"recompute\"").unwrap();
    let params = config.engine_params(Policy::Reserved).unwrap();
    assert_eq!(params.preemption, engine::Preemption::Recompute);
    assert_eq!(
        err("[scheduler]\npreemption = \"Offload\""),
        "config: `scheduler.preemption` = Offload is out of range; allowed: offload or recompute"
    );
}

#[test]
fn a_missing_file_is_named() {
    let error = EngineConfig::load(Path::new("/nonexistent/kvgate.toml"))
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with("cannot read /nonexistent/kvgate.toml: "),
        "{error}"
    );
}

#[test]
fn engine_params_count_the_null_page() {
    let params = EngineConfig::default()
        .engine_params(Policy::Reserved)
        .unwrap();
    assert_eq!(params.n_pages, 4096);
    assert_eq!(params.restore_max_wait, Duration::from_secs(60));
}

#[test]
fn the_documented_example_is_the_default() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/kvgate.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(
        EngineConfig::from_toml(&text).unwrap(),
        EngineConfig::default()
    );
}

/// Issue 35, item 3: the documented example leaves the pool's size to the command (so `agents --config
/// docs/kvgate.toml` keeps the agents run's own pool) and the geometry to the preset (so naming a model preset
/// in it loads).
#[test]
fn the_documented_example_sets_no_pool_size_and_takes_any_preset() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/kvgate.toml");
    assert!(
        !EngineConfig::load_file(&path)
            .unwrap()
            .sets("pool", "pages")
    );
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("preset = \"small-8b-gpu\""));
    for preset in [
        "glm-mla-hybrid",
        "linear-hybrid",
        "sliding-window",
        "glm-like-moe",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let swapped = dir.path().join("kvgate.toml");
        std::fs::write(
            &swapped,
            text.replace(
                "preset = \"small-8b-gpu\"",
                &format!("preset = \"{preset}\""),
            ),
        )
        .unwrap();
        let loaded = EngineConfig::load_file(&swapped);
        assert!(loaded.is_ok(), "{preset}: {:?}", loaded.err());
    }
}

#[test]
fn a_store_directory_opens_a_disk_store_there_that_one_engine_holds_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let config = EngineConfig {
        store: StoreConfig {
            dir: Some(dir.path().to_path_buf()),
            ..StoreConfig::default()
        },
        ..EngineConfig::default()
    };
    let first = EngineBuilder::new(config.clone()).build().unwrap();
    assert!(
        std::fs::read_dir(dir.path()).unwrap().count() > 0,
        "the facade opened the disk store in the directory"
    );
    let error = EngineBuilder::new(config.clone()).build().unwrap_err();
    assert!(
        error
            .to_string()
            .contains(&format!("is in use by pid {}", std::process::id())),
        "{error}"
    );
    drop(first);
    EngineBuilder::new(config).build().unwrap();
    let file = dir.path().join("not-a-directory");
    std::fs::write(&file, b"x").unwrap();
    let not_a_directory = EngineConfig {
        store: StoreConfig {
            dir: Some(file),
            ..StoreConfig::default()
        },
        ..EngineConfig::default()
    };
    let error = EngineBuilder::new(not_a_directory).build().unwrap_err();
    assert!(error.to_string().contains("not-a-directory"), "{error}");
}

#[test]
fn cuda_storage_without_a_driver_is_an_error_naming_storage_never_a_panic() {
    let on_device = |device: u32| EngineConfig {
        pool: PoolConfig {
            pages: 63,
            storage: "cuda".to_string(),
            cuda_device: device,
            ..PoolConfig::default()
        },
        restore: RestoreConfig {
            copy_engine: "cuda".to_string(),
            ..RestoreConfig::default()
        },
        ..EngineConfig::default()
    };
    let built = EngineBuilder::new(on_device(0)).build();
    match kv_pool::cuda_available() {
        Err(reason) => {
            let error = built.unwrap_err();
            let Error::Engine(engine::Error::InvalidParam { name, reason: why }) = &error else {
                panic!("expected InvalidParam naming storage, got {error}");
            };
            assert_eq!(*name, "storage");
            assert!(why.contains(&reason), "{error}");
            let message = error.to_string();
            assert!(
                message.contains("needs an NVIDIA driver")
                    && message.contains("[pool] storage = \"host\""),
                "the error says what to do: {message}"
            );
        }
        Ok(()) => {
            built.expect("an engine on CUDA storage");
            // A device the machine lacks is the same clear error.
            let message = EngineBuilder::new(on_device(63))
                .build()
                .unwrap_err()
                .to_string();
            assert!(message.contains("storage"), "{message}");
        }
    }
}

#[test]
fn huge_times_are_refused_naming_the_field_and_the_limit() {
    for field in ["max_wait_s", "lookup_timeout_s", "lookup_latency_s"] {
        for value in ["1e300", "1e10", "inf", "nan", "-inf"] {
            let message = err(&format!("[restore]\n{field} = {value}"));
            assert!(
                message.starts_with(&format!("config: `restore.{field}` = ")),
                "{message}"
            );
            assert!(
                message.contains("at most 1e9") || message.contains("to 1e9"),
                "{message}"
            );
        }
    }
    assert_eq!(
        err("[restore]\nlookup_timeout_s = 0.0"),
        "config: `restore.lookup_timeout_s` = 0 is out of range; allowed: a number of seconds above 0, at most 1e9"
    );
}

#[test]
fn pools_too_big_to_allocate_are_refused_naming_the_field_and_the_limit() {
    for pages in ["4294967295", "4294967293", "200000000", "4194304"] {
        assert_eq!(
            err(&format!("[pool]\npages = {pages}")),
            format!("config: `pool.pages` = {pages} is out of range; allowed: 1..=4194303")
        );
    }
    assert_eq!(
        err("[pool]\npage_bytes = 4294967295"),
        "config: `pool.page_bytes` = 4294967295 is out of range; allowed: 8..=1048576"
    );
    assert_eq!(
        err("[pool]\npages = 4194303\npage_bytes = 1048576"),
        "config: `pool.page_bytes` = 1048576 is out of range; allowed: at most 256 for the reserved \
         policy's pool of 4194304 pages: pages times page_bytes must stay within 1073741824 bytes of page \
         storage; lower pool.pages or pool.page_bytes"
    );
    // The oracle's pool holds every running slot at the model's length, so it is refused where others are not.
    let config = EngineConfig::from_toml("[pool]\npage_bytes = 4096").unwrap();
    config.engine_params(Policy::Reserved).unwrap();
    let oracle = config
        .engine_params(Policy::Oracle)
        .unwrap_err()
        .to_string();
    assert!(
        oracle.starts_with(
            "config: `pool.page_bytes` = 4096 is out of range; allowed: at most 2047 for the oracle \
             policy's pool of 524353 pages"
        ),
        "{oracle}"
    );
}

#[test]
fn w1_the_restore_wait_environment_variable_overrides_the_config_and_is_checked() {
    let apply = |value: &str| EngineConfig::default().with_restore_max_wait_env(value);
    assert_eq!(apply(" 2.5 ").unwrap().restore.max_wait_s, 2.5);
    assert_eq!(apply("0").unwrap().restore.max_wait_s, 0.0);
    for bad in ["abc", "soon", "", "-1", "NaN", "inf", "1e300", "1e10"] {
        assert_eq!(
            apply(bad).unwrap_err().to_string(),
            format!(
                "environment: KVGATE_RESTORE_MAX_WAIT_S={bad:?} is invalid; allowed: a number of seconds from 0 to 1e9"
            ),
        );
    }
}

#[test]
fn an_empty_store_directory_names_the_field() {
    let error = EngineConfig::from_toml("[store]\ndir = \"\"").unwrap_err();
    assert!(
        matches!(
            &error,
            Error::InvalidConfig {
                field: "store.dir",
                ..
            }
        ),
        "{error}"
    );
    assert_eq!(
        error.to_string(),
        "config: `store.dir` = \"\" is out of range; allowed: a directory path; leave the field out for \
         the host-memory store"
    );
}

#[test]
fn engines_running_at_once_each_get_their_own_store_directory() {
    let config = EngineConfig::from_toml("[store]\ndir = \"/tmp/kvgate-checkpoints\"").unwrap();
    let dirs: Vec<_> = Policy::ALL
        .iter()
        .map(|&policy| config.for_one_of_several(policy).store.dir.unwrap())
        .collect();
    assert_eq!(
        dirs,
        ["ordinary", "pages-only", "reserved", "oracle"]
            .map(|name| Path::new("/tmp/kvgate-checkpoints").join(name))
    );
    assert_eq!(
        EngineConfig::default().for_one_of_several(Policy::Reserved),
        EngineConfig::default()
    );
}

#[test]
fn a_store_url_selects_the_redis_store_and_each_policy_gets_its_own_prefix() {
    let config = EngineConfig::from_toml("[store]\nurl = \"redis://127.0.0.1:6379/0\"").unwrap();
    assert_eq!(
        config.store.url.as_deref(),
        Some("redis://127.0.0.1:6379/0")
    );
    assert_eq!(config.store.key_prefix, "kvgate:");
    let several = config.for_one_of_several(Policy::PagesOnly);
    assert_eq!(several.store.key_prefix, "kvgate:pages-only:");
}

#[test]
fn a_bad_store_url_or_a_url_with_a_directory_names_store_url() {
    let message = err("[store]\nurl = \"http://127.0.0.1:6379\"");
    assert!(
        message.starts_with("config: `store.url` = \"http://"),
        "{message}"
    );
    assert!(message.contains("redis://HOST:PORT/DB"), "{message}");
    let message = err("[store]\nurl = \"redis://127.0.0.1:6379/0\"\ndir = \"ckpt\"");
    assert!(message.starts_with("config: `store.url` = "), "{message}");
    assert!(message.contains("not both"), "{message}");
}

#[test]
fn a_model_preset_sets_the_geometry_and_draft_depth_and_its_cost_preset() {
    for name in MODEL_PRESETS {
        let preset = model_preset(name).expect("a shipped preset");
        let config = EngineConfig::from_toml(&format!("[model]\npreset = \"{name}\"\n")).unwrap();
        assert_eq!(config.model.groups, preset.groups, "{name}");
        assert_eq!(config.model.tokens_per_page, preset.tokens_per_page);
        assert_eq!(config.model.context_parallel, preset.context_parallel);
        assert_eq!(config.scheduler.draft_tokens, preset.draft_tokens);
        assert_eq!(config.scheduler.draft_acceptance, preset.draft_acceptance);
        // A preset that drafts accepts some drafts; one that does not, none.
        assert_eq!(
            preset.draft_acceptance > 0.0,
            preset.draft_tokens > 0,
            "{name}"
        );
        assert_eq!(config.cost().unwrap().name, preset.cost);
        // The engine runs every shipped preset (H1, H8).
        let params = config.engine_params(Policy::Reserved).unwrap();
        engine::Engine::new(params).unwrap_or_else(|error| panic!("{name}: {error}"));
        let mut applied = EngineConfig::default();
        applied.apply_preset(name).unwrap();
        assert_eq!(applied, config, "--preset and [model] preset agree");
    }
}

#[test]
fn a_model_preset_with_its_own_geometry_fields_is_refused_naming_them() {
    for (text, field) in [
        (
            "[model]\npreset = \"linear-hybrid\"\ntokens_per_page = 32\n",
            "model.tokens_per_page",
        ),
        (
            "[model]\npreset = \"linear-hybrid\"\ncontext_parallel = 2\n",
            "model.context_parallel",
        ),
        (
            "[model]\npreset = \"glm-mla-hybrid\"\n[scheduler]\ndraft_tokens = 1\n",
            "scheduler.draft_tokens",
        ),
        (
            "[model]\npreset = \"glm-mla-hybrid\"\n[scheduler]\ndraft_acceptance = 0.5\n",
            "scheduler.draft_acceptance",
        ),
        (
            "[model]\npreset = \"glm-mla-hybrid\"\n[[model.groups]]\nkind = \"full\"\n",
            "model.groups",
        ),
    ] {
        let message = err(text);
        assert!(
            message.contains(&format!("a model preset sets {field}")),
            "{message}"
        );
    }
    let mut config = EngineConfig::default();
    let message = config.apply_preset("gpt-9").unwrap_err().to_string();
    assert!(
        message.contains("glm-mla-hybrid, linear-hybrid, sliding-window (model presets)"),
        "{message}"
    );
    assert_eq!(
        config,
        EngineConfig::default(),
        "a refused preset changes nothing"
    );
}

#[test]
fn l1_storage_and_every_copy_engine_are_read_from_the_config() {
    let params = |text: &str| {
        EngineConfig::from_toml(text)
            .unwrap()
            .engine_params(Policy::Reserved)
            .unwrap()
    };
    let config = |text: &str| EngineConfig::from_toml(text).unwrap();
    let default = params("");
    assert_eq!(config("").cuda_device(), None);
    assert_eq!(default.copy_engine, CopyEngineKind::Inline);
    let cuda = "[pool]\nstorage = \"cuda\"\ncuda_device = 1\n[restore]\ncopy_engine = \"cuda\"\n";
    assert_eq!(config(cuda).cuda_device(), Some(1));
    assert!(config(cuda).cuda_copies() && !config("").cuda_copies());
    // The facade gives CUDA copies with the CUDA storage; the engine's own copy engine is then unused.
    assert_eq!(params(cuda).copy_engine, CopyEngineKind::Inline);
    let reordering =
        params("[restore]\ncopy_engine = \"reordering\"\ncopy_workers = 3\ncopy_seed = 9\n");
    assert_eq!(
        reordering.copy_engine,
        CopyEngineKind::Reordering {
            workers: 3,
            seed: 9
        }
    );
    let threaded = params("[pool]\nstorage = \"cuda\"\n[restore]\ncopy_engine = \"threaded\"\n");
    assert_eq!(
        threaded.copy_engine,
        CopyEngineKind::Threaded { workers: 2 }
    );
    assert_eq!(
        config("[pool]\nstorage = \"cuda\"\n[restore]\ncopy_engine = \"threaded\"\n").cuda_device(),
        Some(0)
    );
}

#[test]
fn bad_storage_and_copy_engines_name_the_field_and_what_to_do() {
    assert_eq!(
        err("[pool]\nstorage = \"gpu\""),
        "config: `pool.storage` = gpu is out of range; allowed: host or cuda"
    );
    assert_eq!(
        err("[pool]\nstorage = \"cuda\"\ncuda_device = 64"),
        "config: `pool.cuda_device` = 64 is out of range; allowed: 0..=63"
    );
    let message = err("[restore]\ncopy_engine = \"cuda\"");
    assert!(
        message.starts_with("config: `restore.copy_engine` = cuda is out of range")
            && message.contains("set pool.storage = \"cuda\" (--storage cuda)"),
        "{message}"
    );
    assert_eq!(
        err("[restore]\ncopy_engine = \"dma\""),
        "config: `restore.copy_engine` = dma is out of range; allowed: inline, threaded, reordering or cuda"
    );
    assert_eq!(
        err("[restore]\ncopy_engine = \"reordering\"\ncopy_workers = 0"),
        "config: `restore.copy_workers` = 0 is out of range; allowed: 1..=64"
    );
}

#[test]
fn every_model_preset_round_trips_through_to_toml() {
    let mut configs = vec![EngineConfig::default()];
    for name in MODEL_PRESETS.iter().chain(&["glm-like-moe"]) {
        let mut config = EngineConfig::default();
        config.apply_preset(name).unwrap();
        config.pool.pages = 1000;
        config.pool.storage = "cuda".to_string();
        config.restore.copy_engine = "reordering".to_string();
        config.restore.copy_seed = 5;
        configs.push(config);
    }
    for config in configs {
        let text = config.to_toml().unwrap();
        assert_eq!(
            EngineConfig::from_toml(&text).unwrap(),
            config,
            "{}:\n{text}",
            config.model.preset
        );
    }
    // A config changed after its model preset was applied has no text that names the preset.
    let mut changed = EngineConfig::default();
    changed.apply_preset("linear-hybrid").unwrap();
    changed.model.tokens_per_page = 32;
    let message = changed.to_toml().unwrap_err().to_string();
    assert!(
        message.starts_with("config: `model.preset` = linear-hybrid is out of range"),
        "{message}"
    );
}

#[test]
fn a_loaded_file_says_which_fields_it_set() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, "[pool]\npages = 300\n[restore]\nverify = true\n").unwrap();
    let file = EngineConfig::load_file(&path).unwrap();
    assert_eq!(file.config.pool.pages, 300);
    assert!(file.sets("pool", "pages"));
    assert!(file.sets("restore", "verify"));
    assert!(!file.sets("pool", "page_bytes"));
    assert!(!file.sets("scheduler", "max_running"));
    assert_eq!(EngineConfig::load(&path).unwrap(), file.config);
}

/// Defaults are written once, in `EngineParams::default()`: the default config gives exactly those parameters.
#[test]
fn default_config_gives_the_default_engine_params() {
    let from_config = EngineConfig::default()
        .engine_params(Policy::Reserved)
        .unwrap();
    assert_eq!(
        format!("{from_config:?}"),
        format!("{:?}", EngineParams::default())
    );
}
