//! minisgl engine: requests, scheduling, KV cache management, tokenization,
//! chat templates and the front ends (`serve`, `generate`, `bench`, `shell`).
#![forbid(unsafe_code)]

pub mod chat_template;
pub mod cli;
pub mod core;
pub mod engine;
pub mod gguf_tokenizer;
pub mod kvcache;
pub mod logprobs;
pub mod penalties;
pub mod runner;
pub mod sampling;
pub mod scheduler;
pub mod server;
pub mod shell;
pub mod tokenizer;
