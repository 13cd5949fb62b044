//! Decoder-only checkpoints in GGUF of the architectures `llama` (SmolLM2-135M in the assets),
//! `qwen2`, `qwen3`, `qwen3moe` and `olmoe` (each layer's experts stacked per projection, split
//! at load; `deepseek2` has a file of its own, `deepseek_gguf`), `gpt-oss` (its experts, often
//! MXFP4, fused back into transformers' interleaved `gate_up_proj`: `fuse_gpt_oss`),
//! built by the HF llama code (`llama::build`), and `gemma`, `gemma2`,
//! `gemma3` (Gemma 3 270M in the assets), built by the HF Gemma code (`gemma::build`), from the
//! metadata and the tensors renamed to HF's names: RMSNorm before each sublayer, rotary
//! positions, grouped-query causal self-attention (Qwen2's Q/K/V biases, Qwen3's and Gemma 3's
//! per-head q/k norms), SwiGLU or GeGLU FFN, a final RMSNorm, and an output projection tied to
//! the embeddings unless `output.weight` exists.
//! Settings come from the GGUF metadata (`ARCH.*`), with llama.cpp's fixed values where the
//! metadata has none (Gemma 3: every sixth layer global, local rotary base 10000; Gemma 2:
//! alternating); the tokenizer is the directory's `tokenizer.json` when there is one, else the
//! GGUF's own (`gguf_tokenizer`). llama.cpp's converter permutes a llama checkpoint's Q/K rows
//! into adjacent rotary pairs, and leaves Qwen's and Gemma's in HF's rotate-half order (their
//! NEOX rope); it stores Gemma's RMSNorm weights as `1 + w`, which are read back as `w` (as
//! transformers' GGUF loader does).

use crate::model::families::llama::{build, Config, RotaryRows};
use crate::model::readers::gguf::{Gguf, Value};
use crate::model::readers::weights::Weights;
use crate::model::transformer::Transformer;
use crate::model::{LoadOptions, ModelError};
use std::path::{Path, PathBuf};

/// The one `*.gguf` of a directory.
/// The GGUF a model path names: the file itself, or a directory's only `.gguf`.
pub fn gguf_of(path: &Path) -> Option<PathBuf> {
    if path.is_file() {
        return path.extension().is_some_and(|e| e == "gguf").then(|| path.to_path_buf());
    }
    find_gguf(path)
}

pub fn find_gguf(dir: &Path) -> Option<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .collect();
    (v.len() == 1).then(|| v.remove(0))
}

/// A GGUF tensor name -> the HF name of the same tensor (`arch` decides what `ffn_norm` is:
/// Gemma 2/3's norm before the MLP has a name of its own).
fn hf_name(arch: &str, name: &str) -> String {
    if let Some(rest) = name.strip_prefix("blk.") {
        if let Some((l, part)) = rest.split_once('.') {
            let (module, suffix) = part.rsplit_once('.').unwrap_or((part, "weight"));
            let hf = match module {
                "attn_q" => "self_attn.q_proj",
                "attn_k" => "self_attn.k_proj",
                "attn_v" => "self_attn.v_proj",
                "attn_output" => "self_attn.o_proj",
                "attn_qkv" => "self_attn.qkv_proj",
                "attn_q_norm" => "self_attn.q_norm",
                "attn_k_norm" => "self_attn.k_norm",
                "attn_norm" => "input_layernorm",
                "ffn_norm" if arch == "gemma2" || arch == "gemma3" => "pre_feedforward_layernorm",
                "ffn_norm" => "post_attention_layernorm",
                "post_attention_norm" => "post_attention_layernorm",
                "post_ffw_norm" => "post_feedforward_layernorm",
                "ffn_up" if arch == "phi3" => "mlp.gate_up_proj",
                "ffn_up" => "mlp.up_proj",
                "ffn_down" => "mlp.down_proj",
                "ffn_gate" => "mlp.gate_proj",
                "ffn_gate_inp" => "mlp.gate",
                _ => return name.to_string(),
            };
            return format!("model.layers.{l}.{hf}.{suffix}");
        }
    }
    match name {
        "token_embd.weight" => "model.embed_tokens.weight".into(),
        "output_norm.weight" => "model.norm.weight".into(),
        "output.weight" => "lm_head.weight".into(),
        other => other.to_string(),
    }
}

