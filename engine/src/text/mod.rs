//! Text processing, shared by every front end: text in, token ids to the core,
//! token ids back to text.
//!
//! | module | what |
//! | --- | --- |
//! | [`tokenizer`] | `Tokenizer` (tokenizers crate), `DecodeStream`, `StopMatcher` |
//! | [`gguf_tokenizer`] | byte-level BPE and SentencePiece vocabularies rebuilt from GGUF metadata |
//! | [`chat_template`] | chat templates: minijinja with transformers' semantics |
//! | [`token_env`] | the tokens' bytes as `llguidance` sees them (constrained decoding) |
//! | [`marker`] | markers split across streamed pieces (what the parsers hold back) |
//! | [`reasoning`] | `ReasoningSplitter`: a thinking model's `<think>` part apart from its answer |
//! | [`tool_calls`] | `ToolCallParser`: the tool-call syntaxes of the supported families, parsed from output text |
//! | [`text_stream`] | `TextStream`: one request's output text, decoded incrementally with stop strings cut |
//!
//! Nothing here is async or knows about HTTP, so the server and the shell share it.

pub mod chat_template;
pub mod gguf_tokenizer;
pub mod marker;
pub mod reasoning;
pub mod text_stream;
pub mod token_env;
pub mod tokenizer;
pub mod tool_calls;
