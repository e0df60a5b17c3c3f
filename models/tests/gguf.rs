//! GGUF reader, dequantisation, name mapping and config: against gguf-py.
//!
//! The data under `tests/data/gguf/` is made by `make_quant_cases.py` there
//! (gguf-py 0.19.0): raw blocks with gguf-py's dequantisation, and two tiny
//! checkpoints written by `gguf.GGUFWriter` with their tensors in HF layout.
//! Error cases build files with `models::gguf::GgufWriter` and break them.
//! The real SmolLM2-135M Q4_1 file is checked when `MINISGL_SMOLLM2_GGUF`
//! points at it.

use std::collections::BTreeSet;
use std::path::PathBuf;

use models::gguf::quant::{self, DEQUANTIZABLE};
use models::gguf::{
    GgmlType, GgufCheckpoint, GgufError, GgufFile, GgufWriter, MetadataArray, MetadataValue, ValueType,
};
use safetensors::SafeTensors;

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/gguf")
}

/// Every tensor of a `.safetensors` file as (shape, f32 or u8 bytes).
fn read_safetensors(name: &str) -> Vec<(String, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(data_dir().join(name)).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<_> = st.tensors().into_iter().map(|(n, t)| (n, t.shape().to_vec(), t.data().to_vec())).collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

/// Bit-exact comparison with a message that locates the first difference.
fn assert_bits_eq(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!(
            "{what}: element {i}: got {} ({:#010x}), want {} ({:#010x})",
            got[i],
            got[i].to_bits(),
            want[i],
            want[i].to_bits()
        );
    }
}

#[test]
fn dequantisation_is_bit_exact_with_gguf_py() {
    let tensors = read_safetensors("quant_cases.safetensors");
    let mut seen = BTreeSet::new();
    let mut cases = 0;
    for (name, _, raw) in tensors.iter().filter(|t| t.0.ends_with(".raw")) {
        let case = name.trim_end_matches(".raw");
        let type_name = case.split('.').next().unwrap();
        let ty = DEQUANTIZABLE.iter().copied().find(|t| t.name() == type_name).unwrap();
        let (_, shape, expected) = tensors.iter().find(|t| t.0 == format!("{case}.expected")).unwrap();
        let want = f32s(expected);
        assert_eq!(shape.iter().product::<usize>(), want.len());
        let got = quant::dequantize(ty, raw, want.len()).unwrap();
        assert_bits_eq(case, &got, &want);
        seen.insert(ty.name());
        cases += 1;
    }
    let all: BTreeSet<_> = DEQUANTIZABLE.iter().map(|t| t.name()).collect();
    assert_eq!(seen, all, "every dequantisable type has a case");
    assert_eq!(cases, 13 + 7);
}

#[test]
fn dequantisation_is_parallel_safe_on_large_inputs() {
    // Many rayon tasks (plus a ragged last one) must give the same result as
    // block-by-block decoding.
    let tensors = read_safetensors("quant_cases.safetensors");
    let (_, _, raw) = tensors.iter().find(|t| t.0 == "Q4_K.random.raw").unwrap();
    let (_, _, expected) = tensors.iter().find(|t| t.0 == "Q4_K.random.expected").unwrap();
    let reps = 1500;
    let big: Vec<u8> = raw.iter().copied().cycle().take(raw.len() * reps).collect();
    let want: Vec<f32> = f32s(expected).into_iter().cycle().take(expected.len() / 4 * reps).collect();
    let got = quant::dequantize(GgmlType::Q4_K, &big, want.len()).unwrap();
    assert_bits_eq("Q4_K x1500", &got, &want);
}

