//! The decode kernel's run-time variants (`ops::DecodeTuning`: the tensor-core
//! block's pipeline stages, the `waves` and `keys` split plans, the split merge in
//! a thread-block cluster, in the decode launch's last block or in the combine
//! launch) against the CPU reference: page
//! sizes 1, 16, 64, 256; head dimensions 64, 128, 256; GQA ratios 1, 2, 4, 8;
//! contexts 1 to 32768; ragged batches with and without splits (the host's plan
//! and the fixed split counts of CUDA graphs); steps of 2 to 16 new tokens. Every
//! variant must also give the same bits on a second run and, for a graph's
//! fixed-split plan, when replayed from a captured CUDA graph and (within 16
//! splits) merged by the cluster or by the combine launch.
//!
//! `MINISGL_GPU_TESTS=1` runs them on device 0 (`cpu`: a dry run, the CPU standing in).

mod common;

use std::sync::Mutex;

use anyhow::{bail, ensure, Context, Result};
use common::{enabled_or_dry_run, gpu, random, rng, target, view_like};
use kernel_runtime::ops::{self, AttnKernel, DecodePlanKind, DecodeTuning, PagedAttnMeta, RopeStore};
use kernel_runtime::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;

const CPU: Device = Device::Cpu;

/// The tuning is process-wide: one test at a time changes it.
static TUNING: Mutex<()> = Mutex::new(());

/// One variant: a tuning and a forced split merge.
#[derive(Clone, Copy)]
struct Variant {
    tuning: DecodeTuning,
    merge: bool,
}

impl std::fmt::Display for Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = &self.tuning;
        write!(f, "stages={} plan={:?} merge={} cluster={}", t.stages, t.plan, self.merge, t.cluster)
    }
}

/// Every pipeline depth (and the three-warp block, stages 1) with both plans and
/// both merges (`all`), or the depths with one plan and merge each (a cheaper
/// sweep for the 16-bit subset). The
/// variants without the counter merge take the cluster merge (off by default;
/// here at most 16 splits), those with it leave it off; `all` adds the combine
/// launch alone (neither, the default).
fn variants(all: bool) -> Vec<Variant> {
    let mut out = Vec::new();
    for stages in [1, 2, 3, 4] {
        for (i, plan) in [DecodePlanKind::Waves, DecodePlanKind::Keys].into_iter().enumerate() {
            for merge in [false, true] {
                if all || (i == 1) == merge {
                    // A small chunk minimum makes the plans split more often (the
                    // graph plan's run-time chunks too).
                    let chunk_min = if merge { 64 } else { 128 };
                    let cluster = if merge { 0 } else { 16 };
                    let tuning = DecodeTuning {
                        stages,
                        plan,
                        chunk_min,
                        graph_chunk_min: chunk_min,
                        cluster,
                        ..DecodeTuning::default()
                    };
                    out.push(Variant { tuning, merge });
                }
            }
        }
    }
    if all {
        let tuning = DecodeTuning { stages: 2, plan: DecodePlanKind::Keys, cluster: 0, ..DecodeTuning::default() };
        out.push(Variant { tuning, merge: false });
    }
    out
}

/// A GPU tensor full of 0xff bytes.
fn poisoned(shape: &[usize], dtype: DType) -> Result<Tensor> {
    let n: usize = shape.iter().product::<usize>() * dtype.size_in_bytes();
    Ok(Tensor::from_bytes(&vec![0xffu8; n], dtype, shape, target())?)
}

/// ||got - want|| / ||want|| over f32 values (infinite when got holds a NaN/inf).
fn rel_l2(got: &Tensor, want: &Tensor) -> Result<f64> {
    ensure!(got.shape() == want.shape(), "shapes {:?} and {:?} differ", got.shape(), want.shape());
    let (g, w) = (got.to_f32_vec()?, want.to_f32_vec()?);
    let (mut num, mut den) = (0f64, 0f64);
    for (a, b) in g.iter().zip(&w) {
        if !a.is_finite() {
            return Ok(f64::INFINITY);
        }
        num += (f64::from(*a) - f64::from(*b)).powi(2);
        den += f64::from(*b).powi(2);
    }
    Ok(if den == 0.0 { num.sqrt() } else { (num / den).sqrt() })
}

