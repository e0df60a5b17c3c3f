//! minisgl engine: the serving core, text processing, and the front ends.
//!
//! The folders are the crate's layers, and imports point down them only:
//!
//! | layer | module | what |
//! | --- | --- | --- |
//! | front ends | [`frontend`] | the OpenAI server, the interactive shell, the `minisgl` command line |
//! | text | [`text`] | tokenizers (HF and GGUF), chat templates, incremental detokenization and stop strings |
//! | serving core | [`core`] | requests, scheduler, KV cache, sampling (with penalties and log probabilities), the model runner, the [`core::engine::Engine`] API |
//!
//! **Architecture Invariant:** `core` works on token ids and imports neither
//! `text` nor `frontend`; `text` imports no front end. Both the server and the
//! shell turn ids into text through `text`.
#![forbid(unsafe_code)]

pub mod core;
pub mod frontend;
pub mod text;
