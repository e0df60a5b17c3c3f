//! Rank 0 of a tensor-parallel group: sets up the group's collectives over the
//! control channels the rendezvous opened, then runs the engine's steps on
//! every rank through [`TpRunner`].
//!
//! [`TpRunner`] is the engine's `ModelRunner`: each call (`forward`, `launch`,
//! `launch_masked`, `wait`) is sent to every worker as it is made, then made on
//! rank 0's own runner, so that every rank runs the same forward pass with the
//! same inputs, meeting in the same collectives. Only rank 0's results are
//! used: its logits go to the engine's sampler, and its sampled ids (the
//! workers sample the same all-gathered logits with the same random numbers,
//! and so draw the same ids, which their own next steps read as deferred
//! tokens) back to the engine.
//!
//! A worker that dies stops the process with a message naming it, never a
//! hang: a watcher thread per control channel reads what workers send (only a
//! `Failed` report, or the end of the stream), and one thread polls the local
//! worker processes.

use std::net::{IpAddr, TcpListener, TcpStream};
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kernel_runtime::Device;
use models::tp::nccl::NcclCollective;
use models::tp::{Collective, TcpCollective};

use crate::core::engine::{ModelRunner, RunnerError, SampledStep};
use crate::core::grammar::TokenMasks;
use crate::core::req::PreparedBatch;
use crate::core::runner::CausalLmRunner;
use crate::core::sampling::Logits;
use crate::core::tp::error::TpError;
use crate::core::tp::protocol::{Call, CommSetup, MaskParts, StartInfo, StepMsg, ToLeader, ToWorker};
use crate::core::tp::rendezvous::{recv_from_worker, send_to_worker};

/// Rank 0's collectives for a group of `world_size` on `device`: the CPU's TCP
/// star (a listener on `ip`, its port sent in the welcome) or NCCL (a fresh
/// unique id sent in the welcome). Blocks until every rank has joined.
pub fn leader_collective(
    device: Device,
    links: &[TcpStream],
    ip: IpAddr,
    timeout: Duration,
) -> Result<Arc<dyn Collective>, TpError> {
    let world_size = links.len() + 1;
    match device {
        Device::Cpu => {
            let listener = TcpListener::bind((ip, 0))
                .map_err(|e| TpError::Startup(format!("binding the CPU collective listener on {ip}: {e}")))?;
            let port = listener.local_addr().map_err(|e| TpError::Startup(e.to_string()))?.port();
            for (i, link) in links.iter().enumerate() {
                send_to_worker(link, i + 1, &ToWorker::Welcome(CommSetup::Tcp { port }))?;
            }
            Ok(Arc::new(TcpCollective::accept(&listener, world_size, timeout)?))
        }
        Device::Cuda(ordinal) => {
            let id = kernel_runtime::nccl::UniqueId::new().map_err(models::ModelError::from)?;
            for (i, link) in links.iter().enumerate() {
                send_to_worker(link, i + 1, &ToWorker::Welcome(CommSetup::Nccl { unique_id: id.to_bytes() }))?;
            }
            Ok(Arc::new(NcclCollective::init(ordinal, world_size, 0, &id)?))
        }
    }
}

/// What stops the process when a worker goes away (shared by the watchers).
#[derive(Debug)]
struct Watch {
    /// Set before a deliberate shutdown: a worker leaving then is expected.
    stopping: AtomicBool,
    /// Local worker processes (rank, process), polled by the child watcher.
    children: Mutex<Vec<(usize, Child)>>,
}

impl Watch {
    /// Reports a dead worker and ends the process (the other workers with it):
    /// rank 0 may be blocked in a collective with the dead rank (NCCL waits
    /// forever), so returning an error is not enough.
    fn fatal(&self, message: String) {
        if self.stopping.swap(true, Ordering::SeqCst) {
            return;
        }
        tracing::error!("{message}; stopping");
        eprintln!("minisgl: error: {message}; stopping");
        for (_, child) in self.children.lock().unwrap_or_else(|e| e.into_inner()).iter_mut() {
            let _ = child.kill();
        }
        std::process::exit(1);
    }
}

/// Rank 0's runner (see the module docs).
pub struct TpRunner {
    inner: CausalLmRunner,
    /// Control channel of rank `i + 1`.
    links: Vec<TcpStream>,
    watch: Arc<Watch>,
    child_watcher: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for TpRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TpRunner {{ ranks: {} }}", self.links.len() + 1)
    }
}

