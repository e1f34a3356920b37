//! The loader against hostile files (issue 29, item 2): each damage to a small valid file is an error
//! naming what is wrong, never a panic or an allocation of the size the file claims.

mod common;

use common::writer::{Meta, Tensor, tiny_llama};
use llama::{Llama, LlamaError, Tokenizer};

fn load(bytes: &[u8]) -> Result<Llama, LlamaError> {
    Llama::from_bytes(bytes)
}

#[test]
fn the_tiny_file_loads_with_its_hyperparameters() {
    let model = load(&tiny_llama(1).bytes()).expect("the valid file loads");
    let c = model.config();
    assert_eq!(
        (
            c.layers,
            c.embedding,
            c.feed_forward,
            c.heads,
            c.kv_heads,
            c.head_dim,
            c.vocab
        ),
        (2, 64, 128, 4, 2, 16, 96)
    );
    assert!(c.tied_embeddings);
    assert_eq!(c.rope_base, 10_000.0);
    Tokenizer::from_gguf(model.gguf()).expect("its tokenizer builds");
}

#[test]
fn a_file_that_is_not_gguf_is_named_so() {
    let err = load(b"PK\x03\x04 this is a zip").unwrap_err();
    assert!(matches!(err, LlamaError::NotGguf { .. }), "{err}");
    assert!(err.to_string().contains("not a GGUF file"), "{err}");
    let err = load(b"GG").unwrap_err();
    assert!(matches!(err, LlamaError::Truncated { .. }), "{err}");
}

#[test]
fn an_unknown_version_is_refused() {
    let mut bytes = tiny_llama(1).bytes();
    bytes[4..8].copy_from_slice(&7u32.to_le_bytes());
    let err = load(&bytes).unwrap_err();
    assert!(matches!(err, LlamaError::Version(7)), "{err}");
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = tiny_llama(1).bytes();
    // Every cut in the header, and a sample of cuts in the data.
    let (_, layout) = tiny_llama(1).bytes_with_layout();
    let cuts = (0..layout.data_start).chain((layout.data_start..bytes.len()).step_by(97));
    for cut in cuts {
        let err = load(&bytes[..cut]).expect_err("a truncated file does not load");
        assert!(
            matches!(
                err,
                LlamaError::Truncated { .. }
                    | LlamaError::Tensor { .. }
                    | LlamaError::NotGguf { .. }
            ),
            "cut at {cut}: {err}"
        );
        if cut >= layout.data_start {
            assert!(
                err.to_string().contains("past the end of the file"),
                "{err}"
            );
        }
    }
}

