//! The messages between rank 0 and the other ranks, on the control channel
//! (framed by `wire`).
//!
//! | from | message | when |
//! | --- | --- | --- |
//! | worker | `Hello` (rank, world size, [`RankArgs`]) | first, at the rendezvous |
//! | rank 0 | `Welcome` ([`CommSetup`]) or `Reject` (why) | once every rank said hello |
//! | rank 0 | `Start` ([`StartInfo`]: pages, context, graphs) | once its model is loaded |
//! | worker | `Ready` or `Failed` (why) | after `Start` (and after any step that fails) |
//! | rank 0 | `Step` ([`StepMsg`]), `Wait`, `Shutdown` | per step, as the engine calls its runner |
//!
//! A step travels as the scheduler built it: the `models::StepLayout` plus the
//! sampling rows and deferred tokens (and a constrained step's token masks, and
//! the device-side penalties and log probabilities, `StepExtras`: every rank
//! keeps the same penalty counters), so that every rank makes the same runner
//! call on the same inputs and samples the same tokens.

use models::StepLayout;

use kernel_runtime::ops::PenaltyRow;

use crate::core::req::{DeferredToken, Phase, PreparedBatch};
use crate::core::sampling::extras::{SlotSetup, StepExtras};
use crate::core::sampling::SamplingRow;
use crate::core::tp::wire::{Dec, Enc, WireError};

/// What every rank must agree on, checked at the rendezvous.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankArgs {
    /// The model's name as given (for messages) and a hash of its config, which
    /// is what must match (paths may differ between machines).
    pub model: String,
    pub model_fingerprint: String,
    pub device_kind: String,
    pub dtype: String,
    pub load_format: String,
    pub attn: String,
    pub moe: String,
    pub page_size: u64,
    pub num_pages: Option<u64>,
    pub max_model_len: Option<u64>,
}

impl RankArgs {
    /// The first argument in which `other` (of rank `rank`) differs from `self`
    /// (rank 0's), in words.
    pub fn mismatch(&self, other: &RankArgs, rank: usize) -> Option<String> {
        let fields: [(&str, String, String); 9] = [
            ("the model (config.json)", self.model_fingerprint.clone(), other.model_fingerprint.clone()),
            ("--device", self.device_kind.clone(), other.device_kind.clone()),
            ("--dtype", self.dtype.clone(), other.dtype.clone()),
            ("--load-format", self.load_format.clone(), other.load_format.clone()),
            ("--attn", self.attn.clone(), other.attn.clone()),
            ("--moe", self.moe.clone(), other.moe.clone()),
            ("--page-size", self.page_size.to_string(), other.page_size.to_string()),
            ("--num-pages", format!("{:?}", self.num_pages), format!("{:?}", other.num_pages)),
            ("--max-model-len", format!("{:?}", self.max_model_len), format!("{:?}", other.max_model_len)),
        ];
        fields.into_iter().find(|(_, a, b)| a != b).map(|(what, mine, theirs)| {
            let (mine, theirs) = if what.starts_with("the model") {
                (format!("{} ({mine:.12})", self.model), format!("{} ({theirs:.12})", other.model))
            } else {
                (mine, theirs)
            };
            format!("{what} differs: rank {rank} has {theirs}, rank 0 has {mine}")
        })
    }

    fn encode(&self, e: &mut Enc) {
        e.str(&self.model)
            .str(&self.model_fingerprint)
            .str(&self.device_kind)
            .str(&self.dtype)
            .str(&self.load_format)
            .str(&self.attn)
            .str(&self.moe)
            .u64(self.page_size)
            .opt_u64(self.num_pages)
            .opt_u64(self.max_model_len);
    }

    fn decode(d: &mut Dec<'_>) -> Result<RankArgs, WireError> {
        Ok(RankArgs {
            model: d.str("model")?,
            model_fingerprint: d.str("model fingerprint")?,
            device_kind: d.str("device")?,
            dtype: d.str("dtype")?,
            load_format: d.str("load format")?,
            attn: d.str("attn")?,
            moe: d.str("moe")?,
            page_size: d.u64("page size")?,
            num_pages: d.opt_u64("num pages")?,
            max_model_len: d.opt_u64("max model len")?,
        })
    }
}

/// How the ranks' collectives connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommSetup {
    /// CPU: connect to rank 0's collective listener on this port (of the
    /// rendezvous host).
    Tcp { port: u16 },
    /// GPU: join NCCL with rank 0's unique id.
    Nccl { unique_id: Vec<u8> },
}

