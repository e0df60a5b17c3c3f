//! `minisgl render-template`: render a chat template with a conversation and
//! print the prompt, for debugging templates without loading a model.
//!
//! The output is the rendered text exactly as the server would tokenize it
//! (no newline is added). A template that fails, or raises on purpose
//! (`raise_exception`), prints the error and exits with status 1.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Args;
use serde_json::{Map, Value as Json};

use crate::text::chat_template::{ChatTemplate, ModelChatConfig, RenderOptions, SpecialTokens};

/// Arguments of `minisgl render-template`.
#[derive(Args, Debug)]
pub struct RenderTemplateArgs {
    /// The template file (.jinja), a tokenizer_config.json, a model folder, or a
    /// .gguf file (its tokenizer.chat_template and special tokens).
    #[arg(long)]
    pub template: std::path::PathBuf,
    /// A JSON file: a list of messages, or an object with "messages" (and
    /// optionally "tools", "documents", and further template variables).
    #[arg(long)]
    pub messages: PathBuf,
    /// End the prompt with the header of an assistant turn.
    #[arg(long)]
    pub add_generation_prompt: bool,
    /// A template variable, e.g. `--var enable_thinking=false` or
    /// `--var bos_token='<s>'`; the value is parsed as JSON when it parses,
    /// else taken as a string. Repeatable.
    #[arg(long = "var", value_name = "KEY=VALUE")]
    pub vars: Vec<String>,
}

/// Renders and prints; a template error is an `Err` (exit status 1).
pub fn run(args: RenderTemplateArgs) -> anyhow::Result<ExitCode> {
    let rendered = render(&args)?;
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(rendered.as_bytes())?;
    stdout.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// The rendered prompt for `args`.
pub fn render(args: &RenderTemplateArgs) -> anyhow::Result<String> {
    let (source, special_tokens) = load_template(&args.template)?;
    let template = ChatTemplate::new(&source).with_context(|| format!("{}", args.template.display()))?;

    let text =
        std::fs::read_to_string(&args.messages).with_context(|| format!("cannot read {}", args.messages.display()))?;
    let doc: Json =
        serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", args.messages.display()))?;
    let mut opts = RenderOptions::new(args.add_generation_prompt, special_tokens);
    let messages = match doc {
        Json::Array(messages) => messages,
        Json::Object(mut obj) => {
            let messages = match obj.remove("messages") {
                Some(Json::Array(m)) => m,
                _ => bail!("{}: the object must have a \"messages\" list", args.messages.display()),
            };
            for (key, value) in obj {
                set_var(&mut opts, &key, value)
                    .with_context(|| format!("{}: key \"{key}\"", args.messages.display()))?;
            }
            messages
        }
        _ => bail!("{}: expected a list of messages or an object with \"messages\"", args.messages.display()),
    };
    for var in &args.vars {
        let Some((key, value)) = var.split_once('=') else {
            bail!("--var {var}: expected KEY=VALUE");
        };
        if key.is_empty() {
            bail!("--var {var}: the key is empty");
        }
        let value = serde_json::from_str(value).unwrap_or_else(|_| Json::String(value.to_owned()));
        set_var(&mut opts, key, value).with_context(|| format!("--var {var}"))?;
    }
    Ok(template.render(&messages, &opts)?)
}

/// Puts one template variable where the renderer reads it: special tokens
/// and `tools`/`documents` have fields of their own (which would otherwise
/// hide a plain variable of the same name).
fn set_var(opts: &mut RenderOptions, key: &str, value: Json) -> anyhow::Result<()> {
    let as_token = |value: Json| match value {
        Json::String(s) => Ok(Some(s)),
        Json::Null => Ok(None),
        other => bail!("a special token must be a string, got {other}"),
    };
    match key {
        "messages" => bail!("the messages come from --messages"),
        "add_generation_prompt" => match value {
            Json::Bool(b) => opts.add_generation_prompt = b,
            other => bail!("add_generation_prompt must be true or false, got {other}"),
        },
        "tools" => opts.tools = Some(value),
        "documents" => opts.documents = Some(value),
        "bos_token" => opts.special_tokens.bos_token = as_token(value)?,
        "eos_token" => opts.special_tokens.eos_token = as_token(value)?,
        "unk_token" => opts.special_tokens.unk_token = as_token(value)?,
        "pad_token" => opts.special_tokens.pad_token = as_token(value)?,
        _ => {
            opts.extra.insert(key.to_owned(), value);
        }
    }
    Ok(())
}

/// The template source and special tokens of `path`: a model folder, a GGUF
/// file, a `tokenizer_config.json`/`chat_template.json`, or a Jinja file (whose
/// folder's `tokenizer_config.json`, if any, gives the special tokens). A
/// GGUF goes through the loader the server uses, so both render alike.
fn load_template(path: &Path) -> anyhow::Result<(String, SpecialTokens)> {
    if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) || is_gguf(path) {
        let (_, chat) = super::common::load_tokenizer(path)?;
        let Some(source) = chat.chat_template else {
            bail!("{}: no tokenizer.chat_template in the GGUF metadata", path.display());
        };
        return Ok((source, chat.special_tokens));
    }
    if path.is_dir() {
        let chat = ModelChatConfig::load(path)?;
        let Some(source) = chat.chat_template else {
            bail!(
                "{}: no chat template (chat_template.jinja, chat_template.json or tokenizer_config.json)",
                path.display()
            );
        };
        return Ok((source, chat.special_tokens));
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    if path.extension().is_some_and(|e| e == "json") {
        let config: Json =
            serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", path.display()))?;
        let source = template_field(&config).with_context(|| format!("{}", path.display()))?;
        let mut special = SpecialTokens::from_tokenizer_config(&config);
        if special == SpecialTokens::default() {
            special = sibling_special_tokens(path)?;
        }
        return Ok((source, special));
    }
    Ok((text, sibling_special_tokens(path)?))
}

/// Whether `path` starts with the GGUF magic (a GGUF named otherwise).
fn is_gguf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok() && &magic == b"GGUF"
}

