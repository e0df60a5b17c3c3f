//! GGUF v2/v3 parser: header, typed metadata, tensor infos, tensor data.
//!
//! Layout (little-endian throughout; see ggml's `docs/gguf.md`):
//!
//! ```text
//! "GGUF" | u32 version | u64 tensor_count | u64 kv_count
//! kv_count   x { string key | u32 value_type | value }
//! tensor_count x { string name | u32 num_dims | u64 ne[num_dims] | u32 ggml_type | u64 offset }
//! padding to `general.alignment` (default 32)
//! tensor data; each tensor at data_start + offset
//! ```
//!
//! where a string is `u64 len | bytes` and an array is
//! `u32 elem_type | u64 len | elems`. Version 1 (u32 counts) and big-endian
//! files are rejected with a message saying so.
//!
//! The file is untrusted input: every count and length is checked against the
//! bytes that remain before anything is allocated, every tensor's extent is
//! checked against the file size when the file is opened, and nothing here
//! panics on bad data. Errors name the file and the key or tensor involved.
//!
//! Tensor data is read on demand with positioned reads, so opening a file
//! costs only its header (a few MB for a 150k-token vocabulary), and
//! [`GgufFile`] is `Sync`: tensors may be loaded from several threads at once.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::error::{GgufError, Result};
use super::quant::{self, DequantError, GgmlType, DEQUANTIZABLE};

const MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's `GGML_MAX_DIMS`.
const MAX_DIMS: u32 = 4;
/// Nesting limit for arrays of arrays: real files use at most 2 levels, and a
/// limit keeps a malicious file from exhausting the stack.
const MAX_ARRAY_DEPTH: u32 = 8;
/// Upper bound on the header (metadata and tensor infos). Real headers are a
/// few MB even with a 256k-token vocabulary; the bound caps what a corrupt
/// length or count can make the parser allocate in a multi-GB file.
pub const MAX_HEADER_BYTES: u64 = 256 << 20;
/// Initial capacity cap for vectors sized by counts read from the file:
/// they grow as entries actually arrive.
const MAX_PREALLOC: u64 = 1 << 16;

