//! Compiling the kernel sources with NVRTC: machine code (a cubin) for one architecture, not
//! PTX that an older driver might fail to load, cached on disk under a key made of the source
//! digest, the architecture and the NVRTC version, so each process compiles at most once per
//! change.
//!
//! NVRTC needs no GPU: CI compiles every source for `sm_90` with the NVRTC of the PyPI wheel
//! `nvidia-cuda-nvrtc==13.0.88`, so a kernel that does not compile fails there.

use std::ffi::{c_char, CStr, CString};
use std::mem::MaybeUninit;
use std::path::PathBuf;

use cudarc::nvrtc::sys;

use super::sources::{Source, COMMON, COMMON_NAME};
use super::{GpuError, Result};

/// Whether the NVRTC library can be loaded.
pub fn available() -> bool {
    // SAFETY: only tries to open the library.
    unsafe { sys::is_culib_present() }
}

fn missing() -> GpuError {
    GpuError::Unavailable(
        "NVRTC (libnvrtc.so.13) could not be loaded: put the CUDA 13 toolkit's lib64 folder (or \
         the nvidia-cuda-nvrtc wheel's lib folder) on LD_LIBRARY_PATH"
            .into(),
    )
}

/// NVRTC's (major, minor) version.
pub fn version() -> Result<(i32, i32)> {
    if !available() {
        return Err(missing());
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: writes two ints.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| GpuError::Unavailable(format!("NVRTC does not answer: {e:?}")))?;
    Ok((major, minor))
}

/// The options every source is compiled with, for `arch` (e.g. `sm_90`).
pub fn options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        "--fmad=true".into(),
    ]
}

struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by nvrtcCreateProgram and destroyed once.
        unsafe {
            let _ = sys::nvrtcDestroyProgram(&mut self.0);
        }
    }
}

fn cstring(s: &str, what: &str) -> Result<CString> {
    CString::new(s).map_err(|_| GpuError::Invalid(format!("{what} contains a NUL byte")))
}

/// Compile one source to a cubin for `arch`.
pub fn compile(src: &Source, arch: &str) -> Result<Vec<u8>> {
    compile_with_log(src, arch, &[]).map(|(image, _)| image)
}

/// [`compile`] with `extra` options after the usual ones, also returning NVRTC's program log
/// (with `--ptxas-options=-v` it holds each kernel's registers, stack and spills).
pub fn compile_with_log(src: &Source, arch: &str, extra: &[&str]) -> Result<(Vec<u8>, String)> {
    if !available() {
        return Err(missing());
    }
    let fail = |log: String| GpuError::Compile {
        file: src.file.to_string(),
        arch: arch.to_string(),
        log,
    };
    let code = cstring(src.code, src.file)?;
    let name = cstring(src.file, "a file name")?;
    let header = cstring(COMMON, COMMON_NAME)?;
    let header_name = cstring(COMMON_NAME, "a file name")?;
    let headers = [header.as_ptr()];
    let include_names = [header_name.as_ptr()];
    let mut raw = MaybeUninit::uninit();
    // SAFETY: every string outlives the program (they live to the end of this function, and the
    // program is dropped before them).
    unsafe {
        sys::nvrtcCreateProgram(
            raw.as_mut_ptr(),
            code.as_ptr(),
            name.as_ptr(),
            1,
            headers.as_ptr(),
            include_names.as_ptr(),
        )
    }
    .result()
    .map_err(|e| fail(format!("nvrtcCreateProgram: {e:?}")))?;
    // SAFETY: initialised by the successful call above.
    let prog = Program(unsafe { raw.assume_init() });
    let opts: Vec<CString> = options(arch)
        .iter()
        .map(String::as_str)
        .chain(extra.iter().copied())
        .map(|o| cstring(o, "an option"))
        .collect::<Result<_>>()?;
    let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    // SAFETY: the options outlive the call.
    let rc = unsafe { sys::nvrtcCompileProgram(prog.0, opt_ptrs.len() as i32, opt_ptrs.as_ptr()) };
    let log = program_log(&prog);
    if rc.result().is_err() {
        return Err(fail(format!("{rc:?}\n{log}")));
    }
    if !log.trim().is_empty() {
        tracing::debug!(file = src.file, arch, "NVRTC: {}", log.trim());
    }
    let mut size = 0usize;
    // SAFETY: the program compiled; NVRTC writes the size, then that many bytes.
    unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut size) }
        .result()
        .map_err(|e| fail(format!("nvrtcGetCUBINSize: {e:?}")))?;
    let mut image = vec![0u8; size];
    // SAFETY: `image` has the size NVRTC asked for.
    unsafe { sys::nvrtcGetCUBIN(prog.0, image.as_mut_ptr().cast()) }
        .result()
        .map_err(|e| fail(format!("nvrtcGetCUBIN: {e:?}")))?;
    if !is_elf(&image) {
        return Err(fail(
            "NVRTC returned no machine code (is the architecture a real sm_XX?)".into(),
        ));
    }
    Ok((image, log))
}

