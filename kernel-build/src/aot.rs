//! The ahead-of-time build: every family of `kernels.toml` through nvcc into one
//! shared library per arch set, plus one cubin per instance of the JIT-able
//! families, and `manifest.json` describing it all.
//!
//! Each object and cubin carries a stamp file with the hash of its inputs; an
//! unchanged input is not recompiled and an unchanged set of objects is not
//! relinked, so a second run does nothing. The build never asks the machine for
//! a GPU (no `nvidia-smi`), and never touches the network.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::files::write_atomic;
use crate::manifest::{Artifact, Cubin, KernelEntry, Manifest, MANIFEST_FORMAT};
use crate::sources::{family_hash, sha256_hex, KernelSources};
use crate::spec::{Family, Instance, Spec};

/// The architecture built when none is given: Hopper with its arch-specific
/// features (`wgmma`, `setmaxnreg`), which the H100/H200 run and nothing else does,
/// as it is with plain sm_90 machine code.
pub const DEFAULT_ARCH: &str = "sm_90a";

/// The architecture NVRTC compiles for on a device of real architecture `arch`:
/// the arch-specific target where the kernels use its instructions (sm_90 -> sm_90a),
/// the architecture itself elsewhere.
pub fn nvrtc_arch(arch: &str) -> String {
    if arch == "sm_90" {
        "sm_90a".to_owned()
    } else {
        arch.to_owned()
    }
}

/// Device compile flags shared by the library objects, the cubins and NVRTC.
pub const DEVICE_FLAGS: &[&str] = &["-std=c++20", "-O3"];

/// What to build and where.
#[derive(Debug, Clone)]
pub struct AotOptions {
    /// The `csrc/` folder holding `kernels.toml`.
    pub csrc_dir: PathBuf,
    /// Output folder (library, cubins, objects, manifest).
    pub out_dir: PathBuf,
    /// Real architectures, e.g. `["sm_90"]`.
    pub archs: Vec<String>,
    /// The nvcc to run; `None` searches `$CUDA_HOME/bin`, `$PATH`, `/usr/local/cuda/bin`.
    pub nvcc: Option<PathBuf>,
    /// Parallel nvcc processes.
    pub jobs: usize,
    /// Also one cubin per instance (loaded alone by `kernel-runtime` when the
    /// library cannot serve it). The GPU bundle ships only the library and skips
    /// them, which halves the compiles of a rebuild.
    pub cubins: bool,
}

/// What a build did.
#[derive(Debug, Clone, Default)]
pub struct AotReport {
    /// Objects and cubins compiled this run (empty when everything was up to date).
    pub compiled: Vec<String>,
    /// Whether the shared library was (re)linked.
    pub linked: bool,
    /// The manifest written.
    pub manifest: Option<Manifest>,
}

impl AotReport {
    /// Nothing was compiled or linked.
    pub fn up_to_date(&self) -> bool {
        self.compiled.is_empty() && !self.linked
    }
}

/// The flags that enter a family hash for an AOT build: the device flags, the archs
/// and the nvcc release. The runtime recomputes hashes from a manifest with this
/// same function to find a stale library.
pub fn hash_flags(flags: &[String], archs: &[String], nvcc_version: &str) -> Vec<String> {
    let mut out = flags.to_vec();
    out.extend(archs.iter().map(|a| format!("arch={a}")));
    out.push(format!("nvcc={nvcc_version}"));
    out
}

/// The library file name for an arch set: `libminisgl_kernels_sm_90.so`.
pub fn library_name(archs: &[String]) -> String {
    format!("libminisgl_kernels_{}.so", archs.join("-"))
}

/// Checks an architecture name (`sm_90`, `sm_90a`, `sm_80`, ...).
pub fn validate_arch(arch: &str) -> Result<()> {
    let ok = arch
        .strip_prefix("sm_")
        .map(|rest| {
            let digits = rest.trim_end_matches(['a', 'f']);
            digits.len() >= 2 && digits.chars().all(|c| c.is_ascii_digit()) && rest.len() - digits.len() <= 1
        })
        .unwrap_or(false);
    if ok {
        Ok(())
    } else {
        Err(Error::Arch(arch.to_owned()))
    }
}

fn gencode(arch: &str) -> String {
    let num = arch.trim_start_matches("sm_");
    format!("-gencode=arch=compute_{num},code=sm_{num}")
}

