//! `prune_heads`: a copy of a model with closed heads removed from the weights (smaller
//! Q/K/V row blocks and W^O column blocks), computing what the masked model computes.

use crate::model::nn::{Attention, HeadSlots};
use crate::model::{HeadId, Kind, Model, ModelError};
use tch::Tensor;

/// Keeps the heads `keep` (original numbers) of one attention block.
fn shrink(a: &mut Attention, keep: &[i64]) {
    let width = a.width();
    let dh = a.head_dim;
    let rows: Vec<i64> = keep.iter().flat_map(|&h| h * dh..(h + 1) * dh).collect();
    let idx = Tensor::from_slice(&rows).to_device(a.q.w.device());
    for lin in [&mut a.q, &mut a.k, &mut a.v] {
        lin.w = lin.w.index_select(0, &idx);
        lin.b = lin.b.as_ref().map(|b| b.index_select(0, &idx));
    }
    a.o.w = a.o.w.index_select(1, &idx);
    a.n_heads = keep.len() as i64;
    a.n_kv_heads = keep.len() as i64;
    a.slots = Some(HeadSlots::new(width, keep.iter().map(|&h| h as usize).collect(), idx.device()));
}

/// A fresh copy of `model` (reloaded from its files, then given `weights` when they are the
/// jointly trained ones, in `params_mut` order) without the heads `closed`.
pub fn prune_heads(model: &Model, closed: &[HeadId], weights: Option<&[Tensor]>) -> Result<Model, ModelError> {
    if !model.removed.is_empty() {
        return Err(ModelError::Invalid(format!(
            "{} was already pruned physically; prune the original model",
            model.name()
        )));
    }
    for h in closed {
        model.check_head(*h)?;
    }
    let mut m = Model::load(&model.path, model.opts)?;
    m.id = model.id.clone();
    m.net.forced_bos.set(model.net.forced_bos.get()); // a target language chosen at load (`tgt_lang`)
    if let Some(w) = weights {
        let net = &mut m.net;
        let tied = net.output.as_ref().is_some_and(|o| o.w.data_ptr() == net.embed.tokens.data_ptr());
        let params = net.params_mut();
        if params.len() != w.len() {
            return Err(ModelError::Invalid(format!(
                "prune_heads: {} weight tensors given, the model has {}",
                w.len(),
                params.len()
            )));
        }
        for (dst, src) in params.into_iter().zip(w) {
            *dst = src.shallow_clone();
        }
        if tied {
            if let Some(o) = net.output.as_mut() {
                o.w = net.embed.tokens.shallow_clone();
            }
        }
    }
    for s in m.kinds() {
        for l in 0..s.n_layers {
            let gone: Vec<usize> =
                closed.iter().filter(|h| h.kind == s.kind && h.layer_idx == l).map(|h| h.head).collect();
            if gone.is_empty() {
                continue;
            }
            let keep: Vec<i64> = (0..s.n_heads).filter(|h| !gone.contains(h)).map(|h| h as i64).collect();
            let stack = m.net.stack_kind;
            let a = match s.kind {
                Kind::Cross => m.net.decoder[l].cross.as_mut().map(|(a, _)| a),
                k if k == stack => Some(&mut m.net.encoder[l].attn),
                _ => match &mut m.net.decoder[l].self_block {
                    crate::model::transformer::SelfBlock::Attention(a) => Some(a),
                    crate::model::transformer::SelfBlock::Ssru(_) => None,
                },
            };
            let Some(a) = a else { continue };
            if a.n_kv_heads != a.n_heads {
                return Err(ModelError::Invalid(format!(
                    "prune_heads: {} uses grouped-query attention ({} query heads share {} key/value heads); removing single heads is not supported there, use with_gates",
                    model.name(), a.n_heads, a.n_kv_heads
                )));
            }
            if a.qk_norm.as_ref().is_some_and(|n| !n.per_head) {
                return Err(ModelError::Invalid(format!(
                    "prune_heads: layer {l} of {} normalises the queries and keys of all its heads together (a q/k RMSNorm over all {} heads, as OLMo-2's); removing a head would rescale every other head, so it cannot equal masking: use with_gates",
                    model.name(), a.n_heads
                )));
            }
            shrink(a, &keep);
        }
    }
    let mut removed = closed.to_vec();
    removed.sort();
    removed.dedup();
    m.removed = removed;
    m.n_params = m.count_params();
    Ok(m)
}
