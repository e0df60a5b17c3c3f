//! `minisgl generate`: offline generation through the engine.
//!
//! Prompts come from `--prompt` (repeatable), `--prompts-file` (one prompt per
//! line, or JSON lines with a `prompt` field), or `--random N` (random token ids,
//! for load tests). A model with a chat template gets each prompt as one user
//! message rendered by it (as `minisgl shell` and the server's chat route do);
//! `--raw` tokenizes the prompts as given, with no template and no special
//! tokens added, and `--chat` insists on the template (an error without one).
//! All prompts run together through the scheduler (continuous batching).
//! Greedy by default. Special tokens are left out of the printed text, and
//! each output is labelled with its prompt's number.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use rand::{Rng, SeedableRng};

use super::common::{EngineArgs, ModelArgs};
use super::tp::load_model_tp;
use crate::core::engine::GenerateRequest;
use crate::core::req::SamplingParams;
use crate::core::sampling::penalties::Penalties;
use crate::text::chat_template::{ChatTemplate, ModelChatConfig, RenderOptions};

/// Sampling options shared by `generate` and `bench`.
#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Most new tokens per prompt.
    #[arg(long, default_value_t = 32)]
    pub max_tokens: usize,
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long)]
    pub top_k: Option<usize>,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// Seed of the sampling streams (request i uses seed + i).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Generate past end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// > 1 discourages tokens already in the prompt or output.
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    /// Subtracted from a token's logit per earlier occurrence in the output.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// Subtracted from a token's logit once it occurred in the output.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f32,
}

impl SamplingArgs {
    /// The parameters of request `i`.
    pub fn params(&self, i: usize) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            seed: self.seed.map(|s| s.wrapping_add(i as u64)),
            max_tokens: self.max_tokens,
            stop_token_ids: std::sync::Arc::from([]),
            ignore_eos: self.ignore_eos,
            penalties: Penalties {
                repetition: self.repetition_penalty,
                frequency: self.frequency_penalty,
                presence: self.presence_penalty,
            },
            logprobs: None,
        }
    }
}

/// Arguments of `minisgl generate`.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub tp: super::tp::TpArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// A prompt (repeat for several).
    #[arg(long)]
    pub prompt: Vec<String>,
    /// A file of prompts: one per line, or JSON lines with a "prompt" field.
    #[arg(long)]
    pub prompts_file: Option<PathBuf>,
    /// This many prompts of random token ids (with --input-len).
    #[arg(long)]
    pub random: Option<usize>,
    /// Tokens per random prompt.
    #[arg(long, default_value_t = 128)]
    pub input_len: usize,
    /// Print one JSON object per prompt: prompt_ids, output_ids, text, finish_reason.
    #[arg(long)]
    pub json: bool,
    /// Render each prompt with the model's chat template (the default when it
    /// has one); an error when it has none.
    #[arg(long, conflicts_with = "raw")]
    pub chat: bool,
    /// Tokenize the prompts as given: no chat template, no special tokens.
    #[arg(long)]
    pub raw: bool,
    /// With `--model NAME` of a model `minisgl pull` knows, fetch it if it is
    /// not pulled yet.
    #[arg(long)]
    pub pull: bool,
}

fn read_prompts_file(path: &PathBuf) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut prompts = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        if line.trim_start().starts_with('{') {
            let v: serde_json::Value =
                serde_json::from_str(line).with_context(|| format!("{}:{}: invalid JSON", path.display(), n + 1))?;
            let p = v
                .get("prompt")
                .and_then(|p| p.as_str())
                .with_context(|| format!("{}:{}: no \"prompt\" string", path.display(), n + 1))?;
            prompts.push(p.to_owned());
        } else {
            prompts.push(line.to_owned());
        }
    }
    Ok(prompts)
}

