//! Structured outputs: `response_format` and the grammars that enforce it.
//!
//! A request's [`ResponseFormat`] (or its tool choice, see `tools`) becomes a
//! [`GrammarSpec`]; the [`GrammarCompiler`] (one per server, built from the
//! model's tokenizer at start) compiles it with `llguidance` into one
//! [`Grammar`] per choice, which the engine applies as a token mask at every
//! step. A schema the library rejects is a 400 naming the problem; compiling
//! runs on the blocking pool with the rest of the request's preparation.
//!
//! vLLM's `guided_json`, `guided_regex`, `guided_choice` and `guided_grammar`
//! (a lark grammar, llguidance's dialect) are accepted too, one at most, in
//! place of `response_format`.
//!
//! JSON is generated compactly (`", "` and `": "` separators, no free
//! whitespace) unless the schema sets llguidance's own `x-guidance` options:
//! free whitespace would let a weak model pad forever instead of closing the
//! object.

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Map, Value as Json};

use super::error::ApiError;
use super::fields::Fields;
use crate::core::grammar::Grammar;
use crate::text::token_env::token_env;
use crate::text::tokenizer::Tokenizer;

/// The largest schema (or grammar) a request may send, in bytes of JSON.
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;

/// `response_format`.
#[derive(Clone, Debug, PartialEq)]
pub enum ResponseFormat {
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON valid against `schema`.
    JsonSchema {
        schema: Json,
    },
    /// One of vLLM's `guided_*` fields (`field`).
    Guided {
        spec: GrammarSpec,
        field: &'static str,
    },
}

impl ResponseFormat {
    /// The grammar the format needs (`None` for text).
    pub fn grammar(&self) -> Option<GrammarSpec> {
        match self {
            Self::Text => None,
            Self::JsonObject => Some(GrammarSpec::JsonSchema(json!({"type": "object"}))),
            Self::JsonSchema { schema } => Some(GrammarSpec::JsonSchema(schema.clone())),
            Self::Guided { spec, .. } => Some(spec.clone()),
        }
    }

    /// The request field it came from, for errors.
    pub fn param(&self) -> &'static str {
        match self {
            Self::Guided { field, .. } => field,
            _ => "response_format",
        }
    }
}

/// `response_format`, or one of vLLM's `guided_*` fields instead.
pub fn parse_output_format(f: &mut Fields) -> Result<Option<ResponseFormat>, ApiError> {
    let mut found = f.take("response_format").map(parse_response_format).transpose()?;
    for field in ["guided_json", "guided_regex", "guided_choice", "guided_grammar"] {
        let Some(v) = f.take(field) else {
            continue;
        };
        if let Some(other) = &found {
            return Err(ApiError::invalid_value(field, format!("cannot be combined with `{}`", other.param())));
        }
        let spec = match (field, v) {
            ("guided_json", Json::String(text)) => {
                let schema = serde_json::from_str(&text)
                    .map_err(|e| ApiError::invalid_value(field, format!("is not JSON: {e}")))?;
                GrammarSpec::JsonSchema(schema)
            }
            ("guided_json", schema @ Json::Object(_)) => GrammarSpec::JsonSchema(schema),
            ("guided_regex", Json::String(rx)) => GrammarSpec::Regex(rx),
            ("guided_grammar", Json::String(lark)) => GrammarSpec::Lark(lark),
            ("guided_choice", Json::Array(items)) if !items.is_empty() => {
                // Lark string literals take JSON's escapes.
                let choices = items
                    .iter()
                    .map(|c| c.as_str().map(|s| Json::String(s.to_owned()).to_string()))
                    .collect::<Option<Vec<String>>>()
                    .ok_or_else(|| ApiError::invalid_type(field, "a non-empty array of strings"))?;
                GrammarSpec::Lark(format!("start: {}", choices.join(" | ")))
            }
            ("guided_choice", _) => return Err(ApiError::invalid_type(field, "a non-empty array of strings")),
            ("guided_json", _) => return Err(ApiError::invalid_type(field, "a JSON schema (object or text)")),
            _ => return Err(ApiError::invalid_type(field, "a string")),
        };
        let size = match &spec {
            GrammarSpec::JsonSchema(schema) => schema.to_string().len(),
            GrammarSpec::Regex(text) | GrammarSpec::Lark(text) => text.len(),
        };
        if size > MAX_SCHEMA_BYTES {
            return Err(ApiError::invalid_value(field, format!("is {size} bytes; at most {MAX_SCHEMA_BYTES}")));
        }
        found = Some(ResponseFormat::Guided { spec, field });
    }
    Ok(found)
}

