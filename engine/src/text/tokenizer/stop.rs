//! Stop strings over streamed text.
//!
//! A stop string can span token boundaries (`"###"` arriving as `"#"` then
//! `"##"`), and once text is sent to a client it cannot be taken back. So
//! [`StopMatcher`] holds back the longest tail of the text that is still the
//! beginning of some stop string, and releases it once it no longer can be.
//! On a match it returns the text before the stop string and nothing after.
//!
//! The result does not depend on how the text is cut into pieces: it is the
//! same as checking after every character, i.e. the stop string that is
//! completed first wins (the longest one if several complete at the same
//! character).

/// What [`StopMatcher::push`] decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopOutcome {
    /// No stop string yet; this text is safe to send (possibly empty, while
    /// a possible stop string is held back).
    Continue(String),
    /// A stop string was found: send this text (what preceded the stop
    /// string) and end the request.
    Stopped(StopMatch),
}

/// A completed stop string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StopMatch {
    /// The last text to send, the stop string excluded.
    pub text: String,
    /// Index of the matched string in the list given to [`StopMatcher::new`].
    pub stop_idx: usize,
}

/// Per-request stop-string detector over a stream of text pieces.
#[derive(Clone, Debug)]
pub struct StopMatcher {
    /// The stop strings as given (empty ones never match).
    stops: Vec<String>,
    /// Text received but not yet released.
    pending: String,
    stopped: bool,
}

impl StopMatcher {
    pub fn new<S: Into<String>>(stops: impl IntoIterator<Item = S>) -> Self {
        Self { stops: stops.into_iter().map(Into::into).collect(), pending: String::new(), stopped: false }
    }

    /// Adds the next piece of generated text.
    ///
    /// After a stop, further pieces are ignored and yield an empty
    /// [`StopOutcome::Continue`].
    pub fn push(&mut self, piece: &str) -> StopOutcome {
        if self.stopped {
            return StopOutcome::Continue(String::new());
        }
        self.pending.push_str(piece);
        if let Some((start, stop_idx)) = self.first_completed_stop() {
            self.stopped = true;
            let mut text = std::mem::take(&mut self.pending);
            text.truncate(start);
            return StopOutcome::Stopped(StopMatch { text, stop_idx });
        }
        let held = self.longest_partial_stop_suffix();
        let release = self.pending.len() - held;
        let text = self.pending[..release].to_owned();
        self.pending.drain(..release);
        StopOutcome::Continue(text)
    }

    /// Ends the stream without a stop string: releases the held-back text.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Whether a stop string has been matched.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// The (start, index) of the stop string whose match ends first in
    /// `pending`; on a tie the one starting first (the longest).
    fn first_completed_stop(&self) -> Option<(usize, usize)> {
        self.stops
            .iter()
            .enumerate()
            .filter(|(_, stop)| !stop.is_empty())
            .filter_map(|(idx, stop)| self.pending.find(stop.as_str()).map(|start| (start + stop.len(), start, idx)))
            .min()
            .map(|(_, start, idx)| (start, idx))
    }

    /// Length in bytes of the longest suffix of `pending` that is a proper
    /// prefix of some stop string (and so might still become a match).
    fn longest_partial_stop_suffix(&self) -> usize {
        let max_len = self.stops.iter().map(String::len).max().unwrap_or(0);
        let limit = max_len.saturating_sub(1).min(self.pending.len());
        (1..=limit)
            .rev()
            .filter(|&len| self.pending.is_char_boundary(self.pending.len() - len))
            .find(|&len| {
                let suffix = &self.pending[self.pending.len() - len..];
                self.stops.iter().any(|stop| stop.len() > len && stop.starts_with(suffix))
            })
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces`, returning everything released and the stop (if any).
    fn run(stops: &[&str], pieces: &[&str]) -> (String, Option<usize>) {
        let mut m = StopMatcher::new(stops.iter().copied());
        let mut out = String::new();
        for piece in pieces {
            match m.push(piece) {
                StopOutcome::Continue(text) => out.push_str(&text),
                StopOutcome::Stopped(hit) => {
                    out.push_str(&hit.text);
                    return (out, Some(hit.stop_idx));
                }
            }
        }
        out.push_str(&m.finish());
        (out, None)
    }

    #[test]
    fn stop_across_pieces_is_never_released() {
        let mut m = StopMatcher::new(["###"]);
        assert_eq!(m.push("ab#"), StopOutcome::Continue("ab".into()));
        assert_eq!(m.push("#"), StopOutcome::Continue(String::new()));
        assert_eq!(m.push("#tail"), StopOutcome::Stopped(StopMatch { text: String::new(), stop_idx: 0 }));
        assert!(m.is_stopped());
        assert_eq!(m.push("more"), StopOutcome::Continue(String::new()));
    }

    #[test]
    fn held_text_is_released_when_it_cannot_match() {
        let mut m = StopMatcher::new(["</s>"]);
        assert_eq!(m.push("a</"), StopOutcome::Continue("a".into()));
        assert_eq!(m.push("x"), StopOutcome::Continue("</x".into()));
        assert_eq!(m.push("<"), StopOutcome::Continue(String::new()));
        assert_eq!(m.finish(), "<");
    }

    #[test]
    fn first_completed_stop_wins() {
        assert_eq!(run(&["abc", "b"], &["xabc"]), ("xa".into(), Some(1)));
        assert_eq!(run(&["a", "ab"], &["xab"]), ("x".into(), Some(0)));
        assert_eq!(run(&["a", "ab"], &["x", "a", "b"]), ("x".into(), Some(0)));
        assert_eq!(run(&["", "zz"], &["abc"]), ("abc".into(), None));
        assert_eq!(run(&[], &["abc", "def"]), ("abcdef".into(), None));
    }

    #[test]
    fn multibyte_text_splits_on_char_boundaries() {
        assert_eq!(run(&["日本語"], &["こんにちは日", "本", "人"]), ("こんにちは日本人".into(), None));
        assert_eq!(run(&["日本語"], &["こ日", "本", "語!"]), ("こ".into(), Some(0)));
        assert_eq!(run(&["é!"], &["café", "?"]), ("café?".into(), None));
    }

    #[test]
    fn result_does_not_depend_on_piece_boundaries() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let alphabet = ['a', 'b', 'c', '#', 'é', '日'];
        let stops = ["ab#", "##", "c日é", "bbb"];
        for _ in 0..2000 {
            let len = rng.gen_range(0..24);
            let text: String = (0..len).map(|_| alphabet[rng.gen_range(0..alphabet.len())]).collect();
            let whole = run(&stops, &[&text]);
            // Reference: check after every character.
            let chars: Vec<String> = text.chars().map(String::from).collect();
            let char_refs: Vec<&str> = chars.iter().map(String::as_str).collect();
            assert_eq!(run(&stops, &char_refs), whole, "{text:?}");
            // Random cuts.
            let mut pieces = Vec::new();
            let mut rest = text.as_str();
            while !rest.is_empty() {
                let n = rng.gen_range(1..=rest.chars().count());
                let cut = rest.char_indices().nth(n).map_or(rest.len(), |(i, _)| i);
                pieces.push(&rest[..cut]);
                rest = &rest[cut..];
            }
            assert_eq!(run(&stops, &pieces), whole, "{text:?} as {pieces:?}");
            if let (out, Some(idx)) = &whole {
                assert!(text.starts_with(out.as_str()));
                assert!(text[out.len()..].starts_with(stops[*idx]));
                assert!(!stops.iter().any(|s| out.contains(s)));
            } else {
                assert_eq!(whole.0, text);
            }
        }
    }
}
