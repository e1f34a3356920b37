//! Tests of config loading: defaults, TOML round trip, and every bad value naming its field.

use super::*;

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
fn out_of_range_values_name_the_field_and_range() {
    assert_eq!(
        err("[pool]\npages = 0"),
        "config: `pool.pages` = 0 is out of range; allowed: 1..=4294967293"
    );
    assert_eq!(
        err("[scheduler]\ndraft_tokens = 17"),
        "config: `scheduler.draft_tokens` = 17 is out of range; allowed: 0..=16"
    );
    assert_eq!(
        err("[restore]\nmax_wait_s = -1.0"),
        "config: `restore.max_wait_s` = -1 is out of range; allowed: a number of seconds >= 0"
    );
    assert_eq!(
        err("[model]\npreset = \"gpt-9\""),
        "config: `model.preset` = gpt-9 is out of range; allowed: one of small-8b-gpu, glm-like-moe"
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
    assert!(
        err("[model]\ngroups = [{ kind = \"quantum\" }]").contains("unknown variant `quantum`")
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

#[test]
fn a_store_directory_selects_the_disk_store() {
    let config = EngineConfig::from_toml("[store]\ndir = \"/tmp/kvgate-checkpoints\"").unwrap();
    let params = config.engine_params(Policy::Reserved).unwrap();
    assert_eq!(
        params.store_dir.as_deref(),
        Some(Path::new("/tmp/kvgate-checkpoints"))
    );
    assert_eq!(
        EngineConfig::default()
            .engine_params(Policy::Reserved)
            .unwrap()
            .store_dir,
        None
    );
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
        .map(|&policy| {
            config
                .for_one_of_several(policy)
                .engine_params(policy)
                .unwrap()
                .store_dir
                .unwrap()
        })
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
