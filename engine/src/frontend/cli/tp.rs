//! `--tp N` on the command line: the flags (SGLang's and vLLM's), starting the
//! worker processes, and the hidden `minisgl tp-worker` command they run.
//!
//! One process per rank. `serve`, `generate` and `bench` with `--tp N` start
//! the `N / nnodes - 1` other ranks of their node as child processes of the
//! same binary (`minisgl tp-worker --rank R ...`, with the same model and
//! engine flags), listen at `--dist-init-addr` (default: a free port on
//! 127.0.0.1) for the rendezvous, and serve as rank 0. On the other nodes of a
//! multi-node group, the same command with `--node-rank K` runs that node's
//! first rank (`K * N / nnodes`) as a worker and starts the node's other ranks.
//! GPUs: local rank `i` of a node uses `cuda:(base + i)` (`--device cuda:base`).

use std::ffi::OsString;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use kernel_runtime::Device;
use sha2::{Digest, Sha256};

use super::common::{
    default_num_pages, engine_over, load_chat, load_model, load_options, resolve_device, served_name, EngineArgs,
    LoadedModel, ModelArgs, ModelSummary,
};
use crate::core::engine::{Engine, ModelRunner};
use crate::core::runner::CausalLmRunner;
use crate::core::tp::leader::{leader_collective, TpRunner};
use crate::core::tp::protocol::{RankArgs, StartInfo};
use crate::core::tp::rendezvous::accept_ranks;
use crate::core::tp::worker::{run_worker, WorkerConfig};

/// Tensor parallelism (the names SGLang and vLLM deploy with).
#[derive(Args, Debug, Clone)]
pub struct TpArgs {
    /// Tensor-parallel ranks: one process per GPU (on the CPU, processes that
    /// talk over TCP).
    #[arg(long = "tp", visible_alias = "tp-size", default_value_t = 1)]
    pub tp: usize,
    /// Machines the ranks are spread over (the same number of ranks on each).
    #[arg(long, default_value_t = 1)]
    pub nnodes: usize,
    /// This machine's index among --nnodes (0 runs the scheduler and the server).
    #[arg(long, default_value_t = 0)]
    pub node_rank: usize,
    /// HOST:PORT of rank 0's rendezvous (needed with --nnodes > 1; default:
    /// a free port on 127.0.0.1).
    #[arg(long)]
    pub dist_init_addr: Option<String>,
    /// Seconds to wait for every rank to join, and for a CPU collective.
    #[arg(long, default_value_t = 600)]
    pub dist_timeout: u64,
    /// Run through the worker-process machinery even at --tp 1 (its cost, and
    /// GPU tests on one device).
    #[arg(long, hide = true)]
    pub tp_force_workers: bool,
}

impl TpArgs {
    /// No tensor parallelism (what `load_model` runs with).
    pub fn single() -> TpArgs {
        TpArgs { tp: 1, nnodes: 1, node_rank: 0, dist_init_addr: None, dist_timeout: 600, tp_force_workers: false }
    }

    /// Whether the worker-process path runs.
    pub fn enabled(&self) -> bool {
        self.tp > 1 || self.nnodes > 1 || self.tp_force_workers
    }

    /// Ranks per node, after checking the flags agree.
    pub fn ranks_per_node(&self) -> anyhow::Result<usize> {
        if self.tp == 0 || self.nnodes == 0 {
            anyhow::bail!("--tp and --nnodes must be at least 1");
        }
        if !self.tp.is_multiple_of(self.nnodes) {
            anyhow::bail!("--tp {} does not spread evenly over --nnodes {}", self.tp, self.nnodes);
        }
        if self.node_rank >= self.nnodes {
            anyhow::bail!("--node-rank {} is not below --nnodes {}", self.node_rank, self.nnodes);
        }
        if self.nnodes > 1 && self.dist_init_addr.is_none() {
            anyhow::bail!("--nnodes {} needs --dist-init-addr HOST:PORT (rank 0's address)", self.nnodes);
        }
        if self.dist_timeout == 0 {
            anyhow::bail!("--dist-timeout must be at least 1 second");
        }
        Ok(self.tp / self.nnodes)
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.dist_timeout)
    }
}

