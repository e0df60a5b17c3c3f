#!/usr/bin/env python3
"""Test data for models/tests/gguf.rs: dequantisation cases and two tiny GGUF checkpoints.

Reference: the Python `gguf` package (gguf-py, llama.cpp's own), version 0.19.0, with numpy 2.x.
Regenerate (deterministic, seeded) from the repository root:

    python3 -m pip install gguf==0.19.0 numpy
    python3 models/tests/data/gguf/make_quant_cases.py

Writes, next to this script:

quant_cases.safetensors
    For every ggml type T the Rust side dequantises, and case C in {random, quantized}:
      "T.C.raw"       U8  [n_bytes]     the encoded blocks
      "T.C.expected"  F32 [rows, cols]  gguf.quants.dequantize(raw, T)
    `random` is random bytes with every f16 scale field overwritten by a finite f16 (negative,
    zero and subnormal ones included), so all quant bit patterns are covered; `quantized` is
    gguf.quants.quantize() of seeded normal data, for the types gguf-py can quantise.
    Plain types (F32, F16, BF16) get random finite bit patterns. The Rust test requires bit-equal
    f32 results.

tiny_llama.gguf (+ tiny_llama.safetensors)
    A 2-layer LLaMA written with gguf.GGUFWriter, alignment 64, a metadata key of every GGUF value
    type (test.*), tensors in F32/F16/BF16/Q8_0/Q4_0/Q4_1/Q5_0/Q5_1, Q/K rows permuted exactly as
    convert_hf_to_gguf.py's LlamaModel.permute does, an untied lm_head and a rope_freqs tensor
    (no HF counterpart). The .safetensors holds every tensor under its HF name, in HF layout, as the
    loader must return it: dequantised, Q/K rows un-permuted (layer 0's attn_q is F16 and exact,
    so there the un-permuted result equals the original weight).

tiny_qwen3moe.gguf (+ tiny_qwen3moe.safetensors)
    A 1-layer Qwen3-MoE (4 experts, head_dim 16 != hidden/heads, tied embeddings) with packed
    expert tensors; the .safetensors holds every per-expert HF tensor.
"""
import json
import os
import struct
from importlib.metadata import version

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V
from gguf import GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

HERE = os.path.dirname(os.path.abspath(__file__))

# Byte offsets of the f16 scale fields in each block type (ggml-common.h block_* structs).
F16_FIELDS = {
    T.Q8_0: [0],
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}
QUANTIZABLE = [T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1]


def finite_f16(rng, n):
    """n finite f16 scales: mostly normal magnitudes 2^-12..2^2, some 0, -0, subnormal, negative."""
    mag = np.exp2(rng.uniform(-12, 2, n)).astype(np.float32)
    sign = np.where(rng.random(n) < 0.3, -1.0, 1.0).astype(np.float32)
    v = (mag * sign).astype(np.float16)
    special = np.array([0.0, -0.0, 2.0 ** -20, -(2.0 ** -24), 65504.0], dtype=np.float16)
    k = min(len(special), n)
    v[:k] = special[:k]
    assert np.isfinite(v).all()
    return v


