//! AttnLRP (Achtibat et al. 2024; docs/methods.md#attnlrp): relevance as gradient x input
//! through the model's one forward run under [`GradRules::AttnLrp`] (the rules LXT 2.1 implements),
//! giving every head's relevance (at the input of W^O) and every input token's relevance (at
//! its token embedding) in one backward per set of seeds. Signed, not rescaled: relevance that
//! biases and constant embeddings absorb is lost, as in LXT.

use super::lrp::{LrpOptions, LrpResult, Seed};
use super::AnalysisError;
use crate::data::Dataset;
use crate::model::hooks::{At, GradRules, Hooks, Point};
use crate::model::nn::Gates;
use crate::model::{Kind, Model, ModelError};
use tch::{Device, Kind as DType, Tensor};

/// Relevance of one set of rows (each row one seed set).
pub struct Relevance {
    /// `[R, T]`: each input token's relevance (summed over its embedding's units).
    pub input: Tensor,
    /// Per layer `[R, H]`: each head's relevance (summed over positions and units of its
    /// context vector), heads in physical order (`[R, 0]` for a layer without heads).
    pub heads: Vec<Tensor>,
    /// `[R]`: the seeds' total per row.
    pub seed: Tensor,
    /// `[R, T]` with a `Logit` seed: the top-1 token id at each position (the token a seed
    /// without a target explains).
    pub top: Option<Tensor>,
}

/// One forward and one backward over `ids [R, T]` (`mask [R, T]`), seeding the positions where
/// `seed_at [R, T]` is 1: `Logit`, the position's top-1 logit (or, with `target`, the logit of
/// that token id); `Norm`, its final hidden units with relevance `h * h`.
pub fn relevance(
    model: &Model,
    ids: &Tensor,
    mask: &Tensor,
    seed_at: &Tensor,
    seed: Seed,
    gates: &Gates,
    target: Option<i64>,
) -> Result<Relevance, ModelError> {
    if !gates.fill.is_empty() {
        return Err(ModelError::Invalid("AttnLRP: this view mean-ablates its closed heads; the relevance rules propagate through gates that scale a context, not through a mean put in its place: run it on a zero-ablated view".into()));
    }
    // Gradients are this computation's own: a caller's no_grad guard does not switch them off.
    tch::with_grad(|| relevance_with_grad(model, ids, mask, seed_at, seed, gates, target))
}

fn relevance_with_grad(
    model: &Model,
    ids: &Tensor,
    mask: &Tensor,
    seed_at: &Tensor,
    seed: Seed,
    gates: &Gates,
    target: Option<i64>,
) -> Result<Relevance, ModelError> {
    let mut leaves =
        Leaves { kind: model.net.stack_kind, tok: None, ctx: (0..model.net.stack.len()).map(|_| None).collect() };
    let h = model.net.encode(ids, mask, gates, Some(&mut leaves))?;
    let Leaves { tok, ctx, .. } = leaves;
    let tok =
        tok.ok_or_else(|| ModelError::Invalid("AttnLRP: the forward passed no token embeddings (hook_embed)".into()))?;
    let (per_position, top) = match seed {
        Seed::Logit => {
            let logits = model.net.logits_before_cap(&h)?;
            let top = logits.detach().argmax(-1, false);
            let width = logits.size().last().copied().unwrap_or(0);
            let per = match target {
                Some(id) if !(0..width).contains(&id) => {
                    return Err(ModelError::Invalid(format!(
                        "target id {id} is outside the output head's {width} tokens"
                    )))
                }
                Some(id) => logits.select(-1, id),
                None => logits.amax([-1i64].as_slice(), false),
            };
            (per, Some(top))
        }
        Seed::Norm if target.is_some() => {
            return Err(ModelError::Invalid(
                "a target token needs a language model's output head (seed \"logit\")".into(),
            ))
        }
        Seed::Norm => ((&h * h.detach()).sum_dim_intlist([-1i64].as_slice(), false, h.kind()), None),
    };
    let seeded = per_position * seed_at.to_kind(h.kind());
    let mut inputs = vec![tok.shallow_clone()];
    inputs.extend(ctx.iter().flatten().map(|c| c.shallow_clone()));
    let grads = Tensor::f_run_backward(&[seeded.sum(h.kind())], &inputs, false, false)?;
    let input = (&tok * &grads[0]).sum_dim_intlist([-1i64].as_slice(), false, DType::Float);
    let mut g = grads[1..].iter();
    let rows = ids.size()[0];
    let heads = ctx
        .iter()
        .map(|c| match (c, c.as_ref().and_then(|_| g.next())) {
            (Some(c), Some(g)) => (c * g).sum_dim_intlist([2i64, 3].as_slice(), false, DType::Float),
            _ => Tensor::zeros([rows, 0], (DType::Float, ids.device())),
        })
        .collect();
    Ok(Relevance { input, heads, seed: seeded.detach().sum_dim_intlist([1i64].as_slice(), false, DType::Float), top })
}

