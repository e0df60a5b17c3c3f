//! A thinking model's reasoning, split from its answer as the text streams
//! (vLLM's `reasoning_content`).
//!
//! Qwen3 (and DeepSeek-R1 style) models think between `<think>` and `</think>`
//! before they answer. [`ReasoningSplitter`] sends what is inside as
//! [`ReasoningPiece::Reasoning`] and the rest as [`ReasoningPiece::Content`].
//! The reasoning starts either in the output (the model writes `<think>`
//! first) or already in the prompt (templates that end the generation prompt
//! with `<think>`); output that does not open with `<think>` in the first case
//! is all content (`enable_thinking: false` renders an empty think block into
//! the prompt, so the model answers at once). Unclosed reasoning (the length
//! limit hit while thinking) stays reasoning.

use std::str::FromStr;

use crate::text::marker::partial_marker_len;

const THINK_START: &str = "<think>";
const THINK_END: &str = "</think>";

/// The reasoning syntaxes (`--reasoning-parser`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasoningFormat {
    /// `<think>...</think>` (Qwen3, QwQ, DeepSeek-R1).
    Qwen3,
}

impl ReasoningFormat {
    pub const NAMES: &'static [&'static str] = &["qwen3", "deepseek_r1"];

    /// The format a chat template's thinking syntax implies, if any.
    pub fn detect(template: &str) -> Option<Self> {
        (template.contains(THINK_START) && template.contains(THINK_END)).then_some(Self::Qwen3)
    }
}

impl FromStr for ReasoningFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "qwen3" | "deepseek_r1" => Ok(Self::Qwen3),
            _ => Err(format!("unknown reasoning parser `{s}`; expected one of {}", Self::NAMES.join(", "))),
        }
    }
}

/// A piece of output, reasoning or answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReasoningPiece {
    Reasoning(String),
    Content(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet: does the output open with `<think>`?
    Start,
    Reasoning,
    /// Just after `</think>`: whitespace before the answer is dropped.
    AfterReasoning,
    Content,
}

/// Splits one choice's output text, piece by piece.
#[derive(Clone, Debug)]
pub struct ReasoningSplitter {
    state: State,
    /// Text held back: it may be the start of a marker.
    pending: String,
}

impl ReasoningSplitter {
    /// `prompt` is the rendered prompt: when it ends inside an open `<think>`,
    /// the output starts as reasoning.
    pub fn new(prompt: &str) -> Self {
        let opened = prompt.rfind(THINK_START);
        let in_think = opened.is_some_and(|at| !prompt[at..].contains(THINK_END));
        Self { state: if in_think { State::Reasoning } else { State::Start }, pending: String::new() }
    }

    /// The pieces `text` completes (text that may begin a marker waits).
    pub fn push(&mut self, text: &str) -> Vec<ReasoningPiece> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Start => {
                    let trimmed = self.pending.trim_start();
                    if let Some(rest) = trimmed.strip_prefix(THINK_START) {
                        self.pending = rest.to_owned();
                        self.state = State::Reasoning;
                    } else if trimmed.is_empty() || THINK_START.starts_with(trimmed) {
                        return out;
                    } else {
                        self.state = State::Content;
                    }
                }
                State::Reasoning => {
                    if let Some(at) = self.pending.find(THINK_END) {
                        let reasoning: String = self.pending.drain(..at + THINK_END.len()).take(at).collect();
                        push_piece(&mut out, ReasoningPiece::Reasoning(reasoning));
                        self.state = State::AfterReasoning;
                    } else {
                        let keep = partial_marker_len(&self.pending, &[THINK_END]);
                        let ready: String = self.pending.drain(..self.pending.len() - keep).collect();
                        push_piece(&mut out, ReasoningPiece::Reasoning(ready));
                        return out;
                    }
                }
                State::AfterReasoning => {
                    let trimmed = self.pending.trim_start();
                    if trimmed.is_empty() {
                        self.pending.clear();
                        return out;
                    }
                    self.pending = trimmed.to_owned();
                    self.state = State::Content;
                }
                State::Content => {
                    push_piece(&mut out, ReasoningPiece::Content(std::mem::take(&mut self.pending)));
                    return out;
                }
            }
        }
    }

    /// The rest, at the end of the output.
    pub fn finish(&mut self) -> Vec<ReasoningPiece> {
        let rest = std::mem::take(&mut self.pending);
        let mut out = Vec::new();
        match self.state {
            State::Reasoning => push_piece(&mut out, ReasoningPiece::Reasoning(rest)),
            State::Start | State::Content => push_piece(&mut out, ReasoningPiece::Content(rest)),
            State::AfterReasoning => {}
        }
        out
    }
}

fn push_piece(out: &mut Vec<ReasoningPiece>, piece: ReasoningPiece) {
    let empty = match &piece {
        ReasoningPiece::Reasoning(t) | ReasoningPiece::Content(t) => t.is_empty(),
    };
    if !empty {
        out.push(piece);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `output` in pieces of `step` bytes (on char boundaries) and joins
    /// what comes out: (reasoning, content).
    fn split(prompt: &str, output: &str, step: usize) -> (String, String) {
        let mut s = ReasoningSplitter::new(prompt);
        let mut pieces = Vec::new();
        for piece in crate::text::marker::stream_pieces(output, step) {
            pieces.extend(s.push(piece));
        }
        pieces.extend(s.finish());
        let (mut reasoning, mut content) = (String::new(), String::new());
        for p in pieces {
            match p {
                ReasoningPiece::Reasoning(t) => reasoning.push_str(&t),
                ReasoningPiece::Content(t) => content.push_str(&t),
            }
        }
        (reasoning, content)
    }

    #[test]
    fn qwen3_output_splits_whatever_the_pieces() {
        let prompt = "<|im_start|>assistant\n";
        let output = "<think>\nThe user greets me. Be brief.\n</think>\n\nHello! ☺ How can I help?";
        for step in [1, 2, 3, 7, 100] {
            let (reasoning, content) = split(prompt, output, step);
            assert_eq!(reasoning, "\nThe user greets me. Be brief.\n", "step {step}");
            assert_eq!(content, "Hello! ☺ How can I help?", "step {step}");
        }
    }

    #[test]
    fn no_think_block_is_all_content() {
        // enable_thinking: false renders the empty block into the prompt.
        let prompt = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
        assert_eq!(split(prompt, "Just the answer <b>.", 2), (String::new(), "Just the answer <b>.".into()));
        assert_eq!(split("", "<thi", 1), (String::new(), "<thi".into()));
    }

    #[test]
    fn a_prompt_that_opens_the_block_starts_in_reasoning() {
        let prompt = "<|im_start|>assistant\n<think>\n";
        assert_eq!(split(prompt, "hmm </think>answer", 3), ("hmm ".into(), "answer".into()));
        // Cut off while thinking: all reasoning.
        assert_eq!(split(prompt, "hmm, let me </thi", 4), ("hmm, let me </thi".into(), String::new()));
    }

    #[test]
    fn names_and_detection() {
        assert_eq!("qwen3".parse::<ReasoningFormat>(), Ok(ReasoningFormat::Qwen3));
        assert!("o1".parse::<ReasoningFormat>().unwrap_err().contains("qwen3"));
        assert_eq!(ReasoningFormat::detect("{{ '<think>\\n\\n</think>' }}"), Some(ReasoningFormat::Qwen3));
        assert_eq!(ReasoningFormat::detect("{{ messages }}"), None);
    }
}
