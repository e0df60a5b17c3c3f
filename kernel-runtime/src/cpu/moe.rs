//! CPU reference of the MoE ops (see `crate::ops::moe` for their contracts).
//!
//! Routing and sorting are exact (the same choices and layout as the CUDA
//! kernels: experts by logit, ties to the lower index, a stable sort by expert).
//! The experts compute in f32 through the dense reference GEMM, one expert at a
//! time over the rows routed to it, and round where the CUDA path rounds (the
//! activation and each pair's weighted output to the input dtype), so that the
//! f32 results are the plain f32 computation and the 16-bit ones differ from the
//! kernels only by summation order.

use half::{bf16, f16};

use crate::cpu::{read_f32, write_f32};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op_types::moe::{MoeAlignment, MoeRouting};
use crate::tensor::Tensor;

/// `v` rounded to `dtype` and back (identity for f32).
fn round_to(dtype: DType, v: f32) -> f32 {
    match dtype {
        DType::BF16 => bf16::from_f32(v).to_f32(),
        DType::F16 => f16::from_f32(v).to_f32(),
        _ => v,
    }
}

fn read_i32(t: &Tensor) -> Result<Vec<i32>> {
    t.to_vec::<i32>()
}

fn write_i32(t: &Tensor, values: &[i32]) -> Result<()> {
    // SAFETY: exclusive write access to a contiguous host tensor (ops' ordering rule).
    let d = unsafe { t.host_slice_mut::<i32>()? };
    if d.len() < values.len() {
        return Err(Error::arg("moe", format!("{} values for a tensor of {}", values.len(), d.len())));
    }
    d[..values.len()].copy_from_slice(values);
    Ok(())
}

/// The experts of one token, largest logit first (ties to the lower index), and
/// their softmax weights.
pub(crate) fn route_row(logits: &[f32], top_k: usize, renormalize: bool) -> (Vec<i32>, Vec<f32>) {
    let mx = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    // The denominator in f64: one rounding, whatever the number of experts.
    let sum = logits.iter().map(|&v| f64::from((v - mx).exp())).sum::<f64>() as f32;
    let mut taken = vec![false; logits.len()];
    let mut ids = Vec::with_capacity(top_k);
    let mut probs = Vec::with_capacity(top_k);
    for _ in 0..top_k {
        let mut best: Option<usize> = None;
        for (e, &v) in logits.iter().enumerate() {
            if !taken[e] && best.is_none_or(|b| v > logits[b]) {
                best = Some(e);
            }
        }
        let e = best.unwrap_or(0);
        taken[e] = true;
        ids.push(e as i32);
        probs.push((logits[e] - mx).exp() / sum);
    }
    if renormalize {
        let chosen: f32 = probs.iter().sum();
        for p in &mut probs {
            *p /= chosen;
        }
    }
    (ids, probs)
}

/// Top-k routing (see `ops::moe_route`).
pub(crate) fn route(routing: &MoeRouting, logits: &Tensor, renormalize: bool) -> Result<()> {
    let (t, e, k) = (logits.dim(0), logits.dim(1), routing.top_k());
    let values = read_f32(logits)?;
    let mut ids = Vec::with_capacity(t * k);
    let mut weights = Vec::with_capacity(t * k);
    for row in values.chunks_exact(e) {
        let (i, w) = route_row(row, k, renormalize);
        ids.extend(i);
        weights.extend(w);
    }
    write_i32(&routing.topk_ids, &ids)?;
    write_f32(&routing.topk_weights, &weights)
}

/// The sorted layout of `ids` (see `ops::MoeAlignment`): (expert offsets, sorted
/// ids up to the padded total, block experts, tiles).
pub(crate) fn align_layout(
    ids: &[i32],
    num_experts: usize,
    block_m: usize,
    tile_m: usize,
) -> (Vec<i32>, Vec<i32>, Vec<i32>, Vec<i32>) {
    let n = ids.len();
    let mut count = vec![0usize; num_experts];
    for &e in ids {
        if (0..num_experts as i32).contains(&e) {
            count[e as usize] += 1;
        }
    }
    let mut offsets = vec![0usize; num_experts + 1];
    for e in 0..num_experts {
        offsets[e + 1] = offsets[e] + count[e].div_ceil(block_m) * block_m;
    }
    let total = offsets[num_experts];
    let mut sorted = vec![n as i32; total];
    let mut cursor = offsets[..num_experts].to_vec();
    for (p, &e) in ids.iter().enumerate() {
        if (0..num_experts as i32).contains(&e) {
            sorted[cursor[e as usize]] = p as i32;
            cursor[e as usize] += 1;
        }
    }
    let mut block_experts = Vec::with_capacity(total / block_m);
    let mut tiles = vec![0, tile_m as i32];
    for e in 0..num_experts {
        for _ in (offsets[e]..offsets[e + 1]).step_by(block_m) {
            block_experts.push(e as i32);
        }
        for r in (offsets[e]..offsets[e + 1]).step_by(tile_m) {
            tiles.push(r as i32);
        }
    }
    tiles[0] = (tiles.len() - 2) as i32;
    (offsets.iter().map(|&o| o as i32).collect(), sorted, block_experts, tiles)
}

