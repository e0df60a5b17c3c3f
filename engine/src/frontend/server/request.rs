//! OpenAI (and vLLM) request bodies, parsed and validated.
//!
//! Each `parse_*` function reads one endpoint's body with [`Fields`] into a
//! typed request, checking types and ranges and naming the field in every
//! error. Supported, beyond the OpenAI fields: vLLM's `top_k`, `min_p`,
//! `ignore_eos`, `stop_token_ids`, `skip_special_tokens`,
//! `chat_template_kwargs`, `add_generation_prompt`, `continue_final_message`,
//! `add_special_tokens` and `documents` (and `n`, the penalties and log
//! probabilities, which the engine implements), `response_format` and vLLM's
//! `guided_*` ([`structured`](super::structured)) and `tools` / `tool_choice` /
//! `parallel_tool_calls` ([`tools`](super::tools)). Fields the server does not
//! implement are accepted only at their neutral value (`echo: false`,
//! `best_of: 1`, `suffix: ""`, ...) and refused otherwise.

use std::sync::Arc;

use serde_json::{Map, Value as Json};

use super::error::ApiError;
use super::fields::{as_int, Fields};
use super::structured::{parse_output_format, ResponseFormat};
use super::tools::{parse_tools, ToolRequest};
use crate::core::engine::MAX_TOP_LOGPROBS;
use crate::core::req::SamplingParams;
use crate::core::sampling::penalties::Penalties;

/// Fields accepted and ignored on every generation endpoint: they carry no
/// meaning for generation (`user` is an end-user id for abuse monitoring,
/// `metadata`/`store` concern OpenAI's stored completions).
const IGNORABLE: &[&str] = &["user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier"];

/// Fields of the OpenAI and vLLM APIs that this server does not implement
/// (beyond their neutral values), for a precise error message.
const KNOWN_UNSUPPORTED: &[&str] = &[
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "functions",
    "function_call",
    "prompt_logprobs",
    "audio",
    "modalities",
    "prediction",
    "web_search_options",
    "reasoning_effort",
    "verbosity",
    "suffix",
    "best_of",
    "structured_outputs",
    "chat_template",
    "mm_processor_kwargs",
    "priority",
    "use_beam_search",
    "length_penalty",
    "bad_words",
    "truncate_prompt_tokens",
    "cache_salt",
    "kv_transfer_params",
    "vllm_xargs",
    "return_tokens_as_token_ids",
    "return_token_ids",
];

/// Server-wide sampling defaults: OpenAI's, overridden by the model's
/// `generation_config.json` the way vLLM does it (`temperature`, `top_p`,
/// `top_k`, `min_p`, `max_new_tokens`). Unlike vLLM, a `repetition_penalty`
/// there is not made the default: penalties sample on the host, which on a GPU
/// would slow every request of such a model (Qwen2.5 sets 1.05); requests may
/// still set it.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingDefaults {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: Option<usize>,
    pub min_p: f32,
    /// Cap on the default `max_tokens` (a request's own value is not capped).
    pub max_new_tokens: Option<usize>,
}

impl SamplingDefaults {
    /// OpenAI's defaults: temperature 1, no truncation.
    pub fn openai() -> Self {
        Self { temperature: 1.0, top_p: 1.0, top_k: None, min_p: 0.0, max_new_tokens: None }
    }

    /// Applies the sampling fields of a `generation_config.json`; returns the
    /// names of the fields it took, for a log line.
    pub fn apply_generation_config(&mut self, config: &Json) -> Vec<&'static str> {
        let mut taken = Vec::new();
        let num = |key: &str| config.get(key).and_then(Json::as_f64);
        if let Some(t) = num("temperature").filter(|t| t.is_finite() && *t >= 0.0) {
            self.temperature = t as f32;
            taken.push("temperature");
        }
        if let Some(p) = num("top_p").filter(|p| *p > 0.0 && *p <= 1.0) {
            self.top_p = p as f32;
            taken.push("top_p");
        }
        if let Some(k) = config.get("top_k").and_then(as_int) {
            self.top_k = usize::try_from(k).ok().filter(|&k| k > 0);
            taken.push("top_k");
        }
        if let Some(p) = num("min_p").filter(|p| (0.0..=1.0).contains(p)) {
            self.min_p = p as f32;
            taken.push("min_p");
        }
        if let Some(n) = config.get("max_new_tokens").and_then(as_int) {
            self.max_new_tokens = usize::try_from(n).ok().filter(|&n| n > 0);
            taken.push("max_new_tokens");
        }
        taken
    }
}

