//! Streaming accumulators: each batch's attention of one layer updates per-head counts that
//! stay on the model's device; nothing per sentence is kept. Inputs are plain tensors, so
//! tests can feed synthetic attention.

use crate::model::ModelError;
use tch::{Device, Kind as DType, Tensor};

/// Offsets `argmax - t` are counted in `[-MAX_OFFSET, MAX_OFFSET]`; farther ones fall in the
/// end bins.
pub const MAX_OFFSET: i64 = 127;
pub const BINS: i64 = 2 * MAX_OFFSET + 1;

/// What one sentence contributes, on one side of one attention kind.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SentenceMeta {
    /// Query positions that count (real tokens: not special, not padding).
    pub real_query: Vec<bool>,
    /// Keys a head's argmax may land on (not padding; not EOS/SEP unless kept).
    pub key_ok: Vec<bool>,
    /// Key indices of the rarest and second-rarest real tokens, when the sentence counts
    /// for the rare-word statistic.
    pub rare: Option<(usize, usize)>,
    /// Word alignment for the syntactic statistic.
    pub words: Option<Words>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Words {
    /// For each token (query side = key side), the words it overlaps: usually one; a token
    /// spanning several words (`▁$10` over `$` and `103.7`) belongs to each of them.
    pub words_of_token: Vec<Vec<usize>>,
    pub n_words: usize,
    /// (relation-direction index, query word, target word).
    pub edges: Vec<(usize, usize, usize)>,
}

/// Per-layer accumulators of one attention kind, one slot per head present in each layer
/// (layers of a physically pruned model differ in width).
pub struct Accumulator {
    pub n_layers: usize,
    pub n_reldirs: usize,
    device: Device,
    conf: Vec<Tensor>,
    hist: Vec<Tensor>,
    rare1: Vec<Tensor>,
    rare2: Vec<Tensor>,
    syn: Vec<Tensor>,
    /// The syntactic statistic's word rows summed over the tiles so far of one layer.
    syn_rows: Option<(usize, Tensor)>,
    pub queries: usize,
    pub rare_queries: usize,
    pub rare_sentences: usize,
    pub edges: Vec<usize>,
}

/// The batch's metadata as tensors on the device, built once per batch.
pub struct BatchTensors {
    /// The padded query length.
    tq: i64,
    /// The keys counted, where they are one span `lo .. hi` in every row.
    key_span: Option<(i64, i64)>,
    real_q: Tensor,
    key_ok: Tensor,
    rare: Option<(Tensor, Tensor, Tensor)>,
    syn: Option<SynTensors>,
}

struct SynTensors {
    qavg: Tensor,
    m: Tensor,
    word_valid: Tensor,
    e_flat: Tensor,
    e_target: Tensor,
    e_rd: Tensor,
}

fn pad_bool(v: &[bool], n: usize) -> impl Iterator<Item = f32> + '_ {
    v.iter().map(|&b| if b { 1.0 } else { 0.0 }).chain(std::iter::repeat(0.0)).take(n)
}

