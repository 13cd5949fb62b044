//! `headscope kernel install`: writes the kernelspec (kernel.json and logos) where Jupyter
//! looks for kernels.

use crate::files::write_atomic;
use std::path::{Path, PathBuf};

/// Where to install the kernelspec.
#[derive(Debug, Clone, PartialEq)]
pub enum InstallTarget {
    /// `~/.local/share/jupyter/kernels` (the per-user data dir).
    User,
    /// `PREFIX/share/jupyter/kernels` (a virtualenv, conda env, or any prefix).
    Prefix(PathBuf),
}

impl InstallTarget {
    pub fn kernels_dir(&self) -> Result<PathBuf, String> {
        match self {
            InstallTarget::User => dirs::data_dir()
                .map(|d| d.join("jupyter").join("kernels"))
                .ok_or_else(|| "cannot find the user's data directory (is HOME set?)".to_string()),
            InstallTarget::Prefix(p) => Ok(p.join("share").join("jupyter").join("kernels")),
        }
    }
}

/// The kernel.json for a kernel started as `exe kernel --connection-file FILE`.
pub fn kernel_json(exe: &Path) -> serde_json::Value {
    serde_json::json!({
        "argv": [exe.display().to_string(), "kernel", "--connection-file", "{connection_file}"],
        "display_name": "headscope (Rhai)",
        "language": "rhai",
        "interrupt_mode": "message",
        "metadata": { "debugger": false },
    })
}

/// Installs the kernelspec `name` for `exe`; returns its directory.
pub fn install(target: &InstallTarget, name: &str, exe: &Path) -> Result<PathBuf, String> {
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
        return Err(format!("kernel name '{name}': use letters, digits, '-', '_' or '.'"));
    }
    let dir = target.kernels_dir()?.join(name);
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let json = serde_json::to_vec_pretty(&kernel_json(exe)).map_err(|e| e.to_string())?;
    let write = |file: &str, bytes: &[u8]| {
        let p = dir.join(file);
        write_atomic(&p, bytes).map_err(|e| format!("cannot write {}: {e}", p.display()))
    };
    write("kernel.json", &json)?;
    write("logo-32x32.png", &logo(32)?)?;
    write("logo-64x64.png", &logo(64)?)?;
    Ok(dir)
}

/// The logo: a 4x4 attention heatmap with a bright diagonal (a previous-token head).
fn logo(size: u32) -> Result<Vec<u8>, String> {
    let cell = size / 4;
    let img = image::RgbaImage::from_fn(size, size, |x, y| {
        let (i, j) = ((y / cell).min(3) as i32, (x / cell).min(3) as i32);
        let w: f32 = if j == i - 1 || (i == 0 && j == 0) { 1.0 } else { 0.12 + 0.05 * ((i * 3 + j * 5) % 4) as f32 };
        let lerp = |a: f32, b: f32| (a + (b - a) * w) as u8;
        image::Rgba([lerp(250.0, 200.0), lerp(240.0, 40.0), lerp(230.0, 30.0), 255])
    });
    let mut bytes = Vec::new();
    image::DynamicImage::ImageRgba8(img)
        .write_to(&mut std::io::Cursor::new(&mut bytes), image::ImageOutputFormat::Png)
        .map_err(|e| format!("cannot encode the logo: {e}"))?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installs_a_kernelspec_jupyter_can_read() {
        let dir = tempfile::tempdir().unwrap();
        let target = InstallTarget::Prefix(dir.path().to_path_buf());
        let at = install(&target, "headscope", Path::new("/opt/hs/headscope")).unwrap();
        assert_eq!(at, dir.path().join("share/jupyter/kernels/headscope"));
        let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(at.join("kernel.json")).unwrap()).unwrap();
        assert_eq!(spec["interrupt_mode"], "message");
        assert_eq!(spec["display_name"], "headscope (Rhai)");
        assert_eq!(spec["argv"][0], "/opt/hs/headscope");
        assert_eq!(spec["argv"][3], "{connection_file}");
        for (f, px) in [("logo-32x32.png", 32), ("logo-64x64.png", 64)] {
            let img = image::load_from_memory(&std::fs::read(at.join(f)).unwrap()).unwrap();
            assert_eq!((img.width(), img.height()), (px, px));
        }
        assert!(install(&target, "bad/name", Path::new("x")).unwrap_err().contains("bad/name"));
    }
}
