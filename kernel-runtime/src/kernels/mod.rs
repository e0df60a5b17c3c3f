//! Kernel loading: the AOT library (manifest + shared library through
//! libloading), AOT cubins, the NVRTC disk cache, and the mode that chooses.
//!
//! Load order for one instance of a family on one device:
//! 1. the shared library from the manifest, when it holds the instance, is fresh
//!    (its hash matches the embedded sources) and was built for the device's arch;
//! 2. an AOT cubin of the instance from the same manifest;
//! 3. the NVRTC disk cache, compiling on a miss.
//!
//! `MINISGL_KERNEL_MODE=aot` stops after step 2 and fails naming the instance;
//! `jit` skips steps 1 and 2; `auto` (the default) does all three. The manifest is
//! found in `$MINISGL_KERNELS`, else `kernels/` beside the executable, else the
//! default output of `cargo xtask build-kernels` (`target/kernels`).

pub mod jit;

use std::collections::{HashMap, HashSet};
use std::ffi::{c_void, CStr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{result, sys as cu};
use kernel_build::manifest::Manifest;
use kernel_build::{Family, Instance, KernelSources, Spec};

use crate::cuda::CudaDevice;
use crate::error::{Error, Result};
use crate::sys::kernels::KernelLibrary;

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/embedded.rs"));
}

/// Which loaders may supply a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelMode {
    /// AOT library and cubins only; a missing instance is an error.
    Aot,
    /// NVRTC (through the disk cache) only.
    Jit,
    /// AOT when available, NVRTC for the rest.
    Auto,
}

impl KernelMode {
    /// Reads `MINISGL_KERNEL_MODE` (default `auto`).
    pub fn from_env() -> Result<KernelMode> {
        match std::env::var("MINISGL_KERNEL_MODE") {
            Err(_) => Ok(KernelMode::Auto),
            Ok(v) => match v.trim() {
                "" | "auto" => Ok(KernelMode::Auto),
                "aot" => Ok(KernelMode::Aot),
                "jit" => Ok(KernelMode::Jit),
                other => Err(Error::KernelMode { value: other.to_owned() }),
            },
        }
    }
}

/// The shared library of an AOT build, checked against its manifest.
pub struct AotLibrary {
    /// The folder holding manifest.json.
    pub dir: PathBuf,
    pub manifest: Manifest,
    lib: KernelLibrary,
    /// Families whose manifest hash equals the hash of the embedded sources.
    fresh: HashSet<String>,
    /// Why other families are unusable (stale hash), for messages.
    stale: Vec<String>,
}

// SAFETY: KernelLibrary holds a libloading::Library and plain function pointers;
// the launchers are thread-safe C functions (the last error is thread-local).
unsafe impl Send for AotLibrary {}
// SAFETY: as above.
unsafe impl Sync for AotLibrary {}

/// `dir/rel` for a path the manifest names, which must stay inside `dir`:
/// relative, without `..` or a root (a manifest is data, not a way to load
/// any file on the machine).
pub fn confined(dir: &Path, rel: &str) -> Result<PathBuf> {
    use std::path::Component;
    let path = Path::new(rel);
    if rel.is_empty() || !path.components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir)) {
        return Err(Error::Library {
            path: dir.join(kernel_build::manifest::MANIFEST_FILE),
            message: format!("artifact path {rel:?} leaves the manifest's folder"),
        });
    }
    Ok(dir.join(path))
}

/// The path through which `file` (already open) is loaded: its descriptor in
/// `/proc/self/fd` on Linux, else `path` itself.
fn handle_path(file: &std::fs::File, path: &Path) -> PathBuf {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let fd_path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        if fd_path.exists() {
            return fd_path;
        }
    }
    let _ = file;
    path.to_owned()
}

