//! The kernel runtime without a GPU: NVRTC compiles and caches kernels, corrupt
//! cache entries are rebuilt, aot mode names a missing instance, and the AOT
//! library's launchers reject bad arguments with a message naming the argument.
//!
//! The NVRTC tests need libnvrtc (LD_LIBRARY_PATH=$CUDA_HOME/lib); the library
//! tests need the AOT build (`cargo xtask build-kernels`). `.ci/run` provides both;
//! elsewhere set MINISGL_SKIP_CUDA_TOOLKIT_TESTS=1 to skip them.

use std::path::PathBuf;

use kernel_runtime::kernels::jit::{self, CacheOutcome, JitCache};
use kernel_runtime::kernels::{self, AotLibrary, KernelMode, Plan, Registry};
use kernel_runtime::sys::kernels::{msgl_tensor, MSGL_ERR_INVALID_ARGUMENT, MSGL_OK};
use kernel_runtime::{DType, Device, Tensor};

fn skip(what: &str) -> bool {
    if std::env::var_os("MINISGL_SKIP_CUDA_TOOLKIT_TESTS").is_some() {
        eprintln!("skipped ({what}): MINISGL_SKIP_CUDA_TOOLKIT_TESTS is set");
        return true;
    }
    false
}

fn kernels_dir() -> PathBuf {
    std::env::var_os("MINISGL_KERNELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/kernels"))
}

#[test]
fn nvrtc_compiles_store_for_sm90_then_hits_the_cache_and_rebuilds_a_corrupt_entry() {
    if skip("nvrtc") {
        return;
    }
    assert!(jit::nvrtc_present(), "libnvrtc.so not found: set LD_LIBRARY_PATH to $CUDA_HOME/lib");
    let (spec, sources) = kernels::embedded().unwrap();
    let family = spec.family("store").unwrap();
    // 1280-byte rows (5 kv heads x 128 x bf16) are not built ahead of time.
    let instance = family.instance(&[("ROW_BYTES", 1280)]).unwrap();
    assert!(!family.has_aot_instance(&instance));
    let dir = tempfile::tempdir().unwrap();
    let cache = JitCache::new(dir.path());

    let (cubin, outcome) = cache.get_or_compile(&sources, family, &instance, "sm_90").unwrap();
    assert_eq!(outcome, CacheOutcome::Compiled);
    assert_eq!(&cubin[..4], b"\x7fELF", "NVRTC output is not a cubin");
    let entry = cache.entry_path(&sources, family, &instance, "sm_90").unwrap();
    assert!(entry.is_file());

    let (again, outcome) = cache.get_or_compile(&sources, family, &instance, "sm_90").unwrap();
    assert_eq!(outcome, CacheOutcome::Hit);
    assert_eq!(again, cubin);

    // Flip one byte in the payload: detected, recompiled, replaced.
    let mut bytes = std::fs::read(&entry).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&entry, &bytes).unwrap();
    let (rebuilt, outcome) = cache.get_or_compile(&sources, family, &instance, "sm_90").unwrap();
    assert_eq!(outcome, CacheOutcome::Rebuilt);
    assert_eq!(rebuilt, cubin);
    // Truncated entry: likewise.
    std::fs::write(&entry, &bytes[..100]).unwrap();
    assert_eq!(cache.get_or_compile(&sources, family, &instance, "sm_90").unwrap().1, CacheOutcome::Rebuilt);
    assert_eq!(cache.get_or_compile(&sources, family, &instance, "sm_90").unwrap().1, CacheOutcome::Hit);

    // Another arch or instance is another entry.
    let other = family.instance(&[("ROW_BYTES", 640)]).unwrap();
    assert_ne!(cache.entry_path(&sources, family, &other, "sm_90").unwrap(), entry);
    assert_ne!(cache.entry_path(&sources, family, &instance, "sm_80").unwrap(), entry);
    // No temporary files are left behind.
    let names: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(names.iter().all(|n| n.ends_with(".cubin")), "{names:?}");
}

