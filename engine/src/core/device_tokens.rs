//! Sampled token ids that stay on the GPU (overlap scheduling).
//!
//! A step samples into the head of one persistent i32 buffer, `ids`, and a copy
//! of them to pinned host memory is queued behind it ([`DeviceTokens::wait`]
//! returns them later). The next step, launched before the host has seen them,
//! feeds its deferred tokens (`PreparedBatch::deferred`) from that head on the
//! device: the step's host ids are copied behind the sampled ones, and one
//! gather (`ops::index` over 4-byte rows) rewrites the step's `input_ids`, each
//! token taking either its own host id or the sampled id of its row. All of it
//! is queued on the one compute stream, so the gather reads the previous step's
//! ids after they are written and before this step's sampling overwrites them.
//!
//! The step's device-side extras (`StepExtras`) run around the sampling:
//! penalties from the penalty slots' counters (kept here, `[slots, vocab]` int32,
//! set up when a slot is first used and counting each step's sampled ids right
//! after it samples them), token masks, and log probabilities of the raw logits,
//! copied back with the ids. Penalties, and masks beside log probabilities, work
//! on an f32 copy of the logits: the raw rows stay for the log probabilities, and
//! f32 is the host path's arithmetic, so both paths sample the same tokens.

use std::collections::VecDeque;

use kernel_runtime::ops::{self, CountKind, RowLogprobs, SampleRow};
use kernel_runtime::staging::{Readback, Upload};
use kernel_runtime::{DType, Device, Tensor};

use crate::core::engine::{RunnerError, SampledStep};
use crate::core::grammar::TokenMasks;
use crate::core::req::DeferredToken;
use crate::core::sampling::extras::StepExtras;
use crate::core::sampling::logprobs::TokenLogprobs;

/// The sampled ids of launched steps, on the device and on their way back.
#[derive(Debug)]
pub struct DeviceTokens {
    device: Device,
    /// `[rows + tokens]` i32: the last launch's sampled ids, then room for a
    /// step's host ids (the gather's source).
    ids: Tensor,
    /// Sampled rows the head holds.
    rows: usize,
    /// Gather indices and sampling settings go up through these.
    upload: Upload,
    sample_upload: Upload,
    /// The extras' tables (penalty rows, slot setups, log-probability rows).
    extras_upload: Upload,
    /// Penalty counters `[slots, vocab]` int32 (made when first needed).
    counts: Option<Tensor>,
    /// Copies to the host of launched steps not waited for, oldest first.
    pending: VecDeque<PendingStep>,
    spare: Vec<Readback>,
}

/// The copies of one launched step on their way to the host.
#[derive(Debug)]
struct PendingStep {
    ids: Readback,
    logprobs: Option<PendingLogprobs>,
}

/// `ops::logprobs`' output of a step, and how to decode it.
#[derive(Debug)]
struct PendingLogprobs {
    words: Readback,
    /// `(sampling row, alternatives)` of each output row.
    rows: Vec<(u32, usize)>,
    cols: usize,
    vocab: usize,
}

impl DeviceTokens {
    pub fn new(device: Device) -> Result<DeviceTokens, RunnerError> {
        Ok(DeviceTokens {
            device,
            ids: Tensor::zeros(&[1024 + 4096], DType::I32, device)?,
            rows: 1024,
            upload: Upload::new(device)?,
            sample_upload: Upload::new(device)?,
            extras_upload: Upload::new(device)?,
            counts: None,
            pending: VecDeque::new(),
            spare: Vec::new(),
        })
    }

    /// Makes room for `rows` sampled ids and `tokens` host ids, keeping the
    /// sampled ids of the last launch (stream-ordered copies).
    fn reserve(&mut self, rows: usize, tokens: usize) -> Result<(), RunnerError> {
        if rows <= self.rows && self.rows + tokens <= self.ids.numel() {
            return Ok(());
        }
        let new_rows = rows.max(self.rows).next_power_of_two();
        let new_len = new_rows + tokens.max(self.ids.numel() - self.rows).next_power_of_two();
        let ids = Tensor::zeros(&[new_len], DType::I32, self.device)?;
        ops::copy(&ids.narrow(0, 0, self.rows)?, &self.ids.narrow(0, 0, self.rows)?)?;
        self.ids = ids;
        self.rows = new_rows;
        Ok(())
    }

    /// Rewrites the deferred tokens of `input_ids` (`[t]` i32 on the device)
    /// with the ids the previous launch sampled.
    pub fn fill_deferred(&mut self, input_ids: &Tensor, deferred: &[DeferredToken]) -> Result<(), RunnerError> {
        if deferred.is_empty() {
            return Ok(());
        }
        let t = input_ids.numel();
        self.reserve(0, t)?;
        let base = self.rows;
        ops::copy(&self.ids.narrow(0, base, t)?, input_ids)?;
        let mut index: Vec<i32> = (0..t).map(|i| (base + i) as i32).collect();
        for d in deferred {
            if d.row as usize >= base || d.token as usize >= t {
                return Err(format!("deferred token {d:?} is outside the step or the sampled ids").into());
            }
            index[d.token as usize] = d.row as i32;
        }
        let index_t = Tensor::empty(&[t], DType::I32, self.device)?;
        self.upload.begin()?;
        self.upload.write_rows(&index_t, &index, t)?;
        let source = self.ids.narrow(0, 0, base + t)?.reshape(&[base + t, 1])?;
        ops::index(&input_ids.reshape(&[t, 1])?, &source, &index_t, 0)?;
        Ok(())
    }