/// The GGUF's metadata as the HF llama config and its tensors under HF's names, built by the
/// same code as HF llama checkpoints (`llama::build`); the Q/K rows are already in adjacent
/// pairs.
pub fn load(dir: &Path, opts: LoadOptions) -> Result<Transformer, ModelError> {
    let path = gguf_of(dir)
        .ok_or_else(|| ModelError::Io(dir.display().to_string(), "no single *.gguf in the directory".into()))?;
    let g = Gguf::open(&path)?;
    build_from(&g, &path.display().to_string(), opts)
}

/// The `general.architecture` of the GGUF at `path` (a file, or a directory holding one), if
/// it opens.
pub fn architecture(path: &Path) -> Option<String> {
    let g = Gguf::open(&gguf_of(path)?).ok()?;
    g.metadata.get("general.architecture").and_then(Value::as_str).map(str::to_string)
}

/// The model a parsed GGUF (read from `file`) holds, by its `general.architecture`.
pub fn build_from(g: &Gguf, file: &str, opts: LoadOptions) -> Result<Transformer, ModelError> {
    let file = file.to_string();
    let bad = |why: String| ModelError::Config(file.clone(), why);
    let arch = g.metadata.get("general.architecture").and_then(Value::as_str).unwrap_or_default().to_string();
    let rows = match arch.as_str() {
        "llama" => RotaryRows::Adjacent,
        "qwen2" | "qwen3" | "qwen3moe" | "olmoe" | "gemma" | "gemma2" | "gemma3" | "phi3" | "gpt-oss" => {
            RotaryRows::RotateHalf
        }
        "gptneox" => return gpt_neox(g, &file, opts),
        "deepseek2" => return crate::model::families::deepseek_gguf::load(g, &file, opts),
        "lfm2" => return crate::model::families::lfm2_gguf::load(g, &file, opts),
        "granitehybrid" => return crate::model::families::granitehybrid_gguf::load(g, &file, opts),
        "jamba" => return crate::model::families::jamba_gguf::load(g, &file, opts),
        "t5" => return t5(g, &file, opts),
        _ => return Err(bad(format!("architecture '{arch}' is not supported ({SUPPORTED} are)"))),
    };
    let meta = Meta { g, arch: &arch, file: &file };
    let key = |k: &str| meta.key(k);
    let gpt_oss = arch == "gpt-oss";
    // Read: Gemma's linear scaling, gpt-oss's YaRN.
    let scaling = meta.rope_scaling(&|t| (t == "linear" && arch.starts_with("gemma")) || (t == "yarn" && gpt_oss))?;
    let int = |k: &str| meta.int(k);
    let (n_layers, d, ff, h) =
        (meta.blocks()?, int("embedding_length")?, int("feed_forward_length")?, int("attention.head_count")?);
    // gpt-oss has experts only, as wide as `expert_feed_forward_length` (transformers' config
    // calls it `intermediate_size`).
    let ff = if gpt_oss { int("expert_feed_forward_length")? } else { ff };
    let hk = int("attention.head_count_kv").unwrap_or(h);
    // Qwen3's and Gemma's heads are wider than d / h: the key length says.
    let key_length = int("attention.key_length").ok();
    if h <= 0 || hk <= 0 || h % hk != 0 || (key_length.is_none() && d % h != 0) {
        return Err(bad(format!("{h} heads and {hk} key/value heads do not fit a model of size {d}")));
    }
    let float = |k: &str| meta.float(k);
    let eps = float("attention.layer_norm_rms_epsilon")
        .ok_or_else(|| bad(format!("metadata {} is missing", key("attention.layer_norm_rms_epsilon"))))?;
    let eos = g.metadata.get("tokenizer.ggml.eos_token_id").and_then(Value::as_u64).unwrap_or(0) as i64;
    let gemma = arch.starts_with("gemma");
    let map: std::collections::HashMap<String, tch::Tensor> = g
        .tensors
        .iter()
        .map(|t| {
            // llama.cpp wrote Gemma's norms as 1 + w: shifted in float32, then converted.
            let x = if gemma && t.name.ends_with("norm.weight") {
                (g.tensor(&t.name)? - 1.0).f_to_kind(opts.dtype)?
            } else {
                g.tensor_as(&t.name, opts.dtype)?
            };
            Ok((hf_name(&arch, &t.name), x))
        })
        .collect::<Result<_, ModelError>>()?;
    let vocab = vocab_rows(&map, "model.embed_tokens.weight", "token_embd.weight", &file)?;
    let head_dim = key_length.unwrap_or(d / h);
    if gemma {
        // llama.cpp's fixed Gemma settings: the 27B models (62 layers for Gemma 3, 46 for
        // Gemma 2) scale scores by (hidden / heads)^-1/2, the others by head_dim^-1/2.
        let big = (arch == "gemma3" && n_layers == 62) || (arch == "gemma2" && n_layers == 46);
        let rope_scaling = match scaling {
            Some(_) => Some(
                serde_json::json!({"rope_type": "linear", "factor": float("rope.scaling.factor").ok_or_else(|| bad(format!("metadata {} is missing", key("rope.scaling.factor"))))?}),
            ),
            None => None,
        };
        let cfg = crate::model::families::gemma::Config {
            model_type: if arch == "gemma3" { "gemma3_text".into() } else { arch.clone() },
            vocab_size: vocab,
            hidden_size: d,
            intermediate_size: ff,
            num_hidden_layers: n_layers,
            num_attention_heads: h,
            num_key_value_heads: Some(hk),
            head_dim,
            hidden_activation: Some("gelu_pytorch_tanh".into()),
            hidden_act: None,
            max_position_embeddings: int("context_length").ok(),
            rms_norm_eps: eps,
            rope_theta: Some(float("rope.freq_base").unwrap_or(10000.0)),
            rope_parameters: None,
            rope_scaling,
            rope_local_base_freq: Some(10000.0),
            attention_bias: false,
            query_pre_attn_scalar: Some(if big { (d / h) as f64 } else { head_dim as f64 }),
            sliding_window: int("attention.sliding_window").ok(),
            layer_types: None,
            sliding_window_pattern: Some(6),
            final_logit_softcapping: float("final_logit_softcapping"),
            attn_logit_softcapping: float("attn_logit_softcapping"),
            tie_word_embeddings: !map.contains_key("lm_head.weight"),
            eos_token_id: Some(eos.into()),
        };
        return crate::model::families::gemma::build(&cfg, &file, Weights::new(map, file.clone(), opts, None), opts);
    }
    let mut map = map;
    // Qwen3-MoE and OLMoE: each layer's experts stacked into one tensor per projection, split
    // here into HF's per-expert names. The chosen experts' weights are renormalised as
    // `expert_weights_norm` says, else as the family's HF default does (Qwen3-MoE as llama.cpp
    // computes it: renormalised; OLMoE: not).
    let moe = if arch == "qwen3moe" || arch == "olmoe" {
        let n = int("expert_count")?;
        // OLMoE's experts are as wide as its feed_forward_length.
        let width = if arch == "olmoe" { ff } else { int("expert_feed_forward_length")? };
        split_experts(&mut map, 0..n_layers, n, width, d, &file)?;
        let norm = g.metadata.get(&key("expert_weights_norm")).and_then(Value::as_bool).unwrap_or(arch == "qwen3moe");
        crate::model::families::llama::MoeConfig {
            num_experts: Some(n),
            num_experts_per_tok: Some(int("expert_used_count")?),
            norm_topk_prob: Some(norm),
            moe_intermediate_size: Some(width),
            ..Default::default()
        }
    } else if gpt_oss {
        let n = int("expert_count")?;
        fuse_gpt_oss(&mut map, n_layers, n, ff, d, &file)?;
        crate::model::families::llama::MoeConfig {
            num_local_experts: Some(n),
            num_experts_per_tok: Some(int("expert_used_count")?),
            ..Default::default()
        }
    } else {
        Default::default()
    };
    // Phi-3: LongRoPE's factors are tensors of their own (`rope_factors_short`, `_long`), the
    // sliding window is 0 when there is none; llama.cpp reads neither as transformers does
    // (it chooses the factors by context size and drops the window), headscope does.
    let (mut rope_scaling, mut sliding_window) = (None, None);
    if arch == "phi3" {
        let mut factors = |name: &str| -> Result<Option<Vec<f64>>, ModelError> {
            map.remove(name)
                .map(|t| {
                    Vec::<f64>::try_from(t.to_kind(tch::Kind::Double).reshape([-1]))
                        .map_err(|e| bad(format!("tensor {name}: {e}")))
                })
                .transpose()
        };
        match (factors("rope_factors_short.weight")?, factors("rope_factors_long.weight")?) {
            (Some(short), Some(long)) => {
                let mut scaling = serde_json::json!({"type": "longrope", "short_factor": short, "long_factor": long});
                if let Some(a) = float("rope.scaling.attn_factor") {
                    scaling["attention_factor"] = a.into();
                }
                rope_scaling = Some(scaling);
            }
            (None, None) => {}
            _ => return Err(bad("LongRoPE needs both rope_factors_short.weight and rope_factors_long.weight".into())),
        }
        sliding_window = int("attention.sliding_window").ok().filter(|&w| w > 0);
    }
    // gpt-oss: YaRN as transformers reads gpt-oss's config (`truncate: false`); llama.cpp's
    // fixed alternation of sliding (even) and global (odd) layers is transformers' default too.
    if gpt_oss {
        sliding_window = int("attention.sliding_window").ok().filter(|&w| w > 0);
        if scaling.is_some() {
            let mut s = meta.yarn()?;
            s["truncate"] = false.into();
            rope_scaling = Some(s);
        }
    }
    let cfg = Config {
        model_type: match arch.as_str() {
            "qwen3moe" => "qwen3_moe".into(),
            "gpt-oss" => "gpt_oss".into(),
            a => a.into(),
        },
        hidden_size: d,
        intermediate_size: ff,
        num_hidden_layers: n_layers,
        num_attention_heads: h,
        num_key_value_heads: Some(hk),
        head_dim: Some(head_dim),
        rms_norm_eps: eps,
        rope_theta: Some(float("rope.freq_base").unwrap_or(10000.0)),
        rope_parameters: None,
        vocab_size: vocab,
        tie_word_embeddings: !map.contains_key("lm_head.weight"),
        hidden_act: "silu".into(),
        rope_scaling,
        max_position_embeddings: int("context_length").ok(),
        original_max_position_embeddings: int("rope.scaling.original_context_length").ok().filter(|_| arch == "phi3"),
        partial_rotary_factor: None,
        attention_bias: false,
        mlp_bias: false,
        sliding_window,
        use_sliding_window: None,
        layer_types: None,
        eos_token_id: Some(eos.into()),
        no_rope_layers: None,
        no_rope_layer_interval: None,
        moe,
        rope_dim: int("rope.dimension_count").ok(),
    };
    if arch == "phi3" {
        crate::model::families::phi3::split_fused(&mut map, &cfg, &file, &file)?;
    }
    build(&cfg, &file, Weights::new(map, file.clone(), opts, None), rows)
}

