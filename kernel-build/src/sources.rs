//! The kernel sources as text, and the content hash that names a build of them.
//!
//! The same [`KernelSources`] is read from `csrc/` by the AOT build and from the
//! copies the runtime embeds at compile time, and [`family_hash`] is the one
//! function that turns sources + headers + flags into the SHA-256 written to the
//! manifest and used (with the NVRTC version, arch and instance) as the JIT cache
//! key. Equal hashes mean equal inputs, so a stale library is always noticed.

use std::collections::BTreeMap;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::spec::{Family, Spec};

/// Headers live under this folder of `csrc/`; every kernel may include any of them.
pub const INCLUDE_DIR: &str = "include";

/// Every file a kernel build reads: the family sources and all headers, keyed by
/// their path relative to `csrc/` (with `/` separators).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelSources {
    files: BTreeMap<String, String>,
}

impl KernelSources {
    /// Reads the sources of every family of `spec` and every header under
    /// `csrc/include/` from disk.
    pub fn load(csrc_dir: &Path, spec: &Spec) -> Result<KernelSources> {
        let mut files = BTreeMap::new();
        for rel in spec.sources() {
            let path = csrc_dir.join(rel);
            let text = std::fs::read_to_string(&path).map_err(|source| Error::Io { path, source })?;
            files.insert(rel.to_owned(), text);
        }
        for rel in header_paths(csrc_dir)? {
            let path = csrc_dir.join(&rel);
            let text = std::fs::read_to_string(&path).map_err(|source| Error::Io { path, source })?;
            files.insert(rel, text);
        }
        Ok(KernelSources { files })
    }

    /// Builds the set from `(relative path, text)` pairs (the runtime's embedded copy).
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> KernelSources {
        KernelSources { files: pairs.into_iter().map(|(p, t)| (p.to_owned(), t.to_owned())).collect() }
    }

    /// The text of `rel` (relative to `csrc/`).
    pub fn get(&self, rel: &str) -> Option<&str> {
        self.files.get(rel).map(String::as_str)
    }

    /// Headers as `(include name, text)`, the include name being the path below
    /// `csrc/include/` (`minisgl/tensor.h`), as a kernel writes it in `#include`.
    pub fn headers(&self) -> impl Iterator<Item = (&str, &str)> {
        let prefix = format!("{INCLUDE_DIR}/");
        self.files.iter().filter_map(move |(p, t)| p.strip_prefix(prefix.as_str()).map(|name| (name, t.as_str())))
    }
}

/// Relative paths (`include/minisgl/tensor.h`) of every file under `csrc/include/`,
/// sorted.
pub fn header_paths(csrc_dir: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let root = csrc_dir.join(INCLUDE_DIR);
    let mut stack = vec![root];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|source| Error::Io { path: dir.clone(), source })?;
        for entry in entries {
            let entry = entry.map_err(|source| Error::Io { path: dir.clone(), source })?;
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(rel) = path.strip_prefix(csrc_dir) {
                let rel: Vec<String> = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
                out.push(rel.join("/"));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// SHA-256 (hex) of a family's source, every header and the compile flags.
///
/// Every part is length-prefixed so that moving text between parts changes the
/// hash.
pub fn family_hash(sources: &KernelSources, family: &Family, flags: &[String]) -> Result<String> {
    let source = sources.get(&family.source).ok_or_else(|| Error::Spec {
        path: family.source.clone().into(),
        message: format!("family `{}`: source is missing", family.name),
    })?;
    let mut h = Sha256::new();
    let mut part = |tag: &str, bytes: &[u8]| {
        h.update(tag.as_bytes());
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    part("minisgl-kernel-hash-v1", b"");
    part("source-path", family.source.as_bytes());
    part("source", source.as_bytes());
    for (name, text) in sources.headers() {
        part("header-path", name.as_bytes());
        part("header", text.as_bytes());
    }
    for f in flags {
        part("flag", f.as_bytes());
    }
    Ok(hex::encode(h.finalize()))
}

/// SHA-256 (hex) of arbitrary bytes (artifacts in the manifest, cache entries).
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn family() -> Family {
        let spec = Spec::parse(
            "format = 1\n[[family]]\nname = \"a\"\nsource = \"kernels/a.cu\"\nsymbols = [\"msgl_a\"]",
            Path::new("k.toml"),
        )
        .unwrap();
        spec.families[0].clone()
    }

    #[test]
    fn hash_changes_with_source_headers_and_flags() {
        let f = family();
        let base = KernelSources::from_pairs([("kernels/a.cu", "x"), ("include/minisgl/t.h", "y")]);
        let h0 = family_hash(&base, &f, &["-O3".into()]).unwrap();
        assert_eq!(h0, family_hash(&base.clone(), &f, &["-O3".into()]).unwrap());
        let src = KernelSources::from_pairs([("kernels/a.cu", "x2"), ("include/minisgl/t.h", "y")]);
        let hdr = KernelSources::from_pairs([("kernels/a.cu", "x"), ("include/minisgl/t.h", "y2")]);
        let moved = KernelSources::from_pairs([("kernels/a.cu", "xy"), ("include/minisgl/t.h", "")]);
        for other in [
            family_hash(&src, &f, &["-O3".into()]).unwrap(),
            family_hash(&hdr, &f, &["-O3".into()]).unwrap(),
            family_hash(&moved, &f, &["-O3".into()]).unwrap(),
            family_hash(&base, &f, &["-O2".into()]).unwrap(),
        ] {
            assert_ne!(h0, other);
        }
        assert_eq!(base.headers().collect::<Vec<_>>(), [("minisgl/t.h", "y")]);
    }
}