fn assert_same_bytes(what: &str, got: &Tensor, want: &Tensor) -> Result<()> {
    let (g, w) = (got.to_host_bytes()?, want.to_host_bytes()?);
    ensure!(g.len() == w.len(), "{what}: {} bytes, expected {}", g.len(), w.len());
    if let Some(i) = g.iter().zip(&w).position(|(a, b)| a != b) {
        bail!("{what}: byte {i} is {:#04x}, expected {:#04x}", g[i], w[i]);
    }
    Ok(())
}

struct Case {
    dtype: DType,
    page_size: usize,
    head_dim: usize,
    heads: (usize, usize),
}

/// Runs `case` over `batch` on the CPU, then on the device with each variant and
/// each split plan (the host's, and fixed counts that leave some sequences
/// unsplit and some splits empty): close to the reference, the same bits on a
/// second run, and (fixed counts, on a GPU) the same bits from a graph replay.
fn check(r: &mut StdRng, case: &Case, batch_name: &str, batch: &[(usize, usize)], variants: &[Variant]) -> Result<()> {
    let Case { dtype, page_size, head_dim: d, heads: (hq, hkv) } = *case;
    let q_lens: Vec<usize> = batch.iter().map(|b| b.0).collect();
    let kv_lens: Vec<usize> = batch.iter().map(|b| b.1).collect();
    let t: usize = q_lens.iter().sum();
    let b = batch.len();
    let pages_per_seq: Vec<usize> = kv_lens.iter().map(|kv| kv.div_ceil(page_size)).collect();
    let max_pages = pages_per_seq.iter().copied().max().unwrap_or(1).max(1) + 1;
    let num_pages = pages_per_seq.iter().sum::<usize>() + 5;
    let mut order: Vec<i32> = (0..num_pages as i32).collect();
    order.shuffle(r);
    let mut table = vec![-1i32; b * max_pages];
    let mut next = 0;
    for (s, &n) in pages_per_seq.iter().enumerate() {
        table[s * max_pages..][..n].copy_from_slice(&order[next..next + n]);
        next += n;
    }
    let mut indptr = vec![0i32];
    for &q in &q_lens {
        indptr.push(indptr.last().copied().unwrap_or(0) + q as i32);
    }
    let kv_i32: Vec<i32> = kv_lens.iter().map(|&k| k as i32).collect();
    let (ti, tk, tt) = (
        Tensor::from_slice(&indptr, &[b + 1], CPU)?,
        Tensor::from_slice(&kv_i32, &[b], CPU)?,
        Tensor::from_slice(&table, &[b, max_pages], CPU)?,
    );
    let qkv = random(r, &[t, hq + 2 * hkv, d], dtype, 0.0, 1.0)?;
    let q = qkv.narrow(1, 0, hq)?;
    let k_cache = random(r, &[num_pages, page_size, hkv, d], dtype, 0.0, 1.0)?;
    let v_cache = random(r, &[num_pages, page_size, hkv, d], dtype, 0.0, 1.0)?;
    let scale = 1.0 / (d as f32).sqrt();
    let want = Tensor::zeros(&[t, hq, d], dtype, CPU)?;
    let meta = PagedAttnMeta {
        q_indptr: &ti,
        kv_lens: &tk,
        block_table: &tt,
        q_lens_host: &q_lens,
        kv_lens_host: &kv_lens,
        decode_splits: None,
    };
    ops::paged_attention(&want, &q, &k_cache, &v_cache, &meta, scale)?;

    let (gi, gk, gt) = (gpu(&ti)?, gpu(&tk)?, gpu(&tt)?);
    let gq = view_like(&gpu(&qkv)?, &q, 0)?;
    let (gkc, gvc) = (gpu(&k_cache)?, gpu(&v_cache)?);
    let tol = if dtype == DType::F32 { 1e-4 } else { 1e-2 };
    for v in variants {
        ops::set_decode_tuning(Some(v.tuning));
        ops::set_decode_split_merge(Some(v.merge));
        for decode_splits in [None, Some(1), Some(3), Some(16), Some(40)] {
            let gmeta = PagedAttnMeta {
                q_indptr: &gi,
                kv_lens: &gk,
                block_table: &gt,
                q_lens_host: &q_lens,
                kv_lens_host: &kv_lens,
                decode_splits,
            };
            let what = format!(
                "decode [{v}, splits {decode_splits:?}] {dtype} page={page_size} d={d} heads={hq}/{hkv} batch={batch_name}"
            );
            let run = |out: &Tensor| ops::paged_attention_with(out, &gq, &gkc, &gvc, &gmeta, scale, AttnKernel::Decode);
            let got = poisoned(&[t, hq, d], dtype)?;
            run(&got).with_context(|| what.clone())?;
            let err = rel_l2(&got, &want).with_context(|| what.clone())?;
            ensure!(err <= tol, "{what}: relative L2 error {err:.3e} > {tol:.0e}");
            let again = poisoned(&[t, hq, d], dtype)?;
            run(&again).with_context(|| what.clone())?;
            assert_same_bytes(&format!("{what}: second run"), &again, &got)?;
            if let (Some(_), Device::Cuda(ordinal)) = (decode_splits, target()) {
                let dev = kernel_runtime::cuda::device(ordinal)?;
                let replayed = poisoned(&[t, hq, d], dtype)?;
                let (mut graph, ()) = dev.capture(|| run(&replayed)).with_context(|| format!("{what}: capture"))?;
                graph.replay()?;
                graph.replay()?;
                dev.synchronize()?;
                assert_same_bytes(&format!("{what}: graph replay"), &replayed, &got)?;
            }
            // A fixed split count within the cluster cap: the cluster merge gives the
            // combine launch's bits (the same plan, merged the other way).
            if decode_splits.is_some_and(|s| (2..=v.tuning.cluster).contains(&s)) {
                ops::set_decode_tuning(Some(DecodeTuning { cluster: 0, ..v.tuning }));
                let combined = poisoned(&[t, hq, d], dtype)?;
                let r = run(&combined);
                ops::set_decode_tuning(Some(v.tuning));
                r.with_context(|| format!("{what}: cluster 0"))?;
                assert_same_bytes(&format!("{what}: the combine launch against the cluster merge"), &combined, &got)?;
            }
        }
    }
    Ok(())
}

