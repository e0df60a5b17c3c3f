//! GGUF checkpoints: llama.cpp's single-file format as a first-class input.
//!
//! A GGUF file holds typed metadata (architecture hyper-parameters, the
//! tokenizer, the chat template) and tensors stored in llama.cpp's layout and
//! quantisation formats. This module turns one into what the rest of `models`
//! expects from a HuggingFace folder:
//!
//! | Module       | What it does                                                        |
//! | ------------ | ------------------------------------------------------------------- |
//! | [`reader`]   | Parses v2/v3 files ([`GgufFile`]): metadata, tensor infos, raw data |
//! | [`quant`]    | [`GgmlType`] and CPU dequantisation to f32, bit-exact with `gguf-py` |
//! | [`names`]    | llama.cpp tensor names to HF names, undoing the Q/K row permutation |
//! | [`config`]   | GGUF metadata to a HuggingFace-style `config.json` value            |
//! | [`checkpoint`] | [`GgufCheckpoint`]: HF names, shapes and f32 data, by HF name     |
//! | [`writer`]   | A small GGUF writer, for tests and tooling                          |
//!
//! The consumer (weight loading) uses [`GgufCheckpoint`]: `hf_config()` gives
//! the `config.json` equivalent, `tensors()` lists every tensor under its HF
//! name with its shape and stored type, and `load_f32(hf_name)` returns the
//! dequantised data in row-major HF order. The tokenizer side (engine) reads
//! the same [`GgufFile`] through [`GgufCheckpoint::file`].
//!
//! NOTE: tensor data is read with positioned reads (`read_exact_at`), not
//! memory-mapped: this crate forbids `unsafe`, and memory-mapping waits for a
//! safe mmap helper in `kernel-runtime`.

pub mod checkpoint;
pub mod config;
pub mod names;
pub mod quant;
pub mod reader;
pub mod writer;

mod error;

pub use checkpoint::{CheckpointTensor, GgufCheckpoint};
pub use config::{hf_config, GgufArchitecture};
pub use error::{GgufError, Result};
pub use quant::GgmlType;
pub use reader::{FromMetadata, GgufFile, MetadataArray, MetadataValue, TensorInfo, ValueType};
pub use writer::GgufWriter;
