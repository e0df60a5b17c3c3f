//! The prefill attention kernel (csrc/kernels/prefill_attention.cu) against the CPU
//! reference of paged attention (gated: MINISGL_GPU_TESTS=1 on a machine with a
//! GPU; MINISGL_GPU_TESTS=cpu dry-runs the harness on the CPU, without the long
//! cases).
//!
//! Inputs as in gpu_ops.rs: built once on the host in the tested dtype, q a view of
//! a fused QKV buffer, pages of each sequence in a random order of a cache with
//! spare pages, -1 past each sequence's pages in the block table, NaN in every
//! cache slot that holds no key (spare pages, past each sequence's last key),
//! outputs poisoned with NaN. Relative L2 error at most 1e-2 (bf16/f16).
//!
//! Coverage: page sizes 1/16/64/256, head dims 64/128/256, GQA 1/2/4/8, bf16 and
//! f16, ragged batches with cached prefixes and decodes riding along, lengths that
//! are and are not multiples of the tiles (1..1025 in one batch, 4096 and 8192
//! alone), and every tile variant that fits each head dim, the wgmma tiles (16..48,
//! sm_90a; `MINISGL_TEST_PREFILL_TILES=22,23` narrows them for a short GPU call)
//! included; the persistent ones (34..38, 42, 47, 48) also with a grid of a few blocks.

mod common;

use anyhow::{ensure, Context, Result};
use common::{enabled_or_dry_run, gpu, random, rng, target, view_like};
use kernel_runtime::ops::{self, AttnKernel, PagedAttnMeta};
use kernel_runtime::sys::kernels::MSGL_PREFILL_RANKS;
use kernel_runtime::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

const CPU: Device = Device::Cpu;

/// A device tensor full of 0xff bytes (NaN).
fn poisoned(shape: &[usize], dtype: DType) -> Result<Tensor> {
    let n: usize = shape.iter().product::<usize>() * dtype.size_in_bytes();
    Ok(Tensor::from_bytes(&vec![0xffu8; n], dtype, shape, target())?)
}

/// `cache` ([pages, page_size, heads, head_dim], host) with NaN in every slot that
/// holds no key: spare pages, and the slots of a sequence's last page past its
/// length. `used`: (page, keys in it) of each page a sequence holds. A kernel that
/// reads a slot it must not (a whole-page copy past the last key, say) and lets a
/// zero probability meet it gets NaN (0 * NaN) and fails.
fn nan_past_keys(cache: &Tensor, used: &[(i32, usize)]) -> Result<Tensor> {
    let [pages, page_size, heads, d] = cache.dims::<4>("test", "cache")?;
    let slot_bytes = heads * d * cache.dtype().size_in_bytes();
    let mut bytes = cache.to_host_bytes()?;
    let mut keys_in = vec![0usize; pages];
    for &(page, keys) in used {
        keys_in[usize::try_from(page)?] = keys;
    }
    for (page, &keys) in keys_in.iter().enumerate() {
        let start = (page * page_size + keys) * slot_bytes;
        bytes[start..(page + 1) * page_size * slot_bytes].fill(0xff);
    }
    Ok(Tensor::from_bytes(&bytes, cache.dtype(), cache.shape(), CPU)?)
}

/// ||got - want|| / ||want|| (infinite when got holds a NaN/inf).
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

/// (new tokens, kv length) per sequence.
type Batch = Vec<(usize, usize)>;

struct Case {
    dtype: DType,
    page_size: usize,
    head_dim: usize,
    heads: (usize, usize),
}