#[test]
fn counts_and_lengths_larger_than_the_file_are_refused_before_allocating() {
    let file = tiny_llama(1);
    let bytes = file.bytes();
    // The tensor count, then the metadata count.
    for (at, what) in [(8, "tensor infos"), (16, "metadata entries")] {
        let mut b = bytes.clone();
        b[at..at + 8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
        let err = load(&b).unwrap_err();
        assert!(matches!(err, LlamaError::Truncated { .. }), "{err}");
        assert!(err.to_string().contains(what), "{err}");
    }
    // The first key's length.
    let mut b = bytes.clone();
    b[24..32].copy_from_slice(&(1u64 << 60).to_le_bytes());
    let err = load(&b).unwrap_err();
    assert!(matches!(err, LlamaError::Truncated { .. }), "{err}");
    // An array that claims 2^40 strings.
    let mut f = tiny_llama(1);
    f.set("tokenizer.ggml.merges", Meta::Strs(vec!["a b".into()]));
    let mut b = f.bytes();
    let key = b"tokenizer.ggml.merges";
    let at = b.windows(key.len()).position(|w| w == key).unwrap() + key.len() + 8;
    b[at..at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let err = load(&b).unwrap_err();
    assert!(err.to_string().contains("tokenizer.ggml.merges"), "{err}");
}

#[test]
fn another_architecture_is_named() {
    let mut f = tiny_llama(1);
    f.set("general.architecture", Meta::Str("mamba".into()));
    let err = load(&f.bytes()).unwrap_err();
    assert!(
        matches!(err, LlamaError::Architecture(ref a) if a == "mamba"),
        "{err}"
    );
}

#[test]
fn another_quantization_is_named_with_its_tensor() {
    // blk.0.attn_q as Q4_K (type 12): 256-element blocks of 144 bytes, so the row of 64 is not whole
    // blocks; make it Q4_0 (type 2, 18-byte blocks), a known type this model does not read.
    let mut f = tiny_llama(1);
    let t = f
        .tensors
        .iter_mut()
        .find(|t| t.name == "blk.0.attn_q.weight")
        .unwrap();
    t.ty = 2;
    t.data.truncate(64 * 64 / 32 * 18);
    let err = load(&f.bytes()).unwrap_err();
    assert!(matches!(err, LlamaError::Quantization { .. }), "{err}");
    let message = err.to_string();
    assert!(
        message.contains("blk.0.attn_q.weight") && message.contains("Q4_0"),
        "{message}"
    );
    // An unknown type id.
    let mut f = tiny_llama(1);
    f.tensors[0].ty = 99;
    let err = load(&f.bytes()).unwrap_err();
    assert!(err.to_string().contains("token_embd.weight"), "{err}");
}

#[test]
fn tensor_sizes_that_lie_are_errors() {
    // A dimension far larger than the data: the data would end past the end of the file.
    let f = tiny_llama(1);
    let (mut b, layout) = f.bytes_with_layout();
    let at = layout.tensor_info[0] + 4 + 8; // token_embd's second dimension
    b[at..at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let err = load(&b).unwrap_err();
    assert!(matches!(err, LlamaError::Tensor { .. }), "{err}");
    assert!(err.to_string().contains("token_embd.weight"), "{err}");
    // Dimensions whose product overflows.
    let at0 = layout.tensor_info[0] + 4;
    b[at0..at0 + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    b[at..at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let err = load(&b).unwrap_err();
    assert!(err.to_string().contains("overflow"), "{err}");
    // Dimensions the hyperparameters contradict (the file has room for them).
    let mut f = tiny_llama(1);
    let t: &mut Tensor = f
        .tensors
        .iter_mut()
        .find(|t| t.name == "blk.1.ffn_down.weight")
        .unwrap();
    t.dims = vec![64, 128];
    let err = load(&f.bytes()).unwrap_err();
    assert!(err.to_string().contains("blk.1.ffn_down.weight"), "{err}");
    // A tensor whose data overlaps another's.
    let (mut b, layout) = tiny_llama(1).bytes_with_layout();
    let second = layout.tensor_info[1];
    let n_dims = u32::from_le_bytes(b[second..second + 4].try_into().unwrap()) as usize;
    let offset_at = second + 4 + 8 * n_dims + 4;
    b[offset_at..offset_at + 8].copy_from_slice(&0u64.to_le_bytes());
    let err = load(&b).unwrap_err();
    assert!(err.to_string().contains("overlaps"), "{err}");
    // A missing tensor.
    let mut f = tiny_llama(1);
    f.tensors.retain(|t| t.name != "blk.1.attn_v.weight");
    let err = load(&f.bytes()).unwrap_err();
    assert!(err.to_string().contains("blk.1.attn_v.weight") && err.to_string().contains("missing"));
}

#[test]
fn inconsistent_hyperparameters_are_named() {
    let mut f = tiny_llama(1);
    f.set("llama.attention.head_count_kv", Meta::U32(3));
    let err = load(&f.bytes()).unwrap_err();
    assert!(matches!(err, LlamaError::Hyperparameters(_)), "{err}");
    let mut f = tiny_llama(1);
    f.set("llama.block_count", Meta::U32(u32::MAX));
    let err = load(&f.bytes()).unwrap_err();
    assert!(err.to_string().contains("llama.block_count"), "{err}");
    let mut f = tiny_llama(1);
    f.meta
        .retain(|(k, _)| k != "llama.attention.layer_norm_rms_epsilon");
    let err = load(&f.bytes()).unwrap_err();
    assert!(err.to_string().contains("missing"), "{err}");
    let mut f = tiny_llama(1);
    f.set("llama.embedding_length", Meta::Str("wide".into()));
    let err = load(&f.bytes()).unwrap_err();
    assert!(err.to_string().contains("llama.embedding_length"), "{err}");
}

#[test]
fn random_damage_never_panics() {
    let bytes = tiny_llama(1).bytes();
    let (_, layout) = tiny_llama(1).bytes_with_layout();
    let mut rng = common::writer::Rng(7);
    for _ in 0..2000 {
        let mut b = bytes.clone();
        for _ in 0..1 + rng.next() % 4 {
            let at = (rng.next() as usize) % layout.data_start;
            b[at] = rng.next() as u8;
        }
        if let Ok(model) = load(&b) {
            let _ = Tokenizer::from_gguf(model.gguf());
        }
    }
}
