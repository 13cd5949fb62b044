//! HF GPT-2 (`model_type: "gpt2"`): learned positions, LayerNorm before each sublayer, causal
//! self-attention whose Q/K/V come fused in one `c_attn` Conv1D (weights stored `[in, out]`),
//! a GELU (tanh) MLP, a final `ln_f`, and the output tied to `wte`. Its heads are kind `dec`.

use crate::model::nn::{Activation, Attention, Ffn, Linear, Norm, NormKind, NormPosition};
use crate::model::readers::hf;
use crate::model::readers::weights::Weights;
use crate::model::transformer::{place, Embeddings, Positions, StackLayer, Transformer};
use crate::model::{LoadOptions, ModelError};
use serde::Deserialize;
use std::path::Path;
use tch::Tensor;

#[derive(Debug, Deserialize)]
struct Config {
    n_embd: i64,
    n_layer: usize,
    n_head: i64,
    n_positions: i64,
    vocab_size: i64,
    #[serde(default)]
    n_inner: Option<i64>,
    #[serde(default = "default_eps")]
    layer_norm_epsilon: f64,
    #[serde(default = "default_act")]
    activation_function: String,
    #[serde(default)]
    eos_token_id: Option<serde_json::Value>,
}

fn default_eps() -> f64 {
    1e-5
}

fn default_act() -> String {
    "gelu_new".into()
}

/// A Conv1D's weight `[in, out]` as a Linear's `[out, in]`, with its bias.
fn conv1d(w: &mut Weights, prefix: &str, inp: i64, out: i64) -> Result<Linear, ModelError> {
    let name = format!("{prefix}.weight");
    let t = w.take(&name).ok_or_else(|| ModelError::MissingTensor { file: w.file.clone(), name: name.clone() })?;
    if t.size() != [inp, out] {
        return Err(ModelError::BadShape { file: w.file.clone(), name, want: vec![inp, out], got: t.size() });
    }
    Ok(Linear {
        w: place(t.tr().contiguous(), w.opts.device, w.opts.dtype),
        b: Some(w.get(&format!("{prefix}.bias"), &[out])?),
    })
}

fn layer_norm(w: &mut Weights, prefix: &str, d: i64, eps: f64) -> Result<Norm, ModelError> {
    w.norm(NormKind::Layer, prefix, d, true, eps)
}

pub fn load(dir: &Path, opts: LoadOptions) -> Result<Transformer, ModelError> {
    let cfg: Config = hf::typed_config(dir)?;
    let cfg_file = dir.join("config.json").display().to_string();
    let (d, h) = (cfg.n_embd, cfg.n_head);
    if h <= 0 || d % h != 0 {
        return Err(ModelError::Config(cfg_file, format!("n_embd {d} is not a multiple of n_head {h}")));
    }
    let act = match cfg.activation_function.as_str() {
        "gelu_new" | "gelu_pytorch_tanh" => Activation::GeluTanh,
        "gelu" => Activation::Gelu,
        "relu" => Activation::Relu,
        other => {
            return Err(ModelError::Config(
                cfg_file,
                format!("activation_function '{other}' is not supported (gelu_new, gelu, relu)"),
            ))
        }
    };
    let ff = cfg.n_inner.unwrap_or(4 * d);
    let (map, file) = hf::weights(dir, opts.dtype)?;
    // GPT2LMHeadModel saves `transformer.`-prefixed names; GPT2Model none.
    let mut w = Weights::new(map, file, opts, Some("transformer."));
    let eps = cfg.layer_norm_epsilon;
    let mut layers = Vec::new(); // the layer count is the config's: nothing is reserved for it
    for l in 0..cfg.n_layer {
        let p = format!("h.{l}");
        // c_attn: one [D, 3D] Conv1D, split into Q, K, V rows.
        let qkv = conv1d(&mut w, &format!("{p}.attn.c_attn"), d, 3 * d)?;
        let part = |t: &Tensor, i: i64| t.narrow(0, i * d, d).contiguous();
        let bias = qkv.b.as_ref().map(|b| (part(b, 0), part(b, 1), part(b, 2)));
        let lin = |i: i64, b: Option<Tensor>| Linear { w: part(&qkv.w, i), b };
        let (bq, bk, bv) = match bias {
            Some((q, k, v)) => (Some(q), Some(k), Some(v)),
            None => (None, None, None),
        };
        layers.push(StackLayer::new(
            Attention::new(
                lin(0, bq),
                lin(1, bk),
                lin(2, bv),
                conv1d(&mut w, &format!("{p}.attn.c_proj"), d, d)?,
                h,
                h,
                d / h,
            ),
            layer_norm(&mut w, &format!("{p}.ln_1"), d, eps)?,
            Ffn {
                up: conv1d(&mut w, &format!("{p}.mlp.c_fc"), d, ff)?,
                down: conv1d(&mut w, &format!("{p}.mlp.c_proj"), ff, d)?,
                act,
                gate: None,
            },
            layer_norm(&mut w, &format!("{p}.ln_2"), d, eps)?,
            NormPosition::Pre,
        ));
    }
    let tokens = w.get("wte.weight", &[cfg.vocab_size, d])?;
    let positions = w.get("wpe.weight", &[cfg.n_positions, d])?;
    let embed = Embeddings {
        tokens: tokens.shallow_clone(),
        scale: 1.0,
        positions: Positions::Learned(positions),
        token_type: None,
        norm: None,
    };
    let final_norm = layer_norm(&mut w, "ln_f", d, eps)?;
    // The learned position table bounds the input (`Embeddings::finish`).
    Ok(Transformer::decoder_only(
        embed,
        layers,
        Some(final_norm),
        tokens,
        hf::first_id(&cfg.eos_token_id).unwrap_or(0),
        None,
    ))
}
