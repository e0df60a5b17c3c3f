//! A GGUF file seen as a HuggingFace checkpoint: config, HF names, f32 data.
//!
//! This is the API weight loading consumes. [`GgufCheckpoint::open`] parses
//! the file, builds the `config.json` equivalent and the HF-named tensor list;
//! [`GgufCheckpoint::load_f32`] reads one tensor, dequantises it and undoes
//! llama.cpp's layout changes (Q/K row permutation, packed experts), so that
//! what comes out is exactly what the HF checkpoint would hold (up to the
//! quantisation error baked into the file).
//!
//! `load_f32` takes `&self` and the file is read with positioned reads, so
//! tensors can be loaded from several threads at once.

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

use super::config::{hf_config, GgufArchitecture};
use super::error::{GgufError, Result};
use super::names::{expert_hf_name, map_name, permuted_qk, unpermute_qk_rows, MappedName};
use super::quant::GgmlType;
use super::reader::GgufFile;

/// One HF-named tensor of a [`GgufCheckpoint`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointTensor {
    /// HF name (`model.layers.0.self_attn.q_proj.weight`).
    pub hf_name: String,
    /// Row-major HF shape (`[out, in]` for a linear weight).
    pub shape: Vec<usize>,
    /// The type the data is stored as in the file (what dequantisation reads).
    pub ggml_type: GgmlType,
    /// The llama.cpp tensor it comes from (`blk.0.attn_q.weight`); for packed
    /// `gate_up_proj`, the gate tensor.
    pub gguf_name: String,
    layout: Layout,
}

/// How a [`CheckpointTensor`] is cut out of its GGUF tensor(s).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Layout {
    /// The whole GGUF tensor (un-permuted when `qk_heads` is set).
    Whole { qk_heads: Option<usize> },
    /// Expert `expert` of a packed `[E, out, in]` tensor.
    Expert { expert: usize, num_experts: usize },
    /// transformers-5 `gate_up_proj` `[E, 2I, H]`: per expert, gate rows then up rows.
    GateUp { up: String },
}

/// A GGUF file exposed under HF names and layout.
#[derive(Debug)]
pub struct GgufCheckpoint {
    file: GgufFile,
    arch: GgufArchitecture,
    config: Value,
    tensors: Vec<CheckpointTensor>,
    packed: Vec<CheckpointTensor>,
    index: HashMap<String, Entry>,
    unmapped: Vec<String>,
}

#[derive(Clone, Copy, Debug)]
enum Entry {
    Listed(usize),
    Packed(usize),
}

