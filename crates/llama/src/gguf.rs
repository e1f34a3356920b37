//! A reader of the GGUF container (versions 2 and 3) over the bytes of the whole file.
//!
//! Every length, count and offset the file states is checked against the bytes that remain before anything
//! is allocated for it, so a hostile file costs at most its own size in memory: a string or an array that
//! claims more than the file holds, a tensor whose data would end past the end of the file or overlap
//! another's, or a size whose arithmetic overflows is an error naming the field, never a panic.
//!
//! Layout (little-endian): `"GGUF"`, version `u32`, tensor count `u64`, metadata count `u64`; the metadata
//! (key string, value type `u32`, value); the tensor infos (name, dimension count `u32`, dimensions `u64`
//! innermost first, type `u32`, data offset `u64` relative to the data section); the data section at the
//! next multiple of `general.alignment` (32 unless stated).

use std::collections::HashMap;

use crate::error::{LlamaError, LlamaResult};

/// The most dimensions a GGML tensor has.
const MAX_DIMS: u32 = 4;
/// Data alignment when the file does not state `general.alignment`.
const DEFAULT_ALIGNMENT: u64 = 32;
/// Deepest nesting of arrays accepted in metadata.
const MAX_ARRAY_DEPTH: u32 = 4;
/// Most array elements accepted in all the metadata together (a vocabulary and its merges take about
/// 100,000): each is held as a [`Value`] of 32 bytes, so this bounds the metadata's memory to 128 MiB
/// whatever the file declares.
const MAX_ARRAY_ELEMENTS: u64 = 1 << 22;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

impl Value {
    /// The value as an unsigned integer, when it is a non-negative integer of any width.
    pub(crate) fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(u64::from(v)),
            Value::U16(v) => Some(u64::from(v)),
            Value::U32(v) => Some(u64::from(v)),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, when it is a float.
    pub(crate) fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F32(_) => "f32",
            Value::F64(_) => "f64",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
        }
    }
}

/// A GGML element type: its id in the file, name, and block geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GgmlType {
    pub(crate) id: u32,
    pub(crate) name: &'static str,
    /// Elements per block.
    pub(crate) block: u64,
    /// Bytes per block.
    pub(crate) block_bytes: u64,
}

impl GgmlType {
    pub(crate) const F32: u32 = 0;
    pub(crate) const Q4_1: u32 = 3;
    pub(crate) const Q8_0: u32 = 8;

    /// The types whose sizes this reader knows (llama.cpp's `ggml_type` table).
    const KNOWN: &[(u32, &str, u64, u64)] = &[
        (0, "F32", 1, 4),
        (1, "F16", 1, 2),
        (2, "Q4_0", 32, 18),
        (3, "Q4_1", 32, 20),
        (6, "Q5_0", 32, 22),
        (7, "Q5_1", 32, 24),
        (8, "Q8_0", 32, 34),
        (9, "Q8_1", 32, 36),
        (10, "Q2_K", 256, 84),
        (11, "Q3_K", 256, 110),
        (12, "Q4_K", 256, 144),
        (13, "Q5_K", 256, 176),
        (14, "Q6_K", 256, 210),
        (15, "Q8_K", 256, 292),
        (24, "I8", 1, 1),
        (25, "I16", 1, 2),
        (26, "I32", 1, 4),
        (27, "I64", 1, 8),
        (28, "F64", 1, 8),
        (30, "BF16", 1, 2),
    ];

    /// The type of id `id`, if known.
    pub(crate) fn from_id(id: u32) -> Option<GgmlType> {
        GgmlType::KNOWN
            .iter()
            .find(|t| t.0 == id)
            .map(|&(id, name, block, block_bytes)| GgmlType {
                id,
                name,
                block,
                block_bytes,
            })
    }
}

/// One tensor's description and where its data lies in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TensorInfo {
    pub(crate) name: String,
    /// Dimensions, innermost (contiguous) first, as GGML writes them.
    pub(crate) dims: Vec<u64>,
    pub(crate) ty: GgmlType,
    /// Byte range of the data in the file.
    pub(crate) start: u64,
    pub(crate) len: u64,
}

