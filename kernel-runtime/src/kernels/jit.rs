//! Run-time compilation: NVRTC to a cubin for the device's exact arch, with an
//! on-disk cache.
//!
//! The cache key is the family hash (source + headers + NVRTC flags, the same
//! [`kernel_build::family_hash`] the AOT manifest uses) plus the NVRTC version, the
//! arch and the instance. Entries are written atomically (temporary file + rename),
//! carry a SHA-256 of their payload so a corrupt or truncated entry is detected and
//! rebuilt, and concurrent processes at worst both compile and both rename a valid
//! file into place. A line goes to stderr before every compile, so a user always
//! sees why a start is slow. Nothing here needs a GPU.

use std::ffi::{c_char, CStr, CString};
use std::path::{Path, PathBuf};

use cudarc::nvrtc::sys as nvrtc;
use kernel_build::{Family, Instance, KernelSources};

use crate::error::{Error, Result};

/// Magic line that starts every cache entry.
const ENTRY_MAGIC: &[u8] = b"MINISGL-CUBIN-1\n";

/// How a cubin was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Read from the disk cache.
    Hit,
    /// Compiled with NVRTC (no entry existed).
    Compiled,
    /// The entry was corrupt; compiled again and replaced.
    Rebuilt,
}

/// The NVRTC compiler with its on-disk cache folder.
#[derive(Debug, Clone)]
pub struct JitCache {
    dir: PathBuf,
}

/// The kernel cache folder: the `kernels/` subfolder of
/// [`minisgl_cache_dir`](crate::cache_dir::minisgl_cache_dir).
pub fn default_cache_dir() -> PathBuf {
    crate::cache_dir::minisgl_cache_dir().join("kernels")
}

/// Whether libnvrtc can be loaded.
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { nvrtc::is_culib_present() }
}

/// The NVRTC version as `major.minor`.
pub fn nvrtc_version() -> Result<String> {
    ensure_nvrtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC is present (checked above); the out-pointers are valid.
    let rc = unsafe { nvrtc::nvrtcVersion(&mut major, &mut minor) };
    check(rc, "nvrtcVersion")?;
    Ok(format!("{major}.{minor}"))
}

fn ensure_nvrtc() -> Result<()> {
    if nvrtc_present() {
        Ok(())
    } else {
        Err(Error::Nvrtc {
            what: "kernels".into(),
            message: "libnvrtc.so was not found: add CUDA's lib folder to LD_LIBRARY_PATH (or build the kernels ahead of time \
                      with `cargo xtask build-kernels`)"
                .into(),
        })
    }
}

fn check(rc: nvrtc::nvrtcResult, what: &str) -> Result<()> {
    if rc == nvrtc::nvrtcResult::NVRTC_SUCCESS {
        return Ok(());
    }
    // SAFETY: nvrtcGetErrorString returns a static C string for any code.
    let msg = unsafe { CStr::from_ptr(nvrtc::nvrtcGetErrorString(rc)) }.to_string_lossy().into_owned();
    Err(Error::Nvrtc { what: what.into(), message: msg })
}

/// The options NVRTC compiles an instance with (besides the arch).
pub fn nvrtc_flags() -> Vec<String> {
    kernel_build::aot::DEVICE_FLAGS.iter().filter(|f| f.starts_with("-std")).map(|f| (*f).to_owned()).collect()
}

impl JitCache {
    /// A cache in `dir` (created on first write).
    pub fn new(dir: impl Into<PathBuf>) -> JitCache {
        JitCache { dir: dir.into() }
    }

    /// The cache in [`default_cache_dir`].
    pub fn from_env() -> JitCache {
        JitCache::new(default_cache_dir())
    }

    /// The folder entries are stored in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The entry path of an instance.
    pub fn entry_path(
        &self,
        sources: &KernelSources,
        family: &Family,
        instance: &Instance,
        arch: &str,
    ) -> Result<PathBuf> {
        let mut flags = nvrtc_flags();
        flags.push(format!("nvrtc={}", nvrtc_version()?));
        flags.push(format!("arch={arch}"));
        flags.push(format!("instance={instance}"));
        let key = kernel_build::family_hash(sources, family, &flags)?;
        Ok(self.dir.join(format!("{}-{}-{arch}-{}.cubin", family.name, instance.tag(), &key[..20])))
    }