/// Arguments of the hidden `minisgl tp-worker`.
#[derive(Args, Debug, Clone)]
pub struct TpWorkerArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub tp: TpArgs,
    /// This process's global rank (1..--tp).
    #[arg(long)]
    pub rank: usize,
}

/// The device of local rank `local_rank`: the CPU, or the GPU `local_rank`
/// places after the base one of `--device`.
fn rank_device(spec: &str, local_rank: usize) -> anyhow::Result<Device> {
    Ok(match resolve_device(spec)? {
        Device::Cpu => Device::Cpu,
        Device::Cuda(base) => {
            let device = Device::Cuda(base + local_rank);
            kernel_runtime::cuda::device(base + local_rank)
                .with_context(|| format!("tp local rank {local_rank} needs cuda:{}", base + local_rank))?;
            device
        }
    })
}

/// A hash of what identifies the model (its config.json, or a GGUF file's
/// name and size): paths may differ between machines, the model may not.
fn model_fingerprint(path: &Path) -> anyhow::Result<String> {
    let bytes = if path.is_dir() {
        let config = path.join("config.json");
        std::fs::read(&config).with_context(|| format!("reading {}", config.display()))?
    } else {
        let len = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?.len();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        format!("{name}:{len}").into_bytes()
    };
    Ok(Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect())
}

/// What this rank must agree on with the others.
fn rank_args(model: &ModelArgs, engine: &EngineArgs, device: Device) -> anyhow::Result<RankArgs> {
    Ok(RankArgs {
        model: model.model.display().to_string(),
        model_fingerprint: model_fingerprint(&model.model)?,
        device_kind: if device == Device::Cpu { "cpu".into() } else { "cuda".into() },
        dtype: model.dtype.clone(),
        load_format: model.load_format.clone(),
        attn: model.attn.clone(),
        moe: model.moe.clone(),
        page_size: engine.page_size as u64,
        num_pages: engine.num_pages.map(|n| n as u64),
        max_model_len: engine.max_model_len.map(|n| n as u64),
    })
}

/// The executable worker processes run: this one, or `MINISGL_TP_WORKER_EXE`
/// (for a library caller, such as a test, whose own executable is not minisgl).
pub fn worker_exe() -> anyhow::Result<PathBuf> {
    match std::env::var_os("MINISGL_TP_WORKER_EXE") {
        Some(exe) => Ok(PathBuf::from(exe)),
        None => std::env::current_exe().context("finding this executable to start the tp workers"),
    }
}

/// Starts the worker process of global rank `rank`, with the flags a worker
/// reads (the model's, the KV geometry's and the group's).
fn spawn_worker(
    exe: &Path,
    rank: usize,
    model: &ModelArgs,
    engine: &EngineArgs,
    tp: &TpArgs,
    addr: &str,
) -> anyhow::Result<Child> {
    let mut args: Vec<OsString> = vec!["tp-worker".into(), "--rank".into(), rank.to_string().into()];
    let mut flag = |name: &str, value: OsString| {
        args.push(format!("--{name}").into());
        args.push(value);
    };
    flag("model", model.model.clone().into_os_string());
    flag("device", model.device.clone().into());
    flag("dtype", model.dtype.clone().into());
    flag("load-format", model.load_format.clone().into());
    flag("attn", model.attn.clone().into());
    flag("moe", model.moe.clone().into());
    flag("page-size", engine.page_size.to_string().into());
    if let Some(n) = engine.num_pages {
        flag("num-pages", n.to_string().into());
    }
    if let Some(n) = engine.max_model_len {
        flag("max-model-len", n.to_string().into());
    }
    flag("tp", tp.tp.to_string().into());
    flag("nnodes", tp.nnodes.to_string().into());
    flag("node-rank", tp.node_rank.to_string().into());
    flag("dist-init-addr", addr.into());
    flag("dist-timeout", tp.dist_timeout.to_string().into());
    let child = Command::new(exe)
        .args(&args)
        .spawn()
        .with_context(|| format!("starting tp rank {rank} ({})", exe.display()))?;
    tracing::info!("started tp rank {rank} (pid {})", child.id());
    Ok(child)
}

