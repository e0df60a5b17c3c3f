//! Files: [`write_atomic`] and the workspace's `csrc/` folder.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Writes `bytes` to `path` atomically: a temporary file in the same folder, then a
/// rename, so a reader (or a concurrent writer) never sees a partial file.
///
/// The temporary file is created exclusively (`O_CREAT | O_EXCL`) and with
/// `O_NOFOLLOW`, so a file or symlink planted at its name (in a shared or
/// hostile folder) is an error rather than something written through; the
/// rename replaces a link at `path` itself rather than following it. The file
/// and then the folder are synced, so the entry survives a crash once this
/// returns.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or_else(|| Path::new("."));
    std::fs::create_dir_all(dir).map_err(|source| Error::Io { path: dir.to_owned(), source })?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let unique = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let tmp = dir.join(format!(".{name}.{}.{unique}.tmp", std::process::id()));
    let mut created = false;
    let result = (|| {
        let mut f = exclusive_create(&tmp)?;
        created = true;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        sync_dir(dir)
    })();
    if let Err(source) = result {
        // Only remove what this call created: an existing file at the
        // temporary name is someone else's.
        if created {
            let _ = std::fs::remove_file(&tmp);
        }
        return Err(Error::Io { path: path.to_owned(), source });
    }
    Ok(())
}

#[cfg(unix)]
fn exclusive_create(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().write(true).create_new(true).custom_flags(libc::O_NOFOLLOW).open(path)
}

#[cfg(not(unix))]
fn exclusive_create(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new().write(true).create_new(true).open(path)
}

/// Makes a rename in `dir` durable (a no-op where folders cannot be opened).
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    std::fs::File::open(dir)?.sync_all()?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// The `csrc/` folder of this workspace (for tools run from the source tree).
pub fn workspace_csrc_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("csrc")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_atomic_replaces_and_never_follows_a_planted_link() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("entry.bin");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        #[cfg(unix)]
        {
            // A symlink at the entry's name is replaced, its target untouched.
            let target = tmp.path().join("target");
            std::fs::write(&target, b"keep").unwrap();
            let link = tmp.path().join("link.bin");
            std::os::unix::fs::symlink(&target, &link).unwrap();
            write_atomic(&link, b"new").unwrap();
            assert_eq!(std::fs::read(&target).unwrap(), b"keep");
            assert!(!std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
            // A link planted at a temporary name is refused, not written through.
            let planted = tmp.path().join("planted");
            std::os::unix::fs::symlink(&target, &planted).unwrap();
            let err = exclusive_create(&planted).unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::AlreadyExists);
            assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        }
        let names: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(!names.iter().any(|n| n.to_string_lossy().ends_with(".tmp")), "{names:?}");
    }
}