impl AotLibrary {
    /// Opens `dir/manifest.json` and its library, checking the format version, the
    /// library's SHA-256, the ABI version, every listed symbol and every family hash.
    pub fn open(dir: &Path, spec: &Spec, sources: &KernelSources) -> Result<AotLibrary> {
        let manifest = Manifest::read(dir)?;
        let lib_path = confined(dir, &manifest.library.path)?;
        for k in &manifest.kernels {
            for c in &k.cubins {
                confined(dir, &c.artifact.path)?;
            }
        }
        // Hash and load the same file: read it through one handle and dlopen
        // that handle (`/proc/self/fd/N`), so the file cannot be swapped
        // between the check and the load.
        let mut file = std::fs::File::open(&lib_path).map_err(|source| Error::Io { path: lib_path.clone(), source })?;
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut file, &mut bytes)
            .map_err(|source| Error::Io { path: lib_path.clone(), source })?;
        if kernel_build::sources::sha256_hex(&bytes) != manifest.library.sha256 {
            return Err(Error::Library {
                path: lib_path,
                message: format!(
                    "SHA-256 differs from {}; rebuild with `cargo xtask build-kernels`",
                    dir.join("manifest.json").display()
                ),
            });
        }
        // Check every symbol by name first, for a message that names the missing one.
        // SAFETY: loading the library runs its initialisers: a CUDA library built by
        // our own toolchain, whose initialisers only register fatbins.
        let raw = unsafe { libloading::Library::new(handle_path(&file, &lib_path)) }
            .map_err(|e| Error::Library { path: lib_path.clone(), message: format!("cannot be loaded: {e}") })?;
        drop(file);
        for k in &manifest.kernels {
            for s in &k.symbols {
                // SAFETY: only the address is looked up; nothing is called.
                if unsafe { raw.get::<*const c_void>(s.as_bytes()) }.is_err() {
                    return Err(Error::Library {
                        path: lib_path,
                        message: format!("symbol `{s}` (family `{}`) is missing", k.family),
                    });
                }
            }
        }
        // SAFETY: every launcher declared in tensor.h resolves (checked by name above
        // for the manifest's list; from_library fails on any other missing one).
        let lib = unsafe { KernelLibrary::from_library(raw) }
            .map_err(|e| Error::Library { path: lib_path.clone(), message: e.to_string() })?;
        // SAFETY: a plain C function returning an integer.
        let abi = unsafe { lib.msgl_abi_version() };
        if abi != crate::sys::kernels::MSGL_ABI_VERSION as i32 {
            return Err(Error::Library {
                path: lib_path,
                message: format!(
                    "ABI version {abi}, this build expects {}; rebuild with `cargo xtask build-kernels`",
                    crate::sys::kernels::MSGL_ABI_VERSION
                ),
            });
        }
        let flags = kernel_build::aot::hash_flags(&manifest.flags, &manifest.archs, &manifest.nvcc_version);
        let mut fresh = HashSet::new();
        let mut stale = Vec::new();
        for family in &spec.families {
            match manifest.kernel(&family.name) {
                Some(entry) if entry.hash == kernel_build::family_hash(sources, family, &flags)? => {
                    fresh.insert(family.name.clone());
                }
                Some(_) => stale.push(format!("{} (sources changed since the build)", family.name)),
                None => stale.push(format!("{} (not in the manifest)", family.name)),
            }
        }
        Ok(AotLibrary { dir: dir.to_owned(), manifest, lib, fresh, stale })
    }

    /// The launchers.
    pub fn launchers(&self) -> &KernelLibrary {
        &self.lib
    }

    /// Families that cannot be used because the build is stale for them.
    pub fn stale_families(&self) -> &[String] {
        &self.stale
    }

    /// Whether the library was built for `arch` (an `sm_90a` build serves `sm_90`).
    pub fn supports_arch(&self, arch: &str) -> bool {
        self.manifest.archs.iter().any(|a| a.trim_end_matches(['a', 'f']) == arch)
    }

    fn has_instance(&self, family: &Family, instance: &Instance) -> bool {
        self.fresh.contains(&family.name)
            && self
                .manifest
                .kernel(&family.name)
                .is_some_and(|k| k.instances.iter().any(|m| Instance::from_map(family, m).as_ref() == Some(instance)))
    }

    /// Reads the AOT cubin at `path` (one the manifest lists) and checks it
    /// against the manifest's SHA-256, so a replaced or corrupt cubin is an
    /// error naming it rather than code loaded into the GPU.
    pub fn read_cubin(&self, path: &Path) -> Result<Vec<u8>> {
        let expected = self
            .manifest
            .kernels
            .iter()
            .flat_map(|k| &k.cubins)
            .find(|c| self.dir.join(&c.artifact.path) == path)
            .map(|c| c.artifact.sha256.as_str());
        let image = std::fs::read(path).map_err(|source| Error::Io { path: path.to_owned(), source })?;
        if expected != Some(kernel_build::sources::sha256_hex(&image).as_str()) {
            return Err(Error::Library {
                path: path.to_owned(),
                message: "SHA-256 differs from the manifest's (or the manifest does not list it); rebuild with \
                          `cargo xtask build-kernels`"
                    .into(),
            });
        }
        Ok(image)
    }

    /// Every AOT cubin the manifest lists, as paths.
    pub fn cubin_paths(&self) -> Vec<PathBuf> {
        self.manifest.kernels.iter().flat_map(|k| &k.cubins).map(|c| self.dir.join(&c.artifact.path)).collect()
    }

    fn cubin_path(&self, family: &Family, instance: &Instance, arch: &str) -> Option<PathBuf> {
        if !self.fresh.contains(&family.name) {
            return None;
        }
        let entry = self.manifest.kernel(&family.name)?;
        entry
            .cubins
            .iter()
            .find(|c| {
                c.arch.trim_end_matches(['a', 'f']) == arch
                    && Instance::from_map(family, &c.instance).as_ref() == Some(instance)
            })
            .map(|c| self.dir.join(&c.artifact.path))
    }

    /// The message of the last failed launcher call on this thread.
    pub fn last_error(&self) -> String {
        // SAFETY: returns a pointer to a NUL-terminated thread-local buffer.
        unsafe { CStr::from_ptr(self.lib.msgl_last_error()) }.to_string_lossy().into_owned()
    }
}

