//! One request's output text: token ids in, text pieces out, stop strings cut.
//!
//! [`TextStream`] chains the two per-request layers of `crate::text::tokenizer`:
//! [`DecodeStream`] (ids to text that never splits a character) and
//! [`StopMatcher`] (stop strings across pieces, held-back text that may
//! start one). It has no async or HTTP in it, so the shell uses it too.

use crate::text::tokenizer::stream::DecodeStream;
use crate::text::tokenizer::{StopMatcher, StopOutcome, StopStrings, Tokenizer, TokenizerError};

/// What one token (or the end of the request) adds to the output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextDelta {
    /// Text safe to send (may be empty).
    pub text: String,
    /// A stop string was matched: the request must end now, with
    /// `finish_reason: "stop"`; `text` is what preceded the stop string.
    pub stopped: bool,
}

/// Per-request detokenizer and stop-string matcher.
#[derive(Clone, Debug)]
pub struct TextStream {
    decode: DecodeStream,
    stop: StopMatcher,
}

impl TextStream {
    pub fn new(stop: StopStrings, skip_special_tokens: bool) -> Self {
        Self { decode: DecodeStream::new(skip_special_tokens), stop: StopMatcher::new(stop) }
    }

    /// Feeds the next generated token. After a stop, returns empty deltas.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<TextDelta, TokenizerError> {
        if self.stop.is_stopped() {
            return Ok(self.stopped_delta());
        }
        let piece = self.decode.step(tokenizer, id)?;
        Ok(self.match_stop(&piece))
    }

    /// Ends the stream (the engine finished the request): releases the text
    /// still held back. A stop string can still complete here (in the last
    /// held bytes), in which case `stopped` is set.
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> Result<TextDelta, TokenizerError> {
        if self.stop.is_stopped() {
            return Ok(self.stopped_delta());
        }
        let rest = self.decode.finish(tokenizer)?;
        let mut delta = self.match_stop(&rest);
        if !delta.stopped {
            delta.text.push_str(&self.stop.finish());
        }
        Ok(delta)
    }

    fn match_stop(&mut self, piece: &str) -> TextDelta {
        match self.stop.push(piece) {
            StopOutcome::Continue(text) => TextDelta { text, stopped: false },
            StopOutcome::Stopped(m) => TextDelta { text: m.text, stopped: true },
        }
    }

    fn stopped_delta(&self) -> TextDelta {
        TextDelta { text: String::new(), stopped: true }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn tokenizer() -> Tokenizer {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/qwen3-tiny");
        Tokenizer::from_dir(&dir).unwrap()
    }

    fn run(stream: &mut TextStream, tok: &Tokenizer, ids: &[u32]) -> (String, bool) {
        let mut out = String::new();
        for &id in ids {
            let d = stream.push(tok, id).unwrap();
            out.push_str(&d.text);
            if d.stopped {
                return (out, true);
            }
        }
        let d = stream.finish(tok).unwrap();
        out.push_str(&d.text);
        (out, d.stopped)
    }

    #[test]
    fn pieces_concatenate_to_decode() {
        let tok = tokenizer();
        let ids = tok.encode("hello world, über straße!", false).unwrap();
        let (text, stopped) = run(&mut TextStream::new(StopStrings::none(), true), &tok, &ids);
        assert!(!stopped);
        assert_eq!(text, tok.decode(&ids, true).unwrap());
    }

    #[test]
    fn stop_string_cuts_output() {
        let tok = tokenizer();
        let ids = tok.encode("one two three four", false).unwrap();
        let (text, stopped) = run(&mut TextStream::new(StopStrings::new(["thr"]).unwrap(), true), &tok, &ids);
        assert!(stopped);
        assert_eq!(text, "one two ");
        // A stop string that never appears changes nothing.
        let (text, stopped) = run(&mut TextStream::new(StopStrings::new(["xyz"]).unwrap(), true), &tok, &ids);
        assert!(!stopped);
        assert_eq!(text, "one two three four");
    }
}
