//! `minisgl bench`: mini-sglang's offline throughput benchmark
//! (`benchmark/offline/bench.py`), draw for draw.
//!
//! The workload is the one bench.py draws with CPython's `random`
//! ([`py_random`]): `random.seed(--seed)`, then for each of `--num-requests`
//! (256) requests `randint(100, 1024)` prompt tokens of `randint(0, V - 1)`
//! each, then as many `randint(100, 1024)` output lengths (`max_tokens`).
//! `V` is the tokenizer's base vocabulary (transformers' `vocab_size`, added
//! tokens excluded), or `--vocab-size`, or config.json's `vocab_size` when a
//! dummy-weight run has no tokenizer. The requests sample at `--temperature`
//! (0.6) with `ignore_eos` and are submitted at once after a short warm-up.
//! While it runs, a progress bar on stderr (a line a second when stderr is
//! not a terminal) shows the finished requests and the throughput; at the end a
//! table gives the totals and throughput (output tokens, which `ignore_eos`
//! makes the sum of `max_tokens`, over the wall time, as bench.py reports).
//! Works with `--load-format dummy` to benchmark at real model sizes without
//! weights. `V` decides the whole draw (the lengths are drawn between the ids),
//! so a run meant to repeat mini-sglang's must draw with its `V`: with a
//! stand-in tokenizer, or with config.json alone (Qwen3's says 151,936), pass
//! `--vocab-size` (151,643 for Qwen3: 140,756 input and 148,643 output tokens).
//!
//! `--json-schema-fraction F` constrains that share of the requests (spread
//! evenly through the draw) to a JSON schema (`--schema FILE`, default
//! [`DEFAULT_SCHEMA`]: one long string, so a constrained request writes until
//! its `max_tokens` like the others), which measures what constrained decoding costs
//! a batch (issue 17: a quarter of the requests must cost at most 10%).

mod py_random;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;

use super::common::{build_engine, load_causal_lm, load_tokenizer, EngineArgs, ModelArgs};
use super::tp::build_tp_engine;
use crate::core::engine::GenerateRequest;
use crate::core::req::SamplingParams;
use crate::frontend::server::structured::{GrammarCompiler, GrammarSpec};
use py_random::PyRandom;

/// Arguments of `minisgl bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub tp: super::tp::TpArgs,
    #[arg(long, default_value_t = 256)]
    pub num_requests: usize,
    /// Shortest input and output length.
    #[arg(long, default_value_t = 100)]
    pub min_len: usize,
    /// Longest input and output length.
    #[arg(long, default_value_t = 1024)]
    pub max_len: usize,
    /// The seed of CPython's `random.seed`, as bench.py's `seed(0)`.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Token ids are drawn from `[0, V)` (default: the tokenizer's base
    /// vocabulary, else config.json's `vocab_size`).
    #[arg(long)]
    pub vocab_size: Option<usize>,
    #[arg(long, default_value_t = 0.6)]
    pub temperature: f32,
    /// Print the result as one JSON object too.
    #[arg(long)]
    pub json: bool,
    /// Share of the requests (0 to 1) constrained to a JSON schema.
    #[arg(long, default_value_t = 0.0)]
    pub json_schema_fraction: f64,
    /// The JSON schema of the constrained requests (default: a string no
    /// draw can finish, `DEFAULT_SCHEMA`).
    #[arg(long)]
    pub schema: Option<std::path::PathBuf>,
}

/// The schema of `--json-schema-fraction` without `--schema`: one JSON string
/// longer than any draw can write, so a constrained request runs to its
/// `max_tokens` like the others (a schema it could complete would end it early
/// and shrink the batch, which is not the cost being measured), with almost
/// every token allowed at every step (the dearest masks to compute).
pub const DEFAULT_SCHEMA: &str = r#"{"type": "string", "minLength": 200000}"#;

/// Whether request `i` of the draw is constrained: an even spread of
/// `fraction` of the requests.
fn constrained(i: usize, fraction: f64) -> bool {
    ((i + 1) as f64 * fraction).floor() > (i as f64 * fraction).floor()
}

