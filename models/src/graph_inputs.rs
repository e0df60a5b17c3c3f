//! Persistent device inputs of steps: a [`StepLayout`] written in place into
//! buffers allocated once, through pinned staging (no allocation, and no wait
//! for the stream, on the step path: the host can write step n+1 while the GPU
//! runs step n, the copy queued behind it).
//!
//! CUDA graphs need this: a graph replays its kernels with the addresses it was
//! captured with. A decode step of `b` sequences runs in the graph of the next
//! bucket `B >= b`; the `B - b` padding rows feed token 0 at position 0 into a
//! scratch page that no request owns (`pad_page`, one page past the engine's
//! pool), attend to that one key, and their logits are ignored. Eager steps
//! (prefill, mixed, or larger than every bucket) use their own [`StepInputs`],
//! which grow when a step outgrows them.
//!
//! Layout of a step of `B` rows and `T` tokens in the packed i32 buffer (one
//! host-to-device copy): `ids[T] | positions[T] | out_loc[T] | q_indptr[B + 1] |
//! kv_lens[B] | logit_rows[L]` (a padded decode step has `T = B` and no
//! `logit_rows`: every row gets logits). The page table is its own buffer,
//! `[B, width]` row-major: for graphs `width` is fixed (the context's pages) and
//! one 2-D copy writes the columns the step uses (columns past a row's pages are
//! never read); for eager steps `width` is the step's own.

use kernel_runtime::staging::Upload;
use kernel_runtime::{DType, Device, Tensor};

use crate::ctx::{BatchParts, ForwardBatch, SeqStep};
use crate::error::{ModelError, Result};
use crate::layout::StepLayout;

/// Padding of a step to a CUDA graph's bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Padding {
    /// Rows of the graph (at least the step's).
    pub bucket: usize,
    /// The decode kernel's split count fixed at capture.
    pub decode_splits: usize,
}

/// Persistent buffers for the inputs of steps, on one device.
#[derive(Debug)]
pub struct StepInputs {
    /// i32 (see the module header).
    packed: Tensor,
    /// i32, `[rows * width]` flat: viewed `[rows, width]` per step.
    table: Tensor,
    /// Fixed page-table width of padded (graphed) steps; `None`: eager inputs,
    /// which grow and use each step's own width.
    graph_width: Option<usize>,
    page_size: usize,
    pad_page: u32,
    device: Device,
    upload: Upload,
}

/// A decode step's inputs for CUDA graphs (the name the runner knew them by).
pub type DecodeGraphInputs = StepInputs;

impl StepInputs {
    /// Buffers for padded decode steps of up to `max_batch` rows whose sequences
    /// hold up to `max_context_len` tokens in pages of `page_size`; padding rows
    /// use page `pad_page`. They never grow (graphs hold their addresses).
    pub fn new(
        max_batch: usize,
        max_context_len: usize,
        page_size: usize,
        pad_page: u32,
        device: Device,
    ) -> Result<StepInputs> {
        if max_batch == 0 || page_size == 0 || max_context_len == 0 {
            return Err(ModelError::Batch(format!(
                "graph inputs need rows, pages and a context (got {max_batch} rows, pages of {page_size}, context {max_context_len})"
            )));
        }
        let width = max_context_len.div_ceil(page_size);
        let slots = (pad_page as usize + 1).checked_mul(page_size);
        if slots.is_none_or(|s| s > i32::MAX as usize) || max_context_len > i32::MAX as usize {
            return Err(ModelError::Batch("the KV pool does not fit 32-bit slots".into()));
        }
        Ok(StepInputs {
            packed: Tensor::zeros(&[5 * max_batch + 1], DType::I32, device)?,
            table: Tensor::zeros(&[max_batch * width], DType::I32, device)?,
            graph_width: Some(width),
            page_size,
            pad_page,
            device,
            upload: Upload::new(device)?,
        })
    }

