//! The small ops of a decode step at 64 rows (bf16), fused against unfused:
//! RMSNorm and the fused residual-add RMSNorm at Qwen3-0.6B's and Llama-3-8B's
//! hidden sizes; Qwen3-0.6B's attention prologue (q norm, k norm, RoPE, KV store:
//! four launches) against `ops::rope_store` with the q/k norm (one launch); and
//! Llama-3-8B's (RoPE, KV store) against `ops::rope_store` without it; and token
//! sampling (`ops::sample_with`, settings uploaded once) of Qwen3's 151,936-token
//! bf16 logits at temperature 0.6 without filters for 1, 64 and 256 rows, and
//! greedy at 256, whose bytes are one read of the logits. Criterion
//! timing with CUDA events around back-to-back launches behind a backlog
//! (benches/common), and one plain-text line per case for run scripts:
//!
//! `SUMMARY small <case>: median <us> us, <TB/s> TB/s (<bytes> bytes per launch)`
//!
//! and a second line per case, `SUMMARY small <case> [graph]: ...`, from the same
//! launches replayed out of a CUDA graph as a decode step runs them (no host gap
//! between launches; see `common::graph_median_us`).
//!
//! Targets (issue 12): each RMSNorm and the fused prologue <= 3 us at 64 rows, where
//! the profile of a Qwen3-0.6B decode step had 7.3 + 5.4 + 5.7 us of norms, 3.6 us
//! of rope and 3.8 us of store; sampling about 20-30 us at 256 rows (a read of the
//! row at near the bandwidth), where the old kernel took ~159 us for 207 rows.
//! Bytes are those read plus written once. The KV
//! cache holds 65536 slots in pages of 16, and the step's slots are random. On a
//! machine without a GPU the bench prints a skip line and exits 0.

mod common;

use common::{Case, GPU};
use kernel_runtime::ops::{self, QkNorm, RopeStore, SampleRow, SampleTable};
use kernel_runtime::{DType, Tensor};

const ROWS: usize = 64;
const SLOTS: usize = 65536;
const PAGE: usize = 16;
const MAX_POS: usize = 4096;

/// Deterministic pseudo-random bf16 values in `center +- scale` (never zeros).
fn random(shape: &[usize], seed: u64, center: f32, scale: f32) -> kernel_runtime::Result<Tensor> {
    let n: usize = shape.iter().product();
    let mut s = seed | 1;
    let v: Vec<half::bf16> = (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let u = (s.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40) as f32 / (1u64 << 24) as f32;
            half::bf16::from_f32(center + (2.0 * u - 1.0) * scale)
        })
        .collect();
    Tensor::from_slice(&v, shape, GPU)
}

/// ROWS distinct slots of 0..SLOTS (an LCG walk with an odd step).
fn slots() -> Vec<i32> {
    (0..ROWS).map(|i| ((i * 40503 + 977) % SLOTS) as i32).collect()
}

fn cos_sin(rotary_dim: usize) -> kernel_runtime::Result<Tensor> {
    let half = rotary_dim / 2;
    let mut v = Vec::with_capacity(MAX_POS * rotary_dim);
    for p in 0..MAX_POS {
        let a: Vec<f32> = (0..half).map(|i| p as f32 * 1e6f32.powf(-2.0 * i as f32 / rotary_dim as f32)).collect();
        v.extend(a.iter().map(|x| x.cos()));
        v.extend(a.iter().map(|x| x.sin()));
    }
    Tensor::from_slice(&v, &[MAX_POS, rotary_dim], GPU)
}

fn norm_cases(hidden: usize, label: &str) -> kernel_runtime::Result<Vec<Case>> {
    let x = random(&[ROWS, hidden], 1, 0.0, 1.0)?;
    let w = random(&[hidden], 2, 1.0, 0.2)?;
    let res = random(&[ROWS, hidden], 3, 0.0, 1.0)?;
    let row_bytes = (ROWS * hidden * 2) as u64;
    let (x2, w2) = (x.clone(), w.clone());
    Ok(vec![
        Case {
            name: format!("small rms_norm {label} {ROWS}x{hidden}"),
            bytes: 2 * row_bytes,
            flops: 0,
            run: Box::new(move || ops::rms_norm(&x, &w, 1e-6).map(drop)),
        },
        Case {
            name: format!("small fused_add_rms_norm {label} {ROWS}x{hidden}"),
            bytes: 4 * row_bytes,
            flops: 0,
            run: Box::new(move || ops::fused_add_rms_norm(&x2, &res, &w2, 1e-6)),
        },
    ])
}

