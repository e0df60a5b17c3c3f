//! Tool calls in a model's output text, in the syntaxes of the supported
//! families (vLLM's tool parsers), parsed as the text streams.
//!
//! | format | families | syntax |
//! | --- | --- | --- |
//! | `hermes` | Qwen2.5, Qwen3, Hermes | `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number, text around them |
//! | `llama3_json` | Llama 3.1 / 3.2 / 3.3 | the whole output is `{"name": ..., "parameters": {...}}` (`;`-separated for several, an optional `<\|python_tag\|>` first) |
//! | `mistral` | Mistral | `[TOOL_CALLS]` then a JSON array of `{"name", "arguments"}`, or `name[ARGS]{...}` (newer tokenizers) |
//!
//! [`ToolCallStream`] turns text pieces into [`ToolPiece`]s: text outside
//! calls as it comes (holding back what may be the start of a marker), each
//! call once it is complete. A call that does not parse is given back as
//! text, as vLLM does, so no output is lost.

use std::str::FromStr;

use serde_json::Value as Json;

use crate::text::marker::partial_marker_len;

/// The most tool calls one output is parsed into; the rest stays text.
pub const MAX_TOOL_CALLS: usize = 64;

/// The tool-call syntaxes (`--tool-call-parser`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolCallFormat {
    Hermes,
    Llama3Json,
    Mistral,
}

impl ToolCallFormat {
    pub const NAMES: &'static [&'static str] = &["hermes", "qwen25", "qwen3", "llama3_json", "mistral"];

    /// The syntax a chat template (or, without one, an architecture) implies.
    pub fn detect(template: Option<&str>, architecture: &str) -> Option<Self> {
        if let Some(t) = template {
            if t.contains("<tool_call>") {
                return Some(Self::Hermes);
            }
            if t.contains("[TOOL_CALLS]") {
                return Some(Self::Mistral);
            }
            if t.contains("<|python_tag|>") || (t.contains("<|eot_id|>") && t.contains("parameters")) {
                return Some(Self::Llama3Json);
            }
        }
        match architecture {
            "Qwen2ForCausalLM" | "Qwen3ForCausalLM" | "Qwen3MoeForCausalLM" => Some(Self::Hermes),
            "MistralForCausalLM" => Some(Self::Mistral),
            "LlamaForCausalLM" => Some(Self::Llama3Json),
            _ => None,
        }
    }

    /// Whether the syntax's marker is a special token, which decoding must
    /// keep (the request then decodes with `skip_special_tokens: false`).
    pub fn needs_special_tokens(self) -> bool {
        self == Self::Mistral
    }
}

impl FromStr for ToolCallFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "hermes" | "qwen25" | "qwen3" => Ok(Self::Hermes),
            "llama3_json" | "llama3" => Ok(Self::Llama3Json),
            "mistral" => Ok(Self::Mistral),
            _ => Err(format!("unknown tool-call parser `{s}`; expected one of {}", Self::NAMES.join(", "))),
        }
    }
}

/// One parsed call: the function's name and its arguments as JSON text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedToolCall {
    pub name: String,
    pub arguments: String,
}

/// A piece of output: text, or a complete call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolPiece {
    Text(String),
    Call(ParsedToolCall),
}

const HERMES_START: &str = "<tool_call>";
const HERMES_END: &str = "</tool_call>";
const MISTRAL_START: &str = "[TOOL_CALLS]";
const MISTRAL_ARGS: &str = "[ARGS]";
const PYTHON_TAG: &str = "<|python_tag|>";
/// End-of-sequence texts that appear when special tokens are kept.
const EOS_TEXTS: &[&str] = &["</s>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Llama 3 only: nothing but whitespace yet (is the output a call?).
    Start,
    Text,
    /// Inside a call: collecting until its end (Hermes) or the output's end.
    Call,
}

/// Parses one choice's output, piece by piece.
#[derive(Clone, Debug)]
pub struct ToolCallStream {
    format: ToolCallFormat,
    state: State,
    pending: String,
    num_calls: usize,
}

impl ToolCallStream {
    pub fn new(format: ToolCallFormat) -> Self {
        let state = if format == ToolCallFormat::Llama3Json { State::Start } else { State::Text };
        Self { format, state, pending: String::new(), num_calls: 0 }
    }

