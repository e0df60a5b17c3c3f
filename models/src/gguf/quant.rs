//! ggml tensor types and their CPU dequantisation to f32.
//!
//! Every supported type is dequantised bit-exactly like the Python `gguf`
//! package (`gguf.quants.dequantize`, version 0.19), which computes in float32
//! numpy: each block function below performs the same float operations in the
//! same order (e.g. Q4_K is `(d * sc) * q - (dmin * m)`, never fused), so the
//! f32 results agree to the last bit. Rust never contracts `a * b + c` into an
//! FMA on its own, which is what keeps this true.
//!
//! Block layouts follow ggml's `block_q*` structs (`ggml-common.h`); the
//! scales are little-endian f16. Blocks are independent, so large tensors are
//! dequantised in parallel with rayon, a few hundred blocks per task.

use std::fmt;

use half::f16;
use rayon::prelude::*;

/// A ggml tensor element type, as stored in a GGUF tensor info.
///
/// The list mirrors `GGMLQuantizationType` of gguf-py so that every id found
/// in the wild is recognised (and a file using one we cannot dequantise is
/// rejected by name, not as garbage); ids 4, 5 and 31-33, 36-38 are retired.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
    NVFP4,
    Q1_0,
}

/// Super-block size of the k-quants.
const QK_K: usize = 256;

/// (type, id, name, elements per block, bytes per block): the single table
/// from which ids, names and sizes are derived (gguf-py `GGML_QUANT_SIZES`).
const TYPES: &[(GgmlType, u32, &str, usize, usize)] = &[
    (GgmlType::F32, 0, "F32", 1, 4),
    (GgmlType::F16, 1, "F16", 1, 2),
    (GgmlType::Q4_0, 2, "Q4_0", 32, 2 + 16),
    (GgmlType::Q4_1, 3, "Q4_1", 32, 2 + 2 + 16),
    (GgmlType::Q5_0, 6, "Q5_0", 32, 2 + 4 + 16),
    (GgmlType::Q5_1, 7, "Q5_1", 32, 2 + 2 + 4 + 16),
    (GgmlType::Q8_0, 8, "Q8_0", 32, 2 + 32),
    (GgmlType::Q8_1, 9, "Q8_1", 32, 4 + 4 + 32),
    (GgmlType::Q2_K, 10, "Q2_K", QK_K, 2 + 2 + QK_K / 16 + QK_K / 4),
    (GgmlType::Q3_K, 11, "Q3_K", QK_K, 2 + QK_K / 4 + QK_K / 8 + 12),
    (GgmlType::Q4_K, 12, "Q4_K", QK_K, 2 + 2 + QK_K / 2 + 12),
    (GgmlType::Q5_K, 13, "Q5_K", QK_K, 2 + 2 + QK_K / 2 + QK_K / 8 + 12),
    (GgmlType::Q6_K, 14, "Q6_K", QK_K, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16),
    (GgmlType::Q8_K, 15, "Q8_K", QK_K, 4 + QK_K + QK_K / 8),
    (GgmlType::IQ2_XXS, 16, "IQ2_XXS", QK_K, 2 + QK_K / 4),
    (GgmlType::IQ2_XS, 17, "IQ2_XS", QK_K, 2 + QK_K / 4 + QK_K / 32),
    (GgmlType::IQ3_XXS, 18, "IQ3_XXS", QK_K, 2 + QK_K / 4 + QK_K / 8),
    (GgmlType::IQ1_S, 19, "IQ1_S", QK_K, 2 + QK_K / 8 + QK_K / 16),
    (GgmlType::IQ4_NL, 20, "IQ4_NL", 32, 2 + 16),
    (GgmlType::IQ3_S, 21, "IQ3_S", QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4),
    (GgmlType::IQ2_S, 22, "IQ2_S", QK_K, 2 + QK_K / 4 + QK_K / 16),
    (GgmlType::IQ4_XS, 23, "IQ4_XS", QK_K, 2 + 2 + QK_K / 2 + QK_K / 64),
    (GgmlType::I8, 24, "I8", 1, 1),
    (GgmlType::I16, 25, "I16", 1, 2),
    (GgmlType::I32, 26, "I32", 1, 4),
    (GgmlType::I64, 27, "I64", 1, 8),
    (GgmlType::F64, 28, "F64", 1, 8),
    (GgmlType::IQ1_M, 29, "IQ1_M", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32),
    (GgmlType::BF16, 30, "BF16", 1, 2),
    (GgmlType::TQ1_0, 34, "TQ1_0", QK_K, 2 + 4 * 13),
    (GgmlType::TQ2_0, 35, "TQ2_0", QK_K, 2 + 64),
    (GgmlType::MXFP4, 39, "MXFP4", 32, 1 + 16),
    (GgmlType::NVFP4, 40, "NVFP4", 64, 4 + 32),
    (GgmlType::Q1_0, 41, "Q1_0", 128, 2 + 16),
];