/// Head relevance of the self-attention stack over a dataset, as [`super::lrp::lrp`] reports it:
/// per layer each head's share of the layer's `sum |R_h|`, per seed set, averaged over seed sets
/// (`per_prediction`: one per seeded position, else one per sentence).
pub fn lrp(
    model: &Model,
    data: &Dataset,
    opts: &LrpOptions,
    gates: &Gates,
    stop: &dyn Fn() -> bool,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<LrpResult, AnalysisError> {
    if data.is_empty() {
        return Err(AnalysisError::Input(format!("the dataset {} is empty", data.name)));
    }
    let seed = opts.seed_for(model);
    if seed == Seed::Logit && !model.is_lm() {
        let why = if model.translates() {
            "AttnLRP runs on the self-attention stack; through a translation model's decoder use rule \"ab\" or \"zplus\", or seed \"norm\" for its encoder"
        } else {
            "it has no output head: use seed \"norm\""
        };
        return Err(AnalysisError::Input(format!("seed \"logit\" with rule \"attnlrp\" on {}: {why}", model.name())));
    }
    let kind = model.net.stack_kind;
    let encoded = model.tokenize_all(data.texts())?;
    let mut sums: Vec<Vec<f64>> = model.layer_heads(kind).into_iter().map(|h| vec![0f64; h]).collect();
    let (mut sets, mut worst) = (0usize, 0f64);
    let batches: Vec<_> = model.batches(&encoded, opts.batch_tokens).collect();
    let n = batches.len();
    for (bi, (_, b)) in batches.into_iter().enumerate() {
        if stop() {
            return Err(ModelError::Interrupted.into());
        }
        // The positions seeded: a language model's every position but the last predicts the
        // next token (seed "logit"); with "norm", every real (non-special, non-padding)
        // position, the predictions of the other LRP rules.
        let real = b.mask.to_kind(DType::Float);
        let seedable = match seed {
            Seed::Logit => {
                let t = real.size()[1];
                Tensor::cat(&[real.narrow(1, 1, t - 1), real.narrow(1, 0, 1).zeros_like()], 1)
            }
            Seed::Norm => model.real_mask(&b.encoded, real.size()[1]),
        };
        let (ids, mask, seed_at) = if opts.per_prediction {
            one_per_row(&b.ids, &b.mask, &seedable)?
        } else {
            (b.ids.shallow_clone(), b.mask.shallow_clone(), seedable)
        };
        if ids.size()[0] == 0 {
            continue;
        }
        // Rows in chunks of about batch_tokens tokens.
        let t = ids.size()[1];
        let chunk = (opts.batch_tokens as i64 / t.max(1)).max(1);
        let rows = ids.size()[0];
        for start in (0..rows).step_by(chunk as usize) {
            let len = chunk.min(rows - start);
            let r = relevance(
                model,
                &ids.narrow(0, start, len),
                &mask.narrow(0, start, len),
                &seed_at.narrow(0, start, len),
                seed,
                gates,
                None,
            )?;
            for (l, hr) in r.heads.iter().enumerate() {
                let a = hr.abs().to_kind(DType::Double);
                let share = &a / a.sum_dim_intlist([1i64].as_slice(), true, DType::Double).clamp_min(1e-30);
                let v = Vec::<f64>::try_from(
                    share.sum_dim_intlist([0i64].as_slice(), false, DType::Double).to_device(Device::Cpu),
                )
                .map_err(ModelError::from)?;
                for (s, x) in sums[l].iter_mut().zip(v) {
                    *s += x;
                }
            }
            let ratio = Vec::<f64>::try_from(
                (r.input.sum_dim_intlist([1i64].as_slice(), false, DType::Double) / r.seed.to_kind(DType::Double))
                    .to_device(Device::Cpu),
            )
            .map_err(ModelError::from)?;
            worst = ratio.iter().fold(worst, |w, x| w.max((x - 1.0).abs()));
            sets += len as usize;
        }
        progress(bi + 1, n);
    }
    let totals: Vec<Vec<f64>> = sums.into_iter().enumerate().map(|(l, row)| model.spread(kind, l, &row)).collect();
    let grid = totals.iter().map(|row| row.iter().map(|s| s / sets.max(1) as f64).collect()).collect();
    Ok(LrpResult {
        kinds: vec![(kind, grid)],
        sums: vec![(kind, totals)],
        predictions: sets,
        max_conservation_error: worst,
        options: LrpOptions { seed: Some(seed), ..opts.clone() },
    })
}

/// Every seedable position of every row as a row of its own: `(ids, mask, seed_at)` with one
/// seeded position per row.
fn one_per_row(ids: &Tensor, mask: &Tensor, seedable: &Tensor) -> Result<(Tensor, Tensor, Tensor), ModelError> {
    let at = seedable.f_nonzero()?; // [N, 2]: (row, position)
    let (rows, pos) = (at.select(1, 0), at.select(1, 1));
    let t = ids.size()[1];
    let one_hot = pos.one_hot(t).to_kind(DType::Float);
    Ok((ids.index_select(0, &rows), mask.index_select(0, &rows), one_hot))
}

/// The hooks of one AttnLRP pass: the forward's gradients under the AttnLRP rules, the token
/// embeddings made the gradient's leaf at `hook_embed` (the input relevance is taken there),
/// and each layer's contexts at `hook_z` kept (a layer without heads hands out none).
struct Leaves {
    kind: Kind,
    tok: Option<Tensor>,
    ctx: Vec<Option<Tensor>>,
}

impl Hooks for Leaves {
    fn wants(&self, at: At) -> bool {
        at.kind == self.kind && matches!(at.point, Point::Embed | Point::Z)
    }
    fn visit(&mut self, at: At, x: &Tensor) -> Result<Option<Tensor>, ModelError> {
        if at.point == Point::Embed {
            let leaf = x.detach().set_requires_grad(true);
            self.tok = Some(leaf.shallow_clone());
            return Ok(Some(leaf));
        }
        if let Some(slot) = self.ctx.get_mut(at.layer) {
            *slot = Some(x.shallow_clone());
        }
        Ok(None)
    }
    fn rules(&self) -> GradRules {
        GradRules::AttnLrp
    }
}