/// The chat template to render prompts with, if any (`--chat`, `--raw`, or
/// the model's own when it has one).
fn prompt_template(args: &GenerateArgs, chat: &ModelChatConfig) -> anyhow::Result<Option<ChatTemplate>> {
    if args.raw {
        return Ok(None);
    }
    match &chat.chat_template {
        Some(source) => Ok(Some(ChatTemplate::new(source).context("the model's chat template")?)),
        None if args.chat => {
            anyhow::bail!("--chat: the model has no chat template (use --raw, or --chat-template FILE)")
        }
        None => Ok(None),
    }
}

/// Runs the command.
pub fn run(mut args: GenerateArgs) -> anyhow::Result<ExitCode> {
    args.model.model = super::common::resolve_model_path(&args.model.model, args.pull)?;
    let mut texts = args.prompt.clone();
    if let Some(path) = &args.prompts_file {
        texts.extend(read_prompts_file(path)?);
    }
    if texts.is_empty() && args.random.is_none() {
        anyhow::bail!("no prompts: give --prompt, --prompts-file or --random");
    }
    if args.tp.node_rank > 0 {
        return super::tp::run_node(&args.model, &args.engine, &args.tp);
    }
    let mut loaded = load_model_tp(&args.model, &args.engine, &args.tp)?;
    let template = prompt_template(&args, &loaded.chat)?;
    let mut prompts: Vec<Vec<u32>> = Vec::new();
    for t in &texts {
        let ids = match &template {
            Some(template) => {
                let opts = RenderOptions::new(true, loaded.chat.special_tokens.clone());
                let rendered = template
                    .render(&[serde_json::json!({"role": "user", "content": t})], &opts)
                    .with_context(|| format!("rendering the prompt {t:?} with the chat template"))?;
                loaded.tokenizer.encode(&rendered, false)?
            }
            None => loaded.tokenizer.encode(t, false)?,
        };
        if ids.is_empty() {
            anyhow::bail!("the prompt {t:?} encodes to no tokens");
        }
        prompts.push(ids);
    }
    if let Some(n) = args.random {
        let vocab = loaded.tokenizer.vocab_size().min(loaded.engine.runner().vocab_size()) as u32;
        let mut rng = rand::rngs::StdRng::seed_from_u64(args.sampling.seed.unwrap_or(0));
        for _ in 0..n {
            prompts.push((0..args.input_len.max(1)).map(|_| rng.gen_range(0..vocab)).collect());
            texts.push(String::new());
        }
    }
    let requests: Vec<GenerateRequest> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| GenerateRequest { prompt_ids: p.clone(), params: args.sampling.params(i) })
        .collect();
    let started = std::time::Instant::now();
    let outputs = loaded.engine.generate(requests)?;
    let elapsed = started.elapsed().as_secs_f64();
    let mut stdout = std::io::stdout().lock();
    for (i, ((prompt, out), prompt_text)) in prompts.iter().zip(&outputs).zip(&texts).enumerate() {
        let text = loaded.tokenizer.decode(&out.output_ids, true)?;
        if args.json {
            let obj = serde_json::json!({
                "prompt_ids": prompt,
                "output_ids": out.output_ids,
                "text": text,
                "finish_reason": out.finish_reason.to_string(),
            });
            writeln!(stdout, "{obj}")?;
        } else {
            let shown = if prompt_text.is_empty() {
                format!("({} random token ids)", prompt.len())
            } else {
                prompt_text.clone()
            };
            writeln!(stdout, "prompt {}: {shown}", i + 1)?;
            writeln!(stdout, "output {}: {}", i + 1, text.trim_end())?;
        }
    }
    let generated: usize = outputs.iter().map(|o| o.output_ids.len()).sum();
    eprintln!(
        "minisgl: {} prompts, {generated} tokens generated in {elapsed:.2}s ({:.1} tok/s)",
        outputs.len(),
        generated as f64 / elapsed.max(1e-9)
    );
    Ok(ExitCode::SUCCESS)
}
