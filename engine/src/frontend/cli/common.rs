//! Options shared by every command that loads a model, and the code that turns
//! them into a running engine.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use kernel_runtime::{DType, Device};

use crate::core::engine::{overlap_disabled_by_env, Engine, EngineConfig, ModelRunner};
use crate::core::kvcache::CacheKind;
use crate::core::runner::CausalLmRunner;
use crate::core::scheduler::{SchedulePolicy, SchedulerConfig};
use crate::text::chat_template::{ModelChatConfig, SpecialTokens};
use crate::text::tokenizer::Tokenizer;

/// Which model and how to run it.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// A HuggingFace model folder (config.json, safetensors, tokenizer), a .gguf
    /// file, or the name of a model `minisgl pull` knows (smollm2; see `pull --list`).
    #[arg(long)]
    pub model: PathBuf,
    /// cpu, cuda, cuda:N, or auto (the GPU when there is one).
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Compute dtype: auto (bf16 on the GPU, f32 on the CPU), bf16, f16, f32.
    #[arg(long, default_value = "auto")]
    pub dtype: String,
    /// auto (from the folder), safetensors, gguf, or dummy (random weights from config.json).
    #[arg(long, default_value = "auto")]
    pub load_format: String,
    /// Attention backend: a name, or `prefill,decode`.
    #[arg(long, default_value = "paged")]
    pub attn: String,
    /// MoE backend of sparse MoE models: fused (the fused kernels) or naive (one expert at a time).
    #[arg(long, default_value = "fused")]
    pub moe: String,
    /// A Jinja chat template file to use instead of the model's own.
    #[arg(long)]
    pub chat_template: Option<PathBuf>,
}

/// Engine sizing and scheduling.
#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    /// Tokens per KV page.
    #[arg(long, default_value_t = 16)]
    pub page_size: usize,
    /// KV pages in the pool (default: sized from --mem-fraction on the GPU; on
    /// the CPU as many as fit in 1 GiB, at least one full-length sequence).
    #[arg(long)]
    pub num_pages: Option<usize>,
    /// Share of the GPU's free memory (after the weights) given to the KV cache.
    #[arg(long, default_value_t = 0.85)]
    pub mem_fraction: f64,
    /// Most prompt tokens prefilled per step (chunked prefill).
    #[arg(long, default_value_t = 8192)]
    pub max_prefill_length: usize,
    /// Most requests running at once.
    #[arg(long, default_value_t = 256)]
    pub max_running_requests: usize,
    /// Prefix cache: radix or naive.
    #[arg(long, default_value = "radix")]
    pub cache: String,
    /// Longest sequence (prompt + output) served, at most the model's context
    /// (default: the model's context).
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Largest decode batch captured in a CUDA graph (GPU; capped by
    /// --max-running-requests); larger decode steps run eagerly.
    #[arg(long, default_value_t = 256)]
    pub cuda_graph_max_bs: usize,
    /// Run every step eagerly: no CUDA graphs.
    #[arg(long)]
    pub disable_cuda_graph: bool,
    /// Wait for each step's tokens before scheduling the next (no overlap
    /// scheduling; also `MINISGL_DISABLE_OVERLAP=1`).
    #[arg(long)]
    pub disable_overlap: bool,
    /// Share of a request's remaining `max_tokens` whose KV pages are
    /// reserved when it is admitted (SGLang's new-token ratio). Below 1, a
    /// request whose `max_tokens` defaults to the rest of the context does
    /// not hold the whole pool: requests share it, and the scheduler
    /// preempts (and later resumes, with identical output) if decode runs
    /// out of pages. 1 never preempts (mini-sglang).
    #[arg(long, default_value_t = 0.25)]
    pub decode_reserve: f64,
}

impl EngineArgs {
    /// The context served for `model`: its own, or less with `--max-model-len`.
    pub fn max_model_len(&self, model: &dyn models::CausalLm) -> anyhow::Result<usize> {
        let own = model.max_position_embeddings();
        match self.max_model_len {
            None => Ok(own),
            Some(0) => anyhow::bail!("--max-model-len must be at least 1"),
            Some(n) if n > own => anyhow::bail!(
                "--max-model-len {n} exceeds the model's context of {own} tokens (max_position_embeddings)"
            ),
            Some(n) => Ok(n),
        }
    }
}

/// A model ready to serve: the engine (scheduler + model runner), the tokenizer
/// and the chat template configuration, and the name clients address it by.
pub struct LoadedModel {
    pub engine: crate::core::engine::Engine<Box<dyn crate::core::engine::ModelRunner + Send>>,
    pub tokenizer: crate::text::tokenizer::Tokenizer,
    pub chat: crate::text::chat_template::ModelChatConfig,
    /// The served model name (the folder or file name).
    pub name: String,
    pub summary: ModelSummary,
}