fn program_log(prog: &Program) -> String {
    let mut size = 0usize;
    // SAFETY: the program exists; NVRTC writes the size, then that many bytes.
    unsafe {
        if sys::nvrtcGetProgramLogSize(prog.0, &mut size)
            .result()
            .is_err()
            || size == 0
        {
            return String::new();
        }
        let mut buf = vec![0 as c_char; size];
        if sys::nvrtcGetProgramLog(prog.0, buf.as_mut_ptr())
            .result()
            .is_err()
        {
            return String::new();
        }
        CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned()
    }
}

/// Whether `image` is machine code (an ELF file) rather than PTX or a damaged file.
pub fn is_elf(image: &[u8]) -> bool {
    image.starts_with(b"\x7fELF")
}

/// Where compiled kernels are kept: `$GATEWAY_KERNEL_CACHE` (empty: no cache), else
/// `$XDG_CACHE_HOME/gateway/kernels`, else `~/.cache/gateway/kernels`.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(v) = std::env::var_os("GATEWAY_KERNEL_CACHE") {
        return (!v.is_empty()).then(|| PathBuf::from(v));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("gateway").join("kernels"))
}

/// The cubin of `src` for `arch`: from the disk cache when an entry with the same key exists,
/// else compiled now (and stored). The flag says whether it came from the cache.
pub fn compile_cached(src: &Source, arch: &str) -> Result<(Vec<u8>, bool)> {
    compile_cached_in(src, arch, cache_dir().as_deref())
}

/// The file name of `src`'s cubin for `arch` in the cache: the source's stem, the digest of
/// everything that decides the code, the architecture and this NVRTC's version.
pub fn cache_key(src: &Source, arch: &str) -> Result<String> {
    let (major, minor) = version()?;
    let stem = src.file.trim_end_matches(".cu");
    Ok(format!(
        "{stem}-{}-{arch}-nvrtc{major}.{minor}.cubin",
        src.digest(&options(arch))
    ))
}

/// [`compile_cached`] with the cache in `dir` (`None`: no cache).
pub fn compile_cached_in(
    src: &Source,
    arch: &str,
    dir: Option<&std::path::Path>,
) -> Result<(Vec<u8>, bool)> {
    let key = cache_key(src, arch)?;
    if let Some(dir) = dir {
        if let Ok(image) = std::fs::read(dir.join(&key)) {
            if is_elf(&image) {
                return Ok((image, true));
            }
        }
    }
    let image = compile(src, arch)?;
    if let Some(dir) = dir {
        if let Err(e) = store(dir, &key, &image) {
            tracing::warn!(dir = %dir.display(), "cannot cache compiled kernels: {e}");
        }
    }
    Ok((image, false))
}

fn store(dir: &std::path::Path, key: &str, image: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!("{key}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, image)?;
    std::fs::rename(&tmp, dir.join(key))
}