/// The special tokens of the `tokenizer_config.json` next to `path`, if any.
fn sibling_special_tokens(path: &Path) -> anyhow::Result<SpecialTokens> {
    let Some(dir) = path.parent() else {
        return Ok(SpecialTokens::default());
    };
    let config = dir.join("tokenizer_config.json");
    if config == path || !config.is_file() {
        return Ok(SpecialTokens::default());
    }
    let text = std::fs::read_to_string(&config).with_context(|| format!("cannot read {}", config.display()))?;
    let json: Json = serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", config.display()))?;
    Ok(SpecialTokens::from_tokenizer_config(&json))
}

/// The `chat_template` field: a string, or a list of `{name, template}`
/// objects of which `"default"` is used (as transformers does).
fn template_field(config: &Json) -> anyhow::Result<String> {
    match config.get("chat_template") {
        Some(Json::String(s)) => Ok(s.clone()),
        Some(Json::Array(entries)) => {
            let named = |e: &Json| -> Option<(String, String)> {
                let obj: &Map<String, Json> = e.as_object()?;
                Some((obj.get("name")?.as_str()?.to_owned(), obj.get("template")?.as_str()?.to_owned()))
            };
            let entries: Vec<(String, String)> = entries.iter().filter_map(named).collect();
            match entries.iter().find(|(name, _)| name == "default") {
                Some((_, template)) => Ok(template.clone()),
                None => bail!(
                    "no chat template named \"default\" (found: {})",
                    entries.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", ")
                ),
            }
        }
        None | Some(Json::Null) => bail!("no \"chat_template\" field"),
        Some(_) => {
            bail!("\"chat_template\" must be a string or a list of {{name, template}} objects")
        }
    }
}