/// The sampling fields of a generation request, as sent (unset = default).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sampling {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// `Some(None)`: explicitly disabled (`top_k: -1` or `0`, as in vLLM).
    pub top_k: Option<Option<usize>>,
    pub min_p: Option<f32>,
    pub seed: Option<u64>,
    /// The length limit and the name of the field that set it.
    pub max_tokens: Option<(usize, &'static str)>,
    pub stop: Vec<String>,
    pub stop_token_ids: Arc<[u32]>,
    pub ignore_eos: bool,
    pub skip_special_tokens: bool,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    /// Report log probabilities with this many alternatives per token.
    pub logprobs: Option<usize>,
    /// Choices to generate for each prompt (`n`, >= 1).
    pub n: usize,
}

impl Sampling {
    /// The engine's parameters. `default_max_tokens` applies when the
    /// request set no limit.
    pub fn to_params(&self, defaults: &SamplingDefaults, default_max_tokens: usize) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature.unwrap_or(defaults.temperature),
            top_k: self.top_k.unwrap_or(defaults.top_k),
            top_p: self.top_p.unwrap_or(defaults.top_p),
            min_p: self.min_p.unwrap_or(defaults.min_p),
            seed: self.seed,
            max_tokens: self.max_tokens.map_or(default_max_tokens, |(n, _)| n),
            stop_token_ids: self.stop_token_ids.clone(),
            ignore_eos: self.ignore_eos,
            penalties: Penalties {
                repetition: self.repetition_penalty.unwrap_or(1.0),
                frequency: self.frequency_penalty.unwrap_or(0.0),
                presence: self.presence_penalty.unwrap_or(0.0),
            },
            logprobs: self.logprobs,
        }
    }
}

/// `stream` and `stream_options`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamOptions {
    pub stream: bool,
    /// Send a last chunk with `usage` and empty `choices`.
    pub include_usage: bool,
}

/// `POST /v1/chat/completions`.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatRequest {
    pub model: Option<String>,
    /// Messages as the chat template sees them (content parts joined).
    pub messages: Vec<Json>,
    pub render: ChatRender,
    pub add_special_tokens: bool,
    pub sampling: Sampling,
    pub stream: StreamOptions,
    pub response_format: Option<ResponseFormat>,
    /// `tools`, `tool_choice` and `parallel_tool_calls` (`None`: no tools).
    pub tools: Option<ToolRequest>,
}

/// How to render a conversation (chat requests and `/tokenize`).
#[derive(Clone, Debug, PartialEq)]
pub struct ChatRender {
    pub add_generation_prompt: bool,
    /// End the prompt inside the last (assistant) message, so the model
    /// continues it (vLLM's `continue_final_message`).
    pub continue_final_message: bool,
    /// Extra template variables (`enable_thinking`, ...).
    pub chat_template_kwargs: Map<String, Json>,
    pub documents: Option<Json>,
}

/// A completion prompt: text, or token ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

/// `POST /v1/completions`.
#[derive(Clone, Debug, PartialEq)]
pub struct CompletionRequest {
    pub model: Option<String>,
    /// One prompt, or several (a batch: each gets `n` choices).
    pub prompts: Vec<Prompt>,
    pub add_special_tokens: bool,
    /// Return the prompt before the completion.
    pub echo: bool,
    pub sampling: Sampling,
    pub stream: StreamOptions,
    pub response_format: Option<ResponseFormat>,
}