/// The stacked experts of `layers` (`ffn_gate_exps` and `ffn_up_exps` `[E, I, D]`, `ffn_down_exps`
/// `[E, D, I]`, already under HF-style names `model.layers.L.ffn_*_exps.weight`) split into
/// `model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight`; a stacked tensor of another
/// shape is an error naming it.
pub(crate) fn split_experts(
    map: &mut std::collections::HashMap<String, tch::Tensor>,
    layers: std::ops::Range<usize>,
    n: i64,
    width: i64,
    d: i64,
    file: &str,
) -> Result<(), ModelError> {
    for l in layers {
        for (gguf, hf, shape) in [
            ("ffn_gate_exps", "gate_proj", [n, width, d]),
            ("ffn_up_exps", "up_proj", [n, width, d]),
            ("ffn_down_exps", "down_proj", [n, d, width]),
        ] {
            let t = take(map, format!("blk.{l}.{gguf}.weight"), Some(&shape), file)?;
            for e in 0..n {
                map.insert(format!("model.layers.{l}.mlp.experts.{e}.{hf}.weight"), t.f_get(e)?.f_contiguous()?);
            }
        }
    }
    Ok(())
}

/// Tensor `name` taken out of `map`, of `shape` where given (`None`: checked where it is used,
/// e.g. the sinks' width, the heads); missing or of another shape, an error naming it.
fn take(
    map: &mut std::collections::HashMap<String, tch::Tensor>,
    name: String,
    shape: Option<&[i64]>,
    file: &str,
) -> Result<tch::Tensor, ModelError> {
    let t =
        map.remove(&name).ok_or_else(|| ModelError::MissingTensor { file: file.to_string(), name: name.clone() })?;
    match shape {
        Some(shape) if t.size() != shape => {
            Err(ModelError::BadShape { file: file.to_string(), name, want: shape.to_vec(), got: t.size() })
        }
        _ => Ok(t),
    }
}