/// Sorting by expert (see `ops::moe_align`).
pub(crate) fn align(align: &MoeAlignment, topk_ids: &Tensor) -> Result<()> {
    let ids = read_i32(topk_ids)?;
    let num_experts = align.expert_offsets.dim(0) - 1;
    let (offsets, mut sorted, block_experts, tiles) = align_layout(&ids, num_experts, align.block_m, align.tile_m);
    // Positions past the padded total are unspecified; fill them with padding.
    sorted.resize(align.sorted_ids.dim(0), ids.len() as i32);
    write_i32(&align.expert_offsets, &offsets)?;
    write_i32(&align.sorted_ids, &sorted)?;
    write_i32(&align.block_experts, &block_experts)?;
    write_i32(&align.tiles, &tiles)
}

/// The experts of a batch (see `ops::fused_experts`).
pub(crate) fn fused_experts(out: &Tensor, x: &Tensor, w13: &Tensor, w2: &Tensor, routing: &MoeRouting) -> Result<()> {
    let (t, h) = (x.dim(0), x.dim(1));
    let (num_experts, inter) = (w13.dim(0), w13.dim(1) / 2);
    let k = routing.top_k();
    let dtype = x.dtype();
    let ids = read_i32(&routing.topk_ids)?;
    let weights = routing.topk_weights.to_vec::<f32>()?;
    let xs = read_f32(x)?;
    // Pairs of each expert, in pair order.
    let mut pairs: Vec<Vec<usize>> = vec![Vec::new(); num_experts];
    for (p, &e) in ids.iter().enumerate() {
        if (0..num_experts as i32).contains(&e) {
            pairs[e as usize].push(p);
        }
    }
    // part[p] = weight[p] * down(silu(gate(x)) * up(x)), rounded like the kernels.
    let mut part = vec![0f32; t * k * h];
    for (e, list) in pairs.iter().enumerate().filter(|(_, l)| !l.is_empty()) {
        let rows = list.len();
        let mut a = Vec::with_capacity(rows * h);
        for &p in list {
            a.extend_from_slice(&xs[p / k * h..(p / k + 1) * h]);
        }
        let a = Tensor::from_slice(&a, &[rows, h], crate::device::Device::Cpu)?;
        let w_gate_up = w13.narrow(0, e, 1)?.reshape(&[2 * inter, h])?;
        let gate_up = Tensor::empty(&[rows, 2 * inter], DType::F32, crate::device::Device::Cpu)?;
        crate::cpu::dense::linear(&gate_up, &a, &w_gate_up, None)?;
        let gu = gate_up.to_vec::<f32>()?;
        let mut act = Vec::with_capacity(rows * inter);
        for row in gu.chunks_exact(2 * inter) {
            let (g, u) = row.split_at(inter);
            act.extend(g.iter().zip(u).map(|(&g, &u)| round_to(dtype, g / (1.0 + (-g).exp()) * u)));
        }
        let act = Tensor::from_slice(&act, &[rows, inter], crate::device::Device::Cpu)?;
        let w_down = w2.narrow(0, e, 1)?.reshape(&[h, inter])?;
        let y = Tensor::empty(&[rows, h], DType::F32, crate::device::Device::Cpu)?;
        crate::cpu::dense::linear(&y, &act, &w_down, None)?;
        let y = y.to_vec::<f32>()?;
        for (row, &p) in y.chunks_exact(h).zip(list) {
            for (dst, v) in part[p * h..(p + 1) * h].iter_mut().zip(row) {
                *dst = round_to(dtype, weights[p] * v);
            }
        }
    }
    let mut acc = vec![0f32; t * h];
    for (token, dst) in acc.chunks_exact_mut(h).enumerate() {
        for s in 0..k {
            let p = token * k + s;
            if (0..num_experts as i32).contains(&ids[p]) {
                for (d, v) in dst.iter_mut().zip(&part[p * h..(p + 1) * h]) {
                    *d += v;
                }
            }
        }
    }
    write_f32(out, &acc)
}

/// The weighted sum over the top-k slots (see `ops::moe_sum`).
pub(crate) fn sum(out: &Tensor, part: &Tensor, routing: &MoeRouting, num_experts: usize, weighted: bool) -> Result<()> {
    let (t, h) = (out.dim(0), out.dim(1));
    let k = routing.top_k();
    let ids = read_i32(&routing.topk_ids)?;
    let weights = routing.topk_weights.to_vec::<f32>()?;
    let part = read_f32(part)?;
    let mut acc = vec![0f32; t * h];
    for (token, dst) in acc.chunks_exact_mut(h).enumerate() {
        for s in 0..k {
            let p = token * k + s;
            if !(0..num_experts as i32).contains(&ids[p]) {
                continue;
            }
            let w = if weighted { weights[p] } else { 1.0 };
            for (d, v) in dst.iter_mut().zip(&part[p * h..(p + 1) * h]) {
                *d += w * v;
            }
        }
    }
    write_f32(out, &acc)
}
