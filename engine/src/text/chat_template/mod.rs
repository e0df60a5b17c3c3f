//! Chat templates: HuggingFace-style Jinja templates that turn a list of chat
//! messages into the prompt text a model was trained on.
//!
//! Templates on the Hub are written for jinja2 and rendered by transformers'
//! `render_jinja_template`, so "correct" means "the same text transformers
//! produces". We compile them once with minijinja, configured the way
//! transformers configures jinja2 (`trim_blocks`, `lstrip_blocks`, loop
//! controls, lenient undefined values, its `tojson`, `raise_exception` and
//! `strftime_now`), plus the Python behaviour templates lean on (string
//! methods, `str()` of `None`/`True`/lists/dicts): see `python.rs`. Two
//! constructs are rewritten in the source before compiling (see `rewrite.rs`):
//! transformers' `{% generation %}` tag and slices, which minijinja gets
//! wrong (and can panic on) with negative steps. The conformance test
//! `engine/tests/chat_templates.rs` renders 49 real templates against
//! transformers' output.
//!
//! `hf.rs` finds the template and the special tokens in a model folder.
//!
//! Known difference: jinja2's `Markup` (what `|safe` returns) HTML-escapes a
//! plain string added to it with `+`; minijinja concatenates unescaped. Of the
//! 49 templates only meetkai's functionary-v3.1 does this, when tools are
//! given.

mod error;
mod hf;
mod python;
mod rewrite;

use chrono::NaiveDateTime;
use minijinja::{Environment, Error, ErrorKind, UndefinedBehavior, Value};
use serde_json::{Map, Value as Json};

pub use error::ChatTemplateError;
pub use hf::{load_chat_template, ModelChatConfig, SpecialTokens};

/// The name the template is stored under in its private environment.
const TEMPLATE_NAME: &str = "chat_template";

/// The time `strftime_now` formats.
///
/// Production templates see the real local time (Llama 3.x prints today's
/// date into the system prompt); tests pin it to get reproducible text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clock {
    Local,
    Fixed(NaiveDateTime),
}

impl Clock {
    fn now(self) -> NaiveDateTime {
        match self {
            Clock::Local => chrono::Local::now().naive_local(),
            Clock::Fixed(t) => t,
        }
    }
}

/// Everything a template sees besides the messages.
#[derive(Clone, Debug)]
pub struct RenderOptions {
    /// Ends the prompt with the header of an assistant turn, so the model
    /// answers rather than continuing the last message.
    pub add_generation_prompt: bool,
    /// `bos_token`, `eos_token`, ... as template variables; absent ones stay
    /// undefined, as in transformers.
    pub special_tokens: SpecialTokens,
    /// Tool (function) JSON schemas, passed as `tools`. `None` passes
    /// Python's `None`, which (unlike minijinja's `none`) cannot be iterated,
    /// so tool-use templates fail without tools exactly as in transformers.
    pub tools: Option<Json>,
    /// Retrieval documents, passed as `documents` (`None` as for `tools`).
    pub documents: Option<Json>,
    /// Further template variables (`enable_thinking`, `date_string`, ...).
    /// The named fields above take precedence over keys here.
    pub extra: Map<String, Json>,
}

impl RenderOptions {
    /// Options with no tools, documents or extra variables.
    pub fn new(add_generation_prompt: bool, special_tokens: SpecialTokens) -> Self {
        Self { add_generation_prompt, special_tokens, tools: None, documents: None, extra: Map::new() }
    }
}

/// A compiled chat template, ready to render any number of conversations.
pub struct ChatTemplate {
    env: Environment<'static>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").finish_non_exhaustive()
    }
}

/// The error `raise_exception` carries, so that [`ChatTemplate::render`] can
/// tell a deliberate rejection from a template bug.
#[derive(Debug)]
struct RaisedException(String);

impl std::fmt::Display for RaisedException {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedException {}

impl ChatTemplate {
    /// Compiles `source`, with `strftime_now` reading the local clock.
    pub fn new(source: &str) -> Result<Self, ChatTemplateError> {
        Self::with_clock(source, Clock::Local)
    }

    /// Compiles `source`, with `strftime_now` reading `clock`.
    pub fn with_clock(source: &str, clock: Clock) -> Result<Self, ChatTemplateError> {
        let mut env = Environment::new();
        // The jinja2 configuration of transformers' `_compile_jinja_template`.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_undefined_behavior(UndefinedBehavior::Lenient);
        env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
        python::install(&mut env);

        env.add_function("raise_exception", |message: Option<Value>| -> Result<Value, Error> {
            let message = message.map(|m| python::python_str(&m)).unwrap_or_default();
            Err(Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(RaisedException(message)))
        });
        env.add_function("strftime_now", move |format: String| strftime(clock.now(), &format));

        let source = rewrite::rewrite_template(source);
        env.add_template_owned(TEMPLATE_NAME, source).map_err(|e| ChatTemplateError::Syntax(describe(&e)))?;
        Ok(Self { env })
    }