/// Finds nvcc: `$CUDA_HOME/bin/nvcc`, `$CUDA_PATH/bin/nvcc`, `nvcc` on `$PATH`,
/// `/usr/local/cuda/bin/nvcc`.
pub fn find_nvcc() -> Result<PathBuf> {
    let mut candidates = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(home) = std::env::var_os(var) {
            candidates.push(PathBuf::from(home).join("bin").join("nvcc"));
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("nvcc")));
    }
    candidates.push(PathBuf::from("/usr/local/cuda/bin/nvcc"));
    candidates.into_iter().find(|p| p.is_file()).ok_or(Error::NvccNotFound)
}

/// The release of an nvcc (`13.0.88`), from `nvcc --version`.
pub fn nvcc_version(nvcc: &Path) -> Result<String> {
    let out =
        Command::new(nvcc).arg("--version").output().map_err(|source| Error::Io { path: nvcc.to_owned(), source })?;
    let text = String::from_utf8_lossy(&out.stdout);
    // "Cuda compilation tools, release 13.0, V13.0.88"
    text.lines().find_map(|l| l.split(", V").nth(1).map(|v| v.trim().to_owned())).ok_or_else(|| Error::Compile {
        what: "nvcc --version".into(),
        command: format!("{} --version", nvcc.display()),
        output: format!("{text}{}", String::from_utf8_lossy(&out.stderr)),
    })
}

/// One compile step.
struct Job {
    /// What is built, for messages and the report (`store.o`, `store/sm_90/ROW_BYTES-64.cubin`).
    label: String,
    output: PathBuf,
    stamp: String,
    args: Vec<String>,
}

