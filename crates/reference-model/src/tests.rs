//! Tests of the reference model: chunk, batch and thread-count invariance of every page and logit, restore
//! equals recompute (L4), greedy decoding, sliding windows, every refusal, and the chunking property.

mod errors;
mod invariance;
mod kernels;
mod props;

use kv_pool::{GroupKind, HostStorage, PageId, PageStorage};

use super::{ForwardEntry, LocalAttention, Logits, ModelStorage, ReferenceConfig, ReferenceModel};

/// Pages in each test storage, the null page included.
const N_PAGES: u32 = 256;

/// The tiny model with a seed of its own.
fn tiny_model() -> ReferenceModel {
    ReferenceModel::new(ReferenceConfig {
        seed: 7,
        ..ReferenceConfig::tiny()
    })
    .expect("the tiny config is valid")
}

/// Every shape the model runs, small, each with a name for failures: its own (full attention and one
/// recurrent group), a sliding window beside full attention and a recurrent group, chunked-local beside full
/// attention, and the `glm-mla-hybrid` preset's shape (three recurrent groups on two context-parallel ranks).
fn shapes() -> Vec<(&'static str, ReferenceModel)> {
    let tiny = ReferenceConfig {
        seed: 7,
        ..ReferenceConfig::tiny()
    };
    let configs = [
        ("tiny", tiny),
        (
            "sliding-window",
            ReferenceConfig {
                local: Some(LocalAttention {
                    n_layers: 2,
                    window: GroupKind::SlidingWindow {
                        window_tokens: 40,
                        retained_tail_tokens: 0,
                    },
                }),
                ..tiny
            },
        ),
        (
            "chunked-local",
            ReferenceConfig {
                local: Some(LocalAttention {
                    n_layers: 1,
                    window: GroupKind::ChunkedLocal { chunk_tokens: 48 },
                }),
                n_recurrent_layers: 0,
                ..tiny
            },
        ),
        (
            "ranks",
            ReferenceConfig {
                n_recurrent_groups: 3,
                tokens_per_page: 8,
                context_parallel: 2,
                ..tiny
            },
        ),
    ];
    configs
        .into_iter()
        .map(|(name, config)| (name, ReferenceModel::new(config).expect("valid shape")))
        .collect()
}

/// Attention, local and recurrent storages sized for `model`, with its ranks.
struct Storages {
    attention: HostStorage,
    local: Option<HostStorage>,
    recurrent: Option<HostStorage>,
}

impl Storages {
    fn new(model: &ReferenceModel) -> Storages {
        let config = model.config();
        let n_ranks = config.context_parallel;
        let storage = |bytes| HostStorage::new(n_ranks, N_PAGES, bytes).expect("storage");
        Storages {
            attention: storage(config.bytes_per_page()),
            local: config.local.map(|_| storage(config.local_bytes_per_page())),
            recurrent: (config.n_recurrent_layers > 0)
                .then(|| storage(config.recurrent_bytes_per_page())),
        }
    }

    fn view(&self) -> ModelStorage<'_> {
        ModelStorage {
            attention: &self.attention,
            local: self.local.as_ref().map(|s| s as &dyn PageStorage),
            recurrent: self.recurrent.as_ref().map(|s| s as &dyn PageStorage),
        }
    }

    /// The bytes of attention pages `pages` on every rank.
    fn attention_bytes(&self, pages: &[PageId]) -> Vec<Vec<u8>> {
        pages
            .iter()
            .map(|&page| read(&self.attention, page))
            .collect()
    }

    /// The bytes of local pages `pages` on every rank (none without local layers); null pages skipped.
    fn local_bytes(&self, pages: &[PageId]) -> Vec<Vec<u8>> {
        let Some(local) = &self.local else {
            return Vec::new();
        };
        pages
            .iter()
            .filter(|page| !page.is_null())
            .map(|&page| read(local, page))
            .collect()
    }

    /// The bytes of recurrent state pages `pages` on every rank (empty without recurrent layers).
    fn state_bytes(&self, pages: &[PageId]) -> Vec<u8> {
        self.recurrent.as_ref().map_or_else(Vec::new, |storage| {
            pages.iter().flat_map(|&page| read(storage, page)).collect()
        })
    }
}

/// The bytes of `page` on every rank of `storage`, rank after rank.
fn read(storage: &dyn PageStorage, page: PageId) -> Vec<u8> {
    let mut all = Vec::new();
    for rank in 0..storage.n_ranks() {
        let mut bytes = vec![0u8; storage.bytes_per_page()];
        storage.read(rank, page, &mut bytes).expect("read");
        all.extend(bytes);
    }
    all
}