/// `POST /tokenize`: a prompt, or a conversation to render first.
#[derive(Clone, Debug, PartialEq)]
pub enum TokenizeInput {
    Prompt(Prompt),
    /// `tools`: what the chat template shows of the request's tools. (The
    /// render options are boxed: they are most of the variant's size.)
    Chat {
        messages: Vec<Json>,
        render: Box<ChatRender>,
        tools: Option<Json>,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct TokenizeRequest {
    pub model: Option<String>,
    pub input: TokenizeInput,
    pub add_special_tokens: bool,
    pub return_token_strs: bool,
}

/// `POST /detokenize`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    pub tokens: Vec<u32>,
}

pub fn parse_chat(body: &[u8]) -> Result<ChatRequest, ApiError> {
    let mut f = Fields::from_body(body)?;
    let model = f.string("model")?;
    let messages = match f.take("messages") {
        None => return Err(ApiError::Missing { param: "messages".into() }),
        Some(v) => parse_messages(v)?,
    };
    let render = parse_render(&mut f)?;
    let add_special_tokens = f.bool("add_special_tokens")?.unwrap_or(false);
    let sampling = parse_sampling(&mut f, true)?;
    let stream = parse_stream(&mut f)?;
    let mut sampling = sampling;
    let logprobs = f.bool("logprobs")?.unwrap_or(false);
    let top = f.int("top_logprobs")?;
    if let Some(n) = top {
        if !logprobs {
            return Err(ApiError::invalid_value("top_logprobs", "needs `logprobs: true`"));
        }
        check_top_logprobs("top_logprobs", n)?;
    }
    if logprobs {
        sampling.logprobs = Some(top.map_or(0, |n| n as usize));
    }
    f.neutral("echo", |v| v == &Json::Bool(false), "")?;
    let tools = parse_tools(&mut f)?;
    let response_format = parse_output_format(&mut f)?;
    if response_format.as_ref().is_some_and(|r| r.grammar().is_some())
        && tools.as_ref().is_some_and(|t| t.grammar().is_some())
    {
        return Err(ApiError::invalid_value(
            response_format.as_ref().map_or("response_format", ResponseFormat::param),
            "cannot be combined with a `tool_choice` that forces a tool call",
        ));
    }
    f.finish(IGNORABLE, KNOWN_UNSUPPORTED)?;
    Ok(ChatRequest { model, messages, render, add_special_tokens, sampling, stream, response_format, tools })
}

pub fn parse_completion(body: &[u8]) -> Result<CompletionRequest, ApiError> {
    let mut f = Fields::from_body(body)?;
    let model = f.string("model")?;
    let prompts = match f.take("prompt") {
        None => return Err(ApiError::Missing { param: "prompt".into() }),
        Some(v) => parse_prompts(v)?,
    };
    let add_special_tokens = f.bool("add_special_tokens")?.unwrap_or(true);
    let echo = f.bool("echo")?.unwrap_or(false);
    let sampling = parse_sampling(&mut f, false)?;
    let stream = parse_stream(&mut f)?;
    f.neutral("best_of", |v| as_int(v) == Some(1), "only best_of=1 is implemented")?;
    f.neutral("suffix", |v| v == "", "insertion (suffix) is not implemented")?;
    let mut sampling = sampling;
    if let Some(n) = f.int("logprobs")? {
        check_top_logprobs("logprobs", n)?;
        sampling.logprobs = Some(n as usize);
    }
    let response_format = parse_output_format(&mut f)?;
    f.finish(IGNORABLE, KNOWN_UNSUPPORTED)?;
    if prompts.len() * sampling.n > MAX_N {
        return Err(ApiError::invalid_value(
            "n",
            format!("{} prompts x n = {} makes more than {MAX_N} choices", prompts.len(), sampling.n),
        ));
    }
    Ok(CompletionRequest { model, prompts, add_special_tokens, echo, sampling, stream, response_format })
}

pub fn parse_tokenize(body: &[u8]) -> Result<TokenizeRequest, ApiError> {
    let mut f = Fields::from_body(body)?;
    let model = f.string("model")?;
    let prompt = f.take("prompt");
    let messages = f.take("messages");
    let (input, default_special) = match (prompt, messages) {
        (Some(p), None) => (TokenizeInput::Prompt(parse_prompt(p, "prompt")?), true),
        (None, Some(m)) => {
            let messages = parse_messages(m)?;
            let render = parse_render(&mut f)?;
            let tools = parse_tools(&mut f)?.and_then(|t| t.template_tools());
            (TokenizeInput::Chat { messages, render: Box::new(render), tools }, false)
        }
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid_value("messages", "give either `prompt` or `messages`, not both"))
        }
        (None, None) => return Err(ApiError::Missing { param: "prompt".into() }),
    };
    let add_special_tokens = f.bool("add_special_tokens")?.unwrap_or(default_special);
    let return_token_strs = f.bool("return_token_strs")?.unwrap_or(false);
    f.neutral("tools", is_empty_array, "tools are rendered only with `messages`")?;
    f.finish(&["user"], KNOWN_UNSUPPORTED)?;
    Ok(TokenizeRequest { model, input, add_special_tokens, return_token_strs })
}

