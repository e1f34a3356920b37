//! A writer of small GGUF files for the tests: a tiny Llama with seeded weights (Q4_1 matrices, a Q8_0
//! embedding, F32 norms), which hostile-file tests then damage one field at a time.

/// A metadata value to write.
#[derive(Clone, Debug)]
pub enum Meta {
    U32(u32),
    F32(f32),
    Str(String),
    Strs(Vec<String>),
    I32s(Vec<i32>),
}

/// A tensor to write: name, dimensions (innermost first), GGML type id, raw data.
#[derive(Clone, Debug)]
pub struct Tensor {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: u32,
    pub data: Vec<u8>,
}

/// A GGUF file being put together.
#[derive(Clone, Debug, Default)]
pub struct GgufFile {
    pub meta: Vec<(String, Meta)>,
    pub tensors: Vec<Tensor>,
}

/// Where each part of a written file starts, for tests that damage it.
#[derive(Clone, Debug, Default)]
pub struct Layout {
    /// Byte offset of each tensor info's dimension count, in tensor order.
    pub tensor_info: Vec<usize>,
    /// Byte offset of the data section.
    pub data_start: usize,
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

impl GgufFile {
    pub fn set(&mut self, key: &str, value: Meta) {
        self.meta.retain(|(k, _)| k != key);
        self.meta.push((key.to_string(), value));
    }

    pub fn bytes(&self) -> Vec<u8> {
        self.bytes_with_layout().0
    }

    pub fn bytes_with_layout(&self) -> (Vec<u8>, Layout) {
        let mut out = Vec::new();
        let mut layout = Layout::default();
        out.extend(b"GGUF");
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.meta.len() as u64).to_le_bytes());
        for (key, value) in &self.meta {
            put_str(&mut out, key);
            match value {
                Meta::U32(v) => {
                    out.extend(4u32.to_le_bytes());
                    out.extend(v.to_le_bytes());
                }
                Meta::F32(v) => {
                    out.extend(6u32.to_le_bytes());
                    out.extend(v.to_le_bytes());
                }
                Meta::Str(s) => {
                    out.extend(8u32.to_le_bytes());
                    put_str(&mut out, s);
                }
                Meta::Strs(v) => {
                    out.extend(9u32.to_le_bytes());
                    out.extend(8u32.to_le_bytes());
                    out.extend((v.len() as u64).to_le_bytes());
                    for s in v {
                        put_str(&mut out, s);
                    }
                }
                Meta::I32s(v) => {
                    out.extend(9u32.to_le_bytes());
                    out.extend(5u32.to_le_bytes());
                    out.extend((v.len() as u64).to_le_bytes());
                    for x in v {
                        out.extend(x.to_le_bytes());
                    }
                }
            }
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            put_str(&mut out, &t.name);
            layout.tensor_info.push(out.len());
            out.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.ty.to_le_bytes());
            out.extend(offset.to_le_bytes());
            offset += (t.data.len() as u64).div_ceil(32) * 32;
        }
        while out.len() % 32 != 0 {
            out.push(0);
        }
        layout.data_start = out.len();
        for t in &self.tensors {
            out.extend(&t.data);
            while out.len() % 32 != 0 {
                out.push(0);
            }
        }
        (out, layout)
    }
}

/// A small deterministic generator (SplitMix64).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next() >> 40) as f32 / (1u64 << 24) as f32)
    }
}

fn f16_bytes(x: f32) -> [u8; 2] {
    // Round to nearest through the bits: enough for the moderate values used here.
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32 - 127 + 15;
    if x == 0.0 || exp <= 0 {
        return sign.to_le_bytes();
    }
    let mant = ((bits & 0x7f_ffff) + 0x1000) >> 13;
    let h = sign | (((exp as u16) << 10) + mant as u16);
    h.to_le_bytes()
}

/// `rows * cols / 32` random Q4_1 blocks.
pub fn q4_1(rng: &mut Rng, rows: usize, cols: usize, scale: f32) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..rows * cols / 32 {
        let d = rng.uniform(0.5, 1.0) * scale / 8.0;
        out.extend(f16_bytes(d));
        out.extend(f16_bytes(-7.5 * d));
        for _ in 0..16 {
            out.push(rng.next() as u8);
        }
    }
    out
}

/// `rows * cols / 32` random Q8_0 blocks.
pub fn q8_0(rng: &mut Rng, rows: usize, cols: usize, scale: f32) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..rows * cols / 32 {
        out.extend(f16_bytes(scale / 127.0));
        for _ in 0..32 {
            out.push(rng.next() as u8);
        }
    }
    out
}