/// A parsed GGUF file: its metadata and tensor infos, every tensor's data checked to lie in the file.
#[derive(Debug)]
pub struct Gguf {
    pub(crate) metadata: HashMap<String, Value>,
    pub(crate) tensors: Vec<TensorInfo>,
}

impl Gguf {
    /// Parses the header of `bytes` (the whole file) and checks every tensor's data range against it.
    /// Errors: `NotGguf`, `Version`, `Truncated`, `Malformed`, `Quantization` (a type id this reader does
    /// not know, so that the size of its data cannot be checked), `Tensor` (a size that overflows, a row
    /// that is not whole blocks, data outside the file, misaligned or overlapping another tensor's).
    pub fn parse(bytes: &[u8]) -> LlamaResult<Gguf> {
        let mut r = Reader {
            bytes,
            pos: 0,
            array_elements: 0,
        };
        let magic = r.take(4, "the magic")?;
        if magic != b"GGUF" {
            return Err(LlamaError::NotGguf {
                found: magic.to_vec(),
            });
        }
        let version = r.u32("the version")?;
        if !(2..=3).contains(&version) {
            return Err(LlamaError::Version(version));
        }
        let n_tensors = r.u64("the tensor count")?;
        let n_kv = r.u64("the metadata count")?;
        let metadata = read_metadata(&mut r, n_kv)?;
        let raw = read_tensor_infos(&mut r, n_tensors)?;
        let alignment = alignment(&metadata)?;
        let data_start = (r.pos as u64).div_ceil(alignment) * alignment;
        let file_len = bytes.len() as u64;
        let tensors = raw
            .into_iter()
            .map(|raw| locate(raw, data_start, alignment, file_len))
            .collect::<LlamaResult<Vec<_>>>()?;
        check_distinct(&tensors)?;
        Ok(Gguf { metadata, tensors })
    }

    /// The metadata value of `key`.
    pub(crate) fn get(&self, key: &str) -> LlamaResult<&Value> {
        self.metadata.get(key).ok_or_else(|| LlamaError::Metadata {
            key: key.into(),
            problem: "missing".into(),
        })
    }

    /// The unsigned integer of `key`.
    pub(crate) fn get_u64(&self, key: &str) -> LlamaResult<u64> {
        let value = self.get(key)?;
        value.as_u64().ok_or_else(|| LlamaError::Metadata {
            key: key.into(),
            problem: format!(
                "a {} where a non-negative integer belongs",
                value.type_name()
            ),
        })
    }

    /// The float of `key`.
    pub(crate) fn get_f32(&self, key: &str) -> LlamaResult<f32> {
        let value = self.get(key)?;
        value.as_f32().ok_or_else(|| LlamaError::Metadata {
            key: key.into(),
            problem: format!("a {} where a float belongs", value.type_name()),
        })
    }

    /// The string of `key`.
    pub(crate) fn get_str(&self, key: &str) -> LlamaResult<&str> {
        match self.get(key)? {
            Value::String(s) => Ok(s),
            other => Err(LlamaError::Metadata {
                key: key.into(),
                problem: format!("a {} where a string belongs", other.type_name()),
            }),
        }
    }

    /// The array of `key`.
    pub fn get_array(&self, key: &str) -> LlamaResult<&[Value]> {
        match self.get(key)? {
            Value::Array(a) => Ok(a),
            other => Err(LlamaError::Metadata {
                key: key.into(),
                problem: format!("a {} where an array belongs", other.type_name()),
            }),
        }
    }

    /// The tensor named `name`.
    pub(crate) fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

/// A cursor over the file's bytes whose every read is bounds-checked.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// Array elements read so far, against `MAX_ARRAY_ELEMENTS`.
    array_elements: u64,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn truncated(&self, what: &str, needed: u64) -> LlamaError {
        LlamaError::Truncated {
            what: what.into(),
            offset: self.pos as u64,
            needed,
            available: self.remaining(),
        }
    }

