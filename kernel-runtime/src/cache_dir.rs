//! The minisgl cache folder, shared by the NVRTC kernel cache (`kernels/`) and
//! the models `minisgl pull` fetches (`models/`), so both follow one rule.

use std::path::PathBuf;

/// `$MINISGL_CACHE_DIR`, else `$XDG_CACHE_HOME/minisgl`, else `~/.cache/minisgl`
/// (empty variables count as unset), else a `minisgl-cache` folder in the
/// temporary directory when not even `HOME` is set.
pub fn minisgl_cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("MINISGL_CACHE_DIR").filter(|d| !d.is_empty()) {
        PathBuf::from(d)
    } else if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        PathBuf::from(d).join("minisgl")
    } else if let Some(h) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        PathBuf::from(h).join(".cache").join("minisgl")
    } else {
        std::env::temp_dir().join("minisgl-cache")
    }
}