/// What was loaded and how it runs, for the server's startup summary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelSummary {
    pub path: PathBuf,
    pub architecture: String,
    pub device: Device,
    pub dtype: DType,
    pub num_pages: usize,
    pub page_size: usize,
    /// The context served (prompt plus output).
    pub max_context_len: usize,
    /// Where kernels come from: the CPU reference, or the GPU's kernel mode.
    pub kernels: String,
}

impl ModelSummary {
    /// The summary of `model`, loaded from `path`, over a pool of `num_pages`
    /// pages of `page_size` tokens, serving `max_context_len` tokens.
    pub fn of(
        model: &dyn models::CausalLm,
        path: &Path,
        num_pages: usize,
        page_size: usize,
        max_context_len: usize,
    ) -> ModelSummary {
        ModelSummary {
            path: path.to_path_buf(),
            architecture: model.config().architecture.clone(),
            device: model.device(),
            dtype: model.dtype(),
            num_pages,
            page_size,
            max_context_len,
            kernels: kernel_mode_text(model.device()),
        }
    }

    /// Tokens the KV pool holds.
    pub fn kv_tokens(&self) -> usize {
        self.num_pages * self.page_size
    }
}

/// How kernels are found on `device`: on the CPU none are (the ops are the
/// Rust reference); on a GPU the mode and the AOT library's folder.
pub fn kernel_mode_text(device: Device) -> String {
    match device {
        Device::Cpu => "none (CPU reference ops)".to_owned(),
        Device::Cuda(_) => match kernel_runtime::kernels::Registry::get() {
            Ok(registry) => {
                let mode = format!("{:?}", registry.mode).to_lowercase();
                match registry.aot() {
                    Some(aot) => format!("{mode} (AOT library in {})", aot.dir.display()),
                    None => format!("{mode} (no AOT library: NVRTC)"),
                }
            }
            Err(e) => format!("unavailable ({e})"),
        },
    }
}

/// `--model NAME` for a model `minisgl pull` knows, when no file or folder of
/// that name exists: the pulled file, fetched first when `pull` is set (the
/// command's `--pull`), else an error saying how to fetch it. Any other path
/// is returned as it is, and a missing one is an error naming it.
pub fn resolve_model_path(model: &Path, pull: bool) -> anyhow::Result<PathBuf> {
    if model.exists() {
        return Ok(model.to_owned());
    }
    let known = super::pull::KNOWN_MODELS.iter().find(|m| Some(m.name) == model.to_str());
    let Some(known) = known else {
        let names: Vec<&str> = super::pull::KNOWN_MODELS.iter().map(|m| m.name).collect();
        anyhow::bail!(
            "--model {}: no such file or folder (nor a model `minisgl pull` knows: {})",
            model.display(),
            names.join(", ")
        );
    };
    let dir = super::pull::models_dir();
    let path = dir.join(known.file_name);
    if path.is_file() {
        return Ok(path);
    }
    if !pull {
        anyhow::bail!(
            "--model {}: not pulled yet (no {}); run `minisgl pull {}` first, or add --pull to fetch it now",
            known.name,
            path.display(),
            known.name
        );
    }
    super::pull::pull(known, &dir)
}

/// `--device`: `auto` is the first GPU when a driver and a device are present, else the CPU.
pub fn resolve_device(spec: &str) -> anyhow::Result<Device> {
    if spec.trim() == "auto" {
        return Ok(match kernel_runtime::cuda::device_count() {
            Ok(n) if n > 0 => Device::Cuda(0),
            _ => Device::Cpu,
        });
    }
    let device: Device = spec.parse().map_err(|e: String| anyhow::anyhow!("--device: {e}"))?;
    if let Device::Cuda(i) = device {
        // Fail here, with the driver's reason, rather than at the first tensor.
        kernel_runtime::cuda::device(i).with_context(|| format!("--device {spec}"))?;
    }
    Ok(device)
}

/// `--dtype`: `auto` lets the model loader choose (f32 on the CPU, the checkpoint's
/// float type on the GPU).
pub fn resolve_dtype(spec: &str) -> anyhow::Result<Option<DType>> {
    match spec.trim() {
        "auto" => Ok(None),
        other => match DType::parse(other) {
            Some(d) if d.is_float() => Ok(Some(d)),
            _ => anyhow::bail!("--dtype: `{other}` is not one of auto, bf16, f16, f32"),
        },
    }
}