/// Runs `case` over `batch` ((new tokens, kv length) per sequence) on the CPU and
/// on the device with each of `kernels`, under each of `tiles` (None: the default).
fn check(
    r: &mut StdRng,
    case: &Case,
    batch_name: &str,
    batch: &[(usize, usize)],
    kernels: &[AttnKernel],
    tiles: &[Option<usize>],
) -> Result<()> {
    let Case { dtype, page_size, head_dim: d, heads: (hq, hkv) } = *case;
    let q_lens: Vec<usize> = batch.iter().map(|b| b.0).collect();
    let kv_lens: Vec<usize> = batch.iter().map(|b| b.1).collect();
    let t: usize = q_lens.iter().sum();
    let b = batch.len();
    let pages_per_seq: Vec<usize> = kv_lens.iter().map(|kv| kv.div_ceil(page_size)).collect();
    let max_pages = pages_per_seq.iter().copied().max().unwrap_or(1).max(1) + 1;
    let num_pages = pages_per_seq.iter().sum::<usize>() + 3;
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
    let slots_used: Vec<(i32, usize)> = pages_per_seq
        .iter()
        .zip(&kv_lens)
        .enumerate()
        .flat_map(|(s, (&n, &kv))| (0..n).map(move |j| (s, j, kv)))
        .map(|(s, j, kv)| (table[s * max_pages + j], (kv - j * page_size).min(page_size)))
        .collect();
    let cache_shape = [num_pages, page_size, hkv, d];
    let k_cache = nan_past_keys(&random(r, &cache_shape, dtype, 0.0, 1.0)?, &slots_used)?;
    let v_cache = nan_past_keys(&random(r, &cache_shape, dtype, 0.0, 1.0)?, &slots_used)?;
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
    let gmeta = PagedAttnMeta {
        q_indptr: &gi,
        kv_lens: &gk,
        block_table: &gt,
        q_lens_host: &q_lens,
        kv_lens_host: &kv_lens,
        decode_splits: None,
    };
    for &kernel in kernels {
        for &tile in tiles {
            let what = format!(
                "paged_attention[{kernel:?}, tile {tile:?}] {dtype} page={page_size} d={d} heads={hq}/{hkv} batch={batch_name}"
            );
            let got = poisoned(&[t, hq, d], dtype)?;
            ops::set_prefill_tile(tile);
            let run = ops::paged_attention_with(&got, &gq, &gkc, &gvc, &gmeta, scale, kernel);
            ops::set_prefill_tile(None);
            run.with_context(|| what.clone())?;
            let err = rel_l2(&got, &want).with_context(|| what.clone())?;
            ensure!(err <= 1e-2, "{what}: relative L2 error {err:.3e} > 1e-2");
        }
    }
    Ok(())
}

/// Ragged batches: prompts of awkward lengths, chunks over cached prefixes,
/// decodes riding along, a sequence without new tokens.
fn ragged_batches() -> Vec<(&'static str, Vec<(usize, usize)>)> {
    vec![
        (
            "ragged",
            vec![(37, 37), (100, 612), (1, 1), (129, 129), (64, 2000), (0, 50), (1, 700), (255, 255), (300, 1000)],
        ),
        ("prompt-1000", vec![(1000, 1000)]),
        // Tails: one sequence per length around the 64/128-row and 32/64/128-key tiles,
        // half of them over a cached prefix of 77 tokens.
        (
            "tails",
            [1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 191, 257, 511, 513, 1025]
                .iter()
                .enumerate()
                .map(|(i, &l)| (l, if i % 2 == 0 { l } else { l + 77 }))
                .collect(),
        ),
    ]
}

/// GQA 1, 2, 4, 8 in turn.
const HEADS: [(usize, usize); 4] = [(4, 4), (8, 4), (8, 2), (16, 2)];

#[test]
fn prefill_attention_gpu_matches_cpu() -> Result<()> {
    if !enabled_or_dry_run() {
        return Ok(());
    }
    let mut r = rng(12);
    let mut failures = Vec::new();
    let mut cases = 0;
    let mut i = 0;
    for dtype in [DType::BF16, DType::F16] {
        for page_size in [1, 16, 64, 256] {
            for head_dim in [64, 128, 256] {
                let case = Case { dtype, page_size, head_dim, heads: HEADS[i % HEADS.len()] };
                i += 1;
                for (name, batch) in ragged_batches() {
                    cases += 1;
                    if let Err(e) =
                        check(&mut r, &case, name, &batch, &[AttnKernel::Prefill, AttnKernel::Auto], &[None])
                    {
                        failures.push(format!("{e:#}"));
                    }
                }
            }
        }
    }
    println!("prefill attention: {cases} cases");
    ensure!(failures.is_empty(), "{} of {cases} prefill cases failed:\n{}", failures.len(), failures.join("\n"));
    Ok(())
}

