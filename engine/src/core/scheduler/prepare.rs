//! Turning a [`Batch`] into a [`PreparedBatch`]: give each row the pages
//! its new tokens need and build the flat index arrays of the step.
//!
//! This is the CPU half of a step that overlap scheduling runs while the GPU
//! executes the previous one. It reads only what the previous step cannot
//! change for the rows it shares with it (page tables, lengths) plus the
//! token ids to feed; with overlap, a decode row's input id is the token the
//! in-flight step is sampling, which a device-side token buffer will provide
//! in place of `input_ids` (mini-sglang's `token_pool`).

use crate::core::kvcache::{pages_for, CacheManager};
use crate::core::req::{Batch, PreparedBatch, Req};

/// Builds the step. Every row's request must be in `running` (the scheduler
/// just picked them).
pub(super) fn prepare(batch: Batch, running: &mut [Req], cache: &mut CacheManager) -> PreparedBatch {
    let page_size = cache.page_size();
    let phase = batch.phase();
    let rows = batch.rows().to_vec();
    let num_tokens = batch.num_tokens();

    let mut input_ids = Vec::with_capacity(num_tokens);
    let mut positions = Vec::with_capacity(num_tokens);
    let mut out_loc = Vec::with_capacity(num_tokens);
    let mut q_indptr = Vec::with_capacity(rows.len() + 1);
    let mut q_lens = Vec::with_capacity(rows.len());
    let mut kv_lens = Vec::with_capacity(rows.len());
    let mut row_pages: Vec<Vec<u32>> = Vec::with_capacity(rows.len());
    let mut logits_rows = Vec::new();
    let mut sampling = Vec::new();
    let mut needs_host_logits = false;
    q_indptr.push(0);

    for (row_idx, row) in rows.iter().enumerate() {
        let req = running.iter_mut().find(|r| r.id() == row.id).expect("scheduled request is not running");
        req.grow(row.extend_len, cache);
        let start = req.cached_len();
        let end = start + row.extend_len;
        assert_eq!(
            row.samples,
            end == req.token_ids().len(),
            "{}: sampling rows are exactly those reaching the last token",
            row.id
        );
        let pages = req.pages();
        for pos in start..end {
            input_ids.push(req.token_ids()[pos]);
            positions.push(pos as u32);
            out_loc.push(pages.page_id(pos / page_size).slot(page_size, pos % page_size));
        }
        q_indptr.push(input_ids.len() as u32);
        q_lens.push(row.extend_len as u32);
        kv_lens.push(end as u32);
        row_pages.push(pages.page_ids().take(pages_for(end, page_size)).map(|p| p.get()).collect());
        if row.samples {
            logits_rows.push(row_idx as u32);
            sampling.push(req.sampling_row());
            needs_host_logits |= req.params().needs_host_logits();
        }
    }

    let max_num_pages = row_pages.iter().map(Vec::len).max().unwrap_or(0);
    let mut page_table = vec![0u32; rows.len() * max_num_pages];
    for (r, ids) in row_pages.iter().enumerate() {
        page_table[r * max_num_pages..r * max_num_pages + ids.len()].copy_from_slice(ids);
    }

    PreparedBatch {
        phase,
        page_size,
        rows,
        input_ids,
        positions,
        out_loc,
        q_indptr,
        q_lens,
        kv_lens,
        max_num_pages,
        page_table,
        logits_rows,
        sampling,
        needs_host_logits,
    }
}