/// Decode batches for a GQA group of `group` heads: ragged with and without
/// splits, and steps of 2 to 16 new tokens (up to the tensor-core block's 16 rows
/// per kv head; `max_rows` 8 on the CUDA-core blocks).
fn batches(r: &mut StdRng, group: usize, max_rows: usize) -> Vec<(String, Vec<(usize, usize)>)> {
    let mut out = vec![
        ("ragged".to_owned(), vec![(1, 1), (1, 17), (1, 300), (1, 4096), (1, 2500), (1, 63), (1, 65), (0, 40)]),
        ("one-short".to_owned(), vec![(1, 1)]),
        ("one-long".to_owned(), vec![(1, 4096)]),
    ];
    let many: Vec<(usize, usize)> = (0..64).map(|_| (1, r.gen_range(100..=2000))).collect();
    out.push(("64-uniform-100-2000".to_owned(), many));
    let tokens = max_rows / group;
    if tokens >= 2 {
        let k = r.gen_range(2..=tokens);
        out.push((
            format!("multi-{tokens}-{k}"),
            vec![(tokens, 300), (k, 5000), (tokens, tokens), (2, 2), (1, 1), (k, 1500)],
        ));
    }
    out
}

/// A case, a batch name and the batch: (new tokens, kv length) per sequence.
type Entry = (Case, String, Vec<(usize, usize)>);

fn run_matrix(cases: &mut Vec<Entry>, all: bool) -> Result<()> {
    let _guard = TUNING.lock().unwrap_or_else(|e| e.into_inner());
    let mut r = rng(21);
    let mut failures = Vec::new();
    let n = cases.len();
    for (case, name, batch) in cases.drain(..) {
        if let Err(e) = check(&mut r, &case, &name, &batch, &variants(all)) {
            failures.push(format!("{e:#}"));
        }
    }
    ops::set_decode_tuning(None);
    ops::set_decode_split_merge(None);
    println!("decode variants: {n} cases x {} variants", variants(all).len());
    ensure!(failures.is_empty(), "{} of {n} decode cases failed:\n{}", failures.len(), failures.join("\n"));
    Ok(())
}