pub fn parse_detokenize(body: &[u8]) -> Result<DetokenizeRequest, ApiError> {
    let mut f = Fields::from_body(body)?;
    let model = f.string("model")?;
    let tokens = match f.take("tokens") {
        None => return Err(ApiError::Missing { param: "tokens".into() }),
        Some(v) => token_ids(&v, "tokens")?,
    };
    f.finish(&["user"], KNOWN_UNSUPPORTED)?;
    Ok(DetokenizeRequest { model, tokens })
}

fn is_empty_array(v: &Json) -> bool {
    v.as_array().is_some_and(Vec::is_empty)
}

fn parse_render(f: &mut Fields) -> Result<ChatRender, ApiError> {
    let add_generation_prompt = f.bool("add_generation_prompt")?.unwrap_or(true);
    let continue_final_message = f.bool("continue_final_message")?.unwrap_or(false);
    if add_generation_prompt && continue_final_message {
        return Err(ApiError::invalid_value(
            "continue_final_message",
            "cannot be combined with `add_generation_prompt: true` (set it to false)",
        ));
    }
    let chat_template_kwargs = f.object("chat_template_kwargs")?.unwrap_or_default();
    // These are set by the request's own fields; a template variable of the
    // same name would be silently overridden, so refuse it instead.
    const RESERVED: &[&str] = &[
        "messages",
        "add_generation_prompt",
        "tools",
        "documents",
        "bos_token",
        "eos_token",
        "unk_token",
        "pad_token",
    ];
    if let Some(key) = chat_template_kwargs.keys().find(|k| RESERVED.contains(&k.as_str())) {
        return Err(ApiError::invalid_value(
            format!("chat_template_kwargs.{key}"),
            "is set by the server or by a request field of its own and cannot be passed as a template variable",
        ));
    }
    let documents = match f.take("documents") {
        None => None,
        Some(v @ Json::Array(_)) => Some(v),
        Some(_) => return Err(ApiError::invalid_type("documents", "an array of objects")),
    };
    Ok(ChatRender { add_generation_prompt, continue_final_message, chat_template_kwargs, documents })
}

/// The roles a message may have: OpenAI's, and `ipython` (Llama 3's tool
/// results).
pub const MESSAGE_ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool", "function", "ipython"];

/// Chat messages: a non-empty array of objects with a string `role` and a
/// `content` that is a string, an array of text parts (joined with newlines,
/// as vLLM does for templates that expect strings), or absent/null (for
/// assistant turns). Other fields (`name`, `tool_calls`, ...) go to the
/// template as they are.
pub fn parse_messages(v: Json) -> Result<Vec<Json>, ApiError> {
    let Json::Array(items) = v else {
        return Err(ApiError::invalid_type("messages", "an array of message objects"));
    };
    if items.is_empty() {
        return Err(ApiError::invalid_value("messages", "must not be empty"));
    }
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            let Json::Object(mut msg) = item else {
                return Err(ApiError::invalid_type(format!("messages.{i}"), "an object"));
            };
            let role = match msg.get("role") {
                Some(Json::String(r)) if MESSAGE_ROLES.contains(&r.as_str()) => r.clone(),
                // A template would render an unknown role silently (or
                // drop it): say so instead.
                Some(Json::String(r)) if !r.is_empty() => {
                    return Err(ApiError::invalid_value(
                        format!("messages.{i}.role"),
                        format!("unknown role `{r}`: expected one of {}", MESSAGE_ROLES.join(", ")),
                    ))
                }
                Some(Json::String(_)) => {
                    return Err(ApiError::invalid_value(format!("messages.{i}.role"), "must not be empty"))
                }
                None | Some(Json::Null) => return Err(ApiError::Missing { param: format!("messages.{i}.role") }),
                Some(_) => return Err(ApiError::invalid_type(format!("messages.{i}.role"), "a string")),
            };
            let content = match msg.remove("content") {
                None | Some(Json::Null) => {
                    if role != "assistant" {
                        return Err(ApiError::Missing { param: format!("messages.{i}.content") });
                    }
                    None
                }
                Some(Json::String(s)) => Some(s),
                Some(Json::Array(parts)) => Some(join_text_parts(parts, i)?),
                Some(_) => {
                    return Err(ApiError::invalid_type(
                        format!("messages.{i}.content"),
                        "a string or an array of content parts",
                    ))
                }
            };
            if let Some(content) = content {
                msg.insert("content".to_owned(), Json::String(content));
            }
            if let Some(Json::Array(calls)) = msg.get_mut("tool_calls") {
                arguments_as_objects(calls);
            }
            Ok(Json::Object(msg))
        })
        .collect()
}