/// The attention prologue of one layer: (unfused, fused) cases.
fn prologue_cases(label: &str, hq: usize, hkv: usize, d: usize, qk_norm: bool) -> kernel_runtime::Result<Vec<Case>> {
    let qkv = random(&[ROWS, hq + 2 * hkv, d], 4, 0.0, 1.0)?;
    let kc = random(&[SLOTS / PAGE, PAGE, hkv, d], 5, 0.0, 1.0)?;
    let vc = random(&[SLOTS / PAGE, PAGE, hkv, d], 6, 0.0, 1.0)?;
    let qw = random(&[d], 7, 1.0, 0.2)?;
    let kw = random(&[d], 8, 1.0, 0.2)?;
    let positions: Vec<i32> = (0..ROWS).map(|i| (500 + 11 * i % 700) as i32).collect();
    let positions = Tensor::from_slice(&positions, &[ROWS], GPU)?;
    let out_loc = Tensor::from_slice(&slots(), &[ROWS], GPU)?;
    let cs = cos_sin(d)?;
    // Read q, k, v (and positions, slots, cos/sin rows); write q, k and v rows.
    let bytes = (ROWS * (hq + 2 * hkv) * d * 2 * 2 + ROWS * (8 + d * 4)) as u64;
    let fused = {
        let (qkv, kc, vc, qw, kw, positions, out_loc, cs) = (
            qkv.clone(),
            kc.clone(),
            vc.clone(),
            qw.clone(),
            kw.clone(),
            positions.clone(),
            out_loc.clone(),
            cs.clone(),
        );
        move || -> kernel_runtime::Result<()> {
            let (q, k, v) = (qkv.narrow(1, 0, hq)?, qkv.narrow(1, hq, hkv)?, qkv.narrow(1, hq + hkv, hkv)?);
            let norm = qk_norm.then_some(QkNorm { q_weight: &qw, k_weight: &kw, eps: 1e-6 });
            ops::rope_store(&RopeStore {
                q: &q,
                k: &k,
                v: &v,
                k_cache: &kc,
                v_cache: &vc,
                positions: &positions,
                out_loc: &out_loc,
                cos_sin: &cs,
                qk_norm: norm,
            })
        }
    };
    let unfused = move || -> kernel_runtime::Result<()> {
        let (q, k, v) = (qkv.narrow(1, 0, hq)?, qkv.narrow(1, hq, hkv)?, qkv.narrow(1, hq + hkv, hkv)?);
        if qk_norm {
            ops::head_rms_norm(&q, &qw, 1e-6)?;
            ops::head_rms_norm(&k, &kw, 1e-6)?;
        }
        ops::rope(&q, &k, &positions, &cs)?;
        ops::store_kv(&kc, &vc, &out_loc, &k, &v)
    };
    let what = if qk_norm { "q/k norm + rope + store" } else { "rope + store" };
    Ok(vec![
        Case { name: format!("small {what} {label} {ROWS} tok unfused"), bytes, flops: 0, run: Box::new(unfused) },
        Case { name: format!("small {what} {label} {ROWS} tok fused"), bytes, flops: 0, run: Box::new(fused) },
    ])
}

/// Qwen3's vocabulary.
const VOCAB: usize = 151_936;

/// Sampling of `rows` bf16 logits rows: tempered without filters, or greedy.
fn sampling_case(rows: usize, greedy: bool) -> kernel_runtime::Result<Case> {
    let logits = random(&[rows, VOCAB], 9 + rows as u64, 0.0, 4.0)?;
    let params: Vec<SampleRow> = (0..rows)
        .map(|r| match greedy {
            true => SampleRow::greedy(),
            false => {
                SampleRow { temperature: 0.6, top_k: 0, top_p: 1.0, min_p: 0.0, u: (r as f32 + 0.5) / rows as f32 }
            }
        })
        .collect();
    let table = SampleTable::new(&params, GPU)?;
    let out = Tensor::empty(&[rows], DType::I32, GPU)?;
    let what = if greedy { "greedy" } else { "t=0.6" };
    Ok(Case {
        name: format!("small sample {what} bf16 {rows}x{VOCAB}"),
        bytes: (rows * VOCAB * 2) as u64,
        flops: 0,
        run: Box::new(move || ops::sample_with(&logits, &table, &out)),
    })
}

fn main() {
    if !common::gpu_present() {
        return;
    }
    if let Err(e) = run() {
        eprintln!("small_ops bench failed: {e}");
        std::process::exit(1);
    }
}

fn run() -> kernel_runtime::Result<()> {
    let mut cases = Vec::new();
    cases.extend(norm_cases(1024, "qwen3-0.6b")?);
    cases.extend(norm_cases(4096, "llama3-8b")?);
    cases.extend(prologue_cases("qwen3-0.6b 16/8x128", 16, 8, 128, true)?);
    cases.extend(prologue_cases("llama3-8b 32/8x128", 32, 8, 128, false)?);
    for rows in [1, 64, 256] {
        cases.push(sampling_case(rows, false)?);
    }
    cases.push(sampling_case(256, true)?);
    common::bench_cases_and_graphs("small_ops", &cases)
}
