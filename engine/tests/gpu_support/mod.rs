//! What the engine's GPU tests share: the gate, and the models they run on
//! (real-size configurations with dummy weights, the dense bf16 fixtures).

use std::path::{Path, PathBuf};

use kernel_runtime::{DType, Device};
use models::registry::model_loader;
use models::{
    load_model, AttnBackendKind, AttnBackendSpec, CausalLm, LoadFormat, LoadOptions, ModelConfig, MoeBackendKind,
    Weights,
};

/// Whether the GPU tests run (MINISGL_GPU_TESTS=1); says how to run them if not.
pub fn gpu_enabled() -> bool {
    if std::env::var("MINISGL_GPU_TESTS").as_deref() != Ok("1") {
        eprintln!("skipped: set MINISGL_GPU_TESTS=1 on a machine with a GPU");
        return false;
    }
    true
}

/// The configuration `tests/configs/<config>` on GPU 0 with dummy bf16 weights,
/// serving up to `max_context` tokens.
pub fn dummy(config: &str, max_context: usize) -> Box<dyn CausalLm> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/configs").join(config);
    let options = LoadOptions {
        device: Device::Cuda(0),
        dtype: Some(DType::BF16),
        load_format: LoadFormat::Dummy,
        attn: AttnBackendSpec::single(AttnBackendKind::Paged),
        moe: MoeBackendKind::Fused,
        max_context: Some(max_context),
    };
    load_model(&dir, &options).unwrap()
}

/// A fixture folder's model in bf16 on GPU 0, with the rotary frequencies
/// rounded as the references were computed (see `RopeConfig::inv_freq_dtype`).
pub fn load_fixture_gpu(dir: &Path) -> Box<dyn CausalLm> {
    let mut config = ModelConfig::from_folder(dir).unwrap();
    config.rope.inv_freq_dtype = config.torch_dtype.expect("fixture configs state their dtype");
    let weights = Weights::safetensors(dir, DType::BF16, Device::Cuda(0)).unwrap();
    let attn = AttnBackendKind::Paged.create().unwrap();
    model_loader(&config.architecture).unwrap()(&config, &weights, attn, MoeBackendKind::Fused).unwrap()
}