/// Clients send a tool call's `function.arguments` as JSON text; chat
/// templates (Qwen's, Llama's) print it with `tojson`, so they get it parsed,
/// as vLLM does. Text that is not a JSON object stays text.
fn arguments_as_objects(calls: &mut [Json]) {
    for call in calls {
        if let Some(args) = call.get_mut("function").and_then(|f| f.get_mut("arguments")) {
            if let Some(obj @ Json::Object(_)) = args.as_str().and_then(|s| serde_json::from_str::<Json>(s).ok()) {
                *args = obj;
            }
        }
    }
}

fn join_text_parts(parts: Vec<Json>, msg_idx: usize) -> Result<String, ApiError> {
    let mut texts = Vec::with_capacity(parts.len());
    for (j, part) in parts.into_iter().enumerate() {
        let param = format!("messages.{msg_idx}.content.{j}");
        let Json::Object(part) = part else {
            return Err(ApiError::invalid_type(param, "a content part object"));
        };
        match part.get("type").and_then(Json::as_str) {
            Some("text") => {}
            Some(other) => {
                return Err(ApiError::unsupported(
                    format!("{param}.type"),
                    format!("content parts of type `{other}` are not supported (text only)"),
                ))
            }
            None => return Err(ApiError::Missing { param: format!("{param}.type") }),
        }
        match part.get("text") {
            Some(Json::String(t)) => texts.push(t.clone()),
            None | Some(Json::Null) => return Err(ApiError::Missing { param: format!("{param}.text") }),
            Some(_) => return Err(ApiError::invalid_type(format!("{param}.text"), "a string")),
        }
        if let Some(key) = part.keys().find(|k| !matches!(k.as_str(), "type" | "text")) {
            return Err(ApiError::UnknownField { param: format!("{param}.{key}") });
        }
    }
    Ok(texts.join("\n"))
}

/// A completion prompt: a string, an array of token ids, or an array
/// holding exactly one of those (what clients send for a single prompt).
fn parse_prompt(v: Json, param: &str) -> Result<Prompt, ApiError> {
    match v {
        Json::String(s) => Ok(Prompt::Text(s)),
        Json::Array(items) => {
            if items.is_empty() {
                return Err(ApiError::invalid_value(param, "must not be empty"));
            }
            if items.iter().all(|x| x.is_number()) {
                return Ok(Prompt::Ids(token_ids(&Json::Array(items), param)?));
            }
            if items.len() > 1 {
                return Err(ApiError::unsupported(
                    param,
                    "a list of several prompts is not supported; send one request per prompt",
                ));
            }
            match items.into_iter().next() {
                Some(Json::String(s)) => Ok(Prompt::Text(s)),
                Some(inner @ Json::Array(_)) => Ok(Prompt::Ids(token_ids(&inner, param)?)),
                _ => Err(ApiError::invalid_type(
                    param,
                    "a string, an array of token ids, or a one-element array of either",
                )),
            }
        }
        _ => Err(ApiError::invalid_type(param, "a string or an array of token ids")),
    }
}

/// The `prompt` of a completion: a string, an array of token ids, or an array
/// of several of either (a batch).
fn parse_prompts(v: Json) -> Result<Vec<Prompt>, ApiError> {
    match v {
        Json::Array(items) if !items.is_empty() && !items.iter().all(Json::is_number) => items
            .into_iter()
            .enumerate()
            .map(|(i, item)| {
                let param = format!("prompt.{i}");
                match item {
                    Json::String(s) => Ok(Prompt::Text(s)),
                    ids @ Json::Array(_) => {
                        let ids = token_ids(&ids, &param)?;
                        if ids.is_empty() {
                            return Err(ApiError::invalid_value(param, "must not be empty"));
                        }
                        Ok(Prompt::Ids(ids))
                    }
                    _ => Err(ApiError::invalid_type(param, "a string or an array of token ids")),
                }
            })
            .collect(),
        single => Ok(vec![parse_prompt(single, "prompt")?]),
    }
}