    /// Buffers for eager steps of pages of `page_size` tokens, grown on demand.
    pub fn eager(page_size: usize, device: Device) -> Result<StepInputs> {
        if page_size == 0 {
            return Err(ModelError::Batch("page size 0".into()));
        }
        Ok(StepInputs {
            packed: Tensor::zeros(&[4096], DType::I32, device)?,
            table: Tensor::zeros(&[4096], DType::I32, device)?,
            graph_width: None,
            page_size,
            pad_page: 0,
            device,
            upload: Upload::new(device)?,
        })
    }

    /// The most rows a padded step may have (graph inputs).
    pub fn max_batch(&self) -> usize {
        (self.packed.numel() - 1) / 5
    }

    /// The page padding rows write to.
    pub fn pad_page(&self) -> u32 {
        self.pad_page
    }

    /// Writes a decode step of `seqs` (one new token each) padded to `bucket`
    /// rows (the per-sequence form of [`Self::write`], for tests and tools).
    /// `seqs` may be empty (a capture of padding only).
    pub fn write_seqs(&mut self, seqs: &[SeqStep<'_>], bucket: usize, decode_splits: usize) -> Result<ForwardBatch> {
        if let Some((i, s)) = seqs.iter().enumerate().find(|(_, s)| s.new_tokens.len() != 1) {
            return Err(ModelError::Batch(format!(
                "sequence {i} of a graphed decode step has {} new tokens, not 1",
                s.new_tokens.len()
            )));
        }
        let layout = StepLayout::from_seqs(seqs, self.page_size)?;
        self.write(&layout, Some(Padding { bucket, decode_splits }))
    }

    /// Writes `layout` into the buffers (padded to `pad.bucket` rows for a graph)
    /// and returns its batch, whose tensors are views of them. With padding the
    /// step must be a plain decode step ([`StepLayout::is_plain_decode`]), or
    /// empty (a capture of padding only).
    pub fn write(&mut self, layout: &StepLayout, pad: Option<Padding>) -> Result<ForwardBatch> {
        if layout.page_size != self.page_size {
            return Err(ModelError::Batch(format!(
                "step built for pages of {} tokens, inputs for {}",
                layout.page_size, self.page_size
            )));
        }
        let empty = layout.num_rows() == 0;
        if !empty {
            layout.check()?;
        }
        let (b, t) = (layout.num_rows(), layout.num_tokens());
        let ps = self.page_size;
        let mut max_page = layout.max_page();
        let (rows, tokens, width, logit_rows) = match pad {
            Some(p) => {
                let Some(width) = self.graph_width else {
                    return Err(ModelError::Batch("eager step inputs cannot pad to a graph".into()));
                };
                if !empty && !layout.is_plain_decode() {
                    return Err(ModelError::Batch(
                        "a padded step must be a decode step with logits of every row".into(),
                    ));
                }
                if p.bucket < b.max(1) || p.bucket > self.max_batch() {
                    return Err(ModelError::Batch(format!(
                        "a decode step of {b} rows does not fit a graph of {} (at most {})",
                        p.bucket,
                        self.max_batch()
                    )));
                }
                if layout.width > width {
                    return Err(ModelError::Batch(format!(
                        "a sequence holds {} pages, graph inputs were sized for {width}",
                        layout.width
                    )));
                }
                max_page = Some(max_page.map_or(self.pad_page, |m| m.max(self.pad_page)));
                (p.bucket, p.bucket, width, None)
            }
            None => {
                if empty {
                    return Err(ModelError::Batch("a step needs at least one sequence".into()));
                }
                (b, t, layout.width.max(1), Some(layout.logits_rows.len()))
            }
        };
        let num_logits = logit_rows.unwrap_or(0);
        let packed_len = 3 * tokens + 2 * rows + 1 + num_logits;
        self.reserve(packed_len, rows * width)?;

        let mut packed = Vec::with_capacity(packed_len);
        let pad_slot = (self.pad_page as usize * ps) as i32;
        packed.extend(i32s(&layout.input_ids));
        packed.extend(std::iter::repeat_n(0, tokens - t));
        packed.extend(i32s(&layout.positions));
        packed.extend(std::iter::repeat_n(0, tokens - t));
        packed.extend(i32s(&layout.out_loc));
        packed.extend(std::iter::repeat_n(pad_slot, tokens - t));
        if empty {
            packed.push(0);
        } else {
            packed.extend(i32s(&layout.q_indptr));
        }
        packed.extend((t + 1..=tokens).map(|i| i as i32));
        packed.extend(i32s(&layout.kv_lens));
        packed.extend(std::iter::repeat_n(1, rows - b));
        packed.extend(layout.logits_rows.iter().map(|&r| layout.q_indptr[r as usize + 1] as i32 - 1).take(num_logits));
        debug_assert_eq!(packed.len(), packed_len);

        // The table: the step's own columns (all of them for an eager step).
        let used_width = if pad.is_some() { layout.width.max(1) } else { width };
        let mut table = vec![0i32; rows * used_width];
        for r in 0..b {
            let pages = &layout.page_table[r * layout.width..(r + 1) * layout.width];
            for (j, &p) in pages.iter().enumerate() {
                table[r * used_width + j] = p as i32;
            }
        }
        for r in b..rows {
            table[r * used_width] = self.pad_page as i32;
        }

        self.upload.begin()?;
        self.upload.write_rows(&self.packed.narrow(0, 0, packed_len)?, &packed, packed_len)?;
        let table_view = self.table.narrow(0, 0, rows * width)?.reshape(&[rows, width])?;
        self.upload.write_rows(&table_view, &table, used_width)?;

        let part = |start: usize, len: usize| self.packed.narrow(0, start, len);
        let mut ids_host = layout.input_ids.clone();
        ids_host.resize(tokens, 0);
        let mut q_lens: Vec<usize> = (0..b).map(|r| layout.q_len(r)).collect();
        q_lens.resize(rows, 1);
        let mut kv_lens_host: Vec<usize> = layout.kv_lens.iter().map(|&l| l as usize).collect();
        kv_lens_host.resize(rows, 1);
        Ok(ForwardBatch::from_parts(BatchParts {
            input_ids: part(0, tokens)?,
            positions: part(tokens, tokens)?,
            out_loc: part(2 * tokens, tokens)?,
            q_indptr: part(3 * tokens, rows + 1)?,
            kv_lens: part(3 * tokens + rows + 1, rows)?,
            block_table: table_view,
            logit_rows: logit_rows.map(|n| part(3 * tokens + 2 * rows + 1, n)).transpose()?,
            input_ids_host: ids_host,
            q_lens,
            kv_lens_host,
            num_logit_rows: logit_rows.unwrap_or(rows),
            page_size: ps,
            max_page,
            decode_splits: pad.map(|p| p.decode_splits.max(1)),
        }))
    }

    /// Makes room for a step (eager inputs only; graph inputs are sized once).
    fn reserve(&mut self, packed_len: usize, table_len: usize) -> Result<()> {
        if packed_len <= self.packed.numel() && table_len <= self.table.numel() {
            return Ok(());
        }
        if self.graph_width.is_some() {
            return Err(ModelError::Batch(format!(
                "a step of {packed_len} inputs and {table_len} page entries outgrows the graph inputs"
            )));
        }
        // Old buffers may still be read by steps in flight: they are freed in
        // stream order, like any tensor.
        if packed_len > self.packed.numel() {
            self.packed = Tensor::zeros(&[packed_len.next_power_of_two()], DType::I32, self.device)?;
        }
        if table_len > self.table.numel() {
            self.table = Tensor::zeros(&[table_len.next_power_of_two()], DType::I32, self.device)?;
        }
        Ok(())
    }
}

impl StepLayout {
    /// The layout of per-sequence steps (each row gets logits), derived the way
    /// [`ForwardBatch::new`] derives it.
    pub fn from_seqs(seqs: &[SeqStep<'_>], page_size: usize) -> Result<StepLayout> {
        if page_size == 0 {
            return Err(ModelError::Batch("page size 0".into()));
        }
        let width = seqs.iter().map(|s| s.pages.len()).max().unwrap_or(0);
        let mut l = StepLayout { page_size, width, q_indptr: vec![0], ..StepLayout::default() };
        for (i, s) in seqs.iter().enumerate() {
            let kv_len = s.cached_len + s.new_tokens.len();
            if kv_len > s.pages.len() * page_size {
                return Err(ModelError::Batch(format!(
                    "sequence {i} has {kv_len} tokens but {} pages of {page_size} hold only {}",
                    s.pages.len(),
                    s.pages.len() * page_size
                )));
            }
            for p in s.cached_len..kv_len {
                l.positions.push(p as u32);
                l.out_loc.push(s.pages[p / page_size] * page_size as u32 + (p % page_size) as u32);
            }
            l.input_ids.extend_from_slice(s.new_tokens);
            l.q_indptr.push(l.input_ids.len() as u32);
            l.kv_lens.push(kv_len as u32);
            let mut row = s.pages.to_vec();
            row.resize(width, 0);
            l.page_table.extend(row);
            l.logits_rows.push(i as u32);
        }
        if seqs.is_empty() {
            l.q_indptr.clear();
        }
        Ok(l)
    }
}

fn i32s(v: &[u32]) -> impl Iterator<Item = i32> + '_ {
    v.iter().map(|&x| x as i32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctx::LogitRows;

    /// The graph layout of a step equals the eager derivation (`ForwardBatch::new`)
    /// on its real rows, and padding rows point at the scratch page.
    #[test]
    fn padded_decode_layout_matches_the_eager_batch() {
        let mut inputs = StepInputs::new(8, 64, 4, 9, Device::Cpu).unwrap();
        let (a, b) = ([5u32], [7u32]);
        let seqs = [
            SeqStep { new_tokens: &a, cached_len: 5, pages: &[3, 1] },
            SeqStep { new_tokens: &b, cached_len: 0, pages: &[2] },
        ];
        let graph = inputs.write_seqs(&seqs, 4, 3).unwrap();
        let eager = ForwardBatch::new(&seqs, 4, LogitRows::LastOfEachSequence, Device::Cpu).unwrap();
        let head = |t: &Tensor, n: usize| t.narrow(0, 0, n).unwrap().to_vec::<i32>().unwrap();
        assert_eq!(head(graph.input_ids(), 2), eager.input_ids().to_vec::<i32>().unwrap());
        assert_eq!(head(graph.positions(), 2), eager.positions().to_vec::<i32>().unwrap());
        assert_eq!(head(graph.out_loc(), 2), eager.out_loc().to_vec::<i32>().unwrap());
        assert_eq!(graph.out_loc().to_vec::<i32>().unwrap(), [5, 8, 36, 36]);
        let meta = graph.attn_meta();
        assert_eq!(meta.q_indptr.to_vec::<i32>().unwrap(), [0, 1, 2, 3, 4]);
        assert_eq!(meta.kv_lens.to_vec::<i32>().unwrap(), [6, 1, 1, 1]);
        assert_eq!((meta.q_lens_host, meta.kv_lens_host), (&[1usize; 4][..], &[6usize, 1, 1, 1][..]));
        assert_eq!(meta.decode_splits, Some(3));
        let table = meta.block_table.to_vec::<i32>().unwrap();
        let width = meta.block_table.dim(1);
        assert_eq!(width, 16);
        assert_eq!(&table[..2], &[3, 1]);
        assert_eq!(table[width], 2);
        assert_eq!((table[2 * width], table[3 * width]), (9, 9));
        assert_eq!((graph.num_seqs(), graph.num_logit_rows(), graph.max_page()), (4, 4, Some(9)));
        assert!(graph.logit_rows().is_none() && graph.is_decode());

        // The buffers are rewritten in place: the next step has the same addresses.
        let again = inputs.write_seqs(&seqs[..1], 4, 3).unwrap();
        assert_eq!(again.kv_lens().to_vec(), [6, 1, 1, 1]);
        assert_eq!(again.out_loc().to_vec::<i32>().unwrap(), [5, 36, 36, 36]);
    }

    #[test]
    fn steps_that_do_not_fit_are_errors() {
        let mut inputs = StepInputs::new(4, 16, 4, 9, Device::Cpu).unwrap();
        let two = [5u32, 6];
        let chunk = [SeqStep { new_tokens: &two, cached_len: 0, pages: &[1] }];
        assert!(inputs.write_seqs(&chunk, 1, 1).unwrap_err().to_string().contains("2 new tokens"));
        let one = [5u32];
        let seqs = vec![SeqStep { new_tokens: &one, cached_len: 0, pages: &[1] }; 3];
        assert!(inputs.write_seqs(&seqs, 2, 1).is_err(), "3 rows in a bucket of 2");
        assert!(inputs.write_seqs(&seqs, 8, 1).is_err(), "a bucket above the maximum");
        let long = [SeqStep { new_tokens: &one, cached_len: 19, pages: &[1, 2, 3, 4, 5] }];
        assert!(inputs.write_seqs(&long, 1, 1).unwrap_err().to_string().contains("sized for 4"));
        let short = [SeqStep { new_tokens: &one, cached_len: 4, pages: &[1] }];
        assert!(inputs.write_seqs(&short, 1, 1).unwrap_err().to_string().contains("hold only 4"));
    }

    /// Eager steps (chunks, mixed rows, logits of some rows) written into the
    /// persistent buffers equal the derivation from per-sequence steps, and the
    /// buffers grow for a step larger than they are.
    #[test]
    fn eager_layout_matches_the_derived_batch() {
        let mut inputs = StepInputs::eager(4, Device::Cpu).unwrap();
        let (a, b, c) = ([5u32, 6, 7], [9u32], (0..5000).map(|i| i % 50).collect::<Vec<u32>>());
        let pages_c: Vec<u32> = (10..10 + 1250).collect();
        let seqs = [
            SeqStep { new_tokens: &a, cached_len: 2, pages: &[3, 1] },
            SeqStep { new_tokens: &b, cached_len: 4, pages: &[0, 2] },
            SeqStep { new_tokens: &c, cached_len: 0, pages: &pages_c },
        ];
        let mut layout = StepLayout::from_seqs(&seqs, 4).unwrap();
        layout.logits_rows = vec![0, 2];
        let got = inputs.write(&layout, None).unwrap();
        let want = ForwardBatch::new(&seqs, 4, LogitRows::LastOf(vec![0, 2]), Device::Cpu).unwrap();
        let v = |t: &Tensor| t.to_vec::<i32>().unwrap();
        assert_eq!(v(got.input_ids()), v(want.input_ids()));
        assert_eq!(v(got.positions()), v(want.positions()));
        assert_eq!(v(got.out_loc()), v(want.out_loc()));
        assert_eq!(v(got.logit_rows().unwrap()), v(want.logit_rows().unwrap()));
        let (gm, wm) = (got.attn_meta(), want.attn_meta());
        assert_eq!(v(gm.q_indptr), v(wm.q_indptr));
        assert_eq!(v(gm.kv_lens), v(wm.kv_lens));
        assert_eq!(v(gm.block_table), v(wm.block_table));
        assert_eq!((gm.q_lens_host, gm.kv_lens_host), (wm.q_lens_host, wm.kv_lens_host));
        assert_eq!((got.max_page(), got.num_logit_rows()), (want.max_page(), 2));
        let from_layout = ForwardBatch::from_layout(&layout, Device::Cpu).unwrap();
        assert_eq!(v(from_layout.out_loc()), v(want.out_loc()));
        assert_eq!(v(from_layout.attn_meta().block_table), v(wm.block_table));
    }
}
