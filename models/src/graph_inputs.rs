//! The persistent device inputs of decode steps that CUDA graphs capture and
//! replay.
//!
//! A graph replays its kernels with the addresses it was captured with, so a
//! decode step's inputs (token ids, positions, KV slots, the attention layout)
//! live in buffers allocated once and rewritten in place before every replay.
//! A step of `b` sequences runs in the graph of the next bucket `B >= b`; the
//! `B - b` padding rows feed token 0 at position 0 into a scratch page that no
//! request owns (`pad_page`, one page past the engine's pool), attend to that one
//! key, and their logits are ignored.
//!
//! Layout of a bucket of `B` rows in the packed i32 buffer (one host-to-device
//! copy per step): `ids[B] | positions[B] | out_loc[B] | q_indptr[B + 1] |
//! kv_lens[B]`; the block table is its own `[max_batch, width]` buffer whose
//! first `B` rows and the columns the step uses are written by one 2-D copy
//! (columns past a row's pages are never read).

use kernel_runtime::{DType, Device, Tensor};

use crate::ctx::{BatchParts, ForwardBatch, SeqStep};
use crate::error::{ModelError, Result};

/// The inputs of decode steps of up to `max_batch` sequences of up to
/// `max_context_len` tokens, on one device.
#[derive(Debug)]
pub struct DecodeGraphInputs {
    /// `[5 * max_batch + 1]` i32 (see the module header).
    packed: Tensor,
    /// `[max_batch, width]` i32 pages per row.
    block_table: Tensor,
    max_batch: usize,
    page_size: usize,
    pad_page: u32,
}

impl DecodeGraphInputs {
    /// Buffers for `max_batch` rows whose sequences hold up to `max_context_len`
    /// tokens in pages of `page_size`; padding rows use page `pad_page`.
    pub fn new(
        max_batch: usize,
        max_context_len: usize,
        page_size: usize,
        pad_page: u32,
        device: Device,
    ) -> Result<DecodeGraphInputs> {
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
        Ok(DecodeGraphInputs {
            packed: Tensor::zeros(&[5 * max_batch + 1], DType::I32, device)?,
            block_table: Tensor::zeros(&[max_batch, width], DType::I32, device)?,
            max_batch,
            page_size,
            pad_page,
        })
    }

    /// The most rows a step may have.
    pub fn max_batch(&self) -> usize {
        self.max_batch
    }

    /// The page padding rows write to.
    pub fn pad_page(&self) -> u32 {
        self.pad_page
    }

