//! Mixture of experts: routing, batching by expert, the grouped GEMMs and the
//! top-k sum, and the fused MoE built from them.
//!
//! One MoE layer over `t` tokens with `k` experts each works on `t * k` (token,
//! slot) pairs, pair `p = token * k + slot`:
//!
//! | op | what |
//! | --- | --- |
//! | [`moe_route`] | router logits `[t, E]` -> [`MoeRouting`]: top-k ids `[t, k]` i32 and softmax weights `[t, k]` f32 |
//! | [`moe_align`] | ids -> [`MoeAlignment`]: pairs sorted by expert (stable), runs padded to a row granule, GEMM tiles |
//! | [`moe_gemm`] | one grouped GEMM over the sorted pairs: gate_up with SiLU-and-mul, or down with the routing weight |
//! | [`moe_sum`] | `out[t] = sum_s w[t, s] part[t k + s]` over the valid slots |
//! | [`fused_experts`], [`fused_moe`] | the whole layer: align, gate_up, down, sum (plus the router) |
//! | [`naive_experts`] | the reference: one expert at a time with `linear` and `silu_mul` |
//!
//! Weights are packed per layer: `w13` `[E, 2I, H]` (each expert's gate rows,
//! then its up rows) and `w2` `[E, H, I]`. On CUDA the GEMMs are the tensor-core
//! kernels of csrc/kernels/moe_gemm.cu (bf16/f16 only) and the configuration is
//! chosen per batch size by a tile table ([`MoePlan`]); on the CPU every op is the
//! f32 reference of `crate::cpu::moe`.

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::sys::kernels::{MSGL_MOE_MAX_EXPERTS, MSGL_MOE_MAX_TOP_K, MSGL_MOE_ROUTER_MAX_TOKENS};
use crate::tensor::Tensor;

pub use crate::op_types::moe::{moe_sorted_rows, moe_tile_entries, MoeAlignment, MoePlan, MoeRouting, MOE_BLOCK_M};

use super::check::common_device;
use super::convert::copy;
use super::dense::{linear, silu_mul};
use super::index::embedding;

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16];

fn check_top_k(op: &'static str, top_k: usize, num_experts: usize) -> Result<()> {
    if num_experts == 0 || num_experts > MSGL_MOE_MAX_EXPERTS as usize {
        return Err(Error::arg(op, format!("{num_experts} experts, expected 1..={MSGL_MOE_MAX_EXPERTS}")));
    }
    if top_k == 0 || top_k > num_experts || top_k > MSGL_MOE_MAX_TOP_K as usize {
        return Err(Error::arg(op, format!("top_k {top_k}, expected 1..=min({num_experts}, {MSGL_MOE_MAX_TOP_K})")));
    }
    Ok(())
}

/// The top `top_k` experts of every token by router logit, with their softmax
/// probabilities (f32, over all experts), renormalised over the chosen experts
/// when `renormalize` (Qwen3-MoE's `norm_topk_prob`). `logits` `[t, E]` with unit
/// last stride, f32/f16/bf16.
pub fn moe_route(logits: &Tensor, top_k: usize, renormalize: bool) -> Result<MoeRouting> {
    const OP: &str = "moe_route";
    let [t, num_experts] = logits.dims::<2>(OP, "logits")?;
    logits.expect_dtype(OP, "logits", FLOATS)?;
    check_top_k(OP, top_k, num_experts)?;
    if t > 1 && logits.strides()[1] != 1 {
        return Err(Error::arg(OP, "argument `logits` must have unit stride in its last dimension"));
    }
    let device = logits.device();
    let routing = MoeRouting {
        topk_ids: Tensor::empty(&[t, top_k], DType::I32, device)?,
        topk_weights: Tensor::empty(&[t, top_k], DType::F32, device)?,
    };
    if t == 0 {
        return Ok(routing);
    }
    match device {
        Device::Cpu => crate::cpu::moe::route(&routing, logits, renormalize)?,
        Device::Cuda(_) => crate::gpu::moe::route(&routing, logits, renormalize)?,
    }
    Ok(routing)
}

