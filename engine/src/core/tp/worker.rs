//! A worker rank (1..N): joins the rendezvous, builds its collectives, loads
//! its shard, then makes every runner call rank 0 makes, as rank 0 sends them.
//!
//! The control channel is read on its own thread, so that rank 0 going away
//! ends this process even while its main thread waits in a collective (NCCL
//! would wait forever); the main thread runs the steps.

use std::net::TcpStream;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use kernel_runtime::Device;
use models::tp::nccl::NcclCollective;
use models::tp::{Collective, TcpCollective, TpGroup};
use models::CausalLm;

use crate::core::engine::ModelRunner;
use crate::core::grammar::TokenMasks;
use crate::core::runner::CausalLmRunner;
use crate::core::tp::error::TpError;
use crate::core::tp::protocol::{Call, CommSetup, RankArgs, StepMsg, ToLeader, ToWorker};
use crate::core::tp::rendezvous::{join, recv_from_leader, send_to_leader};
use crate::core::tp::wire::WireError;

/// Where and what a worker is.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Rank 0's rendezvous, `HOST:PORT`.
    pub addr: String,
    pub rank: usize,
    pub world_size: usize,
    pub args: RankArgs,
    pub device: Device,
    pub page_size: usize,
    pub timeout: Duration,
}

/// Runs worker `config.rank` until rank 0 shuts the group down. `load` loads
/// this rank's shard of the model for the group it is given.
pub fn run_worker(
    config: &WorkerConfig,
    load: &mut dyn FnMut(TpGroup) -> Result<Box<dyn CausalLm>, String>,
) -> Result<(), TpError> {
    let rank = config.rank;
    let (stream, comm) = join(&config.addr, rank, config.world_size, &config.args, config.timeout)?;
    let result = serve(config, &stream, comm, load);
    if let Err(e) = &result {
        // Rank 0 stops the group on this (its watcher reads it).
        let _ = send_to_leader(&stream, rank, &ToLeader::Failed(e.to_string()));
    }
    result
}

fn serve(
    config: &WorkerConfig,
    stream: &TcpStream,
    comm: CommSetup,
    load: &mut dyn FnMut(TpGroup) -> Result<Box<dyn CausalLm>, String>,
) -> Result<(), TpError> {
    let rank = config.rank;
    let collective: Arc<dyn Collective> = match (comm, config.device) {
        (CommSetup::Tcp { port }, Device::Cpu) => {
            let host = config.addr.rsplit_once(':').map_or(config.addr.as_str(), |(h, _)| h);
            let addr = format!("{host}:{port}");
            Arc::new(TcpCollective::connect(&addr, rank, config.world_size, config.timeout)?)
        }
        (CommSetup::Nccl { unique_id }, Device::Cuda(ordinal)) => {
            let id = kernel_runtime::nccl::UniqueId::from_bytes(&unique_id).map_err(models::ModelError::from)?;
            Arc::new(NcclCollective::init(ordinal, config.world_size, rank, &id)?)
        }
        (comm, device) => {
            return Err(TpError::Startup(format!("tp rank {rank} runs on {device} but rank 0 set up {comm:?}")));
        }
    };
    let group = TpGroup::new(collective).map_err(TpError::Startup)?;
    let model = load(group).map_err(|e| TpError::Startup(format!("tp rank {rank}: loading the model: {e}")))?;
    let start = match recv_from_leader(stream).map_err(TpError::channel(0))? {
        ToWorker::Start(start) => start,
        ToWorker::Shutdown => return Ok(()),
        other => return Err(TpError::Startup(format!("tp rank {rank}: expected start, got {other:?}"))),
    };
    let mut runner = CausalLmRunner::new(model, start.num_pages, config.page_size, start.max_context_len)?;
    if start.graph_max_bs > 0 {
        runner
            .capture_decode_graphs(start.graph_max_bs)
            .map_err(|e| TpError::Runner(format!("capturing CUDA graphs on tp rank {rank}: {e}")))?;
    }
    send_to_leader(stream, rank, &ToLeader::Ready)?;

    let messages = read_on_a_thread(stream, rank)?;
    loop {
        let Ok(msg) = messages.recv() else {
            return Ok(());
        };
        match msg {
            ToWorker::Step(step) => run_step(&mut runner, *step).map_err(TpError::Runner)?,
            ToWorker::Wait => {
                runner.wait().map_err(|e| TpError::Runner(e.to_string()))?;
            }
            ToWorker::Shutdown => return Ok(()),
            other => return Err(TpError::Runner(format!("unexpected {other:?} mid-run"))),
        }
    }
}

/// Reads rank 0's messages into a channel. The end of the stream before a
/// `Shutdown` means rank 0 is gone: the process exits at once (see the module
/// docs) with a message saying so.
fn read_on_a_thread(stream: &TcpStream, rank: usize) -> Result<mpsc::Receiver<ToWorker>, TpError> {
    let reader = stream.try_clone().map_err(|e| TpError::Startup(format!("tp rank {rank}: {e}")))?;
    // Bounded: rank 0 runs at most a couple of steps ahead of a worker.
    let (tx, rx) = mpsc::sync_channel(64);
    std::thread::Builder::new()
        .name("tp-control".into())
        .spawn(move || loop {
            match recv_from_leader(&reader) {
                Ok(msg) => {
                    let last = msg == ToWorker::Shutdown;
                    if tx.send(msg).is_err() || last {
                        return;
                    }
                }
                Err(e) => {
                    let why = match e {
                        WireError::Closed => "rank 0 closed the control channel (it exited?)".to_owned(),
                        other => format!("the control channel from rank 0: {other}"),
                    };
                    eprintln!("minisgl: error: tp rank {rank}: {why}; exiting");
                    std::process::exit(1);
                }
            }
        })
        .map_err(|e| TpError::Startup(format!("tp rank {rank}: starting the control thread: {e}")))?;
    Ok(rx)
}

/// Makes the runner call of `step`, as rank 0 made it.
fn run_step(runner: &mut CausalLmRunner, step: StepMsg) -> Result<(), String> {
    let (call, masks) = (step.call, step.masks.clone());
    let batch = step.into_batch();
    let e = |e: crate::core::engine::RunnerError| e.to_string();
    match call {
        Call::Forward => {
            runner.forward(&batch).map_err(e)?;
        }
        Call::Launch => {
            runner.launch(&batch).map_err(e)?;
        }
        Call::LaunchMasked => {
            let mut masks = match masks {
                Some(m) => {
                    let mut masks = TokenMasks::zeroed(m.vocab_size, m.rows);
                    if masks.bits().len() != m.bits.len() {
                        return Err(format!("{} mask words for {} rows", m.bits.len(), masks.rows().len()));
                    }
                    masks.bits_mut().copy_from_slice(&m.bits);
                    Some(masks)
                }
                None => None,
            };
            runner.launch_masked(&batch, &mut || masks.take()).map_err(e)?;
        }
    }
    Ok(())
}
