//! OpenAI response bodies and stream chunks.
//!
//! Field for field what OpenAI sends (and the `openai` Python package
//! parses): `id`, `object`, `created`, `model`, `choices[]` with `index`,
//! `message`/`delta`/`text`, `logprobs` (`null` unless asked for; chat and
//! completions have their own shapes, [`chat_logprobs`] and
//! [`completion_logprobs`]) and `finish_reason`, and `usage`. In a stream, `usage` is `null` on every chunk and, with
//! `stream_options.include_usage`, set on one last chunk whose `choices` is
//! empty.

use serde::Serialize;
use serde_json::{json, Map, Value as Json};

use super::engine_loop::TokenLogprob;
use super::output::ToolCallOut;
use crate::core::req::FinishReason;

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
    pub choices: Vec<ChatChoice<'a>>,
    pub usage: Usage,
    pub system_fingerprint: Option<&'a str>,
}

#[derive(Serialize)]
pub struct ChatChoice<'a> {
    pub index: u32,
    pub message: ChatMessage<'a>,
    pub logprobs: Option<Json>,
    pub finish_reason: &'static str,
}

#[derive(Serialize)]
pub struct ChatMessage<'a> {
    pub role: &'static str,
    /// `null` when the choice is only tool calls.
    pub content: Option<&'a str>,
    /// The thinking part (vLLM's field), with a reasoning parser.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<&'a str>,
    pub refusal: Option<&'a str>,
    pub tool_calls: Vec<Json>,
}

/// A tool call as `message.tool_calls[]` holds it (`index` is for deltas).
pub fn tool_call_json(call: &ToolCallOut, with_index: bool) -> Json {
    let mut v = json!({
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    });
    if with_index {
        v["index"] = json!(call.index);
    }
    v
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
    pub logprobs: Option<Json>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Serialize, Default)]
