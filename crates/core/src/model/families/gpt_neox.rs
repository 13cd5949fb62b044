//! HF GPT-NeoX (`model_type: "gpt_neox"`; the Pythia suite): LayerNorm before each sublayer,
//! attention and MLP in parallel on the layer's input when `use_parallel_residual` (the
//! default: `x + attn(ln1(x)) + mlp(ln2(x))`), rotary positions on the first
//! `rotary_pct * head_size` dimensions of each head (rotate-half, base `rotary_emb_base`, with
//! `rope_scaling`), a fused `query_key_value` laid out per head (`[q_h | k_h | v_h]` for each
//! head `h`), a GELU MLP, a final norm and an untied `embed_out`. Its heads are kind `dec`.

use crate::model::nn::{Activation, Attention, Ffn, Linear, NormKind, NormPosition, Rotary};
use crate::model::readers::hf;
use crate::model::readers::weights::Weights;
use crate::model::transformer::{Embeddings, Positions, StackLayer, Transformer};
use crate::model::{LoadOptions, ModelError};
use serde::Deserialize;
use std::path::Path;
use tch::Tensor;

#[derive(Debug, Deserialize)]
pub(crate) struct Config {
    pub hidden_size: i64,
    pub num_hidden_layers: usize,
    pub num_attention_heads: i64,
    pub intermediate_size: i64,
    pub vocab_size: i64,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// Also written as `partial_rotary_factor` by transformers 4.5x.
    #[serde(default)]
    pub rotary_pct: Option<f64>,
    #[serde(default)]
    pub partial_rotary_factor: Option<f64>,
    /// Also written as `rope_theta`.
    #[serde(default)]
    pub rotary_emb_base: Option<f64>,
    #[serde(default)]
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    /// transformers 5's rotary settings (its `rope_theta` and `partial_rotary_factor` inside).
    #[serde(default)]
    pub rope_parameters: Option<serde_json::Value>,
    #[serde(default)]
    pub max_position_embeddings: Option<i64>,
    /// transformers 5 reads it (as hidden_size / num_attention_heads when absent).
    #[serde(default)]
    pub head_dim: Option<i64>,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    #[serde(default = "default_true")]
    pub use_parallel_residual: bool,
    #[serde(default = "default_true")]
    pub attention_bias: bool,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub eos_token_id: Option<serde_json::Value>,
    /// The rotary dimensions per head when known as a count (GGUF's `rope.dimension_count`),
    /// not as a fraction of the head.
    #[serde(skip)]
    pub rotary_dims: Option<i64>,
}

/// How the fused `query_key_value` rows are laid out: HF's per head (`[q_h | k_h | v_h]` for
/// each head `h`), or llama.cpp's GGUF (every query row, then every key row, then every value
/// row: its converter reorders them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QkvRows {
    PerHead,
    Stacked,
}

fn default_act() -> String {
    "gelu".into()
}

fn default_eps() -> f64 {
    1e-5
}

fn default_true() -> bool {
    true
}

pub fn load(dir: &Path, opts: LoadOptions) -> Result<Transformer, ModelError> {
    let cfg: Config = hf::typed_config(dir)?;
    let cfg_file = dir.join("config.json").display().to_string();
    let (map, file) = hf::weights(dir, opts.dtype)?;
    // GPTNeoXForCausalLM saves `gpt_neox.`-prefixed names (and `embed_out`); GPTNeoXModel none.
    build(&cfg, &cfg_file, Weights::new(map, file, opts, Some("gpt_neox.")), QkvRows::PerHead)
}