impl GgufCheckpoint {
    /// Opens `path` and interprets it; fails on an unsupported architecture
    /// (listing the supported ones) or incomplete hyper-parameters.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::from_file(GgufFile::open(path)?)
    }

    /// Interprets an already opened file.
    pub fn from_file(file: GgufFile) -> Result<Self> {
        let arch = GgufArchitecture::of(&file)?;
        let config = hf_config(&file)?;
        let count = |k: &str| config.get(k).and_then(Value::as_u64).unwrap_or(0) as usize;
        let (num_heads, num_kv_heads) = (count("num_attention_heads"), count("num_key_value_heads"));

        let mut tensors = Vec::new();
        let mut packed = Vec::new();
        let mut unmapped = Vec::new();
        for info in file.tensors() {
            let gguf_name = info.name().to_owned();
            match map_name(&gguf_name) {
                None => {
                    log::warn!(
                        "{}: tensor `{gguf_name}` has no HuggingFace counterpart; ignored",
                        file.path().display()
                    );
                    unmapped.push(gguf_name);
                }
                Some(MappedName::Single(hf_name)) => {
                    let qk_heads = match permuted_qk(&gguf_name) {
                        Some(is_q) if arch.permutes_qk() => Some(if is_q { num_heads } else { num_kv_heads }),
                        _ => None,
                    };
                    tensors.push(CheckpointTensor {
                        hf_name,
                        shape: info.shape(),
                        ggml_type: info.ggml_type(),
                        gguf_name,
                        layout: Layout::Whole { qk_heads },
                    });
                }
                Some(MappedName::Experts { layer, proj }) => {
                    let shape = info.shape();
                    let &[num_experts, rows, cols] = shape.as_slice() else {
                        return Err(GgufError::InvalidTensor {
                            path: file.path().to_path_buf(),
                            tensor: gguf_name,
                            reason: format!("packed experts need 3 dimensions, found shape {shape:?}"),
                        });
                    };
                    // The file's own count, not the tensor's shape, bounds the
                    // per-expert entries (a shape of [2^40, 1, 1] is cheap to
                    // write and would otherwise be looped over).
                    let declared = count("num_experts");
                    if num_experts != declared {
                        return Err(GgufError::InvalidTensor {
                            path: file.path().to_path_buf(),
                            tensor: gguf_name,
                            reason: format!(
                                "packs {num_experts} experts, but the metadata declares {declared} (expert_count)"
                            ),
                        });
                    }
                    for expert in 0..num_experts {
                        tensors.push(CheckpointTensor {
                            hf_name: expert_hf_name(layer, expert, proj),
                            shape: vec![rows, cols],
                            ggml_type: info.ggml_type(),
                            gguf_name: gguf_name.clone(),
                            layout: Layout::Expert { expert, num_experts },
                        });
                    }
                    let prefix = format!("model.layers.{layer}.mlp.experts");
                    match proj {
                        "down_proj" => packed.push(CheckpointTensor {
                            hf_name: format!("{prefix}.down_proj"),
                            shape,
                            ggml_type: info.ggml_type(),
                            gguf_name,
                            layout: Layout::Whole { qk_heads: None },
                        }),
                        "gate_proj" => {
                            let up = format!("blk.{layer}.ffn_up_exps.weight");
                            if file.tensor(&up).is_some_and(|u| u.shape() == shape) {
                                packed.push(CheckpointTensor {
                                    hf_name: format!("{prefix}.gate_up_proj"),
                                    shape: vec![num_experts, 2 * rows, cols],
                                    ggml_type: info.ggml_type(),
                                    gguf_name,
                                    layout: Layout::GateUp { up },
                                });
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        let mut index = HashMap::with_capacity(tensors.len() + packed.len());
        for (i, t) in tensors.iter().enumerate() {
            if index.insert(t.hf_name.clone(), Entry::Listed(i)).is_some() {
                return Err(GgufError::DuplicateTensor { path: file.path().to_path_buf(), tensor: t.hf_name.clone() });
            }
        }
        for (i, t) in packed.iter().enumerate() {
            index.insert(t.hf_name.clone(), Entry::Packed(i));
        }
        Ok(Self { file, arch, config, tensors, packed, index, unmapped })
    }

    /// The underlying file (metadata for the tokenizer, raw tensors).
    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// The architecture.
    pub fn architecture(&self) -> GgufArchitecture {
        self.arch
    }

    /// The HF `config.json` equivalent (see [`hf_config`]).
    pub fn hf_config(&self) -> &Value {
        &self.config
    }

    /// The chat template (`tokenizer.chat_template`), if the file has one.
    pub fn chat_template(&self) -> Result<Option<&str>> {
        self.file.get_opt("tokenizer.chat_template")
    }

    /// Every tensor under its HF name, in file order, experts one by one
    /// (`lm_head.weight` is absent when embeddings are tied).
    pub fn tensors(&self) -> &[CheckpointTensor] {
        &self.tensors
    }

    /// The HF names of [`tensors`](Self::tensors).
    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.tensors.iter().map(|t| t.hf_name.as_str())
    }

    /// Packed MoE tensors under transformers-5 names, also accepted by
    /// [`load_f32`](Self::load_f32): `model.layers.N.mlp.experts.gate_up_proj`
    /// `[E, 2I, H]` (per expert, gate rows then up rows) and
    /// `model.layers.N.mlp.experts.down_proj` `[E, H, I]`. Loading these is
    /// one read per layer instead of one per expert.
    pub fn packed_experts(&self) -> &[CheckpointTensor] {
        &self.packed
    }

    /// The tensor named `hf_name` (listed or packed), if any.
    pub fn tensor(&self, hf_name: &str) -> Option<&CheckpointTensor> {
        self.index.get(hf_name).map(|e| match *e {
            Entry::Listed(i) => &self.tensors[i],
            Entry::Packed(i) => &self.packed[i],
        })
    }

    /// llama.cpp tensors with no HF counterpart, skipped (logged at open).
    pub fn unmapped_tensors(&self) -> &[String] {
        &self.unmapped
    }

    /// Rows `rows` (along the HF shape's first dimension) of tensor `hf_name`
    /// dequantised to f32, reading only their bytes (a tensor-parallel rank's
    /// slice; ggml rows are whole blocks). `None` for a tensor stored in another
    /// layout (rope-permuted q/k, a fused gate/up), which must be loaded whole.
    pub fn load_f32_rows(&self, hf_name: &str, rows: std::ops::Range<usize>) -> Result<Option<Vec<f32>>> {
        let t = self.tensor(hf_name).ok_or_else(|| GgufError::MissingTensor {
            path: self.file.path().to_path_buf(),
            tensor: hf_name.to_owned(),
        })?;
        let row_elems = t.shape.iter().skip(1).product::<usize>() as u64;
        let first = match &t.layout {
            Layout::Whole { qk_heads: None } => 0,
            Layout::Expert { expert, num_experts } => {
                let info = self.file.require_tensor(&t.gguf_name)?;
                *expert as u64 * (info.num_elements() / *num_experts as u64)
            }
            _ => return Ok(None),
        };
        let info = self.file.require_tensor(&t.gguf_name)?;
        let start = first + rows.start as u64 * row_elems;
        Ok(Some(self.file.dequantize_elements(info, start, rows.len() as u64 * row_elems)?))
    }

    /// Tensor `hf_name` dequantised to f32: its HF shape and row-major data.
    pub fn load_f32(&self, hf_name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let t = self.tensor(hf_name).ok_or_else(|| GgufError::MissingTensor {
            path: self.file.path().to_path_buf(),
            tensor: hf_name.to_owned(),
        })?;
        let invalid = |reason: String| GgufError::InvalidTensor {
            path: self.file.path().to_path_buf(),
            tensor: t.gguf_name.clone(),
            reason,
        };
        let data = match &t.layout {
            Layout::Whole { qk_heads: None } => self.file.tensor_f32(&t.gguf_name)?,
            Layout::Whole { qk_heads: Some(heads) } => {
                let data = self.file.tensor_f32(&t.gguf_name)?;
                let rows = t.shape.first().copied().unwrap_or(0);
                unpermute_qk_rows(&data, rows, *heads)
                    .map_err(|e| invalid(format!("undoing llama.cpp's rope permutation: {e}")))?
            }
            Layout::Expert { expert, num_experts } => {
                let info = self.file.require_tensor(&t.gguf_name)?;
                let per_expert = info.num_elements() / *num_experts as u64;
                self.file.dequantize_elements(info, *expert as u64 * per_expert, per_expert)?
            }
            Layout::GateUp { up } => {
                let gate = self.file.tensor_f32(&t.gguf_name)?;
                let up = self.file.tensor_f32(up)?;
                let num_experts = t.shape.first().copied().unwrap_or(1).max(1);
                let per_expert = gate.len() / num_experts;
                let mut out = Vec::with_capacity(gate.len() * 2);
                if per_expert > 0 {
                    for (g, u) in gate.chunks_exact(per_expert).zip(up.chunks_exact(per_expert)) {
                        out.extend_from_slice(g);
                        out.extend_from_slice(u);
                    }
                }
                out
            }
        };
        Ok((t.shape.clone(), data))
    }
}
