//! The ahead-of-time build, end to end with the real nvcc: every family compiles
//! for sm_90a and the manifest names every kernel with its hash (checked on the
//! workspace's own build, `target/kernels`, which `cargo xtask build-kernels` has
//! usually made already, so it is built once and shared with the tests that load
//! it); a second run rebuilds nothing, a changed source rebuilds only its family
//! and a changed header rebuilds all (checked on a copy of csrc/ cut down to two
//! small families, so the three rebuilds cost seconds rather than minutes); and
//! compile errors come back with nvcc's output.
//!
//! Needs nvcc (CUDA_HOME or PATH; `.ci/run` installs the PyPI toolkit). On a
//! machine without it, set MINISGL_SKIP_NVCC_TESTS=1 to skip.

use std::path::{Path, PathBuf};

use kernel_build::aot::{self, AotOptions};
use kernel_build::manifest::Manifest;
use kernel_build::Spec;

fn nvcc_or_skip() -> Option<PathBuf> {
    match aot::find_nvcc() {
        Ok(p) => Some(p),
        Err(e) if std::env::var_os("MINISGL_SKIP_NVCC_TESTS").is_some() => {
            eprintln!("skipped: {e}");
            None
        }
        Err(e) => panic!("{e} (set MINISGL_SKIP_NVCC_TESTS=1 to skip the nvcc tests)"),
    }
}

fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for entry in std::fs::read_dir(src).unwrap() {
        let entry = entry.unwrap();
        let to = dst.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &to);
        } else {
            std::fs::copy(entry.path(), &to).unwrap();
        }
    }
}

fn options(csrc: &Path, out: &Path, nvcc: &Path) -> AotOptions {
    AotOptions {
        csrc_dir: csrc.to_owned(),
        out_dir: out.to_owned(),
        archs: vec![aot::DEFAULT_ARCH.into()],
        nvcc: Some(nvcc.to_owned()),
        jobs: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2),
        cubins: true,
    }
}

/// The families the rebuild test keeps: `abi` (a library-only family) and
/// `store` (an object plus one cubin per instance), two of the smallest.
const SMALL_FAMILIES: [&str; 2] = ["abi", "store"];

/// A copy of the workspace's csrc/ under `dir` whose kernels.toml lists only
/// `keep` (and whose kernels/ holds only their sources, as the tidy check wants).
fn small_csrc(dir: &Path, keep: &[&str]) -> PathBuf {
    let csrc = dir.join("csrc");
    copy_dir(&kernel_build::workspace_csrc_dir(), &csrc);
    let toml = std::fs::read_to_string(csrc.join("kernels.toml")).unwrap();
    let mut blocks = toml.split("\n[[family]]\n");
    let mut cut = blocks.next().unwrap().to_owned();
    let mut sources = Vec::new();
    for block in blocks {
        let name = block.lines().find_map(|l| l.strip_prefix("name = ")).unwrap().trim_matches('"');
        let source = block.lines().find_map(|l| l.strip_prefix("source = ")).unwrap().trim_matches('"');
        if keep.contains(&name) {
            cut.push_str("\n[[family]]\n");
            cut.push_str(block);
            sources.push(source.to_owned());
        }
    }
    std::fs::write(csrc.join("kernels.toml"), cut).unwrap();
    for entry in std::fs::read_dir(csrc.join("kernels")).unwrap() {
        let path = entry.unwrap().path();
        let rel = format!("kernels/{}", path.file_name().unwrap().to_string_lossy());
        if rel.ends_with(".cu") && !sources.contains(&rel) {
            std::fs::remove_file(path).unwrap();
        }
    }
    csrc
}

