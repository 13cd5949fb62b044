//! A head taxonomy (docs/methods.md#head-taxonomy): attention-sink, previous-token,
//! duplicate-token, induction and retrieval (copy-paste) heads of the self-attention stack,
//! scored on synthetic probes generated from a seed: repeated random tokens (sink, previous,
//! duplicate, induction; TransformerLens's `detect_head` "mul" scores) and needle-in-context
//! sequences (retrieval, Wu et al. 2024). The probes run through the model's one forward
//! (`Transformer::encode`, recording `hook_pattern`); scores are computed from the captured attention.

use super::AnalysisError;
use crate::model::hooks::{At, Tile};
use crate::model::nn::Gates;
use crate::model::{Model, ModelError};
use tch::{Device, Kind as DType, Tensor};

options_enum!(HeadType, "head type", {
    /// Mean attention on the first token (Gu et al. 2025).
    Sink = "sink",
    /// Attention on the previous token.
    PreviousToken = "previous_token",
    /// Attention on earlier occurrences of the current token.
    DuplicateToken = "duplicate_token",
    /// Attention on the token after an earlier occurrence of the current token.
    Induction = "induction",
    /// Top-1 attention on the needle token being copied (Wu et al. 2024).
    Retrieval = "retrieval",
});

pub const HEAD_TYPES: [HeadType; 5] =
    [HeadType::Sink, HeadType::PreviousToken, HeadType::DuplicateToken, HeadType::Induction, HeadType::Retrieval];

impl HeadType {
    /// The default label threshold: Gu et al.'s 0.3 for sinks, Wu et al.'s 0.1 for retrieval;
    /// half the largest score the repeated-token probe allows for the others (1 for previous
    /// token, 1/2 for duplicate and induction, whose targets are in the second half only).
    pub fn default_threshold(self) -> f64 {
        match self {
            HeadType::Sink => 0.3,
            HeadType::PreviousToken => 0.5,
            HeadType::DuplicateToken | HeadType::Induction => 0.25,
            HeadType::Retrieval => 0.1,
        }
    }
}

/// The synthetic probes' shape; every sequence derives from `seed`.
#[derive(Debug, Clone)]
pub struct ProbeOptions {
    pub seed: u64,
    /// Sequences of each probe.
    pub n: usize,
    /// Length of the random segment that the repeated-token probe repeats once.
    pub len: usize,
    /// Needle and haystack lengths of the retrieval probe.
    pub needle: usize,
    pub haystack: usize,
}

/// Probe sequences: `repeated` (r r), and `needles` (hay, needle, hay, needle) with the needle's
/// first start.
pub struct Probes {
    pub repeated: Vec<Vec<i64>>,
    pub needles: Vec<(Vec<i64>, usize)>,
    /// The needle's length in tokens.
    pub needle: usize,
}

/// Ids the probes draw from: TransformerLens's range (ids 100 to 20000, here also at least a
/// quarter into the vocabulary for small ones), without the padding and end tokens.
pub fn token_pool(model: &Model) -> Vec<i64> {
    let v = model.tok.vocab_size() as i64;
    let (lo, hi) = ((v / 4).min(100), v.min(20000));
    (lo..hi).filter(|&i| i != model.tok.pad_id && Some(i) != model.tok.eos_id && i != model.net.eos_id).collect()
}

/// `k` distinct draws from `pool` (a partial Fisher-Yates shuffle keyed by (seed, stream)).
fn draw(pool: &[i64], k: usize, seed: u64, stream: u64) -> Vec<i64> {
    let mut p = pool.to_vec();
    for i in 0..k.min(p.len()) {
        let n = p.len();
        let j = i + (super::importance::uniform(seed, stream, i as u64) * (n - i) as f64) as usize;
        p.swap(i, j.min(n - 1));
    }
    p.truncate(k);
    p
}