    fn take(&mut self, n: u64, what: &str) -> LlamaResult<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.truncated(what, n));
        }
        let n = n as usize;
        let slice = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(slice)
    }

    /// Fails unless `count` items of at least `min_bytes` each fit in what remains.
    fn check_count(&self, count: u64, min_bytes: u64, what: &str) -> LlamaResult<()> {
        match count.checked_mul(min_bytes) {
            Some(needed) if needed <= self.remaining() => Ok(()),
            needed => Err(LlamaError::Truncated {
                what: format!("{what} ({count} declared)"),
                offset: self.pos as u64,
                needed: needed.unwrap_or(u64::MAX),
                available: self.remaining(),
            }),
        }
    }

    fn array<const N: usize>(&mut self, what: &str) -> LlamaResult<[u8; N]> {
        let slice = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(slice);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> LlamaResult<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> LlamaResult<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn string(&mut self, what: &str) -> LlamaResult<String> {
        let len = self.u64(what)?;
        let start = self.pos;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| {
            LlamaError::Malformed(format!("{what}: the string at byte {start} is not UTF-8"))
        })
    }

    /// The smallest encoding of a value of type `ty`, to bound an array's count before allocating it.
    fn min_size(ty: u32) -> u64 {
        match ty {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            8 | 10..=12 => 8,
            _ => 12, // an array: its type and count
        }
    }

    fn value(&mut self, ty: u32, what: &str, depth: u32) -> LlamaResult<Value> {
        Ok(match ty {
            0 => Value::U8(u8::from_le_bytes(self.array(what)?)),
            1 => Value::I8(i8::from_le_bytes(self.array(what)?)),
            2 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            4 => Value::U32(u32::from_le_bytes(self.array(what)?)),
            5 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            7 => match self.array::<1>(what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => {
                    return Err(LlamaError::Malformed(format!(
                        "{what}: bool byte {b} is neither 0 nor 1"
                    )));
                }
            },
            8 => Value::String(self.string(what)?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(LlamaError::Malformed(format!(
                        "{what}: arrays nested deeper than {MAX_ARRAY_DEPTH}"
                    )));
                }
                let elem_ty = self.u32(what)?;
                if elem_ty > 12 {
                    return Err(LlamaError::Malformed(format!(
                        "{what}: array element type {elem_ty} is not a GGUF value type"
                    )));
                }
                let count = self.u64(what)?;
                self.check_count(count, Self::min_size(elem_ty), what)?;
                self.array_elements = self.array_elements.saturating_add(count);
                if self.array_elements > MAX_ARRAY_ELEMENTS {
                    return Err(LlamaError::Malformed(format!(
                        "{what}: the metadata's arrays hold more than the {MAX_ARRAY_ELEMENTS} elements \
                         this reader accepts"
                    )));
                }
                let mut values = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    values.push(self.value(elem_ty, what, depth + 1)?);
                }
                Value::Array(values)
            }
            10 => Value::U64(u64::from_le_bytes(self.array(what)?)),
            11 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            other => {
                return Err(LlamaError::Malformed(format!(
                    "{what}: value type {other} is not a GGUF value type"
                )));
            }
        })
    }
}

/// A tensor info as the header states it: name, dimensions, type id, data offset.
type RawTensor = (String, Vec<u64>, u32, u64);

/// The `n_kv` metadata entries; a key that appears twice is `Malformed`.
fn read_metadata(r: &mut Reader<'_>, n_kv: u64) -> LlamaResult<HashMap<String, Value>> {
    // Each metadata entry takes at least 12 bytes (an empty key and a type).
    r.check_count(n_kv, 12, "the metadata entries")?;
    let mut metadata = HashMap::new();
    for idx in 0..n_kv {
        let key = r.string(&format!("metadata key {idx}"))?;
        let what = format!("metadata `{key}`");
        let ty = r.u32(&what)?;
        let value = r.value(ty, &what, 0)?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(LlamaError::Malformed(format!(
                "metadata key `{key}` appears twice"
            )));
        }
    }
    Ok(metadata)
}