fn token_ids(v: &Json, param: &str) -> Result<Vec<u32>, ApiError> {
    let Json::Array(items) = v else {
        return Err(ApiError::invalid_type(param, "an array of token ids"));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, x)| match as_int(x) {
            Some(id) => u32::try_from(id)
                .map_err(|_| ApiError::invalid_value(format!("{param}.{i}"), format!("{id} is not a token id"))),
            None => Err(ApiError::invalid_type(format!("{param}.{i}"), "an integer token id")),
        })
        .collect()
}

/// The most choices one request may ask for (`n`).
pub const MAX_N: usize = 128;

/// The most stop strings one request may send. Matching costs the same per
/// byte of output whatever their number (one automaton per request), so
/// this bounds the automaton's memory, with [`MAX_STOP_STRING_BYTES`].
pub const MAX_STOP_STRINGS: usize = 64;

/// The longest stop string, in bytes: output is held back while it may be
/// the start of one, so this also bounds the streaming delay.
pub const MAX_STOP_STRING_BYTES: usize = 1024;

/// The most `stop_token_ids` one request may send (each generated token is
/// checked against the list).
pub const MAX_STOP_TOKEN_IDS: usize = 1024;

/// `top_logprobs` (chat) or `logprobs` (completions): 0 to 20 alternatives.
fn check_top_logprobs(field: &str, n: i128) -> Result<(), ApiError> {
    if (0..=MAX_TOP_LOGPROBS as i128).contains(&n) {
        Ok(())
    } else {
        Err(ApiError::invalid_value(field, format!("must be in [0, {MAX_TOP_LOGPROBS}], got {n}")))
    }
}

/// The sampling fields shared by chat and completions. `chat` also accepts
/// `max_completion_tokens` (which wins over `max_tokens`, as in vLLM).
fn parse_sampling(f: &mut Fields, chat: bool) -> Result<Sampling, ApiError> {
    let mut s = Sampling { skip_special_tokens: true, ..Sampling::default() };
    if let Some(t) = f.f64("temperature")? {
        if !(t.is_finite() && t >= 0.0) {
            return Err(ApiError::invalid_value("temperature", format!("must be >= 0, got {t}")));
        }
        s.temperature = Some(t as f32);
    }
    if let Some(p) = f.f64("top_p")? {
        if !(p > 0.0 && p <= 1.0) {
            return Err(ApiError::invalid_value("top_p", format!("must be in (0, 1], got {p}")));
        }
        s.top_p = Some(p as f32);
    }
    if let Some(k) = f.int("top_k")? {
        s.top_k = Some(match k {
            -1 | 0 => None,
            k if k > 0 => Some(usize::try_from(k).unwrap_or(usize::MAX)),
            k => return Err(ApiError::invalid_value("top_k", format!("must be >= 1, or -1 or 0 to disable, got {k}"))),
        });
    }
    if let Some(p) = f.f64("min_p")? {
        if !(0.0..=1.0).contains(&p) {
            return Err(ApiError::invalid_value("min_p", format!("must be in [0, 1], got {p}")));
        }
        s.min_p = Some(p as f32);
    }
    if let Some(seed) = f.int("seed")? {
        // Negative seeds (Python clients allow them) map to distinct u64s.
        s.seed = Some(seed as u64);
    }
    let mut max_tokens = None;
    let mut length_fields = vec!["max_tokens"];
    if chat {
        length_fields.insert(0, "max_completion_tokens");
    }
    for field in length_fields {
        if let Some(n) = f.int(field)? {
            if n < 1 {
                return Err(ApiError::invalid_value(field, format!("must be at least 1, got {n}")));
            }
            if max_tokens.is_none() {
                max_tokens = Some((usize::try_from(n).unwrap_or(usize::MAX), field));
            }
        }
    }
    s.max_tokens = max_tokens;
    if let Some(stop) = f.take("stop") {
        s.stop = match stop {
            Json::String(x) => vec![x],
            Json::Array(items) if items.len() > MAX_STOP_STRINGS => {
                return Err(ApiError::invalid_value(
                    "stop",
                    format!("at most {MAX_STOP_STRINGS} stop strings, got {}", items.len()),
                ))
            }
            Json::Array(items) => items
                .into_iter()
                .enumerate()
                .map(|(i, x)| match x {
                    Json::String(x) => Ok(x),
                    _ => Err(ApiError::invalid_type(format!("stop.{i}"), "a string")),
                })
                .collect::<Result<_, _>>()?,
            _ => return Err(ApiError::invalid_type("stop", "a string or an array of strings")),
        };
        if let Some(i) = s.stop.iter().position(String::is_empty) {
            return Err(ApiError::invalid_value(format!("stop.{i}"), "must not be empty"));
        }
        if let Some((i, x)) = s.stop.iter().enumerate().find(|(_, x)| x.len() > MAX_STOP_STRING_BYTES) {
            return Err(ApiError::invalid_value(
                format!("stop.{i}"),
                format!("at most {MAX_STOP_STRING_BYTES} bytes, got {}", x.len()),
            ));
        }
    }
    if let Some(ids) = f.take("stop_token_ids") {
        if let Some(n) = ids.as_array().map(Vec::len).filter(|&n| n > MAX_STOP_TOKEN_IDS) {
            return Err(ApiError::invalid_value(
                "stop_token_ids",
                format!("at most {MAX_STOP_TOKEN_IDS} token ids, got {n}"),
            ));
        }
        s.stop_token_ids = token_ids(&ids, "stop_token_ids")?.into();
    }
    s.ignore_eos = f.bool("ignore_eos")?.unwrap_or(false);
    s.skip_special_tokens = f.bool("skip_special_tokens")?.unwrap_or(true);
    s.n = 1;
    if let Some(n) = f.int("n")? {
        if !(1..=MAX_N as i128).contains(&n) {
            return Err(ApiError::invalid_value("n", format!("must be in [1, {MAX_N}], got {n}")));
        }
        s.n = n as usize;
    }
    for field in ["frequency_penalty", "presence_penalty"] {
        if let Some(v) = f.f64(field)? {
            if !(-2.0..=2.0).contains(&v) {
                return Err(ApiError::invalid_value(field, format!("must be in [-2, 2], got {v}")));
            }
            if field == "frequency_penalty" {
                s.frequency_penalty = Some(v as f32);
            } else {
                s.presence_penalty = Some(v as f32);
            }
        }
    }
    if let Some(v) = f.f64("repetition_penalty")? {
        if !(v.is_finite() && v > 0.0) {
            return Err(ApiError::invalid_value("repetition_penalty", format!("must be > 0, got {v}")));
        }
        s.repetition_penalty = Some(v as f32);
    }
    let zero = |v: &Json| v.as_f64() == Some(0.0);
    f.neutral("min_tokens", zero, "min_tokens is not implemented")?;
    f.neutral("logit_bias", |v| v.as_object().is_some_and(Map::is_empty), "logit_bias is not implemented")?;
    f.neutral(
        "include_stop_str_in_output",
        |v| v == &Json::Bool(false),
        "stop strings are always cut from the output",
    )?;
    f.neutral("spaces_between_special_tokens", |v| v == &Json::Bool(true), "")?;
    Ok(s)
}