/// gpt-oss as llama.cpp writes it back into transformers' layout: each layer's `ffn_gate_exps` and
/// `ffn_up_exps` (`[E, I, D]`, MXFP4 or not, with `[E, I]` biases) interleaved column by column
/// into `mlp.experts.gate_up_proj [E, D, 2I]` and its bias, `ffn_down_exps [E, D, I]` transposed
/// into `down_proj [E, I, D]`, the router (`ffn_gate_inp`, under HF-style names `mlp.gate`) as
/// `mlp.router`, the sinks (`attn_sinks.weight`) as `self_attn.sinks`. A tensor of another shape
/// is an error naming it.
fn fuse_gpt_oss(
    map: &mut std::collections::HashMap<String, tch::Tensor>,
    n_layers: usize,
    n: i64,
    width: i64,
    d: i64,
    file: &str,
) -> Result<(), ModelError> {
    let mut get = |name: String, shape: Option<&[i64]>| take(map, name, shape, file);
    let mut out = Vec::new();
    for l in 0..n_layers {
        let (b, hf) = (format!("blk.{l}"), format!("model.layers.{l}"));
        let gate = get(format!("{b}.ffn_gate_exps.weight"), Some(&[n, width, d]))?;
        let up = get(format!("{b}.ffn_up_exps.weight"), Some(&[n, width, d]))?;
        let gate_b = get(format!("{b}.ffn_gate_exps.bias"), Some(&[n, width]))?;
        let up_b = get(format!("{b}.ffn_up_exps.bias"), Some(&[n, width]))?;
        let down = get(format!("{b}.ffn_down_exps.weight"), Some(&[n, d, width]))?;
        let down_b = get(format!("{b}.ffn_down_exps.bias"), Some(&[n, d]))?;
        let gate_up = tch::Tensor::f_stack(&[gate, up], 2)?.f_reshape([n, 2 * width, d])?.f_transpose(1, 2)?;
        let gate_up_b = tch::Tensor::f_stack(&[gate_b, up_b], 2)?.f_reshape([n, 2 * width])?;
        out.push((format!("{hf}.mlp.experts.gate_up_proj"), gate_up.f_contiguous()?));
        out.push((format!("{hf}.mlp.experts.gate_up_proj_bias"), gate_up_b));
        out.push((format!("{hf}.mlp.experts.down_proj"), down.f_transpose(1, 2)?.f_contiguous()?));
        out.push((format!("{hf}.mlp.experts.down_proj_bias"), down_b));
        out.push((format!("{hf}.mlp.router.weight"), get(format!("{hf}.mlp.gate.weight"), Some(&[n, d]))?));
        out.push((format!("{hf}.mlp.router.bias"), get(format!("{hf}.mlp.gate.bias"), Some(&[n]))?));
        out.push((format!("{hf}.self_attn.sinks"), get(format!("{b}.attn_sinks.weight"), None)?));
    }
    map.extend(out);
    Ok(())
}

