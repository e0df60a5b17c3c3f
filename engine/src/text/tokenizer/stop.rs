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
//!
//! The strings of a request are compiled once into one Aho-Corasick automaton
//! ([`StopStrings`], shared by the request's choices), and each matcher keeps
//! only its state in it: a piece of text costs one transition per byte,
//! whatever the number of stop strings, and the held-back tail is the
//! automaton state's depth (the longest suffix that begins a stop string), so
//! no step rescans old text.

use std::collections::HashMap;
use std::sync::Arc;

use aho_corasick::automaton::{Automaton, StateID};
use aho_corasick::nfa::noncontiguous::NFA;
use aho_corasick::{Anchored, MatchKind};

/// Why a set of stop strings could not be compiled (only when they exceed
/// the automaton's limits, far beyond what a request may send).
#[derive(Debug, thiserror::Error)]
#[error("cannot compile the stop strings: {0}")]
pub struct StopStringsError(String);

/// A request's stop strings, compiled once. Cheap to clone (shared).
#[derive(Clone, Debug)]
pub struct StopStrings(Option<Arc<Compiled>>);

#[derive(Debug)]
struct Compiled {
    nfa: NFA,
    /// Unanchored start state.
    start: StateID,
    /// Depth of every trie state: the length in bytes of the stop-string
    /// prefix it stands for.
    depth: HashMap<StateID, usize>,
    /// Index in the caller's list of each compiled pattern (empty strings
    /// are left out of the automaton).
    index: Vec<usize>,
}

impl StopStrings {
    /// No stop strings.
    pub fn none() -> Self {
        Self(None)
    }

    /// Compiles `stops` (empty strings never match). Indices in
    /// [`StopMatch::stop_idx`] refer to this list.
    pub fn new<S: AsRef<str>>(stops: impl IntoIterator<Item = S>) -> Result<Self, StopStringsError> {
        let mut patterns = Vec::new();
        let mut index = Vec::new();
        for (i, stop) in stops.into_iter().enumerate() {
            if !stop.as_ref().is_empty() {
                patterns.push(stop.as_ref().as_bytes().to_vec());
                index.push(i);
            }
        }
        if patterns.is_empty() {
            return Ok(Self::none());
        }
        let nfa = NFA::builder()
            .match_kind(MatchKind::Standard)
            .build(&patterns)
            .map_err(|e| StopStringsError(e.to_string()))?;
        let start = nfa.start_state(Anchored::No).map_err(|e| StopStringsError(e.to_string()))?;
        let anchored = nfa.start_state(Anchored::Yes).map_err(|e| StopStringsError(e.to_string()))?;
        // Walking each pattern from the anchored start follows trie edges
        // only, so the state after `i` bytes is the trie node of depth `i`;
        // these are the same states an unanchored search lands in.
        let mut depth = HashMap::from([(start, 0), (anchored, 0)]);
        for pattern in &patterns {
            let mut sid = anchored;
            for (i, &b) in pattern.iter().enumerate() {
                sid = nfa.next_state(Anchored::Yes, sid, b);
                depth.insert(sid, i + 1);
            }
        }
        Ok(Self(Some(Arc::new(Compiled { nfa, start, depth, index }))))
    }

    /// Number of (non-empty) stop strings.
    pub fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |c| c.index.len())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }
}

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
    /// Index of the matched string in the list given to [`StopStrings::new`].
    pub stop_idx: usize,
}

/// Per-request stop-string detector over a stream of text pieces.
#[derive(Clone, Debug)]
pub struct StopMatcher {
    stops: StopStrings,
    /// The automaton state after every byte received so far.
    state: Option<StateID>,
    /// Text received but not yet released: exactly the stop-string prefix
    /// that the state stands for, so never longer than the longest stop string.
    pending: String,
    stopped: bool,
}

impl StopMatcher {
    pub fn new(stops: StopStrings) -> Self {
        let state = stops.0.as_ref().map(|c| c.start);
        Self { stops, state, pending: String::new(), stopped: false }
    }

