//! A small GGUF v3 writer, for tests and tooling.
//!
//! It writes what [`reader`](super::reader) reads: metadata of every type and
//! tensors given as raw bytes of any [`GgmlType`] (or f32 values), aligned to
//! `general.alignment` when that key is set (32 otherwise). It exists so that
//! tests in this crate and in `engine` can build small, exact GGUF files, and
//! corrupt them on purpose, without Python.

use std::path::Path;

use super::error::{GgufError, Result};
use super::quant::GgmlType;
use super::reader::{MetadataArray, MetadataValue, DEFAULT_ALIGNMENT};

/// Accumulates metadata and tensors, then serialises them.
#[derive(Clone, Debug, Default)]
pub struct GgufWriter {
    metadata: Vec<(String, MetadataValue)>,
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

impl GgufWriter {
    /// An empty file (no metadata, no tensors).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) metadata `key`.
    pub fn metadata(&mut self, key: impl Into<String>, value: MetadataValue) -> &mut Self {
        let key = key.into();
        self.metadata.retain(|(k, _)| *k != key);
        self.metadata.push((key, value));
        self
    }

    /// Adds a tensor of HF (row-major) `shape` whose data is `data`, already
    /// encoded as `ty`; the size must match the shape.
    pub fn tensor(
        &mut self,
        name: impl Into<String>,
        shape: &[usize],
        ty: GgmlType,
        data: Vec<u8>,
    ) -> Result<&mut Self> {
        let name = name.into();
        let dims: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
        let numel = dims.iter().product::<u64>();
        let expected = ty.size_of(numel).filter(|_| dims.first().is_none_or(|&d| d % ty.block_size() as u64 == 0));
        if expected != Some(data.len() as u64) {
            return Err(GgufError::InvalidTensor {
                path: "<gguf writer>".into(),
                tensor: name,
                reason: format!("{} bytes do not encode shape {shape:?} as {ty} ({expected:?} expected)", data.len()),
            });
        }
        self.tensors.push((name, dims, ty, data));
        Ok(self)
    }

    /// Adds an F32 tensor of HF `shape`.
    pub fn tensor_f32(&mut self, name: impl Into<String>, shape: &[usize], data: &[f32]) -> Result<&mut Self> {
        let bytes = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensor(name, shape, GgmlType::F32, bytes)
    }

    fn alignment(&self) -> u64 {
        self.metadata
            .iter()
            .find(|(k, _)| k == "general.alignment")
            .and_then(|(_, v)| v.as_i128())
            .and_then(|a| u64::try_from(a).ok())
            .filter(|a| a.is_power_of_two())
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let align = self.alignment() as usize;
        let pad = |out: &mut Vec<u8>| out.resize(out.len().next_multiple_of(align), 0);
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_str(&mut out, key);
            out.extend_from_slice(&value.value_type().id().to_le_bytes());
            put_value(&mut out, value);
        }
        let mut offset = 0usize;
        for (name, dims, ty, data) in &self.tensors {
            put_str(&mut out, name);
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&ty.id().to_le_bytes());
            out.extend_from_slice(&(offset as u64).to_le_bytes());
            offset = (offset + data.len()).next_multiple_of(align);
        }
        pad(&mut out);
        for (_, _, _, data) in &self.tensors {
            out.extend_from_slice(data);
            pad(&mut out);
        }
        out
    }

    /// Writes the file to `path`.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        std::fs::write(path, self.to_bytes()).map_err(|source| GgufError::Io { path: path.to_path_buf(), source })
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, value: &MetadataValue) {
    use MetadataValue as V;
    match value {
        V::U8(v) => out.push(*v),
        V::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        V::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        V::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        V::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        V::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        V::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        V::Bool(v) => out.push(u8::from(*v)),
        V::String(s) => put_str(out, s),
        V::Array(a) => put_array(out, a),
        V::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        V::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        V::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
    }
}

fn put_array(out: &mut Vec<u8>, a: &MetadataArray) {
    use MetadataArray as A;
    out.extend_from_slice(&a.elem_type().id().to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    fn each<T: Copy, const N: usize>(out: &mut Vec<u8>, v: &[T], f: fn(T) -> [u8; N]) {
        for &x in v {
            out.extend_from_slice(&f(x));
        }
    }
    match a {
        A::U8(v) => out.extend_from_slice(v),
        A::I8(v) => each(out, v, i8::to_le_bytes),
        A::U16(v) => each(out, v, u16::to_le_bytes),
        A::I16(v) => each(out, v, i16::to_le_bytes),
        A::U32(v) => each(out, v, u32::to_le_bytes),
        A::I32(v) => each(out, v, i32::to_le_bytes),
        A::F32(v) => each(out, v, f32::to_le_bytes),
        A::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
        A::String(v) => v.iter().for_each(|s| put_str(out, s)),
        A::Array(v) => v.iter().for_each(|inner| put_array(out, inner)),
        A::U64(v) => each(out, v, u64::to_le_bytes),
        A::I64(v) => each(out, v, i64::to_le_bytes),
        A::F64(v) => each(out, v, f64::to_le_bytes),
    }
}