/// A GGUF's metadata under its architecture's prefix (`ARCH.KEY`); a missing required key is
/// an error naming the file and the key.
pub(crate) struct Meta<'a> {
    pub(crate) g: &'a Gguf,
    pub(crate) arch: &'a str,
    pub(crate) file: &'a str,
}

impl Meta<'_> {
    pub(crate) fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }
    fn bad(&self, why: String) -> ModelError {
        ModelError::Config(self.file.to_string(), why)
    }
    pub(crate) fn int(&self, k: &str) -> Result<i64, ModelError> {
        self.g
            .metadata
            .get(&self.key(k))
            .and_then(Value::as_u64)
            .map(|v| v as i64)
            .ok_or_else(|| self.bad(format!("metadata {} is missing", self.key(k))))
    }
    /// `int(k)` where `required` (a key of a layer kind the file has), else the value if present
    /// (a key of a kind it lacks, which the file need not hold).
    pub(crate) fn int_if(&self, required: bool, k: &str) -> Result<Option<i64>, ModelError> {
        if required {
            self.int(k).map(Some)
        } else {
            Ok(self.int(k).ok())
        }
    }
    /// `block_count`, checked against the tensor directory: more blocks than the file holds
    /// `blk.N` tensors for is an error naming the key (a hostile count is not a loop over
    /// millions of missing layers; found by the `gguf_model` fuzz target).
    pub(crate) fn blocks(&self) -> Result<usize, ModelError> {
        let n = self.int("block_count")?;
        let held = self
            .g
            .tensors
            .iter()
            .filter_map(|t| t.name.strip_prefix("blk.")?.split('.').next()?.parse::<u64>().ok())
            .max()
            .map_or(0, |m| m.saturating_add(1));
        if n as u64 > held {
            return Err(self.bad(format!(
                "metadata {} is {n}, but the file holds tensors of {held} blocks",
                self.key("block_count")
            )));
        }
        Ok(n as usize)
    }
    /// YaRN's settings in transformers' `rope_scaling` form: `rope.scaling.factor` (required),
    /// `yarn_beta_fast` / `_slow` (none: transformers' 32 / 1), `original_context_length`;
    /// each family adds what its config has besides.
    pub(crate) fn yarn(&self) -> Result<serde_json::Value, ModelError> {
        let factor = self
            .float("rope.scaling.factor")
            .ok_or_else(|| self.bad(format!("metadata {} is missing", self.key("rope.scaling.factor"))))?;
        let mut s = serde_json::json!({
            "rope_type": "yarn", "factor": factor,
            "beta_fast": self.float("rope.scaling.yarn_beta_fast").unwrap_or(32.0),
            "beta_slow": self.float("rope.scaling.yarn_beta_slow").unwrap_or(1.0),
        });
        if let Ok(o) = self.int("rope.scaling.original_context_length") {
            s["original_max_position_embeddings"] = o.into();
        }
        Ok(s)
    }
    /// `rope.scaling.type` where it is not "none": the ones `read` accepts, any other refused
    /// naming the key and the architecture.
    pub(crate) fn rope_scaling(&self, read: &dyn Fn(&str) -> bool) -> Result<Option<&str>, ModelError> {
        let key = self.key("rope.scaling.type");
        match self.g.metadata.get(&key).and_then(Value::as_str).filter(|t| *t != "none") {
            Some(t) if !read(t) => Err(self.bad(format!(
                "metadata {key}: rope scaling '{t}' is not supported in GGUF files of '{}' yet",
                self.arch
            ))),
            t => Ok(t),
        }
    }
    pub(crate) fn float(&self, k: &str) -> Option<f64> {
        self.g.metadata.get(&self.key(k)).and_then(Value::as_f64)
    }
    /// A per-layer count of `n` layers (hybrids write `attention.head_count_kv` so, 0 for a
    /// layer without attention): an array of `n` counts, or one count for every layer, or
    /// `default` for every layer where the key is missing.
    pub(crate) fn per_layer(&self, k: &str, n: usize, default: i64) -> Result<Vec<i64>, ModelError> {
        let v = match self.g.metadata.get(&self.key(k)) {
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| v.as_u64().map(|v| v as i64))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| self.bad(format!("metadata {}: not a list of counts", self.key(k))))?,
            Some(v) => {
                vec![v.as_u64().ok_or_else(|| self.bad(format!("metadata {}: not a count", self.key(k))))? as i64; n]
            }
            None => vec![default; n],
        };
        if v.len() != n {
            return Err(self.bad(format!("metadata {} has {} entries for {n} blocks", self.key(k), v.len())));
        }
        Ok(v)
    }
}

