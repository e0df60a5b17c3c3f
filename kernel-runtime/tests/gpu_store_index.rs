//! The CUDA store (KV cache scatter) and index (embedding gather) kernels against
//! the CPU reference, bit for bit, and NCCL all-reduce (gated: they run only with
//! MINISGL_GPU_TESTS=1 on a machine with a GPU).
//!
//! The matrix: bf16, f16 and f32; rows of 64 to 8192 bytes, including rows that
//! are not powers of two (384, 1152) and rows in neither AOT list (640, 1280), so
//! that NVRTC compiles them; int32 and int64 indices; 1, 7, 64, 8192 and 65536
//! tokens (65536 with bf16 rows only: the kernels move bytes, the dtype only
//! changes the row length the launcher computes). It runs twice:
//! - `store_index_through_the_aot_library`: in this process, in the default mode;
//!   every instance of the AOT lists must come from the library (so the AOT build
//!   must be present: `$MINISGL_KERNELS` or target/kernels), the others from NVRTC;
//! - `store_index_through_nvrtc`: the same matrix in a child process with
//!   MINISGL_KERNEL_MODE=jit and an empty MINISGL_CACHE_DIR, so every instance is
//!   compiled by NVRTC and loaded from its cubin.
//!
//! With MINISGL_GPU_TESTS=cpu the CPU stands in for the GPU (a dry run of the
//! tests themselves; the plan checks and NCCL are skipped).
//!
//! Caches and outputs start as random bytes (the same on both devices) and are
//! compared whole, so an unwritten row or a write to the wrong slot fails; index
//! lists include out-of-range entries (skipped by store, zero rows for index).

mod common;

use anyhow::{bail, ensure, Context, Result};
use common::{enabled_or_dry_run, target};
use kernel_runtime::kernels::{KernelMode, Plan, Registry};
use kernel_runtime::{cuda, nccl, ops, DType, Device, Tensor};

const CPU: Device = Device::Cpu;
const ROW_BYTES: [usize; 9] = [64, 128, 384, 640, 1152, 1280, 2048, 4096, 8192];
const TOKENS: [usize; 5] = [1, 7, 64, 8192, 65536];
/// Set in the child process of `store_index_through_nvrtc`.
const CHILD_ENV: &str = "MINISGL_TEST_STORE_INDEX_CHILD";

/// xorshift64*: random bytes fast enough for gigabytes of test data.
struct Bytes(u64);

impl Bytes {
    fn fill(&mut self, n: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(n + 8);
        while out.len() < n {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            out.extend_from_slice(&self.0.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
        }
        out.truncate(n);
        out
    }

    fn below(&mut self, n: usize) -> usize {
        let b = self.fill(8);
        (u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) % n as u64) as usize
    }

    /// A random permutation of 0..n (Fisher-Yates).
    fn permutation(&mut self, n: usize) -> Vec<i64> {
        let mut v: Vec<i64> = (0..n as i64).collect();
        for i in (1..n).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
        v
    }
}

/// The same random bytes as a host tensor and a GPU tensor.
fn pair(bytes: &[u8], dtype: DType, shape: &[usize]) -> Result<(Tensor, Tensor)> {
    Ok((Tensor::from_bytes(bytes, dtype, shape, CPU)?, Tensor::from_bytes(bytes, dtype, shape, target())?))
}

fn indices(values: &[i64], dtype: DType) -> Result<(Tensor, Tensor)> {
    let t = Tensor::from_slice(values, &[values.len()], CPU)?.to_dtype(dtype)?;
    let g = Tensor::from_bytes(&t.to_host_bytes()?, t.dtype(), t.shape(), target())?;
    Ok((t, g))
}

fn assert_same_bytes(what: &str, got: &Tensor, want: &Tensor) -> Result<()> {
    let (g, w) = (got.to_host_bytes()?, want.to_host_bytes()?);
    ensure!(g.len() == w.len(), "{what}: {} bytes, expected {}", g.len(), w.len());
    if let Some(i) = g.iter().zip(&w).position(|(a, b)| a != b) {
        bail!("{what}: byte {i} is {:#04x}, expected {:#04x}", g[i], w[i]);
    }
    Ok(())
}