/// The router and [`moe_route`] as one op: the top `top_k` experts of every row of
/// `x` `[t, hidden]` by the logits `x router_w^T` (`router_w` `[E, hidden]`, the
/// router's bias-free Linear weight, of x's dtype), exactly [`super::linear`] then
/// [`moe_route`] on the CPU. On CUDA (unless `MINISGL_MOE_FUSED_ROUTER=0` or
/// [`set_moe_fused_router`] turn it off), a batch of at most 8 tokens whose rows are whole
/// 16-byte vectors runs one launch (moe_route.cu, phase 2: the logits, rounded to
/// the dtype as the GEMM's output is, then the routing; the summation order is
/// the kernel's own, so a token whose k-th and (k+1)-th logits are within a
/// rounding of each other may pick the other expert); everything else runs the
/// two ops.
pub fn moe_router_route(x: &Tensor, router_w: &Tensor, top_k: usize, renormalize: bool) -> Result<MoeRouting> {
    const OP: &str = "moe_router_route";
    let device = common_device(OP, &[("x", x), ("router_w", router_w)])?;
    let [t, hidden] = x.dims::<2>(OP, "x")?;
    let [num_experts, _] = router_w.dims::<2>(OP, "router_w")?;
    router_w.expect_shape(OP, "router_w", &[num_experts, hidden])?;
    x.expect_dtype(OP, "x", FLOATS)?;
    router_w.expect_dtype(OP, "router_w", &[x.dtype()])?;
    check_top_k(OP, top_k, num_experts)?;
    if fused_router_applies(device, t) {
        let routing = MoeRouting {
            topk_ids: Tensor::empty(&[t, top_k], DType::I32, device)?,
            topk_weights: Tensor::empty(&[t, top_k], DType::F32, device)?,
        };
        if crate::gpu::moe::router_route(&routing, x, router_w, renormalize)? {
            return Ok(routing);
        }
    }
    moe_route(&linear(x, router_w, None)?, top_k, renormalize)
}

/// Whether [`moe_router_route`] tries its one launch for `t` tokens on `device`
/// (CUDA, the switch on, 1..=MSGL_MOE_ROUTER_MAX_TOKENS tokens).
fn fused_router_applies(device: Device, t: usize) -> bool {
    matches!(device, Device::Cuda(_))
        && crate::gpu::moe::fused_router_enabled()
        && (1..=MSGL_MOE_ROUTER_MAX_TOKENS as usize).contains(&t)
}

/// [`fused_moe`] with the router's GEMM in the op (`router_w` `[E, hidden]`, the
/// bias-free router weight): where [`moe_router_route`] takes one launch (CUDA,
/// the fused router on, decode batches), its routing and [`fused_experts`];
/// elsewhere [`super::linear`] and [`fused_moe`] (whose decode batches route and
/// sort in one kernel).
pub fn fused_moe_routed(
    x: &Tensor,
    router_w: &Tensor,
    w13: &Tensor,
    w2: &Tensor,
    top_k: usize,
    renormalize: bool,
) -> Result<Tensor> {
    let [t, _] = x.dims::<2>("fused_moe_routed", "x")?;
    if fused_router_applies(x.device(), t) {
        return fused_experts(x, w13, w2, &moe_router_route(x, router_w, top_k, renormalize)?);
    }
    fused_moe(x, &linear(x, router_w, None)?, w13, w2, top_k, renormalize)
}

/// Output columns a block of the MoE decode kernels computes (moe_decode.cu's
/// `cols_per_block`), overriding `MINISGL_MOE_DECODE_COLS` and the default 8
/// (`None`: back to them). For sweeps in benchmarks and tests: any count gives the
/// same bits (each column's sums are a warp's, in a fixed order).
pub fn set_moe_decode_cols(cols: Option<usize>) {
    crate::gpu::moe::set_decode_cols(cols);
}