/// Every tensor of `g`, dequantised into `dtype`, under the name `rename` gives its GGUF name.
fn renamed(
    g: &Gguf,
    dtype: tch::Kind,
    rename: impl Fn(&str) -> String,
) -> Result<std::collections::HashMap<String, tch::Tensor>, ModelError> {
    g.tensors.iter().map(|t| Ok((rename(&t.name), g.tensor_as(&t.name, dtype)?))).collect()
}

/// The rows of the token table `name` of `map` (`gguf`: its name in the file, for errors): a
/// `[vocab, width]` tensor; another shape (a hostile file's scalar) is an error naming it.
pub(crate) fn vocab_rows(
    map: &std::collections::HashMap<String, tch::Tensor>,
    name: &str,
    gguf: &str,
    file: &str,
) -> Result<i64, ModelError> {
    let t = map.get(name).ok_or_else(|| ModelError::MissingTensor { file: file.into(), name: gguf.into() })?;
    match t.size()[..] {
        [v, _] => Ok(v),
        _ => Err(ModelError::Corrupt {
            file: file.into(),
            why: format!("tensor '{gguf}' has shape {:?}: a token table is [vocab, width]", t.size()),
        }),
    }
}

/// The architectures read.
pub const SUPPORTED: &str =
    "llama, qwen2, qwen3, qwen3moe, olmoe, deepseek2, gpt-oss, gemma, gemma2, gemma3, phi3, gptneox, t5, lfm2, granitehybrid, jamba";

