//! The tokenizer as constrained decoding sees it: the bytes of every token, in
//! a `toktrie` trie, for `llguidance` to compute which tokens a grammar allows.
//!
//! The bytes come from the tokenizer's own JSON (`tokenizer.json`, or the one
//! rebuilt from GGUF metadata) through llguidance's
//! `token_bytes_from_tokenizer_json`, which undoes the byte-level (GPT-2) and
//! byte-fallback (SentencePiece) encodings and marks special tokens so that no
//! grammar text matches them. The trie covers the model's vocabulary, which
//! may be padded past the tokenizer's: padding ids have no bytes and are never
//! allowed.

use std::sync::Arc;

use toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};

use crate::text::tokenizer::Tokenizer;

/// Why a tokenizer has no token environment (structured outputs are then
/// unavailable for its model).
#[derive(Debug, thiserror::Error)]
pub enum TokenEnvError {
    #[error("cannot serialize the tokenizer: {0}")]
    Serialize(String),
    #[error("cannot read the bytes of the tokens: {0}")]
    TokenBytes(String),
    #[error("the tokenizer has no end-of-sequence token")]
    NoEos,
}

/// The token environment of `tokenizer` over a vocabulary of `vocab_size` ids
/// (the model's logits width). A grammar that is complete allows the
/// tokenizer's first end-of-sequence id.
pub fn token_env(tokenizer: &Tokenizer, vocab_size: usize) -> Result<TokEnv, TokenEnvError> {
    let text = tokenizer.inner().to_string(false).map_err(|e| TokenEnvError::Serialize(e.to_string()))?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| TokenEnvError::Serialize(e.to_string()))?;
    let mut words =
        llguidance::token_bytes_from_tokenizer_json(&json).map_err(|e| TokenEnvError::TokenBytes(e.to_string()))?;
    words.resize(vocab_size, Vec::new());
    let eos =
        tokenizer.eos_token_ids().iter().copied().find(|&t| (t as usize) < vocab_size).ok_or(TokenEnvError::NoEos)?;
    let vocab = u32::try_from(vocab_size).map_err(|_| TokenEnvError::TokenBytes(format!("{vocab_size} tokens")))?;
    let info = TokRxInfo::new(vocab, eos);
    // Greedy tokenization over the trie: llguidance only tokenizes to force
    // tokens, which the engine does not do, so exactness does not matter.
    Ok(Arc::new(ApproximateTokEnv::new(TokTrie::from(&info, &words))))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn fixture_tokens_have_their_bytes() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/qwen3-tiny");
        let tokenizer = Tokenizer::from_dir(&dir).unwrap();
        let vocab = tokenizer.vocab_size() + 7;
        let env = token_env(&tokenizer, vocab).unwrap();
        let trie = env.tok_trie();
        assert_eq!(trie.vocab_size(), vocab);
        let ids = tokenizer.encode("{\"a\": 1}", false).unwrap();
        let bytes: Vec<u8> = ids.iter().flat_map(|&t| trie.token(t).to_vec()).collect();
        assert_eq!(bytes, b"{\"a\": 1}");
        assert_eq!(trie.eos_token(), tokenizer.eos_token_ids()[0]);
    }
}
