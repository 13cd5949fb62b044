//! The real models and data that `scripts/setup` fetches into `assets/`.

use std::path::{Path, PathBuf};

/// One asset headscope knows by name.
pub struct Asset {
    pub name: &'static str,
    /// Path relative to the assets directory.
    pub path: &'static str,
    pub what: &'static str,
}

pub const ASSETS: &[Asset] = &[
    Asset { name: "minilm", path: "minilm", what: "all-MiniLM-L6-v2 (BERT, 6 layers x 12 heads)" },
    Asset { name: "enpt", path: "marian/enpt", what: "Firefox-Translations EN->PT (Marian)" },
    Asset { name: "pten", path: "marian/pten", what: "Firefox-Translations PT->EN (Marian)" },
    Asset { name: "smollm2", path: "smollm2", what: "SmolLM2-135M-Instruct (GGUF, Q4_1) + derived tokenizer.json" },
    Asset {
        name: "gemma3",
        path: "gemma3-270m",
        what: "Gemma 3 270M base (GGUF, Q4_K_M; tokenizer from its metadata; Gemma Terms of Use)",
    },
    Asset {
        name: "qwen25coder",
        path: "qwen25coder",
        what: "Qwen2.5-Coder-0.5B-Instruct (GGUF, Q4_K_M; tokenizer from its metadata)",
    },
    Asset { name: "pud_en.conllu", path: "pud_en.conllu", what: "1000 English PUD sentences parsed by spaCy" },
    Asset { name: "pud_en.txt", path: "pud_en.txt", what: "the same sentences, one per line" },
    Asset { name: "brown.txt", path: "brown.txt", what: "Brown corpus as text (token frequencies)" },
];

/// The assets directory: `$HEADSCOPE_ASSETS`, else `assets/` of the source tree this binary
/// was built from, else `./assets`.
pub fn assets_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("HEADSCOPE_ASSETS") {
        return PathBuf::from(d);
    }
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets");
    if built.is_dir() {
        return built;
    }
    PathBuf::from("assets")
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AssetError {
    #[error("unknown asset '{0}' (known: {1})")]
    Unknown(String, String),
    #[error("asset '{name}' is missing at {path}: run scripts/setup")]
    Missing { name: String, path: String },
}

/// The path of a named asset, checked to exist.
pub fn asset_path(name: &str) -> Result<PathBuf, AssetError> {
    let a = ASSETS.iter().find(|a| a.name == name).ok_or_else(|| {
        AssetError::Unknown(name.into(), ASSETS.iter().map(|a| a.name).collect::<Vec<_>>().join(", "))
    })?;
    let p = assets_dir().join(a.path);
    if p.exists() {
        Ok(p)
    } else {
        Err(AssetError::Missing { name: name.into(), path: p.display().to_string() })
    }
}

/// One line per asset: present or missing.
pub fn status_report() -> String {
    let dir = assets_dir();
    let mut s = format!("assets:  {}\n", dir.display());
    for a in ASSETS {
        let ok = dir.join(a.path).exists();
        s += &format!("  {:<14} {:<8} {}\n", a.name, if ok { "ok" } else { "MISSING" }, a.what);
    }
    s.trim_end().to_string()
}

pub mod script {
    use crate::script::convert::{err, ScriptResult};
    use rhai::plugin::*;
    use rhai::Engine;

    #[export_module]
    pub mod api {
        use super::*;

        /// The path of a named asset fetched by `scripts/setup`: "minilm", "enpt", "pten",
        /// "smollm2", "gemma3", "qwen25coder", "pud_en.conllu", "pud_en.txt", "brown.txt".
        ///
        /// ```rhai
        /// let p = asset("pud_en.txt");
        /// assert(p.ends_with("pud_en.txt"));
        /// ```
        #[rhai_fn(return_raw)]
        pub fn asset(name: &str) -> ScriptResult<String> {
            super::super::asset_path(name).map(|p| p.display().to_string()).or_else(|e| err(format!("asset: {e}")))
        }
    }

    pub fn register(engine: &mut Engine) {
        engine.register_global_module(exported_module!(api).into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_asset_lists_known_ones() {
        let e = asset_path("bert-large").unwrap_err().to_string();
        assert!(e.starts_with("unknown asset 'bert-large' (known: minilm, enpt"), "{e}");
    }
}