impl Probes {
    pub fn generate(pool: &[i64], o: &ProbeOptions) -> Result<Probes, AnalysisError> {
        if pool.len() < o.len.max(o.needle + 1) || o.len < 2 || o.needle < 1 || o.n < 1 {
            return Err(AnalysisError::Input(format!("head_types: probes of len {} and needle {} need that many distinct tokens (the model has {} to draw from), len >= 2, needle >= 1 and n >= 1", o.len, o.needle, pool.len())));
        }
        // The probes' ids, and a forward over each probe's batch (`Transformer::forward_bytes`
        // checks that one when it runs).
        let per = 2.0 * o.len as f64 + 2.0 * (o.haystack as f64 + o.needle as f64);
        crate::budget::check(
            &format!("head_types: n = {} probe sequences of len {} and haystack {}", o.n, o.len, o.haystack),
            o.n as f64 * per * 8.0,
        )
        .map_err(AnalysisError::Input)?;
        let repeated = (0..o.n)
            .map(|s| {
                let r = draw(pool, o.len, o.seed, 2 * s as u64);
                r.iter().chain(&r).copied().collect()
            })
            .collect();
        let needles = (0..o.n)
            .map(|s| {
                let stream = 2 * s as u64 + 1;
                let needle = draw(pool, o.needle, o.seed, stream);
                let rest: Vec<i64> = pool.iter().copied().filter(|t| !needle.contains(t)).collect();
                let hay: Vec<i64> = (0..o.haystack)
                    .map(|i| {
                        rest[(super::importance::uniform(o.seed ^ 0x5EED, stream, i as u64) * rest.len() as f64)
                            as usize
                            % rest.len()]
                    })
                    .collect();
                let at = (super::importance::uniform(o.seed ^ 0xA7, stream, 0) * (o.haystack + 1) as f64) as usize
                    % (o.haystack + 1);
                let seq: Vec<i64> = hay[..at].iter().chain(&needle).chain(&hay[at..]).chain(&needle).copied().collect();
                (seq, at)
            })
            .collect();
        Ok(Probes { repeated, needles, needle: o.needle })
    }
}

/// Per head-type `[layers][heads]` scores of the self-attention stack's heads.
pub type TypeGrids = Vec<(HeadType, Vec<Vec<f64>>)>;

/// 0/1 patterns `[B, T, T]` of one batch of sequences (query i, key j): previous token,
/// duplicate token, induction (TransformerLens's `get_*_detection_pattern`).
#[cfg(test)]
fn patterns(seqs: &[Vec<i64>], dev: Device) -> [Tensor; 3] {
    patterns_rows(seqs, 0, seqs[0].len(), dev).map(|p| p.squeeze_dim(1))
}

/// Query rows `q0 .. q0 + n` of the 0/1 patterns, `[B, 1, n, T]` each.
fn patterns_rows(seqs: &[Vec<i64>], q0: usize, n: usize, dev: Device) -> [Tensor; 3] {
    let t = seqs[0].len();
    let size = seqs.len() * n * t;
    let (mut prev, mut dup, mut ind) = (vec![0f32; size], vec![0f32; size], vec![0f32; size]);
    for (b, s) in seqs.iter().enumerate() {
        for i in q0..q0 + n {
            let at = |j: usize| b * n * t + (i - q0) * t + j;
            if i >= 1 {
                prev[at(i - 1)] = 1.0;
            }
            for j in 0..i {
                if s[j] == s[i] {
                    dup[at(j)] = 1.0;
                }
            }
            for j in 1..=i {
                if s[j - 1] == s[i] {
                    ind[at(j)] = 1.0;
                }
            }
        }
    }
    let shape = [seqs.len() as i64, 1, n as i64, t as i64];
    [prev, dup, ind].map(|v| Tensor::from_slice(&v).view(shape).to_device(dev))
}

/// What [`attend`] hands each layer's attention to: `(layer, a tile of its rows, the batch's
/// sequences)`.
type OnAttention<'a> = &'a mut dyn FnMut(usize, &Tile, &[Vec<i64>]) -> Result<(), ModelError>;