/// The model of `cfg` (read from `cfg_file`) over HF's tensor names in `w`.
pub(crate) fn build(
    cfg: &Config,
    cfg_file: &str,
    mut w: Weights,
    qkv_rows: QkvRows,
) -> Result<Transformer, ModelError> {
    let bad = |why: String| ModelError::Config(cfg_file.to_string(), why);
    let (d, h) = (cfg.hidden_size, cfg.num_attention_heads);
    if h <= 0 || d <= 0 || d % h != 0 {
        return Err(bad(format!("hidden_size {d} is not a positive multiple of num_attention_heads {h}")));
    }
    let dh = d / h;
    if let Some(x) = cfg.head_dim.filter(|&x| x != dh) {
        return Err(bad(format!("head_dim {x} differs from hidden_size {d} / num_attention_heads {h}: GPT-NeoX heads of another size are not supported")));
    }
    let act = match cfg.hidden_act.as_str() {
        "gelu" => Activation::Gelu,
        "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Activation::GeluTanh,
        "relu" => Activation::Relu,
        "silu" => Activation::Silu,
        other => return Err(bad(format!("hidden_act '{other}' is not supported (gelu, gelu_new, relu, silu)"))),
    };
    // transformers 4 writes rotary_pct / rotary_emb_base (or partial_rotary_factor / rope_theta),
    // transformers 5 rope_parameters; two names of one setting must agree.
    let same = |what: &str, a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(x), Some(y)) if (x - y).abs() > 1e-12 * x.abs().max(y.abs()) => {
            Err(bad(format!("{what} is given twice, as {x} and {y}: remove one")))
        }
        _ => Ok(a.or(b)),
    };
    let old = hf::Rope4 {
        theta: same("the rotary base (rotary_emb_base, rope_theta)", cfg.rotary_emb_base, cfg.rope_theta)?,
        scaling: cfg.rope_scaling.as_ref(),
        partial_rotary_factor: same(
            "the rotary fraction (rotary_pct, partial_rotary_factor)",
            cfg.rotary_pct,
            cfg.partial_rotary_factor,
        )?,
    };
    let rope = hf::rope_settings(cfg.rope_parameters.as_ref(), old, "full_attention").map_err(bad)?;
    let pct = rope.partial_rotary_factor.unwrap_or(0.25);
    if !(0.0..=1.0).contains(&pct) {
        return Err(bad(format!("rotary_pct {pct} must be in [0, 1]")));
    }
    // As transformers: int(head_size * rotary_pct) rotary dimensions.
    let rope_dim = cfg.rotary_dims.unwrap_or((dh as f64 * pct) as i64);
    if rope_dim % 2 != 0 {
        return Err(bad(format!("rotary_pct {pct} gives {rope_dim} rotary dimensions per head, not an even number")));
    }
    let scaling = rope.scaling_for(cfg.max_position_embeddings, None, 0).map_err(bad)?;
    let base = rope.theta.unwrap_or(10000.0);
    let eps = cfg.layer_norm_eps;
    let ln = |w: &mut Weights, name: String| w.norm(NormKind::Layer, &name, d, true, eps);
    let ff = cfg.intermediate_size;
    let mut layers = Vec::new(); // the layer count is the config's: nothing is reserved for it
    for l in 0..cfg.num_hidden_layers {
        let p = format!("layers.{l}");
        let proj =
            |w: &mut Weights, name: &str, out: i64, inp: i64, bias: bool| w.scoped(&p).linear(name, out, inp, bias);
        // query_key_value: [3D, D] rows as [H, 3, dh] (head h's query, key and value rows), or
        // stacked as [3, D].
        let qkv = proj(&mut w, "attention.query_key_value", 3 * d, d, cfg.attention_bias)?;
        let part = |t: &Tensor, i: i64| -> Result<Tensor, ModelError> {
            if qkv_rows == QkvRows::Stacked {
                return Ok(t.f_narrow(0, i * d, d)?.contiguous());
            }
            let rest: Vec<i64> = t.size()[1..].to_vec();
            let mut shape = vec![h, 3, dh];
            shape.extend(&rest);
            let mut flat = vec![d];
            flat.extend(&rest);
            Ok(t.f_view(shape.as_slice())?.f_select(1, i)?.f_reshape(flat.as_slice())?.contiguous())
        };
        let split = |i: i64| -> Result<Linear, ModelError> {
            Ok(Linear { w: part(&qkv.w, i)?, b: qkv.b.as_ref().map(|b| part(b, i)).transpose()? })
        };
        layers.push(StackLayer::new(
            Attention::new(
                split(0)?,
                split(1)?,
                split(2)?,
                proj(&mut w, "attention.dense", d, d, cfg.attention_bias)?,
                h,
                h,
                dh,
            )
            .with_rotary(Some(Rotary {
                base,
                dim: rope_dim,
                offset: 0,
                half: true,
                scaling: scaling.clone(),
            })),
            ln(&mut w, format!("{p}.input_layernorm"))?,
            Ffn {
                up: proj(&mut w, "mlp.dense_h_to_4h", ff, d, true)?,
                down: proj(&mut w, "mlp.dense_4h_to_h", d, ff, true)?,
                act,
                gate: None,
            },
            ln(&mut w, format!("{p}.post_attention_layernorm"))?,
            if cfg.use_parallel_residual { NormPosition::Parallel } else { NormPosition::Pre },
        ));
    }
    let tokens = w.get("embed_in.weight", &[cfg.vocab_size, d])?;
    let output = w.output_or_tied("embed_out.weight", &tokens, cfg.tie_word_embeddings)?;
    let embed = Embeddings { tokens, scale: 1.0, positions: Positions::None, token_type: None, norm: None };
    let final_norm = ln(&mut w, "final_layer_norm".into())?;
    Ok(Transformer::decoder_only(
        embed,
        layers,
        Some(final_norm),
        output,
        hf::first_id(&cfg.eos_token_id).unwrap_or(0),
        cfg.max_position_embeddings,
    ))
}
