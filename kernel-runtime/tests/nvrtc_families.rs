//! Every kernel family of the dense and attention ops compiles through NVRTC for
//! sm_90a (what the runtime compiles for on sm_90) on a machine without a GPU, from the sources kernel-runtime embeds: the
//! run-time path an instance missing from the AOT build takes (no system headers,
//! no cuda_fp16.h / cuda_bf16.h in device code).
//!
//! Needs libnvrtc (LD_LIBRARY_PATH=$CUDA_HOME/lib; `.ci/run` provides it); set
//! MINISGL_SKIP_CUDA_TOOLKIT_TESTS=1 to skip.

use kernel_runtime::kernels::{self, jit};

/// Instances compiled: every AOT instance of the small families, and the attention
/// and decode attention variants that matter (both dtypes with tensor cores, f32
/// and the 16-bit CUDA-core fallback, head_dim 256).
fn instances() -> Vec<(&'static str, Vec<(&'static str, i64)>)> {
    let mut out = Vec::new();
    for family in [
        "norm",
        "rope",
        "rope_store",
        "activation",
        "argmax",
        "sampling",
        "random",
        "token_mask",
        "apply_penalties",
        "logprobs",
    ] {
        for dtype in [0, 1, 2] {
            out.push((family, vec![("DTYPE", dtype)]));
        }
    }
    for src in [0, 1, 2] {
        for dst in [0, 1, 2] {
            out.push(("cast", vec![("SRC", src), ("DST", dst)]));
        }
    }
    for bytes in [1, 2, 4, 8] {
        out.push(("copy", vec![("ELEM_BYTES", bytes)]));
    }
    for mode in [0, 1] {
        out.push(("penalty_count", vec![("MODE", mode)]));
    }
    for dtype in [1, 2] {
        for n_tiles in [1, 2] {
            for m_tiles in [1, 2] {
                for gated in [0, 1] {
                    for norm in [0, 1] {
                        out.push((
                            "skinny_gemm",
                            vec![
                                ("DTYPE", dtype),
                                ("N_TILES", n_tiles),
                                ("M_TILES", m_tiles),
                                ("GATED", gated),
                                ("NORM", norm),
                            ],
                        ));
                    }
                }
            }
        }
    }
    for dtype in [1, 2] {
        for n_tiles in [1, 2, 4, 8, 16] {
            out.push(("skinny_tiled", vec![("DTYPE", dtype), ("N_TILES", n_tiles)]));
        }
    }
    for dtype in [1, 2] {
        for n_tiles in [1, 2] {
            out.push(("stream_gemm", vec![("DTYPE", dtype), ("N_TILES", n_tiles)]));
        }
    }
    for (dtype, head_dim, mma) in [(2, 128, 1), (1, 64, 1), (2, 256, 1), (0, 64, 0), (0, 128, 0), (2, 128, 0)] {
        out.push(("attention", vec![("DTYPE", dtype), ("HEAD_DIM", head_dim), ("MMA", mma)]));
    }
    // The decode kernel: the tensor-core block at each pipeline depth, and the
    // CUDA-core blocks that are only ever compiled at run time (f32,
    // MINISGL_DECODE_MMA=0; STAGES 0).
    for (dtype, head_dim, rows, stages) in [
        (2, 128, 16, 3),
        (2, 128, 16, 2),
        (1, 128, 16, 4),
        (2, 64, 16, 2),
        (1, 256, 16, 2),
        (2, 256, 16, 3),
        (0, 128, 4, 0),
        (0, 256, 8, 0),
        (2, 64, 1, 0),
        (1, 128, 2, 0),
        (2, 32, 8, 0),
    ] {
        out.push((
            "decode_attention",
            vec![("DTYPE", dtype), ("HEAD_DIM", head_dim), ("ROWS", rows), ("STAGES", stages)],
        ));
    }
    // The prefill kernel: the default tile at every head dim and both dtypes, and
    // every variant that fits (the sweep compiles them at run time).
    for (dtype, head_dim) in [(2, 64), (1, 128), (2, 128), (1, 256)] {
        out.push(("prefill_attention", vec![("DTYPE", dtype), ("HEAD_DIM", head_dim), ("TILE", 0)]));
    }
    for tile in 1..=8 {
        out.push(("prefill_attention", vec![("DTYPE", 2), ("HEAD_DIM", 128), ("TILE", tile)]));
    }
    for tile in [3, 5, 8] {
        out.push(("prefill_attention", vec![("DTYPE", 2), ("HEAD_DIM", 256), ("TILE", tile)]));
    }
    // The wgmma tiles (sm_90a): each at head dim 128 in both dtypes, the defaults (17
    // up to head dim 128, 16 at 256) at 64 and 256 too, and the warp-specialised ones
    // (22..26, 27..31 with TMA, 32..33 two blocks an SM, 34..36 persistent) where
    // they fit.
    for (dtype, head_dim, tile) in [
        (1, 128, 16),
        (2, 128, 16),
        (1, 128, 17),
        (2, 128, 18),
        (1, 128, 19),
        (2, 128, 20),
        (1, 128, 21),
        (2, 64, 16),
        (2, 64, 17),
        (1, 64, 20),
        (1, 256, 16),
        (2, 128, 22),
        (1, 128, 23),
        (2, 128, 24),
        (1, 128, 25),
        (2, 128, 26),
        (2, 64, 25),
        (1, 256, 22),
        (2, 128, 27),
        (1, 128, 28),
        (2, 128, 29),
        (1, 128, 30),
        (2, 128, 31),
        (2, 64, 30),
        (1, 256, 27),
        (2, 128, 32),
        (1, 128, 33),
        (2, 64, 32),
        (2, 128, 34),
        (1, 128, 35),
        (2, 128, 36),
        (1, 256, 34),
        (2, 128, 37),
        (1, 128, 38),
    ] {
        out.push(("prefill_attention", vec![("DTYPE", dtype), ("HEAD_DIM", head_dim), ("TILE", tile)]));
    }
    out
}

