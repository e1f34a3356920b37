//! Tests of the reference model: chunk, batch and thread-count invariance of every page and logit, restore
//! equals recompute (L4), greedy decoding, sliding windows, every refusal, and the chunking property.

mod errors;
mod invariance;
mod kernels;
mod props;

use kv_pool::{HostStorage, PageId, PageStorage};

use super::{ForwardEntry, Logits, ModelStorage, ReferenceConfig, ReferenceModel};

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

/// Attention and recurrent storages sized for `model`.
struct Storages {
    attention: HostStorage,
    recurrent: Option<HostStorage>,
}

impl Storages {
    fn new(model: &ReferenceModel) -> Storages {
        let config = model.config();
        let recurrent = (config.n_recurrent_layers > 0).then(|| {
            HostStorage::new(1, N_PAGES, config.recurrent_bytes_per_page()).expect("storage")
        });
        Storages {
            attention: HostStorage::new(1, N_PAGES, config.bytes_per_page()).expect("storage"),
            recurrent,
        }
    }

    fn view(&self) -> ModelStorage<'_> {
        ModelStorage {
            attention: &self.attention,
            recurrent: self.recurrent.as_ref().map(|s| s as &dyn PageStorage),
        }
    }

    /// The bytes of attention pages `pages`.
    fn attention_bytes(&self, pages: &[PageId]) -> Vec<Vec<u8>> {
        pages
            .iter()
            .map(|&page| read(&self.attention, page))
            .collect()
    }

    /// The bytes of recurrent state page `page` (empty without recurrent layers).
    fn state_bytes(&self, page: PageId) -> Vec<u8> {
        self.recurrent
            .as_ref()
            .map_or_else(Vec::new, |storage| read(storage, page))
    }
}

fn read(storage: &dyn PageStorage, page: PageId) -> Vec<u8> {
    let mut bytes = vec![0u8; storage.bytes_per_page()];
    storage.read(0, page, &mut bytes).expect("read");
    bytes
}

/// One request's pages: an attention page table and a state page, both from page ids starting at `first_page`.
#[derive(Clone, Debug)]
struct Request {
    tokens: Vec<u32>,
    pages: Vec<PageId>,
    state_page: Option<PageId>,
    /// Tokens computed so far.
    n_done: usize,
}

impl Request {
    /// A request over `tokens` whose pages are `first_page, first_page + 1, ...` (enough for `capacity`
    /// tokens) and whose state page is `state_page`.
    fn new(
        model: &ReferenceModel,
        tokens: Vec<u32>,
        capacity: u32,
        first_page: u32,
        state_page: u32,
    ) -> Request {
        let n_pages = model.config().pages_for_tokens(capacity);
        Request {
            tokens,
            pages: (first_page..first_page + n_pages).map(PageId).collect(),
            state_page: (model.config().n_recurrent_layers > 0).then_some(PageId(state_page)),
            n_done: 0,
        }
    }

    /// The entry computing the next `n` tokens of `tokens`.
    fn entry(&self, n: usize) -> ForwardEntry<'_> {
        ForwardEntry {
            tokens: &self.tokens[self.n_done..self.n_done + n],
            first_pos: self.n_done as u32,
            attention_pages: &self.pages,
            recurrent_page: self.state_page,
            want_logits: true,
        }
    }

    /// The pages holding the tokens computed so far.
    fn used_pages(&self, model: &ReferenceModel) -> &[PageId] {
        &self.pages[..model.config().pages_for_tokens(self.n_done as u32) as usize]
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

/// Everything a prefill leaves: every used page's bytes, the state page's bytes and the last logits.
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
        pages: storages.attention_bytes(request.used_pages(model)),
        state: request
            .state_page
            .map_or_else(Vec::new, |page| storages.state_bytes(page)),
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
        window_tokens: Some(64),
        n_recurrent_layers: 0,
        ..hybrid
    };
    assert_eq!(windowed.recurrent_bytes_per_page(), 0);
    let groups = windowed.cache_groups();
    assert_eq!(groups.len(), 1);
    assert_eq!(
        groups[0].kind,
        GroupKind::SlidingWindow {
            window_tokens: 64,
            retained_tail_tokens: 0
        }
    );
}