/// Parses `response_format`: `{"type": "text" | "json_object"}` or
/// `{"type": "json_schema", "json_schema": {"name", "schema", "strict",
/// "description"}}`.
pub fn parse_response_format(v: Json) -> Result<ResponseFormat, ApiError> {
    const PARAM: &str = "response_format";
    let Json::Object(obj) = v else {
        return Err(ApiError::invalid_type(PARAM, "an object"));
    };
    let mut f = Fields::nested(obj, PARAM);
    let kind = f.string("type")?.ok_or_else(|| ApiError::Missing { param: format!("{PARAM}.type") })?;
    let format = match kind.as_str() {
        "text" => ResponseFormat::Text,
        "json_object" => ResponseFormat::JsonObject,
        "json_schema" => {
            let spec =
                f.object("json_schema")?.ok_or_else(|| ApiError::Missing { param: format!("{PARAM}.json_schema") })?;
            let mut s = Fields::nested(spec, "response_format.json_schema");
            let _name = s.string("name")?;
            let _description = s.string("description")?;
            // Output follows the schema either way (as in vLLM).
            let _strict = s.bool("strict")?;
            let schema = match s.take("schema") {
                Some(schema @ (Json::Object(_) | Json::Bool(true))) => schema,
                None => json!({}),
                Some(_) => return Err(ApiError::invalid_type("response_format.json_schema.schema", "an object")),
            };
            s.finish(&[], &[])?;
            check_schema_size("response_format.json_schema.schema", &schema)?;
            ResponseFormat::JsonSchema { schema }
        }
        other => {
            return Err(ApiError::invalid_value(
                format!("{PARAM}.type"),
                format!("unknown type `{other}`; expected text, json_object or json_schema"),
            ))
        }
    };
    f.finish(&[], &[])?;
    Ok(format)
}

/// Refuses a schema larger than [`MAX_SCHEMA_BYTES`].
pub fn check_schema_size(param: &str, schema: &Json) -> Result<(), ApiError> {
    let bytes = schema.to_string().len();
    if bytes > MAX_SCHEMA_BYTES {
        return Err(ApiError::invalid_value(param, format!("is {bytes} bytes of JSON; at most {MAX_SCHEMA_BYTES}")));
    }
    Ok(())
}

/// What a request's output must follow.
#[derive(Clone, Debug, PartialEq)]
pub enum GrammarSpec {
    JsonSchema(Json),
    /// A regular expression the whole output matches.
    Regex(String),
    /// A lark grammar (llguidance's dialect).
    Lark(String),
}

impl GrammarSpec {
    fn top_level(&self) -> TopLevelGrammar {
        match self {
            Self::JsonSchema(schema) => TopLevelGrammar::from_json_schema(compact_json(schema.clone())),
            Self::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Self::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
        }
    }
}

/// `schema` with llguidance's compact-JSON options, unless it sets its own.
fn compact_json(mut schema: Json) -> Json {
    let options = json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "});
    match &mut schema {
        Json::Object(obj) => {
            obj.entry("x-guidance").or_insert(options);
            schema
        }
        // `true` (anything): an empty schema with the options.
        _ => {
            let mut obj = Map::new();
            obj.insert("x-guidance".into(), options);
            Json::Object(obj)
        }
    }
}

/// Compiles grammars for the served model's tokenizer.
pub struct GrammarCompiler {
    /// `Err`: why this model has no structured outputs.
    factory: Result<ParserFactory, String>,
}

impl GrammarCompiler {
    /// Builds the tokenizer's token trie for a vocabulary of `vocab_size`
    /// (the model's logits width). A tokenizer llguidance cannot read leaves
    /// the server without structured outputs (requests for them get a 400).
    pub fn new(tokenizer: &Tokenizer, vocab_size: usize) -> Self {
        let factory = token_env(tokenizer, vocab_size).map_err(|e| e.to_string()).and_then(|env| {
            let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
            // Library messages go into errors, not to stderr.
            factory.quiet();
            *factory.limits_mut() = ParserLimits::default();
            Ok(factory)
        });
        if let Err(e) = &factory {
            tracing::warn!("structured outputs are unavailable for this model: {e}");
        }
        Self { factory }
    }