#[test]
fn every_family_builds_and_the_manifest_names_each_kernel() {
    let Some(nvcc) = nvcc_or_skip() else { return };
    // The same folder and options as `cargo xtask build-kernels` (its default
    // arch): up to date when that ran, so nothing is compiled twice.
    let csrc = kernel_build::workspace_csrc_dir();
    let out = csrc.join("..").join("target").join("kernels");
    let spec = Spec::load(&csrc).unwrap();
    assert_eq!(aot::DEFAULT_ARCH, "sm_90a", "the assertions below name sm_90a");
    let report = aot::build(&options(&csrc, &out, &nvcc)).unwrap();
    assert!(report.manifest.is_some());
    let manifest = Manifest::read(&out).unwrap();
    assert_eq!(manifest.archs, ["sm_90a"]);
    assert!(manifest.nvcc_version.starts_with("13."), "nvcc {}", manifest.nvcc_version);
    assert!(out.join(&manifest.library.path).is_file());
    assert_eq!(manifest.kernels.len(), spec.families.len());
    for family in &spec.families {
        let entry =
            manifest.kernel(&family.name).unwrap_or_else(|| panic!("{} missing from the manifest", family.name));
        assert_eq!(entry.hash.len(), 64, "{}: hash {:?}", family.name, entry.hash);
        assert_eq!(entry.symbols, family.symbols);
        assert_eq!(entry.instances.len(), family.instances().len());
        if family.jit_entry.is_some() {
            assert_eq!(entry.cubins.len(), family.instances().len(), "{}: one cubin per instance", family.name);
            for c in &entry.cubins {
                let bytes = std::fs::read(out.join(&c.artifact.path)).unwrap();
                assert_eq!(&bytes[..4], b"\x7fELF", "{} is not a cubin", c.artifact.path);
            }
        }
    }
    let symbols = String::from_utf8_lossy(&std::fs::read(out.join(&manifest.library.path)).unwrap()).into_owned();
    for family in &spec.families {
        for s in &family.symbols {
            assert!(symbols.contains(s.as_str()), "{s} not in the library");
        }
    }
    // A second build of the same inputs does nothing.
    let again = aot::build(&options(&csrc, &out, &nvcc)).unwrap();
    assert!(again.up_to_date(), "rebuilt {:?} (linked: {})", again.compiled, again.linked);
}

#[test]
fn builds_then_rebuilds_only_what_changed() {
    let Some(nvcc) = nvcc_or_skip() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let csrc = small_csrc(tmp.path(), &SMALL_FAMILIES);
    let out = tmp.path().join("out");
    let spec = Spec::load(&csrc).unwrap();
    assert_eq!(spec.families.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(), SMALL_FAMILIES);

    // First build: every family's object and every cubin is compiled, and linked.
    let first = aot::build(&options(&csrc, &out, &nvcc)).unwrap();
    assert!(first.linked);
    for family in &spec.families {
        assert!(
            first.compiled.contains(&format!("{}.o", family.name)),
            "{} not compiled: {:?}",
            family.name,
            first.compiled
        );
    }
    let manifest = Manifest::read(&out).unwrap();
    assert_eq!(manifest.kernels.len(), spec.families.len());
    assert_eq!(manifest.kernel("store").unwrap().cubins.len(), spec.family("store").unwrap().instances().len());
    // A cubin holds its instance's JIT entry alone, not the AOT launchers' template
    // kernels (`msgl::store_kv_kernel<...>`, mangled `_ZN4msgl...`) of every instance.
    for c in &manifest.kernel("store").unwrap().cubins {
        let bytes = std::fs::read(out.join(&c.artifact.path)).unwrap();
        assert!(bytes.windows(14).any(|w| w == b".text.msgl_sto"), "{}: no JIT entry", c.artifact.path);
        assert!(!bytes.windows(9).any(|w| w == b".text._ZN"), "{} holds the launchers' kernels", c.artifact.path);
    }

    // Second build: nothing to do, manifest unchanged.
    let second = aot::build(&options(&csrc, &out, &nvcc)).unwrap();
    assert!(second.up_to_date(), "rebuilt {:?} (linked: {})", second.compiled, second.linked);
    assert_eq!(Manifest::read(&out).unwrap(), manifest);

    // A changed source rebuilds that family only (object + cubins) and relinks.
    let store = csrc.join("kernels/store.cu");
    let text = std::fs::read_to_string(&store).unwrap();
    std::fs::write(&store, format!("{text}\n/* touched */\n")).unwrap();
    let third = aot::build(&options(&csrc, &out, &nvcc)).unwrap();
    assert!(third.linked);
    assert!(third.compiled.iter().all(|c| c == "store.o" || c.starts_with("cubin/store/")), "{:?}", third.compiled);
    assert!(third.compiled.contains(&"store.o".to_owned()));
    let after = Manifest::read(&out).unwrap();
    assert_ne!(after.kernel("store").unwrap().hash, manifest.kernel("store").unwrap().hash);
    assert_eq!(after.kernel("abi").unwrap().hash, manifest.kernel("abi").unwrap().hash);

    // An added instance rebuilds that family's object too (its launchers
    // dispatch over the instance list), not only the new cubin.
    let toml = csrc.join("kernels.toml");
    let text = std::fs::read_to_string(&toml).unwrap();
    let old = "instances = { ROW_BYTES = [64,";
    assert!(text.contains(old), "the store family's instance list moved");
    std::fs::write(&toml, text.replacen(old, "instances = { ROW_BYTES = [32, 64,", 1)).unwrap();
    let added = aot::build(&options(&csrc, &out, &nvcc)).unwrap();
    assert!(added.compiled.contains(&"store.o".to_owned()), "{:?}", added.compiled);
    assert!(added.compiled.iter().any(|c| c.contains("ROW_BYTES-32")), "{:?}", added.compiled);
    assert!(added.compiled.iter().all(|c| c == "store.o" || c.starts_with("cubin/store/")), "{:?}", added.compiled);

    // A header change rebuilds everything.
    let header = csrc.join("include/minisgl/device.cuh");
    let text = std::fs::read_to_string(&header).unwrap();
    std::fs::write(&header, format!("{text}\n/* touched */\n")).unwrap();
    // With progress reported: the count first, one event per compiled file,
    // then the link.
    let events = std::sync::Mutex::new(Vec::new());
    let fourth = aot::build_with_progress(&options(&csrc, &out, &nvcc), &|p| {
        events.lock().unwrap().push(match p {
            aot::Progress::Compiling { total } => format!("compiling {total}"),
            aot::Progress::Compiled { label } => format!("compiled {label}"),
            aot::Progress::Linking { name } => format!("linking {name}"),
        })
    })
    .unwrap();
    for family in &spec.families {
        assert!(fourth.compiled.contains(&format!("{}.o", family.name)));
    }
    let events = events.into_inner().unwrap();
    assert_eq!(events[0], format!("compiling {}", fourth.compiled.len()), "{events:?}");
    let mut compiled: Vec<String> =
        events.iter().filter_map(|e| e.strip_prefix("compiled ")).map(str::to_owned).collect();
    compiled.sort();
    assert_eq!(compiled, fourth.compiled, "{events:?}");
    assert_eq!(events.last().unwrap(), &format!("linking {}", aot::library_name(&["sm_90a".to_owned()])));
}

