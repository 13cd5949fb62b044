//! HF checkpoint directories: `config.json` (its `model_type` picks the family) and the weights
//! as `model.safetensors`, sharded with `model.safetensors.index.json` (every shard it lists
//! must be there, and hold the tensors the index puts in it), or `pytorch_model.bin` (read by
//! [`crate::model::readers::torch_pickle`], which executes nothing).

use crate::model::nn::RopeScaling;
use crate::model::ModelError;
use std::collections::HashMap;
use std::path::Path;
use tch::Tensor;

pub fn is_hf_dir(dir: &Path) -> bool {
    dir.join("config.json").is_file()
        && ["model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"]
            .iter()
            .any(|f| dir.join(f).is_file())
}

/// `config.json` as JSON.
pub fn config(dir: &Path) -> Result<serde_json::Value, ModelError> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| ModelError::Io(path.display().to_string(), e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| ModelError::Config(path.display().to_string(), format!("not JSON: {e}")))
}

/// `config.json` checked against its family's keys ([`crate::model::readers::config_keys`]): the config with the
/// keys headscope does not read removed and a warning for each under `allow`, else an error
/// naming the first.
pub fn vetted_config(dir: &Path, allow: bool) -> Result<(serde_json::Value, Vec<String>), ModelError> {
    let path = dir.join("config.json").display().to_string();
    let mut c = config(dir)?;
    let model_type = c.get("model_type").and_then(|v| v.as_str()).unwrap_or("bert").to_string();
    let warnings =
        crate::model::readers::config_keys::vet(&mut c, &path, &model_type, allow).map_err(ModelError::Invalid)?;
    Ok((c, warnings))
}

/// `config.json` as a family's typed config; a missing or mistyped key is named. The keys
/// [`vetted_config`] refuses (which `Model::load` checks first, under the user's
/// `allow_unknown_config`) are not read.
pub fn typed_config<T: serde::de::DeserializeOwned>(dir: &Path) -> Result<T, ModelError> {
    let path = dir.join("config.json");
    serde_json::from_value(vetted_config(dir, true)?.0)
        .map_err(|e| ModelError::Config(path.display().to_string(), e.to_string()))
}

/// The `model_type` of an HF directory; old BERT configs without one are BERT.
pub fn model_type(dir: &Path) -> Result<String, ModelError> {
    let c = config(dir)?;
    Ok(c.get("model_type").and_then(|v| v.as_str()).unwrap_or("bert").to_string())
}

/// Every tensor of the checkpoint, floating-point ones read straight into `dtype` (the
/// model's), and the file to name in errors (the index for sharded weights).
pub fn weights(dir: &Path, dtype: tch::Kind) -> Result<(HashMap<String, Tensor>, String), ModelError> {
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok((crate::model::readers::safetensors::read(&single, Some(dtype))?, single.display().to_string()));
    }
    let index = dir.join("model.safetensors.index.json");
    let bin = dir.join("pytorch_model.bin");
    if !index.is_file() && bin.is_file() {
        return Ok((crate::model::readers::torch_pickle::read(&bin)?, bin.display().to_string()));
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
        let mut shard = crate::model::readers::safetensors::read(&dir.join(f), Some(dtype))?;
        for name in &by_file[f] {
            let t = shard
                .remove(name)
                .ok_or_else(|| bad(format!("tensor '{name}' is listed in shard '{f}' but not there")))?;
            out.insert(name.clone(), t);
        }
    }
    Ok((out, label))
}

/// A hybrid's `layer_types` (one name per layer of `n`) as attention or not: `attention` names
/// an attention layer, `other` the family's other mixer; any other name is an error naming the
/// entry and the family (`family`).
pub fn attention_layer_types(
    types: &[String],
    n: usize,
    family: &str,
    attention: &str,
    other: &str,
) -> Result<Vec<bool>, String> {
    if types.len() != n {
        return Err(format!("layer_types lists {} layers of {n}", types.len()));
    }
    types
        .iter()
        .enumerate()
        .map(|(l, t)| match t.as_str() {
            a if a == attention => Ok(true),
            o if o == other => Ok(false),
            x => Err(format!("layer_types[{l}] is '{x}': {family} has '{other}' and '{attention}' layers")),
        })
        .collect()
}