pub struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Json>>,
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
    pub logprobs: Option<Json>,
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
    /// The first chat chunk of choice `index`: the assistant role and empty
    /// content.
    pub fn role(&self, index: u32) -> String {
        self.chat_chunk(index, Delta { role: Some("assistant"), content: Some(""), ..Delta::default() }, None, None)
    }

    /// A chunk of generated (or, for `echo`, prompt) text of choice `index`,
    /// with the log probabilities of its tokens (already in the API's shape).
    pub fn text(&self, index: u32, text: &str, logprobs: Option<Json>) -> String {
        if self.chat {
            self.chat_chunk(index, Delta { content: Some(text), ..Delta::default() }, logprobs, None)
        } else {
            self.completion_chunk(index, text, logprobs, None)
        }
    }

    /// A chat chunk of reasoning text of choice `index`.
    pub fn reasoning(&self, index: u32, text: &str, logprobs: Option<Json>) -> String {
        self.chat_chunk(index, Delta { reasoning_content: Some(text), ..Delta::default() }, logprobs, None)
    }

    /// A chat chunk with one complete tool call of choice `index` (the
    /// client's stream helpers assemble calls by `index`).
    pub fn tool_call(&self, index: u32, call: &ToolCallOut, logprobs: Option<Json>) -> String {
        let delta = Delta { tool_calls: Some(vec![tool_call_json(call, true)]), ..Delta::default() };
        self.chat_chunk(index, delta, logprobs, None)
    }

    /// The chunk that carries choice `index`'s `finish_reason`.
    pub fn finish(&self, index: u32, reason: FinishReason) -> String {
        self.finish_str(index, finish_reason_str(reason))
    }

    /// [`Self::finish`] with the reason as the API spells it (`tool_calls`).
    pub fn finish_str(&self, index: u32, reason: &'static str) -> String {
        let reason = Some(reason);
        if self.chat {
            self.chat_chunk(index, Delta::default(), None, reason)
        } else {
            self.completion_chunk(index, "", None, reason)
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

    fn chat_chunk(
        &self,
        index: u32,
        delta: Delta<'_>,
        logprobs: Option<Json>,
        finish_reason: Option<&'static str>,
    ) -> String {
        to_json(&ChatChunk {
            id: &self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: &self.model,
            choices: vec![ChunkChoice { index, delta, logprobs, finish_reason }],
            usage: None,
            system_fingerprint: None,
        })
    }

    fn completion_chunk(
        &self,
        index: u32,
        text: &str,
        logprobs: Option<Json>,
        finish_reason: Option<&'static str>,
    ) -> String {
        to_json(&Completion {
            id: &self.id,
            object: "text_completion",
            created: self.created,
            model: &self.model,
            choices: vec![CompletionChoice { index, text, logprobs, finish_reason }],
            usage: None,
            system_fingerprint: None,
        })
    }
}

/// A log probability as JSON: -inf (a masked token) has no JSON number, so it
/// becomes -9999, as in vLLM.
fn logprob_json(logprob: f32) -> Json {
    json!(if logprob.is_finite() { f64::from(logprob) } else { -9999.0 })
}

/// Chat's `logprobs`: `{"content": [{"token", "logprob", "bytes",
/// "top_logprobs": [{"token", "logprob", "bytes"}]}], "refusal": null}`.
pub fn chat_logprobs(tokens: &[TokenLogprob]) -> Json {
    let entry = |token: &str, logprob: f32| json!({"token": token, "logprob": logprob_json(logprob), "bytes": token.as_bytes()});
    let content: Vec<Json> = tokens
        .iter()
        .map(|t| {
            let mut e = entry(&t.token, t.logprob);
            e["top_logprobs"] = t.top.iter().map(|(tok, lp)| entry(tok, *lp)).collect();
            e
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// The completions API's `logprobs`: `{"tokens", "token_logprobs",
/// "top_logprobs": [{token: logprob}], "text_offset"}`, offsets counted in
/// characters of the choice's text from `text_offset` (where these tokens
/// start).
pub fn completion_logprobs(tokens: &[TokenLogprob], mut text_offset: usize) -> Json {
    let mut offsets = Vec::with_capacity(tokens.len());
    for t in tokens {
        offsets.push(text_offset);
        text_offset += t.token.chars().count();
    }
    let top: Vec<Json> = tokens
        .iter()
        .map(|t| {
            let map: Map<String, Json> = t.top.iter().map(|(tok, lp)| (tok.clone(), logprob_json(*lp))).collect();
            Json::Object(map)
        })
        .collect();
    json!({
        "tokens": tokens.iter().map(|t| t.token.as_str()).collect::<Vec<_>>(),
        "token_logprobs": tokens.iter().map(|t| logprob_json(t.logprob)).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": offsets,
    })
}

/// Serializes a response body. These types hold only strings, numbers and
/// options, which cannot fail to serialize; the fallback keeps the request
/// path free of `expect`.
pub fn to_json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value)
        .unwrap_or_else(|e| super::error::ApiError::Internal(format!("cannot serialize a response: {e}")).to_json())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_have_openai_fields() {
        let w = ChunkWriter { id: "chatcmpl-1".into(), created: 5, model: "m".into(), chat: true };
        let role: serde_json::Value = serde_json::from_str(&w.role(0)).unwrap();
        assert_eq!(role["object"], "chat.completion.chunk");
        assert_eq!(role["choices"][0]["delta"]["role"], "assistant");
        assert!(role["choices"][0]["finish_reason"].is_null());
        assert!(role["usage"].is_null());
        let fin: serde_json::Value = serde_json::from_str(&w.finish(2, FinishReason::Length)).unwrap();
        assert_eq!(fin["choices"][0]["finish_reason"], "length");
        assert_eq!(fin["choices"][0]["index"], 2);
        assert_eq!(fin["choices"][0]["delta"], serde_json::json!({}));
        let usage: serde_json::Value = serde_json::from_str(&w.usage(Usage::new(3, 4, 0))).unwrap();
        assert_eq!(usage["choices"], serde_json::json!([]));
        assert_eq!(usage["usage"]["total_tokens"], 7);
    }

    #[test]
    fn tool_call_and_reasoning_deltas_have_openai_fields() {
        let w = ChunkWriter { id: "chatcmpl-1".into(), created: 5, model: "m".into(), chat: true };
        let call = ToolCallOut { index: 1, id: "call_x".into(), name: "f".into(), arguments: r#"{"a":1}"#.into() };
        let chunk: serde_json::Value = serde_json::from_str(&w.tool_call(0, &call, None)).unwrap();
        let delta = &chunk["choices"][0]["delta"];
        assert_eq!(
            delta["tool_calls"],
            json!([{"index": 1, "id": "call_x", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}])
        );
        assert!(delta.get("content").is_none() && delta.get("role").is_none());
        let chunk: serde_json::Value = serde_json::from_str(&w.reasoning(0, "hmm", None)).unwrap();
        assert_eq!(chunk["choices"][0]["delta"], json!({"reasoning_content": "hmm"}));
        let fin: serde_json::Value = serde_json::from_str(&w.finish_str(0, "tool_calls")).unwrap();
        assert_eq!(fin["choices"][0]["finish_reason"], "tool_calls");
        // In a whole message the call has no index.
        assert!(tool_call_json(&call, false).get("index").is_none());
    }

    fn token(token: &str, logprob: f32, top: &[(&str, f32)]) -> TokenLogprob {
        TokenLogprob { token: token.into(), logprob, top: top.iter().map(|&(t, p)| (t.to_owned(), p)).collect() }
    }

    #[test]
    fn logprobs_have_the_shapes_of_chat_and_completions() {
        let tokens = [token("Hé", -0.5, &[("Hé", -0.5), ("Yo", -1.0)]), token("!", f32::NEG_INFINITY, &[])];
        let chat = chat_logprobs(&tokens);
        assert_eq!(chat["content"][0]["token"], "Hé");
        assert_eq!(chat["content"][0]["bytes"], serde_json::json!([72, 195, 169]));
        assert_eq!(chat["content"][0]["top_logprobs"][1]["token"], "Yo");
        assert_eq!(chat["content"][0]["top_logprobs"][1]["logprob"], -1.0);
        assert_eq!(chat["content"][1]["logprob"], -9999.0);
        assert!(chat["refusal"].is_null());
        let comp = completion_logprobs(&tokens, 3);
        assert_eq!(comp["tokens"], serde_json::json!(["Hé", "!"]));
        assert_eq!(comp["token_logprobs"], serde_json::json!([-0.5, -9999.0]));
        assert_eq!(comp["top_logprobs"][0], serde_json::json!({"Hé": -0.5, "Yo": -1.0}));
        assert_eq!(comp["text_offset"], serde_json::json!([3, 5]));
    }
}