/// bf16 on the tensor-core block, every variant.
#[test]
fn gpu_decode_variants_match_cpu_bf16() -> Result<()> {
    if !enabled_or_dry_run() {
        return Ok(());
    }
    let mut r = rng(20);
    let mut cases = Vec::new();
    for page_size in [1, 16, 64, 256] {
        for head_dim in [64, 128, 256] {
            for group in [1, 2, 4, 8] {
                for (name, batch) in batches(&mut r, group, 16) {
                    let case = Case { dtype: DType::BF16, page_size, head_dim, heads: (2 * group, 2) };
                    cases.push((case, name, batch));
                }
            }
        }
        // The longest context, with a short one beside it.
        let case = Case { dtype: DType::BF16, page_size, head_dim: 128, heads: (8, 2) };
        cases.push((case, "32k".to_owned(), vec![(1, 32768), (1, 3)]));
    }
    run_matrix(&mut cases, true)
}

/// f16 on the tensor-core block and f32 on the CUDA-core blocks (compiled at run
/// time; they have one pipeline depth, so the stages do not matter there), a
/// cheaper set of variants.
#[test]
fn gpu_decode_variants_match_cpu_f16_f32() -> Result<()> {
    if !enabled_or_dry_run() {
        return Ok(());
    }
    let mut r = rng(22);
    let mut cases = Vec::new();
    for (dtype, max_rows) in [(DType::F16, 16), (DType::F32, 8)] {
        for head_dim in [64, 128, 256] {
            for group in [1, 4, 8] {
                for (name, batch) in batches(&mut r, group, max_rows) {
                    cases.push((Case { dtype, page_size: 16, head_dim, heads: (2 * group, 2) }, name, batch));
                }
            }
        }
    }
    run_matrix(&mut cases, false)
}

/// Large batches of the benchmark's shapes: the plans' no-split and many-split
/// decisions (b=256, b=64 uniform and ragged, b=1 long), at page 16.
#[test]
fn gpu_decode_variants_at_benchmark_shapes() -> Result<()> {
    if !enabled_or_dry_run() {
        return Ok(());
    }
    let mut r = rng(23);
    let ragged: Vec<(usize, usize)> = (0..64).map(|_| (1, r.gen_range(100..=2000))).collect();
    let mut cases = vec![
        (
            Case { dtype: DType::BF16, page_size: 16, head_dim: 128, heads: (32, 8) },
            "b64-2048".to_owned(),
            vec![(1, 2048); 64],
        ),
        (
            Case { dtype: DType::BF16, page_size: 16, head_dim: 128, heads: (32, 8) },
            "b256-1024".to_owned(),
            vec![(1, 1024); 256],
        ),
        (
            Case { dtype: DType::BF16, page_size: 16, head_dim: 128, heads: (32, 8) },
            "b1-4096".to_owned(),
            vec![(1, 4096)],
        ),
        (Case { dtype: DType::BF16, page_size: 16, head_dim: 128, heads: (16, 8) }, "b64-ragged".to_owned(), ragged),
    ];
    run_matrix(&mut cases, true)
}

/// A decode step's paged layout on the host: sequences `(new tokens, kv length)`
/// over shuffled pages of `page_size` (three spare), with each new token's position
/// and cache slot.
struct PagedStep {
    q_lens: Vec<usize>,
    kv_lens: Vec<usize>,
    /// New tokens in all.
    t: usize,
    num_pages: usize,
    /// `[b + 1]`, `[b]`, `[b, max_pages]`, `[t]`, `[t]` int32.
    indptr: Tensor,
    kv: Tensor,
    table: Tensor,
    positions: Tensor,
    slots: Tensor,
}

