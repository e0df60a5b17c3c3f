//! A chat choice's text, split into what the API reports apart: reasoning
//! (`reasoning_content`), the answer (`content`) and tool calls
//! (`tool_calls`).
//!
//! An [`OutputPlan`] is made once per request (from the served model's
//! parsers and the request's tools); each choice gets a [`ChoiceOutput`],
//! fed the detokenized text as it streams. Requests with neither reasoning
//! nor tools have no plan and take the plain path (text is content).
//!
//! The reasoning splitter runs first; its content goes to the tool-call
//! parser: the model's own syntax for `tool_choice: auto`, or, for the
//! constrained choices, the whole content held to the end and read as JSON
//! (see `tools`).

use super::tools::{constrained_calls, ToolChoice};
use crate::text::reasoning::{ReasoningFormat, ReasoningPiece, ReasoningSplitter};
use crate::text::tool_calls::{ToolCallFormat, ToolCallStream, ToolPiece};

/// The syntaxes the served model writes reasoning and tool calls in
/// (`--reasoning-parser`, `--tool-call-parser`, or detected from the model).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutputParsers {
    /// `None`: the text is all content.
    pub reasoning: Option<ReasoningFormat>,
    /// `None`: `tool_choice: auto` output is not parsed for calls (the
    /// constrained choices still work).
    pub tool_calls: Option<ToolCallFormat>,
}

impl OutputParsers {
    /// What a chat template (and the architecture) implies.
    pub fn detect(template: Option<&str>, architecture: &str) -> Self {
        Self {
            reasoning: template.and_then(ReasoningFormat::detect),
            tool_calls: ToolCallFormat::detect(template, architecture),
        }
    }
}

/// How a request's choices are split.
#[derive(Clone, Debug, PartialEq)]
pub struct OutputPlan {
    /// The rendered prompt, when the model's reasoning is split off.
    pub reasoning_prompt: Option<String>,
    pub tools: ToolPlan,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ToolPlan {
    None,
    /// Parse the model's own syntax.
    Native(ToolCallFormat),
    /// The output is constrained JSON (`required` or a named function).
    Constrained(ToolChoice),
}

impl OutputPlan {
    /// The plan for a chat request, or `None` when its output is plain text.
    pub fn new(
        reasoning: Option<ReasoningFormat>,
        prompt: &str,
        tool_choice: Option<&ToolChoice>,
        tool_format: Option<ToolCallFormat>,
    ) -> Option<Self> {
        let tools = match tool_choice {
            None | Some(ToolChoice::None) => ToolPlan::None,
            Some(ToolChoice::Auto) => tool_format.map_or(ToolPlan::None, ToolPlan::Native),
            Some(choice) => ToolPlan::Constrained(choice.clone()),
        };
        let reasoning_prompt = reasoning.map(|_| prompt.to_owned());
        (reasoning_prompt.is_some() || tools != ToolPlan::None).then_some(Self { reasoning_prompt, tools })
    }
}

/// One piece of a choice's output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OutputDelta {
    Reasoning(String),
    Content(String),
    ToolCall(ToolCallOut),
}

/// A complete tool call, as the API reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCallOut {
    /// Its position among the choice's calls (`delta.tool_calls[].index`).
    pub index: usize,
    pub id: String,
    pub name: String,
    /// JSON text.
    pub arguments: String,
}

enum ToolState {
    None,
    Native(ToolCallStream),
    /// Content held until the end.
    Constrained {
        choice: ToolChoice,
        held: String,
    },
}

/// One choice's output splitter.
pub struct ChoiceOutput {
    reasoning: Option<ReasoningSplitter>,
    tools: ToolState,
    num_calls: usize,
}

impl ChoiceOutput {
    pub fn new(plan: &OutputPlan) -> Self {
        let tools = match &plan.tools {
            ToolPlan::None => ToolState::None,
            ToolPlan::Native(format) => ToolState::Native(ToolCallStream::new(*format)),
            ToolPlan::Constrained(choice) => ToolState::Constrained { choice: choice.clone(), held: String::new() },
        };
        Self { reasoning: plan.reasoning_prompt.as_deref().map(ReasoningSplitter::new), tools, num_calls: 0 }
    }

    /// The deltas a new piece of text completes.
    pub fn push(&mut self, text: &str) -> Vec<OutputDelta> {
        let pieces = match &mut self.reasoning {
            Some(r) => r.push(text),
            None => vec![ReasoningPiece::Content(text.to_owned())],
        };
        self.route(pieces, false)
    }

