//! HF checkpoint directories: `config.json` (its `model_type` picks the family) and the weights
//! as `model.safetensors`, sharded with `model.safetensors.index.json` (every shard it lists
//! must be there, and hold the tensors the index puts in it), or `pytorch_model.bin` (read by
//! [`super::torch_pickle`], which executes nothing).

use super::nn::RopeScaling;
use super::ModelError;
use std::collections::HashMap;
use std::path::Path;
use tch::Tensor;

pub fn is_hf_dir(dir: &Path) -> bool {
    dir.join("config.json").is_file() && ["model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"].iter().any(|f| dir.join(f).is_file())
}

/// `config.json` as JSON.
pub fn config(dir: &Path) -> Result<serde_json::Value, ModelError> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| ModelError::Io(path.display().to_string(), e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| ModelError::Config(path.display().to_string(), format!("not JSON: {e}")))
}

/// `config.json` as a family's typed config; a missing or mistyped key is named.
pub fn typed_config<T: serde::de::DeserializeOwned>(dir: &Path) -> Result<T, ModelError> {
    let path = dir.join("config.json");
    serde_json::from_value(config(dir)?).map_err(|e| ModelError::Config(path.display().to_string(), e.to_string()))
}

/// The `model_type` of an HF directory; old BERT configs without one are BERT.
pub fn model_type(dir: &Path) -> Result<String, ModelError> {
    let c = config(dir)?;
    Ok(c.get("model_type").and_then(|v| v.as_str()).unwrap_or("bert").to_string())
}

/// Every tensor of the checkpoint, and the file to name in errors (the index for sharded
/// weights).
pub fn weights(dir: &Path) -> Result<(HashMap<String, Tensor>, String), ModelError> {
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok((super::safetensors::read(&single)?, single.display().to_string()));
    }
    let index = dir.join("model.safetensors.index.json");
    let bin = dir.join("pytorch_model.bin");
    if !index.is_file() && bin.is_file() {
        return Ok((super::torch_pickle::read(&bin)?, bin.display().to_string()));
    }
    let label = index.display().to_string();
    let bad = |why: String| ModelError::Config(label.clone(), why);
    let text = std::fs::read_to_string(&index).map_err(|e| ModelError::Io(label.clone(), e.to_string()))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let map = v.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| bad("no 'weight_map' object".into()))?;
    let mut by_file: HashMap<String, Vec<String>> = HashMap::new();
    for (name, file) in map {
        let file = file.as_str().ok_or_else(|| bad(format!("weight_map['{name}'] is not a file name")))?;
        if file.contains('/') || file.contains('\\') || file == ".." {
            return Err(bad(format!("weight_map['{name}'] names '{file}', outside the directory")));
        }
        by_file.entry(file.to_string()).or_default().push(name.clone());
    }
    let mut files: Vec<&String> = by_file.keys().collect();
    files.sort();
    for f in &files {
        if !dir.join(f).is_file() {
            return Err(bad(format!("shard '{f}' is listed but missing from {}", dir.display())));
        }
    }
    let mut out = HashMap::with_capacity(map.len());
    for f in files {
        let mut shard = super::safetensors::read(&dir.join(f))?;
        for name in &by_file[f] {
            let t = shard.remove(name).ok_or_else(|| bad(format!("tensor '{name}' is listed in shard '{f}' but not there")))?;
            out.insert(name.clone(), t);
        }
    }
    Ok((out, label))
}

/// An `eos_token_id` that may be a number or a list of numbers (the first counts).
pub fn first_id(v: &Option<serde_json::Value>) -> Option<i64> {
    match v.as_ref()? {
        serde_json::Value::Array(a) => a.first().and_then(|x| x.as_i64()),
        x => x.as_i64(),
    }
}

/// `rope_scaling` of a config (transformers' `rope_type`, or the older `type`;
/// docs/methods.md#rope-scaling), checked:
/// a missing or non-numeric parameter, an unknown type, is an error naming it.
pub fn rope_scaling(value: Option<&serde_json::Value>, max_position_embeddings: Option<i64>) -> Result<RopeScaling, String> {
    rope_scaling_for(value, max_position_embeddings, None, 0)
}