/// Starts the other local ranks of this node (`first + 1 ..first + per_node`).
fn spawn_local_workers(
    first: usize,
    per_node: usize,
    model: &ModelArgs,
    engine: &EngineArgs,
    tp: &TpArgs,
    addr: &str,
) -> anyhow::Result<Vec<(usize, Child)>> {
    let exe = worker_exe()?;
    let mut children = Vec::new();
    for rank in first + 1..first + per_node {
        match spawn_worker(&exe, rank, model, engine, tp, addr) {
            Ok(child) => children.push((rank, child)),
            Err(e) => {
                kill_all(&mut children);
                return Err(e);
            }
        }
    }
    Ok(children)
}

fn kill_all(children: &mut [(usize, Child)]) {
    for (_, child) in children.iter_mut() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Rank 0's start-up: workers started, the rendezvous held, the collectives
/// set up, its shard loaded, the KV pool sized and every rank's runner made.
/// Returns the runner and the KV page count.
pub fn start_leader(model: &ModelArgs, engine: &EngineArgs, tp: &TpArgs) -> anyhow::Result<(TpRunner, usize)> {
    let per_node = tp.ranks_per_node()?;
    if tp.node_rank != 0 {
        anyhow::bail!("--node-rank {} runs workers, not rank 0", tp.node_rank);
    }
    let device = rank_device(&model.device, 0)?;
    let bind = tp.dist_init_addr.clone().unwrap_or_else(|| "127.0.0.1:0".into());
    let listener = TcpListener::bind(&bind).with_context(|| format!("--dist-init-addr {bind}: cannot listen"))?;
    let local: SocketAddr = listener.local_addr().context("reading the rendezvous address")?;
    let addr = tp.dist_init_addr.clone().unwrap_or_else(|| local.to_string());
    tracing::info!("tp: {} ranks ({per_node} per node), rendezvous at {addr}", tp.tp);
    let args = rank_args(model, engine, device)?;
    let mut children = spawn_local_workers(0, per_node, model, engine, tp, &addr)?;
    let started = (|| -> anyhow::Result<(TpRunner, usize)> {
        let mut alive = || -> Result<(), String> {
            for (rank, child) in children.iter_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(format!("tp rank {rank} (pid {}) exited before joining: {status}", child.id()));
                }
            }
            Ok(())
        };
        let links = accept_ranks(&listener, tp.tp, &args, tp.timeout(), &mut alive)?;
        let comm = leader_collective(device, &links, local.ip(), tp.timeout())?;
        let group = models::TpGroup::new(comm).map_err(anyhow::Error::msg)?;
        let mut options = load_options(model, engine.max_model_len)?;
        options.device = device;
        let loaded_at = std::time::Instant::now();
        let causal_lm = models::load_model_sharded(&model.model, &options, group)
            .with_context(|| format!("loading {} (tp rank 0)", model.model.display()))?;
        tracing::info!("loaded tp rank 0's shard in {:.1}s", loaded_at.elapsed().as_secs_f64());
        let num_pages = match engine.num_pages {
            Some(n) => n,
            None => default_num_pages(causal_lm.as_ref(), engine)?,
        };
        let max_context_len = engine.max_model_len(causal_lm.as_ref())?;
        let runner = CausalLmRunner::new(causal_lm, num_pages, engine.page_size, max_context_len)
            .with_context(|| format!("allocating a KV cache of {num_pages} pages"))?;
        let max_bs = engine.cuda_graph_max_bs.min(engine.max_running_requests);
        let graph_max_bs = if engine.disable_cuda_graph || max_bs == 0 {
            0
        } else if let Some(why) = runner.graphs_unsupported() {
            tracing::info!("CUDA graphs off: {why}; decode steps run eagerly");
            0
        } else {
            max_bs
        };
        let start = StartInfo { num_pages, max_context_len, graph_max_bs };
        Ok((TpRunner::start(runner, links, std::mem::take(&mut children), start, tp.timeout())?, num_pages))
    })();
    if started.is_err() {
        kill_all(&mut children);
    }
    started
}

