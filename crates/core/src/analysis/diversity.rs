//! Head diversity (docs/methods.md#head-diversity), streamed over a dataset's real query tokens:
//! 1. query orthogonality `||Q_i^T Q_j||_F / (||Q_i||_F ||Q_j||_F)` (low = diverse);
//! 2. context non-orthogonality, the same for `C_h = A_h V_h`;
//! 3. output dissimilarity `- mean_t cos(O_i[t], O_j[t])`, `O_h = C_h W^O_h` (high = diverse);
//! 4. intra-head attention diversity: variance of `A_h[t, :]` over keys, mean over queries.
//!
//! Gram blocks and sums accumulate batch by batch; nothing per token is kept.

use super::AnalysisError;
use crate::data::Dataset;
use crate::model::hooks::{At, Hooks, Point, Record};
use crate::model::nn::Gates;
use crate::model::transformer::Stop;
use crate::model::{Batch, Kind, Model, ModelError};
use std::collections::HashMap;
use tch::{Device, Kind as DType, Tensor};

/// Sums of one layer, in double precision on the model's device.
pub struct LayerAcc {
    /// `Σ Q_i^T Q_j`: `[H, H, dh, dh]`; squared norms in the diagonal blocks' traces.
    gram_q: Tensor,
    gram_c: Tensor,
    /// `Σ_t cos(O_i[t], O_j[t])`: `[H, H]`.
    cos_o: Tensor,
    /// `Σ_t var_k A_h[t, k]`: `[H]`.
    var_a: Tensor,
    tokens: f64,
}

/// Real query rows of `[B, H, T, X]` as `[H, N, X]` (mask `[B, T]`, 1 = real).
fn real_rows(x: &Tensor, mask: &Tensor) -> Tensor {
    let (b, h, t, d) = (x.size()[0], x.size()[1], x.size()[2], x.size()[3]);
    let idx = mask.reshape([b * t]).nonzero().squeeze_dim(1);
    x.permute([1, 0, 2, 3]).reshape([h, b * t, d]).index_select(1, &idx)
}

impl LayerAcc {
    /// `dq`: a query's width, `dc`: a context's (they differ in latent attention).
    pub fn new(h: i64, dq: i64, dc: i64, device: Device) -> Self {
        let z = |s: &[i64]| Tensor::zeros(s, (DType::Double, device));
        LayerAcc {
            gram_q: z(&[h, h, dq, dq]),
            gram_c: z(&[h, h, dc, dc]),
            cos_o: z(&[h, h]),
            var_a: z(&[h]),
            tokens: 0.0,
        }
    }

    /// One batch: queries and contexts `[B, H, T, dh]`, per-head outputs `O_h = C_h W^O_h`
    /// `[B, H, T, D]` (the trace's `hook_result`), attention `[B, H, T, S]`, real-query mask
    /// `[B, T]` and key mask `[B, S]`.
    pub fn update(&mut self, q: &Tensor, c: &Tensor, o: &Tensor, a: &Tensor, qmask: &Tensor, kmask: &Tensor) {
        let h = q.size()[1];
        let qr = real_rows(&q.to_kind(DType::Double), qmask); // [H, N, dh]
        let cr = real_rows(&c.to_kind(DType::Double), qmask);
        let n = qr.size()[1];
        if n == 0 {
            return;
        }
        // Q_i^T Q_j for all pairs: [H, 1, dh, N] x [1, H, N, dh].
        self.gram_q += qr.transpose(1, 2).unsqueeze(1).matmul(&qr.unsqueeze(0));
        self.gram_c += cr.transpose(1, 2).unsqueeze(1).matmul(&cr.unsqueeze(0));
        // Per-head outputs [H, N, D], unit-normalised per token.
        let o = real_rows(&o.to_kind(DType::Double), qmask);
        let on = &o / o.norm_scalaropt_dim(2, [-1i64].as_slice(), true).clamp_min(1e-12);
        // Σ_t cos(O_i[t], O_j[t]) = Σ_t <o_i[t], o_j[t]>: [H, H].
        let flat = on.reshape([h, -1]);
        self.cos_o += flat.matmul(&flat.tr());
        // Variance over real keys of each real query's attention.
        let km = kmask.to_kind(DType::Double).unsqueeze(1).unsqueeze(1); // [B, 1, 1, S]
        let ad = a.to_kind(DType::Double);
        let nk = km.sum_dim_intlist([-1i64].as_slice(), true, DType::Double);
        let mean = (&ad * &km).sum_dim_intlist([-1i64].as_slice(), true, DType::Double) / &nk;
        let var =
            ((&ad - &mean).pow_tensor_scalar(2) * &km).sum_dim_intlist([-1i64].as_slice(), true, DType::Double) / &nk; // [B, H, T, 1]
        self.var_a += real_rows(&var, qmask).sum_dim_intlist([1i64, 2].as_slice(), false, DType::Double);
        self.tokens += n as f64;
    }

