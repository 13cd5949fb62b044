//! Gradient head importance (Michel et al. 2019; docs/methods.md#gradient-head-importance):
//! per head, the mean over sentences of |dL/dg| (or, for the Fisher variant, of (dL/dg)^2) at
//! the all-open gates, from one forward and one backward per batch. Each sentence of a batch has
//! its own gates (`[B, layers, heads]`), so one backward gives every sentence's own gradient and
//! the result does not depend on how sentences are batched.

use super::AnalysisError;
use crate::data::Dataset;
use crate::model::nn::Gates;
use crate::model::{Kind, KindGrids, Model, ModelError};
use tch::{Device, Kind as DType, Tensor};

options_enum!(ImportanceMetric, "metric", {
    /// Mean |dL/dg| of the task loss on the data's own targets.
    Loss = "loss",
    /// Mean (dL/dg)^2 with targets sampled from the model's own predictions (empirical Fisher).
    Fisher = "fisher",
});

options_enum!(Normalize, "normalize", {
    /// The raw means.
    None = "none",
    /// Each layer's importances divided by their L2 norm (Michel et al. 2019, section 6.1).
    Layer = "layer",
});

#[derive(Debug, Clone)]
pub struct ImportanceOptions {
    pub metric: ImportanceMetric,
    pub normalize: Normalize,
    pub kinds: Vec<Kind>,
    pub batch_tokens: usize,
    /// Seed of the Fisher variant's sampled targets.
    pub seed: u64,
    /// The index of `data`'s first sentence in the dataset it is a shard of (0 for a whole
    /// dataset): the Fisher variant's draws are fixed by the sentence's index in the whole.
    pub row_offset: usize,
}

/// Per kind, `[layer][head]` importances, with the prepared data's target source.
pub struct Importance {
    pub grids: KindGrids,
    /// The sums over sentences behind `grids` (its additive form, docs/methods.md#shards).
    pub sums: KindGrids,
    /// Per kind, `[layer][head]`: whether the head has an importance (open and present).
    pub valid: Vec<(Kind, Vec<Vec<bool>>)>,
    pub targets_from: &'static str,
    pub n_sentences: usize,
}

/// Gradient importance's shard accumulators (docs/methods.md#shards): by kind name,
/// `[layer][head]` the sums over sentences (undefined for a head without a gradient), the
/// sentences, and the seconds they took.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ImportanceAcc {
    pub sums: std::collections::BTreeMap<String, Vec<Vec<crate::shard::Num>>>,
    pub sentences: usize,
    pub seconds: f64,
}
crate::accumulate_fields!(ImportanceAcc { sums, sentences, seconds });

impl ImportanceAcc {
    pub fn of(r: &Importance, seconds: f64) -> ImportanceAcc {
        let sums = r
            .sums
            .iter()
            .map(|(k, g)| {
                (k.to_string(), g.iter().map(|row| row.iter().map(|&x| crate::shard::Num(x)).collect()).collect())
            })
            .collect();
        ImportanceAcc { sums, sentences: r.n_sentences, seconds }
    }
}

