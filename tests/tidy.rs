//! Repository hygiene that review would otherwise have to catch: every Rust file
//! starts with a `//!` header, no test is ignored or expected to panic, every
//! crate below `engine` forbids (or, for kernel-runtime, documents) unsafe, and
//! every GPU test travels in `cargo xtask gpu-bundle`.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if !name.starts_with('.') && name != "target" && name != "fixtures" {
                rust_files(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

fn workspace_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "tests", "benches", "kernel-build", "kernel-runtime", "models", "engine", "xtask"] {
        rust_files(&root.join(dir), &mut files);
    }
    files
}

#[test]
fn every_rust_file_starts_with_a_module_doc() {
    let missing: Vec<String> = workspace_files()
        .into_iter()
        .filter(|p| {
            let text = std::fs::read_to_string(p).unwrap_or_default();
            let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
            // build.rs and main.rs of binaries start with //! too; nothing is exempt.
            !first.starts_with("//!")
        })
        .map(|p| p.display().to_string())
        .collect();
    assert!(missing.is_empty(), "files without a //! header:\n{}", missing.join("\n"));
}

#[test]
fn no_test_is_ignored_or_expects_a_panic() {
    let needles = [concat!("#[", "ignore"), concat!("#[", "should_panic")];
    let offenders: Vec<String> = workspace_files()
        .into_iter()
        .filter(|p| {
            let text = std::fs::read_to_string(p).unwrap_or_default();
            needles.iter().any(|n| text.contains(n))
        })
        .map(|p| p.display().to_string())
        .collect();
    assert!(offenders.is_empty(), "ignored or should_panic tests in:\n{}", offenders.join("\n"));
}

#[test]
fn only_kernel_runtime_may_use_unsafe() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for lib in [
        "src/lib.rs",
        "kernel-build/src/lib.rs",
        "models/src/lib.rs",
        "engine/src/lib.rs",
        "engine/src/main.rs",
        "xtask/src/main.rs",
    ] {
        let text = std::fs::read_to_string(root.join(lib)).unwrap();
        assert!(text.contains("#![forbid(unsafe_code)]"), "{lib} must forbid unsafe code");
    }
    let runtime = std::fs::read_to_string(root.join("kernel-runtime/src/lib.rs")).unwrap();
    assert!(runtime.contains("undocumented_unsafe_blocks"), "kernel-runtime must lint undocumented unsafe blocks");
}

/// `cargo xtask gpu-bundle` takes the test binaries named `*gpu*` and those it
/// lists in `GPU_TESTS_ELSEWHERE`: a `gpu_*` test in any other file would never
/// reach the GPU machine (models' MoE fixture test did not, until this check).
#[test]
fn every_gpu_test_travels_in_the_bundle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let bundle = std::fs::read_to_string(root.join("xtask/src/gpu_bundle.rs")).unwrap_or_default();
    let mut missing = Vec::new();
    for path in workspace_files() {
        let (Some(parent), Some(stem)) = (path.parent(), path.file_stem().and_then(|s| s.to_str())) else { continue };
        if parent.file_name().and_then(|s| s.to_str()) != Some("tests") || stem.contains("gpu") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if !text.lines().any(|l| l.trim_start().starts_with("fn gpu_")) {
            continue;
        }
        // The binary's name: the package (the directory above tests/, or the root
        // package) and the file.
        let package = match parent.parent() {
            Some(p) if p == root => "minisgl".to_owned(),
            Some(p) => p.file_name().and_then(|s| s.to_str()).unwrap_or("").replace('_', "-"),
            None => continue,
        };
        let binary = format!("\"{package}-{stem}\"");
        if !bundle.contains(&binary) {
            missing.push(format!("{} ({binary})", path.display()));
        }
    }
    assert!(missing.is_empty(), "gpu_ tests that the GPU bundle leaves behind:\n{}", missing.join("\n"));
}