/// What a worker needs to build its runner, decided by rank 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartInfo {
    pub num_pages: usize,
    pub max_context_len: usize,
    /// Largest decode batch to capture CUDA graphs for (0: none).
    pub graph_max_bs: usize,
}

/// Which runner call a step is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    Forward,
    Launch,
    LaunchMasked,
}

/// A constrained step's token masks (`grammar::TokenMasks` as parts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaskParts {
    pub vocab_size: usize,
    pub rows: Vec<u32>,
    pub bits: Vec<u32>,
}

/// One step, as rank 0's runner was called with it.
#[derive(Debug, Clone, PartialEq)]
pub struct StepMsg {
    pub call: Call,
    pub layout: StepLayout,
    pub sampling: Vec<SamplingRow>,
    pub deferred: Vec<DeferredToken>,
    pub masks: Option<MaskParts>,
    pub extras: StepExtras,
}

impl StepMsg {
    /// The batch a runner reads: the layout, sampling rows and deferred tokens
    /// (a worker has no requests, so rows and chunk lengths stay empty; runners
    /// do not read them).
    pub fn into_batch(self) -> PreparedBatch {
        let phase = if self.layout.num_tokens() == self.layout.num_rows() { Phase::Decode } else { Phase::Prefill };
        PreparedBatch {
            phase,
            rows: Vec::new(),
            layout: self.layout,
            q_lens: Vec::new(),
            sampling: self.sampling,
            needs_host_logits: self.call == Call::Forward,
            deferred: self.deferred,
            deferred_step: 0,
            extras: self.extras,
        }
    }
}

/// Rank 0 to a worker.
#[derive(Debug, Clone, PartialEq)]
pub enum ToWorker {
    Welcome(CommSetup),
    Reject(String),
    Start(StartInfo),
    Step(Box<StepMsg>),
    Wait,
    Shutdown,
}

/// A worker to rank 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToLeader {
    Hello { rank: usize, world_size: usize, args: RankArgs },
    Ready,
    Failed(String),
}

const HELLO: u8 = 1;
const WELCOME: u8 = 2;
const REJECT: u8 = 3;
const START: u8 = 4;
const READY: u8 = 5;
const FAILED: u8 = 6;
const STEP: u8 = 7;
const WAIT: u8 = 8;
const SHUTDOWN: u8 = 9;

fn encode_step(e: &mut Enc, s: &StepMsg) {
    e.u8(match s.call {
        Call::Forward => 0,
        Call::Launch => 1,
        Call::LaunchMasked => 2,
    });
    let l = &s.layout;
    e.u64(l.page_size as u64)
        .u32s(&l.input_ids)
        .u32s(&l.positions)
        .u32s(&l.out_loc)
        .u32s(&l.q_indptr)
        .u32s(&l.kv_lens)
        .u64(l.width as u64)
        .u32s(&l.page_table)
        .u32s(&l.logits_rows);
    e.u32(s.sampling.len() as u32);
    for r in &s.sampling {
        e.f32(r.temperature).opt_u64(r.top_k.map(|k| k as u64)).f32(r.top_p).f32(r.min_p).u64(r.seed).u64(r.step);
    }
    e.u32(s.deferred.len() as u32);
    for d in &s.deferred {
        e.u32(d.token).u32(d.row);
    }
    match &s.masks {
        Some(m) => e.u8(1).u64(m.vocab_size as u64).u32s(&m.rows).u32s(&m.bits),
        None => e.u8(0),
    };
    let x = &s.extras;
    e.u32(x.setups.len() as u32);
    for setup in &x.setups {
        e.u32(setup.slot).u32s(&setup.prompt).u32s(&setup.outputs);
    }
    e.u32(x.penalties.len() as u32);
    for p in &x.penalties {
        e.u32(p.row).u32(p.slot).f32(p.repetition).f32(p.frequency).f32(p.presence);
    }
    e.u32(x.logprobs.len() as u32);
    for &(row, top_n) in &x.logprobs {
        e.u32(row).u64(top_n as u64);
    }
}

