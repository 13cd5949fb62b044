//! Resumed passes: many rows of a causal stack, each restarting at its own layer and position
//! from a changed value, run together through the layers above (activation patching's grouped
//! passes). The model drives the layers; the caller says, per group and layer, which rows enter
//! and from what ([`Entry`]). What follows a layer's attention runs once for every group of the
//! pass, flattened to positions, where the layer reads each position alone
//! ([`super::transformer::StackLayer::position_wise`]); elsewhere each group runs apart.

use super::hooks::{At, Hooks, Point, Put};
use super::nn::{Gates, KeysValues};
use super::transformer::{Queries, Start, Stop, Transformer};
use super::ModelError;
use tch::Tensor;

/// Rows that enter a resumed pass at one layer, over positions `from..` of their group: `n`
/// copies of the batch (`[n * B, ..]`, row `j * B + b`).
pub enum Entry {
    /// The layer's input `x` `[n * B, T - from, D]` with its attention's `hook_z` replaced by
    /// `z` `[n * B, H, T - from, d_head]`: the attention itself is not recomputed.
    Z { x: Tensor, z: Tensor },
    /// The layer's input itself (`hook_resid_pre`) replaced.
    Input(Tensor),
    /// The layer's input `x` run with the value at `point` of this layer replaced by `value`.
    Put { x: Tensor, point: Point, value: Tensor },
}

/// A group's part of a layer's output: an attention half (its index among the layer's halves)
/// or a whole layer's output.
enum Piece {
    Half(usize),
    Whole(Tensor),
}

impl Transformer {
    /// One pass of groups of resumed rows. Group `g` changes positions `from[g]..` of a batch
    /// of `batch` sequences whose base run left, per layer, its keys and values at every
    /// position in `base` (as a [`super::transformer::StackCache`] holds them). From layer
    /// `first` up, `entries(g, l)` gives the rows of group `g` that enter at layer `l` (after
    /// the rows already running, which go through it over positions `from[g]..` attending to
    /// the base run's keys and values of the positions before). Only the last position's
    /// output is read: the top layer computes that position alone (every position's keys and
    /// values still enter its attention). Returns each group's final states after the final
    /// norm, `[rows x B, 1, D]`, rows in the order they entered.
    pub fn resume_pass(
        &self,
        from: &[i64],
        first: usize,
        base: &[Option<KeysValues>],
        batch: i64,
        entries: &mut dyn FnMut(usize, usize) -> Result<Option<Entry>, ModelError>,
        gates: &Gates,
    ) -> Result<Vec<Tensor>, ModelError> {
        if !self.causal {
            return Err(ModelError::Invalid("resuming a pass needs a causal (decoder-only) stack".into()));
        }
        // The base run's keys and values at positions before `from`, for `reps` copies of the
        // batch (per key/value head, as the layers resumed read them).
        let prefix = |l: usize, from: i64, reps: i64| -> Result<Option<KeysValues>, ModelError> {
            match (base.get(l).and_then(Option::as_ref), self.stack.get(l)) {
                (Some(kv), Some(layer)) if from > 0 && kv.k.dim() == 4 => {
                    let kv = KeysValues { k: kv.k.f_narrow(2, 0, from)?, v: kv.v.f_narrow(2, 0, from)? }
                        .grouped(layer.attention().map_or(1, |a| a.n_kv_heads))?;
                    Ok(Some(KeysValues { k: kv.k.f_repeat([reps, 1, 1, 1])?, v: kv.v.f_repeat([reps, 1, 1, 1])? }))
                }
                _ => Ok(None),
            }
        };
        let n_layers = self.stack.len();
        let top = n_layers.saturating_sub(1);
        let last = |y: Tensor| -> Result<Tensor, ModelError> { Ok(y.f_narrow(1, y.size()[1] - 1, 1)?) };
        let mut carry: Vec<Option<Tensor>> = from.iter().map(|_| None).collect();
        for l in first..n_layers {
            let queries = if l == top { Queries::Last } else { Queries::All };
            // Per group, its pieces in row order: attention halves (finished together below)
            // or whole layer outputs.
            let mut halves: Vec<(Tensor, Tensor)> = Vec::new();
            let mut pieces: Vec<Vec<Piece>> = from.iter().map(|_| Vec::new()).collect();
            let mut half = |h: (Tensor, Tensor)| {
                halves.push(h);
                Piece::Half(halves.len() - 1)
            };
            for (g, &from) in from.iter().enumerate() {
                if let Some(x) = carry[g].take() {
                    let reps = x.size()[0] / batch.max(1);
                    pieces[g].push(half(self.layer_attention(
                        l,
                        &x,
                        from,
                        prefix(l, from, reps)?,
                        gates,
                        &mut None,
                        queries,
                    )?));
                }
                let Some(entry) = entries(g, l)? else { continue };
                let piece = match entry {
                    Entry::Z { x, z } if l == top => {
                        let t = z.size()[2];
                        half(self.layer_attention_from_z(l, &last(x)?, &z.f_narrow(2, t - 1, 1)?, &mut None)?)
                    }
                    Entry::Z { x, z } => half(self.layer_attention_from_z(l, &x, &z, &mut None)?),
                    Entry::Input(x) => {
                        let reps = x.size()[0] / batch.max(1);
                        half(self.layer_attention(l, &x, from, prefix(l, from, reps)?, gates, &mut None, queries)?)
                    }
                    Entry::Put { x, point, value } => {
                        let reps = x.size()[0] / batch.max(1);
                        let mut put = Put { at: At::new(self.stack_kind, l, point), value: &value };
                        let mut h = Some(&mut put as &mut dyn Hooks);
                        let (x, a) =
                            self.layer_attention(l, &x, from, prefix(l, from, reps)?, gates, &mut h, Queries::All)?;
                        let y = self.layer_finish(l, &x, a, gates, &mut h)?;
                        Piece::Whole(if l == top { last(y)? } else { y })
                    }
                };
                pieces[g].push(piece);
            }
            let finished = self.finish_together(l, halves, gates)?;
            for (g, ps) in pieces.into_iter().enumerate() {
                let parts: Vec<Tensor> = ps
                    .into_iter()
                    .map(|p| match p {
                        Piece::Half(i) => finished[i].shallow_clone(),
                        Piece::Whole(y) => y,
                    })
                    .collect();
                carry[g] = match parts.len() {
                    0 => None,
                    1 => parts.into_iter().next(),
                    _ => Some(Tensor::f_cat(&parts, 0)?),
                };
            }
        }
        carry
            .into_iter()
            .map(|c| {
                let x = c.ok_or_else(|| ModelError::Invalid("resume: a group with no rows".into()))?;
                self.run(Start::Layer { layer: n_layers, x: &x, bias: None }, Stop::FinalNorm, gates, &mut None)
            })
            .collect()
    }