impl BatchTensors {
    /// `tq` / `tk`: padded query and key lengths of the batch's attention.
    pub fn new(metas: &[SentenceMeta], tq: usize, tk: usize, device: Device, want_rare: bool, want_syn: bool) -> Self {
        let b = metas.len() as i64;
        let real_q: Vec<f32> = metas.iter().flat_map(|m| pad_bool(&m.real_query, tq)).collect();
        let key_ok: Vec<f32> = metas.iter().flat_map(|m| pad_bool(&m.key_ok, tk)).collect();
        let real_q = Tensor::from_slice(&real_q).view([b, 1, tq as i64]).to_device(device);
        let key_ok = Tensor::from_slice(&key_ok).view([b, 1, 1, tk as i64]).to_device(device).gt(0.5);
        let rare = want_rare.then(|| {
            let r1: Vec<i64> = metas.iter().map(|m| m.rare.map_or(-1, |r| r.0 as i64)).collect();
            let r2: Vec<i64> = metas.iter().map(|m| m.rare.map_or(-1, |r| r.1 as i64)).collect();
            let counted: Vec<f32> = metas.iter().map(|m| if m.rare.is_some() { 1.0 } else { 0.0 }).collect();
            (
                Tensor::from_slice(&r1).view([b, 1, 1]).to_device(device),
                Tensor::from_slice(&r2).view([b, 1, 1]).to_device(device),
                Tensor::from_slice(&counted).view([b, 1, 1]).to_device(device),
            )
        });
        let syn = if want_syn && metas.iter().any(|m| m.words.is_some()) {
            let nw = metas.iter().filter_map(|m| m.words.as_ref().map(|w| w.n_words)).max().unwrap_or(0).max(1);
            let mut qavg = vec![0f32; metas.len() * nw * tq];
            let mut mm = vec![0f32; metas.len() * tk * nw];
            let mut valid = vec![0f32; metas.len() * nw];
            let (mut flat, mut target, mut rd) = (Vec::new(), Vec::new(), Vec::new());
            for (bi, m) in metas.iter().enumerate() {
                let Some(w) = &m.words else { continue };
                let mut count = vec![0f32; nw];
                for wd in w.words_of_token.iter().flatten() {
                    count[*wd] += 1.0;
                }
                for (t, wds) in w.words_of_token.iter().enumerate() {
                    for &wd in wds {
                        if t < tq {
                            qavg[(bi * nw + wd) * tq + t] = 1.0 / count[wd];
                        }
                        if t < tk {
                            mm[(bi * tk + t) * nw + wd] = 1.0;
                        }
                    }
                }
                for wd in 0..w.n_words {
                    valid[bi * nw + wd] = 1.0;
                }
                for &(r, q, tg) in &w.edges {
                    flat.push((bi * nw + q) as i64);
                    target.push(tg as i64);
                    rd.push(r as i64);
                }
            }
            let b = metas.len() as i64;
            Some(SynTensors {
                qavg: Tensor::from_slice(&qavg).view([b, 1, nw as i64, tq as i64]).to_device(device),
                m: Tensor::from_slice(&mm).view([b, 1, tk as i64, nw as i64]).to_device(device),
                word_valid: Tensor::from_slice(&valid).view([b, 1, 1, nw as i64]).to_device(device).gt(0.5),
                e_flat: Tensor::from_slice(&flat).to_device(device),
                e_target: Tensor::from_slice(&target).view([-1, 1]).to_device(device),
                e_rd: Tensor::from_slice(&rd).to_device(device),
            })
        } else {
            None
        };
        let span = |m: &SentenceMeta| -> Option<(i64, i64)> {
            let ok: Vec<bool> = m.key_ok.iter().copied().chain(std::iter::repeat(false)).take(tk).collect();
            let lo = ok.iter().position(|&b| b)?;
            let hi = ok.iter().rposition(|&b| b)? + 1;
            ok[lo..hi].iter().all(|&b| b).then_some((lo as i64, hi as i64))
        };
        let spans: Vec<Option<(i64, i64)>> = metas.iter().map(span).collect();
        let key_span = match spans.first() {
            Some(Some(first)) if spans.iter().all(|s| s.as_ref() == Some(first)) => Some(*first),
            _ => None,
        };
        BatchTensors { tq: tq as i64, key_span, real_q, key_ok, rare, syn }
    }
}

impl Accumulator {
    /// `layer_heads[l]`: the heads layer `l` holds.
    pub fn new(layer_heads: &[usize], n_reldirs: usize, device: Device) -> Self {
        let z = |shape: &dyn Fn(i64) -> Vec<i64>| {
            layer_heads.iter().map(|&h| Tensor::zeros(shape(h as i64), (DType::Double, device))).collect::<Vec<_>>()
        };
        Accumulator {
            n_layers: layer_heads.len(),
            n_reldirs,
            device,
            conf: z(&|h| vec![h]),
            hist: z(&|h| vec![h, BINS]),
            rare1: z(&|h| vec![h]),
            rare2: z(&|h| vec![h]),
            syn: z(&|h| vec![n_reldirs.max(1) as i64, h]),
            syn_rows: None,
            queries: 0,
            rare_queries: 0,
            rare_sentences: 0,
            edges: vec![0; n_reldirs],
        }
    }