/// GPT-NeoX (Pythia) as llama.cpp writes it: HF's names under `blk.N.*`, the fused
/// `attn_qkv` regrouped as every query row, then every key row, then every value row
/// (`gpt_neox::QkvRows::Stacked`), parallel residual by `use_parallel_residual`. llama.cpp's
/// converter writes no rotary base (llama.cpp takes 10000, as here) and no activation: the MLP
/// is HF's exact GELU (llama.cpp computes the tanh approximation).
fn gpt_neox(g: &Gguf, file: &str, opts: LoadOptions) -> Result<Transformer, ModelError> {
    let meta = Meta { g, arch: "gptneox", file };
    let (bad, key, int, float) =
        (|why: String| meta.bad(why), |k: &str| meta.key(k), |k: &str| meta.int(k), |k: &str| meta.float(k));
    let (d, h) = (int("embedding_length")?, int("attention.head_count")?);
    if h <= 0 || d <= 0 || d % h != 0 {
        return Err(bad(format!(
            "{} {d} is not a positive multiple of {} {h}",
            key("embedding_length"),
            key("attention.head_count")
        )));
    }
    let map = renamed(g, opts.dtype, |name| match name {
        "token_embd.weight" => "gpt_neox.embed_in.weight".to_string(),
        "output.weight" => "embed_out.weight".to_string(),
        n if n.starts_with("output_norm.") => format!("gpt_neox.final_layer_norm.{}", &n["output_norm.".len()..]),
        n => match n.strip_prefix("blk.").and_then(|r| r.split_once('.')) {
            Some((l, part)) => {
                let (module, suffix) = part.rsplit_once('.').unwrap_or((part, "weight"));
                let hf = match module {
                    "attn_norm" => "input_layernorm",
                    "attn_qkv" => "attention.query_key_value",
                    "attn_output" => "attention.dense",
                    "ffn_norm" => "post_attention_layernorm",
                    "ffn_up" => "mlp.dense_h_to_4h",
                    "ffn_down" => "mlp.dense_4h_to_h",
                    _ => module,
                };
                format!("gpt_neox.layers.{l}.{hf}.{suffix}")
            }
            None => n.to_string(),
        },
    })?;
    let vocab = vocab_rows(&map, "gpt_neox.embed_in.weight", "token_embd.weight", file)?;
    let rope_dim = int("rope.dimension_count")?;
    let eos = g.metadata.get("tokenizer.ggml.eos_token_id").and_then(Value::as_u64).unwrap_or(0) as i64;
    let cfg = crate::model::families::gpt_neox::Config {
        hidden_size: d,
        num_hidden_layers: int("block_count")? as usize,
        num_attention_heads: h,
        intermediate_size: int("feed_forward_length")?,
        vocab_size: vocab,
        hidden_act: "gelu".into(),
        rotary_pct: Some(rope_dim as f64 / (d / h) as f64),
        partial_rotary_factor: None,
        rotary_emb_base: None,
        rope_theta: Some(float("rope.freq_base").unwrap_or(10000.0)),
        rope_scaling: None,
        rope_parameters: None,
        max_position_embeddings: int("context_length").ok(),
        head_dim: None,
        layer_norm_eps: float("attention.layer_norm_epsilon")
            .ok_or_else(|| bad(format!("metadata {} is missing", key("attention.layer_norm_epsilon"))))?,
        use_parallel_residual: g.metadata.get(&key("use_parallel_residual")).and_then(Value::as_bool).unwrap_or(true),
        attention_bias: map.contains_key("gpt_neox.layers.0.attention.query_key_value.bias"),
        tie_word_embeddings: !map.contains_key("embed_out.weight"),
        eos_token_id: Some(eos.into()),
        rotary_dims: Some(rope_dim),
    };
    crate::model::families::gpt_neox::build(
        &cfg,
        file,
        Weights::new(map, file.to_string(), opts, Some("gpt_neox.")),
        crate::model::families::gpt_neox::QkvRows::Stacked,
    )
}