    /// Layer `l` finished after its attention for every attention half `(x, a)` of a pass:
    /// where the layer reads each position alone, as one batch (the halves flattened to
    /// positions, concatenated, finished, and split back); otherwise each half apart.
    fn finish_together(
        &self,
        l: usize,
        halves: Vec<(Tensor, Tensor)>,
        gates: &Gates,
    ) -> Result<Vec<Tensor>, ModelError> {
        let position_wise = self.stack.get(l).is_some_and(|layer| layer.position_wise());
        if halves.len() <= 1 || !position_wise {
            return halves.into_iter().map(|(x, a)| self.layer_finish(l, &x, a, gates, &mut None)).collect();
        }
        let shapes: Vec<Vec<i64>> = halves.iter().map(|(x, _)| x.size()).collect();
        let d = shapes[0].last().copied().unwrap_or(0);
        let flat = |t: &Tensor| t.f_reshape([-1, d]);
        let xs = halves.iter().map(|(x, _)| flat(x)).collect::<Result<Vec<_>, _>>()?;
        let as_ = halves.iter().map(|(_, a)| flat(a)).collect::<Result<Vec<_>, _>>()?;
        drop(halves);
        let x = Tensor::f_cat(&xs, 0)?.f_unsqueeze(0)?;
        let a = Tensor::f_cat(&as_, 0)?.f_unsqueeze(0)?;
        drop((xs, as_));
        let y = self.layer_finish(l, &x, a, gates, &mut None)?.f_squeeze_dim(0)?;
        let mut at = 0;
        shapes
            .iter()
            .map(|s| {
                let n = s[..s.len() - 1].iter().product::<i64>();
                let part = y.f_narrow(0, at, n)?.f_view(s.as_slice())?;
                at += n;
                Ok(part)
            })
            .collect()
    }
}