fn decode_extras(d: &mut Dec<'_>) -> Result<StepExtras, WireError> {
    // Every entry takes bytes of the body: a count beyond it is refused by `take`.
    let n = d.u32("slot setups")? as usize;
    let mut setups = Vec::with_capacity(n.min(1 << 10));
    for _ in 0..n {
        setups.push(SlotSetup {
            slot: d.u32("penalty slot")?,
            prompt: d.u32s("slot prompt")?,
            outputs: d.u32s("slot outputs")?,
        });
    }
    let n = d.u32("penalised rows")? as usize;
    let mut penalties = Vec::with_capacity(n.min(1 << 16));
    for _ in 0..n {
        penalties.push(PenaltyRow {
            row: d.u32("penalised row")?,
            slot: d.u32("penalised slot")?,
            repetition: d.f32("repetition")?,
            frequency: d.f32("frequency")?,
            presence: d.f32("presence")?,
        });
    }
    let n = d.u32("log-probability rows")? as usize;
    let mut logprobs = Vec::with_capacity(n.min(1 << 16));
    for _ in 0..n {
        logprobs.push((d.u32("log-probability row")?, d.usize("top log probabilities")?));
    }
    Ok(StepExtras { setups, penalties, logprobs })
}

fn decode_step(d: &mut Dec<'_>) -> Result<StepMsg, WireError> {
    let call = match d.u8("call")? {
        0 => Call::Forward,
        1 => Call::Launch,
        2 => Call::LaunchMasked,
        c => return Err(WireError::Malformed(format!("unknown runner call {c}"))),
    };
    let layout = StepLayout {
        page_size: d.usize("page size")?,
        input_ids: d.u32s("input ids")?,
        positions: d.u32s("positions")?,
        out_loc: d.u32s("out loc")?,
        q_indptr: d.u32s("q indptr")?,
        kv_lens: d.u32s("kv lens")?,
        width: d.usize("width")?,
        page_table: d.u32s("page table")?,
        logits_rows: d.u32s("logits rows")?,
    };
    // Each row is at least 25 bytes: a count beyond the body is refused by `take`.
    let n = d.u32("sampling rows")? as usize;
    let mut sampling = Vec::with_capacity(n.min(1 << 16));
    for _ in 0..n {
        sampling.push(SamplingRow {
            temperature: d.f32("temperature")?,
            top_k: d.opt_u64("top k")?.map(|k| k.min(usize::MAX as u64) as usize),
            top_p: d.f32("top p")?,
            min_p: d.f32("min p")?,
            seed: d.u64("seed")?,
            step: d.u64("step")?,
        });
    }
    let n = d.u32("deferred tokens")? as usize;
    let mut deferred = Vec::with_capacity(n.min(1 << 16));
    for _ in 0..n {
        deferred.push(DeferredToken { token: d.u32("deferred token")?, row: d.u32("deferred row")? });
    }
    let masks = match d.u8("masks")? {
        0 => None,
        1 => Some(MaskParts {
            vocab_size: d.usize("mask vocab")?,
            rows: d.u32s("mask rows")?,
            bits: d.u32s("mask bits")?,
        }),
        t => return Err(WireError::Malformed(format!("masks tag {t}"))),
    };
    let extras = decode_extras(d)?;
    layout.check().map_err(|e| WireError::Malformed(format!("step layout: {e}")))?;
    Ok(StepMsg { call, layout, sampling, deferred, masks, extras })
}

impl ToWorker {
    /// `(kind, body)` of the frame.
    pub fn encode(&self) -> (u8, Vec<u8>) {
        let mut e = Enc::new();
        let kind = match self {
            ToWorker::Welcome(CommSetup::Tcp { port }) => {
                e.u8(0).u32(u32::from(*port));
                WELCOME
            }
            ToWorker::Welcome(CommSetup::Nccl { unique_id }) => {
                e.u8(1).bytes(unique_id);
                WELCOME
            }
            ToWorker::Reject(why) => {
                e.str(why);
                REJECT
            }
            ToWorker::Start(s) => {
                e.u64(s.num_pages as u64).u64(s.max_context_len as u64).u64(s.graph_max_bs as u64);
                START
            }
            ToWorker::Step(s) => {
                encode_step(&mut e, s);
                STEP
            }
            ToWorker::Wait => WAIT,
            ToWorker::Shutdown => SHUTDOWN,
        };
        (kind, e.finish())
    }