    /// Counts a batch's queries, rare sentences and edges (once per batch, not per layer).
    pub fn count_batch(&mut self, metas: &[SentenceMeta]) {
        for m in metas {
            let q = m.real_query.iter().filter(|&&b| b).count();
            self.queries += q;
            if m.rare.is_some() {
                self.rare_queries += q;
                self.rare_sentences += 1;
            }
            if let Some(w) = &m.words {
                for &(rd, _, _) in &w.edges {
                    self.edges[rd] += 1;
                }
            }
        }
    }

    /// One layer's attention `[B, H, Tq, Tk]` of the batch described by `bt`.
    pub fn update(&mut self, layer: usize, attn: &Tensor, bt: &BatchTensors) -> Result<(), ModelError> {
        self.update_rows(layer, 0, 0, attn, bt)
    }

    /// Query rows `q0 .. q0 + n` of one layer's attention over keys `k0 .. k0 + m`, `[B, H, n,
    /// m]` (a score tile: docs/methods.md#score-tiles; the other keys have weight 0). Every
    /// statistic but the syntactic one is a sum over query rows, each row's argmax over all its
    /// keys (ties: the first key), so tiles in any order and of any height give the whole
    /// pattern's counts. The syntactic one sums each word's rows over the tiles and decides when
    /// the layer's last row has come.
    pub fn update_rows(
        &mut self,
        layer: usize,
        q0: i64,
        k0: i64,
        attn: &Tensor,
        bt: &BatchTensors,
    ) -> Result<(), ModelError> {
        // float32, or float64 as a float64 model computes it.
        let a = if attn.kind() == DType::Double { attn.shallow_clone() } else { attn.to_kind(DType::Float) };
        let (b, h, n, m) = (a.size()[0], a.size()[1], a.size()[2], a.size()[3]);
        // A row whose keys here are all excluded gets -1 (as over every key: its skipped keys
        // weigh 0 and are not excluded only where a kept key is).
        let (mx, arg) = match bt.key_span {
            // The keys counted are one span in every row (one unpadded text): its max, no copy.
            Some((lo, hi)) => {
                let (lo, hi) = (lo.max(k0), hi.min(k0 + m));
                if lo < hi {
                    let (mx, arg) = a.f_narrow(3, lo - k0, hi - lo)?.f_max_dim(-1, false)?;
                    (mx, arg + lo)
                } else {
                    let z = Tensor::f_zeros([b, h, n], (DType::Int64, a.device()))?;
                    (z.f_to_kind(a.kind())? - 1.0, z + k0)
                }
            }
            None => {
                let masked = a.f_masked_fill(&bt.key_ok.f_narrow(3, k0, m)?.logical_not(), -1.0)?;
                let (mx, arg) = masked.f_max_dim(-1, false)?; // [B, H, n]
                (mx, arg + k0)
            }
        };
        let rq = bt.real_q.f_narrow(2, q0, n)?; // [B, 1, n]
        self.conf[layer] += (&mx * &rq).sum_dim_intlist([0i64, 2].as_slice(), false, DType::Double);

        let t = Tensor::arange_start(q0, q0 + n, (DType::Int64, self.device)).view([1, 1, n]);
        let bins = (&arg - t).clamp(-MAX_OFFSET, MAX_OFFSET) + MAX_OFFSET;
        let idx = bins.permute([1, 0, 2]).reshape([h, b * n]);
        let w = rq.expand([b, h, n], false).permute([1, 0, 2]).reshape([h, b * n]).to_kind(DType::Double);
        self.hist[layer] = self.hist[layer].f_scatter_add(1, &idx, &w)?;

        if let Some((r1, r2, counted)) = &bt.rare {
            let q = &rq * counted; // [B, 1, n]
            let hit1 = arg.eq_tensor(r1).to_kind(DType::Float);
            let hit2 = arg.eq_tensor(r2).to_kind(DType::Float).maximum(&hit1);
            self.rare1[layer] += (hit1 * &q).sum_dim_intlist([0i64, 2].as_slice(), false, DType::Double);
            self.rare2[layer] += (hit2 * &q).sum_dim_intlist([0i64, 2].as_slice(), false, DType::Double);
        }

        if let Some(s) = &bt.syn {
            if s.e_flat.numel() > 0 {
                // W[i, j] = mean over query tokens of word i of the sum over key tokens of
                // word j: the rows of word i come tile by tile, each tile's keys `k0 ..`
                // summed into their words at once (W is linear in the weights).
                let words = s.m.f_narrow(2, k0, m)?.to_kind(a.kind()); // [B, 1, m, NW]
                let part = s.qavg.f_narrow(3, q0, n)?.to_kind(a.kind()).matmul(&a).matmul(&words); // [B, H, NW, NW]
                let sum = match self.syn_rows.take() {
                    Some((l, prev)) if l == layer && q0 > 0 => prev + part,
                    _ => part,
                };
                if q0 + n < bt.tq {
                    self.syn_rows = Some((layer, sum));
                } else {
                    let wm = sum; // [B, H, NW, NW]
                    let wm = wm.f_masked_fill(&s.word_valid.logical_not(), -1.0)?;
                    let argw = wm.argmax(-1, false); // [B, H, NW]
                    let nw = argw.size()[2];
                    let flat = argw.permute([0, 2, 1]).reshape([b * nw, h]);
                    let pred = flat.f_index_select(0, &s.e_flat)?; // [E, H]
                    let correct = pred.eq_tensor(&s.e_target).to_kind(DType::Double);
                    self.syn[layer] = self.syn[layer].f_index_add(0, &s.e_rd, &correct)?;
                }
            }
        }
        Ok(())
    }

