"""Torch twins of benches/gemm.rs and benches/small_ops.rs, for docs/PERF.md.

Each line `SUMMARY <case> <median us> us <TB/s> TB/s` is a median over warmed-up
CUDA-event timings of back-to-back launches (groups of ~2 ms, as the Rust benches
time them). GEMM cases: torch.matmul(x, w.T) in bf16 at the projections of
Llama-3-8B and Qwen3-0.6B, M = 1, 4, 16, 64; TB/s counts the weight bytes, and
each case rotates over enough weight copies (>= 256 MiB) to miss L2. Small ops at
64 rows: RMSNorm and add + RMSNorm in plain torch (several kernels each; torch has
no fused RMSNorm in eager mode before 2.4, and F.rms_norm is used where present).

Each GEMM case is also timed from a CUDA graph (`torch gemm-graph ...`: 20 or more
matmuls captured back to back, every weight copy in turn, timed over replays), the
way benches/gemm.rs now times its cases: a launch from the host costs more than the
GPU work of the small shapes.

Run on the GPU machine: python3 scripts/gpu/torch_gemm_baselines.py
"""
import torch

dev = torch.device("cuda")
torch.manual_seed(0)

SHAPES = [
    ("llama3-8b", "qkv", 4096, 6144),
    ("llama3-8b", "o", 4096, 4096),
    ("llama3-8b", "gate_up", 4096, 28672),
    ("llama3-8b", "down", 14336, 4096),
    ("llama3-8b", "lm_head", 4096, 128256),
    ("qwen3-30b-a3b", "qkv", 2048, 5120),
    ("qwen3-30b-a3b", "o", 4096, 2048),
    ("qwen3-0.6b", "qkv", 1024, 4096),
    ("qwen3-0.6b", "o", 2048, 1024),
    ("qwen3-0.6b", "gate_up", 1024, 6144),
    ("qwen3-0.6b", "down", 3072, 1024),
    ("qwen3-0.6b", "lm_head", 1024, 151936),
]
MS = (1, 4, 16, 64)
ROTATE_BYTES = 256 << 20


def median_us(fn, samples=30):
    """Median microseconds per call over `samples` groups of ~2 ms."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(10):
        fn()
    e.record()
    e.synchronize()
    one_ms = max(s.elapsed_time(e) / 10, 1e-4)
    per_group = int(min(max(2.0 / one_ms, 10), 10000))
    times = []
    for _ in range(samples):
        s.record()
        for _ in range(per_group):
            fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1000.0 / per_group)
    times.sort()
    return times[len(times) // 2]


def report(case, us, nbytes):
    print(f"SUMMARY {case:<44} {us:10.2f} us {nbytes / us / 1e6:8.3f} TB/s", flush=True)


for model, proj, k, n in SHAPES:
    weight_bytes = n * k * 2
    copies = min(max(-(-ROTATE_BYTES // weight_bytes), 2), 64)
    w0 = torch.randn(n, k, dtype=torch.bfloat16, device=dev) * 0.05
    ws = [w0.clone() for _ in range(copies)]
    del w0
    for m in MS:
        x = torch.randn(m, k, dtype=torch.bfloat16, device=dev)
        state = {"i": 0}

        def gemm():
            i = state["i"]
            state["i"] = (i + 1) % len(ws)
            return torch.matmul(x, ws[i].t())

        report(f"torch gemm {model} {proj} m={m}", median_us(gemm), weight_bytes)

        launches = len(ws) * -(-20 // len(ws))
        for _ in range(3):
            gemm()  # warm-up outside the capture (cuBLAS handles, workspaces)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = [gemm() for _ in range(launches)]
        report(f"torch gemm-graph {model} {proj} m={m}", median_us(graph.replay) / launches, weight_bytes)
        del graph, outs
    del ws
    torch.cuda.empty_cache()

ROWS = 64
for label, hidden in (("qwen3-0.6b", 1024), ("llama3-8b", 4096)):
    x = torch.randn(ROWS, hidden, dtype=torch.bfloat16, device=dev)
    res = torch.randn_like(x)
    w = torch.ones(hidden, dtype=torch.bfloat16, device=dev)
    row_bytes = ROWS * hidden * 2
    if hasattr(torch.nn.functional, "rms_norm"):
        norm = lambda t: torch.nn.functional.rms_norm(t, (hidden,), w, 1e-6)
    else:
        norm = lambda t: (t.float() * torch.rsqrt(t.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(t.dtype) * w

    report(f"torch rms_norm {label} {ROWS}x{hidden}", median_us(lambda: norm(x)), 2 * row_bytes)

    def add_norm():
        res.add_(x)
        return norm(res)

    report(f"torch add+rms_norm {label} {ROWS}x{hidden}", median_us(add_norm), 4 * row_bytes)
