//! Tool calling: the `tools`, `tool_choice` and `parallel_tool_calls` fields,
//! and how each choice is enforced.
//!
//! | `tool_choice` | prompt | output |
//! | --- | --- | --- |
//! | `none` | tools not shown to the template | text |
//! | `auto` (default with tools) | tools in the template | the model's own syntax, parsed (`text::tool_calls`) |
//! | `required` | tools in the template | constrained to a JSON array of `{"name", "parameters"}` of the tools (one item without `parallel_tool_calls`) |
//! | `{"type": "function", "function": {"name"}}` | tools in the template | constrained to that function's parameters |
//!
//! The constrained forms do not depend on the model's syntax (vLLM does the
//! same), so they work on any model, and every call validates against its
//! tool's schema.

use serde_json::{json, Value as Json};

use super::error::ApiError;
use super::fields::Fields;
use super::structured::{check_schema_size, GrammarSpec};

/// The most tools one request may declare.
pub const MAX_TOOLS: usize = 128;

/// The most calls of `tool_choice: required` with parallel calls allowed.
pub const MAX_REQUIRED_CALLS: usize = 16;

/// One function tool.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    pub name: String,
    /// The JSON schema of its arguments (an object schema).
    pub parameters: Json,
}

/// `tool_choice`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    Function(String),
}

/// A request's tools, as parsed.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolRequest {
    pub tools: Vec<Tool>,
    /// `tools` as sent, for the chat template.
    pub tools_json: Json,
    pub choice: ToolChoice,
    pub parallel: bool,
}

impl ToolRequest {
    /// The tools to render into the prompt (none with `tool_choice: none`).
    pub fn template_tools(&self) -> Option<Json> {
        (self.choice != ToolChoice::None && !self.tools.is_empty()).then(|| self.tools_json.clone())
    }

    /// The grammar that enforces the choice, for the constrained forms.
    pub fn grammar(&self) -> Option<GrammarSpec> {
        match &self.choice {
            ToolChoice::None | ToolChoice::Auto => None,
            ToolChoice::Required => {
                let items: Vec<Json> = self
                    .tools
                    .iter()
                    .map(|t| {
                        json!({
                            "type": "object",
                            "properties": {"name": {"const": t.name}, "parameters": t.parameters},
                            "required": ["name", "parameters"],
                            "additionalProperties": false,
                        })
                    })
                    .collect();
                let max_items = if self.parallel { MAX_REQUIRED_CALLS } else { 1 };
                Some(GrammarSpec::JsonSchema(json!({
                    "type": "array",
                    "minItems": 1,
                    "maxItems": max_items,
                    "items": {"anyOf": items},
                })))
            }
            ToolChoice::Function(name) => {
                let tool = self.tools.iter().find(|t| &t.name == name)?;
                Some(GrammarSpec::JsonSchema(tool.parameters.clone()))
            }
        }
    }
}

/// Parses `tools`, `tool_choice` and `parallel_tool_calls` of a chat request
/// (`None`: no tools, and a tool choice of none or absent).
pub fn parse_tools(f: &mut Fields) -> Result<Option<ToolRequest>, ApiError> {
    let tools_json = f.take("tools");
    let choice = f.take("tool_choice");
    let parallel = f.bool("parallel_tool_calls")?.unwrap_or(true);
    let tools = match &tools_json {
        None => Vec::new(),
        Some(Json::Array(items)) if items.len() > MAX_TOOLS => {
            return Err(ApiError::invalid_value("tools", format!("at most {MAX_TOOLS} tools, got {}", items.len())))
        }
        Some(Json::Array(items)) => {
            items.iter().enumerate().map(|(i, t)| parse_tool(t, i)).collect::<Result<_, _>>()?
        }
        Some(_) => return Err(ApiError::invalid_type("tools", "an array of tool objects")),
    };
    if let Some((i, t)) = tools.iter().enumerate().find(|(i, t)| tools[..*i].iter().any(|u| u.name == t.name)) {
        return Err(ApiError::invalid_value(
            format!("tools.{i}.function.name"),
            format!("`{}` is declared twice", t.name),
        ));
    }
    let choice = match choice {
        None if tools.is_empty() => ToolChoice::None,
        None => ToolChoice::Auto,
        Some(Json::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::invalid_value(
                    "tool_choice",
                    format!("unknown choice `{other}`; expected none, auto, required or a function object"),
                ))
            }
        },
        Some(Json::Object(obj)) => {
            let mut c = Fields::nested(obj, "tool_choice");
            match c.string("type")?.as_deref() {
                Some("function") => {}
                _ => return Err(ApiError::invalid_value("tool_choice.type", "must be `function`")),
            }
            let func =
                c.object("function")?.ok_or_else(|| ApiError::Missing { param: "tool_choice.function".into() })?;
            let mut func = Fields::nested(func, "tool_choice.function");
            let name =
                func.string("name")?.ok_or_else(|| ApiError::Missing { param: "tool_choice.function.name".into() })?;
            func.finish(&[], &[])?;
            c.finish(&[], &[])?;
            ToolChoice::Function(name)
        }
        Some(_) => return Err(ApiError::invalid_type("tool_choice", "a string or a function object")),
    };
    match &choice {
        ToolChoice::Required if tools.is_empty() => {
            return Err(ApiError::invalid_value("tool_choice", "`required` needs at least one tool in `tools`"))
        }
        ToolChoice::Function(name) if !tools.iter().any(|t| &t.name == name) => {
            return Err(ApiError::invalid_value(
                "tool_choice.function.name",
                format!("`{name}` is not one of the request's tools"),
            ))
        }
        _ => {}
    }
    if tools.is_empty() && choice == ToolChoice::None {
        return Ok(None);
    }
    Ok(Some(ToolRequest { tools, tools_json: tools_json.unwrap_or(Json::Array(Vec::new())), choice, parallel }))
}

