//! `linear` on CUDA: cuBLASLt through cudarc's raw `cublaslt::result` layer.
//!
//! Row-major `out[m, n] = x[m, k] @ w[n, k]^T (+ bias[n])` is the column-major
//! `out^T (n x m) = op(A) B` with A = w stored k x n (ld = k) and transposed, B = x
//! stored k x m (ld = x's row stride, so a strided x needs no copy), and the bias
//! added by the `CUBLASLT_EPILOGUE_BIAS` epilogue (one value per row of out^T).
//! Inputs bf16/f16 accumulate in f32 (`CUBLAS_COMPUTE_32F`); f32 inputs use the
//! same compute type, which is exact f32 (TF32 only with `_FAST_TF32`).
//!
//! One handle and one 32 MiB workspace per device ([`Blas`], created on first use
//! and kept in `CudaDevice::blas`); the descriptors and the heuristic's algorithm
//! are cached per (m, n, k, ld, dtype, bias, pointer alignments), so a repeated
//! shape costs one `cublasLtMatmul` call. Decode-sized shapes take the fastest of
//! the heuristic's first algorithms, timed on first use (`gemm_tune`). See the
//! [cublasLtMatmul docs](https://docs.nvidia.com/cuda/cublas/#cublasltmatmul).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use cudarc::driver::sys::CUdeviceptr;

use crate::cuda::CudaDevice;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

use super::launch::device_of;

/// Workspace per device: NVIDIA's recommendation for Hopper.
const WORKSPACE_BYTES: usize = 32 << 20;
/// `cublasOperation_t` values.
const OP_N: i32 = 0;
const OP_T: i32 = 1;

fn blas_err(what: &str) -> impl FnOnce(lt::CublasError) -> Error + '_ {
    move |e| Error::Blas { what: what.to_owned(), message: format!("{:?}", e.0) }
}

/// What makes two GEMMs share descriptors and an algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct GemmKey {
    m: usize,
    n: usize,
    k: usize,
    ldx: usize,
    dtype: DType,
    bias: bool,
    /// Alignment in bytes (power of two, at most 256) of w, x, out and bias.
    align: [u32; 4],
    /// Whether the algorithm is measured (`gemm_tune::wanted`), so that a shape
    /// planned with tuning off (A/B benchmarks) does not stand in for a tuned one.
    tuned: bool,
}

/// Descriptors and the chosen algorithm of one GEMM shape.
struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    c: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: the descriptors were created by `Plan::new` and are destroyed once.
        unsafe {
            let _ = lt::destroy_matrix_layout(self.a);
            let _ = lt::destroy_matrix_layout(self.b);
            let _ = lt::destroy_matrix_layout(self.c);
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

/// A cuBLASLt handle with its workspace and plan cache, one per device.
pub(crate) struct Blas {
    handle: sys::cublasLtHandle_t,
    workspace: CUdeviceptr,
    /// Plans by shape; the lock also serialises calls (the workspace is shared).
    plans: Mutex<HashMap<GemmKey, Plan>>,
}

// SAFETY: the handle and descriptors are plain cuBLASLt objects with no thread
// affinity; every use goes through the `plans` mutex, one call at a time.
unsafe impl Send for Blas {}
// SAFETY: as above.
unsafe impl Sync for Blas {}

impl Drop for Blas {
    fn drop(&mut self) {
        if let Ok(plans) = self.plans.get_mut() {
            plans.clear();
        }
        // SAFETY: created by `Blas::new`, destroyed once. (The workspace belongs to
        // the device's caching allocator, which lives as long as the device.)
        unsafe {
            let _ = lt::destroy_handle(self.handle);
        }
    }
}

impl Blas {
    fn new(dev: &CudaDevice) -> Result<Blas> {
        // SAFETY: only tries to dlopen libcublasLt.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::Blas {
                what: "loading".into(),
                message: "libcublasLt.so was not found: add CUDA's lib folder to LD_LIBRARY_PATH".into(),
            });
        }
        dev.bind()?;
        let handle = lt::create_handle().map_err(blas_err("cublasLtCreate"))?;
        let workspace = match dev.alloc(WORKSPACE_BYTES) {
            Ok((ptr, _)) => ptr,
            Err(e) => {
                // SAFETY: the handle was just created and is not used again.
                unsafe {
                    let _ = lt::destroy_handle(handle);
                }
                return Err(e);
            }
        };
        Ok(Blas { handle, workspace, plans: Mutex::new(HashMap::new()) })
    }

    /// The device's instance, created on first use (a failure is kept too, so it
    /// is reported again rather than retried on every call).
    fn of(dev: &CudaDevice) -> Result<Arc<Blas>> {
        // One per device for the process, like the device itself: kept here rather
        // than in `CudaDevice`, which sits below this module.
        type Table = Mutex<HashMap<usize, std::result::Result<Arc<Blas>, String>>>;
        static BLAS: OnceLock<Table> = OnceLock::new();
        let poisoned = || Error::Blas { what: "handle table".into(), message: "poisoned by a panic".into() };
        let mut table = BLAS.get_or_init(|| Mutex::new(HashMap::new())).lock().map_err(|_| poisoned())?;
        table
            .entry(dev.ordinal())
            .or_insert_with(|| Blas::new(dev).map(Arc::new).map_err(|e| e.to_string()))
            .clone()
            .map_err(|message| Error::Blas { what: "initialisation".into(), message })
    }
}