/// What [`build_with_progress`] reports while it runs, so that a front end
/// (xtask's progress bar) can show a long build moving.
#[derive(Debug, Clone, Copy)]
pub enum Progress<'a> {
    /// `total` objects and cubins are out of date and will be compiled now.
    Compiling { total: usize },
    /// One of them is done.
    Compiled { label: &'a str },
    /// The shared library is being linked.
    Linking { name: &'a str },
}

/// The instance list a cubin's compile sees: none (see `build_with_progress`).
const JIT_INSTANCES_INCLUDE: &str =
    "/* Generated by kernel-build: a cubin's compile, its JIT entry alone; do not edit. */\n#define MSGL_FOR_EACH_INSTANCE(X)\n";

/// Runs the AOT build described by `opts`.
pub fn build(opts: &AotOptions) -> Result<AotReport> {
    build_with_progress(opts, &|_| {})
}

/// [`build`], calling `progress` as each step starts or ends (from the worker
/// threads, hence `Sync`).
pub fn build_with_progress(opts: &AotOptions, progress: &(dyn Fn(Progress<'_>) + Sync)) -> Result<AotReport> {
    if opts.archs.is_empty() {
        return Err(Error::Arch(String::new()));
    }
    for a in &opts.archs {
        validate_arch(a)?;
    }
    let spec = Spec::load(&opts.csrc_dir)?;
    let sources = KernelSources::load(&opts.csrc_dir, &spec)?;
    let nvcc = match &opts.nvcc {
        Some(p) => p.clone(),
        None => find_nvcc()?,
    };
    let nvcc_version = nvcc_version(&nvcc)?;
    let flags: Vec<String> = DEVICE_FLAGS.iter().map(|s| (*s).to_owned()).collect();
    let hflags = hash_flags(&flags, &opts.archs, &nvcc_version);
    let out = &opts.out_dir;
    let include_dir = opts.csrc_dir.join(crate::sources::INCLUDE_DIR);
    let arch_tag = opts.archs.join("-");

    // A cubin holds its instance's JIT entry alone: its compile sees an empty
    // instance list (one file for every family), so that the AOT launchers' template
    // kernels (every instance of the family, instantiated by the launchers' dispatch)
    // are not compiled into each cubin too (81 kernels of ~100 s for one
    // decode_attention cubin). The list is in each cubin's stamp.
    let jit_gen_dir = out.join("gen-jit");
    std::fs::create_dir_all(&jit_gen_dir).map_err(|source| Error::Io { path: jit_gen_dir.clone(), source })?;
    write_if_changed(&jit_gen_dir.join("msgl_instances.inc"), JIT_INSTANCES_INCLUDE.as_bytes())?;
    let jit_list_hash = sha256_hex(JIT_INSTANCES_INCLUDE.as_bytes());

    let mut jobs = Vec::new();
    let mut entries = Vec::new();
    let mut objects = Vec::new();
    for family in &spec.families {
        let hash = family_hash(&sources, family, &hflags)?;
        let gen_dir = out.join("gen").join(&family.name);
        std::fs::create_dir_all(&gen_dir).map_err(|source| Error::Io { path: gen_dir.clone(), source })?;
        write_if_changed(&gen_dir.join("msgl_instances.inc"), family.instances_include().as_bytes())?;
        let common = |args: &mut Vec<String>, gen: &Path| {
            args.extend(flags.iter().cloned());
            args.push(format!("-I{}", include_dir.display()));
            args.push(format!("-I{}", gen.display()));
        };

        let obj = out.join("obj").join(&arch_tag).join(format!("{}.o", family.name));
        let mut args = vec!["-c".to_owned(), "-Xcompiler=-fPIC,-fvisibility=hidden".to_owned()];
        args.extend(opts.archs.iter().map(|a| gencode(a)));
        common(&mut args, &gen_dir);
        args.push(family.source_path(&opts.csrc_dir).display().to_string());
        args.push("-o".into());
        args.push(obj.display().to_string());
        // The object's launchers dispatch over the generated instance list, which
        // the family hash (sources, headers, flags) does not cover: stamp both, so
        // that adding an instance rebuilds the object and not only its cubin.
        let stamp = format!("{hash} {}", sha256_hex(family.instances_include().as_bytes()));
        jobs.push(Job { label: format!("{}.o", family.name), output: obj.clone(), stamp, args });
        objects.push(obj);

        let mut cubins = Vec::new();
        if opts.cubins && family.jit_entry.is_some() {
            for arch in &opts.archs {
                for inst in family.instances() {
                    let rel = format!("cubin/{}/{arch}/{}.cubin", family.name, inst.tag());
                    let path = out.join(&rel);
                    let mut args = vec!["-cubin".to_owned(), gencode(arch)];
                    common(&mut args, &jit_gen_dir);
                    args.extend(inst.defines().iter().map(|d| format!("-D{d}")));
                    args.push(family.source_path(&opts.csrc_dir).display().to_string());
                    args.push("-o".into());
                    args.push(path.display().to_string());
                    let stamp = format!("{hash} {arch} {inst} {jit_list_hash}");
                    jobs.push(Job { label: rel.clone(), output: path, stamp, args });
                    cubins.push((arch.clone(), inst, rel));
                }
            }
        }
        entries.push((family, hash, cubins));
    }

    let compiled = run_jobs(&nvcc, jobs, opts.jobs.max(1), progress)?;

    // Link when an object changed or the library (or its stamp) is missing.
    let lib_name = library_name(&opts.archs);
    let lib_path = out.join(&lib_name);
    let mut link_stamp = String::new();
    for o in &objects {
        link_stamp.push_str(&read_stamp(o).unwrap_or_default());
        link_stamp.push('\n');
    }
    let linked = if read_stamp(&lib_path).as_deref() != Some(link_stamp.as_str()) || !lib_path.is_file() {
        let mut args = vec!["-shared".to_owned(), "-cudart=static".to_owned()];
        args.extend(opts.archs.iter().map(|a| gencode(a)));
        args.extend(objects.iter().map(|o| o.display().to_string()));
        args.push("-o".into());
        args.push(lib_path.display().to_string());
        progress(Progress::Linking { name: &lib_name });
        run_nvcc(&nvcc, &lib_name, &args)?;
        write_stamp(&lib_path, &link_stamp)?;
        true
    } else {
        false
    };

    let library = Artifact { path: lib_name, sha256: file_sha256(&lib_path)? };
    let mut kernels = Vec::new();
    for (family, hash, cubins) in entries {
        let mut cubin_entries = Vec::new();
        for (arch, inst, rel) in cubins {
            cubin_entries.push(Cubin {
                arch,
                instance: inst.to_map(),
                artifact: Artifact { sha256: file_sha256(&out.join(&rel))?, path: rel },
            });
        }
        kernels.push(KernelEntry {
            family: family.name.clone(),
            file: family.source.clone(),
            hash,
            symbols: family.symbols.clone(),
            jit_entry: family.jit_entry.clone(),
            instances: family.instances().iter().map(Instance::to_map).collect(),
            cubins: cubin_entries,
        });
    }
    let manifest =
        Manifest { format_version: MANIFEST_FORMAT, nvcc_version, archs: opts.archs.clone(), flags, library, kernels };
    if Manifest::read(out).ok().as_ref() != Some(&manifest) {
        manifest.write(out)?;
    }
    Ok(AotReport { compiled, linked, manifest: Some(manifest) })
}

/// Runs the jobs whose stamp differs, `parallel` at a time; returns their labels.
fn run_jobs(
    nvcc: &Path,
    jobs: Vec<Job>,
    parallel: usize,
    progress: &(dyn Fn(Progress<'_>) + Sync),
) -> Result<Vec<String>> {
    let todo: Vec<Job> = jobs
        .into_iter()
        .filter(|j| !(j.output.is_file() && read_stamp(&j.output).as_deref() == Some(j.stamp.as_str())))
        .collect();
    if !todo.is_empty() {
        progress(Progress::Compiling { total: todo.len() });
    }
    let queue = Mutex::new(todo.iter());
    let done = Mutex::new(Vec::new());
    let failure: Mutex<Option<Error>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..parallel {
            s.spawn(|| loop {
                if failure.lock().map(|f| f.is_some()).unwrap_or(true) {
                    return;
                }
                let Some(job) = queue.lock().ok().and_then(|mut q| q.next()) else { return };
                let result = (|| {
                    if let Some(dir) = job.output.parent() {
                        std::fs::create_dir_all(dir).map_err(|source| Error::Io { path: dir.to_owned(), source })?;
                    }
                    run_nvcc(nvcc, &job.label, &job.args)?;
                    write_stamp(&job.output, &job.stamp)
                })();
                match result {
                    Ok(()) => {
                        progress(Progress::Compiled { label: &job.label });
                        if let Ok(mut d) = done.lock() {
                            d.push(job.label.clone());
                        }
                    }
                    Err(e) => {
                        if let Ok(mut f) = failure.lock() {
                            f.get_or_insert(e);
                        }
                        return;
                    }
                }
            });
        }
    });
    if let Some(e) = failure.into_inner().ok().flatten() {
        return Err(e);
    }
    let mut done = done.into_inner().unwrap_or_default();
    done.sort();
    Ok(done)
}

fn run_nvcc(nvcc: &Path, what: &str, args: &[String]) -> Result<()> {
    let command = format!("{} {}", nvcc.display(), args.join(" "));
    let out = Command::new(nvcc).args(args).output().map_err(|source| Error::Io { path: nvcc.to_owned(), source })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::Compile {
            what: what.to_owned(),
            command,
            output: format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
        })
    }
}

fn stamp_path(output: &Path) -> PathBuf {
    let mut name = output.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".stamp");
    output.with_file_name(name)
}