    fn matrix(t: &[Tensor], scale: f64) -> Result<Vec<Vec<f64>>, ModelError> {
        t.iter()
            .map(|x| Ok(Vec::<f64>::try_from(x.to_device(Device::Cpu))?.into_iter().map(|v| v / scale).collect()))
            .collect()
    }

    /// Sums over real queries of the max non-excluded weight: `[layer][head]` (divided by
    /// `queries`, a head's confidence).
    pub fn confidence_sums(&self) -> Result<Vec<Vec<f64>>, ModelError> {
        Self::matrix(&self.conf, 1.0)
    }

    /// Per-layer 2-D tensors as `[layer][row][column]` on the host.
    fn rows(t: &[Tensor]) -> Result<Vec<Vec<Vec<f64>>>, ModelError> {
        t.iter().map(|x| Ok(Vec::<Vec<f64>>::try_from(x.to_device(Device::Cpu))?)).collect()
    }

    /// Offset histograms `[layer][head][bin]`; bin `i` is offset `i - MAX_OFFSET`.
    pub fn offsets(&self) -> Result<Vec<Vec<Vec<f64>>>, ModelError> {
        Self::rows(&self.hist)
    }

    /// Queries (of counted sentences) whose argmax is the rarest token, and one of the two
    /// rarest: `[layer][head]` (divided by `rare_queries`, the rare-word scores).
    pub fn rare_hits(&self) -> Result<(crate::model::HeadGrid, crate::model::HeadGrid), ModelError> {
        Ok((Self::matrix(&self.rare1, 1.0)?, Self::matrix(&self.rare2, 1.0)?))
    }

