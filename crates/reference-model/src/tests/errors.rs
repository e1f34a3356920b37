//! Every refusal of the reference model, asserted by its error value, and that a refused batch writes
//! nothing.

use kv_pool::{GroupKind, HostStorage, PageId, PageStorage};

use super::super::{
    ForwardEntry, LocalAttention, ModelError, ModelStorage, ReferenceConfig, ReferenceModel,
};
use super::{N_PAGES, Request, Storages, prefill, tiny_model, tokens};

fn config_error(config: ReferenceConfig) -> ModelError {
    ReferenceModel::new(config).expect_err("the config is invalid")
}

fn forward_error(
    model: &ReferenceModel,
    storage: ModelStorage<'_>,
    batch: &[ForwardEntry<'_>],
) -> ModelError {
    model
        .forward(storage, batch)
        .expect_err("the batch is refused")
}

const STATE_1: &[PageId] = &[PageId(1)];
const STATE_2: &[PageId] = &[PageId(2)];

fn entry<'a>(tokens: &'a [u32], first_pos: u32, pages: &'a [PageId]) -> ForwardEntry<'a> {
    ForwardEntry {
        tokens,
        first_pos,
        attention_pages: pages,
        local_pages: &[],
        state_pages: STATE_1,
        want_logits: false,
    }
}

#[test]
fn invalid_configs_name_their_field() {
    let tiny = ReferenceConfig::tiny();
    let cases = [
        (ReferenceConfig { vocab: 0, ..tiny }, "vocab"),
        (
            ReferenceConfig {
                d_model: 1 << 20,
                ..tiny
            },
            "d_model",
        ),
        (ReferenceConfig { n_heads: 0, ..tiny }, "n_heads"),
        (
            ReferenceConfig {
                head_dim: 15,
                ..tiny
            },
            "head_dim",
        ),
        (
            ReferenceConfig {
                n_heads: 512,
                head_dim: 16,
                ..tiny
            },
            "n_heads * head_dim",
        ),
        (
            ReferenceConfig {
                n_attention_layers: 0,
                ..tiny
            },
            "n_attention_layers",
        ),
        (
            ReferenceConfig {
                n_recurrent_layers: 1000,
                ..tiny
            },
            "n_recurrent_layers",
        ),
        (
            ReferenceConfig {
                tokens_per_page: 0,
                ..tiny
            },
            "tokens_per_page",
        ),
        (
            ReferenceConfig {
                local: Some(LocalAttention {
                    n_layers: 1,
                    window: GroupKind::SlidingWindow {
                        window_tokens: 0,
                        retained_tail_tokens: 0,
                    },
                }),
                ..tiny
            },
            "local.window_tokens",
        ),
        (
            ReferenceConfig {
                local: Some(LocalAttention {
                    n_layers: 1,
                    window: GroupKind::ChunkedLocal { chunk_tokens: 0 },
                }),
                ..tiny
            },
            "local.chunk_tokens",
        ),
        (
            ReferenceConfig {
                local: Some(LocalAttention {
                    n_layers: 1,
                    window: GroupKind::SlidingWindow {
                        window_tokens: 32,
                        retained_tail_tokens: 16,
                    },
                }),
                ..tiny
            },
            "local.window",
        ),
        (
            ReferenceConfig {
                local: Some(LocalAttention {
                    n_layers: 1,
                    window: GroupKind::Full,
                }),
                ..tiny
            },
            "local.window",
        ),
        (
            ReferenceConfig {
                local: Some(LocalAttention {
                    n_layers: 1,
                    window: GroupKind::Recurrent,
                }),
                ..tiny
            },
            "local.window",
        ),
        (
            ReferenceConfig {
                local: Some(LocalAttention {
                    n_layers: 0,
                    window: GroupKind::ChunkedLocal { chunk_tokens: 16 },
                }),
                ..tiny
            },
            "local.n_layers",
        ),
        (
            ReferenceConfig {
                n_recurrent_groups: 0,
                ..tiny
            },
            "n_recurrent_groups",
        ),
        (
            ReferenceConfig {
                context_parallel: 0,
                ..tiny
            },
            "context_parallel",
        ),
        (
            ReferenceConfig {
                vocab: 1 << 20,
                d_model: 4096,
                ..tiny
            },
            "size",
        ),
    ];
    for (config, field) in cases {
        assert!(
            matches!(config_error(config), ModelError::InvalidConfig { name, .. } if name == field),
            "{field}"
        );
    }
    assert!(
        ReferenceConfig {
            n_recurrent_layers: 0,
            ..tiny
        }
        .validate()
        .is_ok()
    );
}

#[test]
fn bad_tokens_and_positions_are_refused() {
    let model = tiny_model();
    let storages = Storages::new(&model);
    let pages: Vec<PageId> = (1..20).map(PageId).collect();
    let empty = forward_error(&model, storages.view(), &[entry(&[], 0, &pages)]);
    assert!(matches!(empty, ModelError::EmptyTokens { entry: 0 }));
    let out_of_vocab = [3, 512, 4];
    let err = forward_error(
        &model,
        storages.view(),
        &[entry(&[1], 0, &pages), entry(&out_of_vocab, 0, &pages)],
    );
    assert!(matches!(
        err,
        ModelError::TokenOutOfVocab {
            entry: 1,
            token: 512,
            vocab: 512
        }
    ));
    let err = forward_error(&model, storages.view(), &[entry(&[1, 2], u32::MAX, &pages)]);
    assert!(matches!(
        err,
        ModelError::PositionOverflow {
            entry: 0,
            first_pos: u32::MAX,
            n_tokens: 2
        }
    ));
}

#[test]
fn bad_page_tables_are_refused() {
    let model = tiny_model();
    let storages = Storages::new(&model);
    let prompt = tokens(1, 40, 512);
    let short: Vec<PageId> = (1..3).map(PageId).collect();
    let err = forward_error(&model, storages.view(), &[entry(&prompt, 0, &short)]);
    assert!(matches!(
        err,
        ModelError::PageTableTooShort {
            entry: 0,
            group: "attention",
            len: 2,
            needed: 3,
            end_pos: 40
        }
    ));
    let out_of_range = [PageId(1), PageId(N_PAGES), PageId(3)];
    let err = forward_error(&model, storages.view(), &[entry(&prompt, 0, &out_of_range)]);
    assert!(matches!(
        err,
        ModelError::PageOutOfRange {
            entry: 0,
            group: "attention",
            page: PageId(N_PAGES),
            n_pages: N_PAGES
        }
    ));
    let null = [PageId(1), PageId::NULL, PageId(3)];
    let err = forward_error(&model, storages.view(), &[entry(&prompt, 0, &null)]);
    assert!(matches!(
        err,
        ModelError::NullPage {
            entry: 0,
            group: "attention",
            slot: 1
        }
    ));
    let mut state_out_of_range = entry(&prompt, 0, &out_of_range[..1]);
    state_out_of_range.tokens = &prompt[..3];
    let far = [PageId(N_PAGES + 5)];
    state_out_of_range.state_pages = &far;
    let err = forward_error(&model, storages.view(), &[state_out_of_range]);
    assert!(matches!(
        err,
        ModelError::PageOutOfRange {
            group: "recurrent",
            ..
        }
    ));
    let mut state_null = state_out_of_range;
    state_null.state_pages = &[PageId::NULL];
    let err = forward_error(&model, storages.view(), &[state_null]);
    assert!(matches!(
        err,
        ModelError::NullPage {
            entry: 0,
            group: "recurrent",
            slot: 0
        }
    ));
}

#[test]
fn entries_that_share_a_written_page_are_refused_and_nothing_is_written() {
    let model = tiny_model();
    let storages = Storages::new(&model);
    let prompt = tokens(2, 40, 512);
    let a: Vec<PageId> = (1..4).map(PageId).collect();
    let b: Vec<PageId> = (3..6).map(PageId).collect();
    let mut second = entry(&prompt, 0, &b);
    second.state_pages = STATE_2;
    let err = forward_error(&model, storages.view(), &[entry(&prompt, 0, &a), second]);
    assert!(matches!(
        err,
        ModelError::PageConflict {
            group: "attention",
            page: PageId(3),
            writer: 0,
            other: 1
        }
    ));
    let c: Vec<PageId> = (10..13).map(PageId).collect();
    let same_state = entry(&prompt, 0, &c);
    let err = forward_error(
        &model,
        storages.view(),
        &[entry(&prompt, 0, &a), same_state],
    );
    assert!(matches!(
        err,
        ModelError::PageConflict {
            group: "recurrent",
            page: PageId(1),
            writer: 0,
            other: 1
        }
    ));
    // Entry 1 reads page 1 (its slot 0, before its first position) while entry 0 writes it.
    let reader_pages = [PageId(1), PageId(10), PageId(11)];
    let mut reader = entry(&prompt[..8], 32, &reader_pages);
    reader.state_pages = STATE_2;
    let err = forward_error(&model, storages.view(), &[entry(&prompt, 0, &a), reader]);
    assert!(matches!(
        err,
        ModelError::PageConflict {
            group: "attention",
            page: PageId(1),
            writer: 0,
            other: 1
        }
    ));
    for page in 1..12 {
        assert!(
            super::read(&storages.attention, PageId(page))
                .iter()
                .all(|&b| b == 0)
        );
    }
}

#[test]
fn storages_that_do_not_fit_the_model_are_refused() {
    let model = tiny_model();
    let config = *model.config();
    let storages = Storages::new(&model);
    let pages = [PageId(1)];
    let batch = [entry(&[1, 2, 3], 0, &pages)];
    let wrong = HostStorage::new(1, 8, config.bytes_per_page() + 4).expect("storage");
    let view = ModelStorage {
        attention: &wrong,
        ..storages.view()
    };
    let err = forward_error(&model, view, &batch);
    assert!(matches!(
        err,
        ModelError::StoragePageSize {
            group: "attention",
            ..
        }
    ));
    let view = ModelStorage {
        recurrent: Some(&wrong),
        ..storages.view()
    };
    let err = forward_error(&model, view, &batch);
    assert!(matches!(
        err,
        ModelError::StoragePageSize { group: "recurrent", expected, .. } if expected == config.recurrent_bytes_per_page()
    ));
    let view = ModelStorage {
        recurrent: None,
        ..storages.view()
    };
    let err = forward_error(&model, view, &batch);
    assert!(matches!(
        err,
        ModelError::RecurrentStorage {
            n_recurrent_layers: 1,
            ..
        }
    ));
    let mut no_state = batch[0];
    no_state.state_pages = &[];
    let err = forward_error(&model, storages.view(), &[no_state]);
    assert!(matches!(
        err,
        ModelError::RecurrentPage {
            entry: 0,
            n_given: 0,
            n_groups: 1
        }
    ));

    let attention_only = ReferenceModel::new(ReferenceConfig {
        n_recurrent_layers: 0,
        ..config
    })
    .expect("valid");
    let err = forward_error(&attention_only, storages.view(), &[no_state]);
    assert!(matches!(
        err,
        ModelError::RecurrentStorage {
            n_recurrent_layers: 0,
            ..
        }
    ));
    let view = ModelStorage {
        recurrent: None,
        ..storages.view()
    };
    let err = forward_error(&attention_only, view, &batch);
    assert!(matches!(err, ModelError::RecurrentPage { entry: 0, .. }));
    assert!(attention_only.forward(view, &[no_state]).is_ok());
}

#[test]
fn a_state_page_at_another_position_is_refused() {
    let model = tiny_model();
    let storages = Storages::new(&model);
    let mut request = Request::new(&model, tokens(3, 40, 512), 100, 1, 1);
    let _logits = prefill(&model, &storages, &mut request, 40);
    // The state covers 40 tokens; continuing as if it covered 32 is refused.
    let entry = ForwardEntry {
        tokens: &[5],
        first_pos: 32,
        attention_pages: &request.pages,
        local_pages: &[],
        state_pages: &request.state_pages,
        want_logits: true,
    };
    let err = forward_error(&model, storages.view(), &[entry]);
    assert!(matches!(
        err,
        ModelError::StatePosition {
            entry: 0,
            page: PageId(1),
            expected: 32,
            found: 40
        }
    ));
    let recurrent: &dyn PageStorage = storages.recurrent.as_ref().expect("hybrid model");
    assert_eq!(recurrent.n_pages(), N_PAGES);
}

#[test]
fn local_tables_and_ranks_that_do_not_fit_the_model_are_refused() {
    let tiny = tiny_model();
    let storages = Storages::new(&tiny);
    let pages = [PageId(1)];
    let given_in_vain = ForwardEntry {
        local_pages: &pages,
        ..entry(&[1, 2, 3], 0, &pages)
    };
    let err = forward_error(&tiny, storages.view(), &[given_in_vain]);
    assert!(matches!(err, ModelError::LocalPages { entry: 0 }), "{err}");
    let two_ranks = HostStorage::new(2, 8, tiny.config().bytes_per_page()).expect("storage");
    let view = ModelStorage {
        attention: &two_ranks,
        ..storages.view()
    };
    let err = forward_error(&tiny, view, &[entry(&[1, 2, 3], 0, &pages)]);
    assert!(
        matches!(
            err,
            ModelError::StorageRanks {
                group: "attention",
                n_ranks: 2,
                context_parallel: 1
            }
        ),
        "{err}"
    );
    let windowed = ReferenceModel::new(ReferenceConfig {
        local: Some(LocalAttention {
            n_layers: 1,
            window: GroupKind::SlidingWindow {
                window_tokens: 8,
                retained_tail_tokens: 0,
            },
        }),
        ..*tiny.config()
    })
    .expect("valid");
    let err = forward_error(&windowed, storages.view(), &[entry(&[1, 2, 3], 0, &pages)]);
    assert!(
        matches!(err, ModelError::LocalStorage { has: "has", .. }),
        "{err}"
    );
    let windowed_storages = Storages::new(&windowed);
    let err = forward_error(
        &windowed,
        windowed_storages.view(),
        &[entry(&[1, 2, 3], 0, &pages)],
    );
    assert!(
        matches!(
            err,
            ModelError::PageTableTooShort {
                group: "local",
                len: 0,
                needed: 1,
                ..
            }
        ),
        "{err}"
    );
    let err = forward_error(&tiny, windowed_storages.view(), &[entry(&[1], 0, &pages)]);
    assert!(
        matches!(err, ModelError::LocalStorage { has: "has no", .. }),
        "{err}"
    );
}
