//! The interactive chat behind `minisgl shell`.
//!
//! [`Shell`] keeps a conversation, renders it with the model's chat
//! template on every turn, runs the engine in the calling thread (one
//! request at a time, no server), and streams the reply token by token to
//! the output as the incremental detokenizer releases text. Commands:
//! `/reset` clears the history, `/exit` (or end of input) quits, `/help`
//! lists them. Piped stdin is read as any `BufRead` ([`Shell::run`]), with
//! no prompt, and status messages go to a separate writer (stderr), so that
//! piped output is exactly the replies, one per line. On a terminal
//! ([`Shell::run_terminal`]) lines are read with `rustyline`: line editing and
//! history (the Up arrow); Ctrl-C during a reply stops the reply (the shell
//! stays), Ctrl-C at the prompt clears the line, and a second Ctrl-C in a row
//! or Ctrl-D leaves.

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde_json::{json, Value as Json};

use crate::core::engine::{Engine, EngineError, GenerateRequest, ModelRunner};
use crate::core::req::{FinishReason, SamplingParams};
use crate::text::chat_template::{ChatTemplate, ChatTemplateError, ModelChatConfig, RenderOptions, SpecialTokens};
use crate::text::text_stream::TextStream;
use crate::text::tokenizer::{StopStrings, Tokenizer, TokenizerError};