/// An `eos_token_id` that may be a number or a list of numbers (the first counts).
pub fn first_id(v: &Option<serde_json::Value>) -> Option<i64> {
    match v.as_ref()? {
        serde_json::Value::Array(a) => a.first().and_then(|x| x.as_i64()),
        x => x.as_i64(),
    }
}

/// The rotary settings of one layer type, as a config in either shape gives them
/// (docs/formats.md#transformers-5-configs): transformers 4 writes a top-level `rope_theta`,
/// `rope_scaling` and `partial_rotary_factor`; transformers 5 writes `rope_parameters`, one
/// object (`{"rope_type", "rope_theta", ...scaling fields, "partial_rotary_factor"}`) or one per
/// layer type (Gemma 3: `{"full_attention": {...}, "sliding_attention": {...}}`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rope {
    /// The base; `None` when the config gives none (the family's default applies).
    pub theta: Option<f64>,
    /// The scaling object (`rope_type` other than `default`), checked by [`rope_scaling_for`].
    pub scaling: Option<serde_json::Value>,
    pub partial_rotary_factor: Option<f64>,
    /// Where the settings came from, for errors and for `print(m)`: `rope_parameters`,
    /// `rope_parameters.sliding_attention` or `rope_scaling`.
    pub source: &'static str,
}

/// The layer types a per-layer-type `rope_parameters` is keyed by.
pub const LAYER_TYPES: &[&str] = &["full_attention", "sliding_attention", "chunked_attention"];

/// What a config gives of the rotary settings in transformers 4's keys.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rope4<'a> {
    pub theta: Option<f64>,
    pub scaling: Option<&'a serde_json::Value>,
    pub partial_rotary_factor: Option<f64>,
}

/// The rotary settings of `layer_type` from `rope_parameters` (transformers 5) or, without it,
/// from transformers 4's keys. A key given in both shapes must agree; `rope_parameters` keyed by
/// layer types must have an entry for `layer_type`.
pub fn rope_settings(
    parameters: Option<&serde_json::Value>,
    old: Rope4,
    layer_type: &'static str,
) -> Result<Rope, String> {
    let Some(p) = parameters.filter(|v| !v.is_null()) else {
        return Ok(Rope {
            theta: old.theta,
            scaling: old.scaling.filter(|v| !v.is_null()).cloned(),
            partial_rotary_factor: old.partial_rotary_factor,
            source: "rope_scaling",
        });
    };
    let Some(obj) = p.as_object() else { return Err(format!("rope_parameters must be an object, got {p}")) };
    let per_type = !obj.is_empty() && obj.iter().all(|(k, v)| LAYER_TYPES.contains(&k.as_str()) && v.is_object());
    let (entry, source, key) = if per_type {
        let key: &'static str = match layer_type {
            "sliding_attention" => "rope_parameters.sliding_attention",
            "chunked_attention" => "rope_parameters.chunked_attention",
            _ => "rope_parameters.full_attention",
        };
        let e = obj.get(layer_type).ok_or_else(|| {
            format!(
                "rope_parameters has entries for {} but none for '{layer_type}'",
                obj.keys().cloned().collect::<Vec<_>>().join(", ")
            )
        })?;
        (e.as_object().cloned().unwrap_or_default(), key, key)
    } else {
        (obj.clone(), "rope_parameters", "rope_parameters")
    };
    let num = |k: &str| -> Result<Option<f64>, String> {
        match entry.get(k) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(x) => x.as_f64().map(Some).ok_or_else(|| format!("{key}.{k} must be a number, got {x}")),
        }
    };
    let theta = num("rope_theta")?;
    let partial = num("partial_rotary_factor")?;
    // transformers 4's top-level keys describe the full-attention layers only.
    let old = if per_type && layer_type != "full_attention" { Rope4::default() } else { old };
    // transformers 5 keeps the old keys readable; a config giving both must not disagree.
    let agree = |what: &str, new: Option<f64>, old: Option<f64>| match (new, old) {
        (Some(a), Some(b)) if (a - b).abs() > 1e-12 * a.abs().max(b.abs()) => {
            Err(format!("{key}.{what} is {a} but the top-level {what} is {b}: remove one"))
        }
        _ => Ok(new.or(old)),
    };
    let theta = agree("rope_theta", theta, old.theta)?;
    let partial = agree("partial_rotary_factor", partial, old.partial_rotary_factor)?;
    let kind =
        entry.get("rope_type").or_else(|| entry.get("type")).and_then(|t| t.as_str()).unwrap_or("default").to_string();
    if let Some(s) = old.scaling.filter(|v| !v.is_null()) {
        let old_kind = s.get("rope_type").or_else(|| s.get("type")).and_then(|t| t.as_str()).unwrap_or("default");
        if old_kind != kind && !per_type {
            return Err(format!("{key} has rope_type '{kind}' but rope_scaling has '{old_kind}': remove one"));
        }
    }
    // Unknown keys were refused (or dropped) by config_keys::vet before the family read the config.
    let scaling = if kind == "default" { None } else { Some(serde_json::Value::Object(entry)) };
    Ok(Rope { theta, scaling, partial_rotary_factor: partial, source })
}