#[test]
fn reader_reads_every_metadata_type() {
    let f = GgufFile::open(data_dir().join("tiny_llama.gguf")).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.data_offset() % 64, 0);
    assert_eq!(f.architecture().unwrap(), "llama");
    assert_eq!(f.get_u32("test.u8").unwrap(), 200);
    assert_eq!(f.get_i64("test.i8").unwrap(), -100);
    assert_eq!(f.get_u32("test.u16").unwrap(), 60000);
    assert_eq!(f.get_i64("test.i16").unwrap(), -30000);
    assert_eq!(f.get_u32("test.u32").unwrap(), 4_000_000_000);
    assert_eq!(f.get_i64("test.i32").unwrap(), -2_000_000_000);
    assert_eq!(f.get_f32("test.f32").unwrap(), 0.1);
    assert!(f.get_bool("test.bool").unwrap());
    assert_eq!(f.get_str("test.string").unwrap(), "h\u{e9}llo \u{65e5}\u{672c}");
    assert_eq!(f.get_str("test.empty_string").unwrap(), "");
    assert_eq!(f.get_u64("test.u64").unwrap(), (1 << 63) + 5);
    assert_eq!(f.get_i64("test.i64").unwrap(), -(1 << 62));
    assert_eq!(f.get_f64("test.f64").unwrap(), 1e300);
    assert_eq!(f.get_i64_array("test.array_i32").unwrap(), vec![1, -2, 3]);
    assert_eq!(f.get_f32_array("test.array_f32").unwrap(), vec![0.5, -1.5]);
    assert_eq!(f.get_str_array("test.array_str").unwrap(), ["a", "", "\u{fc}"]);
    let nested = f.get_array("test.nested").unwrap();
    assert_eq!(nested.elem_type(), ValueType::Array);
    let MetadataArray::Array(inner) = nested else { panic!("nested: {nested:?}") };
    assert_eq!(inner.iter().map(|a| a.to_i64_vec().unwrap()).collect::<Vec<_>>(), vec![vec![1, 2], vec![3]]);
    assert_eq!(f.get_str_array("tokenizer.ggml.tokens").unwrap().len(), 48);
    assert_eq!(f.tensors().len(), 22);
    let q = f.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!((q.dims(), q.shape(), q.ggml_type()), (&[32u64, 32][..], vec![32, 32], GgmlType::F16));
    assert!(f.tensors().iter().all(|t| (f.data_offset() + t.offset()).is_multiple_of(64)));
    assert_eq!(f.get_opt::<u32>("test.absent").unwrap(), None);
}

#[test]
fn metadata_errors_name_the_key() {
    let f = GgufFile::open(data_dir().join("tiny_llama.gguf")).unwrap();
    let err = f.get_str("test.u32").unwrap_err();
    assert!(matches!(err, GgufError::MetadataType { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("tiny_llama.gguf") && msg.contains("`test.u32`") && msg.contains("u32 4000000000"), "{msg}");
    // Lossless integer conversion only.
    assert!(f.get_u32("test.u64").unwrap_err().to_string().contains("`test.u64`"));
    assert!(f.get_u32("test.i8").is_err());
    let err = f.get_u32("llama.no_such_key").unwrap_err();
    assert!(matches!(err, GgufError::MissingKey { .. }) && err.to_string().contains("`llama.no_such_key`"), "{err}");
    assert!(f.get_str_array("test.array_i32").unwrap_err().to_string().contains("array of i32[3]"));
    let err = f.tensor_f32("blk.9.attn_q.weight").unwrap_err();
    assert!(matches!(err, GgufError::MissingTensor { .. }) && err.to_string().contains("blk.9.attn_q.weight"));
}

/// Loads every HF tensor of `gguf` and compares with `expected` (HF names).
fn check_checkpoint(gguf: &str, expected: &str) -> GgufCheckpoint {
    let ckpt = GgufCheckpoint::open(data_dir().join(gguf)).unwrap();
    let want = read_safetensors(expected);
    let listed: BTreeSet<&str> = ckpt.tensor_names().collect();
    let expected_names: BTreeSet<&str> = want.iter().map(|t| t.0.as_str()).collect();
    assert_eq!(listed, expected_names, "{gguf}: HF tensor names");
    for (name, shape, bytes) in &want {
        let (got_shape, got) = ckpt.load_f32(name).unwrap();
        assert_eq!(&got_shape, shape, "{name}: shape");
        assert_eq!(&ckpt.tensor(name).unwrap().shape, shape, "{name}: listed shape");
        assert_bits_eq(name, &got, &f32s(bytes));
    }
    ckpt
}

#[test]
fn llama_checkpoint_is_hf_layout_with_qk_unpermuted() {
    let ckpt = check_checkpoint("tiny_llama.gguf", "tiny_llama.safetensors");
    assert_eq!(ckpt.unmapped_tensors(), ["rope_freqs.weight"]);
    let q = ckpt.tensor("model.layers.0.self_attn.q_proj.weight").unwrap();
    assert_eq!((q.ggml_type, q.gguf_name.as_str()), (GgmlType::F16, "blk.0.attn_q.weight"));
    assert_eq!(ckpt.tensor("lm_head.weight").unwrap().ggml_type, GgmlType::Q8_0);
    let c = ckpt.hf_config();
    let expected = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-5f32, "rope_theta": 500000.0,
        "hidden_act": "silu", "torch_dtype": "float32", "vocab_size": 48,
        "tie_word_embeddings": false, "attention_bias": false,
        "bos_token_id": 1, "eos_token_id": 2,
    });
    assert_eq!(c, &expected);
    assert_eq!(ckpt.chat_template().unwrap(), Some("{% for m in messages %}{{ m['content'] }}{% endfor %}"));
    let err = ckpt.load_f32("model.layers.0.self_attn.qkv_proj.weight").unwrap_err();
    assert!(err.to_string().contains("model.layers.0.self_attn.qkv_proj.weight"), "{err}");
}

