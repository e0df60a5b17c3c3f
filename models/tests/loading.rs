//! Loading models: broken folders give errors that name the problem (built in a
//! tempdir from copies of a fixture), and the other ways in work: sharded
//! safetensors, dummy weights, GGUF files.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use common::{cases, cpu_f32, fixture, rel_l2};
use kernel_runtime::Device;
use models::{load_model, CausalLm, ForwardBatch, LoadFormat, LogitRows, SeqStep};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

/// A copy of fixture `name`'s config.json and model.safetensors in a tempdir.
fn copy_fixture(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for file in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture(name).join(file), dir.path().join(file)).unwrap();
    }
    dir
}

/// The error message of loading `dir` on the CPU.
fn load_error(dir: &Path, format: LoadFormat) -> String {
    match load_model(dir, &cpu_f32(format)) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) {
    let path = dir.join("config.json");
    let mut value: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(value.as_object_mut().unwrap());
    std::fs::write(path, serde_json::to_string_pretty(&value).unwrap()).unwrap();
}

/// Rewrites `dir/model.safetensors` through `edit`, which gets the tensors as
/// (name, dtype, shape, bytes).
fn edit_tensors(dir: &Path, edit: impl FnOnce(&mut Vec<(String, Dtype, Vec<usize>, Vec<u8>)>)) {
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<_> =
        st.tensors().into_iter().map(|(n, t)| (n, t.dtype(), t.shape().to_vec(), t.data().to_vec())).collect();
    edit(&mut tensors);
    write_tensors(&path, &tensors);
}

fn write_tensors(path: &Path, tensors: &[(String, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, TensorView<'_>)> =
        tensors.iter().map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// Prefill logits of case 1 of `name`'s references with `model` (every position).
fn prefill_logits(model: &dyn CausalLm, ids: &[u32]) -> Vec<f32> {
    let pages: Vec<u32> = (0..ids.len().div_ceil(4) as u32).collect();
    let kv = model.new_kv_cache(pages.len(), 4).unwrap();
    let batch =
        ForwardBatch::new(&[SeqStep { new_tokens: ids, cached_len: 0, pages: &pages }], 4, LogitRows::All, Device::Cpu)
            .unwrap();
    model.forward(&batch, &kv).unwrap().to_f32_vec().unwrap()
}

#[test]
fn unsupported_architecture_lists_the_supported_ones() {
    let dir = copy_fixture("llama-tiny");
    edit_config(dir.path(), |c| {
        c.insert("architectures".into(), serde_json::json!(["GPT2LMHeadModel"]));
    });
    let e = load_error(dir.path(), LoadFormat::Auto);
    assert!(e.contains("`GPT2LMHeadModel`"), "{e}");
    for arch in
        ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "MistralForCausalLM"]
    {
        assert!(e.contains(arch), "{arch} is not listed: {e}");
    }
}

#[test]
fn missing_config_key_is_named_with_the_file() {
    let dir = copy_fixture("qwen3-tiny");
    edit_config(dir.path(), |c| {
        c.remove("num_attention_heads");
    });
    let e = load_error(dir.path(), LoadFormat::Auto);
    assert!(e.contains("config.json") && e.contains("missing required key `num_attention_heads`"), "{e}");
}

#[test]
fn missing_tensor_is_named_with_the_folder() {
    let dir = copy_fixture("llama-tiny");
    edit_tensors(dir.path(), |t| t.retain(|(n, ..)| n != "model.layers.1.self_attn.v_proj.weight"));
    let e = load_error(dir.path(), LoadFormat::Auto);
    assert!(e.contains("tensor `model.layers.1.self_attn.v_proj.weight` not found"), "{e}");
    assert!(e.contains(&dir.path().display().to_string()), "{e}");
}

#[test]
fn tensor_of_wrong_shape_names_both_shapes() {
    let dir = copy_fixture("qwen2-tiny");
    edit_tensors(dir.path(), |t| {
        let k = t.iter_mut().find(|(n, ..)| n == "model.layers.0.self_attn.k_proj.weight").unwrap();
        // [128, 256] in the checkpoint; keep the first 64 rows.
        k.2 = vec![64, 256];
        k.3.truncate(64 * 256 * 2);
    });
    let e = load_error(dir.path(), LoadFormat::Auto);
    assert!(e.contains("`model.layers.0.self_attn.k_proj.weight` has shape [64, 256], expected [128, 256]"), "{e}");
}

#[test]
fn tensor_of_unsupported_dtype_is_named() {
    let dir = copy_fixture("llama-tiny");
    edit_tensors(dir.path(), |t| {
        let w = t.iter_mut().find(|(n, ..)| n == "model.norm.weight").unwrap();
        w.1 = Dtype::I16;
    });
    let e = load_error(dir.path(), LoadFormat::Auto);
    assert!(e.contains("`model.norm.weight` is stored as I16"), "{e}");
}

#[test]
fn truncated_safetensors_names_the_file() {
    let dir = copy_fixture("llama-tiny");
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 1000]).unwrap();
    let e = load_error(dir.path(), LoadFormat::Auto);
    assert!(e.contains("model.safetensors: invalid safetensors file: truncated"), "{e}");
    // Cut inside the header, and below the 8-byte length.
    std::fs::write(&path, &bytes[..100]).unwrap();
    let e = load_error(dir.path(), LoadFormat::Auto);
    assert!(e.contains("model.safetensors") && e.contains("exceeds the 100-byte file"), "{e}");
    std::fs::write(&path, &bytes[..5]).unwrap();
    let e = load_error(dir.path(), LoadFormat::Auto);
    assert!(e.contains("model.safetensors") && e.contains("fewer than the 8-byte header length"), "{e}");
}