/// The keys each `rope_type` reads (transformers' `modeling_rope_utils`, 4.57 and 5.x);
/// `rope_theta` and `partial_rotary_factor` ride along in transformers 5's `rope_parameters`.
pub const ROPE_KEYS: &[(&str, &[&str])] = &[
    ("default", &[]),
    ("linear", &["factor"]),
    ("dynamic", &["factor", "original_max_position_embeddings"]),
    ("llama3", &["factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"]),
    (
        "yarn",
        &[
            "factor",
            "original_max_position_embeddings",
            "attention_factor",
            "beta_fast",
            "beta_slow",
            "mscale",
            "mscale_all_dim",
            "truncate",
        ],
    ),
    ("longrope", &["short_factor", "long_factor", "factor", "original_max_position_embeddings", "attention_factor"]),
];

/// `rope_scaling` of a config (transformers' `rope_type`, or the older `type`;
/// docs/methods.md#rope-scaling), checked:
/// a missing or non-numeric parameter, an unknown type, is an error naming it.
pub fn rope_scaling(
    value: Option<&serde_json::Value>,
    max_position_embeddings: Option<i64>,
) -> Result<RopeScaling, String> {
    rope_scaling_for(value, max_position_embeddings, None, 0)
}

/// [`rope_scaling`] for a model with `dim` rotary dimensions (LongRoPE's factors are one per
/// pair) and, as Phi-3 configs carry it, a top-level `original_max_position_embeddings`.
pub fn rope_scaling_for(
    value: Option<&serde_json::Value>,
    max_position_embeddings: Option<i64>,
    original_max: Option<i64>,
    dim: i64,
) -> Result<RopeScaling, String> {
    scaling_of("rope_scaling", value, max_position_embeddings, original_max, dim)
}

impl Rope {
    /// The scaling these settings give ([`rope_scaling_for`]), errors naming where they came from.
    pub fn scaling_for(
        &self,
        max_position_embeddings: Option<i64>,
        original_max: Option<i64>,
        dim: i64,
    ) -> Result<RopeScaling, String> {
        scaling_of(self.source, self.scaling.as_ref(), max_position_embeddings, original_max, dim)
    }

    /// One line for `print(m)`: base, scaling and rotary fraction, and the key they came from.
    pub fn describe(&self, default_theta: f64) -> String {
        let kind = self
            .scaling
            .as_ref()
            .and_then(|s| s.get("rope_type").or_else(|| s.get("type")))
            .and_then(|t| t.as_str())
            .unwrap_or("default");
        let mut s = format!(
            "rope_theta {}{}, rope_type {kind}",
            self.theta.unwrap_or(default_theta),
            if self.theta.is_none() { " (the family's default)" } else { "" }
        );
        if let Some(f) = self.partial_rotary_factor {
            s += &format!(", partial_rotary_factor {f}");
        }
        let from = if self.source == "rope_scaling" { "rope_theta, rope_scaling" } else { self.source };
        s.push_str(&format!(" (from {from})"));
        s
    }
}

