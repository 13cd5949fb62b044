//! Fills that depend on the input: what a closed head's context becomes under resample
//! ablation and per-position mean ablation (docs/methods.md#resample-ablation,
//! #mean-ablation), computed for each batch when the stack runs it. A view (`with_mask`),
//! `ablate`, `ablation_sweep` and pruning carry one in their gates ([`super::nn::Gates::source`]);
//! [`super::transformer::Transformer::encode`] resolves it into a per-row, per-position fill
//! `[layers, B, heads, T, d_head]` before the first layer.

use super::hooks::{At, Hooks, Point, Record};
use super::nn::Gates;
use super::transformer::Transformer;
use super::ModelError;
use tch::{Kind as DType, Tensor};

/// Where the fill of closed heads comes from, per batch.
pub enum FillSource {
    /// Each sentence's closed heads take their contexts on a reference sentence drawn for it.
    Resample(Resample),
    /// Each closed head takes its mean context at the same position over the reference's
    /// sentences long enough to have it.
    PerPosition {
        /// `[layers, heads, T_max, d_head]` (original head numbering).
        means: Tensor,
        /// `[layers, heads, d_head]`: the mean over every token, for positions past `T_max`.
        overall: Tensor,
    },
}

/// Resample ablation's reference sentences and seed.
pub struct Resample {
    /// The reference sentences' token ids.
    pub refs: Vec<Vec<i64>>,
    pub seed: u64,
    /// `[layers, heads, d_head]`: each head's mean context over the reference's tokens, the
    /// fill past the end of a drawn sentence shorter than the one measured.
    pub mean: Tensor,
    /// The padding id of a batch of drawn sentences.
    pub pad_id: i64,
}