fn read_stamp(output: &Path) -> Option<String> {
    std::fs::read_to_string(stamp_path(output)).ok()
}

fn write_stamp(output: &Path, stamp: &str) -> Result<()> {
    write_atomic(&stamp_path(output), stamp.as_bytes())
}

fn write_if_changed(path: &Path, bytes: &[u8]) -> Result<()> {
    if std::fs::read(path).ok().as_deref() == Some(bytes) {
        return Ok(());
    }
    write_atomic(path, bytes)
}

fn file_sha256(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io { path: path.to_owned(), source })?;
    Ok(sha256_hex(&bytes))
}

/// The families whose source files are not in `spec`, and the spec sources that do
/// not exist: the tidy check between `kernels.toml` and `csrc/kernels/`.
pub fn spec_mismatches(csrc_dir: &Path, spec: &Spec) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    let listed: std::collections::BTreeSet<&str> = spec.sources().collect();
    let kernels_dir = csrc_dir.join("kernels");
    let mut on_disk = Vec::new();
    let entries = std::fs::read_dir(&kernels_dir).map_err(|source| Error::Io { path: kernels_dir.clone(), source })?;
    for entry in entries {
        let entry = entry.map_err(|source| Error::Io { path: kernels_dir.clone(), source })?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".cu") {
            on_disk.push(format!("kernels/{name}"));
        }
    }
    on_disk.sort();
    for f in &on_disk {
        if !listed.contains(f.as_str()) {
            problems.push(format!("csrc/{f} is not listed in csrc/kernels.toml"));
        }
    }
    for family in &spec.families {
        let path = family.source_path(csrc_dir);
        let Ok(text) = std::fs::read_to_string(&path) else {
            problems.push(format!("family `{}`: source csrc/{} does not exist", family.name, family.source));
            continue;
        };
        for symbol in &family.symbols {
            if !defines_extern_c(&text, symbol) {
                problems.push(format!(
                    "family `{}`: symbol `{symbol}` is not defined as extern \"C\" in csrc/{}",
                    family.name, family.source
                ));
            }
        }
        if let Some(entry) = &family.jit_entry {
            if !defines_extern_c(&text, entry) || !text.contains("__global__") {
                problems.push(format!(
                    "family `{}`: jit_entry `{entry}` is not an extern \"C\" __global__ in csrc/{}",
                    family.name, family.source
                ));
            }
        }
        problems.extend(undeclared_symbols(&text, family));
    }
    Ok(problems)
}