/// T5 / Flan-T5 / mT5 as llama.cpp writes them (`enc.blk.N.*`, `dec.blk.N.*`, the relative
/// position bias `attn_rel_b` in block 0 of each stack, `ffn_gate` only in gated variants),
/// built by the HF T5 code with transformers' semantics: the GGUF has no key for
/// `relative_attention_max_distance`, which is 128 (llama.cpp's fixed value, every released T5's
/// own); without `output.weight` the output is tied and the decoder's output scaled by
/// `d_model^-0.5` first (transformers does, llama.cpp does not); gated FFNs are Flan-T5's
/// tanh GELU.
fn t5(g: &Gguf, file: &str, opts: LoadOptions) -> Result<Transformer, ModelError> {
    let meta = Meta { g, arch: "t5", file };
    let (int, float) = (|k: &str| meta.int(k), |k: &str| meta.float(k));
    let mut map = renamed(g, opts.dtype, |name| match name {
        "token_embd.weight" => "shared.weight".to_string(),
        "output.weight" => "lm_head.weight".to_string(),
        "enc.output_norm.weight" => "encoder.final_layer_norm.weight".to_string(),
        "dec.output_norm.weight" => "decoder.final_layer_norm.weight".to_string(),
        n => {
            let stack = n
                .strip_prefix("enc.blk.")
                .map(|r| ("encoder", r))
                .or_else(|| n.strip_prefix("dec.blk.").map(|r| ("decoder", r)));
            match stack.and_then(|(side, rest)| rest.split_once('.').map(|(l, part)| (side, l, part))) {
                Some((side, l, part)) => {
                    let module = part.strip_suffix(".weight").unwrap_or(part);
                    let ffn = if side == "encoder" { "1" } else { "2" };
                    let hf = match module {
                        "attn_norm" => "0.layer_norm".to_string(),
                        "attn_q" | "attn_k" | "attn_v" | "attn_o" => format!("0.SelfAttention.{}", &module[5..]),
                        "attn_rel_b" => "0.SelfAttention.relative_attention_bias".to_string(),
                        "cross_attn_norm" => "1.layer_norm".to_string(),
                        "cross_attn_q" | "cross_attn_k" | "cross_attn_v" | "cross_attn_o" => {
                            format!("1.EncDecAttention.{}", &module[11..])
                        }
                        "ffn_norm" => format!("{ffn}.layer_norm"),
                        "ffn_gate" => format!("{ffn}.DenseReluDense.wi_0"),
                        "ffn_up" => format!("{ffn}.DenseReluDense.UP"),
                        "ffn_down" => format!("{ffn}.DenseReluDense.wo"),
                        _ => module.to_string(),
                    };
                    format!("{side}.block.{l}.layer.{hf}.weight")
                }
                None => n.to_string(),
            }
        }
    })?;
    // The up projection is `wi` in plain FFNs, `wi_1` beside the gate `wi_0`.
    let gated = map.keys().any(|k| k.ends_with("DenseReluDense.wi_0.weight"));
    let up = if gated { "wi_1" } else { "wi" };
    map = map.into_iter().map(|(k, v)| (k.replace("DenseReluDense.UP", &format!("DenseReluDense.{up}")), v)).collect();
    let vocab = vocab_rows(&map, "shared.weight", "token_embd.weight", file)?;
    let id = |k: &str| g.metadata.get(k).and_then(Value::as_u64).map(|v| v as i64);
    let cfg = crate::model::families::t5::Config {
        model_type: "t5".into(),
        vocab_size: vocab,
        d_model: int("embedding_length")?,
        d_kv: int("attention.key_length")?,
        d_ff: int("feed_forward_length")?,
        num_layers: int("block_count")? as usize,
        num_decoder_layers: int("decoder_block_count").ok().map(|n| n as usize),
        num_heads: int("attention.head_count")?,
        relative_attention_num_buckets: Some(int("attention.relative_buckets_count")?),
        relative_attention_max_distance: None,
        layer_norm_epsilon: float("attention.layer_norm_rms_epsilon").or_else(|| float("attention.layer_norm_epsilon")),
        feed_forward_proj: Some(if gated { "gated-gelu" } else { "relu" }.into()),
        tie_word_embeddings: Some(!map.contains_key("lm_head.weight")),
        scale_decoder_outputs: None,
        transformers_version: None,
        pad_token_id: id("tokenizer.ggml.padding_token_id").unwrap_or(0),
        eos_token_id: id("tokenizer.ggml.eos_token_id").map(Into::into),
        decoder_start_token_id: int("decoder_start_token_id").ok(),
    };
    crate::model::families::t5::build(&cfg, file, Weights::new(map, file.to_string(), opts, None))
}