    /// Writes a decode step of `seqs` (one new token each) padded to `bucket`
    /// rows into the buffers and returns its batch, whose tensors are views of
    /// them (so the same addresses every step). `decode_splits` is the fixed
    /// split count of the bucket's graph. `seqs` may be empty (a capture of
    /// padding only).
    pub fn write(&self, seqs: &[SeqStep<'_>], bucket: usize, decode_splits: usize) -> Result<ForwardBatch> {
        let b = seqs.len();
        if bucket < b.max(1) || bucket > self.max_batch {
            return Err(ModelError::Batch(format!(
                "a decode step of {b} rows does not fit a graph of {bucket} (at most {})",
                self.max_batch
            )));
        }
        let ps = self.page_size;
        let width = self.block_table.dim(1);
        let used_width = seqs.iter().map(|s| s.pages.len()).max().unwrap_or(1).max(1);
        if used_width > width {
            return Err(ModelError::Batch(format!(
                "a sequence holds {used_width} pages, graph inputs were sized for {width}"
            )));
        }
        let mut packed = vec![0i32; 5 * bucket + 1];
        let mut table = vec![0i32; bucket * used_width];
        let mut ids_host = Vec::with_capacity(bucket);
        let mut kv_lens_host = Vec::with_capacity(bucket);
        let mut max_page = self.pad_page;
        for (i, s) in seqs.iter().enumerate() {
            if s.new_tokens.len() != 1 {
                return Err(ModelError::Batch(format!(
                    "sequence {i} of a graphed decode step has {} new tokens, not 1",
                    s.new_tokens.len()
                )));
            }
            let kv_len = s.cached_len + 1;
            if kv_len > s.pages.len() * ps {
                return Err(ModelError::Batch(format!(
                    "sequence {i} has {kv_len} tokens but {} pages of {ps} hold only {}",
                    s.pages.len(),
                    s.pages.len() * ps
                )));
            }
            let pos = s.cached_len;
            let page = s.pages[pos / ps];
            for (j, &p) in s.pages.iter().enumerate() {
                table[i * used_width + j] = p as i32;
                max_page = max_page.max(p);
            }
            if (max_page as usize + 1) * ps > i32::MAX as usize {
                return Err(ModelError::Batch(format!("sequence {i} does not fit 32-bit slots")));
            }
            packed[i] = s.new_tokens[0] as i32;
            packed[bucket + i] = pos as i32;
            packed[2 * bucket + i] = (page as usize * ps + pos % ps) as i32;
            packed[4 * bucket + 1 + i] = kv_len as i32;
            ids_host.push(s.new_tokens[0]);
            kv_lens_host.push(kv_len);
        }
        for i in b..bucket {
            // Token 0 at position 0 into the scratch page, attending to itself.
            packed[2 * bucket + i] = (self.pad_page as usize * ps) as i32;
            packed[4 * bucket + 1 + i] = 1;
            table[i * used_width] = self.pad_page as i32;
            ids_host.push(0);
            kv_lens_host.push(1);
        }
        for i in 0..=bucket {
            packed[3 * bucket + i] = i as i32;
        }
        self.packed.narrow(0, 0, 5 * bucket + 1)?.write_rows(&packed, 5 * bucket + 1)?;
        self.block_table.write_rows(&table, used_width)?;
        let part = |start: usize, len: usize| self.packed.narrow(0, start, len);
        Ok(ForwardBatch::from_decode_parts(BatchParts {
            input_ids: part(0, bucket)?,
            positions: part(bucket, bucket)?,
            out_loc: part(2 * bucket, bucket)?,
            q_indptr: part(3 * bucket, bucket + 1)?,
            kv_lens: part(4 * bucket + 1, bucket)?,
            block_table: self.block_table.narrow(0, 0, bucket)?,
            input_ids_host: ids_host,
            kv_lens_host,
            page_size: ps,
            max_page: Some(max_page),
            decode_splits: Some(decode_splits.max(1)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctx::LogitRows;

    /// The graph layout of a step equals the eager derivation (`ForwardBatch::new`)
    /// on its real rows, and padding rows point at the scratch page.
    #[test]
    fn padded_decode_layout_matches_the_eager_batch() {
        let inputs = DecodeGraphInputs::new(8, 64, 4, 9, Device::Cpu).unwrap();
        let (a, b) = ([5u32], [7u32]);
        let seqs = [
            SeqStep { new_tokens: &a, cached_len: 5, pages: &[3, 1] },
            SeqStep { new_tokens: &b, cached_len: 0, pages: &[2] },
        ];
        let graph = inputs.write(&seqs, 4, 3).unwrap();
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
        let again = inputs.write(&seqs[..1], 4, 3).unwrap();
        assert_eq!(again.kv_lens().to_vec(), [6, 1, 1, 1]);
        assert_eq!(again.out_loc().to_vec::<i32>().unwrap(), [5, 36, 36, 36]);
    }

    #[test]
    fn steps_that_do_not_fit_are_errors() {
        let inputs = DecodeGraphInputs::new(4, 16, 4, 9, Device::Cpu).unwrap();
        let two = [5u32, 6];
        let chunk = [SeqStep { new_tokens: &two, cached_len: 0, pages: &[1] }];
        assert!(inputs.write(&chunk, 1, 1).unwrap_err().to_string().contains("2 new tokens"));
        let one = [5u32];
        let seqs = vec![SeqStep { new_tokens: &one, cached_len: 0, pages: &[1] }; 3];
        assert!(inputs.write(&seqs, 2, 1).is_err(), "3 rows in a bucket of 2");
        assert!(inputs.write(&seqs, 8, 1).is_err(), "a bucket above the maximum");
        let long = [SeqStep { new_tokens: &one, cached_len: 19, pages: &[1, 2, 3, 4, 5] }];
        assert!(inputs.write(&long, 1, 1).unwrap_err().to_string().contains("sized for 4"));
        let short = [SeqStep { new_tokens: &one, cached_len: 4, pages: &[1] }];
        assert!(inputs.write(&short, 1, 1).unwrap_err().to_string().contains("hold only 4"));
    }
}