/// Everything the loaders need, built once per process.
pub struct Registry {
    pub mode: KernelMode,
    pub spec: Spec,
    pub sources: KernelSources,
    aot: Option<AotLibrary>,
    /// Why there is no usable AOT library (for messages).
    aot_problem: Option<String>,
    pub jit: jit::JitCache,
}

static REGISTRY: OnceLock<std::result::Result<Registry, String>> = OnceLock::new();

/// The embedded kernel spec and sources (no GPU, no files needed).
pub fn embedded() -> Result<(Spec, KernelSources)> {
    let spec = Spec::parse(embedded::KERNELS_TOML, Path::new("csrc/kernels.toml"))?;
    Ok((spec, KernelSources::from_pairs(embedded::SOURCES.iter().copied())))
}

/// Folders searched for manifest.json, in order.
pub fn manifest_search_path() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("MINISGL_KERNELS").filter(|d| !d.is_empty()) {
        dirs.push(PathBuf::from(d));
        return dirs;
    }
    if let Some(exe_dir) = std::env::current_exe().ok().and_then(|p| p.parent().map(Path::to_owned)) {
        dirs.push(exe_dir.join("kernels"));
    }
    dirs.push(PathBuf::from(embedded::DEFAULT_KERNELS_DIR));
    dirs
}

/// Where one instance will come from on one arch (decided without a GPU).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// The AOT library's C launcher.
    Library,
    /// An AOT cubin at this path.
    AotCubin(PathBuf),
    /// The NVRTC disk cache (compiling on a miss).
    Jit,
}

impl Registry {
    /// A registry with an explicit mode, manifest folder search path and cache.
    ///
    /// A manifest that fails its checks is an error when it was asked for
    /// explicitly (`explicit`, e.g. `$MINISGL_KERNELS`) or in aot mode; otherwise it
    /// is ignored with a message and the kernels are compiled at run time.
    pub fn new(mode: KernelMode, manifest_dirs: &[PathBuf], explicit: bool, jit: jit::JitCache) -> Result<Registry> {
        let (spec, sources) = embedded()?;
        let (mut aot, mut aot_problem) = (None, None);
        if mode != KernelMode::Jit {
            match manifest_dirs.iter().find(|d| d.join(kernel_build::manifest::MANIFEST_FILE).is_file()) {
                Some(dir) => match AotLibrary::open(dir, &spec, &sources) {
                    Ok(lib) => {
                        if !lib.stale.is_empty() {
                            eprintln!(
                                "minisgl: the AOT kernels in {} are stale for: {} ({})",
                                dir.display(),
                                lib.stale.join(", "),
                                if mode == KernelMode::Aot {
                                    "they will fail in aot mode"
                                } else {
                                    "they will be compiled at run time"
                                }
                            );
                        }
                        aot = Some(lib);
                    }
                    Err(e) if explicit || mode == KernelMode::Aot => return Err(e),
                    Err(e) => {
                        eprintln!("minisgl: ignoring the AOT kernels: {e}");
                        aot_problem = Some(e.to_string());
                    }
                },
                None => {
                    let where_: Vec<String> = manifest_dirs.iter().map(|d| d.display().to_string()).collect();
                    aot_problem = Some(format!("no manifest.json in {}", where_.join(", ")));
                }
            }
        }
        Ok(Registry { mode, spec, sources, aot, aot_problem, jit })
    }

