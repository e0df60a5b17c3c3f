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

use std::collections::VecDeque;

use kernel_runtime::ops::{self, SampleRow};
use kernel_runtime::staging::{Readback, Upload};
use kernel_runtime::{DType, Device, Tensor};

use crate::core::engine::RunnerError;
use crate::core::req::DeferredToken;

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
    /// Copies to the host of launched steps not waited for, oldest first.
    pending: VecDeque<Readback>,
    spare: Vec<Readback>,
}

impl DeviceTokens {
    pub fn new(device: Device) -> Result<DeviceTokens, RunnerError> {
        Ok(DeviceTokens {
            device,
            ids: Tensor::zeros(&[1024 + 4096], DType::I32, device)?,
            rows: 1024,
            upload: Upload::new(device)?,
            sample_upload: Upload::new(device)?,
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

    /// Samples every row of `logits` into the head of the buffer and queues the
    /// copy of the ids to the host, without waiting.
    pub fn sample(&mut self, logits: &Tensor, rows: &[SampleRow]) -> Result<(), RunnerError> {
        self.reserve(rows.len(), 0)?;
        let out = self.ids.narrow(0, 0, rows.len())?;
        self.sample_upload.begin()?;
        ops::sample_into(logits, rows, &out, &mut self.sample_upload)?;
        let mut readback = match self.spare.pop() {
            Some(r) => r,
            None => Readback::new(self.device)?,
        };
        readback.start(&out)?;
        self.pending.push_back(readback);
        Ok(())
    }

    /// The ids of the oldest launched step not waited for, once the device has
    /// them.
    pub fn wait(&mut self) -> Result<Vec<u32>, RunnerError> {
        let mut readback = self.pending.pop_front().ok_or("no step was launched on the device")?;
        let ids = readback.wait::<i32>();
        self.spare.push(readback);
        Ok(ids?.into_iter().map(|t| t.max(0) as u32).collect())
    }
}