/// bench.py's workload: each request's prompt ids and its `max_tokens`.
#[derive(Debug, PartialEq, Eq)]
pub struct Draw {
    pub prompts: Vec<Vec<u32>>,
    pub max_tokens: Vec<usize>,
}

/// Which draw to make; `vocab_size` is bench.py's `tokenizer.vocab_size`.
#[derive(Clone, Copy, Debug)]
pub struct DrawSpec {
    pub seed: u64,
    pub num_requests: usize,
    pub min_len: usize,
    pub max_len: usize,
    pub vocab_size: usize,
}

impl Draw {
    /// The draws of bench.py, in its order: all prompts (each length, then its
    /// ids), then all output lengths.
    pub fn new(spec: DrawSpec) -> Self {
        assert!(spec.vocab_size > 0 && spec.vocab_size <= 1 << 32);
        assert!(spec.min_len <= spec.max_len);
        let mut rng = PyRandom::seed(spec.seed);
        let (lo, hi) = (spec.min_len as u64, spec.max_len as u64);
        let top = spec.vocab_size as u64 - 1;
        let prompts = (0..spec.num_requests)
            .map(|_| {
                let len = rng.randint(lo, hi) as usize;
                (0..len).map(|_| rng.randint(0, top) as u32).collect()
            })
            .collect();
        let max_tokens = (0..spec.num_requests).map(|_| rng.randint(lo, hi) as usize).collect();
        Self { prompts, max_tokens }
    }

    pub fn input_tokens(&self) -> usize {
        self.prompts.iter().map(Vec::len).sum()
    }

    pub fn output_tokens(&self) -> usize {
        self.max_tokens.iter().sum()
    }
}