/// The model with its options resolved: what `generate` and `load_model` share.
/// Loads the model of `args`; `max_context` (`--max-model-len`) sizes its
/// rotary table to the served context.
pub fn load_causal_lm(args: &ModelArgs, max_context: Option<usize>) -> anyhow::Result<Box<dyn models::CausalLm>> {
    let options = load_options(args, max_context)?;
    let device = options.device;
    let started = std::time::Instant::now();
    let model =
        models::load_model(&args.model, &options).with_context(|| format!("loading {}", args.model.display()))?;
    tracing::info!(
        "loaded {} ({}) on {device} in {:.1}s",
        args.model.display(),
        model.config().architecture,
        started.elapsed().as_secs_f64()
    );
    Ok(model)
}

/// The load options of `args` (`--device`, `--dtype`, `--load-format`,
/// `--attn`, `--moe`), serving `max_context` tokens.
pub fn load_options(args: &ModelArgs, max_context: Option<usize>) -> anyhow::Result<models::LoadOptions> {
    Ok(models::LoadOptions {
        device: resolve_device(&args.device)?,
        dtype: resolve_dtype(&args.dtype)?,
        load_format: args.load_format.parse().map_err(|e: String| anyhow::anyhow!("--load-format: {e}"))?,
        attn: args.attn.parse().with_context(|| format!("--attn {}", args.attn))?,
        moe: args.moe.parse().map_err(|e: String| anyhow::anyhow!("--moe: {e}"))?,
        max_context,
    })
}

/// The tokenizer and chat configuration of a model folder or GGUF file.
pub fn load_tokenizer(path: &Path) -> anyhow::Result<(Tokenizer, ModelChatConfig)> {
    if path.is_dir() {
        let tokenizer =
            Tokenizer::from_dir(path).with_context(|| format!("loading the tokenizer of {}", path.display()))?;
        let chat =
            ModelChatConfig::load(path).with_context(|| format!("loading the chat template of {}", path.display()))?;
        return Ok((tokenizer, chat));
    }
    let file = models::gguf::GgufFile::open(path).with_context(|| format!("opening {}", path.display()))?;
    let g = crate::text::gguf_tokenizer::tokenizer_from_gguf(&file)
        .with_context(|| format!("building the tokenizer of {}", path.display()))?;
    let special_tokens = SpecialTokens {
        bos_token: g.bos_token.clone(),
        eos_token: g.eos_token.clone(),
        unk_token: g.unk_token_id.and_then(|id| g.tokenizer.id_to_token(id)),
        pad_token: g.pad_token_id.and_then(|id| g.tokenizer.id_to_token(id)),
    };
    let chat = ModelChatConfig { chat_template: g.chat_template.clone(), special_tokens: special_tokens.clone() };
    Ok((Tokenizer::new(g.tokenizer, special_tokens, g.eos_token_ids), chat))
}

/// KV pages when `--num-pages` is not given: on the GPU, `--mem-fraction` of the
/// memory left free after the weights; on the CPU, 1 GiB of cache (at least one
/// full-length sequence).
pub fn default_num_pages(model: &dyn models::CausalLm, args: &EngineArgs) -> anyhow::Result<usize> {
    let bytes_per_page = model.kv_cache_shape(1, args.page_size).bytes_per_page(model.dtype()).max(1);
    let min_pages = args.max_model_len(model)?.div_ceil(args.page_size) + 1;
    Ok(match model.device() {
        Device::Cpu => ((1usize << 30) / bytes_per_page).max(min_pages),
        Device::Cuda(i) => {
            if !(0.0..1.0).contains(&args.mem_fraction) {
                anyhow::bail!("--mem-fraction must be in [0, 1), got {}", args.mem_fraction);
            }
            let (free, _total) = kernel_runtime::cuda::device(i)?.mem_info()?;
            let pages = (free as f64 * args.mem_fraction) as usize / bytes_per_page;
            if pages < 2 {
                anyhow::bail!("only {free} bytes free on cuda:{i} after loading the weights: no room for a KV cache");
            }
            pages
        }
    })
}

/// The engine configuration from the command line, for a model.
pub fn engine_config(args: &EngineArgs, num_pages: usize, eos_token_ids: Vec<u32>) -> anyhow::Result<EngineConfig> {
    let cache = match args.cache.trim() {
        "radix" => CacheKind::Radix,
        "naive" => CacheKind::Naive,
        other => anyhow::bail!("--cache: `{other}` is not one of radix, naive"),
    };
    Ok(EngineConfig {
        scheduler: SchedulerConfig {
            page_size: args.page_size,
            num_pages,
            max_prefill_length: args.max_prefill_length,
            max_running_requests: args.max_running_requests,
            cache,
            policy: SchedulePolicy::PrefillFirst,
            decode_reserve: args.decode_reserve,
            eos_token_ids,
        },
    })
}