/// One request's pages: attention and local page tables and state pages. Its attention pages are
/// `first_page, first_page + 1, ...`, its local pages the same ids in the local storage, its state pages
/// `state_page, state_page + 1, ...`.
#[derive(Clone, Debug)]
struct Request {
    tokens: Vec<u32>,
    pages: Vec<PageId>,
    local_pages: Vec<PageId>,
    state_pages: Vec<PageId>,
    /// Tokens computed so far.
    n_done: usize,
}

impl Request {
    /// A request over `tokens` whose pages are `first_page, first_page + 1, ...` (enough for `capacity`
    /// tokens) and whose state pages start at `state_page`.
    fn new(
        model: &ReferenceModel,
        tokens: Vec<u32>,
        capacity: u32,
        first_page: u32,
        state_page: u32,
    ) -> Request {
        let config = model.config();
        let n_pages = config.pages_for_tokens(capacity);
        let pages: Vec<PageId> = (first_page..first_page + n_pages).map(PageId).collect();
        let n_states = config.n_state_pages() as u32;
        Request {
            tokens,
            local_pages: if config.local.is_some() {
                pages.clone()
            } else {
                Vec::new()
            },
            pages,
            state_pages: (state_page..state_page + n_states).map(PageId).collect(),
            n_done: 0,
        }
    }

    /// The entry computing the next `n` tokens of `tokens`.
    fn entry(&self, n: usize) -> ForwardEntry<'_> {
        ForwardEntry {
            tokens: &self.tokens[self.n_done..self.n_done + n],
            first_pos: self.n_done as u32,
            attention_pages: &self.pages,
            local_pages: &self.local_pages,
            state_pages: &self.state_pages,
            want_logits: true,
        }
    }

    /// The pages holding the tokens computed so far.
    fn used_pages(&self, model: &ReferenceModel) -> &[PageId] {
        &self.pages[..model.config().pages_for_tokens(self.n_done as u32) as usize]
    }

    /// The bytes of the attention and local pages holding the tokens computed so far.
    fn used_bytes(&self, model: &ReferenceModel, storages: &Storages) -> Vec<Vec<u8>> {
        let n_used = model.config().pages_for_tokens(self.n_done as u32) as usize;
        let mut bytes = storages.attention_bytes(&self.pages[..n_used]);
        bytes.extend(storages.local_bytes(&self.local_pages[..n_used.min(self.local_pages.len())]));
        bytes
    }
}

/// Prefills the rest of `request.tokens` in chunks of `chunk` tokens; the last chunk's logits.
fn prefill(
    model: &ReferenceModel,
    storages: &Storages,
    request: &mut Request,
    chunk: usize,
) -> Logits {
    let mut last = None;
    while request.n_done < request.tokens.len() {
        let n = chunk.min(request.tokens.len() - request.n_done);
        let mut out = model
            .forward(storages.view(), &[request.entry(n)])
            .expect("forward");
        last = out.pop().flatten();
        request.n_done += n;
    }
    last.expect("at least one chunk")
}

/// Greedy decoding of `n` tokens after `logits`, appending them to the request; the tokens.
fn decode(
    model: &ReferenceModel,
    storages: &Storages,
    request: &mut Request,
    mut logits: Logits,
    n: usize,
) -> Vec<u32> {
    let mut generated = Vec::with_capacity(n);
    for _ in 0..n {
        generated.push(logits.next_token);
        request.tokens.push(logits.next_token);
        let mut out = model
            .forward(storages.view(), &[request.entry(1)])
            .expect("forward");
        request.n_done += 1;
        logits = out.pop().flatten().expect("logits asked for");
    }
    generated
}

/// `n` tokens below `vocab`, from `seed` (splitmix64).
fn tokens(seed: u64, n: usize, vocab: u32) -> Vec<u32> {
    (0..n as u64)
        .map(|i| {
            let mut x = (seed << 32 ^ i).wrapping_add(0x9e37_79b9_7f4a_7c15);
            x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((x ^ (x >> 31)) % u64::from(vocab)) as u32
        })
        .collect()
}

/// Everything a prefill leaves: every used page's bytes (attention, then local), the state pages' bytes and
/// the last logits.
#[derive(Debug, PartialEq)]
struct Outcome {
    pages: Vec<Vec<u8>>,
    state: Vec<u8>,
    logits: Logits,
}

/// Prefills `prompt` in chunks of `chunk` into fresh storages.
fn prefill_outcome(model: &ReferenceModel, prompt: &[u32], chunk: usize) -> Outcome {
    let storages = Storages::new(model);
    let mut request = Request::new(model, prompt.to_vec(), prompt.len() as u32, 1, 1);
    let logits = prefill(model, &storages, &mut request, chunk);
    Outcome {
        pages: request.used_bytes(model, &storages),
        state: storages.state_bytes(&request.state_pages),
        logits,
    }
}