    /// The process-wide registry, configured from the environment
    /// (`MINISGL_KERNEL_MODE`, `MINISGL_KERNELS`, `MINISGL_CACHE_DIR`).
    pub fn get() -> Result<&'static Registry> {
        REGISTRY
            .get_or_init(|| {
                let explicit = std::env::var_os("MINISGL_KERNELS").is_some_and(|d| !d.is_empty());
                KernelMode::from_env()
                    .and_then(|mode| Registry::new(mode, &manifest_search_path(), explicit, jit::JitCache::from_env()))
                    .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| Error::Registry(e.clone()))
    }

    /// The AOT library, when one was found.
    pub fn aot(&self) -> Option<&AotLibrary> {
        self.aot.as_ref()
    }

    /// The family called `name` (a bug if missing: launchers name their family).
    pub fn family(&self, name: &str) -> Result<&Family> {
        self.spec.family(name).ok_or_else(|| Error::UnknownFamily { family: name.to_owned() })
    }

    /// Decides where `family[instance]` comes from on `arch` (see the module docs);
    /// in aot mode a missing instance is [`Error::MissingInstance`].
    pub fn plan(&self, family_name: &str, instance: &Instance, arch: &str) -> Result<Plan> {
        let family = self.family(family_name)?;
        if self.mode != KernelMode::Jit {
            if let Some(aot) = self.aot.as_ref().filter(|a| a.supports_arch(arch)) {
                if aot.has_instance(family, instance) {
                    return Ok(Plan::Library);
                }
                if let Some(path) = aot.cubin_path(family, instance, arch) {
                    return Ok(Plan::AotCubin(path));
                }
            }
        }
        if self.mode == KernelMode::Aot {
            let detail = match (&self.aot, &self.aot_problem) {
                (Some(a), _) if !a.supports_arch(arch) => {
                    format!(" for {arch} (built for {})", a.manifest.archs.join(","))
                }
                (Some(a), _) if a.stale.iter().any(|s| s.starts_with(family_name)) => {
                    " (the build is stale for this family)".into()
                }
                (None, Some(p)) => format!(" ({p})"),
                _ => String::new(),
            };
            return Err(Error::MissingInstance { family: family_name.into(), instance: instance.to_string(), detail });
        }
        if family.jit_entry.is_none() {
            return Err(Error::NotCompilable { family: family_name.to_owned(), instance: instance.to_string() });
        }
        Ok(Plan::Jit)
    }
}

/// A kernel function loaded into a device's context from a cubin.
pub struct LoadedFunction {
    module: cu::CUmodule,
    function: cu::CUfunction,
    /// Where it came from (`aot cubin`, `nvrtc cache`, ...), for logs and tests.
    pub origin: &'static str,
}

// SAFETY: CUmodule/CUfunction are driver handles usable from any thread once the
// owning context is current (launch sites bind the context first).
unsafe impl Send for LoadedFunction {}
// SAFETY: as above.
unsafe impl Sync for LoadedFunction {}

impl Drop for LoadedFunction {
    fn drop(&mut self) {
        // SAFETY: the module was loaded by `load_cubin` and is unloaded once.
        unsafe {
            let _ = result::module::unload(self.module);
        }
    }
}

impl LoadedFunction {
    /// Lets launches use up to `bytes` of dynamic shared memory (above the default
    /// 48 KiB a kernel gets without opting in). See the
    /// [cuFuncSetAttribute docs](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html).
    pub fn set_max_dynamic_shared_bytes(&self, device: &CudaDevice, bytes: u32) -> Result<()> {
        device.bind()?;
        let bytes = i32::try_from(bytes).map_err(|_| Error::SharedMemory { bytes })?;
        // SAFETY: `function` is a live handle of this device's context (bound above).
        unsafe {
            result::function::set_function_attribute(
                self.function,
                cu::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes,
            )
        }
        .map_err(Error::driver(format!("allowing {bytes} bytes of dynamic shared memory ({})", self.origin)))
    }

    /// Enqueues the kernel with one by-value parameter struct `params`.
    ///
    /// # Safety
    /// `P` must be the exact parameter type of the kernel entry, and every pointer in
    /// it must refer to live device memory the kernel may access as it does.
    pub unsafe fn launch<P>(
        &self,
        device: &CudaDevice,
        grid: u32,
        block: u32,
        shared_bytes: u32,
        params: &P,
    ) -> Result<()> {
        device.bind()?;
        let mut args = [params as *const P as *mut c_void];
        result::launch_kernel(
            self.function,
            (grid.max(1), 1, 1),
            (block, 1, 1),
            shared_bytes,
            device.cu_stream(),
            &mut args,
        )
        .map_err(Error::driver("launching a kernel"))
    }
}

