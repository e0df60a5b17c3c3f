//! The bridge between the engine and a `models::CausalLm`: writes the scheduler's
//! step layout (`models::StepLayout`, consumed as it is) into persistent device
//! buffers (`models::StepInputs`, through pinned staging), runs the forward pass
//! over the runner-owned KV cache, and samples: on a GPU into a device buffer
//! whose ids come back later ([`DeviceTokens`]; the next step can be launched
//! before, feeding its deferred tokens from that buffer), on the CPU by handing
//! the logits rows to the engine's sampler.
//! Rows with a grammar (constrained decoding) get their token masks applied on
//! the GPU first (`kernel_runtime::ops::apply_token_mask`), and penalties and
//! log probabilities are computed there as well (`PreparedBatch::extras`).
//!
//! On a GPU, decode steps replay CUDA graphs ([`CausalLmRunner::capture_decode_graphs`]):
//! one per batch-size bucket ([`graph_buckets`]), captured at start over the
//! persistent inputs of `models::DecodeGraphInputs`; a step of `b` rows runs in the
//! graph of the smallest bucket that holds it, padded, and each graph copies its
//! logits into one shared buffer that sampling then reads. Prefill and mixed steps,
//! and decode steps larger than the largest bucket, run eagerly.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kernel_runtime::cuda::graph::Graph;
use kernel_runtime::ops::{self, SampleRow};
use kernel_runtime::{Device, Tensor};
use models::{CausalLm, KvCache, Padding, SeqStep, StepInputs, StepLayout};

use crate::core::device_tokens::DeviceTokens;
use crate::core::engine::{ModelRunner, RunnerError, SampledStep};
use crate::core::grammar::TokenMasks;
use crate::core::req::{DeferredToken, PreparedBatch};
use crate::core::sampling::{self, Logits, SamplingRow};

/// A loaded model with its KV cache: the engine's [`ModelRunner`].
#[derive(Debug)]
pub struct CausalLmRunner {
    model: Box<dyn CausalLm>,
    kv: KvCache,
    /// Longest sequence served (`max_position_embeddings`, or less if asked).
    max_context_len: usize,
    /// Pages the engine's pool hands out; on a GPU the cache has one more, the
    /// scratch page of CUDA graphs' padding rows.
    num_pages: usize,
    graphs: Option<DecodeGraphs>,
    /// Persistent inputs of steps no graph holds (made on first use).
    eager_inputs: Option<StepInputs>,
    /// Sampled ids on the GPU (made on first launch).
    tokens: Option<DeviceTokens>,
    /// On the CPU, sample through the GPU's path all the same (`DeviceTokens`
    /// over host tensors): the tests' stand-in for a GPU.
    device_path_on_cpu: bool,
}

/// The captured decode graphs of a runner (see the module header).
#[derive(Debug)]
struct DecodeGraphs {
    inputs: StepInputs,
    /// `[largest bucket, vocab]`: every graph copies its logits rows here.
    logits: Tensor,
    /// Bucket (rows) -> its graph.
    graphs: BTreeMap<usize, BucketGraph>,
}

/// The smallest bucket of `graphs` that holds a step of `rows` rows, with its
/// graph (a function of the map alone, so that `DecodeGraphs::inputs` stays
/// borrowable beside it).
fn bucket_mut(graphs: &mut BTreeMap<usize, BucketGraph>, rows: usize) -> Option<(usize, &mut BucketGraph)> {
    graphs.range_mut(rows.max(1)..).next().map(|(&bucket, graph)| (bucket, graph))
}

#[derive(Debug)]
struct BucketGraph {
    graph: Graph,
    /// The decode kernel's split count, fixed at capture.
    splits: usize,
}

/// What [`CausalLmRunner::capture_decode_graphs`] did, for the start-up log.
#[derive(Debug, Clone, PartialEq)]
pub struct GraphCapture {
    /// The captured buckets, smallest first.
    pub buckets: Vec<usize>,
    pub elapsed: Duration,
    /// Bytes of the graph memory pool after capture.
    pub pool_bytes: usize,
}

/// The batch sizes decode graphs are captured for, up to `max_batch`: 1, 2, 4,
/// 8, then every 8 (as SGLang does), and `max_batch` itself.
pub fn graph_buckets(max_batch: usize) -> Vec<usize> {
    let mut buckets: Vec<usize> =
        [1, 2, 4].into_iter().chain((1..).map(|i| 8 * i)).take_while(|&b| b < max_batch).collect();
    if max_batch > 0 {
        buckets.push(max_batch);
    }
    buckets
}