#[test]
fn concurrent_compiles_of_one_entry_do_not_clash() {
    if skip("nvrtc") {
        return;
    }
    let (spec, sources) = kernels::embedded().unwrap();
    let family = spec.family("index").unwrap();
    let instance = family.instance(&[("ROW_BYTES", 2560)]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let results: Vec<Vec<u8>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..3)
            .map(|_| {
                let cache = JitCache::new(dir.path());
                let (sources, family, instance) = (&sources, family, &instance);
                s.spawn(move || cache.get_or_compile(sources, family, instance, "sm_90").unwrap().0)
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(results.windows(2).all(|w| w[0] == w[1]));
    assert_eq!(
        JitCache::new(dir.path()).get_or_compile(&sources, family, &instance, "sm_90").unwrap().1,
        CacheOutcome::Hit
    );
}

#[test]
fn an_nvrtc_compile_error_carries_the_log() {
    if skip("nvrtc") {
        return;
    }
    let (spec, _) = kernels::embedded().unwrap();
    let family = spec.family("store").unwrap();
    let broken = kernel_build::KernelSources::from_pairs([(
        family.source.as_str(),
        "extern \"C\" __global__ void k() { undeclared_thing; }",
    )]);
    let instance = family.instance(&[("ROW_BYTES", 64)]).unwrap();
    let err = jit::compile(&broken, family, &instance, "sm_90").unwrap_err().to_string();
    assert!(err.contains("undeclared_thing"), "{err}");
    assert!(err.contains("store[ROW_BYTES=64] for sm_90"), "{err}");
}

fn aot_registry(mode: KernelMode) -> Option<Registry> {
    if skip("aot library") {
        return None;
    }
    let dir = kernels_dir();
    assert!(
        dir.join("manifest.json").is_file(),
        "no AOT build in {}: run `cargo xtask build-kernels` first (or set MINISGL_KERNELS)",
        dir.display()
    );
    Some(Registry::new(mode, &[dir], true, JitCache::new(tempfile::tempdir().unwrap().path())).unwrap())
}

#[test]
fn aot_mode_names_the_missing_instance_and_auto_mode_plans_jit() {
    let Some(aot) = aot_registry(KernelMode::Aot) else { return };
    let family = aot.family("store").unwrap();
    let built = family.instance(&[("ROW_BYTES", 2048)]).unwrap();
    let missing = family.instance(&[("ROW_BYTES", 1280)]).unwrap();
    assert_eq!(aot.plan("store", &built, "sm_90").unwrap(), Plan::Library);
    let err = aot.plan("store", &missing, "sm_90").unwrap_err().to_string();
    assert!(err.contains("store[ROW_BYTES=1280]"), "{err}");
    assert!(err.contains("MINISGL_KERNEL_MODE=aot"), "{err}");
    // A device the library was not built for.
    let err = aot.plan("store", &built, "sm_80").unwrap_err().to_string();
    assert!(err.contains("for sm_80 (built for sm_90a)"), "{err}");

    let Some(auto) = aot_registry(KernelMode::Auto) else { return };
    assert_eq!(auto.plan("store", &built, "sm_90").unwrap(), Plan::Library);
    assert_eq!(auto.plan("store", &missing, "sm_90").unwrap(), Plan::Jit);
    assert_eq!(auto.plan("store", &built, "sm_80").unwrap(), Plan::Jit);
    let Some(jit) = aot_registry(KernelMode::Jit) else { return };
    assert_eq!(jit.plan("store", &built, "sm_90").unwrap(), Plan::Jit);
}

#[test]
fn a_stale_or_tampered_build_is_detected() {
    if skip("aot library") {
        return;
    }
    let (spec, sources) = kernels::embedded().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(kernels_dir()).unwrap() {
        let entry = entry.unwrap();
        if entry.path().is_file() {
            std::fs::copy(entry.path(), tmp.path().join(entry.file_name())).unwrap();
        }
    }
    let manifest_path = tmp.path().join("manifest.json");
    let original = std::fs::read_to_string(&manifest_path).unwrap();
    // A family hash that does not match the embedded sources: that family is stale.
    let mut manifest: kernel_build::Manifest = serde_json::from_str(&original).unwrap();
    manifest.kernels.iter_mut().find(|k| k.family == "index").unwrap().hash = "0".repeat(64);
    manifest.write(tmp.path()).unwrap();
    let lib = AotLibrary::open(tmp.path(), &spec, &sources).unwrap();
    assert_eq!(lib.stale_families().len(), 1);
    assert!(lib.stale_families()[0].starts_with("index"), "{:?}", lib.stale_families());
    // A wrong format version or library checksum is an error.
    manifest.format_version = 99;
    manifest.write(tmp.path()).unwrap();
    let err = AotLibrary::open(tmp.path(), &spec, &sources).err().unwrap().to_string();
    assert!(err.contains("format version 99"), "{err}");
    std::fs::write(&manifest_path, original.replace("\"sha256\": \"", "\"sha256\": \"00")).unwrap();
    let err = AotLibrary::open(tmp.path(), &spec, &sources).err().unwrap().to_string();
    assert!(err.contains("SHA-256 differs"), "{err}");
    // Artifact paths must stay inside the manifest's folder.
    let mut manifest: kernel_build::Manifest = serde_json::from_str(&original).unwrap();
    manifest.library.path = format!("../{}", manifest.library.path);
    manifest.write(tmp.path()).unwrap();
    let err = AotLibrary::open(tmp.path(), &spec, &sources).err().unwrap().to_string();
    assert!(err.contains("leaves the manifest's folder"), "{err}");
    let mut manifest: kernel_build::Manifest = serde_json::from_str(&original).unwrap();
    if let Some(c) = manifest.kernels.iter_mut().flat_map(|k| k.cubins.iter_mut()).next() {
        c.artifact.path = "/etc/passwd".into();
        manifest.write(tmp.path()).unwrap();
        let err = AotLibrary::open(tmp.path(), &spec, &sources).err().unwrap().to_string();
        assert!(err.contains("leaves the manifest's folder"), "{err}");
    }
}

/// AOT cubins are checked against the manifest before they are loaded.
#[test]
fn a_tampered_aot_cubin_is_refused() {
    if skip("aot library") {
        return;
    }
    let (spec, sources) = kernels::embedded().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    copy_tree(&kernels_dir(), tmp.path());
    let lib = AotLibrary::open(tmp.path(), &spec, &sources).unwrap();
    let Some(cubin) = lib.cubin_paths().into_iter().next() else { return };
    let image = lib.read_cubin(&cubin).unwrap();
    let mut tampered = image.clone();
    let last = tampered.len() - 1;
    tampered[last] ^= 1;
    std::fs::write(&cubin, &tampered).unwrap();
    let err = lib.read_cubin(&cubin).unwrap_err().to_string();
    assert!(err.contains("SHA-256 differs"), "{err}");
    // A file the manifest does not list is refused too.
    let unlisted = tmp.path().join("not-listed.cubin");
    std::fs::write(&unlisted, &image).unwrap();
    let err = lib.read_cubin(&unlisted).unwrap_err().to_string();
    assert!(err.contains("does not list it"), "{err}");
}

fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let dest = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &dest);
        } else {
            std::fs::copy(entry.path(), dest).unwrap();
        }
    }
}