/// The importance of every head of `opts.kinds` over `data`, on the model as given by `base`
/// (a masked view's gates): a closed head gets NaN (it has no gradient to measure).
pub fn head_importance(
    model: &Model,
    data: &Dataset,
    base: &Gates,
    opts: &ImportanceOptions,
    stop: &dyn Fn() -> bool,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Importance, AnalysisError> {
    if data.is_empty() {
        return Err(AnalysisError::Input(format!("the dataset {} is empty", data.name)));
    }
    if !model.has_task_loss() {
        return Err(AnalysisError::Input(format!("head_importance needs a task loss, and {} is an encoder without an output head (docs/methods.md#task-loss): use ablation_sweep with metric \"cosine\"", model.name())));
    }
    let references: Option<Vec<&str>> = data.items.iter().map(|i| i.target.as_deref()).collect();
    let prepared = model.prepare(&data.texts(), references.as_deref(), true, opts.batch_tokens, base)?;
    let shapes: Vec<_> = opts.kinds.iter().map(|k| model.kind_shape(*k)).collect::<Result<_, _>>()?;
    let dev = model.device();
    let mut sums: Vec<Tensor> =
        shapes.iter().map(|s| Tensor::zeros([s.n_layers as i64, s.n_heads as i64], (DType::Double, dev))).collect();
    let n_batches = prepared.batches.len();
    for (bi, b) in prepared.batches.iter().enumerate() {
        if stop() {
            return Err(ModelError::Interrupted.into());
        }
        let rows = b.ids.size()[0];
        // One leaf of ones per kind and sentence; the gates used are base x leaf.
        let leaves: Vec<Tensor> = shapes
            .iter()
            .map(|s| {
                Tensor::ones([rows, s.n_layers as i64, s.n_heads as i64], (DType::Float, dev)).set_requires_grad(true)
            })
            .collect();
        let mut gates = base.share();
        for (s, leaf) in shapes.iter().zip(&leaves) {
            gates.multiply(s.kind, leaf.shallow_clone());
        }
        let (t, tm) = b.targets.as_ref().ok_or(ModelError::NoOutputHead)?;
        let enc = model.net.encode(&b.ids, &b.mask, &gates, None)?;
        let logp = model.log_probs(&model.teacher_states(&enc, &b.mask, t, &gates)?, DType::Float)?;
        let labels = match opts.metric {
            ImportanceMetric::Loss => t.shallow_clone(),
            ImportanceMetric::Fisher => {
                sampled_targets(&logp, &b.rows.iter().map(|r| r + opts.row_offset).collect::<Vec<_>>(), opts.seed)?
            }
        };
        let nll = crate::model::loss::nll(&logp, &labels);
        // Each sentence's mean token loss; their sum's gradient in sentence s's gates is dL_s/dg.
        let per_sentence = (nll * tm).sum_dim_intlist([1i64].as_slice(), false, DType::Float)
            / tm.sum_dim_intlist([1i64].as_slice(), false, DType::Float).clamp_min(1.0);
        let grads = Tensor::f_run_backward(&[per_sentence.sum(DType::Float)], &leaves, false, false)
            .map_err(ModelError::from)?;
        for (sum, g) in sums.iter_mut().zip(grads) {
            let g = g.to_kind(DType::Double);
            let v = match opts.metric {
                ImportanceMetric::Loss => g.abs(),
                ImportanceMetric::Fisher => g.square(),
            };
            *sum += v.sum_dim_intlist([0i64].as_slice(), false, DType::Double);
        }
        progress(bi + 1, n_batches);
    }
    let (mut all_sums, mut valid) = (Vec::new(), Vec::new());
    for (s, sum) in shapes.iter().zip(sums) {
        let v = Vec::<f64>::try_from(sum.to_device(Device::Cpu).reshape([-1])).map_err(ModelError::from)?;
        let open = match base.of(s.kind) {
            Some(g) => Vec::<f64>::try_from(g.to_device(Device::Cpu).to_kind(DType::Double).reshape([-1]))
                .map_err(ModelError::from)?,
            None => vec![1.0; v.len()],
        };
        all_sums.push((s.kind, (0..s.n_layers).map(|l| v[l * s.n_heads..(l + 1) * s.n_heads].to_vec()).collect()));
        valid.push((
            s.kind,
            (0..s.n_layers)
                .map(|l| {
                    (0..s.n_heads)
                        .map(|h| open[l * s.n_heads + h] != 0.0 && model.present(s.kind, l).contains(&h))
                        .collect()
                })
                .collect(),
        ));
    }
    let grids = finish(&all_sums, &valid, prepared.n_sentences, opts.normalize);
    Ok(Importance {
        grids,
        sums: all_sums,
        valid,
        targets_from: prepared.targets_from,
        n_sentences: prepared.n_sentences,
    })
}

/// Importances from their sums over `n` sentences: the mean, normalised per layer when asked
/// (over every head of the layer), NaN for a head without a value.
pub fn finish(sums: &KindGrids, valid: &[(Kind, Vec<Vec<bool>>)], n: usize, normalize: Normalize) -> KindGrids {
    sums.iter()
        .zip(valid)
        .map(|((kind, grid), (_, ok))| {
            let g = grid
                .iter()
                .zip(ok)
                .map(|(row, ok)| {
                    let mean: Vec<f64> = row.iter().map(|x| x / n as f64).collect();
                    let scale = match normalize {
                        Normalize::None => 1.0,
                        Normalize::Layer => mean.iter().map(|x| x * x).sum::<f64>().sqrt().max(1e-20),
                    };
                    mean.iter().zip(ok).map(|(x, &ok)| if ok { x / scale } else { f64::NAN }).collect()
                })
                .collect();
            (*kind, g)
        })
        .collect()
}

/// Targets drawn from the model's own predictions `logp [B, T, V]`: target t of sentence `row`
/// is the inverse CDF at a uniform number fixed by (seed, row, t), so the draw does not depend
/// on batching.
fn sampled_targets(logp: &Tensor, rows: &[usize], seed: u64) -> Result<Tensor, ModelError> {
    let (b, t) = (logp.size()[0], logp.size()[1]);
    let u: Vec<f64> = rows.iter().flat_map(|&r| (0..t).map(move |j| uniform(seed, r as u64, j as u64))).collect();
    let u = Tensor::from_slice(&u).view([b, t, 1]).to_device(logp.device());
    let _g = tch::no_grad_guard();
    let cdf = logp.to_kind(DType::Double).exp().cumsum(-1, DType::Double);
    let last = cdf.size()[2] - 1;
    let u = u * cdf.narrow(2, last, 1);
    Ok(u.f_searchsorted(&cdf, false, false, "left", None::<&Tensor>)?.squeeze_dim(-1).clamp_max(last))
}

/// A uniform number in [0, 1) from three integers (splitmix64 over their mix).
pub(crate) fn uniform(seed: u64, a: u64, b: u64) -> f64 {
    let mut x = seed ^ a.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ b.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// Spearman rank correlation of two equally long samples (average ranks for ties); NaN when
/// either is constant or shorter than 2.
pub fn spearman(a: &[f64], b: &[f64]) -> f64 {
    let (ra, rb) = (ranks(a), ranks(b));
    let n = ra.len() as f64;
    if n < 2.0 {
        return f64::NAN;
    }
    let (ma, mb) = (ra.iter().sum::<f64>() / n, rb.iter().sum::<f64>() / n);
    let cov: f64 = ra.iter().zip(&rb).map(|(x, y)| (x - ma) * (y - mb)).sum();
    let va: f64 = ra.iter().map(|x| (x - ma).powi(2)).sum();
    let vb: f64 = rb.iter().map(|y| (y - mb).powi(2)).sum();
    cov / (va * vb).sqrt()
}

/// 1-based ranks, ties sharing their average rank.
fn ranks(v: &[f64]) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&i, &j| v[i].total_cmp(&v[j]));
    let mut r = vec![0.0; v.len()];
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && v[idx[j + 1]] == v[idx[i]] {
            j += 1;
        }
        for &k in &idx[i..=j] {
            r[k] = (i + j) as f64 / 2.0 + 1.0;
        }
        i = j + 1;
    }
    r
}