#[test]
fn the_cache_groups_make_a_geometry_with_the_page_sizes() {
    use kv_pool::{Geometry, GroupKind};
    let hybrid = ReferenceConfig::tiny();
    assert_eq!(hybrid.bytes_per_page(), 8192);
    assert_eq!(hybrid.recurrent_bytes_per_page(), 8 + 2048);
    assert_eq!(hybrid.pages_for_tokens(33), 3);
    let groups = hybrid.cache_groups();
    assert_eq!(groups.len(), 2);
    assert_eq!(
        (groups[0].kind, groups[0].bytes_per_page),
        (GroupKind::Full, 8192)
    );
    assert_eq!(
        (groups[1].kind, groups[1].bytes_per_page),
        (GroupKind::Recurrent, 2056)
    );
    assert!(Geometry::new(groups, hybrid.tokens_per_page, 1, 1 << 16).is_ok());
    let windowed = ReferenceConfig {
        local: Some(LocalAttention {
            n_layers: 3,
            window: GroupKind::SlidingWindow {
                window_tokens: 64,
                retained_tail_tokens: 0,
            },
        }),
        n_recurrent_layers: 0,
        ..hybrid
    };
    assert_eq!(windowed.recurrent_bytes_per_page(), 0);
    assert_eq!(windowed.local_bytes_per_page(), 3 * 4096);
    assert_eq!(windowed.max_bytes_per_page(), 3 * 4096);
    let groups = windowed.cache_groups();
    assert_eq!(groups.len(), 2);
    assert_eq!(
        groups[1].kind,
        GroupKind::SlidingWindow {
            window_tokens: 64,
            retained_tail_tokens: 0
        }
    );
    // The preset shape: three recurrent groups on two ranks, 64-token pages.
    let glm = ReferenceConfig {
        n_recurrent_groups: 3,
        tokens_per_page: 64,
        context_parallel: 2,
        ..hybrid
    };
    assert_eq!(glm.block_tokens(), 128);
    assert_eq!(glm.pages_for_tokens(129), 2);
    assert_eq!(glm.n_state_pages(), 3);
    let geometry = glm.geometry(1 << 16).expect("valid");
    assert_eq!(geometry.block_tokens(), 128);
    assert_eq!(
        geometry
            .groups()
            .iter()
            .filter(|group| group.kind == GroupKind::Recurrent)
            .count(),
        3
    );
    let chunked = ReferenceConfig {
        local: Some(LocalAttention {
            n_layers: 1,
            window: GroupKind::ChunkedLocal { chunk_tokens: 32 },
        }),
        ..hybrid
    };
    assert_eq!(
        chunked.cache_groups()[1].kind,
        GroupKind::ChunkedLocal { chunk_tokens: 32 }
    );
}

/// The context is read in one access per run of consecutive pages and rank (issue 36, item 4): on the
/// stand-in device a decode step over a table of three runs makes three reads per rank, and its logits and
/// pages are bit for bit those of host storage.
#[test]
fn context_is_read_once_per_run_of_pages_on_a_device() {
    for context_parallel in [1, 2] {
        let config = ReferenceConfig {
            seed: 7,
            n_recurrent_layers: 0,
            tokens_per_page: 8,
            context_parallel,
            ..ReferenceConfig::tiny()
        };
        let model = ReferenceModel::new(config).expect("valid shape");
        let bytes_per_page = model.config().bytes_per_page();
        let fake = kv_pool::DeviceStorage::fake(context_parallel, N_PAGES, bytes_per_page)
            .expect("storage");
        let host = HostStorage::new(context_parallel, N_PAGES, bytes_per_page).expect("storage");
        let block = model.config().block_tokens() as usize;
        let table: Vec<PageId> = [5, 6, 7, 20, 21, 40, 41].into_iter().map(PageId).collect();
        let mut outputs = Vec::new();
        for storage in [&fake as &dyn PageStorage, &host] {
            let view = ModelStorage {
                attention: storage,
                local: None,
                recurrent: None,
            };
            let mut request = Request {
                tokens: tokens(3, 7 * block - 2, model.config().vocab),
                pages: table.clone(),
                local_pages: Vec::new(),
                state_pages: Vec::new(),
                n_done: 0,
            };
            let n_prompt = request.tokens.len();
            let mut out = model
                .forward(view, &[request.entry(n_prompt)])
                .expect("forward");
            request.n_done = n_prompt;
            let logits = out.pop().flatten().expect("logits");
            request.tokens.push(logits.next_token);
            let reads = fake.device().stats().reads;
            let decoded = model.forward(view, &[request.entry(1)]).expect("forward");
            if std::ptr::addr_eq(storage, &fake as &dyn PageStorage) {
                assert_eq!(
                    fake.device().stats().reads - reads,
                    3 * u64::from(context_parallel),
                    "one read per run and rank"
                );
            }
            let pages: Vec<Vec<u8>> = table.iter().map(|&page| read(storage, page)).collect();
            outputs.push((decoded, pages));
        }
        assert_eq!(outputs[0], outputs[1], "device and host bit for bit");
    }
}
