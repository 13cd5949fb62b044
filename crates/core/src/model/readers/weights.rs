//! A checkpoint's tensors by name, handed out once each, checked for shape and placed on the
//! model's device and dtype; and the loader toolkit the checkpoint families build layers with
//! (`linear`, `norm`, `scoped` names, the tied-or-own output), so that each family file shows
//! its checkpoint's key names where its layers are built.

use crate::model::nn::{Linear, Norm, NormKind};
use crate::model::transformer::place;
use crate::model::{LoadOptions, ModelError};
use std::collections::HashMap;
use tch::Tensor;

pub struct Weights {
    pub map: HashMap<String, Tensor>,
    /// The checkpoint file, named in errors.
    pub file: String,
    pub opts: LoadOptions,
    /// A prefix some checkpoints put before every name (`bert.`), tried second.
    pub prefix: Option<&'static str>,
}

impl Weights {
    pub fn new(map: HashMap<String, Tensor>, file: String, opts: LoadOptions, prefix: Option<&'static str>) -> Self {
        Weights { map, file, opts, prefix }
    }

    /// Removes and returns a tensor, unplaced (with the prefix tried second).
    pub fn take(&mut self, name: &str) -> Option<Tensor> {
        self.map.remove(name).or_else(|| self.prefix.and_then(|p| self.map.remove(&format!("{p}{name}"))))
    }

    /// The shape of a tensor still there.
    pub fn shape(&self, name: &str) -> Option<Vec<i64>> {
        self.map.get(name).or_else(|| self.prefix.and_then(|p| self.map.get(&format!("{p}{name}")))).map(|t| t.size())
    }

    /// A tensor checked for shape, on the model's device and dtype.
    pub fn get(&mut self, name: &str, shape: &[i64]) -> Result<Tensor, ModelError> {
        let t =
            self.take(name).ok_or_else(|| ModelError::MissingTensor { file: self.file.clone(), name: name.into() })?;
        if t.size() != shape {
            return Err(ModelError::BadShape {
                file: self.file.clone(),
                name: name.into(),
                want: shape.to_vec(),
                got: t.size(),
            });
        }
        Ok(place(t, self.opts.device, self.opts.dtype))
    }

    /// A linear layer: `{name}.weight` `[out, inp]` and, with `bias`, `{name}.bias` `[out]`.
    pub fn linear(&mut self, name: &str, out: i64, inp: i64, bias: bool) -> Result<Linear, ModelError> {
        let w = self.get(&format!("{name}.weight"), &[out, inp])?;
        let b = if bias { Some(self.get(&format!("{name}.bias"), &[out])?) } else { None };
        Ok(Linear { w, b })
    }

    /// A norm of width `d`: `{name}.weight` and, with `bias`, `{name}.bias`.
    pub fn norm(&mut self, kind: NormKind, name: &str, d: i64, bias: bool, eps: f64) -> Result<Norm, ModelError> {
        let weight = self.get(&format!("{name}.weight"), &[d])?;
        let bias = if bias { Some(self.get(&format!("{name}.bias"), &[d])?) } else { None };
        Ok(Norm { kind, weight, bias, eps })
    }

    /// The output projection `[vocab, d]`: the checkpoint's own `name` where it holds one,
    /// else (`tie`) the token table itself, shared (one tensor: the parameter walk counts it
    /// once); a checkpoint that must hold its own and does not is an error naming it.
    pub fn output_or_tied(&mut self, name: &str, tokens: &Tensor, tie: bool) -> Result<Tensor, ModelError> {
        if tie && self.shape(name).is_none() {
            return Ok(tokens.shallow_clone());
        }
        self.get(name, &tokens.size())
    }

    /// The tensors under `prefix` (`model.layers.3`): `scoped(p).linear("self_attn.q_proj", ..)`
    /// reads `model.layers.3.self_attn.q_proj.weight`.
    pub fn scoped<'a>(&'a mut self, prefix: &str) -> Scope<'a> {
        Scope { w: self, prefix: prefix.to_string() }
    }
}

/// [`Weights`] under a name prefix (one layer's tensors).
pub struct Scope<'a> {
    pub w: &'a mut Weights,
    pub prefix: String,
}

impl Scope<'_> {
    fn name(&self, name: &str) -> String {
        format!("{}.{name}", self.prefix)
    }

    /// [`Weights::linear`] of `{prefix}.{name}`.
    pub fn linear(&mut self, name: &str, out: i64, inp: i64, bias: bool) -> Result<Linear, ModelError> {
        let n = self.name(name);
        self.w.linear(&n, out, inp, bias)
    }

    /// [`Weights::norm`] of `{prefix}.{name}`.
    pub fn norm(&mut self, kind: NormKind, name: &str, d: i64, bias: bool, eps: f64) -> Result<Norm, ModelError> {
        let n = self.name(name);
        self.w.norm(kind, &n, d, bias, eps)
    }

    /// [`Weights::get`] of `{prefix}.{name}`.
    pub fn get(&mut self, name: &str, shape: &[i64]) -> Result<Tensor, ModelError> {
        let n = self.name(name);
        self.w.get(&n, shape)
    }
}
