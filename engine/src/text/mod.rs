//! Text processing, shared by every front end: text in, token ids to the core,
//! token ids back to text.
//!
//! | module | what |
//! | --- | --- |
//! | [`tokenizer`] | `Tokenizer` (tokenizers crate), `DecodeStream`, `StopMatcher` |
//! | [`gguf_tokenizer`] | byte-level BPE and SentencePiece vocabularies rebuilt from GGUF metadata |
//! | [`chat_template`] | chat templates: minijinja with transformers' semantics |
//! | [`text_stream`] | `TextStream`: one request's output text, decoded incrementally with stop strings cut |
//!
//! Nothing here is async or knows about HTTP, so the server and the shell share it.

pub mod chat_template;
pub mod gguf_tokenizer;
pub mod text_stream;
pub mod tokenizer;