    pub fn finish(&self) -> Result<LayerDiversity, ModelError> {
        let frob = |g: &Tensor| -> Result<Vec<Vec<f64>>, ModelError> {
            let norms = g.pow_tensor_scalar(2).sum_dim_intlist([2i64, 3].as_slice(), false, DType::Double).sqrt(); // ||G_ij||_F
            let h = norms.size()[0];
            let self_norm: Vec<f64> = (0..h)
                .map(|i| g.get(i).get(i).diagonal(0, 0, 1).sum(DType::Double).double_value(&[]).max(0.0).sqrt())
                .collect(); // ||Q_i||_F
            let m = Vec::<Vec<f64>>::try_from(norms.to_device(Device::Cpu))?;
            Ok(m.into_iter()
                .enumerate()
                .map(|(i, row)| {
                    row.into_iter().enumerate().map(|(j, v)| v / (self_norm[i] * self_norm[j]).max(1e-300)).collect()
                })
                .collect())
        };
        let n = self.tokens.max(1.0);
        let cos: Vec<Vec<f64>> = Vec::<Vec<f64>>::try_from(self.cos_o.to_device(Device::Cpu))?;
        Ok(LayerDiversity {
            query: frob(&self.gram_q)?,
            context: frob(&self.gram_c)?,
            output: cos.into_iter().map(|r| r.into_iter().map(|v| -v / n).collect()).collect(),
            intra: Vec::<f64>::try_from((&self.var_a / n).to_device(Device::Cpu))?,
            tokens: self.tokens as usize,
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct LayerDiversity {
    pub query: Vec<Vec<f64>>,
    pub context: Vec<Vec<f64>>,
    pub output: Vec<Vec<f64>>,
    pub intra: Vec<f64>,
    pub tokens: usize,
}

/// Mean of the off-diagonal entries of an H x H matrix.
/// NaN entries (heads removed by `prune_heads`) are left out.
pub fn off_diagonal_mean(m: &[Vec<f64>]) -> f64 {
    let h = m.len();
    let vals: Vec<f64> = (0..h)
        .flat_map(|i| (0..h).filter(move |&j| j != i).map(move |j| (i, j)))
        .map(|(i, j)| m[i][j])
        .filter(|v| !v.is_nan())
        .collect();
    if vals.is_empty() {
        return f64::NAN;
    }
    vals.iter().sum::<f64>() / vals.len() as f64
}

/// A layer's values over the heads present -> the original numbering, NaN rows and columns
/// where `prune_heads` removed a head.
fn spread_layer(model: &Model, kind: Kind, l: usize, d: LayerDiversity) -> LayerDiversity {
    let square = |m: Vec<Vec<f64>>| -> Vec<Vec<f64>> {
        let rows: Vec<Vec<f64>> = m.into_iter().map(|r| model.spread(kind, l, &r)).collect();
        let width = model.mixer(kind, l).map_or(rows.len(), |a| a.width());
        model.spread_with(kind, l, rows, vec![f64::NAN; width])
    };
    LayerDiversity {
        query: square(d.query),
        context: square(d.context),
        output: square(d.output),
        intra: model.spread(kind, l, &d.intra),
        tokens: d.tokens,
    }
}

pub struct Diversity {
    pub model: String,
    pub dataset: String,
    pub kinds: Vec<(Kind, Vec<LayerDiversity>)>,
}

pub fn diversity(
    model: &Model,
    data: &Dataset,
    kinds: &[Kind],
    gates: &Gates,
    batch_tokens: usize,
    stop: &dyn Fn() -> bool,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Diversity, AnalysisError> {
    if data.is_empty() {
        return Err(AnalysisError::Input(format!("the dataset {} is empty", data.name)));
    }
    let _g = tch::no_grad_guard();
    let shapes: Vec<_> = kinds.iter().map(|k| model.kind_shape(*k)).collect::<Result<_, _>>()?;
    let stack = model.net.stack_kind;
    let layer_of = |k: Kind, l: usize| {
        model.mixer(k, l).ok_or_else(|| AnalysisError::Input(format!("{} has no {k} layer {l}", model.name())))
    };
    let mut accs: Vec<Vec<LayerAcc>> = shapes
        .iter()
        .map(|s| {
            (0..s.n_layers)
                .map(|l| {
                    layer_of(s.kind, l).map(|a| {
                        let dq = a.as_attention().map_or(a.head_dim(), |x| x.head_dim);
                        LayerAcc::new(a.n_present() as i64, dq, a.head_dim(), model.device())
                    })
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<_, _>>()?;
    let encoded = model.tokenize_all(data.texts())?;
    let batches: Vec<(Vec<usize>, Batch)> = model.batches(&encoded, batch_tokens).collect();
    for (gi, (_, b)) in batches.iter().enumerate() {
        if stop() {
            return Err(ModelError::Interrupted.into());
        }
        let s = b.ids.size()[1];
        let src_real = model.real_mask(&b.encoded, s);
        // One pass over the stack and one teacher-forced decoder pass record every kind's
        // queries (after rotary positions where the model has them), pattern, contexts and
        // per-head outputs.
        let mut got: HashMap<(Kind, usize), [Option<Tensor>; 4]> = HashMap::new();
        let wanted: Vec<Kind> = shapes.iter().map(|s| s.kind).collect();
        let points = [Point::Q, Point::RotQ, Point::Pattern, Point::Z, Point::Result];
        let mut on = |at: At, x: &Tensor| {
            let slot = got.entry((at.kind, at.layer)).or_default();
            let i = match at.point {
                Point::Q | Point::RotQ => 0,
                Point::Z => 1,
                Point::Pattern => 2,
                _ => 3,
            };
            slot[i] = Some(x.shallow_clone());
            Ok(())
        };
        let mut rec = Record { points: &points, kinds: &wanted, on: &mut on };
        let h = model.net.encode(
            &b.ids,
            &b.mask,
            gates,
            if wanted.contains(&stack) { Some(&mut rec as &mut dyn Hooks) } else { None },
        )?;
        let mut dec_masks = None;
        if wanted.iter().any(|&k| k != stack) {
            let targets = model.greedy_targets(b, &h, gates)?;
            let (tgt, _) = model.target_tensors(&targets);
            let _ = model.net.teacher(&h, &b.mask, &tgt, Stop::FinalNorm, gates, Some(&mut rec))?;
            let qmask = model.real_mask(&targets, tgt.size()[1]);
            // The decoder's self-attention keys are its inputs: the start token, then the
            // targets shifted right.
            let t = qmask.size()[1];
            let dec_keys =
                Tensor::cat(&[qmask.ones_like().narrow(1, 0, 1.min(t)), qmask.narrow(1, 0, (t - 1).max(0))], 1);
            dec_masks = Some((qmask, dec_keys));
        }
        for (si, sh) in shapes.iter().enumerate() {
            let kind = sh.kind;
            let (qmask, kmask) = match (&dec_masks, kind) {
                (_, k) if k == stack => (&src_real, &src_real),
                (Some((q, dk)), Kind::Dec) => (q, dk),
                (Some((q, _)), _) => (q, &src_real),
                (None, _) => continue,
            };
            for (l, acc) in accs[si].iter_mut().enumerate().take(sh.n_layers) {
                // A layer left without heads (prune_heads) hands out nothing.
                let Some([Some(q), Some(c), Some(a), Some(o)]) = got.get(&(kind, l)) else { continue };
                acc.update(q, c, o, a, qmask, kmask);
            }
        }
        progress(gi + 1, batches.len());
    }
    let kinds = shapes
        .iter()
        .zip(&accs)
        .map(|(s, layers)| {
            Ok((
                s.kind,
                layers
                    .iter()
                    .enumerate()
                    .map(|(l, a)| Ok(spread_layer(model, s.kind, l, a.finish()?)))
                    .collect::<Result<Vec<_>, ModelError>>()?,
            ))
        })
        .collect::<Result<Vec<_>, ModelError>>()?;
    Ok(Diversity { model: model.name(), dataset: data.name.clone(), kinds })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(q: &[Vec<Vec<f64>>], i: usize, j: usize) -> f64 {
        // q[h][t][d]: ||Q_i^T Q_j||_F / (||Q_i||_F ||Q_j||_F)
        let dh = q[0][0].len();
        let mut g = 0.0;
        for a in 0..dh {
            for b in 0..dh {
                let s: f64 = (0..q[i].len()).map(|t| q[i][t][a] * q[j][t][b]).sum();
                g += s * s;
            }
        }
        let n = |h: usize| q[h].iter().flatten().map(|v| v * v).sum::<f64>().sqrt();
        g.sqrt() / (n(i) * n(j))
    }

    #[test]
    fn metrics_match_naive_loops_and_streaming() {
        tch::manual_seed(3);
        let (b, h, t, dh, d) = (2i64, 3i64, 4i64, 2i64, 6i64);
        let q = Tensor::randn([b, h, t, dh], (DType::Float, Device::Cpu));
        let c = Tensor::randn([b, h, t, dh], (DType::Float, Device::Cpu));
        let a = Tensor::rand([b, h, t, t], (DType::Float, Device::Cpu)).softmax(-1, DType::Float);
        let wo = Tensor::randn([d, h * dh], (DType::Float, Device::Cpu));
        let qmask = Tensor::from_slice(&[1f32, 1., 1., 0., 1., 0., 1., 1.]).view([b, t]);
        let kmask = Tensor::ones([b, t], (DType::Float, Device::Cpu));
        let o = c.matmul(&wo.view([d, h, dh]).permute([1, 2, 0])); // [B, H, T, D]

        // Streamed in two halves of the batch equals one pass.
        let mut one = LayerAcc::new(h, dh, dh, Device::Cpu);
        one.update(&q, &c, &o, &a, &qmask, &kmask);
        let mut two = LayerAcc::new(h, dh, dh, Device::Cpu);
        for k in 0..2 {
            two.update(
                &q.narrow(0, k, 1),
                &c.narrow(0, k, 1),
                &o.narrow(0, k, 1),
                &a.narrow(0, k, 1),
                &qmask.narrow(0, k, 1),
                &kmask.narrow(0, k, 1),
            );
        }
        let (r1, r2) = (one.finish().unwrap(), two.finish().unwrap());
        assert_eq!(r1.tokens, 6);
        for i in 0..3 {
            for j in 0..3 {
                assert!((r1.query[i][j] - r2.query[i][j]).abs() < 1e-12);
                assert!((r1.output[i][j] - r2.output[i][j]).abs() < 1e-12);
            }
        }
        // Naive loops over the real rows.
        let rows = |x: &Tensor| -> Vec<Vec<Vec<f64>>> {
            let m = Vec::<f32>::try_from(qmask.reshape([-1])).unwrap();
            (0..h)
                .map(|hh| {
                    let mut v = Vec::new();
                    for bb in 0..b {
                        for tt in 0..t {
                            if m[(bb * t + tt) as usize] > 0.5 {
                                v.push(Vec::<f64>::try_from(x.get(bb).get(hh).get(tt).to_kind(DType::Double)).unwrap());
                            }
                        }
                    }
                    v
                })
                .collect()
        };
        let (qr, cr) = (rows(&q), rows(&c));
        for i in 0..3 {
            for j in 0..3 {
                assert!((r1.query[i][j] - naive(&qr, i, j)).abs() < 1e-6, "query {i} {j}");
                assert!((r1.context[i][j] - naive(&cr, i, j)).abs() < 1e-6, "context {i} {j}");
            }
            assert!((r1.query[i][i] - naive(&qr, i, i)).abs() < 1e-6);
        }
        // Output dissimilarity of a head with itself is -1.
        for i in 0..3 {
            assert!((r1.output[i][i] + 1.0).abs() < 1e-9);
        }
        // Intra-head variance, by hand for head 0.
        let mut total = 0.0;
        let m = Vec::<f32>::try_from(qmask.reshape([-1])).unwrap();
        for bb in 0..b {
            for tt in 0..t {
                if m[(bb * t + tt) as usize] > 0.5 {
                    let row = Vec::<f64>::try_from(a.get(bb).get(0).get(tt).to_kind(DType::Double)).unwrap();
                    let mean = row.iter().sum::<f64>() / row.len() as f64;
                    total += row.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / row.len() as f64;
                }
            }
        }
        assert!((r1.intra[0] - total / 6.0).abs() < 1e-9);
        assert!((off_diagonal_mean(&[vec![9.0, 1.0], vec![3.0, 9.0]]) - 2.0).abs() < 1e-12);
    }
}