impl TpRunner {
    /// Starts the workers' runners (`start`, sent to each), captures rank 0's
    /// decode graphs alongside theirs when `start.graph_max_bs > 0`, waits until
    /// every worker is ready (or `timeout`), then watches them. `children` are
    /// the local worker processes, killed if start-up fails.
    pub fn start(
        mut inner: CausalLmRunner,
        links: Vec<TcpStream>,
        children: Vec<(usize, Child)>,
        start: StartInfo,
        timeout: Duration,
    ) -> Result<TpRunner, TpError> {
        let watch = Arc::new(Watch { stopping: AtomicBool::new(false), children: Mutex::new(children) });
        for (i, link) in links.iter().enumerate() {
            send_to_worker(link, i + 1, &ToWorker::Start(start))?;
        }
        let captured = capture(&mut inner, start.graph_max_bs);
        // From here a failure drops the runner, which shuts the workers down.
        let mut runner = TpRunner { inner, links, watch, child_watcher: None };
        captured?;
        for (i, link) in runner.links.iter().enumerate() {
            let rank = i + 1;
            link.set_read_timeout(Some(timeout)).map_err(|e| TpError::Startup(e.to_string()))?;
            match recv_from_worker(link, rank)? {
                ToLeader::Ready => {}
                ToLeader::Failed(message) => return Err(TpError::Worker { rank, message }),
                other => return Err(TpError::Startup(format!("tp rank {rank}: expected ready, got {other:?}"))),
            }
            link.set_read_timeout(None).map_err(|e| TpError::Startup(e.to_string()))?;
        }
        runner.watch_links()?;
        runner.child_watcher = Some(watch_children(runner.watch.clone()));
        Ok(runner)
    }

    /// One thread per control channel: a worker only ever sends a failure, or
    /// closes the channel when it exits.
    fn watch_links(&self) -> Result<(), TpError> {
        for (i, link) in self.links.iter().enumerate() {
            let rank = i + 1;
            let reader = link.try_clone().map_err(|e| TpError::Startup(format!("tp rank {rank}: {e}")))?;
            let watch = self.watch.clone();
            std::thread::Builder::new()
                .name(format!("tp-watch-{rank}"))
                .spawn(move || {
                    let message = match recv_from_worker(&reader, rank) {
                        Ok(ToLeader::Failed(message)) => format!("tp rank {rank} failed: {message}"),
                        Ok(other) => format!("tp rank {rank} sent {other:?} mid-run"),
                        Err(e) => {
                            format!("{e} (tp rank {rank} exited or its host went away)")
                        }
                    };
                    if !watch.stopping.load(Ordering::SeqCst) {
                        watch.fatal(message);
                    }
                })
                .map_err(|e| TpError::Startup(format!("starting a watcher thread: {e}")))?;
        }
        Ok(())
    }

    /// Rank 0's own runner.
    pub fn inner(&self) -> &CausalLmRunner {
        &self.inner
    }

    fn send_all(&self, msg: &ToWorker) -> Result<(), RunnerError> {
        for (i, link) in self.links.iter().enumerate() {
            send_to_worker(link, i + 1, msg)?;
        }
        Ok(())
    }

    fn send_step(&self, call: Call, batch: &PreparedBatch, masks: Option<MaskParts>) -> Result<(), RunnerError> {
        if self.links.is_empty() {
            return Ok(());
        }
        let step = StepMsg {
            call,
            layout: batch.layout().clone(),
            sampling: batch.sampling().to_vec(),
            deferred: batch.deferred().to_vec(),
            masks,
            extras: batch.extras().clone(),
        };
        self.send_all(&ToWorker::Step(Box::new(step)))
    }

    /// The logits (f32, `[logits rows, vocab]`, row-major) of one step given by
    /// its layout alone (greedy rows, no deferred tokens), run on every rank: a
    /// forward pass as the engine's host path makes it, for tests and tools.
    pub fn forward_layout(&mut self, layout: &models::StepLayout) -> Result<Vec<f32>, RunnerError> {
        layout.check()?;
        let step = StepMsg {
            call: Call::Forward,
            layout: layout.clone(),
            sampling: vec![crate::core::sampling::SamplingRow::greedy(); layout.logits_rows.len()],
            deferred: Vec::new(),
            masks: None,
            extras: Default::default(),
        };
        let batch = step.into_batch();
        self.send_step(Call::Forward, &batch, None)?;
        let logits = self.inner.forward(&batch)?;
        Ok((0..logits.num_rows()).flat_map(|r| logits.row(r).to_vec()).collect())
    }