/// How many of the `k` lowest of `a` are among the `k` lowest of `b` (ties broken by index).
pub fn bottom_k_overlap(a: &[f64], b: &[f64], k: usize) -> usize {
    let low = |v: &[f64]| {
        let mut idx: Vec<usize> = (0..v.len()).collect();
        idx.sort_by(|&i, &j| v[i].total_cmp(&v[j]).then(i.cmp(&j)));
        idx.truncate(k);
        idx
    };
    let lb = low(b);
    low(a).iter().filter(|i| lb.contains(i)).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spearman_matches_hand_computed_values() {
        // Perfect monotone agreement, reversal, and a hand-computed case with ties:
        // ranks a = [1, 2.5, 2.5, 4], b = [1, 3, 2, 4]: rho = 4.5 / sqrt(4.5 * 5).
        assert!((spearman(&[1.0, 2.0, 3.0], &[10.0, 20.0, 30.0]) - 1.0).abs() < 1e-12);
        assert!((spearman(&[1.0, 2.0, 3.0], &[3.0, 2.0, 1.0]) + 1.0).abs() < 1e-12);
        let rho = spearman(&[1.0, 2.0, 2.0, 5.0], &[0.1, 0.3, 0.2, 0.9]);
        assert!((rho - 4.5 / (4.5f64 * 5.0).sqrt()).abs() < 1e-12, "{rho}");
        assert!(spearman(&[1.0, 1.0], &[1.0, 2.0]).is_nan());
    }

    #[test]
    fn bottom_k_counts_shared_least_important() {
        let a = [0.1, 0.5, 0.2, 0.9, 0.05];
        let b = [0.3, 0.1, 0.2, 0.8, 0.0];
        // lowest two: a -> {4, 0}, b -> {4, 1}
        assert_eq!(bottom_k_overlap(&a, &b, 2), 1);
        assert_eq!(bottom_k_overlap(&a, &b, 5), 5);
    }

    #[test]
    fn uniforms_are_in_range_and_differ() {
        let u: Vec<f64> = (0..1000).map(|i| uniform(7, i, 3)).collect();
        assert!(u.iter().all(|&x| (0.0..1.0).contains(&x)));
        let mean = u.iter().sum::<f64>() / 1000.0;
        assert!((mean - 0.5).abs() < 0.05, "{mean}");
        assert_ne!(uniform(7, 1, 2), uniform(8, 1, 2));
    }
}