/// The type tag of a metadata value (`gguf_type` in ggml).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    /// The type with GGUF id `id` (0..=12).
    pub fn from_id(id: u32) -> Option<Self> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The GGUF id of the type.
    pub fn id(self) -> u32 {
        use ValueType::*;
        match self {
            U8 => 0,
            I8 => 1,
            U16 => 2,
            I16 => 3,
            U32 => 4,
            I32 => 5,
            F32 => 6,
            Bool => 7,
            String => 8,
            Array => 9,
            U64 => 10,
            I64 => 11,
            F64 => 12,
        }
    }

    /// Lower-case name used in error messages (`"u32"`, `"string"`).
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }

    /// The fewest bytes one value of this type occupies in the file, used to
    /// reject element counts the remaining bytes cannot hold.
    fn min_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum MetadataValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(MetadataArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A metadata array: one vector per element type, so a 150k-entry token-type
/// list is one allocation rather than 150k enum values.
#[derive(Clone, Debug, PartialEq)]
pub enum MetadataArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<MetadataArray>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl MetadataValue {
    /// The value's type tag.
    pub fn value_type(&self) -> ValueType {
        use MetadataValue as V;
        match self {
            V::U8(_) => ValueType::U8,
            V::I8(_) => ValueType::I8,
            V::U16(_) => ValueType::U16,
            V::I16(_) => ValueType::I16,
            V::U32(_) => ValueType::U32,
            V::I32(_) => ValueType::I32,
            V::F32(_) => ValueType::F32,
            V::Bool(_) => ValueType::Bool,
            V::String(_) => ValueType::String,
            V::Array(_) => ValueType::Array,
            V::U64(_) => ValueType::U64,
            V::I64(_) => ValueType::I64,
            V::F64(_) => ValueType::F64,
        }
    }

    /// The value of any integer type, widened; `None` for other types.
    pub fn as_i128(&self) -> Option<i128> {
        use MetadataValue as V;
        Some(match *self {
            V::U8(v) => v.into(),
            V::I8(v) => v.into(),
            V::U16(v) => v.into(),
            V::I16(v) => v.into(),
            V::U32(v) => v.into(),
            V::I32(v) => v.into(),
            V::U64(v) => v.into(),
            V::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// A short description for error messages: type and (abridged) value.
    pub fn describe(&self) -> String {
        match self {
            MetadataValue::String(s) => {
                let short: String = s.chars().take(40).collect();
                let ellipsis = if short.len() < s.len() { "..." } else { "" };
                format!("string {short:?}{ellipsis}")
            }
            MetadataValue::Array(a) => format!("array of {}[{}]", a.elem_type().name(), a.len()),
            MetadataValue::F32(v) => format!("f32 {v}"),
            MetadataValue::F64(v) => format!("f64 {v}"),
            MetadataValue::Bool(v) => format!("bool {v}"),
            other => format!("{} {}", other.value_type().name(), other.as_i128().unwrap_or_default()),
        }
    }
}

impl MetadataArray {
    /// The element type.
    pub fn elem_type(&self) -> ValueType {
        use MetadataArray as A;
        match self {
            A::U8(_) => ValueType::U8,
            A::I8(_) => ValueType::I8,
            A::U16(_) => ValueType::U16,
            A::I16(_) => ValueType::I16,
            A::U32(_) => ValueType::U32,
            A::I32(_) => ValueType::I32,
            A::F32(_) => ValueType::F32,
            A::Bool(_) => ValueType::Bool,
            A::String(_) => ValueType::String,
            A::Array(_) => ValueType::Array,
            A::U64(_) => ValueType::U64,
            A::I64(_) => ValueType::I64,
            A::F64(_) => ValueType::F64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        use MetadataArray as A;
        match self {
            A::U8(v) => v.len(),
            A::I8(v) => v.len(),
            A::U16(v) => v.len(),
            A::I16(v) => v.len(),
            A::U32(v) => v.len(),
            A::I32(v) => v.len(),
            A::F32(v) => v.len(),
            A::Bool(v) => v.len(),
            A::String(v) => v.len(),
            A::Array(v) => v.len(),
            A::U64(v) => v.len(),
            A::I64(v) => v.len(),
            A::F64(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements widened to i64 when the element type is an integer type
    /// and every element fits (writers disagree on i32 vs u32 for ids).
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        use MetadataArray as A;
        fn widen<T: Copy>(v: &[T]) -> Option<Vec<i64>>
        where
            i64: TryFrom<T>,
        {
            v.iter().map(|&x| i64::try_from(x).ok()).collect()
        }
        match self {
            A::U8(v) => widen(v),
            A::I8(v) => widen(v),
            A::U16(v) => widen(v),
            A::I16(v) => widen(v),
            A::U32(v) => widen(v),
            A::I32(v) => widen(v),
            A::U64(v) => widen(v),
            A::I64(v) => Some(v.clone()),
            _ => None,
        }
    }

    /// The elements as f32 when the element type is f32 (or f64, narrowed).
    pub fn to_f32_vec(&self) -> Option<Vec<f32>> {
        match self {
            MetadataArray::F32(v) => Some(v.clone()),
            MetadataArray::F64(v) => Some(v.iter().map(|&x| x as f32).collect()),
            _ => None,
        }
    }
}

/// Conversion from a metadata value, used by [`GgufFile::get_as`].
///
/// Integers convert from any integer type when the value fits (writers are
/// not consistent about u32 vs i32 vs u64), floats from f32 or f64; nothing
/// converts between strings, bools and numbers.
pub trait FromMetadata<'a>: Sized {
    /// What the error message says was expected.
    const EXPECTED: &'static str;
    /// The converted value, or `None` when the type does not match.
    fn from_metadata(value: &'a MetadataValue) -> Option<Self>;
}

macro_rules! from_metadata_int {
    ($($t:ty => $name:literal),*) => {$(
        impl FromMetadata<'_> for $t {
            const EXPECTED: &'static str = $name;
            fn from_metadata(value: &MetadataValue) -> Option<Self> {
                value.as_i128().and_then(|v| <$t>::try_from(v).ok())
            }
        }
    )*};
}
from_metadata_int!(u32 => "an integer in u32 range", u64 => "an integer in u64 range",
    i32 => "an integer in i32 range", i64 => "an integer in i64 range",
    usize => "a non-negative integer");

impl FromMetadata<'_> for f32 {
    const EXPECTED: &'static str = "a float";
    fn from_metadata(value: &MetadataValue) -> Option<Self> {
        match *value {
            MetadataValue::F32(v) => Some(v),
            MetadataValue::F64(v) => Some(v as f32),
            _ => None,
        }
    }
}

impl FromMetadata<'_> for f64 {
    const EXPECTED: &'static str = "a float";
    fn from_metadata(value: &MetadataValue) -> Option<Self> {
        match *value {
            MetadataValue::F32(v) => Some(v.into()),
            MetadataValue::F64(v) => Some(v),
            _ => None,
        }
    }
}

impl FromMetadata<'_> for bool {
    const EXPECTED: &'static str = "a bool";
    fn from_metadata(value: &MetadataValue) -> Option<Self> {
        match *value {
            MetadataValue::Bool(v) => Some(v),
            _ => None,
        }
    }
}

impl<'a> FromMetadata<'a> for &'a str {
    const EXPECTED: &'static str = "a string";
    fn from_metadata(value: &'a MetadataValue) -> Option<Self> {
        match value {
            MetadataValue::String(v) => Some(v),
            _ => None,
        }
    }
}

impl<'a> FromMetadata<'a> for &'a [String] {
    const EXPECTED: &'static str = "an array of strings";
    fn from_metadata(value: &'a MetadataValue) -> Option<Self> {
        match value {
            MetadataValue::Array(MetadataArray::String(v)) => Some(v),
            _ => None,
        }
    }
}

impl<'a> FromMetadata<'a> for &'a MetadataArray {
    const EXPECTED: &'static str = "an array";
    fn from_metadata(value: &'a MetadataValue) -> Option<Self> {
        match value {
            MetadataValue::Array(v) => Some(v),
            _ => None,
        }
    }
}

