//! Helpers shared by the model integration tests: fixture paths, loading a
//! fixture on the CPU in f32, reading the reference tensors, the error metric.
#![allow(dead_code)]

use std::path::PathBuf;

use kernel_runtime::{DType, Device};
use models::registry::model_loader;
use models::{
    load_model, AttnBackendKind, AttnBackendSpec, CausalLm, LoadFormat, LoadOptions, ModelConfig, MoeBackendKind,
    Weights,
};
use safetensors::SafeTensors;

/// The dense fixtures (tests/fixtures/ at the workspace root).
pub const DENSE: [&str; 4] = ["llama-tiny", "qwen2-tiny", "qwen3-tiny", "mistral-tiny"];

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
}

/// CPU, f32 compute, the paged backend.
pub fn cpu_f32(load_format: LoadFormat) -> LoadOptions {
    LoadOptions {
        device: Device::Cpu,
        dtype: Some(DType::F32),
        load_format,
        attn: AttnBackendSpec::single(AttnBackendKind::Paged),
        moe: MoeBackendKind::Fused,
        max_context: None,
    }
}

/// Loads a fixture the way its references were computed.
///
/// NOTE: tests/fixtures/make_fixtures.py builds each model in f32, casts it with
/// `model.to(dtype)` to save it, then `.to(float64)` for the reference. The cast
/// also rounds the rotary `inv_freq` buffer to bf16/f16, so the references carry
/// rounded frequencies, which `from_pretrained` (f32 `inv_freq`) and this crate's
/// default do not: about 1e-3 relative L2 at position 40. The fixture models are
/// therefore loaded with `inv_freq_dtype` set to the checkpoint dtype, through the
/// same registry `load_model` uses. (`load_model` itself is covered by the
/// position-0 and bad-input tests.)
pub fn load(name: &str) -> Box<dyn CausalLm> {
    let dir = fixture(name);
    let mut config = ModelConfig::from_folder(&dir).unwrap();
    config.rope.inv_freq_dtype = config.torch_dtype.expect("fixture configs state their dtype");
    let weights = Weights::safetensors(&dir, DType::F32, Device::Cpu).unwrap();
    let attn = AttnBackendKind::Paged.create().unwrap();
    model_loader(&config.architecture).unwrap()(&config, &weights, attn, MoeBackendKind::Fused)
        .unwrap_or_else(|e| panic!("loading {name}: {e}"))
}

/// Loads a fixture through the public entry point, CPU f32.
pub fn load_public(name: &str) -> Box<dyn CausalLm> {
    load_model(&fixture(name), &cpu_f32(LoadFormat::Auto)).unwrap_or_else(|e| panic!("loading {name}: {e}"))
}

/// One reference case: prompt, prefill logits `[L, V]`, greedy ids and the logits
/// that chose them `[N, V]`.
pub struct Case {
    pub input_ids: Vec<u32>,
    pub logits: Vec<f32>,
    pub greedy_ids: Vec<u32>,
    pub greedy_logits: Vec<f32>,
}

fn ids(st: &SafeTensors<'_>, name: &str) -> Vec<u32> {
    let t = st.tensor(name).unwrap();
    t.data().chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32).collect()
}

fn floats(st: &SafeTensors<'_>, name: &str) -> Vec<f32> {
    let t = st.tensor(name).unwrap();
    t.data().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
}

/// Every case of a fixture's reference.safetensors.
pub fn cases(name: &str) -> Vec<Case> {
    let bytes = std::fs::read(fixture(name).join("reference.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    (0..)
        .take_while(|i| st.tensor(&format!("case{i}.input_ids")).is_ok())
        .map(|i| Case {
            input_ids: ids(&st, &format!("case{i}.input_ids")),
            logits: floats(&st, &format!("case{i}.logits")),
            greedy_ids: ids(&st, &format!("case{i}.greedy_ids")),
            greedy_logits: floats(&st, &format!("case{i}.greedy_logits")),
        })
        .collect()
}

/// ‖got − want‖ / ‖want‖ over the whole block.
pub fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "sizes differ");
    let (mut num, mut den) = (0f64, 0f64);
    for (g, w) in got.iter().zip(want) {
        num += (f64::from(*g) - f64::from(*w)).powi(2);
        den += f64::from(*w).powi(2);
    }
    (num / den).sqrt()
}

/// Index of the largest value, the first on ties.
pub fn argmax(row: &[f32]) -> usize {
    row.iter().enumerate().fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| if v > bv { (i, v) } else { (bi, bv) }).0
}

/// The gap between the two largest values (how clear the argmax is).
pub fn top2_gap(row: &[f32]) -> f32 {
    let mut s = row.to_vec();
    s.sort_by(|a, b| b.total_cmp(a));
    s[0] - s[1]
}