#[test]
fn qwen3_moe_checkpoint_exposes_experts() {
    let ckpt = check_checkpoint("tiny_qwen3moe.gguf", "tiny_qwen3moe.safetensors");
    let c = ckpt.hf_config();
    assert_eq!(c["architectures"], serde_json::json!(["Qwen3MoeForCausalLM"]));
    assert_eq!(c["model_type"], "qwen3_moe");
    assert_eq!(c["head_dim"], 16, "from attention.key_length, not hidden / heads");
    assert_eq!(c["num_experts"], 4);
    assert_eq!(c["num_experts_per_tok"], 2);
    assert_eq!(c["moe_intermediate_size"], 32);
    assert_eq!(c["intermediate_size"], 64);
    assert_eq!(c["norm_topk_prob"], true);
    assert_eq!(c["tie_word_embeddings"], true);
    assert!(ckpt.tensor("lm_head.weight").is_none());
    // Packed transformers-5 names agree with the per-expert tensors.
    let (shape, gate_up) = ckpt.load_f32("model.layers.0.mlp.experts.gate_up_proj").unwrap();
    assert_eq!(shape, vec![4, 64, 32]);
    let (shape, down) = ckpt.load_f32("model.layers.0.mlp.experts.down_proj").unwrap();
    assert_eq!(shape, vec![4, 32, 32]);
    for e in 0..4 {
        let (_, g) = ckpt.load_f32(&format!("model.layers.0.mlp.experts.{e}.gate_proj.weight")).unwrap();
        let (_, u) = ckpt.load_f32(&format!("model.layers.0.mlp.experts.{e}.up_proj.weight")).unwrap();
        let (_, d) = ckpt.load_f32(&format!("model.layers.0.mlp.experts.{e}.down_proj.weight")).unwrap();
        let per = 64 * 32;
        assert_bits_eq("gate half", &gate_up[e * per..e * per + per / 2], &g);
        assert_bits_eq("up half", &gate_up[e * per + per / 2..(e + 1) * per], &u);
        assert_bits_eq("down", &down[e * 1024..(e + 1) * 1024], &d);
    }
    let names: Vec<_> = ckpt.packed_experts().iter().map(|t| t.hf_name.as_str()).collect();
    assert_eq!(names, ["model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj"]);
}

/// A small valid file: metadata of a few types and three tensors.
fn small_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.metadata("general.architecture", MetadataValue::String("llama".into()))
        .metadata("test.tokens", MetadataValue::Array(MetadataArray::String(vec!["a".into(), "bc".into()])))
        .metadata("test.flag", MetadataValue::Bool(true));
    w.tensor_f32("a.weight", &[2, 3], &[1., 2., 3., 4., 5., 6.]).unwrap();
    let mut q8 = vec![0u8; 34];
    q8[1] = 0x3c; // f16 1.0
    q8[2..].iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
    w.tensor("b.weight", &[32], GgmlType::Q8_0, q8).unwrap();
    w.tensor("c.weight", &[1, 4], GgmlType::F16, vec![0x00, 0x3c, 0x00, 0xc0, 0x00, 0x00, 0x00, 0x38]).unwrap();
    w
}