impl CausalLmRunner {
    /// Wraps `model` with a KV cache of `num_pages` pages of `page_size` tokens.
    pub fn new(
        model: Box<dyn CausalLm>,
        num_pages: usize,
        page_size: usize,
        max_context_len: usize,
    ) -> models::Result<Self> {
        // On a GPU, one page more: the padding rows of graphed steps write there.
        let cache_pages = if model.device() == Device::Cpu { num_pages } else { num_pages + 1 };
        let kv = model.new_kv_cache(cache_pages, page_size)?;
        Ok(Self {
            model,
            kv,
            max_context_len,
            num_pages,
            graphs: None,
            eager_inputs: None,
            tokens: None,
            device_path_on_cpu: false,
        })
    }

    /// The model.
    pub fn model(&self) -> &dyn CausalLm {
        self.model.as_ref()
    }

    /// The KV cache (for tests and diagnostics).
    pub fn kv_cache(&self) -> &KvCache {
        &self.kv
    }

    /// Why decode steps of this model cannot run in CUDA graphs, if they cannot.
    pub fn graphs_unsupported(&self) -> Option<String> {
        let m = &self.model;
        let c = m.config();
        if m.device() == Device::Cpu {
            return Some("the model runs on the CPU".into());
        }
        if !m.graph_capturable() {
            return Some("the model's layers read results back to the host (the naive MoE backend)".into());
        }
        if !m.attn_backend().decode_graph_safe() {
            return Some(format!("--attn {} plans decode attention on the host", m.attn_backend().name()));
        }
        if !ops::decode_kernel_fits(m.dtype(), c.num_attention_heads, c.num_key_value_heads, c.head_dim) {
            return Some(format!(
                "the decode kernel does not hold {} query heads over {} kv heads of {} dims in {}",
                c.num_attention_heads,
                c.num_key_value_heads,
                c.head_dim,
                m.dtype()
            ));
        }
        None
    }

    /// Captures a CUDA graph of a decode step for every bucket of
    /// [`graph_buckets`]`(max_batch)`, largest first (each after one eager run
    /// of the same step, which loads its kernels and plans). Replaces graphs
    /// captured before. An error leaves the runner eager.
    pub fn capture_decode_graphs(&mut self, max_batch: usize) -> Result<GraphCapture, RunnerError> {
        self.graphs = None;
        if let Some(why) = self.graphs_unsupported() {
            return Err(format!("CUDA graphs are not available: {why}").into());
        }
        let Device::Cuda(ordinal) = self.model.device() else {
            return Err("CUDA graphs need a GPU".into());
        };
        let dev = kernel_runtime::cuda::device(ordinal)?;
        let started = Instant::now();
        let buckets = graph_buckets(max_batch.max(1));
        let largest = buckets.last().copied().unwrap_or(1);
        let c = self.model.config();
        let (hkv, head_dim, dtype) = (c.num_key_value_heads, c.head_dim, self.model.dtype());
        let mut inputs = StepInputs::new(
            largest,
            self.max_context_len,
            self.kv.page_size(),
            self.num_pages as u32,
            self.model.device(),
        )?;
        let mut logits: Option<Tensor> = None;
        let mut graphs = BTreeMap::new();
        for &bucket in buckets.iter().rev() {
            let splits =
                ops::decode_graph_splits(self.model.device(), bucket, hkv, head_dim, dtype, self.max_context_len)?;
            let batch = inputs.write_seqs(&[], bucket, splits)?;
            let warm = self.model.forward(&batch, &self.kv)?;
            let all = match &logits {
                Some(l) => l.clone(),
                None => {
                    let l = Tensor::empty(&[largest, warm.dim(1)], warm.dtype(), warm.device())?;
                    logits = Some(l.clone());
                    l
                }
            };
            drop(warm);
            let out = all.narrow(0, 0, bucket)?;
            let (model, kv) = (&self.model, &self.kv);
            let (graph, ()) = dev.capture(|| -> Result<(), models::ModelError> {
                let step = model.forward(&batch, kv)?;
                ops::copy(&out, &step)?;
                Ok(())
            })?;
            graphs.insert(bucket, BucketGraph { graph, splits });
        }
        let Some(logits) = logits else {
            return Err("no bucket to capture".into());
        };
        dev.synchronize()?;
        self.graphs = Some(DecodeGraphs { inputs, logits, graphs });
        Ok(GraphCapture { buckets, elapsed: started.elapsed(), pool_bytes: dev.alloc_stats().graph_pool_bytes })
    }