/// Runs the command.
pub fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    if args.min_len == 0 || args.min_len > args.max_len {
        anyhow::bail!("--min-len must be in 1..=--max-len");
    }
    if !(0.0..=1.0).contains(&args.json_schema_fraction) {
        anyhow::bail!("--json-schema-fraction must be in [0, 1]");
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
    if args.tp.node_rank > 0 {
        return super::tp::run_node(&args.model, &args.engine, &args.tp);
    }
    let eos = tokenizer.as_ref().map(|t| t.eos_token_ids().to_vec()).unwrap_or_default();
    let mut engine = if args.tp.enabled() {
        build_tp_engine(&args.model, &args.engine, &args.tp, eos)?.0
    } else {
        let model = load_causal_lm(&args.model, args.engine.max_model_len)?;
        build_engine(model, &args.engine, eos)?
    };
    let model_vocab = engine.runner().vocab_size();
    let (vocab_size, vocab_from) = match (args.vocab_size, &tokenizer) {
        (Some(v), _) => (v, "--vocab-size"),
        // transformers' `tokenizer.vocab_size`: the base vocabulary, without added tokens.
        (None, Some(t)) => (t.inner().get_vocab_size(false), "tokenizer"),
        (None, None) => (model_vocab, "config.json"),
    };
    if vocab_size == 0 {
        anyhow::bail!("--vocab-size must be at least 1");
    }
    // NOTE: an id at or past the model's vocab_size has no embedding row.
    if vocab_size > model_vocab {
        anyhow::bail!(
            "ids drawn below {vocab_size} ({vocab_from}) exceed the model's vocab_size of {model_vocab}; pass a smaller --vocab-size"
        );
    }
    let grammar_compiler = match (&tokenizer, args.json_schema_fraction > 0.0) {
        (_, false) => None,
        (None, true) => anyhow::bail!("--json-schema-fraction needs the model's tokenizer"),
        (Some(t), true) => Some(GrammarCompiler::new(t, model_vocab)),
    };
    let schema_text = match &args.schema {
        Some(path) => std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
        None => DEFAULT_SCHEMA.to_owned(),
    };

    let draw = Draw::new(DrawSpec {
        seed: args.seed,
        num_requests: args.num_requests,
        min_len: args.min_len,
        max_len: args.max_len,
        vocab_size,
    });
    let (input_tokens, drawn_output_tokens) = (draw.input_tokens(), draw.output_tokens());
    println!("seed:              {}", args.seed);
    println!("vocab size:        {vocab_size} ({vocab_from})");
    println!("drawn input:       {input_tokens} tokens");
    println!("drawn output:      {drawn_output_tokens} tokens");
    let requests: Vec<GenerateRequest> = draw
        .prompts
        .into_iter()
        .zip(draw.max_tokens)
        .enumerate()
        .map(|(i, (prompt_ids, max_tokens))| {
            let mut params = SamplingParams::random(max_tokens, args.temperature, args.seed.wrapping_add(i as u64));
            params.ignore_eos = true;
            GenerateRequest { prompt_ids, params }
        })
        .collect();
    let num_requests = requests.len();
    let num_constrained = (0..num_requests).filter(|&i| constrained(i, args.json_schema_fraction)).count();
    let mut grammars = match &grammar_compiler {
        Some(compiler) => {
            let schema: serde_json::Value = serde_json::from_str(&schema_text).context("the --schema file")?;
            compiler
                .compile(&GrammarSpec::JsonSchema(schema), "--schema", num_constrained.max(1))
                .map_err(|e| anyhow::anyhow!("{e}"))?
        }
        None => Vec::new(),
    }
    .into_iter();
    if num_constrained > 0 {
        println!("constrained:       {num_constrained} requests (JSON schema)");
    }

    // Warm up (kernel loading, allocator, the sampler) outside the timed region.
    engine.generate(vec![GenerateRequest {
        prompt_ids: vec![1; 16],
        params: SamplingParams::random(4, args.temperature, args.seed),
    }])?;
    let before = engine.stats();
    let steps_before = before.num_steps;

    let started = Instant::now();
    for (i, req) in requests.into_iter().enumerate() {
        let id = engine.add_request(req)?;
        if constrained(i, args.json_schema_fraction) {
            if let Some(grammar) = grammars.next() {
                engine.set_grammar(id, grammar);
            }
        }
    }
    let mut progress = Progress::new(num_requests, started);
    let mut profile = StepProfile::new(engine.overlap());
    while engine.has_work() {
        let step_started = Instant::now();
        let events = engine.step()?;
        let (rows, tokens) = engine.last_step_shape();
        profile.record(step_started.elapsed(), rows, tokens);
        progress.output_tokens += events.len();
        progress.finished += events.iter().filter(|e| e.finished.is_some()).count();
        progress.tick();
    }
    let elapsed = started.elapsed().as_secs_f64();
    if let Some(bar) = &progress.bar {
        bar.finish_and_clear();
    }
    let output_tokens = progress.output_tokens;
    let stats = engine.stats();
    if output_tokens != drawn_output_tokens {
        eprintln!(
            "minisgl: {output_tokens} tokens generated, not the {drawn_output_tokens} drawn (a request reached the context limit)"
        );
    }
    let total_tokens = input_tokens + output_tokens;
    println!("requests:          {}", progress.finished);
    println!("input tokens:      {input_tokens}");
    println!("output tokens:     {output_tokens}");
    println!("total tokens:      {total_tokens}");
    println!("time:              {elapsed:.2} s");
    println!("output throughput: {:.1} tok/s", output_tokens as f64 / elapsed);
    println!("total throughput:  {:.1} tok/s", total_tokens as f64 / elapsed);
    println!("steps:             {} (preempted {})", stats.num_steps - steps_before, stats.num_preempted);
    let (forward, host) = (stats.forward_time - before.forward_time, stats.host_time - before.host_time);
    println!(
        "engine time:       {:.2} s in the model runner (forward, sampling, waiting for the GPU), {:.2} s scheduling and bookkeeping",
        forward.as_secs_f64(),
        host.as_secs_f64()
    );
    for line in profile.lines() {
        println!("{line}");
    }
    if args.json {
        let obj = serde_json::json!({
            "requests": progress.finished, "seed": args.seed, "vocab_size": vocab_size,
            "input_tokens": input_tokens, "output_tokens": output_tokens,
            "seconds": elapsed, "output_tok_per_s": output_tokens as f64 / elapsed,
            "total_tok_per_s": total_tokens as f64 / elapsed,
            "steps": stats.num_steps - steps_before, "constrained": num_constrained,
        });
        println!("{obj}");
    }
    Ok(ExitCode::SUCCESS)
}