    /// The rest, at the end of the choice.
    pub fn finish(&mut self) -> Vec<OutputDelta> {
        let pieces = self.reasoning.as_mut().map(ReasoningSplitter::finish).unwrap_or_default();
        self.route(pieces, true)
    }

    /// Whether the choice made tool calls (its `finish_reason` is then
    /// `tool_calls`).
    pub fn has_tool_calls(&self) -> bool {
        self.num_calls > 0
    }

    fn route(&mut self, pieces: Vec<ReasoningPiece>, last: bool) -> Vec<OutputDelta> {
        let mut out = Vec::new();
        for piece in pieces {
            match piece {
                ReasoningPiece::Reasoning(t) => out.push(OutputDelta::Reasoning(t)),
                ReasoningPiece::Content(t) => self.content(&t, &mut out),
            }
        }
        if last {
            self.finish_tools(&mut out);
        }
        out
    }

    fn content(&mut self, text: &str, out: &mut Vec<OutputDelta>) {
        match &mut self.tools {
            ToolState::None => out.push(OutputDelta::Content(text.to_owned())),
            ToolState::Native(stream) => {
                let pieces = stream.push(text);
                self.tool_pieces(pieces, out);
            }
            ToolState::Constrained { held, .. } => held.push_str(text),
        }
    }

    fn finish_tools(&mut self, out: &mut Vec<OutputDelta>) {
        match &mut self.tools {
            ToolState::None => {}
            ToolState::Native(stream) => {
                let pieces = stream.finish();
                self.tool_pieces(pieces, out);
            }
            ToolState::Constrained { choice, held } => {
                let held = std::mem::take(held);
                match constrained_calls(choice, &held) {
                    Some(calls) => {
                        for (name, arguments) in calls {
                            out.push(self.call(name, arguments));
                        }
                    }
                    // Cut by the length limit: what there is, as content.
                    None if !held.is_empty() => out.push(OutputDelta::Content(held)),
                    None => {}
                }
            }
        }
    }

    fn tool_pieces(&mut self, pieces: Vec<ToolPiece>, out: &mut Vec<OutputDelta>) {
        for p in pieces {
            match p {
                ToolPiece::Text(t) => out.push(OutputDelta::Content(t)),
                ToolPiece::Call(c) => out.push(self.call(c.name, c.arguments)),
            }
        }
    }

    fn call(&mut self, name: String, arguments: String) -> OutputDelta {
        let index = self.num_calls;
        self.num_calls += 1;
        let id = format!("call_{:024x}", rand::random::<u128>() >> 32);
        OutputDelta::ToolCall(ToolCallOut { index, id, name, arguments })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(plan: &OutputPlan, pieces: &[&str]) -> (Vec<OutputDelta>, bool) {
        let mut c = ChoiceOutput::new(plan);
        let mut out: Vec<OutputDelta> = pieces.iter().flat_map(|p| c.push(p)).collect();
        out.extend(c.finish());
        (out, c.has_tool_calls())
    }

    #[test]
    fn reasoning_then_a_native_call() {
        let plan =
            OutputPlan::new(Some(ReasoningFormat::Qwen3), "", Some(&ToolChoice::Auto), Some(ToolCallFormat::Hermes))
                .unwrap();
        let (out, calls) = run(
            &plan,
            &["<think>need weather</think>\n", "<tool_call>\n{\"name\": \"w\", ", "\"arguments\": {}}\n</tool_call>"],
        );
        assert!(calls);
        assert_eq!(out[0], OutputDelta::Reasoning("need weather".into()));
        let OutputDelta::ToolCall(c) = &out[1] else { panic!("{out:?}") };
        assert_eq!((c.index, c.name.as_str(), c.arguments.as_str()), (0, "w", "{}"));
        assert!(c.id.starts_with("call_") && c.id.len() == 29);
    }

    #[test]
    fn constrained_output_is_read_at_the_end() {
        let plan = OutputPlan::new(None, "", Some(&ToolChoice::Required), None).unwrap();
        let (out, calls) = run(&plan, &["[{\"name\": \"f\", ", "\"parameters\": {\"x\": 2}}]"]);
        assert!(calls);
        assert!(matches!(&out[..], [OutputDelta::ToolCall(c)] if c.arguments == r#"{"x":2}"#));
        assert!(OutputPlan::new(None, "", Some(&ToolChoice::Auto), None).is_none());
    }
}