#[test]
fn prefill_attention_gpu_long_sequences() -> Result<()> {
    if !enabled_or_dry_run() {
        return Ok(());
    }
    if target() == CPU {
        println!("skipped in the dry run: too long for the CPU twice");
        return Ok(());
    }
    let mut r = rng(13);
    let mut failures = Vec::new();
    let long: [(Case, &str, Batch); 4] = [
        (Case { dtype: DType::BF16, page_size: 16, head_dim: 128, heads: (8, 2) }, "L=4096", vec![(4096, 4096)]),
        // A chunk of 8000 new tokens over a cached prefix of 192, page size 64, GQA 8.
        (Case { dtype: DType::F16, page_size: 64, head_dim: 64, heads: (8, 1) }, "L=8192", vec![(8000, 8192)]),
        (
            Case { dtype: DType::BF16, page_size: 1, head_dim: 256, heads: (4, 2) },
            "b=3 ragged long",
            vec![(3000, 3000), (2049, 4000), (777, 777)],
        ),
        (Case { dtype: DType::BF16, page_size: 256, head_dim: 128, heads: (4, 4) }, "L=8191", vec![(8191, 8191)]),
    ];
    for (case, name, batch) in &long {
        if let Err(e) = check(&mut r, case, name, batch, &[AttnKernel::Prefill, AttnKernel::Auto], &[None]) {
            failures.push(format!("{e:#}"));
        }
    }
    ensure!(failures.is_empty(), "{} long prefill cases failed:\n{}", failures.len(), failures.join("\n"));
    Ok(())
}

/// Every tile variant that fits each head dim (prefill_attention.cu's table, 1..8
/// compiled at run time), bf16, on the ragged and tail batches.
#[test]
fn prefill_attention_gpu_tile_variants() -> Result<()> {
    if !enabled_or_dry_run() {
        return Ok(());
    }
    let mut r = rng(14);
    let mut failures = Vec::new();
    for (head_dim, tiles) in
        [(64, vec![1, 2, 3, 4, 5, 6, 7, 8]), (128, vec![1, 2, 3, 4, 5, 6, 7, 8]), (256, vec![3, 5, 8])]
    {
        let tiles: Vec<Option<usize>> = tiles.into_iter().map(Some).collect();
        let case = Case { dtype: DType::BF16, page_size: 16, head_dim, heads: (8, 2) };
        for (name, batch) in ragged_batches().into_iter().filter(|(n, _)| *n != "prompt-1000") {
            if let Err(e) = check(&mut r, &case, name, &batch, &[AttnKernel::Prefill], &tiles) {
                failures.push(format!("{e:#}"));
            }
        }
    }
    ensure!(failures.is_empty(), "{} tile variant cases failed:\n{}", failures.len(), failures.join("\n"));
    Ok(())
}

/// The wgmma tiles of `head_dim` the tests run: those that fit it (16..48 at 64 and
/// 128; 16, 22, 27, 28, 34, 35, 39..42 and 46..48, with 64-key tiles, at 256), narrowed to the
/// comma-separated `MINISGL_TEST_PREFILL_TILES` where set.
fn wgmma_tiles(head_dim: usize) -> Vec<Option<usize>> {
    let all: Vec<usize> =
        if head_dim > 128 { vec![16, 22, 27, 28, 34, 35, 39, 40, 41, 42, 46, 47, 48] } else { (16..=48).collect() };
    let wanted: Option<Vec<usize>> = std::env::var("MINISGL_TEST_PREFILL_TILES")
        .ok()
        .map(|v| v.split(',').filter_map(|t| t.trim().parse().ok()).collect());
    all.into_iter().filter(|t| wanted.as_ref().is_none_or(|w| w.contains(t))).map(Some).collect()
}