    /// The pieces `text` completes.
    pub fn push(&mut self, text: &str) -> Vec<ToolPiece> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Start => {
                    let trimmed = self.pending.trim_start();
                    if trimmed.starts_with('{') || trimmed.starts_with(PYTHON_TAG) {
                        self.state = State::Call;
                    } else if trimmed.is_empty() || PYTHON_TAG.starts_with(trimmed) {
                        return out;
                    } else {
                        self.state = State::Text;
                    }
                }
                State::Text => {
                    let start = self.start_marker();
                    match self.pending.find(start).filter(|_| self.num_calls < MAX_TOOL_CALLS) {
                        Some(at) => {
                            let text: String = self.pending.drain(..at).collect();
                            push_text(&mut out, strip_eos(&text));
                            self.state = State::Call;
                        }
                        None => {
                            let keep = partial_marker_len(&self.pending, &[start, EOS_TEXTS[0], EOS_TEXTS[1]]);
                            let text: String = self.pending.drain(..self.pending.len() - keep).collect();
                            push_text(&mut out, strip_eos(&text));
                            return out;
                        }
                    }
                }
                State::Call => {
                    // Only Hermes calls end before the output does.
                    if self.format != ToolCallFormat::Hermes {
                        return out;
                    }
                    let Some(end) = self.pending.find(HERMES_END) else {
                        return out;
                    };
                    let call: String = self.pending.drain(..end + HERMES_END.len()).collect();
                    self.emit_calls(&mut out, &call);
                    self.state = State::Text;
                }
            }
        }
    }

    /// The rest, at the end of the output.
    pub fn finish(&mut self) -> Vec<ToolPiece> {
        let rest = std::mem::take(&mut self.pending);
        let mut out = Vec::new();
        match self.state {
            State::Call => self.emit_calls(&mut out, strip_eos(&rest)),
            State::Start | State::Text => push_text(&mut out, strip_eos(&rest)),
        }
        out
    }

    fn start_marker(&self) -> &'static str {
        match self.format {
            ToolCallFormat::Hermes => HERMES_START,
            ToolCallFormat::Mistral => MISTRAL_START,
            // Llama 3 calls are the whole output (decided in `Start`); a
            // python tag later in the text starts one too.
            ToolCallFormat::Llama3Json => PYTHON_TAG,
        }
    }

    /// Parses `raw` (one Hermes call with its tags, or everything after a
    /// Mistral / Llama marker) into calls, or gives it back as text.
    fn emit_calls(&mut self, out: &mut Vec<ToolPiece>, raw: &str) {
        let calls = match self.format {
            ToolCallFormat::Hermes => parse_hermes(raw),
            ToolCallFormat::Llama3Json => parse_llama3(raw),
            ToolCallFormat::Mistral => parse_mistral(raw),
        };
        match calls {
            Some(calls) if !calls.is_empty() && self.num_calls + calls.len() <= MAX_TOOL_CALLS => {
                self.num_calls += calls.len();
                out.extend(calls.into_iter().map(ToolPiece::Call));
            }
            _ => push_text(out, raw),
        }
    }
}

fn push_text(out: &mut Vec<ToolPiece>, text: &str) {
    if text.is_empty() {
        return;
    }
    if let Some(ToolPiece::Text(last)) = out.last_mut() {
        last.push_str(text);
    } else {
        out.push(ToolPiece::Text(text.to_owned()));
    }
}

/// `text` without end-of-sequence texts (present when special tokens are kept).
fn strip_eos(text: &str) -> &str {
    let mut text = text;
    for eos in EOS_TEXTS {
        if let Some(stripped) = text.strip_suffix(eos) {
            text = stripped;
        }
    }
    text
}

/// A call object: `{"name": ..., "arguments" | "parameters": {...} | "..."}`.
fn call_from_json(v: &Json) -> Option<ParsedToolCall> {
    let obj = v.as_object()?;
    let name = obj.get("name")?.as_str()?.to_owned();
    let arguments = match obj.get("arguments").or_else(|| obj.get("parameters")) {
        None | Some(Json::Null) => "{}".to_owned(),
        // Some models write the arguments as a JSON string already.
        Some(Json::String(s)) => s.clone(),
        Some(args) => args.to_string(),
    };
    Some(ParsedToolCall { name, arguments })
}

fn parse_hermes(raw: &str) -> Option<Vec<ParsedToolCall>> {
    let inner = raw.strip_prefix(HERMES_START)?;
    let inner = inner.strip_suffix(HERMES_END).unwrap_or(inner);
    let v: Json = serde_json::from_str(inner.trim()).ok()?;
    Some(vec![call_from_json(&v)?])
}

/// Consecutive JSON values of `text`, separated by whitespace or `;`.
fn json_values(text: &str) -> Option<Vec<Json>> {
    let mut values = Vec::new();
    let mut rest = text.trim_start();
    while !rest.is_empty() {
        let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Json>();
        let v = stream.next()?.ok()?;
        rest = rest[stream.byte_offset()..].trim_start();
        rest = rest.strip_prefix(';').unwrap_or(rest).trim_start();
        values.push(v);
        if values.len() > MAX_TOOL_CALLS {
            return None;
        }
    }
    Some(values)
}

fn parse_llama3(raw: &str) -> Option<Vec<ParsedToolCall>> {
    let text = raw.trim_start();
    let text = text.strip_prefix(PYTHON_TAG).unwrap_or(text);
    json_values(text)?.iter().map(call_from_json).collect()
}

