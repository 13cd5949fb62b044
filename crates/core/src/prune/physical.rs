//! `prune_heads`: a copy of a model with closed heads removed from the weights (smaller
//! Q/K/V row blocks and W^O column blocks), computing what the masked model computes.

use crate::model::{HeadId, Model, ModelError};
use tch::Tensor;

/// A fresh copy of `model` (reloaded from its files, then given `weights` when they are the
/// jointly trained ones, in `params_mut` order) without the heads `closed`.
pub fn prune_heads(model: &Model, closed: &[HeadId], weights: Option<&[Tensor]>) -> Result<Model, ModelError> {
    if model.pruned_physically() {
        return Err(ModelError::Invalid(format!(
            "{} was already pruned physically; prune the original model",
            model.name()
        )));
    }
    let absent = model.absent();
    for h in closed.iter().filter(|h| !absent.contains(h)) {
        model.check_head(*h)?;
    }
    let mut m = Model::load(&model.path, model.opts)?;
    m.id = model.id.clone();
    m.net.forced_bos.set(model.net.forced_bos.get()); // a target language chosen at load (`tgt_lang`)
    if let Some(w) = weights {
        let n = m.net.params_mut().len();
        if n != w.len() {
            return Err(ModelError::Invalid(format!(
                "prune_heads: {} weight tensors given, the model has {n}",
                w.len()
            )));
        }
        m.net.map_params(|i, _| w[i].shallow_clone());
    }
    remove_heads(&mut m, closed, &model.name())?;
    Ok(m)
}

/// Removes the heads `closed` from `m`'s weights in place, each layer through its mixer's
/// [`crate::model::mixer::Mixer::keep_heads`] (which refuses, saying why, where removing
/// cannot equal masking); `name` names the model in errors. What [`prune_heads`] does to its
/// fresh copy.
pub fn remove_heads(m: &mut Model, closed: &[HeadId], name: &str) -> Result<(), ModelError> {
    // A hybrid's layers without heads have nothing to remove (their gates are held closed).
    let absent = m.absent();
    let closed: Vec<HeadId> = closed.iter().filter(|h| !absent.contains(h)).copied().collect();
    let closed = closed.as_slice();
    for h in closed {
        m.check_head(*h)?;
    }
    for s in m.kinds() {
        for l in 0..s.n_layers {
            let gone: Vec<usize> =
                closed.iter().filter(|h| h.kind == s.kind && h.layer_idx == l).map(|h| h.head).collect();
            if gone.is_empty() {
                continue;
            }
            let keep: Vec<usize> = (0..s.n_heads).filter(|h| !gone.contains(h)).collect();
            let Some(a) = m.mixer_mut(s.kind, l) else { continue };
            a.keep_heads(&keep)
                .map_err(|why| ModelError::Invalid(format!("layer {l} of {name}: {why}; use with_gates")))?;
        }
    }
    let mut removed = closed.to_vec();
    removed.sort();
    removed.dedup();
    m.removed = removed;
    m.n_params = m.count_params();
    Ok(())
}
