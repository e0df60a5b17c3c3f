"""mini-sglang's Triton fused MoE, measured at the shapes of benches/moe.rs.

The GPU machine has torch and triton but not sglang / sgl_kernel, so this file
re-states mini-sglang's fused_experts path (python/minisgl/moe/fused.py and
kernel/triton/fused_moe.py) compactly, with the same kernel structure and the
same default configs:

  - moe_align_block_size: in torch (sgl_kernel's CUDA kernel is not importable);
    timed separately and left out of the `kernels` figure, like GPU.md's;
  - fused_moe_kernel: the Triton grouped GEMM over the block-padded, expert-sorted
    pair list (grouped pid order, masked gather of A rows by token, routing
    weight applied in the down GEMM's epilogue), launched twice;
  - silu_and_mul between the GEMMs (sgl_kernel's CUDA kernel; a one-pass Triton
    kernel here), and moe_sum_reduce_triton for the top-k sum;
  - get_default_config: M <= E -> BLOCK 16/32/64, GROUP 1; else 64/64/32, GROUP 8
    (Triton's default num_warps = 4, num_stages = 3).

Each `SUMMARY moe-triton M=<m> <median us> us <TFLOP/s> TFLOP/s <TB/s> TB/s` line is
the median over CUDA-event timings of warmed-up runs of the kernels (both GEMMs +
SiLU-mul + sum), rotating between 4 token/routing sets; `SUMMARY moe-triton-full`
adds top-k softmax and the torch align. FLOPs = 2 M top_k 3 H I; TB/s counts the
distinct experts' weights (3 H I bf16 each) over the time. The routing is the
softmax top-k of normal random logits, as benches/moe.rs draws them.

  python3 scripts/gpu/moe_triton_baseline.py [--m 1,16,64,256,1024,4096] [--check]
"""
import argparse

import torch
import triton
import triton.language as tl