/// Runs `seqs` (all of one length) through the self-attention stack in batches and hands each
/// layer's attention to `on` tile by tile (docs/methods.md#score-tiles: rows in order, each
/// layer's tiles before the next layer's); the first error `on` returns ends the run.
pub(crate) fn attend(
    model: &Model,
    seqs: &[Vec<i64>],
    gates: &Gates,
    stop: &dyn Fn() -> bool,
    on: OnAttention,
) -> Result<(), AnalysisError> {
    let _g = tch::no_grad_guard();
    let t = seqs[0].len();
    let per_batch = (1024 / t).max(1);
    for chunk in seqs.chunks(per_batch) {
        if stop() {
            return Err(ModelError::Interrupted.into());
        }
        let ids = Tensor::from_slice(&chunk.concat()).view([chunk.len() as i64, t as i64]).to_device(model.device());
        let mask = Tensor::ones([chunk.len() as i64, t as i64], (DType::Float, model.device()));
        let mut f = |at: At, tile: &Tile| on(at.layer, tile, chunk);
        let mut tiles = super::stack_tiles(model, 0, chunk.len() as i64, t, &mut f);
        let _ = model.net.encode(&ids, &mask, gates, Some(&mut tiles))?;
    }
    Ok(())
}

/// The rows `lo .. hi` of a tile of rows `q0 .. q0 + n` that fall in `first .. first + count`;
/// `None` when none does.
pub(crate) fn tile_span(q0: i64, n: i64, first: i64, count: i64) -> Option<(i64, i64)> {
    let (lo, hi) = (first.max(q0), (first + count).min(q0 + n));
    (lo < hi).then_some((lo, hi))
}

/// The rows of a tile (weights `a [1, H, n, T]` from query row `q0`) whose queries predict a
/// needle probe's second needle (`seq`, a needle of `needle` tokens first at `at` and again
/// at the end; query `second - 1 + q` predicts needle token `q`): `[H, m, T]`, and the needle
/// token its first row predicts; `None` when no row of the tile does.
pub(crate) fn needle_rows(q0: i64, a: &Tensor, seq: &[i64], needle: usize) -> Option<(Tensor, usize)> {
    let first = (seq.len() - needle - 1) as i64;
    let (lo, hi) = tile_span(q0, a.size()[2], first, needle as i64)?;
    Some((a.get(0).narrow(1, lo - q0, hi - lo), (lo - first) as usize))
}

/// Per head of `rows [H, m, T]` ([`needle_rows`], its first row predicting needle token
/// `from`): the share of the needle's tokens copied, the row's top key (the first on ties) lying
/// in the first needle and holding the token predicted (Wu et al.'s retrieval score).
pub(crate) fn copied(
    rows: &Tensor,
    from: usize,
    seq: &[i64],
    at: usize,
    needle: usize,
) -> Result<Vec<f64>, ModelError> {
    let second = seq.len() - needle;
    let m = (rows.size()[1] as usize).max(1);
    let top = Vec::<i64>::try_from(rows.f_argmax(-1, false)?.f_to_device(Device::Cpu)?.f_reshape([-1])?)?;
    Ok(top
        .chunks(m)
        .map(|keys| {
            let hits = keys.iter().enumerate().filter(|&(i, &j)| {
                (at..at + needle).contains(&(j as usize)) && seq[j as usize] == seq[second + from + i]
            });
            hits.count() as f64 / needle as f64
        })
        .collect())
}

/// A layer's sums over its tiles so far, per sequence and head `[B, H]`: the attention on each
/// pattern (previous, duplicate, induction) and the attention counted.
struct Pending {
    layer: usize,
    on: [Tensor; 3],
    counted: Tensor,
}

