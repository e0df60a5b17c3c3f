//! `manifest.json`: what an ahead-of-time kernel build produced.
//!
//! Written by [`crate::aot::build`], read by kernel-runtime's loader. It names the
//! shared library and, for every family, its launcher symbols, its instances, the
//! cubins of JIT-able families and the SHA-256 of the inputs (sources, headers,
//! flags, archs, nvcc version) that the runtime recomputes to detect a stale
//! build.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The manifest format this version writes and reads.
pub const MANIFEST_FORMAT: u32 = 1;

/// The file name of the manifest inside a kernel output folder.
pub const MANIFEST_FILE: &str = "manifest.json";

/// The whole manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`MANIFEST_FORMAT`] of the writer.
    pub format_version: u32,
    /// `nvcc --version` release, e.g. `13.0.88`.
    pub nvcc_version: String,
    /// Real architectures built, e.g. `["sm_90"]`.
    pub archs: Vec<String>,
    /// Device compile flags (they enter every family hash).
    pub flags: Vec<String>,
    /// The shared library holding every family's launchers.
    pub library: Artifact,
    /// One entry per kernel family, in `kernels.toml` order.
    pub kernels: Vec<KernelEntry>,
}

/// A file produced by the build, relative to the manifest's folder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Artifact {
    pub path: String,
    pub sha256: String,
}

/// One kernel family as built.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelEntry {
    pub family: String,
    /// Source file relative to `csrc/`.
    pub file: String,
    /// SHA-256 of source + headers + flags (see [`crate::aot::hash_flags`]).
    pub hash: String,
    /// Host launchers exported by the library.
    pub symbols: Vec<String>,
    /// Kernel entry of a single-instance build, for JIT-able families.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jit_entry: Option<String>,
    /// Instances compiled into the library.
    pub instances: Vec<BTreeMap<String, i64>>,
    /// Per-instance cubins (JIT-able families only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cubins: Vec<Cubin>,
}

/// A single-instance cubin built ahead of time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cubin {
    pub arch: String,
    pub instance: BTreeMap<String, i64>,
    #[serde(flatten)]
    pub artifact: Artifact,
}

impl Manifest {
    /// Reads and parses `dir/manifest.json`, checking the format version.
    pub fn read(dir: &Path) -> Result<Manifest> {
        let path = dir.join(MANIFEST_FILE);
        let text = std::fs::read_to_string(&path).map_err(|source| Error::Io { path: path.clone(), source })?;
        let manifest: Manifest =
            serde_json::from_str(&text).map_err(|e| Error::Manifest { path: path.clone(), message: e.to_string() })?;
        if manifest.format_version != MANIFEST_FORMAT {
            return Err(Error::Manifest {
                path,
                message: format!(
                    "format version {} is not supported (this build reads {MANIFEST_FORMAT}); rebuild with `cargo xtask build-kernels`",
                    manifest.format_version
                ),
            });
        }
        Ok(manifest)
    }

    /// Writes `dir/manifest.json` atomically (temporary file + rename).
    pub fn write(&self, dir: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| Error::Manifest { path: dir.join(MANIFEST_FILE), message: e.to_string() })?;
        crate::files::write_atomic(&dir.join(MANIFEST_FILE), format!("{text}\n").as_bytes())
    }

    /// The entry of `family`.
    pub fn kernel(&self, family: &str) -> Option<&KernelEntry> {
        self.kernels.iter().find(|k| k.family == family)
    }
}