#[test]
fn manifest_paths_are_confined_to_its_folder() {
    let dir = std::path::Path::new("/opt/kernels");
    assert_eq!(kernels::confined(dir, "lib/x.so").unwrap(), dir.join("lib/x.so"));
    for bad in ["../x.so", "/etc/passwd", "a/../../x", ""] {
        assert!(kernels::confined(dir, bad).is_err(), "{bad}");
    }
}

/// A fake device view: the launchers validate before touching memory or CUDA.
fn view(dtype: DType, shape: &[i64], device: i32) -> msgl_tensor {
    let mut t = msgl_tensor {
        data: 0x1000_0000 as *mut _,
        dtype: dtype.abi_code(),
        ndim: shape.len() as i32,
        device,
        ..Default::default()
    };
    let mut stride = 1;
    for i in (0..shape.len()).rev() {
        t.shape[i] = shape[i];
        t.strides[i] = stride;
        stride *= shape[i];
    }
    t
}

#[test]
fn library_launchers_reject_bad_arguments_naming_them() {
    let Some(reg) = aot_registry(KernelMode::Aot) else { return };
    let lib = reg.aot().unwrap();
    let l = lib.launchers();
    let good = || {
        (
            view(DType::BF16, &[64, 1024], 0),
            view(DType::BF16, &[64, 1024], 0),
            view(DType::I64, &[8], 0),
            view(DType::BF16, &[8, 1024], 0),
            view(DType::BF16, &[8, 1024], 0),
        )
    };
    let call = |kc: msgl_tensor, vc: msgl_tensor, idx: msgl_tensor, k: msgl_tensor, v: msgl_tensor| {
        // SAFETY: validation fails before any memory is touched or any CUDA call.
        let status = unsafe { l.msgl_store_kv(&kc, &vc, &idx, &k, &v, std::ptr::null_mut()) };
        (status, lib.last_error())
    };
    type Edit = Box<dyn Fn(&mut [msgl_tensor; 5])>;
    let cases: Vec<(&str, Edit)> = vec![
        ("argument `k` has dtype f16 but `k_cache` has dtype bf16", Box::new(|t| t[3].dtype = DType::F16.abi_code())),
        (
            "argument `v_cache` has dtype f32 but `k_cache` has dtype bf16",
            Box::new(|t| t[1].dtype = DType::F32.abi_code()),
        ),
        ("argument `k` has dtype unknown, expected f32|f16|bf16|i32|i64|u8", Box::new(|t| t[3].dtype = 9)),
        ("argument `indices` has dtype f32, expected i32|i64", Box::new(|t| t[2].dtype = DType::F32.abi_code())),
        ("argument `v` has size 7 in dimension 0, expected 8", Box::new(|t| t[4].shape[0] = 7)),
        ("argument `k` has 3 dimensions, expected 2", Box::new(|t| t[3].ndim = 3)),
        ("argument `k` has stride 2 in its last dimension, expected 1", Box::new(|t| t[3].strides[1] = 2)),
        ("argument `k_cache` is not contiguous", Box::new(|t| t[0].strides[0] = 2048)),
        ("argument `v` is in host memory", Box::new(|t| t[4].device = -1)),
        ("argument `v_cache` is on device 1 but `k_cache` is on device 0", Box::new(|t| t[1].device = 1)),
        ("argument `k` data pointer is not 16-byte aligned", Box::new(|t| t[3].data = 0x1000_0008 as *mut _)),
    ];
    let mut fixed = false;
    for (needle, mutate) in &cases {
        let (a, b, c, d, e) = good();
        let mut ts = [a, b, c, d, e];
        mutate(&mut ts);
        let [a, b, c, d, e] = ts;
        let (status, message) = call(a, b, c, d, e);
        assert_eq!(status, MSGL_ERR_INVALID_ARGUMENT as i32, "{needle}: status {status}, message {message:?}");
        assert!(message.starts_with("store_kv: "), "{message}");
        assert!(message.contains(needle), "expected {needle:?} in {message:?}");
        fixed = true;
    }
    assert!(fixed);
    // index: a bad ids dtype and a shape mismatch.
    let (out, weight, mut ids) =
        (view(DType::BF16, &[4, 4096], 0), view(DType::BF16, &[100, 4096], 0), view(DType::I32, &[4], 0));
    ids.dtype = DType::F16.abi_code();
    // SAFETY: as above.
    let status = unsafe { l.msgl_index(&out, &weight, &ids, 0, std::ptr::null_mut()) };
    assert_eq!(status, MSGL_ERR_INVALID_ARGUMENT as i32);
    assert!(lib.last_error().contains("index: argument `ids` has dtype f16"), "{}", lib.last_error());
    let out = view(DType::BF16, &[4, 2048], 0);
    ids.dtype = DType::I32.abi_code();
    // SAFETY: as above.
    let status = unsafe { l.msgl_index(&out, &weight, &ids, 0, std::ptr::null_mut()) };
    assert_eq!(status, MSGL_ERR_INVALID_ARGUMENT as i32);
    assert!(
        lib.last_error().contains("argument `out` has size 2048 in dimension 1, expected 4096"),
        "{}",
        lib.last_error()
    );
    // A well-formed call with zero tokens returns OK without touching the GPU.
    let (kc, vc, _, _, _) = good();
    let (idx, k, v) = (view(DType::I32, &[0], 0), view(DType::BF16, &[0, 1024], 0), view(DType::BF16, &[0, 1024], 0));
    // SAFETY: zero tokens: nothing is launched.
    assert_eq!(unsafe { l.msgl_store_kv(&kc, &vc, &idx, &k, &v, std::ptr::null_mut()) }, MSGL_OK as i32);
}