/// Every head type's score for the self-attention stack (`model.net.stack_kind`), averaged over
/// the probes' sequences: sink, previous, duplicate and induction on `repeated`, retrieval on
/// `needles`. With `exclude_sink` (docs/methods.md#attention-sinks) the first position, the
/// probes' sink, is left out of every score but the sink's own: previous, duplicate and
/// induction are TransformerLens's `detect_head(..., exclude_bos=True)` (the first key's
/// attention zeroed, each sequence's score divided by the attention that remains), and a
/// retrieval head's top key is taken among the other keys (unless the needle starts there).
/// The attention is read tile by tile (docs/methods.md#score-tiles): each score is a sum over
/// query rows, a sequence's ratio taken after its layer's last tile.
pub fn head_type_scores(
    model: &Model,
    probes: &Probes,
    gates: &Gates,
    stop: &dyn Fn() -> bool,
    exclude_sink: bool,
) -> Result<TypeGrids, AnalysisError> {
    let kind = model.net.stack_kind;
    let dev = model.device();
    // Per type, layer and head the layer holds (physical order; a pruned layer is narrower).
    let held = model.layer_heads(kind);
    let mut sums: Vec<Vec<Vec<f64>>> =
        HEAD_TYPES.iter().map(|_| held.iter().map(|&h| vec![0.0; h]).collect()).collect();
    let add = |row: &mut Vec<f64>, v: &Tensor| -> Result<(), ModelError> {
        for (s, x) in row.iter_mut().zip(Vec::<f64>::try_from(v.to_device(Device::Cpu))?) {
            *s += x;
        }
        Ok(())
    };
    let mut pending: Option<Pending> = None;
    attend(model, &probes.repeated, gates, stop, &mut |l, tile, rows| {
        let (t, q0, k0) = (rows[0].len(), tile.q0, tile.k0);
        let a = tile.pattern.to_kind(DType::Double);
        let (n, m) = (a.size()[2], a.size()[3]);
        // The patterns over the tile's rows and keys (`k0 .. k0 + m`; the others weigh 0).
        let [prev, dup, ind] = patterns_rows(rows, q0 as usize, n as usize, dev).map(|p| p.narrow(3, k0, m));
        if k0 == 0 {
            let sink = a.select(3, 0).sum_dim_intlist([0i64, 2].as_slice(), false, DType::Double) / t as f64;
            add(&mut sums[0][l], &sink)?;
        }
        // Per sequence and head: the attention on the pattern over the attention counted (all
        // of it, t per sequence; without the first key, what the other keys hold), summed over
        // the batch's sequences.
        let skip = if exclude_sink && k0 == 0 { 1 } else { 0 };
        let kept = a.narrow(3, skip, m - skip);
        let on = |p: &Tensor| {
            (&kept * p.narrow(3, skip, m - skip)).sum_dim_intlist([2i64, 3].as_slice(), false, DType::Double)
        };
        let here = [on(&prev), on(&dup), on(&ind)];
        let counted = kept.sum_dim_intlist([2i64, 3].as_slice(), false, DType::Double);
        let sofar = match pending.take() {
            Some(p) if p.layer == l && q0 > 0 => Pending {
                layer: l,
                on: [&p.on[0] + &here[0], &p.on[1] + &here[1], &p.on[2] + &here[2]],
                counted: p.counted + counted,
            },
            _ => Pending { layer: l, on: here, counted },
        };
        if q0 + n < t as i64 {
            pending = Some(sofar);
            return Ok(());
        }
        let counted = if exclude_sink {
            sofar.counted.clamp_min(1e-300)
        } else {
            Tensor::full([1], t as f64, (DType::Double, a.device()))
        };
        for (i, v) in sofar.on.iter().enumerate() {
            add(&mut sums[i + 1][l], &(v / &counted).sum_dim_intlist([0i64].as_slice(), false, DType::Double))?;
        }
        Ok(())
    })?;
    for (seq, at) in &probes.needles {
        attend(model, std::slice::from_ref(seq), gates, stop, &mut |l, tile, _| {
            // The queries of this tile that predict the second needle's tokens.
            let a = tile.full_pattern()?;
            let Some((rows, from)) = needle_rows(tile.q0, &a, seq, probes.needle) else { return Ok(()) };
            // Without the sink: the first key can never be the top one (weights are >= 0).
            let rows = if exclude_sink && *at > 0 {
                rows.index_fill(2, &Tensor::from_slice(&[0i64]).to_device(rows.device()), -1.0)
            } else {
                rows
            };
            for (s, x) in sums[4][l].iter_mut().zip(copied(&rows, from, seq, *at, probes.needle)?) {
                *s += x;
            }
            Ok(())
        })?;
    }
    let (n_rep, n_needle) = (probes.repeated.len() as f64, probes.needles.len() as f64);
    Ok(HEAD_TYPES
        .iter()
        .zip(sums)
        .map(|(ty, layers)| {
            let n = if *ty == HeadType::Retrieval { n_needle } else { n_rep };
            let grid = layers
                .iter()
                .enumerate()
                .map(|(l, row)| model.spread(kind, l, &row.iter().map(|s| s / n).collect::<Vec<_>>()))
                .collect();
            (*ty, grid)
        })
        .collect())
}