    /// Renders a conversation: `messages` are chat messages as JSON objects
    /// (`role`, `content` as a string or a list of parts, `tool_calls`, ...).
    ///
    /// Like transformers' `apply_chat_template`, keys whose value is `null`
    /// are dropped and the reasoning fields (`reasoning_content`, `thinking`,
    /// `reasoning`) are aliased to each other before rendering.
    pub fn render(&self, messages: &[Json], opts: &RenderOptions) -> Result<String, ChatTemplateError> {
        let messages = normalize_messages(messages)?;
        let mut ctx: Map<String, Json> = opts.extra.clone();
        for (name, token) in opts.special_tokens.iter() {
            ctx.insert(name.to_owned(), Json::String(token.to_owned()));
        }
        ctx.insert("messages".to_owned(), Json::Array(messages));
        ctx.insert("add_generation_prompt".to_owned(), Json::Bool(opts.add_generation_prompt));
        let mut vars: Vec<(String, Value)> = ctx
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), "tools" | "documents"))
            .map(|(k, v)| (k.clone(), python::json_to_value(v)))
            .collect();
        for (name, value) in [("tools", &opts.tools), ("documents", &opts.documents)] {
            let value = match value {
                Some(json) if !json.is_null() => python::json_to_value(json),
                _ => python::absent(),
            };
            vars.push((name.to_owned(), value));
        }

        let template = self.env.get_template(TEMPLATE_NAME).map_err(|e| ChatTemplateError::Render(describe(&e)))?;
        let ctx = Value::from_iter(vars);
        // NOTE: a safety net, not control flow. minijinja has had panics on
        // odd inputs (slicing an empty list backwards, which `rewrite.rs` now
        // avoids); a template bug must become an error for this request, not
        // take the server down.
        let rendered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| template.render(ctx)))
            .map_err(|_| ChatTemplateError::Render("template engine panicked".to_owned()))?;
        rendered.map_err(|e| match raised_message(&e) {
            Some(message) => ChatTemplateError::Raised(message),
            None => ChatTemplateError::Render(describe(&e)),
        })
    }
}

/// transformers' message clean-up: drop `null` fields (which templates would
/// print as `None`) and copy reasoning under every name templates read.
fn normalize_messages(messages: &[Json]) -> Result<Vec<Json>, ChatTemplateError> {
    const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];
    messages
        .iter()
        .enumerate()
        .map(|(idx, message)| {
            let Json::Object(fields) = message else {
                return Err(ChatTemplateError::InvalidMessages(format!("message {idx} must be a JSON object")));
            };
            let fields: Map<String, Json> =
                fields.iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k.clone(), v.clone())).collect();
            let reasoning = REASONING_FIELDS.iter().find_map(|name| fields.get(*name)).cloned();
            let Some(reasoning) = reasoning else {
                return Ok(Json::Object(fields));
            };
            // Python: `{"thinking": reasoning, **message, "reasoning_content": reasoning}`.
            let mut aliased = Map::new();
            aliased.insert("thinking".to_owned(), reasoning.clone());
            for (k, v) in fields {
                aliased.insert(k, v);
            }
            aliased.insert("reasoning_content".to_owned(), reasoning);
            Ok(Json::Object(aliased))
        })
        .collect()
}

/// `strftime_now(format)`: `time` formatted like Python's `strftime`.
///
/// An invalid format is an error rather than the panic chrono's `to_string`
/// would give.
fn strftime(time: NaiveDateTime, format: &str) -> Result<String, Error> {
    use chrono::format::{Item, StrftimeItems};
    use std::fmt::Write as _;
    let items: Vec<Item<'_>> = StrftimeItems::new(format).collect();
    if items.iter().any(|item| matches!(item, Item::Error)) {
        return Err(Error::new(ErrorKind::InvalidOperation, format!("invalid strftime format {format:?}")));
    }
    let mut out = String::new();
    write!(out, "{}", time.format_with_items(items.into_iter()))
        .map_err(|_| Error::new(ErrorKind::InvalidOperation, format!("cannot format time with {format:?}")))?;
    Ok(out)
}

/// The message `raise_exception` was called with, if that is what failed.
fn raised_message(err: &Error) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(err);
    while let Some(e) = source {
        if let Some(raised) = e.downcast_ref::<RaisedException>() {
            return Some(raised.0.clone());
        }
        source = e.source();
    }
    None
}