fn open_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
    GgufFile::from_bytes("test.gguf", bytes)
}

/// Byte position just after the first occurrence of `needle`.
fn after(bytes: &[u8], needle: &[u8]) -> usize {
    bytes.windows(needle.len()).position(|w| w == needle).unwrap() + needle.len()
}

#[test]
fn writer_round_trips() {
    let f = open_bytes(small_writer().to_bytes()).unwrap();
    assert_eq!(f.get_str_array("test.tokens").unwrap(), ["a", "bc"]);
    assert_eq!(f.tensor_f32("a.weight").unwrap(), vec![1., 2., 3., 4., 5., 6.]);
    assert_eq!(f.tensor("a.weight").unwrap().shape(), vec![2, 3]);
    assert_eq!(f.tensor_f32("b.weight").unwrap(), (0..32).map(|i| i as f32).collect::<Vec<_>>());
    assert_eq!(f.tensor_f32("c.weight").unwrap(), vec![1., -2., 0., 0.5]);
    assert!(GgufWriter::new().tensor("x", &[31], GgmlType::Q8_0, vec![0; 34]).is_err());
}

#[test]
fn every_truncation_is_an_error_not_a_panic() {
    let bytes = small_writer().to_bytes();
    let f = open_bytes(bytes.clone()).unwrap();
    let data_end = f.tensors().iter().map(|t| f.data_offset() + t.offset() + t.size_bytes()).max().unwrap() as usize;
    for len in 0..data_end {
        let err = open_bytes(bytes[..len].to_vec()).unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("test.gguf: "), "{msg}");
        match err {
            GgufError::Truncated { .. } | GgufError::AbsurdCount { .. } | GgufError::TensorOutOfBounds { .. } => {}
            other => panic!("truncated to {len}: unexpected {other}"),
        }
    }
    // The header of the real-world-shaped file, byte by byte, and its data in strides.
    let bytes = std::fs::read(data_dir().join("tiny_llama.gguf")).unwrap();
    let f = open_bytes(bytes.clone()).unwrap();
    for len in (0..f.data_offset() as usize).chain((f.data_offset() as usize..bytes.len() - 64).step_by(61)) {
        assert!(open_bytes(bytes[..len].to_vec()).is_err(), "truncated to {len} opened");
    }
}

#[test]
fn truncation_messages_say_where() {
    let bytes = small_writer().to_bytes();
    let cut = after(&bytes, b"test.tokens") + 4 + 8 + 4; // inside the first string of the array
    let msg = open_bytes(bytes[..cut].to_vec()).unwrap_err().to_string();
    assert!(msg.contains("`test.tokens`"), "{msg}");
    let cut = after(&bytes, b"b.weight") + 2;
    let msg = open_bytes(bytes[..cut].to_vec()).unwrap_err().to_string();
    assert!(msg.contains("truncated file") && msg.contains("`b.weight`"), "{msg}");
    let f = open_bytes(bytes.clone()).unwrap();
    let c = f.tensor("c.weight").unwrap();
    let cut = (f.data_offset() + c.offset() + 2) as usize;
    let err = open_bytes(bytes[..cut].to_vec()).unwrap_err();
    assert!(matches!(err, GgufError::TensorOutOfBounds { .. }), "{err}");
    assert!(err.to_string().contains("`c.weight`") && err.to_string().contains("past the end"), "{err}");
}

