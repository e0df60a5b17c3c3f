//! OpenAI response bodies and stream chunks.
//!
//! Field for field what OpenAI sends (and the `openai` Python package
//! parses): `id`, `object`, `created`, `model`, `choices[]` with `index`,
//! `message`/`delta`/`text`, `logprobs: null` and `finish_reason`, and
//! `usage`. In a stream, `usage` is `null` on every chunk and, with
//! `stream_options.include_usage`, set on one last chunk whose `choices` is
//! empty.

use serde::Serialize;

use crate::core::FinishReason;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens whose KV came from the prefix cache.
    pub cached_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize, cached_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens },
        }
    }
}

/// OpenAI's `finish_reason` string. `abort` (vLLM's) only reaches clients
/// whose request the server cancelled.
pub fn finish_reason_str(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Abort => "abort",
    }
}

#[derive(Serialize)]
pub struct ChatCompletion<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub choices: [ChatChoice<'a>; 1],
    pub usage: Usage,
    pub system_fingerprint: Option<&'a str>,
}

#[derive(Serialize)]
pub struct ChatChoice<'a> {
    pub index: u32,
    pub message: ChatMessage<'a>,
    pub logprobs: Option<()>,
    pub finish_reason: &'static str,
}

#[derive(Serialize)]
pub struct ChatMessage<'a> {
    pub role: &'static str,
    pub content: &'a str,
    pub refusal: Option<&'a str>,
    pub tool_calls: Vec<()>,
}

#[derive(Serialize)]
pub struct ChatChunk<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub choices: Vec<ChunkChoice<'a>>,
    pub usage: Option<Usage>,
    pub system_fingerprint: Option<&'a str>,
}

#[derive(Serialize)]
pub struct ChunkChoice<'a> {
    pub index: u32,
    pub delta: Delta<'a>,
    pub logprobs: Option<()>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Serialize, Default)]
pub struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<&'a str>,
}

#[derive(Serialize)]
pub struct Completion<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub choices: Vec<CompletionChoice<'a>>,
    pub usage: Option<Usage>,
    pub system_fingerprint: Option<&'a str>,
}

#[derive(Serialize)]
pub struct CompletionChoice<'a> {
    pub index: u32,
    pub text: &'a str,
    pub logprobs: Option<()>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Serialize)]
pub struct ModelList<'a> {
    pub object: &'static str,
    pub data: [ModelCard<'a>; 1],
}

#[derive(Serialize)]
pub struct ModelCard<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    pub root: &'a str,
    pub max_model_len: usize,
}

#[derive(Serialize)]
pub struct TokenizeResponse {
    pub count: usize,
    pub max_model_len: usize,
    pub tokens: Vec<u32>,
    pub token_strs: Option<Vec<String>>,
    /// The text that was tokenized (for chat input, the rendered template).
    pub prompt: String,
}

#[derive(Serialize)]
pub struct DetokenizeResponse {
    pub prompt: String,
}

/// What a stream sends: the chunks of one request, formatted as JSON text.
#[derive(Clone, Debug)]
pub struct ChunkWriter {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub chat: bool,
}

impl ChunkWriter {
    /// The first chat chunk: the assistant role and empty content.
    pub fn role(&self) -> String {
        self.chat_chunk(
            Delta {
                role: Some("assistant"),
                content: Some(""),
            },
            None,
        )
    }

    /// A chunk of generated (or, for `echo`, prompt) text.
    pub fn text(&self, text: &str) -> String {
        if self.chat {
            self.chat_chunk(
                Delta {
                    role: None,
                    content: Some(text),
                },
                None,
            )
        } else {
            self.completion_chunk(text, None)
        }
    }

    /// The chunk that carries `finish_reason`.
    pub fn finish(&self, reason: FinishReason) -> String {
        let reason = Some(finish_reason_str(reason));
        if self.chat {
            self.chat_chunk(Delta::default(), reason)
        } else {
            self.completion_chunk("", reason)
        }
    }

    /// The last chunk with `include_usage`: empty `choices`, `usage` set.
    pub fn usage(&self, usage: Usage) -> String {
        if self.chat {
            to_json(&ChatChunk {
                id: &self.id,
                object: "chat.completion.chunk",
                created: self.created,
                model: &self.model,
                choices: Vec::new(),
                usage: Some(usage),
                system_fingerprint: None,
            })
        } else {
            to_json(&Completion {
                id: &self.id,
                object: "text_completion",
                created: self.created,
                model: &self.model,
                choices: Vec::new(),
                usage: Some(usage),
                system_fingerprint: None,
            })
        }
    }

    fn chat_chunk(&self, delta: Delta<'_>, finish_reason: Option<&'static str>) -> String {
        to_json(&ChatChunk {
            id: &self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: &self.model,
            choices: vec![ChunkChoice {
                index: 0,
                delta,
                logprobs: None,
                finish_reason,
            }],
            usage: None,
            system_fingerprint: None,
        })
    }

    fn completion_chunk(&self, text: &str, finish_reason: Option<&'static str>) -> String {
        to_json(&Completion {
            id: &self.id,
            object: "text_completion",
            created: self.created,
            model: &self.model,
            choices: vec![CompletionChoice {
                index: 0,
                text,
                logprobs: None,
                finish_reason,
            }],
            usage: None,
            system_fingerprint: None,
        })
    }
}

/// Serializes a response body. These types hold only strings, numbers and
/// options, which cannot fail to serialize; the fallback keeps the request
/// path free of `expect`.
pub fn to_json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| {
        super::error::ApiError::Internal(format!("cannot serialize a response: {e}")).to_json()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_have_openai_fields() {
        let w = ChunkWriter {
            id: "chatcmpl-1".into(),
            created: 5,
            model: "m".into(),
            chat: true,
        };
        let role: serde_json::Value = serde_json::from_str(&w.role()).unwrap();
        assert_eq!(role["object"], "chat.completion.chunk");
        assert_eq!(role["choices"][0]["delta"]["role"], "assistant");
        assert!(role["choices"][0]["finish_reason"].is_null());
        assert!(role["usage"].is_null());
        let fin: serde_json::Value = serde_json::from_str(&w.finish(FinishReason::Length)).unwrap();
        assert_eq!(fin["choices"][0]["finish_reason"], "length");
        assert_eq!(fin["choices"][0]["delta"], serde_json::json!({}));
        let usage: serde_json::Value = serde_json::from_str(&w.usage(Usage::new(3, 4, 0))).unwrap();
        assert_eq!(usage["choices"], serde_json::json!([]));
        assert_eq!(usage["usage"]["total_tokens"], 7);
    }
}