#[test]
fn rust_launchers_reject_bad_arguments_naming_them() {
    let cpu = Device::Cpu;
    let cache = Tensor::zeros(&[16, 4, 2, 8], DType::BF16, cpu).unwrap();
    let k = Tensor::zeros(&[3, 2, 8], DType::BF16, cpu).unwrap();
    let idx = Tensor::from_slice(&[0i32, 5, 9], &[3], cpu).unwrap();
    kernel_runtime::ops::store_kv(&cache, &cache.clone(), &idx, &k, &k).unwrap();
    let f16 = Tensor::zeros(&[3, 2, 8], DType::F16, cpu).unwrap();
    let cases = [
        (
            kernel_runtime::ops::store_kv(&cache, &cache, &idx, &f16, &k),
            "argument `k_cache` has dtype bf16, `k` has f16",
        ),
        (
            kernel_runtime::ops::store_kv(
                &cache,
                &cache,
                &idx.to_dtype(DType::I64).unwrap().narrow(0, 0, 2).unwrap(),
                &k,
                &k,
            ),
            "argument `indices` has shape [2], expected [3]",
        ),
        (
            kernel_runtime::ops::store_kv(&cache, &cache, &Tensor::zeros(&[3], DType::F32, cpu).unwrap(), &k, &k),
            "argument `indices` has dtype f32, expected i32|i64",
        ),
        (
            kernel_runtime::ops::store_kv(
                &cache,
                &cache,
                &idx,
                &Tensor::zeros(&[3, 2, 16], DType::BF16, cpu).unwrap().narrow(2, 0, 8).unwrap(),
                &k,
            ),
            "argument `k` must have dense rows",
        ),
        (
            kernel_runtime::ops::store_kv(&cache.narrow(3, 0, 4).unwrap(), &cache, &idx, &k, &k),
            "argument `k_cache` must be contiguous",
        ),
    ];
    for (result, needle) in cases {
        let err = result.unwrap_err().to_string();
        assert!(err.starts_with("store_kv: ") && err.contains(needle), "expected {needle:?} in {err:?}");
    }
    let w = Tensor::zeros(&[10, 8], DType::F32, cpu).unwrap();
    let err =
        kernel_runtime::ops::embedding(&w, &Tensor::zeros(&[2], DType::F32, cpu).unwrap(), 0).unwrap_err().to_string();
    assert!(err.contains("argument `ids` has dtype f32"), "{err}");
}