/// One tensor's header entry, validated against the file when it was opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    name: String,
    dims: Vec<u64>,
    ggml_type: GgmlType,
    offset: u64,
    num_elements: u64,
    size_bytes: u64,
}

impl TensorInfo {
    /// The tensor's name in the file (llama.cpp naming, `blk.0.attn_q.weight`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// ggml's `ne`: dimensions fastest first (`dims()[0]` is the row length).
    pub fn dims(&self) -> &[u64] {
        &self.dims
    }

    /// The shape in row-major (PyTorch/HF) order: `dims()` reversed.
    pub fn shape(&self) -> Vec<usize> {
        // Every dim fits in usize: the tensor's bytes fit in the file.
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    /// The element type as stored.
    pub fn ggml_type(&self) -> GgmlType {
        self.ggml_type
    }

    /// Offset of the data relative to the start of the data section.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Number of elements.
    pub fn num_elements(&self) -> u64 {
        self.num_elements
    }

    /// Bytes of data in the file.
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
}

/// Where tensor bytes come from.
#[derive(Debug)]
enum Source {
    File(File),
    Memory(Vec<u8>),
}

/// An open GGUF file: its metadata and tensor infos in memory, tensor data
/// read on demand.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    version: u32,
    metadata: Vec<(String, MetadataValue)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
    file_len: u64,
    source: Source,
}

