"""Torch figures measured in the same run as minisgl's kernels, for docs/PERF.md.

Each line `SUMMARY <case> <median us> <TB/s>` is a median over warmed-up
CUDA-event timings (torch on the GPU machine: 2.11, cu130). The cases mirror
benches/store_index.rs and GPU.md's anchors:
  - device-to-device copy of 2 GiB (the memory ceiling, read + write bytes)
  - KV store with index_copy_ into k and v caches (8 kv heads x 128, bf16)
  - embedding gather (hidden 4096, bf16, 128256-row table)
  - SDPA decode and causal prefill (the twins of benches/attention.rs)
Arguments name the sections to run (copy, store, embedding, decode, prefill);
none runs them all.
"""
import sys

import torch

SECTIONS = set(sys.argv[1:])


def wanted(section):
    return not SECTIONS or section in SECTIONS

dev = torch.device("cuda")
torch.manual_seed(0)


def median_us(fn, iters=200, warmup=20):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1000.0)
    times.sort()
    return times[len(times) // 2]


def report(case, us, nbytes):
    print(f"SUMMARY {case:<36} {us:10.2f} us {nbytes / us / 1e6:8.3f} TB/s", flush=True)


if wanted("copy"):
    # Copy ceiling.
    n = 2 << 30
    a = torch.empty(n, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    report("torch copy 2GiB", median_us(lambda: b.copy_(a), iters=50), 2 * n)
    del a, b

if wanted("store"):
    # KV store: index_copy_ into k and v caches.
    heads, dim = 8, 128
    num_slots = 1 << 20
    k_cache = torch.randn(num_slots, heads, dim, dtype=torch.bfloat16, device=dev)
    v_cache = torch.randn_like(k_cache)
    for t in (1, 64, 8192, 65536):
        k = torch.randn(t, heads, dim, dtype=torch.bfloat16, device=dev)
        v = torch.randn_like(k)
        loc = torch.randperm(num_slots, device=dev)[:t]

        def store():
            k_cache.index_copy_(0, loc, k)
            v_cache.index_copy_(0, loc, v)

        report(f"torch store n={t}", median_us(store), 4 * t * heads * dim * 2)
    del k_cache, v_cache

if wanted("embedding"):
    # Embedding gather.
    vocab, hidden = 128256, 4096
    w = torch.randn(vocab, hidden, dtype=torch.bfloat16, device=dev)
    for t in (1, 64, 8192, 65536):
        ids = torch.randint(0, vocab, (t,), device=dev)
        report(f"torch embedding n={t}", median_us(lambda: torch.nn.functional.embedding(ids, w)), 2 * t * hidden * 2)
    del w

# SDPA: the twins of benches/attention.rs (bf16, head dim 128, 8 kv heads, GQA by
# enable_gqa). Decode reads contiguous K/V ([b, kv heads, ctx, d]): bytes = K + V.
# Causal prefill FLOPs count the causal half (4 * heads * d * L^2 / 2 per sequence).
sdpa = torch.nn.functional.scaled_dot_product_attention
if wanted("decode"):
    for hq, b, ctx in ((32, 64, 2048), (32, 256, 1024), (32, 1, 4096), (16, 64, 2048)):
        q = torch.randn(b, hq, 1, 128, dtype=torch.bfloat16, device=dev)
        k = torch.randn(b, 8, ctx, 128, dtype=torch.bfloat16, device=dev)
        v = torch.randn_like(k)
        report(f"torch sdpa decode {hq}/8 b={b} ctx={ctx}", median_us(lambda: sdpa(q, k, v, enable_gqa=True)), 2 * k.numel() * 2)
        del q, k, v
if wanted("prefill"):
    for hq, b, L in ((32, 1, 4096), (32, 8, 1024), (16, 1, 4096)):
        q = torch.randn(b, hq, L, 128, dtype=torch.bfloat16, device=dev)
        k = torch.randn(b, 8, L, 128, dtype=torch.bfloat16, device=dev)
        v = torch.randn_like(k)
        us = median_us(lambda: sdpa(q, k, v, is_causal=True, enable_gqa=True), iters=50)
        flops = 4 * b * hq * 128 * L * L / 2
        print(f"SUMMARY {'torch sdpa prefill %d/8 b=%d L=%d' % (hq, b, L):<36} {us:10.2f} us {flops / us / 1e6:8.1f} TFLOP/s", flush=True)
        del q, k, v
