//! Incremental detokenization: token ids in, newly completed text out.
//!
//! Decoding one token at a time is wrong in two ways: a byte-level BPE token
//! can hold part of a multi-byte character (decoding it alone gives U+FFFD),
//! and some decoders depend on context (SentencePiece drops the space of the
//! first token of a sequence). So, like TGI and vLLM, we decode a small
//! window twice per step: the tokens already emitted that start the window
//! (the prefix) and the window plus the new tokens, and emit the difference
//! once it no longer ends in U+FFFD. At the end, [`DecodeStream::finish`]
//! emits whatever is still held back, U+FFFD included where a full
//! `decode` would also show it, so the concatenation of all pieces equals
//! `decode(all_ids)`.

use super::{Tokenizer, TokenizerError};

const REPLACEMENT: char = '\u{FFFD}';

/// Held-back tokens after which we look for text that can no longer change
/// (one UTF-8 character is at most 4 bytes, so at most 4 tokens).
const MAX_HELD_TOKENS: usize = 4;

/// Per-request detokenizer state. It does not borrow the tokenizer, so it can
/// live in a request next to an `Arc<Tokenizer>`; pass the same tokenizer to
/// every call.
#[derive(Clone, Debug)]
pub struct DecodeStream {
    skip_special_tokens: bool,
    /// The window: tokens whose text was emitted (`..prefix_len`), then
    /// tokens whose text is held back.
    ids: Vec<u32>,
    prefix_len: usize,
    /// `decode(ids[..prefix_len])`, cached.
    prefix_text: String,
}

// Defined here rather than beside `Tokenizer` so that `mod.rs` does not import
// this file, which imports it.
impl Tokenizer {
    /// A fresh incremental detokenizer for one request.
    pub fn decode_stream(&self, skip_special_tokens: bool) -> DecodeStream {
        DecodeStream::new(skip_special_tokens)
    }
}

impl DecodeStream {
    pub fn new(skip_special_tokens: bool) -> Self {
        Self { skip_special_tokens, ids: Vec::new(), prefix_len: 0, prefix_text: String::new() }
    }

    /// Feeds one generated token; returns the text it completes (often
    /// empty while a character is still incomplete).
    pub fn step(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String, TokenizerError> {
        self.ids.push(id);
        let text = tokenizer.decode(&self.ids, self.skip_special_tokens)?;
        if self.is_new_text(&text) && !text.ends_with(REPLACEMENT) {
            let piece = text[self.prefix_text.len()..].to_owned();
            self.advance(tokenizer, self.ids.len())?;
            return Ok(piece);
        }
        if self.ids.len() - self.prefix_len > MAX_HELD_TOKENS {
            if text == self.prefix_text {
                // The held tokens add no text at all (special tokens that are
                // skipped): drop them, so a model that emits them forever
                // does not grow the window (and each decode) without bound.
                // The prefix stays, so the next token keeps its context.
                self.ids.truncate(self.prefix_len);
                return Ok(String::new());
            }
            return self.emit_settled(tokenizer, &text);
        }
        Ok(String::new())
    }

    /// Tokens in the window (emitted prefix plus held back), for tests of
    /// its bound.
    pub fn window_len(&self) -> usize {
        self.ids.len()
    }

    /// Whether `text` (the window's text) extends the emitted prefix.
    fn is_new_text(&self, text: &str) -> bool {
        text.len() > self.prefix_text.len() && text.starts_with(&self.prefix_text)
    }

    /// Marks `ids[..emitted]` as emitted: they become the next window's
    /// prefix (enough context for the decoder) and older tokens are dropped,
    /// so the window stays short.
    fn advance(&mut self, tokenizer: &Tokenizer, emitted: usize) -> Result<(), TokenizerError> {
        self.ids.drain(..self.prefix_len);
        self.prefix_len = emitted - self.prefix_len;
        self.prefix_text = tokenizer.decode(&self.ids[..self.prefix_len], self.skip_special_tokens)?;
        Ok(())
    }

    /// Emits the settled part of a window whose text keeps ending in U+FFFD
    /// (a model emitting invalid bytes), so the window does not grow, and
    /// decoding cost with it, for the rest of the request.
    ///
    /// Only an incomplete character at the very end can still change, and it
    /// spans at most 3 bytes, so we look for a split that leaves at most 3
    /// tokens held and is a true boundary: decoding both sides separately
    /// gives the same text as decoding them together, with text on the right
    /// (UTF-8 decoding settles an incomplete character at the next byte).
    fn emit_settled(&mut self, tokenizer: &Tokenizer, text: &str) -> Result<String, TokenizerError> {
        for held in 1..=3 {
            let split = self.ids.len() - held;
            if split <= self.prefix_len {
                break;
            }
            let head = tokenizer.decode(&self.ids[..split], self.skip_special_tokens)?;
            let tail = tokenizer.decode(&self.ids[split..], self.skip_special_tokens)?;
            // The tail must hold text: the byte after the split is what
            // settles an incomplete character before it (a skipped special
            // token holds none).
            let is_boundary = !tail.is_empty()
                && text.len() == head.len() + tail.len()
                && text.starts_with(&head)
                && text.ends_with(&tail);
            if is_boundary && self.is_new_text(&head) {
                let piece = head[self.prefix_text.len()..].to_owned();
                self.advance(tokenizer, split)?;
                return Ok(piece);
            }
        }
        Ok(String::new())
    }

    /// Feeds several tokens, returning the text they complete together.
    pub fn step_many(&mut self, tokenizer: &Tokenizer, ids: &[u32]) -> Result<String, TokenizerError> {
        let mut out = String::new();
        for &id in ids {
            out.push_str(&self.step(tokenizer, id)?);
        }
        Ok(out)
    }

    /// Ends the stream: returns all text still held back (with U+FFFD for
    /// bytes that never formed a character, as `decode` shows them) and
    /// resets the stream.
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> Result<String, TokenizerError> {
        let text = tokenizer.decode(&self.ids, self.skip_special_tokens)?;
        let rest = match text.strip_prefix(self.prefix_text.as_str()) {
            Some(rest) => rest.to_owned(),
            // NOTE: only a decoder that rewrites earlier text when more tokens
            // follow gets here; emitted text cannot be taken back, so send
            // what follows the common part.
            None => {
                let common = text
                    .char_indices()
                    .zip(self.prefix_text.chars())
                    .take_while(|((_, a), b)| a == b)
                    .last()
                    .map_or(0, |((i, c), _)| i + c.len_utf8());
                text[common..].to_owned()
            }
        };
        *self = Self::new(self.skip_special_tokens);
        Ok(rest)
    }

    /// Whether text is being held back (an unfinished character).
    pub fn has_pending(&self) -> bool {
        self.ids.len() > self.prefix_len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_stream_is_shareable_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<DecodeStream>();
    }
}