#[test]
fn every_dense_and_attention_family_compiles_with_nvrtc_for_sm90() {
    if std::env::var_os("MINISGL_SKIP_CUDA_TOOLKIT_TESTS").is_some() {
        eprintln!("skipped (nvrtc): MINISGL_SKIP_CUDA_TOOLKIT_TESTS is set");
        return;
    }
    assert!(jit::nvrtc_present(), "libnvrtc.so not found: set LD_LIBRARY_PATH to $CUDA_HOME/lib");
    let (spec, sources) = kernels::embedded().unwrap();
    let work = instances();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2).min(8);
    let failures: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (spec, sources, work, next) = (&spec, &sources, &work, &next);
                s.spawn(move || {
                    let mut failed = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some((name, values)) = work.get(i) else { return failed };
                        let family =
                            spec.family(name).unwrap_or_else(|| panic!("family `{name}` is not in kernels.toml"));
                        let instance = family.instance(values).unwrap();
                        match jit::compile(sources, family, &instance, "sm_90a") {
                            Ok(cubin) if cubin.starts_with(b"\x7fELF") => {}
                            Ok(_) => failed.push(format!("{name}[{instance}]: NVRTC output is not a cubin")),
                            Err(e) => failed.push(format!("{name}[{instance}]: {e}")),
                        }
                    }
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    assert!(failures.is_empty(), "NVRTC failures:\n{}", failures.join("\n\n"));
}

#[test]
fn every_new_family_has_a_jit_entry_and_aot_instances() {
    let (spec, _) = kernels::embedded().unwrap();
    for name in [
        "norm",
        "rope",
        "rope_store",
        "skinny_gemm",
        "skinny_tiled",
        "stream_gemm",
        "activation",
        "argmax",
        "sampling",
        "random",
        "token_mask",
        "penalty_count",
        "apply_penalties",
        "logprobs",
        "cast",
        "copy",
        "attention",
        "prefill_attention",
    ] {
        let family = spec.family(name).unwrap_or_else(|| panic!("family `{name}` is not in kernels.toml"));
        assert!(family.jit_entry.is_some(), "{name} has no jit_entry");
        assert!(!family.instances().is_empty(), "{name} has no AOT instance");
    }
}
