//! Element types, with the codes of `msgl_dtype` in tensor.h.

use std::fmt;

use half::{bf16, f16};

use crate::sys::kernels as abi;

/// The element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    I32,
    I64,
    U8,
}

impl DType {
    /// Every dtype, in ABI-code order.
    pub const ALL: [DType; 6] = [DType::F32, DType::F16, DType::BF16, DType::I32, DType::I64, DType::U8];

    /// Bytes per element.
    pub const fn size_in_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I64 => 8,
            DType::U8 => 1,
        }
    }

    /// The lowercase name (`bf16`), as in error messages and on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
        }
    }

    /// Floating-point types.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// The `msgl_dtype` code of tensor.h.
    pub const fn abi_code(self) -> i32 {
        (match self {
            DType::F32 => abi::MSGL_F32,
            DType::F16 => abi::MSGL_F16,
            DType::BF16 => abi::MSGL_BF16,
            DType::I32 => abi::MSGL_I32,
            DType::I64 => abi::MSGL_I64,
            DType::U8 => abi::MSGL_U8,
        }) as i32
    }

    /// Parses `f32`, `float32`, `bf16`, `bfloat16`, `f16`, `float16`, `half` (and the
    /// `torch_dtype` spellings of HuggingFace configs).
    pub fn parse(s: &str) -> Option<DType> {
        match s.trim().to_ascii_lowercase().trim_start_matches("torch.") {
            "f32" | "float32" | "float" | "fp32" => Some(DType::F32),
            "f16" | "float16" | "half" | "fp16" => Some(DType::F16),
            "bf16" | "bfloat16" => Some(DType::BF16),
            "i32" | "int32" => Some(DType::I32),
            "i64" | "int64" => Some(DType::I64),
            "u8" | "uint8" => Some(DType::U8),
            _ => None,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that is the element of a tensor of one dtype.
pub trait Element: bytemuck::Pod + Copy + Send + Sync + 'static {
    /// The dtype of this element type.
    const DTYPE: DType;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
}
impl Element for f16 {
    const DTYPE: DType = DType::F16;
}
impl Element for bf16 {
    const DTYPE: DType = DType::BF16;
}
impl Element for i32 {
    const DTYPE: DType = DType::I32;
}
impl Element for i64 {
    const DTYPE: DType = DType::I64;
}
impl Element for u8 {
    const DTYPE: DType = DType::U8;
}

/// A float element type the CPU reference ops compute with (through f32).
pub trait FloatElement: Element {
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
}

impl FloatElement for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
}
impl FloatElement for f16 {
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}
impl FloatElement for bf16 {
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_match_the_abi_and_names_round_trip() {
        for (i, d) in DType::ALL.iter().enumerate() {
            assert_eq!(d.abi_code(), i as i32);
            assert_eq!(DType::parse(d.name()), Some(*d));
        }
        assert_eq!(DType::parse("torch.bfloat16"), Some(DType::BF16));
        assert_eq!(DType::parse("float8"), None);
    }
}