    /// Samples every row of `logits` into the head of the buffer, with the
    /// step's extras and the masks of its constrained rows, and queues the copies
    /// of the ids (and log probabilities) to the host, without waiting.
    pub fn sample(
        &mut self,
        logits: &Tensor,
        rows: &[SampleRow],
        extras: &StepExtras,
        masks: Option<&TokenMasks>,
    ) -> Result<(), RunnerError> {
        self.reserve(rows.len(), 0)?;
        let out = self.ids.narrow(0, 0, rows.len())?;
        let penalised = !extras.penalties.is_empty();
        let work = if penalised || (masks.is_some() && !extras.logprobs.is_empty()) {
            ops::cast(logits, DType::F32)?
        } else {
            logits.clone()
        };
        self.extras_upload.begin()?;
        let counts =
            if penalised || !extras.setups.is_empty() { Some(self.set_up_slots(extras, logits.dim(1))?) } else { None };
        if let Some(counts) = &counts {
            ops::apply_penalties(&work, counts, &extras.penalties, &mut self.extras_upload)?;
        }
        if let Some(m) = masks {
            ops::apply_token_mask(&work, m.bits(), m.words_per_row(), m.rows())?;
        }
        self.sample_upload.begin()?;
        ops::sample_into(&work, rows, &out, &mut self.sample_upload)?;
        if let Some(counts) = &counts {
            // The next step's penalties see this step's tokens, which only the
            // device knows yet.
            let slots = Tensor::empty(&[rows.len()], DType::I32, self.device)?;
            self.extras_upload.write_rows(&slots, &extras.row_slots(rows.len()), rows.len())?;
            ops::penalty_count(counts, &slots, &out, CountKind::Output)?;
        }
        let logprobs = if extras.logprobs.is_empty() {
            None
        } else {
            let top_n = extras.max_top_logprobs();
            let cols = ops::logprobs_cols(top_n);
            let lp_rows: Vec<u32> = extras.logprobs.iter().map(|&(r, _)| r).collect();
            let words = Tensor::empty(&[lp_rows.len(), cols], DType::I32, self.device)?;
            ops::logprobs(logits, &lp_rows, &out, top_n, &words, &mut self.extras_upload)?;
            let mut readback = self.take_readback()?;
            readback.start(&words)?;
            Some(PendingLogprobs { words: readback, rows: extras.logprobs.clone(), cols, vocab: logits.dim(1) })
        };
        let mut ids = self.take_readback()?;
        ids.start(&out)?;
        self.pending.push_back(PendingStep { ids, logprobs });
        Ok(())
    }

    /// The penalty counters, with room for every slot of `extras` and its new
    /// slots set up: cleared, prompt tokens marked, known outputs counted.
    fn set_up_slots(&mut self, extras: &StepExtras, vocab: usize) -> Result<Tensor, RunnerError> {
        let needed = extras
            .penalties
            .iter()
            .map(|p| p.slot)
            .chain(extras.setups.iter().map(|s| s.slot))
            .max()
            .map_or(0, |s| s as usize + 1);
        let counts = match self.counts.take() {
            Some(c) if c.dim(0) >= needed && c.dim(1) == vocab => c,
            old => {
                let grown = Tensor::zeros(&[needed.next_power_of_two().max(8), vocab], DType::I32, self.device)?;
                if let Some(old) = old.filter(|o| o.dim(1) == vocab) {
                    ops::copy(&grown.narrow(0, 0, old.dim(0))?, &old)?;
                }
                grown
            }
        };
        self.counts = Some(counts.clone());
        if extras.setups.is_empty() {
            return Ok(counts);
        }
        for setup in &extras.setups {
            counts.narrow(0, setup.slot as usize, 1)?.fill_zero()?;
        }
        for kind in [CountKind::Prompt, CountKind::Output] {
            let (slots, tokens): (Vec<i32>, Vec<i32>) = extras
                .setups
                .iter()
                .flat_map(|s| {
                    let tokens = if kind == CountKind::Prompt { &s.prompt } else { &s.outputs };
                    tokens.iter().map(move |&t| (s.slot as i32, t as i32))
                })
                .unzip();
            if slots.is_empty() {
                continue;
            }
            let slots_t = Tensor::empty(&[slots.len()], DType::I32, self.device)?;
            let tokens_t = Tensor::empty(&[tokens.len()], DType::I32, self.device)?;
            self.extras_upload.write_rows(&slots_t, &slots, slots.len())?;
            self.extras_upload.write_rows(&tokens_t, &tokens, tokens.len())?;
            ops::penalty_count(&counts, &slots_t, &tokens_t, kind)?;
        }
        Ok(counts)
    }

