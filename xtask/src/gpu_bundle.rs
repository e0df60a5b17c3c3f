//! `cargo xtask gpu-bundle`: everything a run on the GPU machine needs, in one
//! git-ignored folder (default `.gpu/`) that travels with the working tree.
//!
//! The GPU machine has no Rust toolchain and no network, so the bundle holds
//! release builds made here: the `minisgl` binary, the GPU test binaries and the
//! bench binaries (stripped, named without cargo's hash, packed in
//! `bin.tar.xz`: xz packs them to well under half of gzip's size), the AOT kernel library with its manifest, and `run.sh` (from
//! scripts/gpu/run.sh), which unpacks the binaries, runs the steps named in
//! `$MINISGL_GPU_STEPS` and writes logs under `$OUT`. The bundle must stay under
//! the 64 MiB the device tool carries (the tree travels too).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// Largest bundle accepted (the working tree and the bundle share 64 MiB).
const MAX_BUNDLE_BYTES: u64 = 40 << 20;

/// Test binaries (`package-file`) holding `gpu_*` tests whose file name does not
/// say so (their CPU twins share the file's helpers): the bundle takes them beside
/// the `*gpu*` binaries. tests/tidy.rs checks that every test file with a `gpu_`
/// test is named `gpu_*` or listed here.
const GPU_TESTS_ELSEWHERE: &[&str] = &["models-moe_fixtures", "minisgl-engine_structured"];

/// Builds the bundle into `out`.
pub fn run(out: PathBuf) -> Result<()> {
    let root = crate::workspace_root();
    let kernels_dir = root.join("target").join("kernels");
    // The bundle ships the library alone (see below), so the cubins are not built.
    crate::build_kernels(vec![kernel_build::aot::DEFAULT_ARCH.into()], Some(kernels_dir.clone()), None, false)?;

    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("removing {}", out.display()))?;
    }
    let bin_dir = out.join("bin");
    std::fs::create_dir_all(bin_dir.join("tests"))?;
    std::fs::create_dir_all(bin_dir.join("benches"))?;

    let binaries =
        executables(&root, &["build", "--release", "-p", "engine", "--bin", "minisgl", "--message-format=json"])?;
    let (_, minisgl) = binaries.first().context("cargo built no minisgl binary")?;
    copy_stripped(minisgl, &bin_dir.join("minisgl"))?;
    for (kind, args) in [
        ("tests", vec!["test", "--release", "--workspace", "--no-run", "--message-format=json"]),
        ("benches", vec!["bench", "--workspace", "--no-run", "--message-format=json"]),
    ] {
        for (name, exe) in executables(&root, &args)? {
            // Only what a GPU run uses travels: the GPU tests and the benches (unit
            // tests of libraries and binaries run in CI).
            let wanted = if kind == "tests" {
                name.contains("gpu") || GPU_TESTS_ELSEWHERE.contains(&name.as_str())
            } else {
                !name.ends_with("-lib") && !name.ends_with("-bin")
            };
            if wanted {
                copy_stripped(&exe, &bin_dir.join(kind).join(name))?;
            }
        }
    }
    // Binaries compress about threefold: they travel as one archive that run.sh unpacks.
    let status = Command::new("tar")
        .env("XZ_OPT", "-T0")
        .arg("cJf")
        .arg(out.join("bin.tar.xz"))
        .arg("-C")
        .arg(&out)
        .arg("bin")
        .status()?;
    if !status.success() {
        bail!("tar failed");
    }
    std::fs::remove_dir_all(&bin_dir)?;

    // The AOT kernels: library and manifest. The cubins stay behind: every AOT
    // instance is in the library, which the loader prefers.
    let kout = out.join("kernels");
    copy_tree(&kernels_dir, &kout, &|p: &Path| {
        let s = p.to_string_lossy();
        !(s.contains("/obj") || s.contains("/gen") || s.contains("/cubin") || s.ends_with(".stamp"))
    })?;
    std::fs::copy(root.join("scripts/gpu/run.sh"), out.join("run.sh"))?;
    // Test binaries find fixtures through their compile-time workspace path;
    // run.sh links that path to the checkout on the GPU machine.
    let built_at = root.canonicalize().unwrap_or(root.clone());
    std::fs::write(out.join("built_at"), built_at.display().to_string())?;

    let size = dir_size(&out)?;
    println!("bundle {}: {:.1} MiB", out.display(), size as f64 / (1 << 20) as f64);
    if size > MAX_BUNDLE_BYTES {
        bail!("the bundle is {size} bytes, over the {MAX_BUNDLE_BYTES}-byte budget");
    }
    Ok(())
}

fn cargo(root: &Path, args: &[&str]) -> Result<std::process::Output> {
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(args)
        .current_dir(root)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running cargo {}", args.join(" ")))?;
    if !out.status.success() {
        bail!("cargo {} failed", args.join(" "));
    }
    Ok(out)
}

/// Test or bench executables from cargo's JSON messages: (target name, path).
fn executables(root: &Path, args: &[&str]) -> Result<Vec<(String, PathBuf)>> {
    let out = cargo(root, args)?;
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let Some(exe) = msg.get("executable").and_then(|e| e.as_str()) else { continue };
        let target = msg.pointer("/target/name").and_then(|n| n.as_str()).unwrap_or("unknown");
        let krate = package_name(msg.pointer("/package_id").and_then(|n| n.as_str()).unwrap_or(""));
        let kinds: Vec<&str> = msg
            .pointer("/target/kind")
            .and_then(|k| k.as_array())
            .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
            .unwrap_or_default();
        // Unit tests of a library are named after their crate.
        let name = if kinds.contains(&"lib") {
            format!("{target}-lib")
        } else if kinds.contains(&"bin") {
            format!("{target}-bin")
        } else {
            format!("{krate}-{target}")
        };
        found.push((name, PathBuf::from(exe)));
    }
    Ok(found)
}

/// The package name in a cargo package id: `path+file:///dir#name@1.0` or
/// `path+file:///dir/name#1.0`.
fn package_name(id: &str) -> &str {
    let last = id.rsplit('/').next().unwrap_or("");
    match last.split_once('#') {
        Some((dir, rest)) => match rest.split_once('@') {
            Some((name, _version)) => name,
            None => dir,
        },
        None => last,
    }
}

fn copy_stripped(from: &Path, to: &Path) -> Result<()> {
    std::fs::copy(from, to).with_context(|| format!("copying {}", from.display()))?;
    let status = Command::new("strip").arg("--strip-debug").arg(to).status();
    if !matches!(status, Ok(s) if s.success()) {
        eprintln!("warning: could not strip {}", to.display());
    }
    Ok(())
}

fn copy_tree(from: &Path, to: &Path, keep: &dyn Fn(&Path) -> bool) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        let path = entry.path();
        if !keep(&path) {
            continue;
        }
        let dest = to.join(entry.file_name());
        if path.is_dir() {
            copy_tree(&path, &dest, keep)?;
        } else {
            std::fs::copy(&path, &dest)?;
        }
    }
    Ok(())
}

fn dir_size(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() { dir_size(&entry.path())? } else { meta.len() };
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    #[test]
    fn package_names_from_ids() {
        assert_eq!(super::package_name("path+file:///work/main#minisgl@0.1.0"), "minisgl");
        assert_eq!(super::package_name("path+file:///work/main/engine#0.1.0"), "engine");
        assert_eq!(super::package_name("registry+https://github.com/rust-lang/crates.io-index#serde@1.0.0"), "serde");
    }
}