/// The engine over rank 0 of a tensor-parallel group (`--tp`; the workers
/// started and joined, see `cli::tp`), with what was loaded.
pub fn build_tp_engine(
    model_args: &ModelArgs,
    engine_args: &EngineArgs,
    tp_args: &TpArgs,
    mut eos: Vec<u32>,
) -> anyhow::Result<(Engine<Box<dyn ModelRunner + Send>>, ModelSummary)> {
    let (runner, num_pages) = start_leader(model_args, engine_args, tp_args)?;
    let model = runner.inner().model();
    for &id in model.eos_token_ids() {
        if !eos.contains(&id) {
            eos.push(id);
        }
    }
    let summary =
        ModelSummary::of(model, &model_args.model, num_pages, engine_args.page_size, runner.max_context_len());
    let sized = EngineArgs { num_pages: Some(num_pages), ..engine_args.clone() };
    Ok((engine_over(Box::new(runner), &sized, num_pages, eos)?, summary))
}

/// [`load_model`] with tensor parallelism: with `--tp N` (or the forced worker
/// path) rank 0's engine over the group; else exactly `load_model`.
pub fn load_model_tp(
    model_args: &ModelArgs,
    engine_args: &EngineArgs,
    tp_args: &TpArgs,
) -> anyhow::Result<LoadedModel> {
    if !tp_args.enabled() {
        return load_model(model_args, engine_args);
    }
    let (tokenizer, chat) = load_chat(model_args, engine_args)?;
    let (engine, summary) = build_tp_engine(model_args, engine_args, tp_args, tokenizer.eos_token_ids().to_vec())?;
    Ok(LoadedModel { engine, tokenizer, chat, name: served_name(model_args), summary })
}

/// `--node-rank K > 0`: this node's first rank runs as a worker here, its other
/// ranks as child processes; returns when rank 0 shuts the group down.
pub fn run_node(model: &ModelArgs, engine: &EngineArgs, tp: &TpArgs) -> anyhow::Result<ExitCode> {
    let per_node = tp.ranks_per_node()?;
    let first = tp.node_rank * per_node;
    let addr = tp.dist_init_addr.clone().context("--node-rank needs --dist-init-addr")?;
    let mut children = spawn_local_workers(first, per_node, model, engine, tp, &addr)?;
    let result = worker_main(model, engine, tp, first);
    if result.is_err() {
        kill_all(&mut children);
    } else {
        for (_, child) in children.iter_mut() {
            let _ = child.wait();
        }
    }
    result
}

/// The hidden `minisgl tp-worker` command.
pub fn run_worker_command(args: TpWorkerArgs) -> anyhow::Result<ExitCode> {
    worker_main(&args.model, &args.engine, &args.tp, args.rank)
}

fn worker_main(model: &ModelArgs, engine: &EngineArgs, tp: &TpArgs, rank: usize) -> anyhow::Result<ExitCode> {
    let per_node = tp.ranks_per_node()?;
    if rank == 0 || rank >= tp.tp {
        anyhow::bail!("--rank {rank} is not a worker rank of --tp {}", tp.tp);
    }
    let addr = tp.dist_init_addr.clone().context("a tp worker needs --dist-init-addr")?;
    let device = rank_device(&model.device, rank % per_node).with_context(|| format!("tp rank {rank}"))?;
    let config = WorkerConfig {
        addr,
        rank,
        world_size: tp.tp,
        args: rank_args(model, engine, device)?,
        device,
        page_size: engine.page_size,
        timeout: tp.timeout(),
    };
    let mut options = load_options(model, engine.max_model_len)?;
    options.device = device;
    let mut load = |group: models::TpGroup| {
        models::load_model_sharded(&model.model, &options, group).map_err(|e| format!("{e:#}"))
    };
    run_worker(&config, &mut load)?;
    Ok(ExitCode::SUCCESS)
}
