//! Turning a [`Batch`] into a [`PreparedBatch`]: give each row the pages
//! its new tokens need and build the step's [`StepLayout`], the one layout
//! the model consumes.
//!
//! This is the CPU half of a step that overlap scheduling runs while the GPU
//! executes the previous one. It reads only what the previous step cannot
//! change for the rows it shares with it (page tables, lengths, both
//! advanced when that step was launched) plus the token ids to feed. A
//! decode row's input id may be the token the in-flight step is sampling:
//! it is then a [`DeferredToken`], which the runner feeds from the device
//! (mini-sglang's `token_pool`).

use models::layout::StepLayout;

use crate::core::kvcache::{pages_for, CacheManager};
use crate::core::req::{Batch, BatchRow, DeferredToken, Phase, PreparedBatch, Req};
use crate::core::sampling::extras::StepExtras;

/// Orders the rows of a decode step by their context after the step, longest
/// first (ties in the scheduler's order). The decode kernel's grid follows the
/// row order and the GPU starts blocks in grid order, so the longest sequences
/// start first and the short ones fill the last wave: longest-processing-time
/// list scheduling, which leaves a ragged batch (contexts of 100 to 2,048) no
/// tail of a few long blocks running alone. Rows are independent everywhere else,
/// so the order changes no output.
fn longest_first(rows: &mut [BatchRow], running: &[Req]) {
    rows.sort_by_cached_key(|row| {
        let len = running.iter().find(|r| r.id() == row.id).map_or(0, |r| r.cached_len() + row.extend_len);
        std::cmp::Reverse(len)
    });
}

/// Builds the step. Every row's request must be in `running` (the scheduler
/// just picked them).
pub(super) fn prepare(batch: Batch, running: &mut [Req], cache: &mut CacheManager) -> PreparedBatch {
    let page_size = cache.page_size();
    let phase = batch.phase();
    let mut rows = batch.rows().to_vec();
    let num_tokens = batch.num_tokens();
    if phase == Phase::Decode {
        longest_first(&mut rows, running);
    }

    let mut layout = StepLayout {
        page_size,
        input_ids: Vec::with_capacity(num_tokens),
        positions: Vec::with_capacity(num_tokens),
        out_loc: Vec::with_capacity(num_tokens),
        q_indptr: Vec::with_capacity(rows.len() + 1),
        kv_lens: Vec::with_capacity(rows.len()),
        width: 0,
        page_table: Vec::new(),
        logits_rows: Vec::new(),
    };
    let mut q_lens = Vec::with_capacity(rows.len());
    let mut row_pages: Vec<Vec<u32>> = Vec::with_capacity(rows.len());
    let mut sampling = Vec::new();
    let mut needs_host_logits = false;
    let mut deferred = Vec::new();
    let mut deferred_step = 0;
    layout.q_indptr.push(0);

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
            if let Some(u) = req.unresolved_at(pos) {
                // Only the step in flight can still be sampling a token we feed.
                assert!(deferred_step == 0 || deferred_step == u.step, "{}: tokens of two steps in flight", row.id);
                deferred_step = u.step;
                deferred.push(DeferredToken { token: layout.input_ids.len() as u32, row: u.row });
            }
            layout.input_ids.push(req.token_ids()[pos]);
            layout.positions.push(pos as u32);
            layout.out_loc.push(pages.page_id(pos / page_size).slot(page_size, pos % page_size));
        }
        layout.q_indptr.push(layout.input_ids.len() as u32);
        q_lens.push(row.extend_len as u32);
        layout.kv_lens.push(end as u32);
        row_pages.push(pages.page_ids().take(pages_for(end, page_size)).map(|p| p.get()).collect());
        if row.samples {
            layout.logits_rows.push(row_idx as u32);
            sampling.push(req.sampling_row());
            needs_host_logits |= req.params().needs_host_logits();
        }
    }

    let width = row_pages.iter().map(Vec::len).max().unwrap_or(0);
    let mut page_table = vec![0u32; rows.len() * width];
    for (r, ids) in row_pages.iter().enumerate() {
        page_table[r * width..r * width + ids.len()].copy_from_slice(ids);
    }
    layout.width = width;
    layout.page_table = page_table;

    PreparedBatch {
        phase,
        rows,
        layout,
        q_lens,
        sampling,
        needs_host_logits,
        deferred,
        deferred_step,
        extras: StepExtras::default(),
    }
}