#[test]
fn compile_errors_carry_nvccs_output() {
    let Some(nvcc) = nvcc_or_skip() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let csrc = tmp.path().join("csrc");
    std::fs::create_dir_all(csrc.join("kernels")).unwrap();
    std::fs::create_dir_all(csrc.join("include/minisgl")).unwrap();
    std::fs::write(csrc.join("include/minisgl/empty.h"), "").unwrap();
    std::fs::write(
        csrc.join("kernels.toml"),
        "format = 1\n[[family]]\nname = \"broken\"\nsource = \"kernels/broken.cu\"\nsymbols = [\"msgl_broken\"]\n",
    )
    .unwrap();
    std::fs::write(csrc.join("kernels/broken.cu"), "extern \"C\" int msgl_broken() { return this_is_not_declared; }\n")
        .unwrap();
    let err = aot::build(&options(&csrc, &tmp.path().join("out"), &nvcc)).unwrap_err().to_string();
    assert!(err.contains("compiling broken.o failed"), "{err}");
    assert!(err.contains("this_is_not_declared"), "nvcc's message is missing: {err}");
    assert!(err.contains("command:"), "{err}");
}

#[test]
fn a_missing_nvcc_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let mut opts = options(&kernel_build::workspace_csrc_dir(), tmp.path(), Path::new("/nonexistent/bin/nvcc"));
    opts.nvcc = Some(PathBuf::from("/nonexistent/bin/nvcc"));
    let err = aot::build(&opts).unwrap_err().to_string();
    assert!(err.contains("/nonexistent/bin/nvcc"), "{err}");
    opts.archs = vec!["compute_90".into()];
    let err = aot::build(&opts).unwrap_err().to_string();
    assert!(err.contains("invalid architecture `compute_90`"), "{err}");
}