#[test]
fn corrupt_safetensors_header_names_the_file() {
    let dir = copy_fixture("mistral-tiny");
    let path = dir.path().join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[8..20].copy_from_slice(b"not a header");
    std::fs::write(&path, &bytes).unwrap();
    let e = load_error(dir.path(), LoadFormat::Auto);
    assert!(e.contains("model.safetensors: invalid safetensors file: corrupt header"), "{e}");
    // A header whose offsets do not tile the data.
    let mut bytes = std::fs::read(fixture("mistral-tiny").join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(bytes[8..8 + n].to_vec()).unwrap();
    let broken = header.replacen("\"data_offsets\":[0,", "\"data_offsets\":[2,", 1);
    assert_ne!(header, broken);
    bytes.splice(8..8 + n, broken.into_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let e = load_error(dir.path(), LoadFormat::Auto);
    assert!(e.contains("model.safetensors: invalid safetensors file: corrupt header"), "{e}");
}

#[test]
fn a_sliding_window_caps_the_context_where_attention_is_exact() {
    let full = load_model(&fixture("mistral-tiny"), &cpu_f32(LoadFormat::Auto)).unwrap();
    let dir = copy_fixture("mistral-tiny");
    edit_config(dir.path(), |c| {
        c.insert("sliding_window".into(), serde_json::json!(256));
    });
    let model = load_model(dir.path(), &cpu_f32(LoadFormat::Auto)).unwrap();
    assert_eq!(model.max_position_embeddings(), 256);
    // Within the window the logits are full attention's.
    for case in cases("mistral-tiny") {
        assert_eq!(prefill_logits(&*model, &case.input_ids), prefill_logits(&*full, &case.input_ids));
    }
    // Qwen-style: only with `use_sliding_window`.
    let dir = copy_fixture("qwen2-tiny");
    edit_config(dir.path(), |c| {
        c.insert("sliding_window".into(), serde_json::json!(64));
        c.insert("use_sliding_window".into(), serde_json::json!(false));
    });
    let full = load_model(dir.path(), &cpu_f32(LoadFormat::Auto)).unwrap().max_position_embeddings();
    assert!(full > 64);
    edit_config(dir.path(), |c| {
        c.insert("use_sliding_window".into(), serde_json::json!(true));
    });
    assert_eq!(load_model(dir.path(), &cpu_f32(LoadFormat::Auto)).unwrap().max_position_embeddings(), 64);
}

#[test]
fn missing_weights_suggest_dummy_and_dummy_runs() {
    let dir = copy_fixture("qwen3-tiny");
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    let e = load_error(dir.path(), LoadFormat::Auto);
    assert!(e.contains("no model.safetensors") && e.contains("--load-format dummy"), "{e}");
    let e = load_error(&dir.path().join("nope"), LoadFormat::Auto);
    assert!(e.contains("no such file or folder"), "{e}");

    let model = load_model(dir.path(), &cpu_f32(LoadFormat::Dummy)).unwrap();
    let ids: Vec<u32> = (0..40).map(|i| i * 13 % 544).collect();
    let a = prefill_logits(&*model, &ids);
    assert_eq!(a.len(), 40 * 544);
    assert!(a.iter().all(|v| v.is_finite()));
    // Activations stay at a sane scale, and the weights are the same every time.
    let rms = (a.iter().map(|v| v * v).sum::<f32>() / a.len() as f32).sqrt();
    assert!((0.01..100.0).contains(&rms), "logit rms {rms}");
    let again = load_model(dir.path(), &cpu_f32(LoadFormat::Dummy)).unwrap();
    assert_eq!(prefill_logits(&*again, &ids), a);
}

#[test]
fn sharded_safetensors_load_like_one_file() {
    let name = "qwen2-tiny";
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixture(name).join("config.json"), dir.path().join("config.json")).unwrap();
    let bytes = std::fs::read(fixture(name).join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<_> =
        st.tensors().into_iter().map(|(n, t)| (n, t.dtype(), t.shape().to_vec(), t.data().to_vec())).collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    // Two shards, with q/k/v of layer 0 split across them.
    let split = tensors.iter().position(|t| t.0 == "model.layers.0.self_attn.q_proj.weight").unwrap() + 1;
    let shards = [
        ("model-00001-of-00002.safetensors", &tensors[..split]),
        ("model-00002-of-00002.safetensors", &tensors[split..]),
    ];
    let mut weight_map = HashMap::new();
    for (file, part) in shards {
        write_tensors(&dir.path().join(file), part);
        for t in part {
            weight_map.insert(t.0.clone(), file);
        }
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
    std::fs::write(dir.path().join("model.safetensors.index.json"), index.to_string()).unwrap();

    let ids = &cases(name)[1].input_ids;
    let sharded = load_model(dir.path(), &cpu_f32(LoadFormat::Safetensors)).unwrap();
    let single = load_model(&fixture(name), &cpu_f32(LoadFormat::Safetensors)).unwrap();
    assert_eq!(prefill_logits(&*sharded, ids), prefill_logits(&*single, ids));

    // An index that puts a tensor in the wrong shard is an error naming both.
    let mut wrong = weight_map.clone();
    wrong.insert("model.norm.weight".into(), "model-00001-of-00002.safetensors");
    let index = serde_json::json!({"weight_map": wrong});
    std::fs::write(dir.path().join("model.safetensors.index.json"), index.to_string()).unwrap();
    let e = load_error(dir.path(), LoadFormat::Auto);
    assert!(
        e.contains("model.safetensors.index.json")
            && e.contains("`model.norm.weight` in model-00001-of-00002.safetensors"),
        "{e}"
    );
}

fn gguf_data(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/gguf").join(file)
}

/// A GGUF file runs, and gives the logits of an HF folder holding the same
/// (dequantised) tensors and the config the GGUF module derives.
#[test]
fn gguf_file_matches_the_equivalent_hf_folder() {
    let gguf = gguf_data("tiny_llama.gguf");
    let from_gguf = load_model(&gguf, &cpu_f32(LoadFormat::Auto)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = models::gguf::GgufCheckpoint::open(&gguf).unwrap().hf_config().clone();
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    std::fs::copy(gguf_data("tiny_llama.safetensors"), dir.path().join("model.safetensors")).unwrap();
    let from_folder = load_model(dir.path(), &cpu_f32(LoadFormat::Auto)).unwrap();
    let vocab = from_gguf.vocab_size() as u32;
    let ids: Vec<u32> = (0..11).map(|i| (i * 7 + 3) % vocab).collect();
    let (a, b) = (prefill_logits(&*from_gguf, &ids), prefill_logits(&*from_folder, &ids));
    assert!(a.iter().all(|v| v.is_finite()));
    assert!(rel_l2(&a, &b) <= 1e-6, "GGUF vs folder: {}", rel_l2(&a, &b));

    let e = load_error(&gguf, LoadFormat::Safetensors);
    assert!(e.contains("needs an HF folder"), "{e}");
}

/// Issue 14, row 8: extreme config values are named errors, before any
/// allocation they would size (dummy weights are built from config alone).
#[test]
fn extreme_config_values_are_named_errors() {
    let cases: [(&str, serde_json::Value, &str); 6] = [
        ("max_position_embeddings", serde_json::json!(1u64 << 40), "exceeds the supported maximum"),
        ("hidden_size", serde_json::json!(1u64 << 40), "exceeds the supported maximum"),
        ("num_hidden_layers", serde_json::json!(1u64 << 20), "exceeds the supported maximum"),
        (
            "rope_scaling",
            serde_json::json!({"rope_type": "yarn", "factor": 1e300, "original_max_position_embeddings": 1024}),
            "rope_scaling.factor",
        ),
        ("rope_scaling", serde_json::json!({"rope_type": "linear", "factor": 0.0}), "rope_scaling.factor"),
        ("rms_norm_eps", serde_json::json!(0.0), "rms_norm_eps"),
    ];
    for (key, value, expect) in cases {
        let dir = copy_fixture("qwen3-tiny");
        edit_config(dir.path(), |c| {
            c.insert(key.to_owned(), value.clone());
        });
        let err = load_error(dir.path(), LoadFormat::Dummy);
        assert!(err.contains("config.json") && err.contains(key) && err.contains(expect), "{key}: {err}");
    }
}

/// Issue 14, rows 8 and 10: the served context sizes the model (and its
/// rotary table); weight-map shard names stay inside the model folder.
#[test]
fn served_context_and_confined_shards() {
    let dir = copy_fixture("qwen3-tiny");
    let mut options = cpu_f32(LoadFormat::Auto);
    options.max_context = Some(64);
    let model = load_model(dir.path(), &options).unwrap();
    assert_eq!(model.max_position_embeddings(), 64);
    options.max_context = Some(1 << 30);
    let err = load_model(dir.path(), &options).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("served context of 1073741824 tokens"), "{err}");

    for escape in ["../model.safetensors", "/etc/passwd", "sub/model.safetensors", ".."] {
        let dir = copy_fixture("qwen3-tiny");
        std::fs::rename(dir.path().join("model.safetensors"), dir.path().join("shard.safetensors")).unwrap();
        let index = serde_json::json!({"weight_map": {"model.norm.weight": escape}});
        std::fs::write(dir.path().join("model.safetensors.index.json"), index.to_string()).unwrap();
        let err = load_error(dir.path(), LoadFormat::Auto);
        assert!(err.contains("is not a file name in the model folder"), "{escape}: {err}");
    }
}