#[derive(Debug, thiserror::Error)]
pub enum ShellError {
    #[error("the model has no chat template; use `minisgl generate` for plain completion")]
    NoChatTemplate,
    #[error(transparent)]
    Template(#[from] ChatTemplateError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("the conversation has {prompt_tokens} tokens and fills the model's context of {max_context_len}; /reset to start over")]
    ContextFull { prompt_tokens: usize, max_context_len: usize },
    #[error("cannot read input or write output")]
    Io(#[from] std::io::Error),
    #[error("cannot read the terminal")]
    Readline(#[from] rustyline::error::ReadlineError),
}

impl ShellError {
    /// Whether the shell can go on with the next message (the conversation
    /// is unchanged) rather than stop.
    fn is_recoverable(&self) -> bool {
        match self {
            ShellError::Template(_) | ShellError::ContextFull { .. } => true,
            ShellError::Engine(e) => {
                matches!(e, EngineError::InvalidRequest { .. } | EngineError::TooLong { .. })
            }
            _ => false,
        }
    }
}

/// Shell settings. No `Default`: the command line decides.
#[derive(Clone, Debug, PartialEq)]
pub struct ShellConfig {
    /// Sampling of every reply; `max_tokens` is capped by the room left in
    /// the context.
    pub params: SamplingParams,
    /// A system message put before the conversation (kept across `/reset`).
    pub system: Option<String>,
}

/// A finished reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub text: String,
    pub reason: FinishReason,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}

/// A chat session over an engine.
pub struct Shell<R> {
    engine: Engine<R>,
    tokenizer: Tokenizer,
    template: ChatTemplate,
    special_tokens: SpecialTokens,
    config: ShellConfig,
    /// The conversation so far: user and assistant messages, alternating.
    history: Vec<Json>,
    /// Set (by a Ctrl-C handler) to stop the reply being generated.
    interrupt: Arc<AtomicBool>,
}

/// What the loop does after a line.
enum Flow {
    Continue,
    Exit,
}

impl<R: ModelRunner> Shell<R> {
    pub fn new(
        engine: Engine<R>,
        tokenizer: Tokenizer,
        chat: ModelChatConfig,
        config: ShellConfig,
    ) -> Result<Self, ShellError> {
        let source = chat.chat_template.ok_or(ShellError::NoChatTemplate)?;
        Ok(Self {
            engine,
            tokenizer,
            template: ChatTemplate::new(&source)?,
            special_tokens: chat.special_tokens,
            config,
            history: Vec::new(),
            interrupt: Arc::new(AtomicBool::new(false)),
        })
    }

    /// The flag that stops the current reply when set: a Ctrl-C handler sets
    /// it; the shell clears it before each reply.
    pub fn interrupt_flag(&self) -> Arc<AtomicBool> {
        self.interrupt.clone()
    }

    pub fn history(&self) -> &[Json] {
        &self.history
    }

    pub fn engine(&self) -> &Engine<R> {
        &self.engine
    }

    pub fn reset(&mut self) {
        self.history.clear();
    }

    /// The messages the template sees for the next turn, ending with
    /// `user_message`.
    pub fn conversation(&self, user_message: &str) -> Vec<Json> {
        let mut messages = Vec::with_capacity(self.history.len() + 2);
        if let Some(system) = &self.config.system {
            messages.push(json!({"role": "system", "content": system}));
        }
        messages.extend(self.history.iter().cloned());
        messages.push(json!({"role": "user", "content": user_message}));
        messages
    }

    /// The prompt ids for the next turn.
    pub fn prompt_ids(&self, user_message: &str) -> Result<Vec<u32>, ShellError> {
        let opts = RenderOptions::new(true, self.special_tokens.clone());
        let prompt = self.template.render(&self.conversation(user_message), &opts)?;
        Ok(self.tokenizer.encode(&prompt, false)?)
    }

    /// Sends a user message, streams the reply to `out` as it is generated,
    /// and adds both to the history. On error the history is unchanged.
    pub fn ask(&mut self, user_message: &str, out: &mut dyn Write) -> Result<Reply, ShellError> {
        let prompt_ids = self.prompt_ids(user_message)?;
        let prompt_tokens = prompt_ids.len();
        let max_context_len = self.engine.runner().max_context_len();
        let room = max_context_len.saturating_sub(prompt_tokens);
        if room == 0 {
            return Err(ShellError::ContextFull { prompt_tokens, max_context_len });
        }
        let mut params = self.config.params.clone();
        params.max_tokens = params.max_tokens.min(room);
        let id = self.engine.add_request(GenerateRequest { prompt_ids, params })?;
        self.interrupt.store(false, Ordering::SeqCst);

        let mut stream = TextStream::new(StopStrings::none(), true);
        let mut text = String::new();
        let finished = 'run: loop {
            if self.interrupt.swap(false, Ordering::SeqCst) {
                // Ctrl-C: the reply so far stays in the conversation, as in
                // a chat app's "stop".
                if let Some(finished) = self.engine.finish(id, FinishReason::Abort) {
                    out.write_all(b" [stopped]")?;
                    break 'run finished;
                }
            }
            let events = match self.engine.step() {
                Ok(events) => events,
                Err(err) => {
                    self.engine.abort(id);
                    return Err(err.into());
                }
            };
            if events.is_empty() && !self.engine.has_work() {
                // NOTE: cannot happen (a request runs until it finishes);
                // guards the loop against a scheduler bug.
                return Err(ShellError::Engine(EngineError::InvalidRequest {
                    field: "prompt_ids",
                    reason: "the engine dropped the request".into(),
                }));
            }
            for event in events.into_iter().filter(|e| e.id == id) {
                let mut delta = stream.push(&self.tokenizer, event.token)?;
                if let Some(finished) = event.finished {
                    if !delta.stopped {
                        delta.text.push_str(&stream.finish(&self.tokenizer)?.text);
                    }
                    emit(out, &mut text, &delta.text)?;
                    break 'run finished;
                }
                emit(out, &mut text, &delta.text)?;
            }
        };
        out.write_all(b"\n")?;
        out.flush()?;
        self.history.push(json!({"role": "user", "content": user_message}));
        self.history.push(json!({"role": "assistant", "content": text}));
        Ok(Reply { text, reason: finished.reason, prompt_tokens, completion_tokens: finished.output_ids.len() })
    }

    /// Runs the read-reply loop until `/exit` or the end of `input`.
    /// `interactive` prints a prompt before each line.
    pub fn run(
        &mut self,
        input: &mut dyn BufRead,
        out: &mut dyn Write,
        status: &mut dyn Write,
        interactive: bool,
    ) -> Result<(), ShellError> {
        if interactive {
            writeln!(status, "Chat with the model. /reset clears the conversation, /exit quits.")?;
        }
        let mut line = String::new();
        loop {
            if interactive {
                out.write_all(b">>> ")?;
                out.flush()?;
            }
            line.clear();
            if input.read_line(&mut line)? == 0 {
                if interactive {
                    out.write_all(b"\n")?;
                }
                return Ok(());
            }
            let message = line.trim_end_matches(['\n', '\r']);
            if let Flow::Exit = self.line(message, out, status)? {
                return Ok(());
            }
        }
    }

    /// The loop on a terminal: `editor` reads the lines (editing, history).
    /// The caller routes Ctrl-C during a reply to [`Shell::interrupt_flag`]
    /// (after creating the editor: rustyline installs a SIGINT handler of its
    /// own for the editor's lifetime, which would swallow it).
    pub fn run_terminal(
        &mut self,
        editor: &mut rustyline::DefaultEditor,
        out: &mut dyn Write,
        status: &mut dyn Write,
    ) -> Result<(), ShellError> {
        use rustyline::error::ReadlineError;
        writeln!(
            status,
            "Chat with the model. /reset clears the conversation, /exit or Ctrl-D quits; \
             Ctrl-C stops a reply, twice at the prompt quits."
        )?;
        let mut interrupted = false;
        loop {
            match editor.readline(">>> ") {
                Ok(line) => {
                    interrupted = false;
                    if !line.trim().is_empty() {
                        let _ = editor.add_history_entry(line.as_str());
                    }
                    if let Flow::Exit = self.line(&line, out, status)? {
                        return Ok(());
                    }
                }
                Err(ReadlineError::Interrupted) if !interrupted => {
                    interrupted = true;
                    writeln!(status, "(Ctrl-C again or Ctrl-D to quit)")?;
                }
                Err(ReadlineError::Interrupted | ReadlineError::Eof) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Handles one input line: a command or a message to the model.
    fn line(&mut self, message: &str, out: &mut dyn Write, status: &mut dyn Write) -> Result<Flow, ShellError> {
        match message.trim() {
            "" => return Ok(Flow::Continue),
            "/exit" | "/quit" => return Ok(Flow::Exit),
            "/reset" | "/clear" => {
                self.reset();
                writeln!(status, "(conversation cleared)")?;
                return Ok(Flow::Continue);
            }
            "/help" => {
                writeln!(status, "/reset clears the conversation, /exit quits; anything else is sent to the model")?;
                return Ok(Flow::Continue);
            }
            cmd if cmd.starts_with('/') && !cmd.contains(char::is_whitespace) => {
                writeln!(status, "unknown command {cmd} (try /help)")?;
                return Ok(Flow::Continue);
            }
            _ => {}
        }
        match self.ask(message, out) {
            Ok(_) => Ok(Flow::Continue),
            Err(err) if err.is_recoverable() => {
                writeln!(status, "error: {err}")?;
                Ok(Flow::Continue)
            }
            Err(err) => Err(err),
        }
    }
}

/// Writes a piece of the reply as soon as it exists.
fn emit(out: &mut dyn Write, text: &mut String, piece: &str) -> std::io::Result<()> {
    if piece.is_empty() {
        return Ok(());
    }
    text.push_str(piece);
    out.write_all(piece.as_bytes())?;
    out.flush()
}