impl GgufFile {
    /// Opens and validates `path`: header, metadata, tensor infos, and that
    /// every tensor lies inside the file. Tensor data is not read.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let io_err = |source| GgufError::Io { path: path.clone(), source };
        let file = File::open(&path).map_err(io_err)?;
        let file_len = file.metadata().map_err(io_err)?.len();
        let header = {
            let reader = BufReader::with_capacity(1 << 20, &file);
            Parser::new(reader, &path, file_len).parse()?
        };
        Ok(Self::assemble(path, header, file_len, Source::File(file)))
    }

    /// Parses a GGUF image held in memory; `name` stands for the file in
    /// error messages.
    pub fn from_bytes(name: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<Self> {
        let path = name.into();
        let file_len = bytes.len() as u64;
        let header = Parser::new(bytes.as_slice(), &path, file_len).parse()?;
        Ok(Self::assemble(path, header, file_len, Source::Memory(bytes)))
    }

    fn assemble(path: PathBuf, h: Header, file_len: u64, source: Source) -> Self {
        let key_index = h.metadata.iter().enumerate().map(|(i, (k, _))| (k.clone(), i)).collect();
        let tensor_index = h.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        Self {
            path,
            version: h.version,
            metadata: h.metadata,
            key_index,
            tensors: h.tensors,
            tensor_index,
            alignment: h.alignment,
            data_offset: h.data_offset,
            file_len,
            source,
        }
    }

    /// The path (or name) given when opening.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// GGUF format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Alignment of tensor data (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Size of the file in bytes.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// Every metadata entry, in file order.
    pub fn metadata(&self) -> impl Iterator<Item = (&str, &MetadataValue)> {
        self.metadata.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&MetadataValue> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// Whether `key` is present.
    pub fn contains_key(&self, key: &str) -> bool {
        self.key_index.contains_key(key)
    }

    /// The value of `key` converted to `T`; an error names the key when it is
    /// missing or of another type.
    pub fn get_as<'a, T: FromMetadata<'a>>(&'a self, key: &str) -> Result<T> {
        self.get_opt(key)?.ok_or_else(|| GgufError::MissingKey { path: self.path.clone(), key: key.to_owned() })
    }

    /// Like [`get_as`](Self::get_as), but a missing key is `Ok(None)`; a key
    /// of the wrong type is still an error.
    pub fn get_opt<'a, T: FromMetadata<'a>>(&'a self, key: &str) -> Result<Option<T>> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        T::from_metadata(value).map(Some).ok_or_else(|| GgufError::MetadataType {
            path: self.path.clone(),
            key: key.to_owned(),
            expected: T::EXPECTED,
            found: value.describe(),
        })
    }

    /// `key` as a u32 (from any integer type that fits).
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        self.get_as(key)
    }

    /// `key` as a u64 (from any integer type that fits).
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.get_as(key)
    }

    /// `key` as an i64 (from any integer type that fits).
    pub fn get_i64(&self, key: &str) -> Result<i64> {
        self.get_as(key)
    }

    /// `key` as an f32 (from f32, or f64 narrowed).
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        self.get_as(key)
    }

    /// `key` as an f64 (from f32 or f64).
    pub fn get_f64(&self, key: &str) -> Result<f64> {
        self.get_as(key)
    }

    /// `key` as a bool.
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        self.get_as(key)
    }

    /// `key` as a string.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        self.get_as(key)
    }

    /// `key` as an array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<&[String]> {
        self.get_as(key)
    }

    /// `key` as an array of any element type.
    pub fn get_array(&self, key: &str) -> Result<&MetadataArray> {
        self.get_as(key)
    }

    /// `key` as an array of integers (any integer element type), widened.
    pub fn get_i64_array(&self, key: &str) -> Result<Vec<i64>> {
        let array = self.get_array(key)?;
        array.to_i64_vec().ok_or_else(|| GgufError::MetadataType {
            path: self.path.clone(),
            key: key.to_owned(),
            expected: "an array of integers",
            found: format!("array of {}[{}]", array.elem_type().name(), array.len()),
        })
    }

    /// `key` as an array of floats (f32, or f64 narrowed).
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>> {
        let array = self.get_array(key)?;
        array.to_f32_vec().ok_or_else(|| GgufError::MetadataType {
            path: self.path.clone(),
            key: key.to_owned(),
            expected: "an array of floats",
            found: format!("array of {}[{}]", array.elem_type().name(), array.len()),
        })
    }

    /// `general.architecture` (`"llama"`, `"qwen2"`, ...).
    pub fn architecture(&self) -> Result<&str> {
        self.get_str("general.architecture")
    }

    /// Every tensor info, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name` (llama.cpp naming), if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor named `name`, or an error naming it.
    pub fn require_tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.tensor(name).ok_or_else(|| GgufError::MissingTensor { path: self.path.clone(), tensor: name.to_owned() })
    }

    /// The raw (still quantised) bytes of tensor `name`.
    pub fn tensor_bytes(&self, name: &str) -> Result<Vec<u8>> {
        let info = self.require_tensor(name)?;
        self.read_range(info, 0, info.size_bytes)
    }

    /// Tensor `name` dequantised to f32, in row-major order of
    /// [`TensorInfo::shape`] (ggml's `ne[0]` is the fastest dimension, so no
    /// transposition is needed).
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>> {
        let info = self.require_tensor(name)?;
        self.dequantize_elements(info, 0, info.num_elements)
    }

    /// Elements `[start, start + count)` (flat, row-major) of `info`
    /// dequantised; both must be whole blocks. Reads only those bytes, which
    /// is how one expert of a packed expert tensor is loaded.
    pub fn dequantize_elements(&self, info: &TensorInfo, start: u64, count: u64) -> Result<Vec<f32>> {
        let ty = info.ggml_type;
        let invalid =
            |reason: String| GgufError::InvalidTensor { path: self.path.clone(), tensor: info.name.clone(), reason };
        if !ty.can_dequantize() {
            return Err(GgufError::UnsupportedGgmlType {
                path: self.path.clone(),
                tensor: info.name.clone(),
                ggml_type: ty,
                supported: DEQUANTIZABLE.iter().map(|t| t.name()).collect::<Vec<_>>().join(", "),
            });
        }
        let end = start.checked_add(count).filter(|&e| e <= info.num_elements);
        let (Some(byte_start), Some(byte_len), Some(_)) = (ty.size_of(start), ty.size_of(count), end) else {
            return Err(invalid(format!(
                "element range [{start}, {start}+{count}) is not whole {ty} blocks inside {} elements",
                info.num_elements
            )));
        };
        let num = usize::try_from(count).map_err(|_| invalid(format!("{count} elements do not fit in memory")))?;
        let bytes = self.read_range(info, byte_start, byte_len)?;
        quant::dequantize(ty, &bytes, num).map_err(|e| match e {
            DequantError::Unsupported(t) => GgufError::UnsupportedGgmlType {
                path: self.path.clone(),
                tensor: info.name.clone(),
                ggml_type: t,
                supported: DEQUANTIZABLE.iter().map(|t| t.name()).collect::<Vec<_>>().join(", "),
            },
            other => invalid(other.to_string()),
        })
    }

    /// Bytes `[start, start + len)` of the tensor's data (checked against the
    /// tensor's extent, which was checked against the file at open).
    fn read_range(&self, info: &TensorInfo, start: u64, len: u64) -> Result<Vec<u8>> {
        let invalid =
            |reason: String| GgufError::InvalidTensor { path: self.path.clone(), tensor: info.name.clone(), reason };
        if start.checked_add(len).is_none_or(|end| end > info.size_bytes) {
            return Err(invalid(format!("byte range [{start}, {start}+{len}) outside its {} bytes", info.size_bytes)));
        }
        let abs = self.data_offset + info.offset + start;
        let n = usize::try_from(len).map_err(|_| invalid(format!("{len} bytes do not fit in memory")))?;
        let truncated = || GgufError::Truncated {
            path: self.path.clone(),
            what: format!("data of tensor `{}`", info.name),
            offset: abs,
            needed: len,
            file_len: self.file_len,
        };
        match &self.source {
            Source::Memory(bytes) => {
                let s = usize::try_from(abs).map_err(|_| truncated())?;
                bytes.get(s..s.saturating_add(n)).map(<[u8]>::to_vec).ok_or_else(truncated)
            }
            Source::File(file) => {
                let mut buf = vec![0u8; n];
                file.read_exact_at(&mut buf, abs).map_err(|e| {
                    // The file shrank after it was opened and validated.
                    if e.kind() == io::ErrorKind::UnexpectedEof {
                        truncated()
                    } else {
                        GgufError::Io { path: self.path.clone(), source: e }
                    }
                })?;
                Ok(buf)
            }
        }
    }
}