/// The key a sentence draws by: FNV-1a over its token ids (`h = (h ^ id) * 0x100000001b3` from
/// `0xcbf29ce484222325`), so a sentence draws the same reference whatever its batch, shard or
/// place in the data (docs/methods.md#resample-ablation).
pub fn text_key(ids: &[i64]) -> u64 {
    ids.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &id| (h ^ id as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

/// The draw of key `key` among `n` eligible sentences: splitmix64 of
/// `seed ^ (key * 0x9E3779B97F4A7C15)`, modulo `n` (the reference script
/// tests/fixtures/resample_ablation_reference.py draws the same).
pub fn resample_draw(seed: u64, key: u64, n: usize) -> usize {
    let mut z = (seed ^ key.wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z % n.max(1) as u64) as usize
}

impl Resample {
    /// The reference sentence `ids` draws: among those with at least its number of tokens and
    /// other ids (else among all with other ids), by [`resample_draw`] of its [`text_key`].
    pub fn draw(&self, ids: &[i64]) -> Result<usize, ModelError> {
        let other = |r: &Vec<i64>| r.as_slice() != ids;
        let mut eligible: Vec<usize> =
            self.refs.iter().enumerate().filter(|(_, r)| r.len() >= ids.len() && other(r)).map(|(j, _)| j).collect();
        if eligible.is_empty() {
            eligible = self.refs.iter().enumerate().filter(|(_, r)| other(r)).map(|(j, _)| j).collect();
        }
        if eligible.is_empty() {
            return Err(ModelError::Invalid(format!(
                "resample ablation: the reference has no sentence other than the one measured ({} tokens)",
                ids.len()
            )));
        }
        Ok(eligible[resample_draw(self.seed, text_key(ids), eligible.len())])
    }
}

/// The real tokens of each row of a right-padded batch.
pub fn rows_of(ids: &Tensor, mask: &Tensor) -> Result<Vec<Vec<i64>>, ModelError> {
    let (b, t) = (ids.size()[0], ids.size()[1]);
    let flat = Vec::<i64>::try_from(ids.f_to_device(tch::Device::Cpu)?.f_reshape([-1])?)?;
    let m = Vec::<f32>::try_from(mask.f_to_device(tch::Device::Cpu)?.f_to_kind(DType::Float)?.f_reshape([-1])?)?;
    Ok((0..b as usize)
        .map(|r| {
            let row = r * t as usize..(r + 1) * t as usize;
            flat[row.clone()].iter().zip(&m[row]).filter(|(_, &k)| k > 0.0).map(|(&i, _)| i).collect()
        })
        .collect())
}

impl FillSource {
    /// The fill of a batch `ids [B, T]` (right-padded, `mask` 1 = real): `[layers, B, heads,
    /// T, d_head]`, the stack's heads in their original numbering, computed under `net` as
    /// loaded.
    pub fn batch_fill(&self, net: &Transformer, ids: &Tensor, mask: &Tensor) -> Result<Tensor, ModelError> {
        let _g = tch::no_grad_guard();
        let (b, t) = (ids.size()[0], ids.size()[1]);
        match self {
            FillSource::PerPosition { means, overall } => {
                let tm = means.size()[2];
                let m = if t <= tm {
                    means.f_narrow(2, 0, t)?
                } else {
                    Tensor::f_cat(
                        &[means.shallow_clone(), overall.f_unsqueeze(2)?.f_expand([-1, -1, t - tm, -1], false)?],
                        2,
                    )?
                };
                let s = m.size();
                Ok(m.f_unsqueeze(1)?.f_expand([s[0], b, s[1], s[2], s[3]], false)?)
            }
            FillSource::Resample(r) => {
                let rows = rows_of(ids, mask)?;
                let picked: Vec<&Vec<i64>> =
                    rows.iter().map(|row| r.draw(row).map(|j| &r.refs[j])).collect::<Result<_, _>>()?;
                let tr = picked.iter().map(|p| p.len()).max().unwrap_or(1).max(1);
                let mut flat = Vec::with_capacity(picked.len() * tr);
                let mut m = Vec::with_capacity(picked.len() * tr);
                for p in &picked {
                    flat.extend(p.iter().copied().chain(std::iter::repeat_n(r.pad_id, tr - p.len())));
                    m.extend(std::iter::repeat_n(1f32, p.len()).chain(std::iter::repeat_n(0f32, tr - p.len())));
                }
                let dev = net.device();
                let rids = Tensor::from_slice(&flat).view([b, tr as i64]).to_device(dev);
                let rmask = Tensor::from_slice(&m).view([b, tr as i64]).to_device(dev);
                let kind = net.stack_kind;
                let n_layers = net.stack.len();
                let mut zs: Vec<Option<Tensor>> = (0..n_layers).map(|_| None).collect();
                {
                    let mut on = |at: At, z: &Tensor| {
                        if at.kind == kind {
                            if let Some(slot) = zs.get_mut(at.layer) {
                                *slot = Some(z.shallow_clone());
                            }
                        }
                        Ok(())
                    };
                    let mut rec = Record::new(&[Point::Z], &mut on);
                    let _ = net.encode(&rids, &rmask, &Gates::none(), Some(&mut rec as &mut dyn Hooks))?;
                }
                let lens: Vec<i64> = picked.iter().map(|p| p.len() as i64).collect();
                // Positions a drawn sentence has: [B, 1, T, 1].
                let valid = Tensor::arange(t, (DType::Int64, dev))
                    .view([1, 1, t, 1])
                    .f_lt_tensor(&Tensor::from_slice(&lens).to_device(dev).view([-1, 1, 1, 1]))?;
                let keep = (tr as i64).min(t);
                // The fill in the stack's own precision.
                let dt = zs.iter().flatten().next().map_or(r.mean.kind(), |z| z.kind());
                let mut layers = Vec::with_capacity(n_layers);
                for (l, z) in zs.iter().enumerate() {
                    let attn = net.stack[l].mixer();
                    let mean = r.mean.f_select(0, l as i64)?.f_to_kind(dt)?;
                    // The fill's own shape per layer ([width, d_head] of the kind: a hybrid's
                    // layer without heads holds the mean's zeros).
                    let (w, dh) = (mean.size()[0], mean.size()[1]);
                    let full = Tensor::zeros([b, w, t, dh], (dt, dev));
                    let drawn = match z {
                        Some(z) => {
                            let idx = Tensor::from_slice(&attn.present().iter().map(|&h| h as i64).collect::<Vec<_>>())
                                .to_device(dev);
                            let z = z.f_narrow(2, 0, keep)?.f_to_kind(dt)?;
                            let z = if keep < t {
                                Tensor::f_cat(
                                    &[
                                        z.shallow_clone(),
                                        z.f_zeros_like()?.f_narrow(2, 0, 1)?.f_expand([-1, -1, t - keep, -1], false)?,
                                    ],
                                    2,
                                )?
                            } else {
                                z
                            };
                            // A layer whose heads are narrower than the widest (a hybrid's
                            // channel groups beside attention heads): zeros past its own width.
                            let dz = z.size()[3];
                            let z = if dz < dh {
                                Tensor::f_cat(
                                    &[
                                        z.shallow_clone(),
                                        z.f_zeros_like()?.f_narrow(3, 0, 1)?.f_expand([-1, -1, -1, dh - dz], false)?,
                                    ],
                                    3,
                                )?
                            } else {
                                z
                            };
                            full.f_index_copy(1, &idx, &z)?
                        }
                        None => full,
                    };
                    layers.push(drawn.f_where_self(&valid, &mean.f_unsqueeze(1)?.f_unsqueeze(0)?)?);
                }
                Ok(Tensor::f_stack(&layers, 0)?)
            }
        }
    }
}
