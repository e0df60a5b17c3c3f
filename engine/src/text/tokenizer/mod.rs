//! Tokenization: text to token ids and back, for one model.
//!
//! [`Tokenizer`] wraps a HuggingFace `tokenizers::Tokenizer` with the facts
//! generation needs and `tokenizer.json` does not hold: the special-token
//! strings chat templates print, the ids that end generation (EOS from
//! `tokenizer_config.json`, `generation_config.json` and `config.json`), and
//! transformers' `add_bos_token`/`add_eos_token` overrides. It is built from a
//! HuggingFace folder ([`Tokenizer::from_dir`]) or from an in-memory tokenizer
//! ([`Tokenizer::new`], used for GGUF checkpoints).
//!
//! Streaming output is two layers, both per request:
//! - [`stream::DecodeStream`] turns token ids into text pieces that never split a
//!   UTF-8 character and concatenate to exactly `decode(all_ids)`.
//! - [`StopMatcher`] finds stop strings across piece boundaries and holds
//!   back text that may be the start of one, so a stop string is never sent.

mod stop;
pub mod stream;

use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde_json::Value as Json;
use tokenizers::processors::template::TemplateProcessing;

pub use crate::text::chat_template::SpecialTokens;
pub use stop::{StopMatch, StopMatcher, StopOutcome, StopStrings, StopStringsError};

/// Why a tokenizer could not be loaded, or could not encode or decode.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} is not valid JSON: {source}")]
    Json { path: PathBuf, source: serde_json::Error },
    #[error("{path}: not a tokenizer the `tokenizers` library can load: {reason}")]
    Load { path: PathBuf, reason: String },
    #[error("{path}: {reason}")]
    Config { path: PathBuf, reason: String },
    #[error("tokenization failed: {0}")]
    Encode(String),
    #[error("detokenization failed: {0}")]
    Decode(String),
}

/// A model's tokenizer plus its special tokens and end-of-generation ids.
#[derive(Clone, Debug)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    special_tokens: SpecialTokens,
    bos_token_id: Option<u32>,
    /// Every id that ends generation, in discovery order, without duplicates.
    eos_token_ids: Vec<u32>,
}

impl Tokenizer {
    /// Wraps an in-memory tokenizer (e.g. one rebuilt from GGUF metadata).
    ///
    /// `eos_token_ids` lists every id that ends generation; the id of
    /// `special_tokens.eos_token` is added when it is in the vocabulary.
    pub fn new(inner: tokenizers::Tokenizer, special_tokens: SpecialTokens, eos_token_ids: Vec<u32>) -> Self {
        let bos_token_id = special_tokens.bos_token.as_deref().and_then(|t| inner.token_to_id(t));
        let mut ids = Vec::new();
        let eos_from_text = special_tokens.eos_token.as_deref().and_then(|t| inner.token_to_id(t));
        for id in eos_from_text.into_iter().chain(eos_token_ids) {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        Self { inner, special_tokens, bos_token_id, eos_token_ids: ids }
    }

    /// Loads `tokenizer.json` from a HuggingFace model folder, with the
    /// special tokens and `add_bos_token`/`add_eos_token` of
    /// `tokenizer_config.json` and the EOS ids of `generation_config.json`
    /// and `config.json` (each optional).
    pub fn from_dir(dir: &Path) -> Result<Self, TokenizerError> {
        let path = dir.join("tokenizer.json");
        let text =
            std::fs::read_to_string(&path).map_err(|source| TokenizerError::Io { path: path.clone(), source })?;
        let mut inner = tokenizers::Tokenizer::from_str(&text)
            .map_err(|e| TokenizerError::Load { path: path.clone(), reason: e.to_string() })?;

        let config = read_json_if_exists(&dir.join("tokenizer_config.json"))?;
        let special_tokens = config.as_ref().map(SpecialTokens::from_tokenizer_config).unwrap_or_default();
        if let Some(config) = &config {
            apply_add_bos_eos(&mut inner, config, &special_tokens, &dir.join("tokenizer_config.json"))?;
        }

        let mut eos_token_ids = Vec::new();
        for file in ["generation_config.json", "config.json"] {
            let path = dir.join(file);
            if let Some(json) = read_json_if_exists(&path)? {
                eos_token_ids.extend(eos_ids_field(&json, &path)?);
            }
        }
        Ok(Self::new(inner, special_tokens, eos_token_ids))
    }

    /// Token ids of `text`.
    ///
    /// `add_special_tokens` applies the post-processor (e.g. a leading BOS).
    /// A prompt rendered by a chat template already contains its special
    /// tokens as text, so encode it with `false`, as transformers'
    /// `apply_chat_template` does. Special-token strings in `text` are
    /// recognised either way.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        self.inner
            .encode_fast(text, add_special_tokens)
            .map(|encoding| encoding.get_ids().to_vec())
            .map_err(|e| TokenizerError::Encode(e.to_string()))
    }

