//! Every instance of the MoE kernel families (and a few of moe_gemm's run-time
//! tiles) compiles through NVRTC for sm_90a on a machine without a GPU, from the
//! sources kernel-runtime embeds (the run-time path of an instance missing from the
//! AOT build), and the families declare their AOT instances.
//!
//! Needs libnvrtc (LD_LIBRARY_PATH=$CUDA_HOME/lib; `.ci/run` provides it); set
//! MINISGL_SKIP_CUDA_TOOLKIT_TESTS=1 to skip.

use kernel_runtime::kernels::{self, jit};

const FAMILIES: [&str; 5] = ["moe_route", "moe_align", "moe_gemm", "moe_sum", "moe_decode"];

#[test]
fn every_moe_instance_compiles_with_nvrtc_for_sm90() {
    if std::env::var_os("MINISGL_SKIP_CUDA_TOOLKIT_TESTS").is_some() {
        eprintln!("skipped (nvrtc): MINISGL_SKIP_CUDA_TOOLKIT_TESTS is set");
        return;
    }
    assert!(jit::nvrtc_present(), "libnvrtc.so not found: set LD_LIBRARY_PATH to $CUDA_HOME/lib");
    let (spec, sources) = kernels::embedded().unwrap();
    let mut work: Vec<_> = FAMILIES
        .iter()
        .flat_map(|name| {
            let family = spec.family(name).unwrap_or_else(|| panic!("family `{name}` is not in kernels.toml"));
            family.instances().into_iter().map(move |i| (family, i))
        })
        .collect();
    // Sweep tiles of moe_gemm that only compile at run time (the wgmma ones among
    // them), once each.
    let gemm = spec.family("moe_gemm").unwrap();
    for tile in [2, 8, 19, 20, 22, 23] {
        work.push((gemm, gemm.instance(&[("DTYPE", 2), ("TILE", tile), ("GATE_UP", 1)]).unwrap()));
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2).min(8);
    let failures: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (sources, work, next) = (&sources, &work, &next);
                s.spawn(move || {
                    let mut failed = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some((family, instance)) = work.get(i) else { return failed };
                        match jit::compile(sources, family, instance, "sm_90a") {
                            Ok(cubin) if cubin.starts_with(b"\x7fELF") => {}
                            Ok(_) => failed.push(format!("{}[{instance}]: NVRTC output is not a cubin", family.name)),
                            Err(e) => failed.push(format!("{}[{instance}]: {e}", family.name)),
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
fn moe_families_have_jit_entries_and_aot_instances() {
    let (spec, _) = kernels::embedded().unwrap();
    for name in FAMILIES {
        let family = spec.family(name).unwrap_or_else(|| panic!("family `{name}` is not in kernels.toml"));
        assert!(family.jit_entry.is_some(), "{name} has no jit_entry");
        assert!(!family.instances().is_empty(), "{name} has no AOT instance");
    }
    // The tiles gpu/moe.rs's plan names (its unit test `the_plan_tiles_are_aot_instances`
    // ties the plan to this list) and the decode fallbacks 0 and 1 are built ahead of
    // time, for both GEMMs; the table's other tiles compile at run time (sweeps).
    let gemm = spec.family("moe_gemm").unwrap();
    for dtype in [1, 2] {
        for tile in [0, 1, 3, 4, 7, 10, 16, 18, 21] {
            for gate_up in [0, 1] {
                let inst = gemm.instance(&[("DTYPE", dtype), ("TILE", tile), ("GATE_UP", gate_up)]).unwrap();
                assert!(gemm.has_aot_instance(&inst), "moe_gemm[{inst}] is not built ahead of time");
            }
        }
    }
}