fn paged_step(r: &mut StdRng, batch: &[(usize, usize)], page_size: usize) -> Result<PagedStep> {
    let q_lens: Vec<usize> = batch.iter().map(|b| b.0).collect();
    let kv_lens: Vec<usize> = batch.iter().map(|b| b.1).collect();
    let (b, t) = (batch.len(), q_lens.iter().sum::<usize>());
    let pages_per_seq: Vec<usize> = kv_lens.iter().map(|kv| kv.div_ceil(page_size)).collect();
    let max_pages = pages_per_seq.iter().copied().max().unwrap_or(1);
    let num_pages = pages_per_seq.iter().sum::<usize>() + 3;
    let mut order: Vec<i32> = (0..num_pages as i32).collect();
    order.shuffle(r);
    let mut table = vec![-1i32; b * max_pages];
    let (mut next, mut positions, mut slots, mut indptr) = (0, Vec::new(), Vec::new(), vec![0i32]);
    for (s, (&n, &(ql, kv))) in pages_per_seq.iter().zip(batch).enumerate() {
        table[s * max_pages..][..n].copy_from_slice(&order[next..next + n]);
        next += n;
        for pos in kv - ql..kv {
            positions.push(pos as i32);
            slots.push(table[s * max_pages + pos / page_size] * page_size as i32 + (pos % page_size) as i32);
        }
        indptr.push(indptr.last().copied().unwrap_or(0) + ql as i32);
    }
    let kv_i32: Vec<i32> = kv_lens.iter().map(|&k| k as i32).collect();
    Ok(PagedStep {
        indptr: Tensor::from_slice(&indptr, &[b + 1], CPU)?,
        kv: Tensor::from_slice(&kv_i32, &[b], CPU)?,
        table: Tensor::from_slice(&table, &[b, max_pages], CPU)?,
        positions: Tensor::from_slice(&positions, &[t], CPU)?,
        slots: Tensor::from_slice(&slots, &[t], CPU)?,
        q_lens,
        kv_lens,
        t,
        num_pages,
    })
}

/// A `[max_pos, rotary_dim]` cos/sin table (the layout `ops::rope` reads).
fn cos_sin_table(max_pos: usize, rotary_dim: usize) -> Result<Tensor> {
    let half = rotary_dim / 2;
    let mut v = Vec::with_capacity(max_pos * rotary_dim);
    for p in 0..max_pos {
        let angles: Vec<f32> =
            (0..half).map(|i| p as f32 * 10000f32.powf(-2.0 * i as f32 / rotary_dim as f32)).collect();
        v.extend(angles.iter().map(|a| a.cos()));
        v.extend(angles.iter().map(|a| a.sin()));
    }
    Ok(Tensor::from_slice(&v, &[max_pos, rotary_dim], CPU)?)
}

