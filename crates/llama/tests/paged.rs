//! `PagedKv` (the engine's pages as the model's KV store) on a tiny seeded model: a prompt computed in
//! passes through pages, each pass loading the pages and writing back the new ones, holds exactly the bits
//! of contiguous KV and gives the same logits; pages past the sequence are zero; bad tables and layouts are
//! errors naming the problem.

mod common;

use std::sync::Mutex;

use common::writer::{Rng, VOCAB, tiny_llama};
use llama::{ContiguousKv, Entry, KvStore, Llama, LlamaError, PageAccess, PageLayout, PagedKv};

/// Pages in memory, with an injectable failure.
struct Pages {
    bytes: usize,
    pages: Mutex<Vec<Vec<u8>>>,
    fail: bool,
}

impl Pages {
    fn new(n: usize, bytes: usize) -> Pages {
        Pages {
            bytes,
            pages: Mutex::new(vec![vec![0xAA; bytes]; n]),
            fail: false,
        }
    }
}

impl PageAccess for Pages {
    fn n_pages(&self) -> usize {
        self.pages.lock().unwrap().len()
    }
    fn page_bytes(&self) -> usize {
        self.bytes
    }
    fn read(&self, index: usize, dst: &mut [u8]) -> llama::LlamaResult<()> {
        if self.fail {
            return Err(LlamaError::Pages("injected read failure".into()));
        }
        dst.copy_from_slice(&self.pages.lock().unwrap()[index]);
        Ok(())
    }
    fn write(&self, index: usize, src: &[u8]) -> llama::LlamaResult<()> {
        self.pages.lock().unwrap()[index].copy_from_slice(src);
        Ok(())
    }
}

fn model() -> Llama {
    Llama::from_bytes(&tiny_llama(3).bytes()).expect("the tiny model loads")
}

fn layout(model: &Llama) -> PageLayout {
    let c = model.config();
    PageLayout {
        layers: c.layers,
        kv_dim: c.kv_dim(),
        block_tokens: 4,
    }
}

fn prompt(len: usize) -> Vec<u32> {
    let mut rng = Rng(5);
    (0..len)
        .map(|_| (rng.next() % VOCAB as u64) as u32)
        .collect()
}

#[test]
fn a_prompt_computed_through_pages_holds_the_bits_of_contiguous_kv() {
    let model = model();
    let layout = layout(&model);
    let tokens = prompt(13);
    let c = model.config();
    let mut contiguous = ContiguousKv::new(c.layers, c.kv_dim(), 16);
    let expected = model
        .forward(&mut [Entry {
            tokens: &tokens,
            kv: &mut contiguous,
            want_logits: true,
        }])
        .unwrap();
    // Pages a little larger than the layout, in passes of 5, 6 and 2 tokens (partial pages written back).
    let pages = Pages::new(4, layout.bytes_per_page() + 8);
    let mut last = None;
    let mut start = 0;
    for len in [5, 6, 2] {
        let mut kv = PagedKv::load(layout, &pages, start).unwrap();
        let piece = &tokens[start..start + len];
        last = model
            .forward(&mut [Entry {
                tokens: piece,
                kv: &mut kv,
                want_logits: true,
            }])
            .unwrap()
            .pop()
            .flatten();
        kv.flush().unwrap();
        start += len;
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&last.unwrap()), bits(expected[0].as_ref().unwrap()));
    let loaded = PagedKv::load(layout, &pages, 13).unwrap();
    for layer in 0..c.layers {
        let (k, v) = loaded.read(layer, 13);
        let (ek, ev) = contiguous.read(layer, 13);
        assert_eq!(bits(&k), bits(&ek), "keys of layer {layer}");
        assert_eq!(bits(&v), bits(&ev), "values of layer {layer}");
    }
    // The encoding of the last, partial page is the layout's, zero past position 13 and past the layout.
    let mut page = vec![0u8; layout.bytes_per_page() + 8];
    layout.encode(&contiguous, 12, 16, &mut page);
    assert_eq!(pages.pages.lock().unwrap()[3], page);
    let mut only_13 = vec![0u8; layout.bytes_per_page() + 8];
    layout.encode(&contiguous, 12, 13, &mut only_13);
    assert_eq!(page, only_13);
    assert!(page[layout.bytes_per_page()..].iter().all(|&b| b == 0));
}

#[test]
fn bad_tables_layouts_and_page_failures_are_errors() {
    let model = model();
    let layout = layout(&model);
    let small = Pages::new(2, layout.bytes_per_page() - 1);
    let err = PagedKv::load(layout, &small, 0).unwrap_err().to_string();
    assert!(err.contains("cannot hold the layout"), "{err}");
    let zero = PageLayout {
        block_tokens: 0,
        ..layout
    };
    let pages = Pages::new(2, layout.bytes_per_page());
    assert!(PagedKv::load(zero, &pages, 0).is_err());
    let err = PagedKv::load(layout, &pages, 9).unwrap_err().to_string();
    assert!(
        err.contains("9 positions to load, but the table's 2 pages hold 8"),
        "{err}"
    );
    let failing = Pages {
        fail: true,
        ..Pages::new(2, layout.bytes_per_page())
    };
    let err = PagedKv::load(layout, &failing, 3).unwrap_err().to_string();
    assert!(err.contains("injected read failure"), "{err}");
    // A pass past the table's capacity is refused before anything is written.
    let mut kv = PagedKv::load(layout, &pages, 0).unwrap();
    let tokens = prompt(9);
    let err = model
        .forward(&mut [Entry {
            tokens: &tokens,
            kv: &mut kv,
            want_logits: false,
        }])
        .unwrap_err()
        .to_string();
    assert!(err.contains("exceed the KV store's 8"), "{err}");
}