    /// On the CPU, samples through the GPU runner's path (`launch` / `wait`,
    /// the device-side penalties and log probabilities) with host tensors
    /// standing in for device memory, instead of handing the engine host
    /// logits: for tests of that path on machines without a GPU.
    pub fn set_device_path_on_cpu(&mut self, on: bool) {
        self.device_path_on_cpu = on;
    }

    fn samples_on_device(&self) -> bool {
        self.model.device() != Device::Cpu || self.device_path_on_cpu
    }

    /// Whether decode steps replay CUDA graphs.
    pub fn has_graphs(&self) -> bool {
        self.graphs.is_some()
    }

    /// A decode step through its bucket's graph, its deferred tokens fed from
    /// the device: the logits of its rows (a view of the graphs' shared buffer,
    /// valid until the next step), or `None` when the step is not one a graph
    /// holds (none captured, not a plain decode step, or more rows than the
    /// largest bucket).
    fn graph_logits(&mut self, layout: &StepLayout, deferred: &[DeferredToken]) -> Result<Option<Tensor>, RunnerError> {
        let Some(g) = self.graphs.as_mut() else {
            return Ok(None);
        };
        if !layout.is_plain_decode() {
            return Ok(None);
        }
        let Some((bucket, bucket_graph)) = bucket_mut(&mut g.graphs, layout.num_rows()) else {
            return Ok(None);
        };
        let step = g.inputs.write(layout, Some(Padding { bucket, decode_splits: bucket_graph.splits }))?;
        let m = &self.model;
        models::ctx::check_step(m.config(), m.dtype(), m.device(), &step, &self.kv)?;
        if !deferred.is_empty() {
            let tokens = self.tokens.as_mut().ok_or("deferred tokens but nothing was sampled on the device")?;
            tokens.fill_deferred(step.input_ids(), deferred)?;
        }
        bucket_graph.graph.replay()?;
        Ok(Some(g.logits.narrow(0, 0, layout.num_rows())?))
    }