fn parse_mistral(raw: &str) -> Option<Vec<ParsedToolCall>> {
    let body = raw.strip_prefix(MISTRAL_START)?.trim();
    if body.starts_with('[') {
        // `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`
        let v: Json = serde_json::from_str(body).ok()?;
        return v.as_array()?.iter().map(call_from_json).collect();
    }
    // `[TOOL_CALLS]name[ARGS]{...}[TOOL_CALLS]name2[ARGS]{...}`
    body.split(MISTRAL_START)
        .map(|call| {
            let (name, args) = call.split_once(MISTRAL_ARGS)?;
            let args: Json = serde_json::from_str(args.trim()).ok()?;
            let name = name.trim();
            (!name.is_empty()).then(|| ParsedToolCall { name: name.to_owned(), arguments: args.to_string() })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, arguments: &str) -> ToolPiece {
        ToolPiece::Call(ParsedToolCall { name: name.into(), arguments: arguments.into() })
    }

    /// Parses `output` fed in pieces of `step` bytes, text pieces merged.
    fn parse(format: ToolCallFormat, output: &str, step: usize) -> Vec<ToolPiece> {
        let mut s = ToolCallStream::new(format);
        let mut pieces = Vec::new();
        for piece in crate::text::marker::stream_pieces(output, step) {
            pieces.extend(s.push(piece));
        }
        pieces.extend(s.finish());
        let mut merged: Vec<ToolPiece> = Vec::new();
        for p in pieces {
            match (merged.last_mut(), p) {
                (Some(ToolPiece::Text(last)), ToolPiece::Text(t)) => last.push_str(&t),
                (_, p) => merged.push(p),
            }
        }
        merged
    }

    fn check(format: ToolCallFormat, output: &str, expected: &[ToolPiece]) {
        for step in [1, 3, 5, 1000] {
            assert_eq!(parse(format, output, step), expected, "{format:?}, pieces of {step}: {output}");
        }
    }

    /// Qwen2.5-7B-Instruct, recorded: two parallel calls after some text.
    #[test]
    fn hermes_calls_of_qwen() {
        let output = "Let me check both cities.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lyon\"}}\n</tool_call>";
        check(
            ToolCallFormat::Hermes,
            output,
            &[
                ToolPiece::Text("Let me check both cities.\n".into()),
                call("get_weather", r#"{"city":"Paris","unit":"celsius"}"#),
                ToolPiece::Text("\n".into()),
                call("get_weather", r#"{"city":"Lyon"}"#),
            ],
        );
        // No call at all: text through, even with a lone `<`.
        check(ToolCallFormat::Hermes, "a < b and <tool", &[ToolPiece::Text("a < b and <tool".into())]);
        // A broken call is given back as text.
        let broken = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\n</tool_call>";
        check(ToolCallFormat::Hermes, broken, &[ToolPiece::Text(broken.into())]);
    }

    /// Llama-3.1-8B-Instruct, recorded: a JSON call as the whole output.
    #[test]
    fn llama3_json_calls() {
        let output = "{\"name\": \"get_current_conditions\", \"parameters\": {\"location\": \"San Francisco, CA\", \"unit\": \"Fahrenheit\"}}";
        check(
            ToolCallFormat::Llama3Json,
            output,
            &[call("get_current_conditions", r#"{"location":"San Francisco, CA","unit":"Fahrenheit"}"#)],
        );
        let two = "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"x\": 1}}<|eot_id|>";
        check(ToolCallFormat::Llama3Json, two, &[call("a", "{}"), call("b", r#"{"x":1}"#)]);
        check(ToolCallFormat::Llama3Json, "The answer is {42}.", &[ToolPiece::Text("The answer is {42}.".into())]);
        check(ToolCallFormat::Llama3Json, "{not json", &[ToolPiece::Text("{not json".into())]);
    }

    /// Mistral-7B-Instruct-v0.3 (array) and Mistral-Small-3.2 (`[ARGS]`),
    /// recorded, decoded with special tokens kept.
    #[test]
    fn mistral_calls() {
        let v3 = "[TOOL_CALLS] [{\"name\": \"get_current_weather\", \"arguments\": {\"location\": \"Paris, France\", \"format\": \"celsius\"}}]</s>";
        check(
            ToolCallFormat::Mistral,
            v3,
            &[call("get_current_weather", r#"{"location":"Paris, France","format":"celsius"}"#)],
        );
        let v11 = "Sure.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Rome\"}[TOOL_CALLS]get_time[ARGS]{}</s>";
        check(
            ToolCallFormat::Mistral,
            v11,
            &[ToolPiece::Text("Sure.".into()), call("get_weather", r#"{"city":"Rome"}"#), call("get_time", "{}")],
        );
        check(ToolCallFormat::Mistral, "No tools needed.</s>", &[ToolPiece::Text("No tools needed.".into())]);
    }

    #[test]
    fn formats_by_name_and_by_model() {
        assert_eq!("qwen25".parse::<ToolCallFormat>(), Ok(ToolCallFormat::Hermes));
        assert!("xml".parse::<ToolCallFormat>().unwrap_err().contains("mistral"));
        assert_eq!(
            ToolCallFormat::detect(Some("{{ '<tool_call>' }}"), "LlamaForCausalLM"),
            Some(ToolCallFormat::Hermes)
        );
        assert_eq!(ToolCallFormat::detect(None, "MistralForCausalLM"), Some(ToolCallFormat::Mistral));
        assert_eq!(ToolCallFormat::detect(None, "GPT2"), None);
    }
}
