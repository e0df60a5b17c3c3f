//! The minisgl cache folder, shared by the NVRTC kernel cache (`kernels/`) and
//! the models `minisgl pull` fetches (`models/`), so both follow one rule.
//!
//! What is read back from the cache is loaded into the GPU (cubins), so the
//! folders are private to the user: created 0700, and refused when another
//! user owns them (a folder planted in a shared `/tmp` by someone else).

use std::path::{Path, PathBuf};

/// `$MINISGL_CACHE_DIR`, else `$XDG_CACHE_HOME/minisgl`, else `~/.cache/minisgl`
/// (empty variables count as unset), else `minisgl-cache-<uid>` in the
/// temporary directory when not even `HOME` is set (the uid keeps users of one
/// machine apart; [`ensure_private_dir`] refuses one another user made).
pub fn minisgl_cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("MINISGL_CACHE_DIR").filter(|d| !d.is_empty()) {
        PathBuf::from(d)
    } else if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        PathBuf::from(d).join("minisgl")
    } else if let Some(h) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        PathBuf::from(h).join(".cache").join("minisgl")
    } else {
        std::env::temp_dir().join(format!("minisgl-cache-{}", current_uid()))
    }
}

/// The effective user id of this process (0 where there is none).
pub fn current_uid() -> u32 {
    #[cfg(unix)]
    {
        // SAFETY: geteuid has no preconditions and cannot fail.
        unsafe { libc::geteuid() }
    }
    #[cfg(not(unix))]
    0
}

/// Creates `dir` (and missing parents) with mode 0700, then checks that it is
/// a real folder owned by this user, narrowing its mode to 0700 if it had
/// been created wider.
pub fn ensure_private_dir(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
        let meta = std::fs::symlink_metadata(dir)?;
        if !meta.is_dir() {
            return Err(std::io::Error::other(format!("{} is not a folder (a symlink?)", dir.display())));
        }
        let uid = current_uid();
        if meta.uid() != uid {
            return Err(std::io::Error::other(format!(
                "{} belongs to uid {}, not to this user (uid {uid}); set MINISGL_CACHE_DIR to a folder of your own",
                dir.display(),
                meta.uid()
            )));
        }
        if meta.mode() & 0o077 != 0 {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
        Ok(())
    }
    #[cfg(not(unix))]
    std::fs::create_dir_all(dir)
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn private_dirs_are_0700_and_links_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b");
        ensure_private_dir(&dir).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        ensure_private_dir(&dir).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert!(ensure_private_dir(&link).is_err());
    }
}