/// The progress shown about once a second while the timed run goes (issue
/// 11: a long benchmark used to print nothing): an `indicatif` bar on a
/// terminal, else a line on stderr.
struct Progress {
    num_requests: usize,
    finished: usize,
    output_tokens: usize,
    started: Instant,
    last_line: Instant,
    bar: Option<indicatif::ProgressBar>,
}

impl Progress {
    const EVERY: Duration = Duration::from_secs(1);

    fn new(num_requests: usize, started: Instant) -> Self {
        let bar = std::io::IsTerminal::is_terminal(&std::io::stderr()).then(|| {
            let bar = indicatif::ProgressBar::new(num_requests as u64);
            let style =
                indicatif::ProgressStyle::with_template("bench [{bar:30}] {pos}/{len} requests {elapsed} {msg}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                    .progress_chars("=> ");
            bar.set_style(style);
            bar
        });
        Self { num_requests, finished: 0, output_tokens: 0, started, last_line: started, bar }
    }

    fn tick(&mut self) {
        let now = Instant::now();
        if now.duration_since(self.last_line) < Self::EVERY {
            return;
        }
        self.last_line = now;
        let secs = now.duration_since(self.started).as_secs_f64();
        if let Some(bar) = &self.bar {
            bar.set_position(self.finished as u64);
            bar.set_message(format!(
                "{} output tokens, {:.1} tok/s",
                self.output_tokens,
                self.output_tokens as f64 / secs
            ));
            return;
        }
        eprintln!(
            "minisgl: bench {secs:.0}s: {}/{} requests, {} output tokens, {:.1} tok/s",
            self.finished,
            self.num_requests,
            self.output_tokens,
            self.output_tokens as f64 / secs
        );
    }
}

/// Where the timed run's wall time went, by kind of step: the steps that
/// prefilled (more tokens than rows) and the decode steps by batch size. A
/// call of `Engine::step` waits for the step launched by the call before it when
/// steps overlap (for its own step otherwise), so its wall time is booked to
/// that step.
struct StepProfile {
    overlap: bool,
    /// (rows, tokens) of the step the previous call launched.
    pending: Option<(usize, usize)>,
    /// Per bucket: steps, seconds, rows summed.
    buckets: [(u64, f64, u64); StepProfile::BUCKETS.len() + 1],
}

impl StepProfile {
    /// Upper bounds (rows) of the decode buckets; the last slot is prefill.
    const BUCKETS: [usize; 5] = [1, 16, 64, 128, usize::MAX];

    fn new(overlap: bool) -> Self {
        Self { overlap, pending: None, buckets: [(0, 0.0, 0); Self::BUCKETS.len() + 1] }
    }

    fn record(&mut self, wall: Duration, rows: usize, tokens: usize) {
        let booked = if self.overlap { self.pending.replace((rows, tokens)) } else { Some((rows, tokens)) };
        let Some((rows, tokens)) = booked else { return };
        let slot = if tokens > rows {
            Self::BUCKETS.len()
        } else {
            Self::BUCKETS.iter().position(|&hi| rows <= hi).unwrap_or(Self::BUCKETS.len() - 1)
        };
        let b = &mut self.buckets[slot];
        b.0 += 1;
        b.1 += wall.as_secs_f64();
        b.2 += rows as u64;
    }