/// `{"type": "function", "function": {"name", "description", "parameters", "strict"}}`.
fn parse_tool(v: &Json, i: usize) -> Result<Tool, ApiError> {
    let param = format!("tools.{i}");
    let Json::Object(obj) = v else {
        return Err(ApiError::invalid_type(param, "a tool object"));
    };
    let mut f = Fields::nested(obj.clone(), &param);
    match f.string("type")?.as_deref() {
        Some("function") => {}
        _ => return Err(ApiError::invalid_value(format!("{param}.type"), "must be `function`")),
    }
    let func = f.object("function")?.ok_or_else(|| ApiError::Missing { param: format!("{param}.function") })?;
    f.finish(&[], &[])?;
    let fparam = format!("{param}.function");
    let mut func = Fields::nested(func, &fparam);
    let name = func.string("name")?.ok_or_else(|| ApiError::Missing { param: format!("{fparam}.name") })?;
    if name.is_empty() || name.len() > 64 || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        return Err(ApiError::invalid_value(
            format!("{fparam}.name"),
            "must be 1 to 64 characters of a-z, A-Z, 0-9, _ and -",
        ));
    }
    let _description = func.string("description")?;
    let _strict = func.bool("strict")?;
    let parameters = match func.take("parameters") {
        None => json!({"type": "object", "properties": {}}),
        Some(p @ Json::Object(_)) => p,
        Some(_) => return Err(ApiError::invalid_type(format!("{fparam}.parameters"), "a JSON schema object")),
    };
    func.finish(&[], &[])?;
    check_schema_size(&format!("{fparam}.parameters"), &parameters)?;
    Ok(Tool { name, parameters })
}

/// The calls of a constrained output: for `required`, the JSON array of
/// `{"name", "parameters"}`; for a named function, its arguments. `None` when
/// the output is not that (the length limit cut it).
pub fn constrained_calls(choice: &ToolChoice, output: &str) -> Option<Vec<(String, String)>> {
    match choice {
        ToolChoice::Required => {
            let v: Json = serde_json::from_str(output).ok()?;
            v.as_array()?
                .iter()
                .map(|c| Some((c.get("name")?.as_str()?.to_owned(), c.get("parameters")?.to_string())))
                .collect()
        }
        ToolChoice::Function(name) => {
            let v: Json = serde_json::from_str(output).ok()?;
            Some(vec![(name.clone(), v.to_string())])
        }
        ToolChoice::None | ToolChoice::Auto => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Json) -> Result<Option<ToolRequest>, ApiError> {
        let Json::Object(obj) = v else { unreachable!() };
        let mut f = Fields::nested(obj, "x");
        parse_tools(&mut f)
    }

    fn weather() -> Json {
        json!({"type": "function", "function": {"name": "get_weather", "description": "d",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
    }

    #[test]
    fn choices_and_their_grammars() {
        let r = parse(json!({"tools": [weather()]})).unwrap().unwrap();
        assert_eq!(r.choice, ToolChoice::Auto);
        assert!(r.grammar().is_none() && r.template_tools().is_some());
        let r = parse(json!({"tools": [weather()], "tool_choice": "required", "parallel_tool_calls": false}))
            .unwrap()
            .unwrap();
        let Some(GrammarSpec::JsonSchema(g)) = r.grammar() else { panic!() };
        assert_eq!(g["maxItems"], 1);
        assert_eq!(g["items"]["anyOf"][0]["properties"]["name"]["const"], "get_weather");
        let r = parse(
            json!({"tools": [weather()], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.grammar(), Some(GrammarSpec::JsonSchema(weather()["function"]["parameters"].clone())));
        let r = parse(json!({"tools": [weather()], "tool_choice": "none"})).unwrap().unwrap();
        assert!(r.template_tools().is_none());
        assert!(parse(json!({})).unwrap().is_none());
    }

    #[test]
    fn bad_tools_name_the_field() {
        let param = |v: Json| parse(v).unwrap_err().param().map(str::to_owned);
        assert_eq!(param(json!({"tool_choice": "required"})).as_deref(), Some("tool_choice"));
        assert_eq!(
            param(json!({"tools": [weather()], "tool_choice": {"type": "function", "function": {"name": "nope"}}}))
                .as_deref(),
            Some("tool_choice.function.name")
        );
        assert_eq!(param(json!({"tools": [{"type": "function"}]})).as_deref(), Some("tools.0.function"));
        assert_eq!(param(json!({"tools": [weather(), weather()]})).as_deref(), Some("tools.1.function.name"));
        assert_eq!(param(json!({"tools": vec![weather(); MAX_TOOLS + 1]})).as_deref(), Some("tools"));
    }

    #[test]
    fn constrained_outputs_become_calls() {
        let calls = constrained_calls(&ToolChoice::Required, r#"[{"name": "f", "parameters": {"a": 1}}]"#);
        assert_eq!(calls, Some(vec![("f".into(), r#"{"a":1}"#.into())]));
        assert_eq!(constrained_calls(&ToolChoice::Function("g".into()), "{}"), Some(vec![("g".into(), "{}".into())]));
        assert_eq!(constrained_calls(&ToolChoice::Required, "[{\"name\": \"f\""), None);
    }
}
