//! Finds and loads the NVIDIA libraries that ONNX Runtime's CUDA provider needs,
//! so that the `cuda` executor runs without LD_LIBRARY_PATH set by hand.
//!
//! `bash scripts/setup.sh --gpu` installs the onnxruntime-gpu wheel and NVIDIA's
//! CUDA 13 runtime, cuBLAS, cuFFT, cuRAND and cuDNN 9 wheels into `.deps/gpu`
//! (pip `--target`). Their libraries sit under `.deps/gpu/nvidia/**/lib`. The
//! provider library (`libonnxruntime_providers_cuda.so`) names them by soname
//! (`libcudart.so.13`, ...), and cuDNN opens its sub-libraries by soname at run
//! time, neither of which searches `.deps`. So before ONNX Runtime is loaded,
//! every library found there is opened with `RTLD_GLOBAL` (dependencies first):
//! the dynamic loader then resolves those sonames to the loaded copies.
//!
//! Search order for the libraries' directories: `FERMATA_CUDA_LIBS` (directories
//! separated by `:`), then `.deps/gpu/nvidia/*/lib` and `.deps/gpu/nvidia/*/*/lib`
//! under the current directory and every ancestor of the executable's directory.
//! A library found in none of them may still come from the system loader path
//! (a CUDA toolkit install); one found nowhere is reported by name, with the wheel
//! that has it.
//!
//! This module does not need the `cuda` cargo feature, so its logic is tested on
//! machines without a GPU.

use anyhow::{bail, Result};
use std::path::{Path, PathBuf};

/// Environment variable: extra directories to search (before `.deps/gpu`).
pub const CUDA_LIBS_ENV: &str = "FERMATA_CUDA_LIBS";

/// Where `scripts/setup.sh --gpu` installs the GPU wheels, relative to a checkout.
pub const DEPS_GPU: &str = ".deps/gpu";

/// What to do about missing libraries.
pub const GPU_SETUP_HINT: &str = "run `bash scripts/setup.sh --gpu` (it installs the \
     onnxruntime-gpu and NVIDIA CUDA 13 wheels into .deps/gpu), or name the directories \
     that hold them in FERMATA_CUDA_LIBS";

/// The libraries the CUDA provider cannot run without, in load order
/// (dependencies first), each with the wheel that ships it.
pub const REQUIRED: &[(&str, &str)] = &[
    ("libcudart.so.13", "nvidia-cuda-runtime"),
    ("libcublasLt.so.13", "nvidia-cublas"),
    ("libcublas.so.13", "nvidia-cublas"),
    ("libcurand.so.10", "nvidia-curand"),
    ("libcufft.so.12", "nvidia-cufft"),
    ("libcudnn.so.9", "nvidia-cudnn-cu13"),
];

/// The bases a relative `.deps` path is looked up under: the current directory,
/// then every ancestor of the executable's directory.
pub fn search_bases() -> Vec<PathBuf> {
    let mut bases: Vec<PathBuf> = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        bases.push(cwd);
    }
    if let Ok(exe) = std::env::current_exe() {
        bases.extend(exe.ancestors().skip(1).map(Path::to_path_buf));
    }
    bases.dedup();
    bases
}