/// The types [`dequantize_into`] handles, in the order error messages list them.
pub const DEQUANTIZABLE: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

impl GgmlType {
    /// The type with ggml id `id`, or `None` for an id no ggml version defines.
    pub fn from_id(id: u32) -> Option<Self> {
        TYPES.iter().find(|t| t.1 == id).map(|t| t.0)
    }

    fn row(self) -> &'static (GgmlType, u32, &'static str, usize, usize) {
        // Every variant has exactly one row (checked by a unit test), so the
        // fallback is unreachable; it keeps this function panic-free.
        TYPES.iter().find(|t| t.0 == self).unwrap_or(&TYPES[0])
    }

    /// The ggml id written in GGUF tensor infos.
    pub fn id(self) -> u32 {
        self.row().1
    }

    /// llama.cpp's name for the type (`"Q4_K"`).
    pub fn name(self) -> &'static str {
        self.row().2
    }

    /// Elements per block: 1 for plain types, 32 or 256 for quantised ones.
    pub fn block_size(self) -> usize {
        self.row().3
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        self.row().4
    }

    /// Whether [`dequantize_into`] supports this type.
    pub fn can_dequantize(self) -> bool {
        DEQUANTIZABLE.contains(&self)
    }

    /// Bytes taken by `num_elements` elements, or `None` when the count is
    /// not a whole number of blocks or the size overflows.
    pub fn size_of(self, num_elements: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if !num_elements.is_multiple_of(bs) {
            return None;
        }
        (num_elements / bs).checked_mul(self.type_size() as u64)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why [`dequantize_into`] refused its input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DequantError {
    #[error("dequantising {0} is not supported")]
    Unsupported(GgmlType),
    #[error("{ggml_type}: {src_bytes} bytes do not hold {dst_len} elements ({expected} bytes expected)")]
    SizeMismatch { ggml_type: GgmlType, src_bytes: usize, dst_len: usize, expected: usize },
}

/// Blocks per rayon task: large enough to amortise scheduling, small enough
/// to spread a 100k-block tensor over every core.
const BLOCKS_PER_TASK: usize = 512;

/// Dequantises `src` (whole blocks of `ty`) into `dst`, which must hold
/// exactly `src.len() / type_size * block_size` elements.
pub fn dequantize_into(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), DequantError> {
    let (bs, ts) = (ty.block_size(), ty.type_size());
    let expected = dst.len() / bs * ts;
    if !dst.len().is_multiple_of(bs) || src.len() != expected {
        return Err(DequantError::SizeMismatch { ggml_type: ty, src_bytes: src.len(), dst_len: dst.len(), expected });
    }
    match ty {
        GgmlType::F32 => run(src, dst, 4, 1, |b, o| o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        GgmlType::F16 => run(src, dst, 2, 1, |b, o| o[0] = le_f16(b, 0)),
        // gguf-py: (int16 << 16).view(float32), i.e. the bits in the top half.
        // NaN payloads are kept as they are, like numpy (half's `to_f32` would quieten them).
        GgmlType::BF16 => {
            run(src, dst, 2, 1, |b, o| o[0] = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16))
        }
        GgmlType::Q8_0 => run(src, dst, ts, bs, block_q8_0),
        GgmlType::Q4_0 => run(src, dst, ts, bs, block_q4_0),
        GgmlType::Q4_1 => run(src, dst, ts, bs, block_q4_1),
        GgmlType::Q5_0 => run(src, dst, ts, bs, block_q5_0),
        GgmlType::Q5_1 => run(src, dst, ts, bs, block_q5_1),
        GgmlType::Q2_K => run(src, dst, ts, bs, block_q2_k),
        GgmlType::Q3_K => run(src, dst, ts, bs, block_q3_k),
        GgmlType::Q4_K => run(src, dst, ts, bs, block_q4_k),
        GgmlType::Q5_K => run(src, dst, ts, bs, block_q5_k),
        GgmlType::Q6_K => run(src, dst, ts, bs, block_q6_k),
        other => return Err(DequantError::Unsupported(other)),
    }
    Ok(())
}

/// Dequantises `src` into a new vector of `num_elements` f32.
pub fn dequantize(ty: GgmlType, src: &[u8], num_elements: usize) -> Result<Vec<f32>, DequantError> {
    let mut out = vec![0f32; num_elements];
    dequantize_into(ty, src, &mut out)?;
    Ok(out)
}

/// Applies `block` to every (`ts`-byte block, `bs`-element output) pair, in
/// parallel over groups of blocks. Lengths were checked by the caller.
fn run(src: &[u8], dst: &mut [f32], ts: usize, bs: usize, block: impl Fn(&[u8], &mut [f32]) + Sync) {
    // Plain types have 1-element "blocks": group more of them per task.
    let per_task = if bs == 1 { BLOCKS_PER_TASK * 64 } else { BLOCKS_PER_TASK };
    src.par_chunks(ts * per_task).zip(dst.par_chunks_mut(bs * per_task)).for_each(|(s, d)| {
        for (b, o) in s.chunks_exact(ts).zip(d.chunks_exact_mut(bs)) {
            block(b, o);
        }
    });
}

/// The little-endian f16 at `b[at..at + 2]`, widened (exactly) to f32.
#[inline]
fn le_f16(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// `block_q8_0 { f16 d; i8 qs[32]; }`: `x * d`.
fn block_q8_0(b: &[u8], o: &mut [f32]) {
    let d = le_f16(b, 0);
    for (o, &q) in o.iter_mut().zip(&b[2..34]) {
        *o = (q as i8) as f32 * d;
    }
}

/// `block_q4_0 { f16 d; u8 qs[16]; }`: low nibbles are elements 0-15, high
/// nibbles 16-31; `d * (q - 8)`.
fn block_q4_0(b: &[u8], o: &mut [f32]) {
    let d = le_f16(b, 0);
    for (j, &q) in b[2..18].iter().enumerate() {
        o[j] = d * ((q & 0x0F) as i32 - 8) as f32;
        o[j + 16] = d * ((q >> 4) as i32 - 8) as f32;
    }
}

/// `block_q4_1 { f16 d; f16 m; u8 qs[16]; }`: `(d * q) + m`.
fn block_q4_1(b: &[u8], o: &mut [f32]) {
    let (d, m) = (le_f16(b, 0), le_f16(b, 2));
    for (j, &q) in b[4..20].iter().enumerate() {
        o[j] = d * (q & 0x0F) as f32 + m;
        o[j + 16] = d * (q >> 4) as f32 + m;
    }
}

/// The 5-bit quants of Q5_0/Q5_1: nibble as in Q4, bit 4 of element `j` is
/// bit `j` of the little-endian u32 `qh`.
#[inline]
fn q5(qh: u32, qs: &[u8], j: usize) -> u32 {
    let low = if j < 16 { qs[j] & 0x0F } else { qs[j - 16] >> 4 };
    low as u32 | (((qh >> j) & 1) << 4)
}

/// `block_q5_0 { f16 d; u8 qh[4]; u8 qs[16]; }`: `d * (q - 16)`.
fn block_q5_0(b: &[u8], o: &mut [f32]) {
    let d = le_f16(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for (j, o) in o.iter_mut().enumerate() {
        *o = d * (q5(qh, qs, j) as i32 - 16) as f32;
    }
}

/// `block_q5_1 { f16 d; f16 m; u8 qh[4]; u8 qs[16]; }`: `(d * q) + m`.
fn block_q5_1(b: &[u8], o: &mut [f32]) {
    let (d, m) = (le_f16(b, 0), le_f16(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for (j, o) in o.iter_mut().enumerate() {
        *o = d * q5(qh, qs, j) as f32 + m;
    }
}

/// `block_q2_K { u8 scales[16]; u8 qs[64]; f16 d; f16 dmin; }`: 16 groups of
/// 16; group `g` is `(d * (sc & 15)) * q - (dmin * (sc >> 4))`. Element `n`
/// takes bits `2s..2s+2` of `qs[32h + j]` with `h = n / 128`,
/// `s = n % 128 / 32`, `j = n % 32`.
fn block_q2_k(b: &[u8], o: &mut [f32]) {
    let (scales, qs) = (&b[0..16], &b[16..80]);
    let (d, dmin) = (le_f16(b, 80), le_f16(b, 82));
    for (g, (&sc, out)) in scales.iter().zip(o.chunks_exact_mut(16)).enumerate() {
        let dl = d * (sc & 0x0F) as f32;
        let ml = dmin * (sc >> 4) as f32;
        for (k, out) in out.iter_mut().enumerate() {
            let n = g * 16 + k;
            let (h, s, j) = (n / 128, n % 128 / 32, n % 32);
            let q = (qs[h * 32 + j] >> (2 * s)) & 3;
            *out = dl * q as f32 - ml;
        }
    }
}

/// `block_q3_K { u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d; }`: 16 groups
/// of 16 with signed 6-bit scales (low nibbles in `scales[0..8]`, high pairs
/// in `scales[8..12]`); `q = low2 - 4 * !hbit`, `(d * (sc - 32)) * q`.
fn block_q3_k(b: &[u8], o: &mut [f32]) {
    let (hmask, qs, sc) = (&b[0..32], &b[32..96], &b[96..108]);
    let d = le_f16(b, 108);
    for (g, out) in o.chunks_exact_mut(16).enumerate() {
        let low = (sc[g % 8] >> (4 * (g / 8))) & 0x0F;
        let high = (sc[8 + g % 4] >> (2 * (g / 4))) & 0x03;
        let dl = d * ((low | (high << 4)) as i32 - 32) as f32;
        for (k, out) in out.iter_mut().enumerate() {
            let n = g * 16 + k;
            let (h, s, j) = (n / 128, n % 128 / 32, n % 32);
            let ql = ((qs[h * 32 + j] >> (2 * s)) & 3) as i32;
            let hbit = ((hmask[j] >> (n / 32)) & 1) as i32;
            *out = dl * (ql - ((hbit ^ 1) << 2)) as f32;
        }
    }
}

/// The eight 6-bit (scale, min) pairs packed in the 12 `scales` bytes of
/// Q4_K and Q5_K (gguf-py `Q4_K.get_scale_min`).
#[inline]
fn k_scale_min(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut mn) = ([0u8; 8], [0u8; 8]);
    for j in 0..4 {
        sc[j] = s[j] & 0x3F;
        mn[j] = s[4 + j] & 0x3F;
        sc[4 + j] = (s[8 + j] & 0x0F) | ((s[j] >> 2) & 0x30);
        mn[4 + j] = (s[8 + j] >> 4) | ((s[4 + j] >> 2) & 0x30);
    }
    (sc, mn)
}

/// `block_q4_K { f16 d; f16 dmin; u8 scales[12]; u8 qs[128]; }`: 8 groups of
/// 32; group `g` reads the low (even `g`) or high (odd `g`) nibbles of
/// `qs[32 * (g / 2)..][..32]`; `(d * sc) * q - (dmin * m)`.
fn block_q4_k(b: &[u8], o: &mut [f32]) {
    let (d, dmin) = (le_f16(b, 0), le_f16(b, 2));
    let (sc, mn) = k_scale_min(&b[4..16]);
    let qs = &b[16..144];
    for g in 0..8 {
        let dl = d * sc[g] as f32;
        let ml = dmin * mn[g] as f32;
        let shift = 4 * (g % 2);
        for (k, &q) in qs[32 * (g / 2)..32 * (g / 2) + 32].iter().enumerate() {
            o[32 * g + k] = dl * ((q >> shift) & 0x0F) as f32 - ml;
        }
    }
}

/// `block_q5_K { f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]; }`:
/// Q4_K plus bit `g` of `qh[k]` as bit 4 of element `k` of group `g`.
fn block_q5_k(b: &[u8], o: &mut [f32]) {
    let (d, dmin) = (le_f16(b, 0), le_f16(b, 2));
    let (sc, mn) = k_scale_min(&b[4..16]);
    let (qh, qs) = (&b[16..48], &b[48..176]);
    for g in 0..8 {
        let dl = d * sc[g] as f32;
        let ml = dmin * mn[g] as f32;
        let shift = 4 * (g % 2);
        for k in 0..32 {
            let q = ((qs[32 * (g / 2) + k] >> shift) & 0x0F) | (((qh[k] >> g) & 1) << 4);
            o[32 * g + k] = dl * q as f32 - ml;
        }
    }
}

/// `block_q6_K { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d; }`: element `n`
/// (half `h = n / 128`, `r = n % 128`) has low nibble
/// `ql[64h + r % 64] >> 4 * (r / 64)` and high pair
/// `qh[32h + r % 32] >> 2 * (r / 32)`; `(d * scales[n / 16]) * (q - 32)`.
fn block_q6_k(b: &[u8], o: &mut [f32]) {
    let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = le_f16(b, 208);
    for (g, (&sc, out)) in scales.iter().zip(o.chunks_exact_mut(16)).enumerate() {
        let dl = d * (sc as i8) as f32;
        for (k, out) in out.iter_mut().enumerate() {
            let n = g * 16 + k;
            let (h, r) = (n / 128, n % 128);
            let low = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0F;
            let high = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 0x03;
            *out = dl * ((low | (high << 4)) as i32 - 32) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_has_one_table_row_and_ids_round_trip() {
        for &(ty, id, name, bs, ts) in TYPES {
            assert_eq!(TYPES.iter().filter(|t| t.0 == ty).count(), 1, "{name}");
            assert_eq!(GgmlType::from_id(id), Some(ty));
            assert_eq!((ty.id(), ty.name(), ty.block_size(), ty.type_size()), (id, name, bs, ts));
        }
        assert_eq!(GgmlType::from_id(99), None);
        assert_eq!(GgmlType::from_id(4), None);
    }

    #[test]
    fn size_of_rejects_partial_blocks() {
        assert_eq!(GgmlType::Q4_K.size_of(512), Some(288));
        assert_eq!(GgmlType::Q4_K.size_of(100), None);
        assert_eq!(GgmlType::F32.size_of(u64::MAX), None);
    }

    #[test]
    fn q8_0_scales_signed_bytes() {
        let mut block = vec![0u8; 34];
        block[..2].copy_from_slice(&f16::from_f32(0.5).to_bits().to_le_bytes());
        block[2] = 0xFF; // -1
        block[3] = 4;
        let out = dequantize(GgmlType::Q8_0, &block, 32).unwrap();
        assert_eq!(&out[..3], &[-0.5, 2.0, 0.0]);
    }

    #[test]
    fn size_mismatch_and_unsupported_are_errors() {
        assert!(matches!(dequantize(GgmlType::Q4_0, &[0; 17], 32), Err(DequantError::SizeMismatch { .. })));
        assert!(matches!(dequantize(GgmlType::Q4_0, &[0; 18], 31), Err(DequantError::SizeMismatch { .. })));
        assert_eq!(dequantize(GgmlType::IQ2_XXS, &[0; 66], 256), Err(DequantError::Unsupported(GgmlType::IQ2_XXS)));
    }
}