fn scaling_of(
    label: &str,
    value: Option<&serde_json::Value>,
    max_position_embeddings: Option<i64>,
    original_max: Option<i64>,
    dim: i64,
) -> Result<RopeScaling, String> {
    let Some(v) = value.filter(|v| !v.is_null()) else { return Ok(RopeScaling::None) };
    let Some(m) = v.as_object() else { return Err(format!("{label} must be an object, got {v}")) };
    let kind = m
        .get("rope_type")
        .or_else(|| m.get("type"))
        .and_then(|t| t.as_str())
        .ok_or_else(|| format!("{label} has no rope_type"))?;
    let num = |key: &str| -> Result<Option<f64>, String> {
        match m.get(key) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(x) => x.as_f64().map(Some).ok_or_else(|| format!("{label}.{key} must be a number, got {x}")),
        }
    };
    let need =
        |key: &str| -> Result<f64, String> { num(key)?.ok_or_else(|| format!("{label} of type '{kind}' needs {key}")) };
    let factor = || -> Result<f64, String> {
        let f = need("factor")?;
        if f < 1.0 {
            return Err(format!("{label}.factor must be at least 1, got {f}"));
        }
        Ok(f)
    };
    let max_positions = || -> Result<f64, String> {
        max_position_embeddings
            .map(|x| x as f64)
            .ok_or_else(|| format!("{label} of type '{kind}' needs max_position_embeddings"))
    };
    Ok(match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: factor()? },
        "dynamic" => RopeScaling::Dynamic { factor: factor()?, max_positions: max_positions()? },
        "llama3" => {
            let (low, high) = (need("low_freq_factor")?, need("high_freq_factor")?);
            if high <= low {
                return Err(format!("{label}.high_freq_factor {high} must exceed low_freq_factor {low}"));
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
                let a = m.get(key).and_then(|v| v.as_array()).ok_or_else(|| format!("{label} of type '{kind}' needs {key} (a list of numbers)"))?;
                let f: Vec<f64> = a.iter().map(|x| x.as_f64().ok_or_else(|| format!("{label}.{key} must hold numbers, got {x}"))).collect::<Result<_, _>>()?;
                if dim > 0 && f.len() as i64 != dim / 2 {
                    return Err(format!("{label}.{key} has {} factors, expected {} (one per rotary pair)", f.len(), dim / 2));
                }
                if let Some(bad) = f.iter().find(|x| **x <= 0.0) {
                    return Err(format!("{label}.{key} holds {bad}: factors must be positive"));
                }
                Ok(f.into())
            };
            let max = max_positions()?;
            let (factor, original) = if label.starts_with("rope_parameters") {
                // transformers 5: the original context from rope_parameters (where its
                // conversion puts Phi-3's top-level one), the factor given or max / original.
                let original = num("original_max_position_embeddings")?.or(original_max.map(|o| o as f64)).unwrap_or(max);
                (num("factor")?.unwrap_or(max / original), original)
            } else {
                // As transformers 4: with a top-level original_max_position_embeddings (Phi-3)
                // the factor is max / original.
                match original_max {
                    Some(o) => (max / o as f64, o as f64),
                    None => (num("factor")?.unwrap_or(1.0), max),
                }
            };
            let attention_factor = match num("attention_factor")? {
                Some(a) => a,
                None if factor <= 1.0 => 1.0,
                None => (1.0 + factor.ln() / original.ln()).sqrt(),
            };
            RopeScaling::LongRope { short: factors("short_factor")?, long: factors("long_factor")?, original, attention_factor }
        }
        other => return Err(format!("rope_type '{other}' is not supported (default, linear, dynamic, llama3, yarn, longrope): headscope refuses rather than compute other numbers than transformers")),
    })
}