/// The types whose score reaches its threshold, per head `(layer, head)`.
pub fn labels(grids: &TypeGrids, thresholds: &[(HeadType, f64)]) -> Vec<((usize, usize), Vec<HeadType>)> {
    let Some((_, first)) = grids.first() else { return vec![] };
    let mut out = Vec::new();
    for (l, row) in first.iter().enumerate() {
        for h in 0..row.len() {
            let types: Vec<HeadType> = grids
                .iter()
                .filter(|(ty, g)| {
                    g[l][h] >= thresholds.iter().find(|(t, _)| t == ty).map_or(ty.default_threshold(), |(_, v)| *v)
                })
                .map(|(ty, _)| *ty)
                .collect();
            if !types.is_empty() {
                out.push(((l, h), types));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_a_hand_count() {
        // tokens 5 6 5 6 6: previous (i, i-1); duplicate (2,0) (3,1) (4,1) (4,3); induction
        // (i, j) with s[j-1] == s[i]: (2,1) (3,2) (4,2) (4,4) (j = i allowed, as TransformerLens).
        let [prev, dup, ind] = patterns(&[vec![5, 6, 5, 6, 6]], Device::Cpu);
        let ones = |t: &Tensor| {
            let v = Vec::<f32>::try_from(t.reshape([-1])).unwrap();
            v.iter().enumerate().filter(|(_, &x)| x == 1.0).map(|(k, _)| (k / 5, k % 5)).collect::<Vec<_>>()
        };
        assert_eq!(ones(&prev), vec![(1, 0), (2, 1), (3, 2), (4, 3)]);
        assert_eq!(ones(&dup), vec![(2, 0), (3, 1), (4, 1), (4, 3)]);
        assert_eq!(ones(&ind), vec![(2, 1), (3, 2), (4, 2), (4, 4)]);
    }

    #[test]
    fn probes_are_seeded_and_shaped() {
        let pool: Vec<i64> = (10..60).collect();
        let o = ProbeOptions { seed: 7, n: 3, len: 8, needle: 4, haystack: 10 };
        let a = Probes::generate(&pool, &o).unwrap();
        let b = Probes::generate(&pool, &o).unwrap();
        assert_eq!(a.repeated, b.repeated);
        for r in &a.repeated {
            assert_eq!(r.len(), 16);
            assert_eq!(r[..8], r[8..]);
            let mut u = r[..8].to_vec();
            u.sort();
            u.dedup();
            assert_eq!(u.len(), 8, "distinct tokens in a segment");
        }
        for (s, at) in &a.needles {
            assert_eq!(s.len(), 10 + 8);
            assert_eq!(s[*at..at + 4], s[14..]);
        }
        let c = Probes::generate(&pool, &ProbeOptions { seed: 8, ..o }).unwrap();
        assert_ne!(a.repeated, c.repeated);
    }
}