/// The `lib` directories of NVIDIA wheels installed under `deps` (`nvidia/X/lib`
/// and `nvidia/X/Y/lib`: the CUDA 13 wheels nest one level deeper), sorted.
pub fn wheel_lib_dirs(deps: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(deps.join("nvidia")) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.join("lib").is_dir() {
            out.push(p.join("lib"));
        }
        if let Ok(rd2) = std::fs::read_dir(&p) {
            for e2 in rd2.flatten() {
                let q = e2.path().join("lib");
                if q.is_dir() {
                    out.push(q);
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The directories searched, in order (see the module docs).
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os(CUDA_LIBS_ENV)
        .map(|v| {
            std::env::split_paths(&v)
                .filter(|p| !p.as_os_str().is_empty())
                .collect()
        })
        .unwrap_or_default();
    for b in search_bases() {
        dirs.extend(wheel_lib_dirs(&b.join(DEPS_GPU)));
    }
    dirs.dedup();
    dirs
}

/// Where each required library is: `Some(path)` when found in `dirs`, `None`
/// otherwise (in [`REQUIRED`]'s order).
pub fn locate(dirs: &[PathBuf]) -> Vec<(&'static str, &'static str, Option<PathBuf>)> {
    REQUIRED
        .iter()
        .map(|&(so, wheel)| {
            let found = dirs.iter().map(|d| d.join(so)).find(|p| p.is_file());
            (so, wheel, found)
        })
        .collect()
}

/// Whether the system loader can open `soname` (a CUDA install on its path).
fn loadable(soname: &str) -> bool {
    let Ok(c) = std::ffi::CString::new(soname) else {
        return false;
    };
    // SAFETY: dlopen with a valid C string; the handle is kept open (a library
    // found here is about to be used anyway).
    !unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) }.is_null()
}

fn dlerror() -> String {
    // SAFETY: dlerror returns a thread-local message or null.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        return "unknown error".into();
    }
    // SAFETY: a NUL-terminated string owned by the loader.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

/// The error for the libraries in `missing` (soname, wheel), naming each.
pub fn missing_error(missing: &[(&str, &str)], dirs: &[PathBuf]) -> anyhow::Error {
    let names: Vec<String> = missing
        .iter()
        .map(|(so, wheel)| format!("{so} (wheel {wheel})"))
        .collect();
    let searched = if dirs.is_empty() {
        "no .deps/gpu found".to_string()
    } else {
        dirs.iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    anyhow::anyhow!(
        "the cuda executor needs CUDA libraries that are missing: {}; searched {searched} \
         and the system loader path; {GPU_SETUP_HINT}",
        names.join(", ")
    )
}

/// Finds every required library and loads it (see the module docs); an error
/// names each library that is missing. Also loads every other `.so*` in the
/// directories where cuDNN was found (its engine and ops sub-libraries).
pub fn load() -> Result<()> {
    let dirs = search_dirs();
    let found = locate(&dirs);
    let missing: Vec<(&str, &str)> = found
        .iter()
        .filter(|(so, _, p)| p.is_none() && !loadable(so))
        .map(|(so, w, _)| (*so, *w))
        .collect();
    if !missing.is_empty() {
        return Err(missing_error(&missing, &dirs));
    }
    for (so, _, p) in &found {
        let Some(p) = p else { continue };
        open_global(p)
            .map_err(|e| anyhow::anyhow!("cannot load {so} from {}: {e}", p.display()))?;
        if so.starts_with("libcudnn.") {
            if let Some(dir) = p.parent() {
                load_siblings(dir, "libcudnn")?;
            }
        }
    }
    Ok(())
}

fn open_global(p: &Path) -> std::result::Result<(), String> {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: dlopen of a file path; the handle stays open for the process.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if h.is_null() {
        return Err(dlerror());
    }
    Ok(())
}

/// Loads every `PREFIX*.so*` in `dir` (cuDNN's sub-libraries, which it opens by
/// soname). One that fails to load is reported.
fn load_siblings(dir: &Path, prefix: &str) -> Result<()> {
    let mut libs: Vec<PathBuf> = std::fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix) && n.contains(".so"))
        })
        .collect();
    libs.sort();
    for p in libs {
        if let Err(e) = open_global(&p) {
            bail!("cannot load {}: {e}", p.display());
        }
    }
    Ok(())
}

/// The onnxruntime-gpu wheel's `libonnxruntime.so*` under `.deps/gpu`, if any.
pub fn gpu_ort_dylib() -> Option<PathBuf> {
    search_bases()
        .iter()
        .find_map(|b| super::dylib_in(&b.join(DEPS_GPU).join("onnxruntime/capi")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_wheel_dirs_and_names_what_is_missing() {
        let root = std::env::temp_dir().join(format!("fermata-gpulibs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let deps = root.join(".deps/gpu");
        // The CUDA 13 layout (nvidia/cu13/lib) and the older one (nvidia/cudnn/lib).
        std::fs::create_dir_all(deps.join("nvidia/cu13/lib")).unwrap();
        std::fs::create_dir_all(deps.join("nvidia/cudnn/lib")).unwrap();
        std::fs::create_dir_all(deps.join("nvidia/cudnn/include")).unwrap();
        let dirs = wheel_lib_dirs(&deps);
        assert_eq!(
            dirs,
            vec![deps.join("nvidia/cu13/lib"), deps.join("nvidia/cudnn/lib")]
        );
        // Nothing there yet: all missing.
        assert!(locate(&dirs).iter().all(|(_, _, p)| p.is_none()));
        for so in ["libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13"] {
            std::fs::write(deps.join("nvidia/cu13/lib").join(so), b"").unwrap();
        }
        std::fs::write(deps.join("nvidia/cudnn/lib/libcudnn.so.9"), b"").unwrap();
        let found = locate(&dirs);
        let missing: Vec<(&str, &str)> = found
            .iter()
            .filter(|(_, _, p)| p.is_none())
            .map(|(s, w, _)| (*s, *w))
            .collect();
        assert_eq!(
            missing,
            vec![
                ("libcurand.so.10", "nvidia-curand"),
                ("libcufft.so.12", "nvidia-cufft")
            ]
        );
        assert_eq!(
            found[0].2.as_deref(),
            Some(deps.join("nvidia/cu13/lib/libcudart.so.13").as_path())
        );
        let e = missing_error(&missing, &dirs).to_string();
        assert!(e.contains("libcurand.so.10 (wheel nvidia-curand)"), "{e}");
        assert!(e.contains("libcufft.so.12 (wheel nvidia-cufft)"), "{e}");
        assert!(e.contains("setup.sh --gpu"), "{e}");
        assert!(e.contains("nvidia/cu13/lib"), "{e}");
        // A file that is not a library is reported with the loader's reason.
        let e = open_global(&deps.join("nvidia/cudnn/lib/libcudnn.so.9")).unwrap_err();
        assert!(!e.is_empty());
        let _ = std::fs::remove_dir_all(&root);
    }
}