/// The wgmma tiles (TILE 16..48, sm_90a; 27..48 copy K/V by TMA at pages 16 and
/// 64) against the CPU reference: bf16 and f16, page sizes 1/16/64, head dims 64/128/256 (the tiles that fit each), GQA 1/2/4/8
/// in turn, on the ragged, prompt and tail batches (lengths 1 and non-multiples of
/// the 128/192-row and 64/128-key tiles, cached prefixes, a sequence without new
/// tokens).
#[test]
fn prefill_attention_gpu_wgmma_tiles() -> Result<()> {
    if !enabled_or_dry_run() {
        return Ok(());
    }
    // The dry run (the CPU twice) takes one case of one tile.
    let dry = target() == CPU;
    let mut r = rng(16);
    let mut failures = Vec::new();
    let mut cases = 0;
    let mut i = 0;
    for dtype in [DType::BF16, DType::F16] {
        for page_size in [1, 16, 64] {
            for head_dim in [64, 128, 256] {
                if dry && cases > 0 {
                    break;
                }
                let case = Case { dtype, page_size, head_dim, heads: HEADS[i % HEADS.len()] };
                i += 1;
                let tiles = if dry { vec![Some(16)] } else { wgmma_tiles(head_dim) };
                if tiles.is_empty() {
                    continue;
                }
                for (name, batch) in ragged_batches() {
                    cases += 1;
                    if let Err(e) = check(&mut r, &case, name, &batch, &[AttnKernel::Prefill], &tiles) {
                        failures.push(format!("{e:#}"));
                    }
                }
            }
        }
    }
    println!("prefill attention, wgmma tiles: {cases} cases");
    ensure!(failures.is_empty(), "{} of {cases} wgmma cases failed:\n{}", failures.len(), failures.join("\n"));
    Ok(())
}

/// The wgmma tiles on long sequences: L=4096 alone, and a 3000-token chunk over a
/// cached prefix of 1096 (GQA 4, page size 16), bf16 and f16.
#[test]
fn prefill_attention_gpu_wgmma_long() -> Result<()> {
    if !enabled_or_dry_run() {
        return Ok(());
    }
    if target() == CPU {
        println!("skipped in the dry run: too long for the CPU twice");
        return Ok(());
    }
    let mut r = rng(17);
    let mut failures = Vec::new();
    let tiles = wgmma_tiles(128);
    let long: [(Case, &str, Batch); 2] = [
        (Case { dtype: DType::BF16, page_size: 16, head_dim: 128, heads: (8, 2) }, "L=4096", vec![(4096, 4096)]),
        (
            Case { dtype: DType::F16, page_size: 16, head_dim: 128, heads: (8, 2) },
            "chunk 3000 over 1096",
            vec![(3000, 4096), (1, 333)],
        ),
    ];
    for (case, name, batch) in &long {
        if let Err(e) = check(&mut r, case, name, batch, &[AttnKernel::Prefill], &tiles) {
            failures.push(format!("{e:#}"));
        }
    }
    ensure!(failures.is_empty(), "{} long wgmma cases failed:\n{}", failures.len(), failures.join("\n"));
    Ok(())
}

/// The persistent tiles (34..38, 42, 47, 48) with their grid capped at a few blocks
/// (through Rust's launch and the AOT launcher alike), so that each block walks many
/// q tiles: its Q buffers alternate, the K/V ring runs on across items of different
/// lengths, blocks end on items of no rows for some of their warpgroups; 48's blocks
/// draw their items from the counter, which each launch must leave at zero for the
/// next (every tile and case here runs after another). Ragged and long batches, pages 16 (TMA) and 1 (cp.async),
/// head dims 64/128 (and 34 at 256, one Q buffer).
#[test]
fn prefill_attention_gpu_persistent_walks() -> Result<()> {
    if !enabled_or_dry_run() || target() == CPU {
        return Ok(());
    }
    let mut r = rng(18);
    let mut failures = Vec::new();
    let mut cases = 0;
    for (i, (dtype, page_size, head_dim)) in
        [(DType::BF16, 16, 128), (DType::F16, 1, 128), (DType::BF16, 64, 64), (DType::F16, 16, 256)]
            .into_iter()
            .enumerate()
    {
        let case = Case { dtype, page_size, head_dim, heads: HEADS[i % HEADS.len()] };
        let tiles: Vec<Option<usize>> = wgmma_tiles(head_dim)
            .into_iter()
            .filter(|t| t.is_some_and(|t| (34..=38).contains(&t) || matches!(t, 42 | 47 | 48)))
            .collect();
        if tiles.is_empty() {
            continue;
        }
        let mut batches = ragged_batches();
        batches.push(("chunk 1500 over 500, and a prompt", vec![(1500, 2000), (700, 700)]));
        for blocks in [1, 3] {
            ops::set_prefill_grid_limit(Some(blocks));
            for (name, batch) in &batches {
                cases += 1;
                if let Err(e) = check(&mut r, &case, name, batch, &[AttnKernel::Prefill], &tiles) {
                    failures.push(format!("{blocks} blocks: {e:#}"));
                }
            }
            ops::set_prefill_grid_limit(None);
        }
    }
    println!("prefill attention, persistent walks: {cases} cases");
    ensure!(failures.is_empty(), "{} of {cases} persistent cases failed:\n{}", failures.len(), failures.join("\n"));
    Ok(())
}