    fn take_readback(&mut self) -> Result<Readback, RunnerError> {
        Ok(match self.spare.pop() {
            Some(r) => r,
            None => Readback::new(self.device)?,
        })
    }

    /// The ids (and log probabilities) of the oldest launched step not waited
    /// for, once the device has them.
    pub fn wait(&mut self) -> Result<SampledStep, RunnerError> {
        let mut step = self.pending.pop_front().ok_or("no step was launched on the device")?;
        let ids = step.ids.wait::<i32>();
        self.spare.push(step.ids);
        let tokens = ids?.into_iter().map(|t| t.max(0) as u32).collect();
        let mut logprobs = Vec::new();
        if let Some(mut lp) = step.logprobs.take() {
            let words = lp.words.wait::<i32>();
            self.spare.push(lp.words);
            let words = words?;
            for (k, &(row, top_n)) in lp.rows.iter().enumerate() {
                let Some(w) = words.get(k * lp.cols..(k + 1) * lp.cols) else {
                    return Err("the log probabilities came back short".into());
                };
                let RowLogprobs { token, logprob, top } = RowLogprobs::decode(w, top_n, lp.vocab);
                logprobs.push((row, TokenLogprobs { token, logprob, top }));
            }
        }
        Ok(SampledStep { tokens, logprobs })
    }
}

#[cfg(test)]
mod tests {
    use kernel_runtime::ops::PenaltyRow;

    use super::*;
    use crate::core::sampling::extras::SlotSetup;
    use crate::core::sampling::logprobs::token_logprobs;
    use crate::core::sampling::penalties::Penalties;
    use crate::core::sampling::{argmax, uniform};

    const VOCAB: usize = 37;

    fn logits(step: u64, rows: usize) -> Vec<f32> {
        (0..rows * VOCAB).map(|i| (uniform(step, i as u64) * 6.0 - 3.0) as f32).collect()
    }

    /// Three greedy rows over three steps on the CPU "device": rows 0 and 2 have
    /// penalties (their slots set up on the first step), rows 1 and 2 report log
    /// probabilities, row 1 is masked on the last step. Tokens and log
    /// probabilities equal the host path's (`Penalties::apply`, argmax of the
    /// masked row, `token_logprobs` of the raw row), the sampled tokens counted
    /// on the device from step to step.
    #[test]
    fn extras_on_the_device_equal_the_host_path() {
        let mut dev = DeviceTokens::new(Device::Cpu).expect("cpu");
        let pens = [
            Penalties { repetition: 1.5, frequency: 0.3, presence: 0.2 },
            Penalties::NONE,
            Penalties { repetition: 0.7, frequency: -0.4, presence: 0.5 },
        ];
        let prompts: [Vec<u32>; 3] = [vec![1, 5, 5, 9], vec![2], vec![3, 36, 40]];
        let mut outputs: [Vec<u32>; 3] = [vec![], vec![], vec![7]];
        let rows = [SampleRow::greedy(); 3];
        for step in 0..3u64 {
            let raw = logits(step, 3);
            let t = Tensor::from_slice(&raw, &[3, VOCAB], Device::Cpu).expect("tensor");
            let penalty_row = |r: usize, slot: u32| {
                let p = pens[r];
                PenaltyRow {
                    row: r as u32,
                    slot,
                    repetition: p.repetition,
                    frequency: p.frequency,
                    presence: p.presence,
                }
            };
            let setups = if step == 0 {
                [(0usize, 4u32), (2, 1)]
                    .iter()
                    .map(|&(r, slot)| SlotSetup { slot, prompt: prompts[r].clone(), outputs: outputs[r].clone() })
                    .collect()
            } else {
                Vec::new()
            };
            let extras = StepExtras {
                setups,
                penalties: vec![penalty_row(0, 4), penalty_row(2, 1)],
                logprobs: vec![(1, 3), (2, 0)],
            };
            let masks = (step == 2).then(|| {
                let mut m = TokenMasks::zeroed(VOCAB, vec![1]);
                m.bits_mut()[0] = 0b1011_0000;
                m
            });
            dev.sample(&t, &rows, &extras, masks.as_ref()).expect("sample");
            let got = dev.wait().expect("wait");
            for r in 0..3 {
                let mut row = raw[r * VOCAB..(r + 1) * VOCAB].to_vec();
                pens[r].apply(&mut row, &prompts[r], &outputs[r]);
                if let Some(m) = &masks {
                    if r == 1 {
                        crate::core::grammar::apply_token_mask(&mut row, m.mask(0));
                    }
                }
                assert_eq!(got.tokens[r], argmax(&row), "step {step} row {r}");
            }
            let want: Vec<(u32, TokenLogprobs)> = [(1usize, 3usize), (2, 0)]
                .iter()
                .map(|&(r, n)| (r as u32, token_logprobs(&raw[r * VOCAB..(r + 1) * VOCAB], got.tokens[r], n)))
                .collect();
            assert_eq!(got.logprobs, want, "step {step}");
            for (r, out) in outputs.iter_mut().enumerate() {
                out.push(got.tokens[r]);
            }
        }
    }
}