def random_case(rng, qtype, rows):
    block, size = GGML_QUANT_SIZES[qtype]
    cols = max(block, 64) * 2
    n_blocks = rows * cols // block
    if qtype == T.F32:
        bits = rng.integers(0, 2 ** 32, n_blocks, dtype=np.uint64).astype(np.uint32)
        bits = np.where((bits >> 23) & 0xFF == 0xFF, bits & ~np.uint32(1 << 30), bits).astype(np.uint32)
        raw = bits.view(np.uint8)
    elif qtype in (T.F16, T.BF16):
        exp_shift, exp_mask = (10, 0x1F) if qtype == T.F16 else (7, 0xFF)
        bits = rng.integers(0, 2 ** 16, n_blocks, dtype=np.uint32).astype(np.uint16)
        inf_nan = ((bits >> exp_shift) & exp_mask) == exp_mask
        bits = np.where(inf_nan, bits ^ np.uint16(1 << (exp_shift + 1)), bits).astype(np.uint16)
        raw = bits.view(np.uint8)
    else:
        raw = rng.integers(0, 256, (n_blocks, size), dtype=np.uint16).astype(np.uint8)
        for off in F16_FIELDS[qtype]:
            raw[:, off:off + 2] = finite_f16(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
        raw = raw.reshape(-1)
    raw = raw.reshape(rows, -1)
    expected = dequantize(raw, qtype).astype(np.float32)
    assert expected.shape == (rows, cols), (qtype.name, expected.shape)
    assert np.isfinite(expected).all(), qtype.name
    return raw, expected


def quantized_case(rng, qtype, rows):
    block, _ = GGML_QUANT_SIZES[qtype]
    cols = max(block, 64) * 2
    data = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
    data[0, :block] = 0.0  # an all-zero block (scale 0)
    raw = quantize(data, qtype)
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(rows, -1)
    return raw, dequantize(raw, qtype).astype(np.float32)


def save_safetensors(path, tensors, metadata):
    """Minimal safetensors writer (avoids a torch/safetensors dependency)."""
    dtypes = {np.dtype(np.uint8): "U8", np.dtype(np.float32): "F32"}
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        b = a.tobytes()
        header[name] = {"dtype": dtypes[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def permute(weights, n_head, n_head_kv):
    """convert_hf_to_gguf.py, LlamaModel.permute (numpy instead of torch)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2)
            .reshape(weights.shape))


def unpermute(weights, n_head):
    """The inverse, as transformers' GGUF loader (reverse_permute_weights) writes it."""
    dim = weights.shape[0] // n_head // 2
    w = weights.reshape(n_head, dim, 2, *weights.shape[1:])
    return w.swapaxes(2, 1).reshape(weights.shape)


def encode(rng, qtype, hf_array):
    """(array to hand GGUFWriter, raw_dtype, what the reader must return for it)."""
    a = np.ascontiguousarray(hf_array.astype(np.float32))
    if qtype == T.F32:
        return a, None, a
    if qtype == T.F16:
        h = a.astype(np.float16)
        return h, None, h.astype(np.float32)
    raw = np.ascontiguousarray(quantize(a, qtype)).view(np.uint8)
    return raw, qtype, dequantize(raw, qtype).astype(np.float32).reshape(a.shape)


def tokenizer_kv(w, vocab):
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [f"t{i}" for i in range(vocab - 3)]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (vocab - 3))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")


def tiny_llama(rng):
    hidden, heads, kv_heads, ffn, vocab, layers = 32, 4, 2, 64, 48, 2
    head_dim = hidden // heads
    path = os.path.join(HERE, "tiny_llama.gguf")
    w = GGUFWriter(path, "llama")
    w.add_custom_alignment(64)
    w.add_name("tiny-llama")
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head_dim)
    w.add_file_type(7)
    tokenizer_kv(w, vocab)
    # One key per GGUF value type, plus nesting and edge cases, for the reader test.
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_float32("test.f32", 0.1)
    w.add_bool("test.bool", True)
    w.add_string("test.string", "h\u00e9llo \u65e5\u672c")
    w.add_key_value("test.empty_string", "", V.STRING)  # add_string() skips empty strings
    w.add_uint64("test.u64", 2 ** 63 + 5)
    w.add_int64("test.i64", -(2 ** 62))
    w.add_float64("test.f64", 1e300)
    w.add_array("test.array_i32", [1, -2, 3])
    w.add_key_value("test.array_f32", [0.5, -1.5], V.ARRAY, V.FLOAT32)
    w.add_array("test.array_str", ["a", "", "\u00fc"])
    w.add_array("test.nested", [[1, 2], [3]])

    expected = {}

    def add(gguf_name, hf_name, qtype, hf_array, gguf_array=None):
        arr, raw, deq = encode(rng, qtype, hf_array if gguf_array is None else gguf_array)
        w.add_tensor(gguf_name, arr, raw_dtype=raw)
        expected[hf_name] = deq

    def normal(*shape):
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    add("token_embd.weight", "model.embed_tokens.weight", T.Q8_0, normal(vocab, hidden))
    for i in range(layers):
        p = f"model.layers.{i}"
        add(f"blk.{i}.attn_norm.weight", f"{p}.input_layernorm.weight", T.F32, 1 + normal(hidden))
        # Q/K: the file holds permute(w); the loader must hand back the un-permuted rows.
        q = normal(hidden, hidden).astype(np.float16).astype(np.float32)  # f16-exact
        q_type = T.F16 if i == 0 else T.Q8_0
        arr, raw, deq = encode(rng, q_type, permute(q, heads, heads))
        w.add_tensor(f"blk.{i}.attn_q.weight", arr, raw_dtype=raw)
        expected[f"{p}.self_attn.q_proj.weight"] = unpermute(deq, heads)
        if i == 0:
            assert np.array_equal(expected[f"{p}.self_attn.q_proj.weight"], q)
        k = normal(kv_heads * head_dim, hidden)
        assert np.array_equal(unpermute(permute(k, heads, kv_heads), kv_heads), k)
        arr, raw, deq = encode(rng, T.Q8_0 if i == 0 else T.F32, permute(k, heads, kv_heads))
        w.add_tensor(f"blk.{i}.attn_k.weight", arr, raw_dtype=raw)
        expected[f"{p}.self_attn.k_proj.weight"] = unpermute(deq, kv_heads)
        add(f"blk.{i}.attn_v.weight", f"{p}.self_attn.v_proj.weight", T.Q4_1, normal(kv_heads * head_dim, hidden))
        add(f"blk.{i}.attn_output.weight", f"{p}.self_attn.o_proj.weight", T.Q5_0, normal(hidden, hidden))
        add(f"blk.{i}.ffn_norm.weight", f"{p}.post_attention_layernorm.weight", T.F32, 1 + normal(hidden))
        add(f"blk.{i}.ffn_gate.weight", f"{p}.mlp.gate_proj.weight", T.BF16, normal(ffn, hidden))
        add(f"blk.{i}.ffn_up.weight", f"{p}.mlp.up_proj.weight", T.Q4_0, normal(ffn, hidden))
        add(f"blk.{i}.ffn_down.weight", f"{p}.mlp.down_proj.weight", T.Q5_1, normal(hidden, ffn))
    add("output_norm.weight", "model.norm.weight", T.F32, 1 + normal(hidden))
    add("output.weight", "lm_head.weight", T.Q8_0, normal(vocab, hidden))
    w.add_tensor("rope_freqs.weight", np.ones(head_dim // 2, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    save_safetensors(os.path.join(HERE, "tiny_llama.safetensors"), expected, {"source": "tiny_llama.gguf"})


def tiny_qwen3moe(rng):
    hidden, heads, kv_heads, head_dim, experts, moe_ffn, vocab = 32, 4, 2, 16, 4, 32, 48
    path = os.path.join(HERE, "tiny_qwen3moe.gguf")
    w = GGUFWriter(path, "qwen3moe")
    w.add_context_length(512)
    w.add_embedding_length(hidden)
    w.add_block_count(1)
    w.add_feed_forward_length(64)
    w.add_expert_feed_forward_length(moe_ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(experts)
    w.add_expert_used_count(2)
    tokenizer_kv(w, vocab)
    expected = {}

    def normal(*shape):
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    def add(gguf_name, hf_name, qtype, hf_array):
        arr, raw, deq = encode(rng, qtype, hf_array)
        w.add_tensor(gguf_name, arr, raw_dtype=raw)
        if hf_name is not None:
            expected[hf_name] = deq
        return deq

    p = "model.layers.0"
    add("token_embd.weight", "model.embed_tokens.weight", T.F32, normal(vocab, hidden))
    add("blk.0.attn_norm.weight", f"{p}.input_layernorm.weight", T.F32, 1 + normal(hidden))
    add("blk.0.attn_q.weight", f"{p}.self_attn.q_proj.weight", T.Q8_0, normal(heads * head_dim, hidden))
    add("blk.0.attn_k.weight", f"{p}.self_attn.k_proj.weight", T.Q8_0, normal(kv_heads * head_dim, hidden))
    add("blk.0.attn_v.weight", f"{p}.self_attn.v_proj.weight", T.F16, normal(kv_heads * head_dim, hidden))
    add("blk.0.attn_output.weight", f"{p}.self_attn.o_proj.weight", T.Q8_0, normal(hidden, heads * head_dim))
    add("blk.0.attn_q_norm.weight", f"{p}.self_attn.q_norm.weight", T.F32, 1 + normal(head_dim))
    add("blk.0.attn_k_norm.weight", f"{p}.self_attn.k_norm.weight", T.F32, 1 + normal(head_dim))
    add("blk.0.ffn_norm.weight", f"{p}.post_attention_layernorm.weight", T.F32, 1 + normal(hidden))
    add("blk.0.ffn_gate_inp.weight", f"{p}.mlp.gate.weight", T.F32, normal(experts, hidden))
    for gguf, proj, qtype, shape in [("ffn_gate_exps", "gate_proj", T.Q8_0, (experts, moe_ffn, hidden)),
                                     ("ffn_up_exps", "up_proj", T.Q4_0, (experts, moe_ffn, hidden)),
                                     ("ffn_down_exps", "down_proj", T.Q4_1, (experts, hidden, moe_ffn))]:
        deq = add(f"blk.0.{gguf}.weight", None, qtype, normal(*shape))
        for e in range(experts):
            expected[f"{p}.mlp.experts.{e}.{proj}.weight"] = deq[e]
    add("output_norm.weight", "model.norm.weight", T.F32, 1 + normal(hidden))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    save_safetensors(os.path.join(HERE, "tiny_qwen3moe.safetensors"), expected, {"source": "tiny_qwen3moe.gguf"})


def quant_cases(rng):
    types = [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]
    tensors = {}
    for qtype in types:
        cases = [("random", random_case(rng, qtype, rows=3))]
        if qtype in QUANTIZABLE:
            cases.append(("quantized", quantized_case(rng, qtype, rows=2)))
        for case, (raw, expected) in cases:
            tensors[f"{qtype.name}.{case}.raw"] = raw.reshape(-1)
            tensors[f"{qtype.name}.{case}.expected"] = expected
    save_safetensors(os.path.join(HERE, "quant_cases.safetensors"), tensors,
                     {"generator": "make_quant_cases.py", "gguf": version("gguf"), "numpy": np.__version__})


def main():
    quant_cases(np.random.default_rng(1234))
    tiny_llama(np.random.default_rng(5678))
    tiny_qwen3moe(np.random.default_rng(9012))
    total = sum(os.path.getsize(os.path.join(HERE, f)) for f in os.listdir(HERE))
    print(f"wrote test data to {HERE} ({total} bytes in total)")


if __name__ == "__main__":
    main()