/// `extern "C" ... name(` appears in `text`.
fn defines_extern_c(text: &str, name: &str) -> bool {
    extern_c_declarations(text).iter().any(|d| d.contains(&format!(" {name}(")))
}

/// Every `extern "C"` declaration of `text`, its lines joined up to the one that
/// opens the body or ends the statement (`{` or `;`), so that a declaration
/// split after `__launch_bounds__(...)` still names its function.
fn extern_c_declarations(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate().filter(|(_, l)| l.contains("extern \"C\"")) {
        let mut decl = (*line).to_owned();
        for next in lines.iter().skip(i + 1).take(4) {
            if decl.contains('{') || decl.contains(';') {
                break;
            }
            decl.push(' ');
            decl.push_str(next);
        }
        out.push(decl);
    }
    out
}

/// `extern "C"` functions in a source that kernels.toml does not list.
fn undeclared_symbols(text: &str, family: &Family) -> Vec<String> {
    let mut out = Vec::new();
    for decl in extern_c_declarations(text) {
        for name in called_names(&decl) {
            let listed = family.symbols.iter().any(|s| s == name) || family.jit_entry.as_deref() == Some(name);
            if name.starts_with("msgl_") && !listed {
                out.push(format!(
                    "family `{}`: csrc/{} defines `{name}`, which kernels.toml does not list",
                    family.name, family.source
                ));
            }
        }
    }
    out
}

/// Identifiers directly followed by `(` in `line`.
fn called_names(line: &str) -> Vec<&str> {
    let mut names = Vec::new();
    let bytes = line.as_bytes();
    let mut start = None;
    for (i, &b) in bytes.iter().enumerate() {
        let ident = b.is_ascii_alphanumeric() || b == b'_';
        match (ident, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                if b == b'(' {
                    names.push(&line[s..i]);
                }
                start = None;
            }
            _ => {}
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extern_c_declarations_may_span_lines() {
        let text =
            "extern \"C\" __global__ void __launch_bounds__(256, 1)\n    msgl_k(const P p) {\n  msgl_other(p);\n}\n\
                    extern \"C\" int32_t msgl_launch(int a,\n                             int b);\n";
        assert!(defines_extern_c(text, "msgl_k"));
        assert!(defines_extern_c(text, "msgl_launch"));
        // A call in a body is not a declaration.
        assert!(!defines_extern_c(text, "msgl_other"));
    }

    #[test]
    fn arch_names() {
        for ok in ["sm_90", "sm_90a", "sm_80", "sm_100a", "sm_120f"] {
            validate_arch(ok).unwrap();
        }
        for bad in ["", "90", "sm_", "sm_9", "compute_90", "sm_90ab", "sm_9x"] {
            assert!(validate_arch(bad).is_err(), "{bad}");
        }
        assert_eq!(gencode("sm_90a"), "-gencode=arch=compute_90a,code=sm_90a");
        assert_eq!(nvrtc_arch("sm_90"), "sm_90a");
        assert_eq!(nvrtc_arch("sm_80"), "sm_80");
        assert_eq!(nvrtc_arch("sm_90a"), "sm_90a");
        assert_eq!(library_name(&["sm_80".into(), "sm_90".into()]), "libminisgl_kernels_sm_80-sm_90.so");
    }
}