fn f32s(values: impl Iterator<Item = f32>) -> Vec<u8> {
    values.flat_map(f32::to_le_bytes).collect()
}

/// Shapes of the tiny model.
pub const LAYERS: usize = 2;
pub const EMBEDDING: usize = 64;
pub const FEED_FORWARD: usize = 128;
pub const HEADS: usize = 4;
pub const KV_HEADS: usize = 2;
pub const VOCAB: usize = 96;

/// A tiny valid Llama GGUF: seeded weights, a byte-level vocabulary of `VOCAB` tokens (the 94 printable
/// ASCII characters after control tokens `<|im_start|>` and `<|im_end|>`), no merges, a ChatML template.
pub fn tiny_llama(seed: u64) -> GgufFile {
    let mut rng = Rng(seed);
    let mut f = GgufFile::default();
    f.set("general.architecture", Meta::Str("llama".into()));
    f.set("llama.block_count", Meta::U32(LAYERS as u32));
    f.set("llama.context_length", Meta::U32(256));
    f.set("llama.embedding_length", Meta::U32(EMBEDDING as u32));
    f.set("llama.feed_forward_length", Meta::U32(FEED_FORWARD as u32));
    f.set("llama.attention.head_count", Meta::U32(HEADS as u32));
    f.set("llama.attention.head_count_kv", Meta::U32(KV_HEADS as u32));
    f.set("llama.rope.freq_base", Meta::F32(10_000.0));
    f.set("llama.attention.layer_norm_rms_epsilon", Meta::F32(1e-5));
    f.set("llama.vocab_size", Meta::U32(VOCAB as u32));
    f.set("tokenizer.ggml.model", Meta::Str("gpt2".into()));
    let mut tokens = vec!["<|im_start|>".to_string(), "<|im_end|>".to_string()];
    tokens.extend((33u8..127).map(|b| (b as char).to_string()));
    let mut types = vec![3, 3];
    types.extend(std::iter::repeat_n(1, tokens.len() - 2));
    f.set("tokenizer.ggml.tokens", Meta::Strs(tokens));
    f.set("tokenizer.ggml.token_type", Meta::I32s(types));
    f.set("tokenizer.ggml.merges", Meta::Strs(Vec::new()));
    f.set("tokenizer.ggml.eos_token_id", Meta::U32(1));
    f.set(
        "tokenizer.chat_template",
        Meta::Str(
            "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + \
             message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ \
             '<|im_start|>assistant\n' }}{% endif %}"
                .into(),
        ),
    );
    let kv = KV_HEADS * EMBEDDING / HEADS;
    let mut push = |name: String, dims: Vec<u64>, ty: u32, data: Vec<u8>| {
        f.tensors.push(Tensor {
            name,
            dims,
            ty,
            data,
        });
    };
    push(
        "token_embd.weight".into(),
        vec![EMBEDDING as u64, VOCAB as u64],
        8,
        q8_0(&mut rng, VOCAB, EMBEDDING, 1.0),
    );
    for l in 0..LAYERS {
        let norm = f32s((0..EMBEDDING).map(|_| rng.uniform(0.8, 1.2)));
        push(
            format!("blk.{l}.attn_norm.weight"),
            vec![EMBEDDING as u64],
            0,
            norm.clone(),
        );
        push(
            format!("blk.{l}.ffn_norm.weight"),
            vec![EMBEDDING as u64],
            0,
            norm,
        );
        for (name, cols, rows) in [
            ("attn_q", EMBEDDING, EMBEDDING),
            ("attn_k", EMBEDDING, kv),
            ("attn_v", EMBEDDING, kv),
            ("attn_output", EMBEDDING, EMBEDDING),
            ("ffn_gate", EMBEDDING, FEED_FORWARD),
            ("ffn_up", EMBEDDING, FEED_FORWARD),
            ("ffn_down", FEED_FORWARD, EMBEDDING),
        ] {
            let data = q4_1(&mut rng, rows, cols, 0.5 / (cols as f32).sqrt());
            push(
                format!("blk.{l}.{name}.weight"),
                vec![cols as u64, rows as u64],
                3,
                data,
            );
        }
    }
    push(
        "output_norm.weight".into(),
        vec![EMBEDDING as u64],
        0,
        f32s((0..EMBEDDING).map(|_| 1.0)),
    );
    f
}