/// A one-line description of a minijinja error with its template line.
fn describe(err: &Error) -> String {
    let mut msg = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(e) = source {
        msg.push_str(": ");
        msg.push_str(&e.to_string());
        source = e.source();
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(src: &str, messages: Json) -> Result<String, ChatTemplateError> {
        let tmpl = ChatTemplate::new(src)?;
        let messages = messages.as_array().cloned().unwrap_or_default();
        tmpl.render(&messages, &RenderOptions::new(true, SpecialTokens::default()))
    }

    #[test]
    fn template_is_shareable_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<ChatTemplate>();
    }

    #[test]
    fn python_printing_and_methods() {
        let out = render(
            "{{ none }}|{{ true }}|{{ [1, 'a'] }}|{{ ' x '.strip() }}|{{ 'a b'.split() }}|{{ {'k': 1.0} }}",
            json!([]),
        )
        .unwrap();
        assert_eq!(out, "None|True|[1, 'a']|x|['a', 'b']|{'k': 1.0}");
    }

    #[test]
    fn tojson_matches_json_dumps() {
        let out = render(
            "{{ messages[0] | tojson }}|{{ messages[0] | tojson(indent=2) }}|{{ 'é<' | tojson }}",
            json!([{"role": "user", "content": "hi", "n": [1, 2.5]}]),
        )
        .unwrap();
        assert_eq!(
            out,
            "{\"role\": \"user\", \"content\": \"hi\", \"n\": [1, 2.5]}|{\n  \"role\": \"user\",\n  \"content\": \"hi\",\n  \"n\": [\n    1,\n    2.5\n  ]\n}|\"é<\""
        );
    }

    #[test]
    fn raise_exception_is_typed() {
        let err = render("{{ raise_exception('no system role') }}", json!([])).unwrap_err();
        assert!(matches!(err, ChatTemplateError::Raised(ref m) if m == "no system role"), "{err}");
    }

    #[test]
    fn syntax_errors_do_not_panic() {
        for src in ["{% if %}", "{{ ", "{% for x in %}{% endfor %}", "{% endgeneration %}"] {
            assert!(ChatTemplate::new(src).is_err(), "{src}");
        }
    }

    #[test]
    fn non_object_message_is_rejected() {
        let err = render("{{ messages }}", json!(["hi"])).unwrap_err();
        assert!(matches!(err, ChatTemplateError::InvalidMessages(_)));
    }

    #[test]
    fn undefined_is_lenient_like_jinja2() {
        let out = render(
            "[{{ missing }}][{{ messages[0].nope }}][{% if messages[0].nope %}x{% endif %}]",
            json!([{"role": "user"}]),
        )
        .unwrap();
        assert_eq!(out, "[][][]");
        assert!(render("{{ missing.attr }}", json!([])).is_err());
    }

    #[test]
    fn generation_tags_render_their_body() {
        let src = "{% for m in messages %}{%- generation -%}\n[{{ m.content }}]\n{%- endgeneration -%}{% endfor %}";
        assert_eq!(render(src, json!([{"content": "a"}, {"content": "b"}])).unwrap(), "[a][b]");
    }

    #[test]
    fn strftime_uses_the_clock() {
        let t = chrono::NaiveDate::from_ymd_opt(2026, 1, 15).and_then(|d| d.and_hms_opt(12, 0, 0)).unwrap();
        let tmpl = ChatTemplate::with_clock("{{ strftime_now('%d %B %Y') }}", Clock::Fixed(t)).unwrap();
        let out = tmpl.render(&[], &RenderOptions::new(false, SpecialTokens::default())).unwrap();
        assert_eq!(out, "15 January 2026");
        assert!(ChatTemplate::new("{{ strftime_now('%Q') }}")
            .unwrap()
            .render(&[], &RenderOptions::new(false, SpecialTokens::default()))
            .is_err());
    }

    #[test]
    fn null_fields_are_dropped_and_reasoning_aliased() {
        let out = render(
            "{{ messages[0].content is defined }}|{{ messages[0].reasoning_content }}|{{ messages[0].thinking }}",
            json!([{"role": "assistant", "content": null, "reasoning": "hmm"}]),
        )
        .unwrap();
        assert_eq!(out, "False|hmm|hmm");
    }

    #[test]
    fn absent_tools_behave_like_python_none() {
        let src = "{{ tools }}|{{ tools is none }}|{{ tools == none }}|{{ tools != None }}|{{ tools | tojson }}|{{ not tools }}|{{ tools | selectattr('x') | list | length }}";
        assert_eq!(render(src, json!([])).unwrap(), "None|True|True|False|null|True|0");
        assert!(render("{% for t in tools %}{% endfor %}", json!([])).is_err());
        let nested = render("{{ messages[0].content[0].text == none }}", json!([{"content": [{"text": null}]}]));
        assert_eq!(nested.unwrap(), "True");
        let tmpl = ChatTemplate::new("{% for t in tools %}{{ t.name }}{% endfor %}").unwrap();
        let mut opts = RenderOptions::new(false, SpecialTokens::default());
        opts.tools = Some(json!([{"name": "a"}, {"name": "b"}]));
        assert_eq!(tmpl.render(&[], &opts).unwrap(), "ab");
    }

    #[test]
    fn namespace_rejects_underscore_names() {
        assert!(render("{% set ns = namespace(_x=1) %}", json!([])).is_err());
        assert_eq!(render("{% set ns = namespace(x=1) %}{% set ns.x = 2 %}{{ ns.x }}", json!([])).unwrap(), "2");
    }
}