/// Where `family[ROW_BYTES=row_bytes]` must come from in this process's mode.
fn check_plan(family: &str, row_bytes: usize) -> Result<()> {
    if target() == CPU {
        return Ok(());
    }
    let reg = Registry::get()?;
    let fam = reg.family(family)?;
    let instance = fam.instance(&[("ROW_BYTES", row_bytes as i64)])?;
    let arch = cuda::device(0)?.arch();
    let plan = reg.plan(family, &instance, &arch)?;
    let expected_library = reg.mode != KernelMode::Jit && fam.has_aot_instance(&instance);
    match (&plan, expected_library) {
        (Plan::Library, true) | (Plan::Jit, false) => Ok(()),
        _ => bail!(
            "{family}[ROW_BYTES={row_bytes}] is planned as {plan:?} in mode {:?} (AOT instance: {}); is the AOT build for {arch} present and fresh?",
            reg.mode,
            fam.has_aot_instance(&instance)
        ),
    }
}

fn check_store(rng: &mut Bytes, dtype: DType, row_bytes: usize, tokens: usize, index_dtype: DType) -> Result<()> {
    let row = row_bytes / dtype.size_in_bytes();
    let slots = tokens + 13;
    // k and v as column slices of one [tokens, 2 row] tensor (a fused KV output).
    let (kv, gkv) = pair(&rng.fill(tokens * 2 * row_bytes), dtype, &[tokens, 2 * row])?;
    let (kc, gkc) = pair(&rng.fill(slots * row_bytes), dtype, &[slots, row])?;
    let (vc, gvc) = pair(&rng.fill(slots * row_bytes), dtype, &[slots, row])?;
    let mut idx: Vec<i64> = rng.permutation(slots)[..tokens].to_vec();
    if tokens >= 7 {
        idx[3] = -1;
        idx[5] = slots as i64;
    }
    let (ci, gi) = indices(&idx, index_dtype)?;
    let (k, v) = (kv.narrow(1, 0, row)?, kv.narrow(1, row, row)?);
    ops::store_kv(&kc, &vc, &ci, &k, &v)?;
    let (gk, gv) = (gkv.narrow(1, 0, row)?, gkv.narrow(1, row, row)?);
    ops::store_kv(&gkc, &gvc, &gi, &gk, &gv)?;
    let what = format!("store_kv {dtype} row={row_bytes}B tokens={tokens} indices={index_dtype}");
    assert_same_bytes(&format!("{what}: k_cache"), &gkc, &kc)?;
    assert_same_bytes(&format!("{what}: v_cache"), &gvc, &vc)
}

fn check_index(rng: &mut Bytes, dtype: DType, row_bytes: usize, tokens: usize, index_dtype: DType) -> Result<()> {
    let row = row_bytes / dtype.size_in_bytes();
    let rows = tokens.min(4096) + 17;
    // Half the cases are a vocab-parallel shard starting at 100.
    let vocab_start: i64 = if tokens.is_multiple_of(2) { 0 } else { 100 };
    let (w, gw) = pair(&rng.fill(rows * row_bytes), dtype, &[rows, row])?;
    let (out, gout) = pair(&rng.fill(tokens * row_bytes), dtype, &[tokens, row])?;
    // Ids over the shard and a little outside it on both sides (zero rows).
    let ids: Vec<i64> = (0..tokens).map(|_| vocab_start - 3 + rng.below(rows + 6) as i64).collect();
    let (ci, gi) = indices(&ids, index_dtype)?;
    ops::index(&out, &w, &ci, vocab_start)?;
    ops::index(&gout, &gw, &gi, vocab_start)?;
    let what = format!("index {dtype} row={row_bytes}B tokens={tokens} ids={index_dtype} vocab_start={vocab_start}");
    assert_same_bytes(&what, &gout, &out)
}