#[test]
fn header_errors_are_typed() {
    let good = small_writer().to_bytes();
    let patched = |at: usize, with: &[u8]| {
        let mut b = good.clone();
        b[at..at + with.len()].copy_from_slice(with);
        open_bytes(b).unwrap_err()
    };
    assert!(matches!(patched(0, b"GGML"), GgufError::BadMagic { .. }));
    assert!(matches!(patched(4, &1u32.to_le_bytes()), GgufError::UnsupportedVersion { version: 1, .. }));
    assert!(matches!(patched(4, &7u32.to_le_bytes()), GgufError::UnsupportedVersion { version: 7, .. }));
    let be = patched(4, &3u32.to_be_bytes());
    assert!(matches!(be, GgufError::BigEndian { version: 3, .. }) && be.to_string().contains("big-endian"), "{be}");
    // Absurd counts fail before any allocation is sized by them.
    assert!(matches!(patched(8, &u64::MAX.to_le_bytes()), GgufError::AbsurdCount { .. }));
    assert!(matches!(patched(16, &(1u64 << 40).to_le_bytes()), GgufError::AbsurdCount { .. }));
    let key_len = 24; // u64 length of the first key
    assert!(matches!(patched(key_len, &u64::MAX.to_le_bytes()), GgufError::Truncated { .. }));
    let tokens = after(&good, b"test.tokens");
    let err = patched(tokens + 8, &(u64::MAX / 2).to_le_bytes());
    assert!(matches!(err, GgufError::AbsurdCount { .. }) && err.to_string().contains("`test.tokens`"), "{err}");
    let err = patched(tokens, &13u32.to_le_bytes());
    assert!(matches!(err, GgufError::UnknownValueType { type_id: 13, .. }), "{err}");
    let err = patched(after(&good, b"test.flag") + 4, &[2]);
    assert!(matches!(err, GgufError::InvalidMetadata { .. }) && err.to_string().contains("`test.flag`"), "{err}");
    // Tensor infos: n_dims, type id, offset.
    let b_info = after(&good, b"b.weight");
    let err = patched(b_info, &7u32.to_le_bytes());
    assert!(matches!(err, GgufError::InvalidTensor { .. }) && err.to_string().contains("7 dimensions"), "{err}");
    let err = patched(b_info + 4 + 8, &99u32.to_le_bytes());
    assert!(matches!(err, GgufError::UnknownGgmlType { type_id: 99, .. }), "{err}");
    assert_eq!(err.to_string(), "test.gguf: tensor `b.weight`: unknown ggml type id 99");
    let err = patched(b_info + 4 + 8 + 4, &1u64.to_le_bytes());
    assert!(err.to_string().contains("not a multiple of the alignment"), "{err}");
    let err = patched(b_info + 4 + 8 + 4, &(1u64 << 62).to_le_bytes());
    assert!(matches!(err, GgufError::TensorOutOfBounds { .. }), "{err}");
    let err = patched(b_info + 4 + 8 + 4, &u64::MAX.to_le_bytes());
    assert!(matches!(err, GgufError::InvalidTensor { .. } | GgufError::TensorOutOfBounds { .. }), "{err}");
    let err = patched(b_info + 4, &33u64.to_le_bytes()); // 33 elements of Q8_0
    assert!(err.to_string().contains("not a multiple of the Q8_0 block size 32"), "{err}");
    let err = patched(after(&good, b"a.weight") + 4, &u64::MAX.to_le_bytes());
    assert!(err.to_string().contains("overflow"), "{err}");
    let mut renamed = good.clone();
    let at = after(&renamed, b"c.weight") - 8;
    renamed[at] = b'b';
    assert!(matches!(open_bytes(renamed).unwrap_err(), GgufError::DuplicateTensor { .. }));
}

#[test]
fn metadata_level_errors() {
    let mut w = small_writer();
    w.metadata("general.alignment", MetadataValue::U32(48));
    let err = open_bytes(w.to_bytes()).unwrap_err();
    assert!(matches!(err, GgufError::InvalidMetadata { .. }) && err.to_string().contains("general.alignment"), "{err}");
    // Two entries with key "k".
    let mut dup = Vec::from(&b"GGUF"[..]);
    dup.extend_from_slice(&3u32.to_le_bytes());
    dup.extend_from_slice(&0u64.to_le_bytes());
    dup.extend_from_slice(&2u64.to_le_bytes());
    for _ in 0..2 {
        dup.extend_from_slice(&1u64.to_le_bytes());
        dup.push(b'k');
        dup.extend_from_slice(&0u32.to_le_bytes());
        dup.push(7);
    }
    assert!(matches!(open_bytes(dup).unwrap_err(), GgufError::DuplicateKey { .. }));
    // Nesting bomb: arrays of arrays 100 deep.
    let mut bomb = Vec::from(&b"GGUF"[..]);
    bomb.extend_from_slice(&3u32.to_le_bytes());
    bomb.extend_from_slice(&0u64.to_le_bytes());
    bomb.extend_from_slice(&1u64.to_le_bytes());
    bomb.extend_from_slice(&1u64.to_le_bytes());
    bomb.push(b'k');
    bomb.extend_from_slice(&9u32.to_le_bytes());
    for _ in 0..100 {
        bomb.extend_from_slice(&9u32.to_le_bytes());
        bomb.extend_from_slice(&1u64.to_le_bytes());
    }
    bomb.extend_from_slice(&[0; 64]);
    let err = open_bytes(bomb).unwrap_err();
    assert!(err.to_string().contains("nested deeper"), "{err}");
}