    /// The text of `ids`; ids outside the vocabulary are skipped, as the
    /// `tokenizers` library (and so transformers) does.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        self.inner.decode(ids, skip_special_tokens).map_err(|e| TokenizerError::Decode(e.to_string()))
    }

    /// Number of tokens, added tokens included. The model's embedding table
    /// may be larger (padded); ids past this decode to nothing.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The special-token strings, for chat templates.
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.special_tokens
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.special_tokens.bos_token.as_deref()
    }

    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos_token_id
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.special_tokens.eos_token.as_deref()
    }

    /// Every id that ends generation (unless the request ignores EOS).
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    pub fn is_eos(&self, id: u32) -> bool {
        self.eos_token_ids.contains(&id)
    }

    /// The wrapped `tokenizers` tokenizer, for what this type does not cover.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// transformers rebuilds the post-processor from `add_bos_token` and
/// `add_eos_token` when `tokenizer_config.json` sets either explicitly (or
/// `tokenizer.json` has no post-processor and one of them is set): `[BOS] $A
/// [EOS]` with each part present only when its flag is true.
fn apply_add_bos_eos(
    inner: &mut tokenizers::Tokenizer,
    config: &Json,
    special: &SpecialTokens,
    path: &Path,
) -> Result<(), TokenizerError> {
    let flag = |name: &str| config.get(name).and_then(Json::as_bool);
    let (add_bos, add_eos) = (flag("add_bos_token"), flag("add_eos_token"));
    if add_bos.is_none() && add_eos.is_none() {
        return Ok(());
    }
    let with_id =
        |token: &Option<String>| token.as_deref().and_then(|t| inner.token_to_id(t).map(|id| (t.to_owned(), id)));
    let bos = with_id(&special.bos_token).filter(|_| add_bos == Some(true));
    let eos = with_id(&special.eos_token).filter(|_| add_eos == Some(true));
    let mut single = Vec::new();
    let mut pair = Vec::new();
    let mut tokens = Vec::new();
    if let Some((t, id)) = &bos {
        single.push(format!("{t}:0"));
        tokens.push((t.clone(), *id));
    }
    single.push("$A:0".to_owned());
    if let Some((t, id)) = &eos {
        single.push(format!("{t}:0"));
        tokens.push((t.clone(), *id));
    }
    pair.extend(single.iter().cloned());
    if let Some((t, _)) = &bos {
        pair.push(format!("{t}:1"));
    }
    pair.push("$B:1".to_owned());
    if let Some((t, _)) = &eos {
        pair.push(format!("{t}:1"));
    }
    let config_err = |e: String| TokenizerError::Config {
        path: path.to_owned(),
        reason: format!("add_bos_token/add_eos_token: {e}"),
    };
    let mut builder = TemplateProcessing::builder();
    builder.try_single(single).map_err(config_err)?;
    builder.try_pair(pair).map_err(config_err)?;
    builder.special_tokens(tokens);
    let processor = builder.build().map_err(|e| config_err(e.to_string()))?;
    inner.with_post_processor(Some(processor));
    Ok(())
}

/// The `eos_token_id` field of a config file: absent, `null`, an id or a
/// list of ids.
fn eos_ids_field(json: &Json, path: &Path) -> Result<Vec<u32>, TokenizerError> {
    let bad = || TokenizerError::Config {
        path: path.to_owned(),
        reason: "eos_token_id must be a token id or a list of token ids".into(),
    };
    let as_id = |v: &Json| v.as_u64().and_then(|n| u32::try_from(n).ok());
    match json.get("eos_token_id") {
        None | Some(Json::Null) => Ok(Vec::new()),
        Some(Json::Array(items)) => items.iter().map(|v| as_id(v).ok_or_else(bad)).collect(),
        Some(v) => as_id(v).map(|id| vec![id]).ok_or_else(bad),
    }
}

fn read_json_if_exists(path: &Path) -> Result<Option<Json>, TokenizerError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(TokenizerError::Io { path: path.to_owned(), source }),
    };
    serde_json::from_str(&text).map(Some).map_err(|source| TokenizerError::Json { path: path.to_owned(), source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tokenizer_is_shareable_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Tokenizer>();
        assert_send_sync::<StopMatcher>();
        assert_send_sync::<StopStrings>();
    }

    #[test]
    fn eos_ids_accept_int_list_and_null() {
        let p = Path::new("x.json");
        assert_eq!(eos_ids_field(&json!({"eos_token_id": 4}), p).unwrap(), [4]);
        assert_eq!(eos_ids_field(&json!({"eos_token_id": [1, 2]}), p).unwrap(), [1, 2]);
        assert!(eos_ids_field(&json!({"eos_token_id": null}), p).unwrap().is_empty());
        assert!(eos_ids_field(&json!({}), p).unwrap().is_empty());
        assert!(eos_ids_field(&json!({"eos_token_id": "x"}), p).is_err());
        assert!(eos_ids_field(&json!({"eos_token_id": [-1]}), p).is_err());
    }
}