/// Turns the copy-engine staging of the MoE decode kernels' down pass on or off,
/// overriding `MINISGL_MOE_DECODE_BULK` (`None`: back to it). Either way gives the
/// same bits (tests compare them).
pub fn set_moe_decode_bulk(on: Option<bool>) {
    crate::gpu::moe::set_decode_bulk(on);
}

/// The gate_up pass of the MoE decode kernels with 2 (or 4, the default) vectors of
/// a row in flight a lane, overriding `MINISGL_MOE_DECODE_UNROLL` (`None`: back to
/// it). 2 runs the AOT library's lighter kernel; the same bits either way.
pub fn set_moe_decode_unroll(unroll: Option<usize>) {
    crate::gpu::moe::set_decode_unroll(unroll);
}

/// How many down passes of the MoE decode kernels staged their weights by the copy
/// engine in this process (tests check that the path ran).
pub fn moe_decode_bulk_launches() -> usize {
    crate::gpu::moe::DECODE_BULK_LAUNCHES.load(std::sync::atomic::Ordering::Relaxed)
}

/// How many launches the fused router of [`moe_router_route`] made in this process
/// (tests check that the fused path ran rather than its fallback).
pub fn moe_fused_router_launches() -> usize {
    crate::gpu::moe::ROUTER_LAUNCHES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Turns the fused router of [`moe_router_route`] on or off (`None`: back to
/// `MINISGL_MOE_FUSED_ROUTER`, on unless set to 0). For A/B runs and tests.
pub fn set_moe_fused_router(on: Option<bool>) {
    crate::gpu::moe::set_fused_router(on);
}

fn check_routing(op: &'static str, routing: &MoeRouting, num_tokens: usize) -> Result<()> {
    let [t, k] = routing.topk_ids.dims::<2>(op, "topk_ids")?;
    if t != num_tokens {
        return Err(Error::arg(op, format!("the routing covers {t} tokens, the input has {num_tokens}")));
    }
    routing.topk_ids.expect_dtype(op, "topk_ids", &[DType::I32])?.expect_contiguous(op, "topk_ids")?;
    routing.topk_weights.expect_shape(op, "topk_weights", &[t, k])?.expect_dtype(op, "topk_weights", &[DType::F32])?;
    routing.topk_weights.expect_contiguous(op, "topk_weights")?;
    Ok(())
}

/// Sorts the pairs of `topk_ids` `[t, k]` by expert (see [`MoeAlignment`]), with
/// runs padded to `block_m` rows (on CUDA: [`MOE_BLOCK_M`]) and GEMM tiles of at
/// most `tile_m` rows (a multiple of `block_m`). Ids outside `[0, num_experts)`
/// are dropped.
pub fn moe_align(topk_ids: &Tensor, num_experts: usize, block_m: usize, tile_m: usize) -> Result<MoeAlignment> {
    const OP: &str = "moe_align";
    let [t, k] = topk_ids.dims::<2>(OP, "topk_ids")?;
    topk_ids.expect_dtype(OP, "topk_ids", &[DType::I32])?.expect_contiguous(OP, "topk_ids")?;
    if num_experts == 0 || num_experts > MSGL_MOE_MAX_EXPERTS as usize {
        return Err(Error::arg(OP, format!("{num_experts} experts, expected 1..={MSGL_MOE_MAX_EXPERTS}")));
    }
    if block_m == 0 || tile_m == 0 || !tile_m.is_multiple_of(block_m) {
        return Err(Error::arg(OP, format!("tile_m {tile_m} must be a positive multiple of block_m {block_m}")));
    }
    let device = topk_ids.device();
    if device.is_cuda() && block_m != MOE_BLOCK_M {
        return Err(Error::arg(OP, format!("block_m {block_m}: the CUDA kernels are built for {MOE_BLOCK_M}")));
    }
    let n = t * k;
    if n >= i32::MAX as usize / 2 {
        return Err(Error::arg(OP, format!("{n} pairs exceed the 32-bit positions")));
    }
    let rows = moe_sorted_rows(n, num_experts, block_m);
    let align = MoeAlignment {
        sorted_ids: Tensor::empty(&[rows], DType::I32, device)?,
        block_experts: Tensor::empty(&[rows / block_m], DType::I32, device)?,
        expert_offsets: Tensor::empty(&[num_experts + 1], DType::I32, device)?,
        tiles: Tensor::empty(&[moe_tile_entries(rows, n, num_experts, tile_m)], DType::I32, device)?,
        block_m,
        tile_m,
    };
    match device {
        Device::Cpu => crate::cpu::moe::align(&align, topk_ids)?,
        Device::Cuda(_) => crate::gpu::moe::align(&align, topk_ids)?,
    }
    Ok(align)
}

/// The shapes of one fused MoE: `x` `[t, H]`, `w13` `[E, 2I, H]`, `w2` `[E, H, I]`.
struct ExpertShapes {
    num_tokens: usize,
    hidden: usize,
    inter: usize,
    num_experts: usize,
}

fn check_experts(op: &'static str, x: &Tensor, w13: &Tensor, w2: &Tensor) -> Result<ExpertShapes> {
    let [t, h] = x.dims::<2>(op, "x")?;
    let [e, two_i, h1] = w13.dims::<3>(op, "w13")?;
    x.expect_dtype(op, "x", FLOATS)?;
    if h1 != h || two_i % 2 != 0 {
        return Err(Error::arg(op, format!("argument `w13` has shape {:?}, expected [E, 2 I, {h}]", w13.shape())));
    }
    let inter = two_i / 2;
    w2.expect_shape(op, "w2", &[e, h, inter])?;
    for (name, w) in [("w13", w13), ("w2", w2)] {
        w.expect_dtype(op, name, &[x.dtype()])?.expect_contiguous(op, name)?;
    }
    if e == 0 || e > MSGL_MOE_MAX_EXPERTS as usize {
        return Err(Error::arg(op, format!("{e} experts, expected 1..={MSGL_MOE_MAX_EXPERTS}")));
    }
    Ok(ExpertShapes { num_tokens: t, hidden: h, inter, num_experts: e })
}

/// Whether the CUDA fused kernels take these shapes and dtype (bf16/f16, hidden
/// and intermediate sizes multiples of 8); the reason when they do not.
pub fn fused_experts_support(dtype: DType, hidden: usize, inter: usize) -> std::result::Result<(), String> {
    if !matches!(dtype, DType::BF16 | DType::F16) {
        return Err(format!("the fused MoE kernels take bf16 or f16, not {dtype}"));
    }
    if !hidden.is_multiple_of(8) || !inter.is_multiple_of(8) || hidden == 0 || inter == 0 {
        return Err(format!("the fused MoE kernels need hidden and intermediate sizes that are multiples of 8, got {hidden} and {inter}"));
    }
    Ok(())
}

/// The MoE experts of a batch: `out[t] = sum_s w[t, s] down_e(silu(gate_e(x_t)) *
/// up_e(x_t))`, `e = ids[t, s]`, with `x` `[t, H]`, `w13` `[E, 2I, H]` (gate rows
/// then up rows per expert) and `w2` `[E, H, I]` of x's dtype; returns a new
/// `[t, H]` tensor. On CUDA: bf16/f16 and sizes that are multiples of 8 (see
/// [`fused_experts_support`]); the activation and the per-pair outputs are rounded
/// to x's dtype, sums are f32. On the CPU: the f32 reference.
pub fn fused_experts(x: &Tensor, w13: &Tensor, w2: &Tensor, routing: &MoeRouting) -> Result<Tensor> {
    fused_experts_with(x, w13, w2, routing, None)
}

/// [`fused_experts`] with an explicit CUDA plan (tests and benchmarks sweep the
/// tile table with it); `None` takes the heuristic's.
pub fn fused_experts_with(
    x: &Tensor,
    w13: &Tensor,
    w2: &Tensor,
    routing: &MoeRouting,
    plan: Option<MoePlan>,
) -> Result<Tensor> {
    const OP: &str = "fused_experts";
    let device = common_device(
        OP,
        &[("x", x), ("w13", w13), ("w2", w2), ("topk_ids", &routing.topk_ids), ("topk_weights", &routing.topk_weights)],
    )?;
    let s = check_experts(OP, x, w13, w2)?;
    check_routing(OP, routing, s.num_tokens)?;
    check_top_k(OP, routing.top_k(), s.num_experts)?;
    let out = Tensor::empty(&[s.num_tokens, s.hidden], x.dtype(), device)?;
    if s.num_tokens == 0 {
        return Ok(out);
    }
    match device {
        Device::Cpu => crate::cpu::moe::fused_experts(&out, x, w13, w2, routing)?,
        Device::Cuda(_) => {
            fused_experts_support(x.dtype(), s.hidden, s.inter).map_err(|m| Error::arg(OP, m))?;
            let plan = match plan {
                Some(plan) => plan,
                None => moe_plan(s.num_tokens, routing.top_k(), s.num_experts, s.hidden, s.inter, device)?,
            };
            crate::gpu::moe::fused_experts(&out, x, w13, w2, routing, plan)?
        }
    }
    Ok(out)
}

/// The router and the experts in one call: [`moe_route`] of `router_logits`
/// `[t, E]`, then [`fused_experts`]. On CUDA, decode-sized batches route and sort
/// in one kernel.
pub fn fused_moe(
    x: &Tensor,
    router_logits: &Tensor,
    w13: &Tensor,
    w2: &Tensor,
    top_k: usize,
    renormalize: bool,
) -> Result<Tensor> {
    const OP: &str = "fused_moe";
    let device = common_device(OP, &[("x", x), ("router_logits", router_logits), ("w13", w13), ("w2", w2)])?;
    let s = check_experts(OP, x, w13, w2)?;
    router_logits.expect_shape(OP, "router_logits", &[s.num_tokens, s.num_experts])?;
    check_top_k(OP, top_k, s.num_experts)?;
    match device {
        Device::Cuda(_) if s.num_tokens > 0 => {
            router_logits.expect_dtype(OP, "router_logits", FLOATS)?;
            if s.num_tokens > 1 && router_logits.strides()[1] != 1 {
                return Err(Error::arg(OP, "argument `router_logits` must have unit stride in its last dimension"));
            }
            fused_experts_support(x.dtype(), s.hidden, s.inter).map_err(|m| Error::arg(OP, m))?;
            let plan = moe_plan(s.num_tokens, top_k, s.num_experts, s.hidden, s.inter, device)?;
            let out = Tensor::empty(&[s.num_tokens, s.hidden], x.dtype(), device)?;
            crate::gpu::moe::fused_moe(&out, x, router_logits, w13, w2, top_k, renormalize, plan)?;
            Ok(out)
        }
        _ => fused_experts(x, w13, w2, &moe_route(router_logits, top_k, renormalize)?),
    }
}

/// The CUDA grouped GEMMs' tile table (moe_gemm.cu's `MoeTile`), by index:
/// `[bm, bn, bk, warps in m, warps in n, stages]`. A [`MoePlan`] names two tiles of
/// equal `bm`; tests and benchmarks sweep the table with [`fused_experts_with`].
pub fn moe_tile_shapes() -> Vec<[usize; 6]> {
    crate::gpu::moe::tile_shapes()
}

/// Whether tile `tile` of [`moe_tile_shapes`] runs on `device`: every tile on a
/// CPU device (which ignores plans), the wgmma tiles only on sm_90 GPUs.
pub fn moe_tile_supported(tile: usize, device: Device) -> Result<bool> {
    let Some(&cfg) = crate::gpu::moe::TILES.get(tile) else { return Ok(false) };
    match device {
        Device::Cuda(ordinal) => Ok(crate::gpu::moe::tile_runs_on(cfg, crate::cuda::device(ordinal)?.capability())),
        _ => Ok(true),
    }
}

/// The plan the CUDA path takes for `num_tokens` tokens on `device` (the heuristic,
/// with the wgmma tiles on sm_90 GPUs, or the tiles `MINISGL_MOE_TILE_GATE_UP` /
/// `MINISGL_MOE_TILE_DOWN` name).
pub fn moe_plan(
    num_tokens: usize,
    top_k: usize,
    num_experts: usize,
    hidden: usize,
    inter: usize,
    device: Device,
) -> Result<MoePlan> {
    let hopper = match device {
        Device::Cuda(ordinal) => crate::gpu::moe::is_hopper(crate::cuda::device(ordinal)?.capability()),
        _ => false,
    };
    Ok(crate::gpu::moe::plan(num_tokens, top_k, num_experts, hidden, inter, hopper))
}

/// The experts of a batch one at a time with the dense ops, the reference of the
/// fused kernels (models' `--moe naive`): for every expert with tokens, gather its
/// tokens' rows ([`super::embedding`]), `linear` with its gate_up rows,
/// `silu_mul`, `linear` with its down rows; then the per-pair rows are gathered
/// back into pair order (zero rows for dropped pairs) and summed with the routing
/// weights ([`moe_sum`]). Same contract as [`fused_experts`], on every device and
/// dtype; it copies the routing ids to the host (one synchronisation).
pub fn naive_experts(x: &Tensor, w13: &Tensor, w2: &Tensor, routing: &MoeRouting) -> Result<Tensor> {
    const OP: &str = "naive_experts";
    let device = common_device(
        OP,
        &[("x", x), ("w13", w13), ("w2", w2), ("topk_ids", &routing.topk_ids), ("topk_weights", &routing.topk_weights)],
    )?;
    let s = check_experts(OP, x, w13, w2)?;
    check_routing(OP, routing, s.num_tokens)?;
    let k = routing.top_k();
    let out = Tensor::empty(&[s.num_tokens, s.hidden], x.dtype(), device)?;
    if s.num_tokens == 0 {
        return Ok(out);
    }
    let x = if x.is_contiguous() { x.clone() } else { x.contiguous()? };
    let ids = routing.topk_ids.to_vec::<i32>()?;
    let mut pairs: Vec<Vec<usize>> = vec![Vec::new(); s.num_experts];
    for (p, &e) in ids.iter().enumerate() {
        if let Some(list) = usize::try_from(e).ok().and_then(|e| pairs.get_mut(e)) {
            list.push(p);
        }
    }
    let valid: usize = pairs.iter().map(Vec::len).sum();
    // Rows of every expert's output, expert after expert; `position[p]` = the row
    // of pair p (-1: dropped, gathered as a zero row).
    let rows = Tensor::empty(&[valid.max(1), s.hidden], x.dtype(), device)?;
    let mut position = vec![-1i32; ids.len()];
    let mut offset = 0;
    for (e, list) in pairs.iter().enumerate().filter(|(_, l)| !l.is_empty()) {
        let tokens: Vec<i32> = list.iter().map(|&p| (p / k) as i32).collect();
        let xe = embedding(&x, &Tensor::from_slice(&tokens, &[tokens.len()], device)?, 0)?;
        let gate_up = linear(&xe, &w13.narrow(0, e, 1)?.reshape(&[2 * s.inter, s.hidden])?, None)?;
        let y = linear(&silu_mul(&gate_up)?, &w2.narrow(0, e, 1)?.reshape(&[s.hidden, s.inter])?, None)?;
        copy(&rows.narrow(0, offset, list.len())?, &y)?;
        for (i, &p) in list.iter().enumerate() {
            position[p] = (offset + i) as i32;
        }
        offset += list.len();
    }
    let part = embedding(&rows, &Tensor::from_slice(&position, &[position.len()], device)?, 0)?;
    moe_sum(&out, &part, routing, s.num_experts, true)?;
    Ok(out)
}

/// One grouped GEMM over the sorted pairs (see csrc/kernels/moe_gemm.cu):
/// - `gate_up`: `out` `[L, I]` (the activation, in sorted order) =
///   `silu(x[token] W_gate^T) * (x[token] W_up^T)` for every sorted row, `a` = `x`
///   `[t, H]`, `w` = `w13` `[E, 2I, H]`;
/// - down: `out` `[t k, H]` (by pair) = `topk_weights[pair] * (act W_down^T)`, `a` =
///   the activation `[L, I]`, `w` = `w2` `[E, H, I]`.
///
/// `tile` picks the kernel configuration (its rows must equal `align.tile_m`).
/// CUDA, bf16/f16 only; `out` is written (padding rows of the activation get
/// zeros, rows of dropped pairs are left as they are).
pub fn moe_gemm(
    out: &Tensor,
    a: &Tensor,
    w: &Tensor,
    align: &MoeAlignment,
    routing: &MoeRouting,
    tile: usize,
    gate_up: bool,
) -> Result<()> {
    const OP: &str = "moe_gemm";
    let device = common_device(
        OP,
        &[("out", out), ("a", a), ("w", w), ("sorted_ids", &align.sorted_ids), ("topk_ids", &routing.topk_ids)],
    )?;
    let Device::Cuda(_) = device else {
        return Err(Error::arg(OP, "the grouped GEMM kernel runs on CUDA only (the CPU path is fused_experts)"));
    };
    crate::gpu::moe::gemm(out, a, w, align, routing, tile, gate_up, false)
}

/// `out[t] = sum_s w[t, s] part[t k + s]` over the slots whose expert id is in
/// `[0, num_experts)`, with `w` = `routing.topk_weights` when `weighted`, else 1.
/// `out` `[t, H]` and `part` `[t k, H]` contiguous, one float dtype; f32 sums.
pub fn moe_sum(out: &Tensor, part: &Tensor, routing: &MoeRouting, num_experts: usize, weighted: bool) -> Result<()> {
    const OP: &str = "moe_sum";
    let device = common_device(OP, &[("out", out), ("part", part), ("topk_ids", &routing.topk_ids)])?;
    let [t, h] = out.dims::<2>(OP, "out")?;
    check_routing(OP, routing, t)?;
    let k = routing.top_k();
    part.expect_shape(OP, "part", &[t * k, h])?
        .expect_dtype(OP, "part", &[out.dtype()])?
        .expect_contiguous(OP, "part")?;
    out.expect_dtype(OP, "out", FLOATS)?.expect_contiguous(OP, "out")?;
    if t == 0 || h == 0 {
        return Ok(());
    }
    match device {
        Device::Cpu => crate::cpu::moe::sum(out, part, routing, num_experts, weighted),
        Device::Cuda(_) => crate::gpu::moe::sum(out, part, routing, num_experts, weighted, false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorted_rows_and_tiles_bound_the_layout() {
        assert_eq!(moe_sorted_rows(8, 128, 16), 128);
        assert_eq!(moe_sorted_rows(1, 8, 16), 16);
        assert_eq!(moe_sorted_rows(32768, 128, 16), 32768 + 128 * 15);
        assert_eq!(moe_tile_entries(128, 8, 128, 16), 2 + 8 + 8);
        assert!(fused_experts_support(DType::BF16, 2048, 768).is_ok());
        assert!(fused_experts_support(DType::F32, 2048, 768).unwrap_err().contains("bf16"));
        assert!(fused_experts_support(DType::F16, 2048, 100).unwrap_err().contains("multiples of 8"));
    }
}
