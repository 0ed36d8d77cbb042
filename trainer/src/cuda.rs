//! Loads `libtorch_cuda.so` at run time. tch links `libtorch_cpu`/`libc10` only, and the linker drops
//! `libtorch_cuda` because no symbol of it is referenced (tch-rs issue 980): CUDA then looks absent and a run on a
//! GPU workstation would silently train on the CPU. Loading the library runs its static initialisers, which
//! register PyTorch's CUDA hooks, as `import torch` does. It is loaded only when a GPU is wanted or present, so a
//! CPU-only machine never needs the ~3 GB of CUDA libraries it depends on.

use std::path::PathBuf;
use std::sync::OnceLock;

static LOADED: OnceLock<Result<PathBuf, String>> = OnceLock::new();

/// Loads `libtorch_cuda.so` from the folder of the `libtorch_cpu.so` this process uses (once); the error says
/// which library is missing and how to install it.
pub fn load() -> Result<PathBuf, String> {
    LOADED.get_or_init(load_once).clone()
}

fn load_once() -> Result<PathBuf, String> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let cpu = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.ends_with("libtorch_cpu.so"))
        .ok_or("libtorch_cpu.so is not mapped into this process")?;
    let lib = std::path::Path::new(cpu).with_file_name("libtorch_cuda.so");
    if !lib.exists() {
        return Err(format!(
            "{} does not exist: this libtorch is a CPU-only build; install the CUDA build: python3 -m pip install \
             --target /opt/care torch==2.13.0 (with its nvidia-* dependencies)",
            lib.display()
        ));
    }
    open_global(&lib).map_err(|e| {
        format!(
            "{} cannot be loaded ({e}); install the CUDA libraries torch==2.13.0 depends on: python3 -m pip install \
             --target /opt/care torch==2.13.0 (without --no-deps), or put them on LD_LIBRARY_PATH",
            lib.display()
        )
    })?;
    Ok(lib)
}

/// `dlopen(RTLD_NOW | RTLD_GLOBAL)`, kept open for the life of the process (the CUDA hooks live in it).
#[allow(unsafe_code)]
fn open_global(lib: &std::path::Path) -> Result<(), String> {
    use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
    // SAFETY: libtorch_cuda's initialisers only register CUDA hooks with the libtorch_cpu already loaded from the
    // same folder (same build); nothing else in this process runs while main() starts.
    let l = unsafe { Library::open(Some(lib), RTLD_NOW | RTLD_GLOBAL) }.map_err(|e| {
        // libloading's own message is just "dlopen failed"; dlerror()'s text (the missing library) is its source.
        std::error::Error::source(&e).map_or_else(|| e.to_string(), |s| s.to_string())
    })?;
    std::mem::forget(l);
    Ok(())
}

#[cfg(test)]
mod tests {
    /// On any machine: the load either succeeds or says which file and how to fix it; it never aborts the process.
    #[test]
    fn load_succeeds_or_names_the_library_and_the_fix() {
        let _ = tch::Tensor::zeros([1], (tch::Kind::Float, tch::Device::Cpu)); // libtorch_cpu is mapped
        match super::load() {
            Ok(p) => assert!(p.ends_with("libtorch_cuda.so")),
            Err(e) => assert!(e.contains("libtorch_cuda.so") && e.contains("pip install"), "{e}"),
        }
        assert_eq!(super::load(), super::load(), "loaded once");
    }
}