    /// One line per non-empty bucket: steps, seconds, mean step time and rows.
    fn lines(&self) -> Vec<String> {
        let mut lo = 1;
        let mut out = Vec::new();
        for (i, &(steps, secs, rows)) in self.buckets.iter().enumerate() {
            let label = match Self::BUCKETS.get(i) {
                Some(&usize::MAX) => format!("decode {lo}+ rows"),
                Some(&hi) => format!("decode {lo}-{hi} rows"),
                None => "prefill steps".to_owned(),
            };
            if let Some(&hi) = Self::BUCKETS.get(i) {
                lo = hi.saturating_add(1);
            }
            if steps > 0 {
                out.push(format!(
                    "  {label:20} {steps:5} steps {secs:7.2} s ({:.3} ms a step, {:.0} rows on average)",
                    secs * 1e3 / steps as f64,
                    rows as f64 / steps as f64
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_step_profile_books_a_call_to_the_step_it_waited_for() {
        let ms = Duration::from_millis;
        let mut overlapped = StepProfile::new(true);
        overlapped.record(ms(5), 4, 400); // launches a prefill step, waits for nothing
        overlapped.record(ms(7), 4, 4); // waits for the prefill
        overlapped.record(ms(2), 3, 3); // waits for the 4-row decode step
        let lines = overlapped.lines();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].contains("decode 2-16 rows") && lines[0].contains("1 steps"), "{lines:?}");
        assert!(lines[0].contains("2.000 ms"), "{lines:?}");
        assert!(lines[1].contains("prefill steps") && lines[1].contains("7.000 ms"), "{lines:?}");
        let mut plain = StepProfile::new(false);
        plain.record(ms(3), 1, 1);
        plain.record(ms(9), 300, 300);
        let lines = plain.lines();
        assert!(lines[0].contains("decode 1-1 rows") && lines[0].contains("3.000 ms"), "{lines:?}");
        assert!(lines[1].contains("decode 129+ rows") && lines[1].contains("300 rows"), "{lines:?}");
    }

    /// Expected values printed by CPython 3.11.7 for bench.py's draw:
    /// `random.seed(s); p = [[randint(0, V-1) for _ in range(randint(100, 1024))]
    /// for _ in range(n)]; o = [randint(100, 1024) for _ in range(n)]`, as
    /// `(s, n, V, sum(map(len, p)), sum(o), first 5 len(p[i]), p[0][:10], o[:5])`.
    /// `(seed, num_requests, V, input tokens, output tokens, first 5 prompt
    /// lengths, first 10 ids, first 5 max_tokens)`.
    type Case = (u64, usize, usize, usize, usize, [usize; 5], [u32; 10], [usize; 5]);

    #[rustfmt::skip]
    const CPYTHON: &[Case] = &[
        (0, 256, 151643, 140756, 148643, [964, 931, 499, 516, 342], [100989, 110250, 10612, 67873, 134027, 127383, 106151, 79511, 124937, 93860], [640, 386, 587, 754, 877]),
        (0, 7, 151643, 4621, 3866, [964, 931, 499, 516, 342], [100989, 110250, 10612, 67873, 134027, 127383, 106151, 79511, 124937, 93860], [916, 245, 397, 610, 366]),
        (0, 256, 32000, 150034, 147617, [964, 839, 537, 459, 619], [12623, 24836, 29171, 13781, 1326, 8484, 31636, 16753, 15922, 13268], [613, 195, 479, 479, 796]),
        (0, 7, 32000, 4738, 3769, [964, 839, 537, 459, 619], [12623, 24836, 29171, 13781, 1326, 8484, 31636, 16753, 15922, 13268], [736, 769, 190, 335, 981]),
        (0, 256, 50, 140062, 140339, [964, 656, 728, 257, 834], [24, 48, 26, 2, 16, 32, 31, 25, 19, 30], [477, 427, 475, 375, 746]),
        (0, 7, 50, 4630, 4083, [964, 656, 728, 257, 834], [24, 48, 26, 2, 16, 32, 31, 25, 19, 30], [722, 626, 123, 611, 761]),
        (1, 256, 151643, 144013, 147108, [237, 901, 620, 900, 605], [149213, 16543, 66864, 30911, 129875, 117831, 123796, 99513, 55038, 24604], [169, 981, 736, 722, 229]),
        (1, 7, 151643, 4514, 4490, [237, 901, 620, 900, 605], [149213, 16543, 66864, 30911, 129875, 117831, 123796, 99513, 55038, 24604], [761, 616, 797, 803, 546]),
        (1, 256, 32000, 146860, 134525, [237, 133, 737, 532, 967], [18651, 27768, 26288, 25027, 2067, 8358, 3863, 16234, 24935, 14728], [150, 536, 539, 970, 391]),
        (1, 7, 32000, 4348, 4381, [237, 133, 737, 532, 967], [18651, 27768, 26288, 25027, 2067, 8358, 3863, 16234, 24935, 14728], [519, 347, 635, 488, 589]),
        (1, 256, 50, 144641, 152455, [237, 618, 578, 847, 972], [36, 48, 4, 16, 7, 31, 48, 28, 30, 41], [808, 434, 994, 365, 857]),
        (1, 7, 50, 5077, 4656, [237, 618, 578, 847, 972], [36, 48, 4, 16, 7, 31, 48, 28, 30, 41], [597, 878, 298, 859, 542]),
        (12345, 256, 151643, 147585, 141211, [526, 401, 679, 101, 999], [2665, 78286, 96576, 50767, 70843, 148375, 114354, 42385, 97796, 32575], [103, 556, 770, 158, 928]),
        (12345, 7, 151643, 4044, 4769, [526, 401, 679, 101, 999], [2665, 78286, 96576, 50767, 70843, 148375, 114354, 42385, 97796, 32575], [870, 113, 414, 995, 792]),
        (12345, 256, 32000, 147082, 143009, [526, 368, 836, 192, 657], [24008, 333, 26875, 27040, 26307, 9785, 28021, 12072, 30532, 6345], [1002, 1011, 882, 647, 942]),
        (12345, 7, 32000, 3623, 2831, [526, 368, 836, 192, 657], [24008, 333, 26875, 27040, 26307, 9785, 28021, 12072, 30532, 6345], [839, 122, 740, 243, 164]),
        (12345, 256, 50, 140413, 147526, [526, 541, 219, 483, 858], [46, 0, 19, 23, 12, 17, 36, 27, 10, 23], [791, 638, 873, 135, 324]),
        (12345, 7, 50, 3728, 3897, [526, 541, 219, 483, 858], [46, 0, 19, 23, 12, 17, 36, 27, 10, 23], [888, 445, 607, 349, 288]),
    ];

    #[test]
    fn constrained_requests_are_spread_evenly() {
        let picked: Vec<usize> = (0..8).filter(|&i| constrained(i, 0.25)).collect();
        assert_eq!(picked, [3, 7]);
        assert_eq!((0..256).filter(|&i| constrained(i, 0.25)).count(), 64);
        assert!(!(0..256).any(|i| constrained(i, 0.0)));
        assert!((0..256).all(|i| constrained(i, 1.0)));
    }

    #[test]
    fn draw_matches_cpython() {
        for &(seed, n, vocab_size, input, output, lens, ids, max_tokens) in CPYTHON {
            let draw = Draw::new(DrawSpec { seed, num_requests: n, min_len: 100, max_len: 1024, vocab_size });
            let case = format!("seed {seed}, {n} requests, V = {vocab_size}");
            assert_eq!(draw.prompts.len(), n, "{case}");
            assert_eq!(draw.input_tokens(), input, "{case}: input tokens");
            assert_eq!(draw.output_tokens(), output, "{case}: output tokens");
            let got_lens: Vec<usize> = draw.prompts[..5].iter().map(Vec::len).collect();
            assert_eq!(got_lens, lens, "{case}: prompt lengths");
            assert_eq!(draw.prompts[0][..10], ids, "{case}: first prompt ids");
            assert_eq!(draw.max_tokens[..5], max_tokens, "{case}: max_tokens");
            assert!(draw.prompts.iter().flatten().all(|&t| (t as usize) < vocab_size));
        }
    }

    /// Issue 13: mini-sglang's default run on Qwen3 (tokenizer.vocab_size 151,643).
    #[test]
    fn qwen3_default_draw_totals() {
        let draw = Draw::new(DrawSpec { seed: 0, num_requests: 256, min_len: 100, max_len: 1024, vocab_size: 151_643 });
        assert_eq!((draw.input_tokens(), draw.output_tokens()), (140_756, 148_643));
    }
}
