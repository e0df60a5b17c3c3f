//! Finding a model's chat template and special tokens in a HuggingFace folder.
//!
//! transformers looks for the template in `chat_template.jinja` first (the
//! layout since transformers 4.47), then `chat_template.json` (written by
//! processors), then the `chat_template` field of `tokenizer_config.json`,
//! which is either a string or a list of `{name, template}` objects of which
//! `"default"` is the one used. The special tokens templates print
//! (`bos_token`, ...) come from `tokenizer_config.json`, as plain strings or
//! as `AddedToken` objects (`{"content": "<s>", ...}`).

use std::path::{Path, PathBuf};

use serde_json::Value as Json;

use super::error::ChatTemplateError;

/// The special-token strings a chat template can refer to.
///
/// A token the model does not define stays `None` and is not passed to the
/// template at all, so `bos_token is defined` is false there, as in
/// transformers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub unk_token: Option<String>,
    pub pad_token: Option<String>,
}

impl SpecialTokens {
    /// Reads the tokens from a parsed `tokenizer_config.json`; missing or
    /// malformed entries are treated as absent.
    pub fn from_tokenizer_config(config: &Json) -> Self {
        let token = |name: &str| config.get(name).and_then(token_content);
        Self {
            bos_token: token("bos_token"),
            eos_token: token("eos_token"),
            unk_token: token("unk_token"),
            pad_token: token("pad_token"),
        }
    }

    /// The defined tokens as `(variable name, text)` pairs.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [
            ("bos_token", &self.bos_token),
            ("eos_token", &self.eos_token),
            ("unk_token", &self.unk_token),
            ("pad_token", &self.pad_token),
        ]
        .into_iter()
        .filter_map(|(name, token)| token.as_deref().map(|t| (name, t)))
    }
}

/// The text of a special-token entry: a string, or an `AddedToken` object's
/// `content`.
pub(crate) fn token_content(entry: &Json) -> Option<String> {
    match entry {
        Json::String(s) => Some(s.clone()),
        Json::Object(obj) => obj.get("content").and_then(Json::as_str).map(str::to_owned),
        _ => None,
    }
}

/// What a model folder says about chat formatting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelChatConfig {
    /// The default chat template source, if the model has one (base models
    /// often do not).
    pub chat_template: Option<String>,
    pub special_tokens: SpecialTokens,
}

impl ModelChatConfig {
    /// Reads the template and the special tokens from the model folder `dir`.
    /// A folder without `tokenizer_config.json` has no special tokens; a file
    /// that exists but cannot be read or parsed is an error naming it.
    pub fn load(dir: &Path) -> Result<Self, ChatTemplateError> {
        let config = read_json_if_exists(&dir.join("tokenizer_config.json"))?;
        let special_tokens = config.as_ref().map(SpecialTokens::from_tokenizer_config).unwrap_or_default();
        let chat_template = find_template(dir, config.as_ref())?;
        Ok(Self { chat_template, special_tokens })
    }
}

/// The default chat template of the model folder `dir`, if it has one.
pub fn load_chat_template(dir: &Path) -> Result<Option<String>, ChatTemplateError> {
    let config = read_json_if_exists(&dir.join("tokenizer_config.json"))?;
    find_template(dir, config.as_ref())
}

fn find_template(dir: &Path, tokenizer_config: Option<&Json>) -> Result<Option<String>, ChatTemplateError> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        return std::fs::read_to_string(&jinja)
            .map(Some)
            .map_err(|source| ChatTemplateError::Io { path: jinja, source });
    }
    let json_path = dir.join("chat_template.json");
    if let Some(json) = read_json_if_exists(&json_path)? {
        if let Some(template) = template_field(&json, &json_path)? {
            return Ok(Some(template));
        }
    }
    match tokenizer_config {
        Some(config) => template_field(config, &dir.join("tokenizer_config.json")),
        None => Ok(None),
    }
}

/// The `chat_template` field of a config file: a string, or a list of
/// `{name, template}` objects from which `"default"` is taken.
fn template_field(config: &Json, path: &Path) -> Result<Option<String>, ChatTemplateError> {
    let bad = |reason: String| ChatTemplateError::Config { path: path.to_owned(), reason };
    match config.get("chat_template") {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(s.clone())),
        Some(Json::Array(entries)) => {
            let mut names = Vec::new();
            for entry in entries {
                let name = entry.get("name").and_then(Json::as_str);
                let template = entry.get("template").and_then(Json::as_str);
                match (name, template) {
                    (Some("default"), Some(t)) => return Ok(Some(t.to_owned())),
                    (Some(n), Some(_)) => names.push(n.to_owned()),
                    _ => return Err(bad("chat_template entries must be {\"name\", \"template\"} objects".into())),
                }
            }
            Err(bad(format!("multiple chat templates and none named \"default\" (found: {})", names.join(", "))))
        }
        Some(_) => Err(bad("chat_template must be a string or a list of {name, template} objects".into())),
    }
}

pub(crate) fn read_json_if_exists(path: &Path) -> Result<Option<Json>, ChatTemplateError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(ChatTemplateError::Io { path: PathBuf::from(path), source }),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|source| ChatTemplateError::Json { path: PathBuf::from(path), source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn special_tokens_from_strings_and_objects() {
        let cfg = json!({"bos_token": "<s>", "eos_token": {"content": "</s>", "lstrip": false}, "pad_token": null});
        let t = SpecialTokens::from_tokenizer_config(&cfg);
        assert_eq!(t.bos_token.as_deref(), Some("<s>"));
        assert_eq!(t.eos_token.as_deref(), Some("</s>"));
        assert_eq!(t.pad_token, None);
        assert_eq!(t.iter().count(), 2);
    }

    #[test]
    fn template_lookup_order() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load_chat_template(dir.path()).unwrap(), None);
        let cfg =
            json!({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]});
        std::fs::write(dir.path().join("tokenizer_config.json"), cfg.to_string()).unwrap();
        assert_eq!(load_chat_template(dir.path()).unwrap().as_deref(), Some("D"));
        std::fs::write(dir.path().join("chat_template.json"), r#"{"chat_template": "J"}"#).unwrap();
        assert_eq!(load_chat_template(dir.path()).unwrap().as_deref(), Some("J"));
        std::fs::write(dir.path().join("chat_template.jinja"), "X").unwrap();
        assert_eq!(load_chat_template(dir.path()).unwrap().as_deref(), Some("X"));
    }

    #[test]
    fn bad_configs_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer_config.json");
        std::fs::write(&path, "{not json").unwrap();
        assert!(matches!(ModelChatConfig::load(dir.path()), Err(ChatTemplateError::Json { .. })));
        std::fs::write(&path, r#"{"chat_template": [{"name": "a", "template": "A"}]}"#).unwrap();
        assert!(matches!(load_chat_template(dir.path()), Err(ChatTemplateError::Config { .. })));
        std::fs::write(&path, r#"{"chat_template": 3}"#).unwrap();
        assert!(matches!(load_chat_template(dir.path()), Err(ChatTemplateError::Config { .. })));
    }
}