    /// Correct counts `[layer][reldir][head]` (empty rows when no relations were asked for).
    pub fn syntactic_correct(&self) -> Result<Vec<Vec<Vec<f64>>>, ModelError> {
        let mut r = Self::rows(&self.syn)?;
        r.iter_mut().for_each(|layer| layer.truncate(self.n_reldirs));
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two sentences (the second padded), 10 positions, 3 heads: weights with planted ties
    /// (a row of equal weights, two equal maxima) and one key excluded.
    fn batch() -> (Vec<SentenceMeta>, Tensor) {
        let _g = tch::no_grad_guard();
        tch::manual_seed(7);
        let t = 10;
        let words = |n: usize| Words {
            words_of_token: (0..n).map(|i| vec![i / 2]).collect(),
            n_words: n.div_ceil(2),
            edges: vec![(0, 0, 1), (1, 1, 0), (0, 2, 3), (1, 3, 2)],
        };
        let metas = vec![
            SentenceMeta {
                real_query: (0..t).map(|i| i > 0).collect(),
                key_ok: (0..t).map(|i| i != 4).collect(),
                rare: Some((3, 7)),
                words: Some(words(t)),
            },
            SentenceMeta {
                real_query: (0..t).map(|i| i > 0 && i < 8).collect(),
                key_ok: (0..t).map(|i| i < 8).collect(),
                rare: Some((2, 5)),
                words: Some(words(8)),
            },
        ];
        let a = Tensor::rand([2, 3, t as i64, t as i64], (DType::Float, Device::Cpu)).softmax(-1, DType::Float);
        // Ties: head 0's row 5 uniform; head 1's row 6 with two equal maxima at keys 2 and 8.
        let _ = a.get(0).get(0).get(5).fill_(0.1);
        let _ = a.get(0).get(1).get(6).get(2).fill_(0.9);
        let _ = a.get(0).get(1).get(6).get(8).fill_(0.9);
        (metas, a)
    }

    type Rows = Vec<Vec<Vec<f64>>>;

    /// Confidence sums, offset histograms, rare hits (either of two), syntactic counts.
    fn sums(acc: &Accumulator) -> (Vec<Vec<f64>>, Rows, crate::model::HeadGrid, Rows) {
        (
            acc.confidence_sums().unwrap(),
            acc.offsets().unwrap(),
            acc.rare_hits().unwrap().1,
            acc.syntactic_correct().unwrap(),
        )
    }

    fn tiled(metas: &[SentenceMeta], a: &Tensor, rows: i64, skip: Option<i64>) -> Accumulator {
        let bt = BatchTensors::new(metas, 10, 10, Device::Cpu, true, true);
        let mut acc = Accumulator::new(&[3], 2, Device::Cpu);
        let mut q0 = 0;
        while q0 < 10 {
            let n = rows.min(10 - q0);
            if skip != Some(q0) {
                acc.update_rows(0, q0, 0, &a.narrow(2, q0, n), &bt).unwrap();
            }
            q0 += n;
        }
        acc
    }

    #[test]
    fn tiles_of_any_height_count_as_the_whole_pattern() {
        let (metas, a) = batch();
        let whole = tiled(&metas, &a, 10, None);
        let (conf, hist, rare, syn) = sums(&whole);
        // The planted ties: the uniform row's argmax is its first key (offset -5), the
        // two-maxima row's is key 2 (offset -4), tiles or not.
        assert!(hist[0][0][(MAX_OFFSET - 5) as usize] >= 1.0, "{:?}", hist[0][0]);
        assert!(hist[0][1][(MAX_OFFSET - 4) as usize] >= 1.0, "{:?}", hist[0][1]);
        for rows in [1, 3, 4, 7] {
            let t = tiled(&metas, &a, rows, None);
            let (c, h, r, s) = sums(&t);
            for (x, y) in c[0].iter().zip(&conf[0]) {
                assert!((x - y).abs() <= 1e-12, "rows {rows}: confidence {x} against {y}");
            }
            assert_eq!(h, hist, "rows {rows}: offsets");
            assert_eq!(r, rare, "rows {rows}: rare hits");
            assert_eq!(s, syn, "rows {rows}: syntactic");
        }
        // One text whose counted keys are one span (all but the first): its max over the span
        // equals the masked max, tiles or not.
        let one = vec![SentenceMeta { key_ok: (0..10).map(|i| i > 0).collect(), ..metas[0].clone() }];
        let a1 = a.narrow(0, 0, 1);
        let spanned = tiled(&one, &a1, 3, None);
        let mut bt = BatchTensors::new(&one, 10, 10, Device::Cpu, true, true);
        assert_eq!(bt.key_span, Some((1, 10)));
        bt.key_span = None;
        let mut masked = Accumulator::new(&[3], 2, Device::Cpu);
        masked.update(0, &a1, &bt).unwrap();
        let (s1, s2) = (sums(&spanned), sums(&masked));
        assert_eq!((&s1.1, &s1.2, &s1.3), (&s2.1, &s2.2, &s2.3), "a span's argmax against the masked argmax");
        for (x, y) in s1.0[0].iter().zip(&s2.0[0]) {
            assert!((x - y).abs() <= 1e-12, "a span's max {x} against the masked max {y}");
        }
        // A tile left out (a dropped boundary) changes the counts: the test can fail.
        let dropped = tiled(&metas, &a, 3, Some(3));
        assert_ne!(sums(&dropped).1, hist, "a dropped tile went unnoticed");
        assert_ne!(sums(&dropped).3, syn, "a dropped tile went unnoticed by the syntactic sum");
    }
}