/// [`rope_scaling`] for a model with `dim` rotary dimensions (LongRoPE's factors are one per
/// pair) and, as Phi-3 configs carry it, a top-level `original_max_position_embeddings`.
pub fn rope_scaling_for(value: Option<&serde_json::Value>, max_position_embeddings: Option<i64>, original_max: Option<i64>, dim: i64) -> Result<RopeScaling, String> {
    let Some(v) = value.filter(|v| !v.is_null()) else { return Ok(RopeScaling::None) };
    let Some(m) = v.as_object() else { return Err(format!("rope_scaling must be an object, got {v}")) };
    let kind = m.get("rope_type").or_else(|| m.get("type")).and_then(|t| t.as_str()).ok_or("rope_scaling has no rope_type")?;
    let num = |key: &str| -> Result<Option<f64>, String> {
        match m.get(key) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(x) => x.as_f64().map(Some).ok_or_else(|| format!("rope_scaling.{key} must be a number, got {x}")),
        }
    };
    let need = |key: &str| -> Result<f64, String> { num(key)?.ok_or_else(|| format!("rope_scaling of type '{kind}' needs {key}")) };
    let factor = || -> Result<f64, String> {
        let f = need("factor")?;
        if f < 1.0 {
            return Err(format!("rope_scaling.factor must be at least 1, got {f}"));
        }
        Ok(f)
    };
    let max_positions = || -> Result<f64, String> { max_position_embeddings.map(|x| x as f64).ok_or_else(|| format!("rope_scaling of type '{kind}' needs max_position_embeddings")) };
    Ok(match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: factor()? },
        "dynamic" => RopeScaling::Dynamic { factor: factor()?, max_positions: max_positions()? },
        "llama3" => {
            let (low, high) = (need("low_freq_factor")?, need("high_freq_factor")?);
            if high <= low {
                return Err(format!("rope_scaling.high_freq_factor {high} must exceed low_freq_factor {low}"));
            }
            RopeScaling::Llama3 { factor: factor()?, low_freq_factor: low, high_freq_factor: high, original: need("original_max_position_embeddings")? }
        }
        "yarn" => {
            let factor = factor()?;
            let original = match num("original_max_position_embeddings")? {
                Some(o) => o,
                None => max_positions()?,
            };
            let mscale = |scale: f64, m: f64| if scale <= 1.0 { 1.0 } else { 0.1 * m * scale.ln() + 1.0 };
            let attention_factor = match (num("attention_factor")?, num("mscale")?, num("mscale_all_dim")?) {
                (Some(a), _, _) => a,
                (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => mscale(factor, m) / mscale(factor, all),
                _ => mscale(factor, 1.0),
            };
            let truncate = m.get("truncate").and_then(|t| t.as_bool()).unwrap_or(true);
            let beta = |key: &str, default: f64| -> Result<f64, String> { Ok(num(key)?.filter(|&b| b != 0.0).unwrap_or(default)) };
            RopeScaling::Yarn { factor, original, beta_fast: beta("beta_fast", 32.0)?, beta_slow: beta("beta_slow", 1.0)?, attention_factor, truncate }
        }
        "longrope" | "su" => {
            let factors = |key: &str| -> Result<std::sync::Arc<[f64]>, String> {
                let a = m.get(key).and_then(|v| v.as_array()).ok_or_else(|| format!("rope_scaling of type '{kind}' needs {key} (a list of numbers)"))?;
                let f: Vec<f64> = a.iter().map(|x| x.as_f64().ok_or_else(|| format!("rope_scaling.{key} must hold numbers, got {x}"))).collect::<Result<_, _>>()?;
                if dim > 0 && f.len() as i64 != dim / 2 {
                    return Err(format!("rope_scaling.{key} has {} factors, expected {} (one per rotary pair)", f.len(), dim / 2));
                }
                if let Some(bad) = f.iter().find(|x| **x <= 0.0) {
                    return Err(format!("rope_scaling.{key} holds {bad}: factors must be positive"));
                }
                Ok(f.into())
            };
            let max = max_positions()?;
            // As transformers: with a top-level original_max_position_embeddings (Phi-3) the
            // factor is max / original.
            let (factor, original) = match original_max {
                Some(o) => (max / o as f64, o as f64),
                None => (num("factor")?.unwrap_or(1.0), max),
            };
            let attention_factor = match num("attention_factor")? {
                Some(a) => a,
                None if factor <= 1.0 => 1.0,
                None => (1.0 + factor.ln() / original.ln()).sqrt(),
            };
            RopeScaling::LongRope { short: factors("short_factor")?, long: factors("long_factor")?, original, attention_factor }
        }
        other => return Err(format!("rope_scaling type '{other}' is not supported (linear, dynamic, llama3, yarn, longrope)")),
    })
}