/// The `n_tensors` tensor infos, each with 1 to `MAX_DIMS` dimensions.
fn read_tensor_infos(r: &mut Reader<'_>, n_tensors: u64) -> LlamaResult<Vec<RawTensor>> {
    // Each tensor info takes at least 24 bytes.
    r.check_count(n_tensors, 24, "the tensor infos")?;
    let mut raw = Vec::new();
    for idx in 0..n_tensors {
        let name = r.string(&format!("tensor name {idx}"))?;
        let what = format!("tensor `{name}`");
        let n_dims = r.u32(&what)?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(LlamaError::Tensor {
                tensor: name,
                problem: format!("{n_dims} dimensions (1 to {MAX_DIMS} are valid)"),
            });
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(r.u64(&what)?);
        }
        let type_id = r.u32(&what)?;
        let offset = r.u64(&what)?;
        raw.push((name, dims, type_id, offset));
    }
    Ok(raw)
}

/// The data alignment: `general.alignment`, a power of two up to 2^20, or the default.
fn alignment(metadata: &HashMap<String, Value>) -> LlamaResult<u64> {
    match metadata.get("general.alignment") {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(value) => match value.as_u64() {
            Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => Ok(a),
            _ => Err(LlamaError::Metadata {
                key: "general.alignment".into(),
                problem: format!("{value:?} is not a power of two up to 2^20"),
            }),
        },
    }
}

/// Where a tensor's data lies: its type known, its size not overflowing, rows of whole blocks, its offset
/// aligned, its bytes inside the file.
fn locate(
    (name, dims, type_id, offset): RawTensor,
    data_start: u64,
    alignment: u64,
    file_len: u64,
) -> LlamaResult<TensorInfo> {
    let Some(ty) = GgmlType::from_id(type_id) else {
        return Err(LlamaError::Quantization {
            tensor: name,
            type_id,
            type_name: "unknown",
            expected: "a GGML type id this reader knows",
        });
    };
    let bad = |problem: String| LlamaError::Tensor {
        tensor: name.clone(),
        problem,
    };
    let elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| bad(format!("dimensions {dims:?} overflow")))?;
    if dims[0] % ty.block != 0 {
        return Err(bad(format!(
            "rows of {} elements are not whole {} blocks of {}",
            dims[0], ty.name, ty.block
        )));
    }
    let len = (elements / ty.block)
        .checked_mul(ty.block_bytes)
        .ok_or_else(|| bad(format!("the size of dimensions {dims:?} overflows")))?;
    if offset % alignment != 0 {
        return Err(bad(format!(
            "data offset {offset} is not a multiple of the alignment {alignment}"
        )));
    }
    let start = data_start
        .checked_add(offset)
        .filter(|s| s.checked_add(len).is_some_and(|end| end <= file_len))
        .ok_or_else(|| {
            bad(format!(
                "data of {len} bytes at offset {offset} (byte {}) ends past the end of the \
                 file ({file_len} bytes)",
                data_start.saturating_add(offset)
            ))
        })?;
    Ok(TensorInfo {
        name,
        dims,
        ty,
        start,
        len,
    })
}

/// No two tensors' data overlap, and no name appears twice.
fn check_distinct(tensors: &[TensorInfo]) -> LlamaResult<()> {
    let mut by_start: Vec<&TensorInfo> = tensors.iter().filter(|t| t.len > 0).collect();
    by_start.sort_by_key(|t| t.start);
    for pair in by_start.windows(2) {
        if pair[0].start + pair[0].len > pair[1].start {
            return Err(LlamaError::Tensor {
                tensor: pair[1].name.clone(),
                problem: format!("its data overlaps the data of `{}`", pair[0].name),
            });
        }
    }
    let mut names = std::collections::HashSet::new();
    for t in tensors {
        if !names.insert(t.name.as_str()) {
            return Err(LlamaError::Malformed(format!(
                "tensor `{}` appears twice",
                t.name
            )));
        }
    }
    Ok(())
}
