//! `minisgl bench`: the mini-sglang offline throughput benchmark.
//!
//! `--num-requests` (256) requests of random token ids, input and output lengths
//! drawn uniformly from `[--min-len, --max-len]` ([100, 1024]) with `--seed` (0),
//! sampled at `--temperature` (0.6) with `ignore_eos`, all submitted at once.
//! Prints total tokens, wall time and throughput; works with `--load-format
//! dummy` to benchmark at real model sizes without weights.

use std::process::ExitCode;

use clap::Args;
use rand::{Rng, SeedableRng};

use super::common::{build_engine, load_causal_lm, load_tokenizer, EngineArgs, ModelArgs};
use crate::core::req::SamplingParams;
use crate::core::engine::GenerateRequest;

/// Arguments of `minisgl bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    #[arg(long, default_value_t = 256)]
    pub num_requests: usize,
    /// Shortest input and output length.
    #[arg(long, default_value_t = 100)]
    pub min_len: usize,
    /// Longest input and output length.
    #[arg(long, default_value_t = 1024)]
    pub max_len: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long, default_value_t = 0.6)]
    pub temperature: f32,
    /// Print the result as one JSON object too.
    #[arg(long)]
    pub json: bool,
}

/// Runs the command.
pub fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    if args.min_len == 0 || args.min_len > args.max_len {
        anyhow::bail!("--min-len must be in 1..=--max-len");
    }
    // The benchmark draws random token ids, so a config.json without tokenizer
    // files (a dummy-weight benchmark of a real architecture) is enough.
    let tokenizer = match load_tokenizer(&args.model.model) {
        Ok((t, _)) => Some(t),
        Err(e) if args.model.load_format == "dummy" => {
            eprintln!("minisgl: no tokenizer ({e:#}); drawing ids from the model's vocabulary");
            None
        }
        Err(e) => return Err(e),
    };
    let model = load_causal_lm(&args.model)?;
    let model_vocab = model.vocab_size();
    let vocab = tokenizer
        .as_ref()
        .map_or(model_vocab, |t| t.vocab_size().min(model_vocab))
        .max(1) as u32;
    let eos = tokenizer
        .as_ref()
        .map(|t| t.eos_token_ids().to_vec())
        .unwrap_or_default();
    let mut engine = build_engine(model, &args.engine, eos)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let requests: Vec<GenerateRequest> = (0..args.num_requests)
        .map(|i| {
            let input_len = rng.gen_range(args.min_len..=args.max_len);
            let output_len = rng.gen_range(args.min_len..=args.max_len);
            let prompt_ids = (0..input_len).map(|_| rng.gen_range(0..vocab)).collect();
            let mut params = SamplingParams::random(
                output_len,
                args.temperature,
                args.seed.wrapping_add(i as u64),
            );
            params.ignore_eos = true;
            GenerateRequest { prompt_ids, params }
        })
        .collect();
    let input_tokens: usize = requests.iter().map(|r| r.prompt_ids.len()).sum();
    // Warm up (kernel loading, allocator) outside the timed region.
    engine.generate(vec![GenerateRequest {
        prompt_ids: vec![1; 16],
        params: SamplingParams::greedy(4),
    }])?;
    let started = std::time::Instant::now();
    let outputs = engine.generate(requests)?;
    let elapsed = started.elapsed().as_secs_f64();
    let output_tokens: usize = outputs.iter().map(|o| o.output_ids.len()).sum();
    let stats = engine.stats();
    println!("requests:          {}", outputs.len());
    println!("input tokens:      {input_tokens}");
    println!("output tokens:     {output_tokens}");
    println!("total tokens:      {}", input_tokens + output_tokens);
    println!("time:              {elapsed:.2} s");
    println!(
        "output throughput: {:.1} tok/s",
        output_tokens as f64 / elapsed
    );
    println!(
        "total throughput:  {:.1} tok/s",
        (input_tokens + output_tokens) as f64 / elapsed
    );
    println!(
        "steps:             {} (preempted {})",
        stats.num_steps, stats.num_preempted
    );
    if args.json {
        let obj = serde_json::json!({
            "requests": outputs.len(), "input_tokens": input_tokens, "output_tokens": output_tokens,
            "seconds": elapsed, "output_tok_per_s": output_tokens as f64 / elapsed,
            "total_tok_per_s": (input_tokens + output_tokens) as f64 / elapsed,
        });
        println!("{obj}");
    }
    Ok(ExitCode::SUCCESS)
}