#[test]
fn random_corruption_never_panics() {
    let good = std::fs::read(data_dir().join("tiny_llama.gguf")).unwrap();
    let header_len = GgufFile::from_bytes("x", good.clone()).unwrap().data_offset() as usize;
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..3000 {
        let mut b = good.clone();
        for _ in 0..1 + next() % 4 {
            let at = (next() as usize) % header_len;
            b[at] = next() as u8;
        }
        if let Ok(f) = open_bytes(b) {
            for t in f.tensors() {
                let _ = f.tensor_f32(t.name());
            }
            let _ = GgufCheckpoint::from_file(f);
        }
    }
}

#[test]
fn unsupported_types_and_architectures_are_named() {
    let mut w = small_writer();
    w.tensor("iq.weight", &[256], GgmlType::IQ2_XXS, vec![0; 66]).unwrap();
    let f = open_bytes(w.to_bytes()).unwrap();
    let err = f.tensor_f32("iq.weight").unwrap_err();
    assert!(matches!(err, GgufError::UnsupportedGgmlType { ggml_type: GgmlType::IQ2_XXS, .. }), "{err}");
    assert!(err.to_string().contains("`iq.weight`") && err.to_string().contains("Q4_K"), "{err}");
    // An unknown architecture opens as a file, and is refused as a checkpoint.
    let mut w = small_writer();
    w.metadata("general.architecture", MetadataValue::String("mamba".into()));
    let f = open_bytes(w.to_bytes()).unwrap();
    let err = GgufCheckpoint::from_file(f).unwrap_err();
    assert_eq!(
        err.to_string(),
        "test.gguf: unsupported architecture `mamba` (supported: llama, qwen2, qwen3, qwen3moe)"
    );
    // A supported architecture with a missing hyper-parameter names the key.
    let err = GgufCheckpoint::from_file(open_bytes(small_writer().to_bytes()).unwrap()).unwrap_err();
    assert!(matches!(&err, GgufError::MissingKey { key, .. } if key == "llama.embedding_length"), "{err}");
}

#[test]
fn real_smollm2_q4_1() {
    let Some(path) = std::env::var_os("MINISGL_SMOLLM2_GGUF") else {
        eprintln!("skipping real_smollm2_q4_1: set MINISGL_SMOLLM2_GGUF to SmolLM2-135M-Instruct.Q4_1.gguf");
        return;
    };
    let ckpt = GgufCheckpoint::open(&path).unwrap();
    let c = ckpt.hf_config();
    for (k, v) in [
        ("hidden_size", 576),
        ("intermediate_size", 1536),
        ("num_hidden_layers", 30),
        ("num_attention_heads", 9),
        ("num_key_value_heads", 3),
        ("head_dim", 64),
        ("vocab_size", 49152),
        ("max_position_embeddings", 8192),
        ("bos_token_id", 1),
        ("eos_token_id", 2),
    ] {
        assert_eq!(c[k], v, "{k}");
    }
    assert_eq!(c["architectures"][0], "LlamaForCausalLM");
    assert_eq!(c["rope_theta"], 100000.0);
    assert_eq!(c["tie_word_embeddings"], true);
    assert_eq!(ckpt.tensors().len(), 272);
    assert!(ckpt.unmapped_tensors().is_empty());
    // Values from gguf-py's dequantize plus transformers' reverse permutation.
    let cases: [(&str, [u32; 4], f64); 3] = [
        ("model.layers.0.self_attn.q_proj.weight", [0x3e212000, 0x3ecbc000, 0x3f2cbc00, 0xbe830000], 59.22322082519531),
        (
            "model.layers.5.self_attn.k_proj.weight",
            [0xbde00000, 0x3bfc0000, 0x3d93c000, 0x3edce000],
            -57.14201354980469,
        ),
        ("model.embed_tokens.weight", [0x3d071400, 0xbc820000, 0x3bf2e000, 0xbd2ad000], -15353.04449415207),
    ];
    for (name, bits, sum) in cases {
        let (_, w) = ckpt.load_f32(name).unwrap();
        let got = [w[1], w[577], w[1000], w[w.len() - 1]].map(f32::to_bits);
        assert_eq!(got, bits, "{name}");
        let s: f64 = w.iter().map(|&x| x as f64).sum();
        assert!((s - sum).abs() <= 1e-9 * sum.abs().max(1.0), "{name}: sum {s} vs {sum}");
    }
    let start = std::time::Instant::now();
    let mut total = 0usize;
    for name in ckpt.tensor_names() {
        total += ckpt.load_f32(name).unwrap().1.len();
    }
    eprintln!("dequantised {total} values in {:?}", start.elapsed());
}