/// The whole matrix; returns the number of cases.
fn matrix() -> Result<usize> {
    let mut rng = Bytes(0x9e37_79b9_7f4a_7c15);
    let mut cases = 0;
    for family in ["store", "index"] {
        for row_bytes in ROW_BYTES {
            check_plan(family, row_bytes)?;
            for dtype in [DType::BF16, DType::F16, DType::F32] {
                for tokens in TOKENS {
                    if tokens == 65536 && dtype != DType::BF16 {
                        continue;
                    }
                    for index_dtype in [DType::I32, DType::I64] {
                        let result = if family == "store" {
                            check_store(&mut rng, dtype, row_bytes, tokens, index_dtype)
                        } else {
                            check_index(&mut rng, dtype, row_bytes, tokens, index_dtype)
                        };
                        result.with_context(|| {
                            format!("{family} row={row_bytes}B {dtype} tokens={tokens} {index_dtype}")
                        })?;
                        cases += 1;
                    }
                }
            }
        }
    }
    Ok(cases)
}

#[test]
fn store_index_through_the_aot_library() -> Result<()> {
    if !enabled_or_dry_run() || std::env::var_os(CHILD_ENV).is_some() {
        return Ok(());
    }
    if target() != CPU {
        let reg = Registry::get()?;
        ensure!(reg.mode != KernelMode::Jit, "this pass needs MINISGL_KERNEL_MODE unset, auto or aot (it is jit)");
        ensure!(
            reg.aot().is_some(),
            "no AOT kernel library was found: run `cargo xtask build-kernels` or set MINISGL_KERNELS to its folder"
        );
    }
    let cases = matrix()?;
    println!("store/index: {cases} cases through the AOT library (NVRTC for 640/1280-byte rows)");
    Ok(())
}

#[test]
fn store_index_through_nvrtc() -> Result<()> {
    if !enabled_or_dry_run() {
        return Ok(());
    }
    if std::env::var_os(CHILD_ENV).is_some() {
        ensure!(
            target() == CPU || Registry::get()?.mode == KernelMode::Jit,
            "the child must run with MINISGL_KERNEL_MODE=jit"
        );
        let cases = matrix()?;
        println!("store/index: {cases} cases through NVRTC");
        return Ok(());
    }
    let cache = tempfile::tempdir()?;
    let out = std::process::Command::new(std::env::current_exe()?)
        .args(["store_index_through_nvrtc", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .env("MINISGL_KERNEL_MODE", "jit")
        .env("MINISGL_CACHE_DIR", cache.path())
        .output()?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    ensure!(out.status.success() && text.contains("1 passed"), "the NVRTC pass failed:\n{text}");
    ensure!(target() == CPU || text.contains("compiling kernel store["), "the NVRTC pass compiled nothing:\n{text}");
    Ok(())
}

#[test]
fn nccl_all_reduce_sums_on_one_gpu_and_on_every_gpu() -> Result<()> {
    if !enabled_or_dry_run() || std::env::var_os(CHILD_ENV).is_some() || target() == CPU {
        return Ok(());
    }
    let count = cuda::device_count()?;
    ensure!(count >= 1, "no CUDA device");
    let mut worlds = vec![1];
    if count > 1 {
        worlds.push(count);
    }
    let n = 4099;
    for world in worlds {
        let ordinals: Vec<usize> = (0..world).collect();
        let comms = nccl::Communicator::init_all(&ordinals)?;
        for dtype in [DType::F32, DType::BF16] {
            // Small integers: every partial sum is exact in bf16 too.
            let values =
                |rank: usize| -> Vec<f32> { (0..n).map(|i| ((i * 7 + rank * 13) % 17) as f32 - 8.0).collect() };
            let tensors = ordinals
                .iter()
                .map(|&o| Ok(Tensor::from_slice(&values(o), &[n], Device::Cuda(o))?.to_dtype(dtype)?))
                .collect::<Result<Vec<_>>>()?;
            nccl::group(|| {
                for (c, t) in comms.iter().zip(&tensors) {
                    c.all_reduce_sum(t)?;
                }
                Ok(())
            })?;
            let expected: Vec<f32> = (0..n).map(|i| (0..world).map(|r| values(r)[i]).sum()).collect();
            for (rank, t) in tensors.iter().enumerate() {
                cuda::device(rank)?.synchronize()?;
                let got = t.to_f32_vec()?;
                if let Some(i) = got.iter().zip(&expected).position(|(a, b)| a != b) {
                    bail!(
                        "all_reduce {dtype} over {world} GPU(s): rank {rank} element {i} is {}, expected {}",
                        got[i],
                        expected[i]
                    );
                }
            }
        }
        println!("nccl all_reduce over {world} GPU(s): ok");
    }
    Ok(())
}
