//! Link settings for libtorch taken from the project's Python venv (see shared notes/libtorch.md):
//! - an rpath to torch's `lib/` so the binary runs without `LD_LIBRARY_PATH`;
//! - `libtorch_cuda` linked with `--no-as-needed`, otherwise the linker drops it and
//!   `tch::Cuda::is_available()` is false even on a machine with an NVIDIA GPU.
use std::path::{Path, PathBuf};
use std::process::Command;

fn python() -> PathBuf {
    if let Ok(venv) = std::env::var("VIRTUAL_ENV") {
        let p = Path::new(&venv).join("bin").join("python");
        if p.exists() {
            return p;
        }
    }
    PathBuf::from("python3")
}

fn torch_lib_dir() -> Option<PathBuf> {
    if let Ok(lib) = std::env::var("LIBTORCH_LIB") {
        return Some(PathBuf::from(lib).join("lib"));
    }
    if let Ok(lib) = std::env::var("LIBTORCH") {
        return Some(PathBuf::from(lib).join("lib"));
    }
    let out = Command::new(python())
        .args(["-c", "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?;
    Some(PathBuf::from(s.trim()))
}

fn main() {
    println!("cargo:rerun-if-env-changed=VIRTUAL_ENV");
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=LIBTORCH_LIB");
    // No rerun-if-changed for this file: cargo reruns a build script whose source changed, and
    // this one builds both crates (crates/core names it `../../build.rs`), where a relative path
    // to it would name a missing file and rebuild the crate on every cargo command.
    let Some(lib) = torch_lib_dir() else {
        println!("cargo:warning=headscope: could not locate torch's lib dir; run scripts/setup first");
        println!("cargo:rustc-env=HEADSCOPE_TORCH_LIB=");
        println!("cargo:rustc-env=HEADSCOPE_TORCH_VERSION=unknown");
        return;
    };
    let lib = lib.display();
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    println!("cargo:rustc-link-search=native={lib}");
    if Path::new(&format!("{lib}/libtorch_cuda.so")).exists() {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-L{lib}");
        println!("cargo:rustc-link-arg=-ltorch_cuda");
        println!("cargo:rustc-link-arg=-Wl,--as-needed");
    }
    println!("cargo:rustc-env=HEADSCOPE_TORCH_LIB={lib}");
    let version = std::fs::read_to_string(format!("{lib}/../version.py"))
        .ok()
        .and_then(|v| {
            v.lines().find_map(|l| l.strip_prefix("__version__ = ").map(|s| s.trim_matches(['\'', '"']).to_string()))
        })
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=HEADSCOPE_TORCH_VERSION={version}");
}