fn parse_stream(f: &mut Fields) -> Result<StreamOptions, ApiError> {
    let stream = f.bool("stream")?.unwrap_or(false);
    let mut include_usage = false;
    if let Some(opts) = f.object("stream_options")? {
        if !stream {
            return Err(ApiError::invalid_value("stream_options", "is only allowed when `stream` is true"));
        }
        let mut o = Fields::nested(opts, "stream_options");
        include_usage = o.bool("include_usage")?.unwrap_or(false);
        o.neutral("continuous_usage_stats", |v| v == &Json::Bool(false), "usage is reported once, at the end")?;
        o.finish(&[], &[])?;
    }
    Ok(StreamOptions { stream, include_usage })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: &str) -> Result<ChatRequest, ApiError> {
        parse_chat(body.as_bytes())
    }

    #[test]
    fn chat_minimal_and_full() {
        let r = chat(r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#).unwrap();
        assert!(r.render.add_generation_prompt);
        assert_eq!(r.sampling.max_tokens, None);
        assert!(!r.stream.stream);
        let r = chat(
            r#"{"messages":[{"role":"system","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
                {"role":"user","content":"hi","name":"bob"}],
              "temperature":0,"top_p":0.5,"top_k":-1,"min_p":0.1,"seed":-3,"max_tokens":5,
              "max_completion_tokens":7,"stop":["x","y"],"n":1,"stream":true,
              "stream_options":{"include_usage":true},"user":"u","frequency_penalty":0,
              "chat_template_kwargs":{"enable_thinking":false}}"#,
        )
        .unwrap();
        assert_eq!(r.messages[0]["content"], "a\nb");
        assert_eq!(r.messages[1]["name"], "bob");
        assert_eq!(r.sampling.max_tokens, Some((7, "max_completion_tokens")));
        assert_eq!(r.sampling.top_k, Some(None));
        assert_eq!(r.sampling.stop, ["x", "y"]);
        assert!(r.stream.include_usage);
        assert_eq!(r.render.chat_template_kwargs["enable_thinking"], false);
    }

    #[test]
    fn chat_rejections_name_the_field() {
        let param = |body: &str| chat(body).unwrap_err().param().map(str::to_owned);
        let m = r#""messages":[{"role":"user","content":"hi"}]"#;
        assert_eq!(param(&format!("{{{m},\"temperature\":-1}}")).as_deref(), Some("temperature"));
        assert_eq!(param(&format!("{{{m},\"top_p\":0}}")).as_deref(), Some("top_p"));
        assert_eq!(param(&format!("{{{m},\"max_tokens\":0}}")).as_deref(), Some("max_tokens"));
        assert_eq!(param(&format!("{{{m},\"n\":0}}")).as_deref(), Some("n"));
        assert_eq!(param(&format!("{{{m},\"logprobs\":1}}")).as_deref(), Some("logprobs"));
        assert_eq!(param(&format!("{{{m},\"top_logprobs\":1}}")).as_deref(), Some("top_logprobs"));
        assert_eq!(param(&format!("{{{m},\"prompt_logprobs\":1}}")).as_deref(), Some("prompt_logprobs"));
        assert_eq!(param(&format!("{{{m},\"bogus\":1}}")).as_deref(), Some("bogus"));
        assert_eq!(param(&format!("{{{m},\"temperature\":\"hot\"}}")).as_deref(), Some("temperature"));
        assert_eq!(
            param(&format!("{{{m},\"stream_options\":{{\"include_usage\":true}}}}")).as_deref(),
            Some("stream_options")
        );
        assert_eq!(param(r#"{"messages":[]}"#).as_deref(), Some("messages"));
        assert_eq!(param(r#"{"messages":[{"role":"user"}]}"#).as_deref(), Some("messages.0.content"));
        assert_eq!(param(r#"{"messages":[{"role":"wizard","content":"hi"}]}"#).as_deref(), Some("messages.0.role"));
        assert_eq!(
            param(r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]}"#).as_deref(),
            Some("messages.0.content.0.type")
        );
        assert_eq!(param(r#"{}"#).as_deref(), Some("messages"));
    }

    #[test]
    fn completion_prompts() {
        let p = |body: &str| parse_completion(body.as_bytes()).map(|r| r.prompts);
        assert_eq!(p(r#"{"prompt":"x"}"#).unwrap(), [Prompt::Text("x".into())]);
        assert_eq!(p(r#"{"prompt":[1,2]}"#).unwrap(), [Prompt::Ids(vec![1, 2])]);
        assert_eq!(p(r#"{"prompt":["x"]}"#).unwrap(), [Prompt::Text("x".into())]);
        assert_eq!(p(r#"{"prompt":[[3]]}"#).unwrap(), [Prompt::Ids(vec![3])]);
        assert_eq!(p(r#"{"prompt":["x",[4,5]]}"#).unwrap(), [Prompt::Text("x".into()), Prompt::Ids(vec![4, 5])]);
        assert!(p(r#"{"prompt":[]}"#).is_err());
        assert!(p(r#"{"prompt":[-1]}"#).is_err());
        assert!(p(r#"{"prompt":"x","max_completion_tokens":3}"#).is_err());
    }

    #[test]
    fn generation_config_defaults() {
        let mut d = SamplingDefaults::openai();
        let taken = d.apply_generation_config(
            &serde_json::json!({"temperature": 0.6, "top_k": 20, "do_sample": true, "repetition_penalty": 1.05}),
        );
        assert_eq!(taken, ["temperature", "top_k"]);
        assert_eq!(d.top_k, Some(20));
        let s = Sampling::default().to_params(&d, 9);
        assert_eq!((s.temperature, s.max_tokens), (0.6, 9));
        // The model's repetition penalty is not a default (see SamplingDefaults);
        // a request's own is applied.
        assert!(s.penalties.is_neutral());
        let own = Sampling { repetition_penalty: Some(1.05), ..Sampling::default() };
        assert_eq!(own.to_params(&d, 9).penalties.repetition, 1.05);
    }
}