#[test]
fn cpu_store_and_index_follow_the_contract() {
    let cpu = Device::Cpu;
    // 4 pages x 2 slots x (2 heads x 3 dims) of f32.
    let cache_k = Tensor::zeros(&[4, 2, 2, 3], DType::F32, cpu).unwrap();
    let cache_v = Tensor::zeros(&[4, 2, 2, 3], DType::F32, cpu).unwrap();
    // k and v are strided views of one fused [t, 3 * 6] tensor.
    let fused: Vec<f32> = (0..3 * 18).map(|i| i as f32 + 0.5).collect();
    let fused = Tensor::from_slice(&fused, &[3, 3, 2, 3], cpu).unwrap();
    let k = fused.narrow(1, 1, 1).unwrap().reshape(&[3, 2, 3]).err();
    assert!(k.is_some(), "a strided view cannot be reshaped");
    let k = fused.as_strided(&[3, 2, 3], &[18, 3, 1], 6).unwrap();
    let v = fused.as_strided(&[3, 2, 3], &[18, 3, 1], 12).unwrap();
    let idx = Tensor::from_slice(&[7i64, 0, 100], &[3], cpu).unwrap();
    kernel_runtime::ops::store_kv(&cache_k, &cache_v, &idx, &k, &v).unwrap();
    let ck = cache_k.to_vec::<f32>().unwrap();
    let cv = cache_v.to_vec::<f32>().unwrap();
    assert_eq!(&ck[7 * 6..8 * 6], &[6.5, 7.5, 8.5, 9.5, 10.5, 11.5]);
    assert_eq!(&cv[0..6], &[30.5, 31.5, 32.5, 33.5, 34.5, 35.5]);
    // Slot 100 is out of range: skipped; nothing else written.
    assert_eq!(ck.iter().filter(|&&x| x != 0.0).count(), 12);
    // index with a vocab-parallel shard [10, 14).
    let w = Tensor::from_slice(&(0..8).map(|i| i as f32).collect::<Vec<_>>(), &[4, 2], cpu).unwrap();
    let ids = Tensor::from_slice(&[11i32, 9, 13, 14], &[4], cpu).unwrap();
    let out = kernel_runtime::ops::embedding(&w, &ids, 10).unwrap();
    assert_eq!(out.to_vec::<f32>().unwrap(), [2.0, 3.0, 0.0, 0.0, 6.0, 7.0, 0.0, 0.0]);
}
