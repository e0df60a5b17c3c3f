//! minisgl models: HuggingFace folder (or GGUF file) in, logits out.
//!
//! Nothing here knows about requests, HTTP or tokenizers; the engine drives the
//! models through the forward context declared in `ctx`.
#![forbid(unsafe_code)]

pub mod gguf;