    /// Adds the next piece of generated text.
    ///
    /// After a stop, further pieces are ignored and yield an empty
    /// [`StopOutcome::Continue`].
    pub fn push(&mut self, piece: &str) -> StopOutcome {
        if self.stopped {
            return StopOutcome::Continue(String::new());
        }
        let (Some(compiled), Some(mut sid)) = (self.stops.0.as_deref(), self.state) else {
            return StopOutcome::Continue(piece.to_owned());
        };
        let nfa = &compiled.nfa;
        for (i, &b) in piece.as_bytes().iter().enumerate() {
            sid = nfa.next_state(Anchored::No, sid, b);
            if nfa.is_match(sid) {
                // Every stop string ending here; the longest starts first.
                let Some(pid) =
                    (0..nfa.match_len(sid)).map(|k| nfa.match_pattern(sid, k)).max_by_key(|&p| nfa.pattern_len(p))
                else {
                    continue;
                };
                self.stopped = true;
                let mut text = std::mem::take(&mut self.pending);
                text.push_str(&piece[..=i]);
                // The match began inside the held-back text or this piece
                // (the held text is the longest possible start).
                text.truncate(text.len().saturating_sub(nfa.pattern_len(pid)));
                let stop_idx = compiled.index.get(pid.as_usize()).copied().unwrap_or(0);
                return StopOutcome::Stopped(StopMatch { text, stop_idx });
            }
        }
        self.state = Some(sid);
        self.pending.push_str(piece);
        let held = compiled.depth.get(&sid).copied().unwrap_or(0).min(self.pending.len());
        let mut release = self.pending.len() - held;
        // A stop string starts with a whole character, so this is already a
        // boundary; stepping back keeps it one whatever happens.
        while !self.pending.is_char_boundary(release) {
            release -= 1;
        }
        let rest = self.pending.split_off(release);
        StopOutcome::Continue(std::mem::replace(&mut self.pending, rest))
    }

    /// Ends the stream without a stop string: releases the held-back text.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Whether a stop string has been matched.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces`, returning everything released and the stop (if any).
    fn run(stops: &[&str], pieces: &[&str]) -> (String, Option<usize>) {
        let mut m = StopMatcher::new(StopStrings::new(stops).unwrap());
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
        let mut m = StopMatcher::new(StopStrings::new(["###"]).unwrap());
        assert_eq!(m.push("ab#"), StopOutcome::Continue("ab".into()));
        assert_eq!(m.push("#"), StopOutcome::Continue(String::new()));
        assert_eq!(m.push("#tail"), StopOutcome::Stopped(StopMatch { text: String::new(), stop_idx: 0 }));
        assert!(m.is_stopped());
        assert_eq!(m.push("more"), StopOutcome::Continue(String::new()));
    }

    #[test]
    fn held_text_is_released_when_it_cannot_match() {
        let mut m = StopMatcher::new(StopStrings::new(["</s>"]).unwrap());
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

#[cfg(test)]
mod cost {
    use super::*;

    /// Many long stop strings cost one automaton step per byte of new text:
    /// 2,000 pieces against 64 stop strings of 1 KiB (the request limits)
    /// stay fast, even with a long prefix of every string held back all the
    /// time (the old matcher searched every string in the pending text per
    /// piece).
    #[test]
    fn many_long_stop_strings_are_cheap_per_piece() {
        let stops: Vec<String> = (0..64).map(|i| format!("{}{i:04}", "x".repeat(1020))).collect();
        let set = StopStrings::new(&stops).unwrap();
        let start = std::time::Instant::now();
        let mut m = StopMatcher::new(set);
        let mut out = String::new();
        for _ in 0..2000 {
            match m.push("xxxxx") {
                StopOutcome::Continue(t) => out.push_str(&t),
                StopOutcome::Stopped(_) => panic!("no stop string matches"),
            }
        }
        out.push_str(&m.finish());
        assert_eq!(out.len(), 10_000);
        assert!(start.elapsed() < std::time::Duration::from_millis(500), "{:?}", start.elapsed());
    }
}