    fn on_cpu(&self) -> bool {
        self.inner.model().device() == Device::Cpu
    }
}

/// Captures decode graphs on rank 0 (the workers capture theirs at the same
/// time: the warm-up and captured passes meet in the same collectives).
fn capture(runner: &mut CausalLmRunner, max_bs: usize) -> Result<(), TpError> {
    if max_bs == 0 {
        return Ok(());
    }
    match runner.capture_decode_graphs(max_bs) {
        Ok(c) => {
            tracing::info!("captured {} CUDA graphs of decode steps on every tp rank", c.buckets.len());
            Ok(())
        }
        // The workers fail theirs too (the same model), or are stuck in a
        // collective: either way the group cannot run.
        Err(e) => Err(TpError::Runner(format!("capturing CUDA graphs on tp rank 0: {e}"))),
    }
}

/// Polls the local worker processes; one that exits while the group runs
/// ends rank 0 with its status.
fn watch_children(watch: Arc<Watch>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || loop {
        if watch.stopping.load(Ordering::SeqCst) {
            return;
        }
        let exited = {
            let mut children = watch.children.lock().unwrap_or_else(|e| e.into_inner());
            children.iter_mut().find_map(|(rank, child)| match child.try_wait() {
                Ok(Some(status)) => Some(format!("tp rank {rank} (pid {}) exited: {status}", child.id())),
                Ok(None) => None,
                Err(e) => Some(format!("tp rank {rank} (pid {}): {e}", child.id())),
            })
        };
        if let Some(message) = exited {
            watch.fatal(message);
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    })
}

impl Drop for TpRunner {
    /// Tells every worker to exit, then reaps the local ones (killing any that
    /// has not exited within a few seconds).
    fn drop(&mut self) {
        self.watch.stopping.store(true, Ordering::SeqCst);
        let _ = self.send_all(&ToWorker::Shutdown);
        if let Some(h) = self.child_watcher.take() {
            let _ = h.join();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut children = self.watch.children.lock().unwrap_or_else(|e| e.into_inner());
        for (_, child) in children.iter_mut() {
            while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(10));
            }
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

impl ModelRunner for TpRunner {
    fn forward(&mut self, batch: &PreparedBatch) -> Result<Logits, RunnerError> {
        self.send_step(Call::Forward, batch, None)?;
        self.inner.forward(batch)
    }

    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    fn max_context_len(&self) -> usize {
        self.inner.max_context_len()
    }

    fn launch(&mut self, batch: &PreparedBatch) -> Result<bool, RunnerError> {
        if self.on_cpu() {
            // The CPU runner samples on the host: the engine calls `forward`.
            return Ok(false);
        }
        self.send_step(Call::Launch, batch, None)?;
        self.inner.launch(batch)
    }

    /// The masks are computed before the step goes out (the workers need them
    /// too), so a constrained step overlaps less than on one GPU.
    fn launch_masked(
        &mut self,
        batch: &PreparedBatch,
        masks: &mut dyn FnMut() -> Option<TokenMasks>,
    ) -> Result<bool, RunnerError> {
        if self.on_cpu() {
            return Ok(false);
        }
        let mut computed = masks();
        let parts = computed.as_ref().map(|m| MaskParts {
            vocab_size: self.inner.vocab_size(),
            rows: m.rows().to_vec(),
            bits: m.bits().to_vec(),
        });
        self.send_step(Call::LaunchMasked, batch, parts)?;
        self.inner.launch_masked(batch, &mut || computed.take())
    }

    fn wait(&mut self) -> Result<SampledStep, RunnerError> {
        self.send_all(&ToWorker::Wait)?;
        self.inner.wait()
    }

    /// As the runner it wraps: the extras travel with each step, and every rank
    /// keeps the same penalty counters.
    fn samples_extras(&self) -> bool {
        !self.on_cpu() && self.inner.samples_extras()
    }
}