/// The warp-specialised tiles (22..48) find each block's q tile two ways: in the
/// batch's ranking sent with the launch (the default, checked everywhere above) and
/// by searching the batch layout in memory, which batches of more than
/// `MSGL_PREFILL_RANKS` (256) prompts take. Here the search: the ranking switched off
/// on the ragged and tail batches, and with it on, a batch of 70 prompts (lengths
/// 1..400, some over a cached prefix, two without new tokens: ranked) and one of
/// `MSGL_PREFILL_RANKS` + 14 (lengths 1..120, nine without new tokens: searched).
/// Pages 16 (TMA) and 1 (cp.async), GQA 4 and 8.
#[test]
fn prefill_attention_gpu_item_search() -> Result<()> {
    if !enabled_or_dry_run() || target() == CPU {
        return Ok(());
    }
    let mut r = rng(19);
    let mut failures = Vec::new();
    let mut cases = 0;
    let tiles: Vec<Option<usize>> = wgmma_tiles(128).into_iter().filter(|t| t.is_some_and(|t| t >= 22)).collect();
    let prompts = |n: usize, longest: usize| -> Batch {
        (0..n)
            .map(|i| {
                if i % 31 == 5 {
                    (0, 40)
                } else {
                    (1 + (i * 37) % longest, 1 + (i * 37) % longest + if i % 3 == 0 { 50 } else { 0 })
                }
            })
            .collect()
    };
    let many = prompts(70, 400);
    let too_many = prompts(MSGL_PREFILL_RANKS as usize + 14, 120);
    for (dtype, page_size, heads) in [(DType::BF16, 16, (8, 2)), (DType::F16, 1, (16, 2))] {
        let case = Case { dtype, page_size, head_dim: 128, heads };
        ops::set_prefill_ranked(false);
        for (name, batch) in ragged_batches() {
            cases += 1;
            if let Err(e) = check(&mut r, &case, name, &batch, &[AttnKernel::Prefill], &tiles) {
                failures.push(format!("searched: {e:#}"));
            }
        }
        ops::set_prefill_ranked(true);
        cases += 1;
        if let Err(e) = check(&mut r, &case, "70 prompts", &many, &[AttnKernel::Prefill], &tiles) {
            failures.push(format!("{e:#}"));
        }
        cases += 1;
        if let Err(e) = check(&mut r, &case, "past the ranking", &too_many, &[AttnKernel::Prefill], &tiles) {
            failures.push(format!("searched: {e:#}"));
        }
    }
    println!("prefill attention, item search: {cases} cases");
    ensure!(failures.is_empty(), "{} of {cases} search cases failed:\n{}", failures.len(), failures.join("\n"));
    Ok(())
}

/// The prefill kernel refuses what it has no instance for, and a tile that does not
/// fit, with an error rather than a wrong answer.
#[test]
fn prefill_attention_gpu_refuses_what_it_cannot_hold() -> Result<()> {
    if !enabled_or_dry_run() || target() == CPU {
        return Ok(());
    }
    let mut r = rng(15);
    let f32_case = Case { dtype: DType::F32, page_size: 16, head_dim: 128, heads: (8, 2) };
    let e = check(&mut r, &f32_case, "f32", &[(200, 200)], &[AttnKernel::Prefill], &[None]);
    ensure!(e.is_err(), "the prefill kernel ran an f32 batch");
    let d256 = Case { dtype: DType::BF16, page_size: 16, head_dim: 256, heads: (8, 2) };
    let e = check(&mut r, &d256, "tile 1 at d=256", &[(200, 200)], &[AttnKernel::Prefill], &[Some(1)]);
    ensure!(e.is_err(), "tile 1 (two m-tiles) ran at head dim 256");
    // Auto falls back to the tile kernel for f32.
    check(&mut r, &f32_case, "f32 auto", &[(200, 200)], &[AttnKernel::Auto], &[None])
}