/// The decode kernel issues its first key tiles before the grid dependency wait
/// when they hold only keys of earlier steps: the step's new keys, stored by
/// rope_store right before it (both launched with programmatic dependent launch),
/// must still be read after that store. The new slots are first overwritten with
/// NaN bytes (a plain launch, finished before rope_store starts), so a tile read
/// too early shows as a NaN; every pipeline depth, with the host's plan and a
/// graph's fixed splits, against the CPU's rope_store and attention.
#[test]
fn gpu_decode_reads_the_keys_rope_store_wrote_just_before() -> Result<()> {
    if !enabled_or_dry_run() {
        return Ok(());
    }
    let _guard = TUNING.lock().unwrap_or_else(|e| e.into_inner());
    let mut r = rng(24);
    let (dtype, page_size, d, hq, hkv) = (DType::BF16, 16, 128, 16, 8);
    // Single new tokens at every offset in a tile and in a page, short contexts whose
    // first tile is new, and steps of up to 8 new tokens (16 rows at GQA 2).
    let mut batch: Vec<(usize, usize)> = (0..40).map(|_| (1, r.gen_range(1..=3000))).collect();
    batch.extend([(1, 1), (1, 16), (1, 17), (8, 8), (8, 9), (5, 700), (2, 4096), (3, 33)]);
    let PagedStep { q_lens, kv_lens, t, num_pages, indptr: ti, kv: tk, table: tt, positions: tpos, slots: tslots } =
        paged_step(&mut r, &batch, page_size)?;
    let cos_sin = cos_sin_table(4096, d)?;
    let qkv = random(&mut r, &[t, hq + 2 * hkv, d], dtype, 0.0, 1.0)?;
    let k_cache = random(&mut r, &[num_pages, page_size, hkv, d], dtype, 0.0, 1.0)?;
    let v_cache = random(&mut r, &[num_pages, page_size, hkv, d], dtype, 0.0, 1.0)?;
    let scale = 1.0 / (d as f32).sqrt();
    let heads = |x: &Tensor| -> Result<[Tensor; 3]> {
        Ok([x.narrow(1, 0, hq)?, x.narrow(1, hq, hkv)?, x.narrow(1, hq + hkv, hkv)?])
    };
    // Copies that the ops may write in place (`contiguous` may alias).
    let copy_of = |x: &Tensor, device: Device| -> Result<Tensor> {
        Ok(Tensor::from_bytes(&x.to_host_bytes()?, x.dtype(), x.shape(), device)?)
    };
    let (pristine, gkc, gvc) = (copy_of(&qkv, target())?, copy_of(&k_cache, target())?, copy_of(&v_cache, target())?);
    // The reference: rope_store, then attention, on the CPU.
    let want = Tensor::zeros(&[t, hq, d], dtype, CPU)?;
    {
        let (cq, ck, cv) = (copy_of(&qkv, CPU)?, copy_of(&k_cache, CPU)?, copy_of(&v_cache, CPU)?);
        let [q, k, v] = heads(&cq)?;
        let store = RopeStore {
            q: &q,
            k: &k,
            v: &v,
            k_cache: &ck,
            v_cache: &cv,
            positions: &tpos,
            out_loc: &tslots,
            cos_sin: &cos_sin,
            qk_norm: None,
        };
        ops::rope_store(&store)?;
        let meta = PagedAttnMeta {
            q_indptr: &ti,
            kv_lens: &tk,
            block_table: &tt,
            q_lens_host: &q_lens,
            kv_lens_host: &kv_lens,
            decode_splits: None,
        };
        ops::paged_attention(&want, &q, &ck, &cv, &meta, scale)?;
    }
    let (gi, gk, gt, gpos, gslots, gcs) = (gpu(&ti)?, gpu(&tk)?, gpu(&tt)?, gpu(&tpos)?, gpu(&tslots)?, gpu(&cos_sin)?);
    let nan_rows = poisoned(&[t, hkv, d], dtype)?;
    let mut failures = Vec::new();
    for stages in [1, 2, 3, 4] {
        ops::set_decode_tuning(Some(DecodeTuning { stages, chunk_min: 64, ..DecodeTuning::default() }));
        for decode_splits in [None, Some(1), Some(7)] {
            let what = format!("decode after rope_store [stages {stages}, splits {decode_splits:?}]");
            let got = poisoned(&[t, hq, d], dtype)?;
            let result = (|| -> Result<f64> {
                let work = copy_of(&pristine, target())?; // rope_store rotates q in place
                let [q, k, v] = heads(&work)?;
                ops::store_kv(&gkc, &gvc, &gslots, &nan_rows, &nan_rows)?;
                let store = RopeStore {
                    q: &q,
                    k: &k,
                    v: &v,
                    k_cache: &gkc,
                    v_cache: &gvc,
                    positions: &gpos,
                    out_loc: &gslots,
                    cos_sin: &gcs,
                    qk_norm: None,
                };
                ops::rope_store(&store)?;
                let meta = PagedAttnMeta {
                    q_indptr: &gi,
                    kv_lens: &gk,
                    block_table: &gt,
                    q_lens_host: &q_lens,
                    kv_lens_host: &kv_lens,
                    decode_splits,
                };
                ops::paged_attention_with(&got, &q, &gkc, &gvc, &meta, scale, AttnKernel::Decode)?;
                rel_l2(&got, &want)
            })();
            match result {
                Ok(err) if err <= 1e-2 => {}
                Ok(err) => failures.push(format!("{what}: relative L2 error {err:.3e} > 1e-2")),
                Err(e) => failures.push(format!("{what}: {e:#}")),
            }
        }
    }
    ops::set_decode_tuning(None);
    ensure!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

/// One shape of the fused prologue's test: head dim, heads, rotary dims, q/k norm.
struct FusedCase {
    head_dim: usize,
    heads: (usize, usize),
    rotary_dim: usize,
    qk_norm: bool,
}

/// The fused prologue (`ops::rope_store_attention` with the decode kernel running
/// rope_store in its launch) against rope_store followed by the attention launch:
/// the same output bits and the same cache bytes, for every pipeline depth, the
/// host's plan and graphs' fixed splits (replayed from a captured graph too),
/// with and without the split merge in the launch; new tokens at every offset in a
/// tile and a page, first tiles that hold new keys, steps of several new tokens
/// whose keys cross a split; q/k norm (Qwen3) and none, partial rotary, GQA 2 and
/// 4, head dims 64 and 128. The new slots are NaN bytes before each run, so a
/// key read from the cache before the prologue wrote it shows; q must come out of
/// the fused runs unrotated (the fused path ran, not rope_store's fallback).
#[test]
fn gpu_decode_fused_rope_matches_rope_store_then_attention() -> Result<()> {
    if !enabled_or_dry_run() {
        return Ok(());
    }
    let _guard = TUNING.lock().unwrap_or_else(|e| e.into_inner());
    let mut r = rng(25);
    let cases = [
        FusedCase { head_dim: 128, heads: (16, 8), rotary_dim: 128, qk_norm: true },
        FusedCase { head_dim: 128, heads: (32, 8), rotary_dim: 128, qk_norm: false },
        FusedCase { head_dim: 128, heads: (16, 8), rotary_dim: 64, qk_norm: true },
        FusedCase { head_dim: 64, heads: (8, 4), rotary_dim: 64, qk_norm: true },
    ];
    let mut failures = Vec::new();
    let mut runs = 0;
    for case in &cases {
        let FusedCase { head_dim: d, heads: (hq, hkv), rotary_dim, qk_norm } = *case;
        let (dtype, page_size) = (DType::BF16, 16);
        let max_new = 16 / (hq / hkv);
        let mut batch: Vec<(usize, usize)> = (0..24).map(|_| (1, r.gen_range(1..=3000))).collect();
        batch.extend([(1, 1), (1, 15), (1, 16), (1, 17), (1, 4096), (max_new, max_new), (max_new, 700)]);
        batch.extend([(2, 65), (max_new.min(3), 129), (2, 2)]);
        let step = paged_step(&mut r, &batch, page_size)?;
        let (q_lens, kv_lens, t, num_pages) = (&step.q_lens, &step.kv_lens, step.t, step.num_pages);
        let (gi, gk, gt) = (gpu(&step.indptr)?, gpu(&step.kv)?, gpu(&step.table)?);
        let (gpos, gslots) = (gpu(&step.positions)?, gpu(&step.slots)?);
        let gcs = gpu(&cos_sin_table(4096, rotary_dim)?)?;
        let norm_w = [gpu(&random(&mut r, &[d], dtype, 1.0, 0.5)?)?, gpu(&random(&mut r, &[d], dtype, 1.0, 0.5)?)?];
        let qkv = gpu(&random(&mut r, &[t, hq + 2 * hkv, d], dtype, 0.0, 1.0)?)?;
        let k_cache = gpu(&random(&mut r, &[num_pages, page_size, hkv, d], dtype, 0.0, 1.0)?)?;
        let v_cache = gpu(&random(&mut r, &[num_pages, page_size, hkv, d], dtype, 0.0, 1.0)?)?;
        let nan_rows = poisoned(&[t, hkv, d], dtype)?;
        // Copies on the device (the caches are tens of MiB: no round trips to the host).
        let copy_of = |x: &Tensor| -> Result<Tensor> {
            let y = Tensor::empty(x.shape(), x.dtype(), x.device())?;
            ops::copy(&y, x)?;
            Ok(y)
        };
        let scale = 1.0 / (d as f32).sqrt();
        let slots_total = num_pages * page_size;
        // The cache rows at the step's slots, `[t, hkv * d]`.
        let new_rows = |cache: &Tensor| -> Result<Tensor> {
            Ok(ops::embedding(&cache.reshape(&[slots_total, hkv * d])?, &gslots, 0)?)
        };
        // One run: fresh copies of the projection and the caches (the new slots NaN),
        // the prologue and the attention, fused or not: the output, the caches' rows
        // at the new slots, and q afterwards (rope_store rotates it in place, the
        // fused launch leaves it: the proof that the fused path ran).
        let run = |fused: bool, decode_splits: Option<usize>, graph: bool| -> Result<[Tensor; 4]> {
            let (work, kc, vc) = (copy_of(&qkv)?, copy_of(&k_cache)?, copy_of(&v_cache)?);
            ops::store_kv(&kc, &vc, &gslots, &nan_rows, &nan_rows)?;
            let [q, k, v] = [work.narrow(1, 0, hq)?, work.narrow(1, hq, hkv)?, work.narrow(1, hq + hkv, hkv)?];
            let norm = qk_norm.then(|| ops::QkNorm { q_weight: &norm_w[0], k_weight: &norm_w[1], eps: 1e-6 });
            let store = RopeStore {
                q: &q,
                k: &k,
                v: &v,
                k_cache: &kc,
                v_cache: &vc,
                positions: &gpos,
                out_loc: &gslots,
                cos_sin: &gcs,
                qk_norm: norm,
            };
            let meta = PagedAttnMeta {
                q_indptr: &gi,
                kv_lens: &gk,
                block_table: &gt,
                q_lens_host: q_lens,
                kv_lens_host: kv_lens,
                decode_splits,
            };
            let out = poisoned(&[t, hq, d], dtype)?;
            ops::set_decode_fused_rope(Some(fused));
            let step = || ops::rope_store_attention(&out, &store, &meta, scale, AttnKernel::Decode);
            let result = match (graph, target()) {
                (true, Device::Cuda(ordinal)) => {
                    let dev = kernel_runtime::cuda::device(ordinal)?;
                    let (mut g, ()) = dev.capture(step)?;
                    // The capture ran nothing: the replay is the step.
                    g.replay()?;
                    dev.synchronize()?;
                    Ok(())
                }
                _ => step(),
            };
            ops::set_decode_fused_rope(None);
            result?;
            Ok([out, new_rows(&kc)?, new_rows(&vc)?, copy_of(&q)?])
        };
        let q_given = qkv.narrow(1, 0, hq)?.contiguous()?;
        for stages in [2, 3, 4] {
            for merge in [false, true] {
                ops::set_decode_tuning(Some(DecodeTuning { stages, chunk_min: 64, ..DecodeTuning::default() }));
                ops::set_decode_split_merge(Some(merge));
                for decode_splits in [None, Some(1), Some(7), Some(40)] {
                    let what = format!(
                        "fused prologue [d={d} heads={hq}/{hkv} rotary={rotary_dim} norm={qk_norm} stages={stages} merge={merge} splits={decode_splits:?}]"
                    );
                    let check = || -> Result<()> {
                        let [want, want_k, want_v, _] = run(false, decode_splits, false)?;
                        ensure!(rel_l2(&want, &want)?.is_finite(), "the unfused output holds NaN or inf");
                        let [got, got_k, got_v, got_q] = run(true, decode_splits, false)?;
                        if matches!(target(), Device::Cuda(_)) {
                            assert_same_bytes("q after the fused launch (did it run?)", &got_q, &q_given)?;
                        }
                        assert_same_bytes("output", &got, &want)?;
                        assert_same_bytes("new k rows", &got_k, &want_k)?;
                        assert_same_bytes("new v rows", &got_v, &want_v)?;
                        if decode_splits.is_some() {
                            let [replayed, ..] = run(true, decode_splits, true)?;
                            assert_same_bytes("graph replay", &replayed, &want)?;
                        }
                        Ok(())
                    };
                    runs += 1;
                    if let Err(e) = check() {
                        failures.push(format!("{what}: {e:#}"));
                    }
                }
            }
        }
    }
    ops::set_decode_tuning(None);
    ops::set_decode_split_merge(None);
    println!("SUMMARY decode fused prologue: {runs} runs, {} failed", failures.len());
    ensure!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}