    pub fn decode(kind: u8, body: &[u8]) -> Result<ToWorker, WireError> {
        let mut d = Dec::new(body);
        let msg = match kind {
            WELCOME => match d.u8("comm")? {
                0 => {
                    let port = u16::try_from(d.u32("port")?).map_err(|_| WireError::Malformed("port".into()))?;
                    ToWorker::Welcome(CommSetup::Tcp { port })
                }
                1 => ToWorker::Welcome(CommSetup::Nccl { unique_id: d.bytes("unique id")? }),
                t => return Err(WireError::Malformed(format!("comm tag {t}"))),
            },
            REJECT => ToWorker::Reject(d.str("reason")?),
            START => ToWorker::Start(StartInfo {
                num_pages: d.usize("num pages")?,
                max_context_len: d.usize("max context")?,
                graph_max_bs: d.usize("graph max bs")?,
            }),
            STEP => ToWorker::Step(Box::new(decode_step(&mut d)?)),
            WAIT => ToWorker::Wait,
            SHUTDOWN => ToWorker::Shutdown,
            k => return Err(WireError::Malformed(format!("unknown message kind {k} from rank 0"))),
        };
        d.end("message from rank 0")?;
        Ok(msg)
    }
}

impl ToLeader {
    pub fn encode(&self) -> (u8, Vec<u8>) {
        let mut e = Enc::new();
        let kind = match self {
            ToLeader::Hello { rank, world_size, args } => {
                e.u64(*rank as u64).u64(*world_size as u64);
                args.encode(&mut e);
                HELLO
            }
            ToLeader::Ready => READY,
            ToLeader::Failed(why) => {
                e.str(why);
                FAILED
            }
        };
        (kind, e.finish())
    }

    pub fn decode(kind: u8, body: &[u8]) -> Result<ToLeader, WireError> {
        let mut d = Dec::new(body);
        let msg = match kind {
            HELLO => ToLeader::Hello {
                rank: d.usize("rank")?,
                world_size: d.usize("world size")?,
                args: RankArgs::decode(&mut d)?,
            },
            READY => ToLeader::Ready,
            FAILED => ToLeader::Failed(d.str("reason")?),
            k => return Err(WireError::Malformed(format!("unknown message kind {k} from a worker"))),
        };
        d.end("message from a worker")?;
        Ok(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_round_trips() {
        let layout = StepLayout {
            page_size: 4,
            input_ids: vec![5, 0],
            positions: vec![3, 7],
            out_loc: vec![11, 29],
            q_indptr: vec![0, 1, 2],
            kv_lens: vec![4, 8],
            width: 2,
            page_table: vec![2, 0, 6, 7],
            logits_rows: vec![0, 1],
        };
        let step = StepMsg {
            call: Call::LaunchMasked,
            layout,
            sampling: vec![
                SamplingRow::greedy(),
                SamplingRow { top_k: Some(5), seed: 9, step: 2, ..SamplingRow::greedy() },
            ],
            deferred: vec![DeferredToken { token: 1, row: 0 }],
            masks: Some(MaskParts { vocab_size: 40, rows: vec![1], bits: vec![3, 4] }),
            extras: StepExtras {
                setups: vec![SlotSetup { slot: 3, prompt: vec![5, 9, 9], outputs: vec![2] }],
                penalties: vec![PenaltyRow { row: 1, slot: 3, repetition: 1.2, frequency: 0.5, presence: -0.25 }],
                logprobs: vec![(0, 20), (1, 0)],
            },
        };
        let msg = ToWorker::Step(Box::new(step));
        let (kind, body) = msg.encode();
        assert_eq!(ToWorker::decode(kind, &body).unwrap(), msg);
        // A truncated body is an error.
        assert!(ToWorker::decode(kind, &body[..body.len() - 3]).is_err());
    }

    #[test]
    fn hello_round_trips_and_mismatches_are_named() {
        let args = RankArgs {
            model: "llama".into(),
            model_fingerprint: "abc".into(),
            device_kind: "cpu".into(),
            dtype: "auto".into(),
            load_format: "auto".into(),
            attn: "paged".into(),
            moe: "fused".into(),
            page_size: 16,
            num_pages: None,
            max_model_len: Some(64),
        };
        let hello = ToLeader::Hello { rank: 1, world_size: 2, args: args.clone() };
        let (kind, body) = hello.encode();
        assert_eq!(ToLeader::decode(kind, &body).unwrap(), hello);
        assert_eq!(args.mismatch(&args, 1), None);
        let other = RankArgs { dtype: "bf16".into(), ..args.clone() };
        let why = args.mismatch(&other, 3).unwrap();
        assert!(why.contains("--dtype") && why.contains("rank 3 has bf16"), "{why}");
        let other = RankArgs { model_fingerprint: "xyz".into(), model: "qwen".into(), ..args.clone() };
        assert!(args.mismatch(&other, 1).unwrap().contains("the model"));
    }
}