    /// One grammar per choice (`count`), or a 400 naming `param` when the
    /// library rejects the spec.
    pub fn compile(&self, spec: &GrammarSpec, param: &str, count: usize) -> Result<Vec<Grammar>, ApiError> {
        let factory = self.factory.as_ref().map_err(|why| {
            ApiError::unsupported(param, format!("structured outputs are not available for this model: {why}"))
        })?;
        let parser = factory
            .create_parser(spec.top_level())
            .map_err(|e| ApiError::invalid_value(param, format!("is not a grammar the server can enforce: {e}")))?;
        let first = Matcher::new(Ok(parser));
        if let Some(e) = first.get_error() {
            return Err(ApiError::invalid_value(param, format!("is not a grammar the server can enforce: {e}")));
        }
        let mut grammars = Vec::with_capacity(count);
        for _ in 1..count {
            grammars.push(Grammar::new(first.deep_clone()));
        }
        grammars.push(Grammar::new(first));
        Ok(grammars)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn fixture_compiler() -> GrammarCompiler {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/qwen3-tiny");
        let tokenizer = Tokenizer::from_dir(&dir).unwrap();
        GrammarCompiler::new(&tokenizer, tokenizer.vocab_size())
    }

    #[test]
    fn response_formats_parse_and_refuse_with_the_field() {
        let p = |v: Json| parse_response_format(v);
        assert_eq!(p(json!({"type": "text"})).unwrap(), ResponseFormat::Text);
        assert_eq!(p(json!({"type": "json_object"})).unwrap(), ResponseFormat::JsonObject);
        let s = p(
            json!({"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": {"type": "integer"}}}),
        );
        assert_eq!(s.unwrap(), ResponseFormat::JsonSchema { schema: json!({"type": "integer"}) });
        let param = |v: Json| p(v).unwrap_err().param().map(str::to_owned);
        assert_eq!(param(json!({"type": "xml"})).as_deref(), Some("response_format.type"));
        assert_eq!(param(json!({"type": "json_schema"})).as_deref(), Some("response_format.json_schema"));
        let big = json!({"type": "json_schema", "json_schema": {"schema": {"enum": vec!["x".repeat(100); 1000]}}});
        assert_eq!(param(big).as_deref(), Some("response_format.json_schema.schema"));
    }

    #[test]
    fn guided_fields_of_vllm() {
        let parse = |v: Json| {
            let Json::Object(obj) = v else { unreachable!() };
            parse_output_format(&mut Fields::nested(obj, "x"))
        };
        let g = parse(json!({"guided_choice": ["yes", "no \"way\""]})).unwrap().unwrap();
        assert_eq!(g.param(), "guided_choice");
        assert_eq!(g.grammar(), Some(GrammarSpec::Lark(r#"start: "yes" | "no \"way\"""#.into())));
        let c = fixture_compiler();
        assert!(c.compile(&g.grammar().unwrap(), "guided_choice", 1).is_ok());
        let g = parse(json!({"guided_json": "{\"type\": \"integer\"}"})).unwrap().unwrap();
        assert_eq!(g.grammar(), Some(GrammarSpec::JsonSchema(json!({"type": "integer"}))));
        assert!(c.compile(&GrammarSpec::Regex("[0-9]{3}".into()), "guided_regex", 1).is_ok());
        let err = parse(json!({"response_format": {"type": "json_object"}, "guided_regex": "a"})).unwrap_err();
        assert_eq!(err.param(), Some("guided_regex"));
        assert_eq!(parse(json!({"guided_choice": []})).unwrap_err().param(), Some("guided_choice"));
    }

    #[test]
    fn rejected_schemas_name_the_problem() {
        let c = fixture_compiler();
        let err = c
            .compile(
                &GrammarSpec::JsonSchema(json!({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}})),
                "rf",
                1,
            )
            .unwrap_err();
        assert_eq!(err.param(), Some("rf"));
        assert!(c.compile(&GrammarSpec::JsonSchema(json!({"type": "integer"})), "rf", 3).unwrap().len() == 3);
    }
}