    /// The cubin of `instance` for `arch`: from the cache, else compiled with NVRTC
    /// and stored.
    pub fn get_or_compile(
        &self,
        sources: &KernelSources,
        family: &Family,
        instance: &Instance,
        arch: &str,
    ) -> Result<(Vec<u8>, CacheOutcome)> {
        let path = self.entry_path(sources, family, instance, arch)?;
        // Entries are loaded into the GPU: only from a folder of this user's.
        crate::cache_dir::ensure_private_dir(&self.dir)
            .map_err(|source| Error::Io { path: self.dir.clone(), source })?;
        let mut outcome = CacheOutcome::Compiled;
        match std::fs::read(&path) {
            Ok(bytes) => match decode_entry(&bytes) {
                Some(cubin) => return Ok((cubin.to_vec(), CacheOutcome::Hit)),
                None => {
                    eprintln!("minisgl: kernel cache entry {} is corrupt; rebuilding it", path.display());
                    outcome = CacheOutcome::Rebuilt;
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(Error::Io { path, source }),
        }
        eprintln!(
            "minisgl: compiling kernel {}[{instance}] for {arch} with NVRTC (not in the AOT build); cached at {}",
            family.name,
            path.display()
        );
        let cubin = compile(sources, family, instance, arch)?;
        kernel_build::write_atomic(&path, &encode_entry(&cubin))?;
        Ok((cubin, outcome))
    }
}

fn encode_entry(cubin: &[u8]) -> Vec<u8> {
    let mut out = ENTRY_MAGIC.to_vec();
    out.extend_from_slice(kernel_build::sources::sha256_hex(cubin).as_bytes());
    out.push(b'\n');
    out.extend_from_slice(cubin);
    out
}

fn decode_entry(bytes: &[u8]) -> Option<&[u8]> {
    let rest = bytes.strip_prefix(ENTRY_MAGIC)?;
    if rest.len() < 65 || rest[64] != b'\n' {
        return None;
    }
    let (hash, payload) = (&rest[..64], &rest[65..]);
    (!payload.is_empty() && kernel_build::sources::sha256_hex(payload).as_bytes() == hash).then_some(payload)
}

/// Compiles one instance with NVRTC into a cubin for `arch` (no cache).
pub fn compile(sources: &KernelSources, family: &Family, instance: &Instance, arch: &str) -> Result<Vec<u8>> {
    ensure_nvrtc()?;
    let what = format!("{}[{instance}] for {arch}", family.name);
    let nvrtc_err = |message: String| Error::Nvrtc { what: what.clone(), message };
    let source =
        sources.get(&family.source).ok_or_else(|| nvrtc_err(format!("source {} is not embedded", family.source)))?;
    let cstr = |s: &str| CString::new(s).map_err(|_| nvrtc_err(format!("{s:?} contains a NUL byte")));
    let src = cstr(source)?;
    let name = cstr(&family.source)?;
    let (header_names, header_texts): (Vec<&str>, Vec<&str>) = sources.headers().unzip();
    let header_names = header_names.into_iter().map(cstr).collect::<Result<Vec<_>>>()?;
    let header_texts = header_texts.into_iter().map(cstr).collect::<Result<Vec<_>>>()?;
    let name_ptrs: Vec<*const c_char> = header_names.iter().map(|c| c.as_ptr()).collect();
    let text_ptrs: Vec<*const c_char> = header_texts.iter().map(|c| c.as_ptr()).collect();

    let mut options = nvrtc_flags();
    options.push(format!("--gpu-architecture={arch}"));
    options.extend(instance.defines().iter().map(|d| format!("-D{d}")));
    let options = options.iter().map(|o| cstr(o)).collect::<Result<Vec<_>>>()?;
    let option_ptrs: Vec<*const c_char> = options.iter().map(|c| c.as_ptr()).collect();

    let mut prog: nvrtc::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: every pointer refers to a NUL-terminated string that outlives the
    // program (dropped after nvrtcDestroyProgram below); the counts match the arrays.
    unsafe {
        check(
            nvrtc::nvrtcCreateProgram(
                &mut prog,
                src.as_ptr(),
                name.as_ptr(),
                text_ptrs.len() as i32,
                text_ptrs.as_ptr(),
                name_ptrs.as_ptr(),
            ),
            "nvrtcCreateProgram",
        )?;
    }
    let result = (|| {
        // SAFETY: `prog` is a live program; the option strings outlive the call.
        let rc = unsafe { nvrtc::nvrtcCompileProgram(prog, option_ptrs.len() as i32, option_ptrs.as_ptr()) };
        if rc != nvrtc::nvrtcResult::NVRTC_SUCCESS {
            let log = program_log(prog).unwrap_or_default();
            let opts: Vec<String> = options.iter().map(|o| o.to_string_lossy().into_owned()).collect();
            return Err(nvrtc_err(format!("options {opts:?}\n{log}")));
        }
        let mut size = 0usize;
        // SAFETY: `prog` compiled successfully for a real arch, so it has a cubin.
        check(unsafe { nvrtc::nvrtcGetCUBINSize(prog, &mut size) }, "nvrtcGetCUBINSize")?;
        let mut cubin = vec![0u8; size];
        // SAFETY: `cubin` has the size NVRTC reported.
        check(unsafe { nvrtc::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast()) }, "nvrtcGetCUBIN")?;
        Ok(cubin)
    })();
    // SAFETY: `prog` was created above and is destroyed once.
    unsafe {
        nvrtc::nvrtcDestroyProgram(&mut prog);
    }
    result
}

fn program_log(prog: nvrtc::nvrtcProgram) -> Result<String> {
    let mut size = 0usize;
    // SAFETY: `prog` is a live program.
    check(unsafe { nvrtc::nvrtcGetProgramLogSize(prog, &mut size) }, "nvrtcGetProgramLogSize")?;
    let mut log = vec![0u8; size.max(1)];
    // SAFETY: `log` has the size NVRTC reported.
    check(unsafe { nvrtc::nvrtcGetProgramLog(prog, log.as_mut_ptr().cast()) }, "nvrtcGetProgramLog")?;
    Ok(String::from_utf8_lossy(&log).trim_end_matches('\0').to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_corruption_is_detected() {
        let payload = b"\x7fELF fake cubin".to_vec();
        let entry = encode_entry(&payload);
        assert_eq!(decode_entry(&entry), Some(payload.as_slice()));
        let mut flipped = entry.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert_eq!(decode_entry(&flipped), None);
        assert_eq!(decode_entry(&entry[..entry.len() - 3]), None);
        assert_eq!(decode_entry(b"garbage"), None);
        assert_eq!(decode_entry(&encode_entry(b"")), None);
    }
}