fn load_cubin(device: &CudaDevice, image: &[u8], entry: &str, origin: &'static str) -> Result<LoadedFunction> {
    device.bind()?;
    // cuModuleLoadData wants the image to stay valid only during the call, but
    // requires it to be suitably aligned: copy into an aligned buffer.
    let mut aligned = vec![0u64; image.len().div_ceil(8) + 1];
    bytemuck::cast_slice_mut::<u64, u8>(&mut aligned)[..image.len()].copy_from_slice(image);
    // SAFETY: `aligned` holds a complete cubin image for the duration of the call.
    let module = unsafe { result::module::load_data(aligned.as_ptr().cast()) }
        .map_err(Error::driver(format!("loading the module of `{entry}` ({origin})")))?;
    let name = std::ffi::CString::new(entry).map_err(|_| Error::EntryName { entry: entry.to_owned() })?;
    // SAFETY: `module` is live; `name` is NUL-terminated.
    match unsafe { result::module::get_function(module, name) } {
        Ok(function) => Ok(LoadedFunction { module, function, origin }),
        Err(e) => {
            // SAFETY: unloading the module just loaded.
            unsafe {
                let _ = result::module::unload(module);
            }
            Err(Error::Driver { what: format!("finding `{entry}` in its module ({origin})"), source: e })
        }
    }
}

/// How a launcher should run one instance on one device.
pub enum Resolved {
    /// Through the AOT library's C launcher.
    Library(&'static AotLibrary),
    /// Through a loaded function (AOT cubin or NVRTC), launched from Rust.
    Function(Arc<LoadedFunction>),
}

/// Kernel functions loaded from cubins (AOT or NVRTC), by device ordinal, family
/// and instance. They live as long as the process, like the devices themselves;
/// kept here rather than in `CudaDevice`, which sits below this module.
type FunctionTable = Mutex<HashMap<(usize, String, Instance), Arc<LoadedFunction>>>;

fn loaded_functions() -> &'static FunctionTable {
    static FUNCTIONS: OnceLock<FunctionTable> = OnceLock::new();
    FUNCTIONS.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Chooses the loader for `family[instance]` on `device` and loads it.
pub fn resolve(device: &CudaDevice, family_name: &str, instance: &Instance) -> Result<Resolved> {
    let reg = Registry::get()?;
    let plan = reg.plan(family_name, instance, &device.arch())?;
    if plan == Plan::Library {
        if let Some(aot) = reg.aot.as_ref() {
            return Ok(Resolved::Library(aot));
        }
    }
    let key = (device.ordinal(), family_name.to_owned(), instance.clone());
    if let Some(f) = loaded_functions().lock().ok().and_then(|m| m.get(&key).cloned()) {
        return Ok(Resolved::Function(f));
    }
    let family = reg.family(family_name)?;
    let entry = family.jit_entry.as_deref().ok_or_else(|| Error::NoJitEntry { family: family_name.to_owned() })?;
    let loaded = match plan {
        Plan::AotCubin(path) => {
            let aot = reg.aot.as_ref().ok_or_else(|| Error::Library {
                path: path.clone(),
                message: "an AOT cubin was planned without an AOT library".into(),
            })?;
            let image = aot.read_cubin(&path)?;
            load_cubin(device, &image, entry, "aot cubin")?
        }
        _ => {
            let arch = kernel_build::aot::nvrtc_arch(&device.arch());
            let (cubin, _) = reg.jit.get_or_compile(&reg.sources, family, instance, &arch)?;
            load_cubin(device, &cubin, entry, "nvrtc")?
        }
    };
    let f = Arc::new(loaded);
    if let Ok(mut m) = loaded_functions().lock() {
        m.insert(key, f.clone());
    }
    Ok(Resolved::Function(f))
}

/// Turns a launcher status into a Result, with the library's message.
pub(crate) fn check_status(lib: &AotLibrary, op: &'static str, status: i32) -> Result<()> {
    if status == crate::sys::kernels::MSGL_OK as i32 {
        Ok(())
    } else {
        Err(Error::Launch { op, message: lib.last_error() })
    }
}