fn data_type(dtype: DType) -> Result<sys::cudaDataType> {
    Ok(match dtype {
        DType::F32 => sys::cudaDataType::CUDA_R_32F,
        DType::F16 => sys::cudaDataType::CUDA_R_16F,
        DType::BF16 => sys::cudaDataType::CUDA_R_16BF,
        other => return Err(Error::DType { op: "linear", got: other, expected: "f32|f16|bf16".into() }),
    })
}

/// The largest power of two (at most 256) dividing `ptr`.
fn alignment(ptr: CUdeviceptr) -> u32 {
    if ptr == 0 {
        256
    } else {
        1u32 << ptr.trailing_zeros().min(8)
    }
}

/// Sets one attribute of a matmul descriptor from a plain value.
///
/// # Safety
/// `desc` must be a live descriptor and `T` the attribute's documented type.
unsafe fn set_desc<T>(
    desc: sys::cublasLtMatmulDesc_t,
    attr: sys::cublasLtMatmulDescAttributes_t,
    value: &T,
) -> Result<()> {
    lt::set_matmul_desc_attribute(desc, attr, (value as *const T).cast(), std::mem::size_of::<T>())
        .map_err(blas_err("cublasLtMatmulDescSetAttribute"))
}

impl Plan {
    /// The plan of `key` with the heuristic's first algorithm, and the heuristic's
    /// algorithms best first (one for an untuned key; a tuned one's candidates).
    fn new(blas: &Blas, key: &GemmKey) -> Result<(Plan, Vec<sys::cublasLtMatmulAlgo_t>)> {
        let ty = data_type(key.dtype)?;
        let (m, n, k) = (key.m as u64, key.n as u64, key.k as u64);
        let desc = lt::create_matmul_desc(sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, sys::cudaDataType::CUDA_R_32F)
            .map_err(blas_err("cublasLtMatmulDescCreate"))?;
        // Build the plan as soon as each handle exists, so an error drops what was made.
        let mut plan = Plan {
            desc,
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            c: std::ptr::null_mut(),
            algo: sys::cublasLtMatmulAlgo_t { data: [0; 8] },
        };
        plan.a = lt::create_matrix_layout(ty, k, n, key.k as i64).map_err(blas_err("cublasLtMatrixLayoutCreate"))?;
        plan.b = lt::create_matrix_layout(ty, k, m, key.ldx as i64).map_err(blas_err("cublasLtMatrixLayoutCreate"))?;
        plan.c = lt::create_matrix_layout(ty, n, m, key.n as i64).map_err(blas_err("cublasLtMatrixLayoutCreate"))?;
        // SAFETY: `desc` is live; the attribute types are those of the cuBLASLt docs
        // (cublasOperation_t and cublasLtEpilogue_t are 32-bit enums, the bias type a
        // cudaDataType).
        unsafe {
            set_desc(desc, sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA, &OP_T)?;
            set_desc(desc, sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB, &OP_N)?;
            if key.bias {
                let epilogue = sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS;
                set_desc(desc, sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue)?;
                set_desc(desc, sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &ty)?;
            }
        }
        let pref = lt::create_matmul_pref().map_err(blas_err("cublasLtMatmulPreferenceCreate"))?;
        let result = (|| {
            let set = |attr, value: u64, size: usize| {
                let v32 = value as u32;
                let ptr: *const c_void =
                    if size == 8 { (&value as *const u64).cast() } else { (&v32 as *const u32).cast() };
                // SAFETY: `pref` is live; MAX_WORKSPACE_BYTES is a u64 and the
                // alignment attributes are u32, as the sizes passed say.
                unsafe { lt::set_matmul_pref_attribute(pref, attr, ptr, size) }
                    .map_err(blas_err("cublasLtMatmulPreferenceSetAttribute"))
            };
            use sys::cublasLtMatmulPreferenceAttributes_t as P;
            set(P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, WORKSPACE_BYTES as u64, 8)?;
            set(P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, u64::from(key.align[0]), 4)?;
            set(P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, u64::from(key.align[1]), 4)?;
            set(P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, u64::from(key.align[2]), 4)?;
            set(P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, u64::from(key.align[2]), 4)?;
            let wanted = if key.tuned { super::gemm_tune::CANDIDATES } else { 1 };
            // SAFETY: the result type is plain old data the call fills in.
            let mut results: Vec<sys::cublasLtMatmulHeuristicResult_t> = vec![unsafe { std::mem::zeroed() }; wanted];
            let mut count = 0i32;
            // SAFETY: every descriptor is live and describes this GEMM; `results`
            // holds `wanted` entries and `count` says how many were written.
            unsafe {
                sys::cublasLtMatmulAlgoGetHeuristic(
                    blas.handle,
                    desc,
                    plan.a,
                    plan.b,
                    plan.c,
                    plan.c,
                    pref,
                    wanted as i32,
                    results.as_mut_ptr(),
                    &mut count,
                )
            }
            .result()
            .map_err(blas_err("cublasLtMatmulAlgoGetHeuristic"))?;
            results.truncate(count.clamp(0, wanted as i32) as usize);
            Ok::<_, Error>(
                results
                    .into_iter()
                    .filter(|r| r.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
                    .map(|r| r.algo)
                    .collect::<Vec<_>>(),
            )
        })();
        // SAFETY: created above, destroyed once.
        unsafe {
            let _ = lt::destroy_matmul_pref(pref);
        }
        let candidates = result?;
        plan.algo = *candidates.first().ok_or_else(|| Error::Blas {
            what: "cublasLtMatmulAlgoGetHeuristic".into(),
            message: "no algorithm for this shape".into(),
        })?;
        Ok((plan, candidates))
    }
}

/// `out = x @ w^T (+ bias)`: `out` `[m, n]` contiguous (written), `x` `[m, k]`,
/// `w` `[n, k]` contiguous, `bias` `[n]`, one float dtype.
pub(crate) fn linear(out: &Tensor, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<()> {
    const OP: &str = "linear";
    let dev = device_of(OP, x)?;
    let [m, k] = x.dims::<2>(OP, "x")?;
    let [n, _] = w.dims::<2>(OP, "w")?;
    if k == 0 {
        // An empty reduction: out = bias (or zeros).
        return match bias {
            Some(b) => super::convert::copy(out, &b.reshape(&[1, n])?.as_strided(&[m, n], &[0, 1], b.offset())?),
            None => dev.memset(out.device_ptr(), 0, out.size_in_bytes()),
        };
    }
    // Decode-sized, weight-bound products go to the skinny kernel (the rule and
    // why: `skinny::plan`); MINISGL_SKINNY_GEMM=0 keeps everything on cuBLASLt.
    if super::skinny::enabled() && bias.is_none_or(Tensor::is_contiguous) {
        let aligned = super::skinny::operands_aligned(x, w);
        let sms = dev.sm_count().max(1) as usize;
        // With MINISGL_STREAM_GEMM=1 (off by default: `stream_gemm::ENABLED` says
        // why), large weights at m <= 16 on sm_90 go to the streaming kernel, whose
        // tensor copies keep ~130 KiB of weights in flight an SM; =all sends it
        // every product of 1 MiB and more, ahead of the skinny kernel.
        let capability = dev.capability();
        if let Some(plan) = super::stream_gemm::linear_plan(m, n, k, x.dtype(), aligned, capability, sms) {
            return super::stream_gemm::stream_gemm(out, x, w, bias, plan);
        }
        if let Some(plan) = super::skinny::plan(m, n, k, x.dtype(), aligned, sms) {
            return super::skinny::skinny_gemm(out, x, w, bias, plan);
        }
        // Then the tiled kernel up to MINISGL_SKINNY_MAX_ROWS rows (default 64) of
        // at least 1 MiB of weights: its cp.async pipeline keeps ~96 KiB of
        // weights in flight an SM, where cuBLASLt measured 2.45-2.61 TB/s on
        // Llama-3-8B's projections at m = 16..64 and 7-8 us (1-3 us of weight
        // reads) on Qwen3-0.6B's at m = 64 (`skinny_tiled::plan`).
        if let Some(plan) = super::skinny_tiled::linear_plan(m, n, k, x.dtype(), aligned, sms) {
            return super::skinny_tiled::skinny_tiled(out, x, w, bias, plan);
        }
    }
    // B's leading dimension is x's row stride: rows must be dense and not overlap.
    let strided_ok = k == 1 || x.strides()[1] == 1;
    let x = if strided_ok && (m <= 1 || x.strides()[0] >= k) { x.clone() } else { x.contiguous()? };
    let ldx = if m <= 1 { k } else { x.strides()[0] };
    let key = GemmKey {
        m,
        n,
        k,
        ldx,
        dtype: x.dtype(),
        bias: bias.is_some(),
        align: [
            alignment(w.device_ptr()),
            alignment(x.device_ptr()),
            alignment(out.device_ptr()),
            bias.map_or(256, |b| alignment(b.device_ptr())),
        ],
        tuned: super::gemm_tune::wanted(m, n * k * x.dtype().size_in_bytes()),
    };
    let blas = Blas::of(dev)?;
    let mut plans = blas
        .plans
        .lock()
        .map_err(|_| Error::Blas { what: "plan cache".into(), message: "poisoned by a panic".into() })?;
    dev.bind()?;
    let plan = match plans.entry(key) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(e) => {
            let (mut plan, candidates) = Plan::new(&blas, &key)?;
            // Inside a capture nothing can be timed: the shape keeps the first pick.
            if key.tuned && !dev.is_capturing() {
                let shape = (m, n, k, key.dtype);
                let chosen = super::gemm_tune::choose(dev, shape, candidates.len(), |i| {
                    matmul(&blas, &plan, &candidates[i], out, &x, w, bias, dev)
                })?;
                if let Some(i) = chosen {
                    plan.algo = candidates[i];
                }
            }
            e.insert(plan)
        }
    };
    let algo = plan.algo;
    matmul(&blas, plan, &algo, out, &x, w, bias, dev)
}

/// Enqueues `out = x @ w^T (+ bias)` with `algo` (one of `plan`'s candidates).
#[allow(clippy::too_many_arguments)]
fn matmul(
    blas: &Blas,
    plan: &Plan,
    algo: &sys::cublasLtMatmulAlgo_t,
    out: &Tensor,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    dev: &CudaDevice,
) -> Result<()> {
    if let Some(b) = bias {
        let ptr: CUdeviceptr = b.device_ptr();
        // SAFETY: the plan's descriptor is live and its bias pointer attribute is a
        // device pointer; it is set under the cache lock right before the call.
        unsafe { set_desc(plan.desc, sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ptr)? };
    }
    let (alpha, beta) = (1.0f32, 0.0f32);
    let d = out.device_ptr() as *mut c_void;
    // SAFETY: the layouts describe w [n, k], x [m, k] (row stride ldx) and out [m, n]
    // exactly as the op checked them (same device, dtype, shapes); the workspace
    // holds WORKSPACE_BYTES, the size the algorithm was chosen for; the work is
    // enqueued on the device's compute stream, which orders it with every other op.
    unsafe {
        lt::matmul(
            blas.handle,
            plan.desc,
            (&alpha as *const f32).cast(),
            (&beta as *const f32).cast(),
            w.device_ptr() as *const c_void,
            plan.a,
            x.device_ptr() as *const c_void,
            plan.b,
            d,
            plan.c,
            d,
            plan.c,
            algo,
            blas.workspace as *mut c_void,
            WORKSPACE_BYTES,
            dev.cu_stream() as sys::cudaStream_t,
        )
    }
    .map_err(blas_err("cublasLtMatmul"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_is_the_largest_power_of_two_up_to_256() {
        assert_eq!(alignment(0x7f00_0000_0000), 256);
        assert_eq!(alignment(0x7f00_0000_0010), 16);
        assert_eq!(alignment(0x7f00_0000_0002), 2);
        assert_eq!(alignment(0x7f00_0000_0180), 128);
    }
}