/// Everything the header holds.
struct Header {
    version: u32,
    metadata: Vec<(String, MetadataValue)>,
    tensors: Vec<TensorInfo>,
    alignment: u64,
    data_offset: u64,
}

/// A bounds-checked little-endian reader over the header. `what` describes
/// the item being read, for error messages.
struct Parser<'p, R> {
    r: R,
    pos: u64,
    len: u64,
    path: &'p Path,
    what: String,
    key: String,
}

impl<'p, R: Read> Parser<'p, R> {
    fn new(r: R, path: &'p Path, len: u64) -> Self {
        Self { r, pos: 0, len, path, what: String::new(), key: String::new() }
    }

    fn path(&self) -> PathBuf {
        self.path.to_path_buf()
    }

    /// Bytes the header may still take: to the end of the file or of the
    /// [`MAX_HEADER_BYTES`] budget, whichever comes first.
    fn remaining(&self) -> u64 {
        self.len.min(MAX_HEADER_BYTES).saturating_sub(self.pos)
    }

    fn truncated(&self, needed: u64) -> GgufError {
        if self.pos.saturating_add(needed) <= self.len {
            return GgufError::HeaderTooLarge { path: self.path(), what: self.what.clone(), limit: MAX_HEADER_BYTES };
        }
        GgufError::Truncated {
            path: self.path(),
            what: self.what.clone(),
            offset: self.pos,
            needed,
            file_len: self.len,
        }
    }