#[test]
fn header_allocations_are_bounded_in_huge_files() {
    // A sparse 1 GiB file whose header claims a 700 MB string: refused before
    // anything is allocated, as corrupt rather than truncated.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.gguf");
    let mut header = Vec::from(&b"GGUF"[..]);
    header.extend_from_slice(&3u32.to_le_bytes());
    header.extend_from_slice(&0u64.to_le_bytes());
    header.extend_from_slice(&1u64.to_le_bytes());
    header.extend_from_slice(&1u64.to_le_bytes());
    header.push(b'k');
    header.extend_from_slice(&8u32.to_le_bytes());
    header.extend_from_slice(&700_000_000u64.to_le_bytes());
    std::fs::write(&path, &header).unwrap();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(1 << 30).unwrap();
    let err = GgufFile::open(&path).unwrap_err();
    assert!(matches!(err, GgufError::HeaderTooLarge { .. }), "{err}");
    assert!(err.to_string().contains("value of metadata key `k`"), "{err}");
    // The same with an array of 100M i32: the count is refused up front.
    let at = header.len() - 12;
    header.truncate(at);
    header.extend_from_slice(&9u32.to_le_bytes());
    header.extend_from_slice(&5u32.to_le_bytes());
    header.extend_from_slice(&100_000_000u64.to_le_bytes());
    std::fs::write(&path, &header).unwrap();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(1 << 30).unwrap();
    let err = GgufFile::open(&path).unwrap_err();
    assert!(matches!(err, GgufError::AbsurdCount { count: 100_000_000, .. }), "{err}");
}

/// Issue 14, row 7: a zero dimension no longer slips past the size checks
/// (the element count is 0 whatever the other dimensions), and the expert
/// loop is bounded by the metadata's expert count, not the tensor's shape.
#[test]
fn zero_dimensions_and_expert_counts_are_checked() {
    let mut w = small_writer();
    w.tensor("z.weight", &[1 << 40, 0], GgmlType::F32, Vec::new()).unwrap();
    let err = open_bytes(w.to_bytes()).unwrap_err();
    assert!(matches!(&err, GgufError::InvalidTensor { tensor, .. } if tensor == "z.weight"), "{err}");
    assert!(err.to_string().contains("is 0"), "{err}");

    let mut bytes = std::fs::read(data_dir().join("tiny_qwen3moe.gguf")).unwrap();
    let at = after(&bytes, b"qwen3moe.expert_count");
    let ty = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    match ty {
        4 => bytes[at + 4..at + 8].copy_from_slice(&5u32.to_le_bytes()),
        10 => bytes[at + 4..at + 12].copy_from_slice(&5u64.to_le_bytes()),
        other => panic!("expert_count has value type {other}"),
    }
    let file = GgufFile::from_bytes("moe.gguf", bytes).unwrap();
    let err = GgufCheckpoint::from_file(file).unwrap_err();
    assert!(err.to_string().contains("packs 4 experts, but the metadata declares 5"), "{err}");
}