    /// Runs a decode step (one new token per sequence) through the graph of the
    /// smallest bucket that holds it: the logits `[seqs.len(), vocab]`, a view of
    /// the graphs' shared buffer valid until the next step; `None` when no graph
    /// holds it (none captured, or more rows than the largest bucket).
    pub fn replay_decode(&mut self, seqs: &[SeqStep<'_>]) -> Result<Option<Tensor>, RunnerError> {
        if let Some((i, _)) = seqs.iter().enumerate().find(|(_, s)| s.new_tokens.len() != 1) {
            return Err(format!("sequence {i} of a decode step feeds more than one token").into());
        }
        let layout = StepLayout::from_seqs(seqs, self.kv.page_size())?;
        self.graph_logits(&layout, &[])
    }

    /// Replays the graph that holds `rows` rows again on the inputs the last step
    /// wrote (timing the graph alone; the logits land in the shared buffer).
    pub fn replay_again(&mut self, rows: usize) -> Result<(), RunnerError> {
        let g = self.graphs.as_mut().ok_or("no CUDA graphs were captured")?;
        let (_, bucket_graph) = bucket_mut(&mut g.graphs, rows).ok_or("no bucket holds the step")?;
        Ok(bucket_graph.graph.replay()?)
    }

    /// A decode step padded to its bucket's rows, run eagerly through the graphs'
    /// inputs with the bucket's split count (the reference a replay must equal
    /// bit for bit), and the same step replayed: `(eager, graphed)` logits of
    /// every bucket row, on the host. For tests.
    pub fn compare_graph_replay(&mut self, seqs: &[SeqStep<'_>]) -> Result<(Vec<f32>, Vec<f32>), RunnerError> {
        let g = self.graphs.as_mut().ok_or("no CUDA graphs were captured")?;
        let (bucket, bucket_graph) = bucket_mut(&mut g.graphs, seqs.len()).ok_or("no bucket holds the step")?;
        // The eager run stores the same K/V the replay stores again: both read
        // what the step itself wrote.
        let step = g.inputs.write_seqs(seqs, bucket, bucket_graph.splits)?;
        let eager = self.model.forward(&step, &self.kv)?.to_f32_vec()?;
        bucket_graph.graph.replay()?;
        let graphed = g.logits.narrow(0, 0, bucket)?.to_f32_vec()?;
        Ok((eager, graphed))
    }
}

impl CausalLmRunner {
    /// The forward pass: logits of the rows that sample, `[logits_rows, vocab]`,
    /// left on the model's device. The step's layout is written into persistent
    /// buffers as it is; deferred tokens come from the device's sampled ids.
    fn logits(&mut self, batch: &PreparedBatch) -> Result<Tensor, RunnerError> {
        let (layout, deferred) = (batch.layout(), batch.deferred());
        if let Some(logits) = self.graph_logits(layout, deferred)? {
            return Ok(logits);
        }
        let inputs = match self.eager_inputs.as_mut() {
            Some(inputs) => inputs,
            None => self.eager_inputs.insert(StepInputs::eager(self.kv.page_size(), self.model.device())?),
        };
        let step = inputs.write(layout, None)?;
        if !deferred.is_empty() {
            let tokens = self.tokens.as_mut().ok_or("deferred tokens but nothing was sampled on the device")?;
            tokens.fill_deferred(step.input_ids(), deferred)?;
        }
        Ok(self.model.forward(&step, &self.kv)?)
    }
}

/// The kernel's settings for one sampling row, with the engine's uniform number
/// for the row's (seed, output index), so that seeds reproduce on the GPU too.
fn sample_row(row: &SamplingRow) -> SampleRow {
    // f32 rounding could turn 1 - 2^-53 into 1.0: keep u below 1.
    let u = (sampling::uniform(row.seed, row.step) as f32).min(1.0 - f32::EPSILON / 2.0);
    SampleRow {
        temperature: row.temperature,
        top_k: row.top_k.map_or(0, |k| k.min(1 << 24) as u32),
        top_p: row.top_p,
        min_p: row.min_p,
        u,
    }
}

impl CausalLmRunner {
    /// Runs the step and samples on the device into the device token buffer
    /// (masking the rows of the masks `masks` computes, once the forward pass is
    /// queued, first); `false` on the CPU, where the engine samples the host
    /// logits.
    fn launch_with(
        &mut self,
        batch: &PreparedBatch,
        masks: Option<&mut dyn FnMut() -> Option<TokenMasks>>,
    ) -> Result<bool, RunnerError> {
        if !self.samples_on_device() {
            return Ok(false);
        }
        if self.tokens.is_none() {
            self.tokens = Some(DeviceTokens::new(self.model.device())?);
        }
        let logits = self.logits(batch)?;
        let masks = masks.and_then(|compute| compute());
        let rows: Vec<SampleRow> = batch.sampling().iter().map(sample_row).collect();
        self.tokens.as_mut().ok_or("device tokens")?.sample(&logits, &rows, batch.extras(), masks.as_ref())?;
        Ok(true)
    }
}

impl ModelRunner for CausalLmRunner {
    fn forward(&mut self, batch: &PreparedBatch) -> Result<Logits, RunnerError> {
        let logits = self.logits(batch)?;
        let vocab = logits.dim(1);
        Ok(Logits::new(logits.to_f32_vec()?, vocab))
    }

    /// On a GPU the logits stay there and the ids stay in [`DeviceTokens`], on
    /// their way to the host; nothing waits for the device. On the CPU the
    /// engine's sampler runs on the host logits (`false`).
    fn launch(&mut self, batch: &PreparedBatch) -> Result<bool, RunnerError> {
        self.launch_with(batch, None)
    }

    /// As [`Self::launch`], masking the constrained rows' logits on the device
    /// before sampling: the masks are computed once the forward pass is queued
    /// (the GPU runs it meanwhile) and go up through pinned staging.
    fn launch_masked(
        &mut self,
        batch: &PreparedBatch,
        masks: &mut dyn FnMut() -> Option<TokenMasks>,
    ) -> Result<bool, RunnerError> {
        self.launch_with(batch, Some(masks))
    }

    fn wait(&mut self) -> Result<SampledStep, RunnerError> {
        self.tokens.as_mut().ok_or("no step was launched on the device")?.wait()
    }

    /// On a GPU, penalties and log probabilities are computed there too.
    fn samples_extras(&self) -> bool {
        self.samples_on_device()
    }

    fn vocab_size(&self) -> usize {
        self.model.vocab_size()
    }

    fn max_context_len(&self) -> usize {
        self.max_context_len
    }
}
