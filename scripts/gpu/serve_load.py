#!/usr/bin/env python3
"""Streaming load on a running `minisgl serve`: N concurrent clients, each one
streaming /v1/completions of `max_tokens` tokens (ignore_eos), standard library
only (the GPU machine has no openai package and no network). Prints one line:
total output tokens/s over the wall time, and the inter-token latency p50/p99 over
every gap between consecutive streamed chunks of one request.

    python3 scripts/gpu/serve_load.py --port 30000 --clients 256 --max-tokens 256
"""
import argparse
import asyncio
import json
import statistics
import time


async def one(host, port, body, gaps, counts):
    reader, writer = await asyncio.open_connection(host, port)
    payload = json.dumps(body).encode()
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + b"Content-Length: " + str(len(payload)).encode() + b"\r\nConnection: close\r\n\r\n" + payload
    )
    await writer.drain()
    status = await reader.readline()
    if b" 200 " not in status:
        raise RuntimeError(f"HTTP status {status!r}")
    while (await reader.readline()) not in (b"\r\n", b""):
        pass
    last, tokens = None, 0
    while True:
        line = await reader.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            break
        chunk = json.loads(data)
        if not chunk.get("choices"):
            continue
        now = time.perf_counter()
        if last is not None:
            gaps.append(now - last)
        last = now
        tokens += 1
    writer.close()
    counts.append(tokens)


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--clients", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--prompt", default="Tell me a story about a lighthouse keeper.")
    ap.add_argument("--model", default="model")
    a = ap.parse_args()
    body = {"model": a.model, "prompt": a.prompt, "max_tokens": a.max_tokens, "stream": True,
            "ignore_eos": True, "temperature": 0.6}
    gaps, counts = [], []
    t0 = time.perf_counter()
    await asyncio.gather(*(one(a.host, a.port, body, gaps, counts) for _ in range(a.clients)))
    wall = time.perf_counter() - t0
    usage = a.clients * a.max_tokens
    gaps.sort()
    p = lambda q: gaps[min(len(gaps) - 1, int(q * len(gaps)))] * 1e3 if gaps else float("nan")
    print(f"SUMMARY serve-load clients={a.clients} max_tokens={a.max_tokens}: {usage / wall:.0f} output tok/s "
          f"({usage} tokens in {wall:.2f} s, {sum(counts)} chunks), inter-token p50 {p(0.5):.2f} ms, p99 {p(0.99):.2f} ms")


asyncio.run(main())