/// The engine over a loaded model: sizes the KV pool (`--num-pages`, else
/// [`default_num_pages`]) and wires the runner; `eos` are the stop tokens.
pub fn build_engine(
    model: Box<dyn models::CausalLm>,
    engine_args: &EngineArgs,
    mut eos: Vec<u32>,
) -> anyhow::Result<Engine<Box<dyn ModelRunner + Send>>> {
    let num_pages = match engine_args.num_pages {
        Some(n) => n,
        None => default_num_pages(model.as_ref(), engine_args)?,
    };
    for &id in model.eos_token_ids() {
        if !eos.contains(&id) {
            eos.push(id);
        }
    }
    let max_context = engine_args.max_model_len(model.as_ref())?;
    let mut runner = CausalLmRunner::new(model, num_pages, engine_args.page_size, max_context)
        .with_context(|| format!("allocating a KV cache of {num_pages} pages"))?;
    capture_graphs(&mut runner, engine_args);
    engine_over(Box::new(runner), engine_args, num_pages, eos)
}

/// The engine over a ready runner of `num_pages` KV pages; `eos` are the stop tokens.
pub fn engine_over(
    runner: Box<dyn ModelRunner + Send>,
    engine_args: &EngineArgs,
    num_pages: usize,
    eos: Vec<u32>,
) -> anyhow::Result<Engine<Box<dyn ModelRunner + Send>>> {
    let config = engine_config(engine_args, num_pages, eos)?;
    let mut engine = Engine::new(runner, config)?;
    let overlap = !(engine_args.disable_overlap || overlap_disabled_by_env());
    engine.set_overlap(overlap)?;
    tracing::info!("overlap scheduling {}", if overlap { "on" } else { "off" });
    Ok(engine)
}

/// Captures the runner's decode CUDA graphs unless they are off or the model
/// cannot have them (then it says why and runs eagerly).
fn capture_graphs(runner: &mut CausalLmRunner, args: &EngineArgs) {
    if args.disable_cuda_graph || runner.model().device() == Device::Cpu {
        return;
    }
    let max_bs = args.cuda_graph_max_bs.min(args.max_running_requests);
    if max_bs == 0 {
        return;
    }
    if let Some(why) = runner.graphs_unsupported() {
        tracing::info!("CUDA graphs off: {why}; decode steps run eagerly");
        return;
    }
    match runner.capture_decode_graphs(max_bs) {
        Ok(c) => tracing::info!(
            "captured {} CUDA graphs of decode steps (batch 1..={max_bs}) in {:.2} s, {} MiB graph memory",
            c.buckets.len(),
            c.elapsed.as_secs_f64(),
            c.pool_bytes >> 20
        ),
        Err(e) => tracing::warn!("capturing CUDA graphs failed ({e}); decode steps run eagerly"),
    }
}

/// The tokenizer and chat configuration a served model uses (`--chat-template`
/// replacing the model's own), after the checks that need no model.
pub fn load_chat(model_args: &ModelArgs, engine_args: &EngineArgs) -> anyhow::Result<(Tokenizer, ModelChatConfig)> {
    let (tokenizer, mut chat) = load_tokenizer(&model_args.model)?;
    if let Some(path) = &model_args.chat_template {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading the chat template {}", path.display()))?;
        chat.chat_template = Some(text);
    }
    if engine_args.max_model_len == Some(0) {
        anyhow::bail!("--max-model-len must be at least 1");
    }
    Ok((tokenizer, chat))
}

/// Loads the model, its tokenizer and chat template, sizes the KV pool and builds
/// the engine.
pub fn load_model(model_args: &ModelArgs, engine_args: &EngineArgs) -> anyhow::Result<LoadedModel> {
    let (tokenizer, chat) = load_chat(model_args, engine_args)?;
    let model = load_causal_lm(model_args, engine_args.max_model_len)?;
    let num_pages = match engine_args.num_pages {
        Some(n) => n,
        None => default_num_pages(model.as_ref(), engine_args)?,
    };
    let max_context_len = engine_args.max_model_len(model.as_ref())?;
    let summary =
        ModelSummary::of(model.as_ref(), &model_args.model, num_pages, engine_args.page_size, max_context_len);
    let sized = EngineArgs { num_pages: Some(num_pages), ..engine_args.clone() };
    let engine = build_engine(model, &sized, tokenizer.eos_token_ids().to_vec())?;
    let name = served_name(model_args);
    Ok(LoadedModel { engine, tokenizer, chat, name, summary })
}

/// The name clients address the model by: its folder or file name.
pub fn served_name(model_args: &ModelArgs) -> String {
    model_args.model.file_stem().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into())
}