    fn read_into(&mut self, buf: &mut [u8]) -> Result<()> {
        let n = buf.len() as u64;
        if n > self.remaining() {
            return Err(self.truncated(n));
        }
        self.r.read_exact(buf).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                self.truncated(n)
            } else {
                GgufError::Io { path: self.path(), source: e }
            }
        })?;
        self.pos += n;
        Ok(())
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut b = [0u8; N];
        self.read_into(&mut b)?;
        Ok(b)
    }

    fn u32(&mut self) -> Result<u32> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64> {
        self.array().map(u64::from_le_bytes)
    }

    /// A u64 element count, rejected when `count * min_size` bytes cannot
    /// remain in the file (so no allocation is ever sized by a bogus count).
    fn count(&mut self, min_size: u64) -> Result<u64> {
        let count = self.u64()?;
        let fits = count.checked_mul(min_size).is_some_and(|b| b <= self.remaining());
        if !fits {
            return Err(GgufError::AbsurdCount {
                path: self.path(),
                what: self.what.clone(),
                count,
                reason: format!("{min_size}+ bytes each, {} bytes left for the header", self.remaining()),
            });
        }
        Ok(count)
    }

    fn bytes(&mut self, n: u64) -> Result<Vec<u8>> {
        if n > self.remaining() {
            return Err(self.truncated(n));
        }
        let mut buf = vec![0u8; n as usize];
        self.read_into(&mut buf)?;
        Ok(buf)
    }

    fn string(&mut self) -> Result<String> {
        let len = self.u64()?;
        let bytes = self.bytes(len)?;
        String::from_utf8(bytes).map_err(|_| GgufError::InvalidUtf8 { path: self.path(), what: self.what.clone() })
    }

    fn parse(mut self) -> Result<Header> {
        self.what = "magic".into();
        let magic: [u8; 4] = self.array()?;
        if magic != MAGIC {
            return Err(GgufError::BadMagic { path: self.path(), found: magic });
        }
        self.what = "version".into();
        let version = self.u32()?;
        if version & 0xFFFF == 0 && (1..=3).contains(&version.swap_bytes()) {
            return Err(GgufError::BigEndian { path: self.path(), version: version.swap_bytes() });
        }
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion { path: self.path(), version });
        }
        self.what = "tensor count".into();
        // Smallest tensor info: name length, num_dims, type, offset.
        let tensor_count = self.count(8 + 4 + 4 + 8)?;
        self.what = "metadata count".into();
        // Smallest entry: key length, type, one byte of value.
        let kv_count = self.count(8 + 4 + 1)?;

        let mut metadata = Vec::with_capacity(kv_count.min(MAX_PREALLOC) as usize);
        let mut seen = HashMap::with_capacity(kv_count.min(MAX_PREALLOC) as usize);
        for i in 0..kv_count {
            self.what = format!("metadata key #{i}");
            let key = self.string()?;
            if seen.insert(key.clone(), ()).is_some() {
                return Err(GgufError::DuplicateKey { path: self.path(), key });
            }
            self.what = format!("value of metadata key `{key}`");
            self.key = key;
            let type_id = self.u32()?;
            let value = self.value(type_id, 0)?;
            metadata.push((std::mem::take(&mut self.key), value));
        }

        let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some((key, v)) => match v.as_i128() {
                Some(a) if a > 0 && (a as u64).is_power_of_two() && a <= u32::MAX as i128 => a as u64,
                _ => {
                    return Err(GgufError::InvalidMetadata {
                        path: self.path(),
                        key: key.clone(),
                        reason: format!("alignment must be a power of two, found {}", v.describe()),
                    })
                }
            },
        };

        let mut tensors: Vec<TensorInfo> = Vec::with_capacity(tensor_count.min(MAX_PREALLOC) as usize);
        let mut names = HashMap::with_capacity(tensor_count.min(MAX_PREALLOC) as usize);
        for i in 0..tensor_count {
            self.what = format!("tensor info #{i}");
            let name = self.string()?;
            if names.insert(name.clone(), ()).is_some() {
                return Err(GgufError::DuplicateTensor { path: self.path(), tensor: name });
            }
            self.what = format!("tensor info #{i} (`{name}`)");
            let num_dims = self.u32()?;
            if num_dims > MAX_DIMS {
                return Err(self.invalid_tensor(&name, format!("{num_dims} dimensions (at most {MAX_DIMS})")));
            }
            let mut dims = Vec::with_capacity(num_dims as usize);
            for _ in 0..num_dims {
                dims.push(self.u64()?);
            }
            // A zero dimension makes the element count 0 whatever the others
            // are, so the overflow and bounds checks below would pass a tensor
            // whose other dimensions are absurd (and are trusted later).
            if let Some(i) = dims.iter().position(|&d| d == 0) {
                return Err(self.invalid_tensor(&name, format!("dimension {i} of {dims:?} is 0")));
            }
            let type_id = self.u32()?;
            let offset = self.u64()?;
            let Some(ggml_type) = GgmlType::from_id(type_id) else {
                return Err(GgufError::UnknownGgmlType { path: self.path(), tensor: name, type_id });
            };
            let num_elements = dims
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .filter(|&n| n <= i64::MAX as u64)
                .ok_or_else(|| self.invalid_tensor(&name, format!("dimensions {dims:?} overflow")))?;
            let row = dims.first().copied().unwrap_or(1);
            if row % ggml_type.block_size() as u64 != 0 {
                return Err(self.invalid_tensor(
                    &name,
                    format!(
                        "row length {row} is not a multiple of the {ggml_type} block size {}",
                        ggml_type.block_size()
                    ),
                ));
            }
            let size_bytes = ggml_type.size_of(num_elements).ok_or_else(|| {
                self.invalid_tensor(&name, format!("size of {num_elements} {ggml_type} elements overflows"))
            })?;
            if offset % alignment != 0 {
                return Err(self
                    .invalid_tensor(&name, format!("offset {offset} is not a multiple of the alignment {alignment}")));
            }
            tensors.push(TensorInfo { name, dims, ggml_type, offset, num_elements, size_bytes });
        }

        self.what = "data section".into();
        let header_end = self.pos;
        let data_offset = header_end.checked_next_multiple_of(alignment).ok_or_else(|| self.truncated(alignment))?;
        for t in &tensors {
            let start = data_offset.checked_add(t.offset);
            let end = start.and_then(|s| s.checked_add(t.size_bytes));
            match (start, end) {
                (Some(_), Some(end)) if end <= self.len => {}
                _ => {
                    return Err(GgufError::TensorOutOfBounds {
                        path: self.path(),
                        tensor: t.name.clone(),
                        start: start.unwrap_or(u64::MAX),
                        end: end.unwrap_or(u64::MAX),
                        file_len: self.len,
                    })
                }
            }
        }
        Ok(Header { version, metadata, tensors, alignment, data_offset })
    }

    fn invalid_tensor(&self, name: &str, reason: String) -> GgufError {
        GgufError::InvalidTensor { path: self.path(), tensor: name.to_owned(), reason }
    }

    fn value_type(&self, type_id: u32) -> Result<ValueType> {
        ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
            path: self.path(),
            what: self.what.clone(),
            type_id,
        })
    }

    fn value(&mut self, type_id: u32, depth: u32) -> Result<MetadataValue> {
        use MetadataValue as V;
        Ok(match self.value_type(type_id)? {
            ValueType::U8 => V::U8(u8::from_le_bytes(self.array()?)),
            ValueType::I8 => V::I8(i8::from_le_bytes(self.array()?)),
            ValueType::U16 => V::U16(u16::from_le_bytes(self.array()?)),
            ValueType::I16 => V::I16(i16::from_le_bytes(self.array()?)),
            ValueType::U32 => V::U32(u32::from_le_bytes(self.array()?)),
            ValueType::I32 => V::I32(i32::from_le_bytes(self.array()?)),
            ValueType::F32 => V::F32(f32::from_le_bytes(self.array()?)),
            ValueType::Bool => V::Bool(self.bool()?),
            ValueType::String => V::String(self.string()?),
            ValueType::Array => V::Array(self.array_value(depth + 1)?),
            ValueType::U64 => V::U64(u64::from_le_bytes(self.array()?)),
            ValueType::I64 => V::I64(i64::from_le_bytes(self.array()?)),
            ValueType::F64 => V::F64(f64::from_le_bytes(self.array()?)),
        })
    }

    fn bool(&mut self) -> Result<bool> {
        match self.array::<1>()?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(GgufError::InvalidMetadata {
                path: self.path(),
                key: self.key.clone(),
                reason: format!("bool byte is {b}, expected 0 or 1"),
            }),
        }
    }

    /// Reads `count` elements with `read`, growing the vector as data
    /// arrives rather than trusting `count` for one big allocation.
    fn elems<T>(&mut self, count: u64, mut read: impl FnMut(&mut Self) -> Result<T>) -> Result<Vec<T>> {
        let mut v = Vec::with_capacity(count.min(MAX_PREALLOC) as usize);
        for _ in 0..count {
            v.push(read(self)?);
        }
        Ok(v)
    }

    fn array_value(&mut self, depth: u32) -> Result<MetadataArray> {
        use MetadataArray as A;
        if depth > MAX_ARRAY_DEPTH {
            return Err(GgufError::InvalidMetadata {
                path: self.path(),
                key: self.key.clone(),
                reason: format!("arrays nested deeper than {MAX_ARRAY_DEPTH} levels"),
            });
        }
        let elem_id = self.u32()?;
        let elem = self.value_type(elem_id)?;
        let n = self.count(elem.min_size())?;
        Ok(match elem {
            ValueType::U8 => A::U8(self.bytes(n)?),
            ValueType::I8 => A::I8(self.elems(n, |p| p.array().map(i8::from_le_bytes))?),
            ValueType::U16 => A::U16(self.elems(n, |p| p.array().map(u16::from_le_bytes))?),
            ValueType::I16 => A::I16(self.elems(n, |p| p.array().map(i16::from_le_bytes))?),
            ValueType::U32 => A::U32(self.elems(n, |p| p.array().map(u32::from_le_bytes))?),
            ValueType::I32 => A::I32(self.elems(n, |p| p.array().map(i32::from_le_bytes))?),
            ValueType::F32 => A::F32(self.elems(n, |p| p.array().map(f32::from_le_bytes))?),
            ValueType::Bool => A::Bool(self.elems(n, |p| p.bool())?),
            ValueType::String => A::String(self.elems(n, |p| p.string())?),
            ValueType::Array => A::Array(self.elems(n, |p| {
                // Each inner array is `u32 elem_type | u64 len | elems`.
                p.array_value(depth + 1)
            })?),
            ValueType::U64 => A::U64(self.elems(n, |p| p.array().map(u64::from_le_bytes))?),
            ValueType::I64 => A::I64(self.elems(n, |p| p.array().map(i64::from_le_bytes))?),
            ValueType::F64 => A::F64(self.elems(n, |p| p.array().map(f64::from_le_bytes))?),
        })
    }
}