@triton.jit
def fused_moe_kernel(a_ptr, b_ptr, c_ptr, topk_weights_ptr, sorted_token_ids_ptr, expert_ids_ptr,
                     num_tokens_post_padded_ptr, N, K, EM, num_valid_tokens, stride_am, stride_ak, stride_be,
                     stride_bk, stride_bn, stride_cm, stride_cn, BLOCK_SIZE_M: tl.constexpr,
                     BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
                     MUL_ROUTED_WEIGHT: tl.constexpr, top_k: tl.constexpr, compute_type: tl.constexpr):
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(EM, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    num_tokens_post_padded = tl.load(num_tokens_post_padded_ptr)
    if pid_m * BLOCK_SIZE_M >= num_tokens_post_padded:
        return
    offs_token_id = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_token = tl.load(sorted_token_ids_ptr + offs_token_id).to(tl.int64)
    token_mask = offs_token < num_valid_tokens
    offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + (offs_token[:, None] // top_k * stride_am + offs_k[None, :] * stride_ak)
    off_experts = tl.load(expert_ids_ptr + pid_m)
    b_ptrs = b_ptr + off_experts * stride_be + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
    accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        # even_Ks (K % BLOCK_SIZE_K == 0) at every shape measured here.
        a = tl.load(a_ptrs, mask=token_mask[:, None], other=0.0)
        b = tl.load(b_ptrs)
        accumulator += tl.dot(a, b)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk
    if MUL_ROUTED_WEIGHT:
        moe_weight = tl.load(topk_weights_ptr + offs_token, mask=token_mask, other=0)
        accumulator = accumulator * moe_weight[:, None]
    accumulator = accumulator.to(compute_type)
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + stride_cm * offs_token[:, None] + stride_cn * offs_cn[None, :]
    c_mask = token_mask[:, None] & (offs_cn[None, :] < N)
    tl.store(c_ptrs, accumulator, mask=c_mask)


@triton.jit
def silu_and_mul_kernel(x_ptr, out_ptr, inter, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inter
    g = tl.load(x_ptr + row * 2 * inter + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * 2 * inter + inter + offs, mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + row * inter + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def moe_sum_reduce_kernel(input_ptr, s0, s1, output_ptr, o0, token_num, topk_num: tl.constexpr, hidden_dim,
                          BLOCK_DIM: tl.constexpr):
    token = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK_DIM + tl.arange(0, BLOCK_DIM)
    mask = offs < hidden_dim
    acc = tl.zeros((BLOCK_DIM,), dtype=tl.float32)
    for i in range(topk_num):
        acc += tl.load(input_ptr + token.to(tl.int64) * s0 + i * s1 + offs, mask=mask, other=0.0)
    tl.store(output_ptr + token.to(tl.int64) * o0 + offs, acc.to(output_ptr.dtype.element_ty), mask=mask)


def get_default_config(m, e):
    if m <= e:
        return dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=64, GROUP_SIZE_M=1)
    return dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=64, BLOCK_SIZE_K=32, GROUP_SIZE_M=8)


def moe_align_block_size(topk_ids, block_size, num_experts):
    """The layout of sgl_kernel's moe_align_block_size (stable within an expert), in torch."""
    flat = topk_ids.flatten().to(torch.int64)
    n = flat.numel()
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_size - 1) // block_size * block_size
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    order = torch.sort(flat, stable=True).indices
    sorted_experts = flat[order]
    rank = torch.arange(n, device=flat.device) - (torch.cumsum(counts, 0) - counts)[sorted_experts]
    max_padded = n + (num_experts + 1) * (block_size - 1)
    sorted_ids = torch.full((max_padded,), n, dtype=torch.int32, device=flat.device)
    sorted_ids[starts[sorted_experts] + rank] = order.to(torch.int32)
    blocks = triton.cdiv(max_padded, block_size)
    block_starts = torch.arange(blocks, device=flat.device) * block_size
    expert_ids = torch.searchsorted(ends, block_starts, right=True).clamp(max=num_experts - 1).to(torch.int32)
    total = ends[-1:].to(torch.int32)
    return sorted_ids, expert_ids, total


def invoke(a, b, c, topk_weights, sorted_ids, expert_ids, total, mul_routed_weight, top_k, config, num_valid):
    grid = (triton.cdiv(sorted_ids.shape[0], config["BLOCK_SIZE_M"]) * triton.cdiv(b.shape[1], config["BLOCK_SIZE_N"]),)
    fused_moe_kernel[grid](a, b, c, topk_weights, sorted_ids, expert_ids, total, b.shape[1], b.shape[2],
                           sorted_ids.shape[0], num_valid, a.stride(0), a.stride(1), b.stride(0), b.stride(2),
                           b.stride(1), c.stride(-2), c.stride(-1), MUL_ROUTED_WEIGHT=mul_routed_weight, top_k=top_k,
                           compute_type=tl.bfloat16, **config)


def fused_experts_kernels(x, w1, w2, topk_weights, topk_ids, align):
    m, h = x.shape
    e, two_i, _ = w1.shape
    inter = two_i // 2
    top_k = topk_ids.shape[1]
    config = get_default_config(m, e)
    sorted_ids, expert_ids, total = align
    cache1 = torch.empty((m * top_k, two_i), device=x.device, dtype=x.dtype)
    cache2 = torch.empty((m * top_k, inter), device=x.device, dtype=x.dtype)
    cache3 = torch.empty((m, top_k, h), device=x.device, dtype=x.dtype)
    out = torch.empty_like(x)
    n = topk_ids.numel()
    invoke(x, w1, cache1, topk_weights, sorted_ids, expert_ids, total, False, top_k, config, n)
    silu_and_mul_kernel[(m * top_k, triton.cdiv(inter, 1024))](cache1, cache2, inter, BLOCK=1024)
    invoke(cache2, w2, cache3.view(m * top_k, h), topk_weights, sorted_ids, expert_ids, total, True, 1, config, n)
    moe_sum_reduce_kernel[(m, triton.cdiv(h, 2048))](cache3, cache3.stride(0), cache3.stride(1), out, out.stride(0), m,
                                                      top_k, h, BLOCK_DIM=2048, num_warps=8)
    return out


def select_experts(logits, top_k, renormalize=True):
    probs = torch.softmax(logits.float(), dim=-1)
    w, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        w = w / w.sum(dim=-1, keepdim=True)
    return w, ids.to(torch.int32)


def median_us(fn, iters, warmup=5):
    for _ in range(warmup):
        fn(0)
    torch.cuda.synchronize()
    times = []
    for r in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(r)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1000.0)
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", default="1,16,64,256,1024,4096")
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=768)
    ap.add_argument("--check", action="store_true", help="compare with a torch loop over experts first")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    e, k, h, inter = args.experts, args.top_k, args.hidden, args.inter
    w1 = torch.randn(e, 2 * inter, h, device=dev, dtype=torch.bfloat16) / h ** 0.5
    w2 = torch.randn(e, h, inter, device=dev, dtype=torch.bfloat16) / inter ** 0.5
    sets = 4
    for m in [int(v) for v in args.m.split(",")]:
        xs = [torch.randn(m, h, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
        logits = [torch.randn(m, e, device=dev, dtype=torch.float32) for _ in range(sets)]
        routed = [select_experts(l, k) for l in logits]
        config = get_default_config(m, e)
        aligns = [moe_align_block_size(ids, config["BLOCK_SIZE_M"], e) for _, ids in routed]
        if args.check:
            w, ids = routed[0]
            got = fused_experts_kernels(xs[0], w1, w2, w, ids, aligns[0]).float()
            want = torch.zeros(m, h, device=dev)
            for t in range(min(m, 64)):
                for j in range(k):
                    ex = int(ids[t, j])
                    g = xs[0][t].float() @ w1[ex, :inter].float().T
                    u = xs[0][t].float() @ w1[ex, inter:].float().T
                    want[t] += float(w[t, j]) * ((torch.nn.functional.silu(g) * u) @ w2[ex].float().T)
            t = min(m, 64)
            rel = ((got[:t] - want[:t]).norm() / want[:t].norm()).item()
            print(f"CHECK moe-triton M={m} rel_l2={rel:.2e}", flush=True)
        flops = 2.0 * m * k * 3 * h * inter
        distinct = len(set(routed[0][1].flatten().tolist()))
        wbytes = distinct * 3 * h * inter * 2
        iters = 200 if m <= 256 else 50

        def kernels(r):
            w, ids = routed[r % sets]
            fused_experts_kernels(xs[r % sets], w1, w2, w, ids, aligns[r % sets])

        def full(r):
            w, ids = select_experts(logits[r % sets], k)
            fused_experts_kernels(xs[r % sets], w1, w2, w, ids, moe_align_block_size(ids, config["BLOCK_SIZE_M"], e))

        us = median_us(kernels, iters)
        print(f"SUMMARY moe-triton M={m} {us:.1f} us {flops / us / 1e6:.1f} TFLOP/s {wbytes / us / 1e6:.2f} TB/s",
              flush=True)
        us = median_us(full, iters)
        print(f"SUMMARY moe-triton-full M={m} {us:.1f} us {flops / us / 1e6:.1f} TFLOP/s {wbytes / us / 1e6:.2f} TB/s",
              flush=True)


if __name__ == "__main__":
    main()
