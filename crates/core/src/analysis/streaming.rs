//! Which heads need the whole context (docs/methods.md#streaming-heads): scorers of the
//! decoder-only stack's heads (RazorAttention's echo and induction, Wu et al.'s retrieval,
//! HeadKV's needle mass, kvpress's on-the-fly DuoAttention score), the exact key/value cache a
//! split keeps, and the curve of quality against the cache kept when the lowest-scored
//! key/value groups stream. Everything runs through the one forward of a view
//! ([`crate::model::view::View`]): a split is `View::streaming`.

use super::taxonomy::{ProbeOptions, Probes};
use super::AnalysisError;
use crate::data::Dataset;
use crate::model::hooks::{At, Point, Record};
use crate::model::nn::{Gates, Regime};
use crate::model::view::View;
use crate::model::{HeadId, Kind, Model, ModelError};
use tch::{Device, Kind as DType, Tensor};

options_enum!(Scorer, "streaming scorer", {
    /// Attention on the current token's earlier occurrence (RazorAttention's echo heads).
    Echo = "echo",
    /// Attention on the token after that occurrence (RazorAttention's induction heads).
    Induction = "induction",
    /// The larger of echo and induction.
    Razor = "razor",
    /// Top-1 copy of the needle token being predicted (Wu et al. 2025).
    Retrieval = "retrieval",
    /// Attention mass on the needle while it is predicted (HeadKV, Fu et al. 2025).
    HeadKv = "headkv",
    /// kvpress's on-the-fly DuoAttention score: the area under the cumulated attention of a
    /// mean query over mean keys.
    Duo = "duo",
});

pub const SCORERS: [Scorer; 6] =
    [Scorer::Echo, Scorer::Induction, Scorer::Razor, Scorer::Retrieval, Scorer::HeadKv, Scorer::Duo];

/// The probes' shape and kvpress's query length.
#[derive(Debug, Clone)]
pub struct ScoreOptions {
    pub probes: ProbeOptions,
    /// kvpress's `q_len`: positions of the repeated mean query and key (500).
    pub q_len: i64,
}

/// The taxonomy's seeded probes for this model, an error naming `func` instead of `head_types`.
fn probes(model: &Model, o: &ProbeOptions, func: &str) -> Result<Probes, AnalysisError> {
    probes_counted(model, o, func, "n")
}

/// [`probes`] for a function whose option `count` gives the number of probes (the budget's
/// refusal names that option, not `n`).
fn probes_counted(model: &Model, o: &ProbeOptions, func: &str, count: &str) -> Result<Probes, AnalysisError> {
    Probes::generate(&super::taxonomy::token_pool(model), o).map_err(|e| {
        AnalysisError::Input(e.to_string().replace("head_types", func).replacen(" n = ", &format!(" {count} = "), 1))
    })
}

/// Per layer `[layers][heads]` scores of the decoder-only stack's heads, in the original
/// numbering (NaN where `prune_heads` removed a head): higher needs the whole context more.
/// `data` feeds the duo scorer (kvpress: its mean queries and keys).
pub fn scores(
    v: &View,
    scorer: Scorer,
    data: Option<&Dataset>,
    o: &ScoreOptions,
    stop: &dyn Fn() -> bool,
) -> Result<Vec<Vec<f64>>, AnalysisError> {
    let model = &v.model;
    if !model.decoder_only() {
        return Err(AnalysisError::Input(format!(
            "kv_scores: {} is not a decoder-only model: its heads keep no key/value cache to compress",
            model.name()
        )));
    }
    let gates = v.gates()?;
    let _g = tch::no_grad_guard();
    let held = model.layer_heads(Kind::Dec);
    let mut sums: Vec<Vec<f64>> = held.iter().map(|&h| vec![0.0; h]).collect();
    let add = |row: &mut Vec<f64>, t: &Tensor| -> Result<(), ModelError> {
        for (s, x) in row.iter_mut().zip(Vec::<f64>::try_from(t.to_kind(DType::Double).to_device(Device::Cpu))?) {
            *s += x;
        }
        Ok(())
    };
    let n: f64;
    match scorer {
        Scorer::Echo | Scorer::Induction | Scorer::Razor => {
            let probes = probes(model, &o.probes, "kv_scores")?;
            let len = o.probes.len as i64;
            let mut echo: Vec<Vec<f64>> = sums.clone();
            super::taxonomy::attend(model, &probes.repeated, &gates, stop, &mut |l, tile, _| {
                let (q0, a) = (tile.q0, tile.full_pattern()?);
                // Queries of the second half (i = len + i'): the echo key i', the induction key
                // i' + 1; those of this tile: rows lo..hi.
                let Some((lo, hi)) = super::taxonomy::tile_span(q0, a.size()[2], len, len) else { return Ok(()) };
                let second = a.narrow(2, lo - q0, hi - lo);
                let diag = |k0: i64| {
                    second.narrow(3, k0, hi - lo).diagonal(0, -2, -1).sum_dim_intlist(
                        [0i64, 2].as_slice(),
                        false,
                        DType::Double,
                    ) / len as f64
                };
                add(&mut echo[l], &diag(lo - len))?;
                add(&mut sums[l], &diag(lo - len + 1))
            })?;
            n = probes.repeated.len() as f64;
            match scorer {
                Scorer::Echo => sums = echo,
                Scorer::Razor => {
                    for (r, e) in sums.iter_mut().zip(&echo) {
                        for (x, y) in r.iter_mut().zip(e) {
                            *x = x.max(*y);
                        }
                    }
                }
                _ => {}
            }
        }
        Scorer::Retrieval | Scorer::HeadKv => {
            let probes = probes(model, &o.probes, "kv_scores")?;
            for (seq, at) in &probes.needles {
                let needle = o.probes.needle;
                super::taxonomy::attend(model, std::slice::from_ref(seq), &gates, stop, &mut |l, tile, _| {
                    // The queries of this tile that predict the second needle's tokens `[H, m, T]`.
                    let a = tile.full_pattern()?;
                    let Some((rows, from)) = super::taxonomy::needle_rows(tile.q0, &a, seq, needle) else {
                        return Ok(());
                    };
                    if scorer == Scorer::HeadKv {
                        let mass = rows.narrow(2, *at as i64, needle as i64).sum_dim_intlist(
                            [1i64, 2].as_slice(),
                            false,
                            DType::Double,
                        ) / needle as f64;
                        return add(&mut sums[l], &mass);
                    }
                    for (s, x) in sums[l].iter_mut().zip(super::taxonomy::copied(&rows, from, seq, *at, needle)?) {
                        *s += x;
                    }
                    Ok(())
                })?;
            }
            n = probes.needles.len() as f64;
        }
        Scorer::Duo => {
            let data = data.ok_or_else(|| AnalysisError::Input("kv_scores: the duo scorer needs data (its mean queries and keys): kv_scores(\"duo\", #{data: ...})".into()))?;
            n = duo(model, data, &gates, o.q_len, stop, &mut sums)? as f64;
        }
    }
    Ok(sums
        .iter()
        .enumerate()
        .map(|(l, row)| model.spread(Kind::Dec, l, &row.iter().map(|s| s / n).collect::<Vec<_>>()))
        .collect())
}

/// kvpress's `duo_attention_on_the_fly`, added into `sums` per text of `data`: per layer, the
/// mean query and the mean key over the text's tokens (after the q/k norms, before rotary),
/// each repeated `q_len` times and rotated to positions `0..q_len`; the last query's softmax
/// over the keys (scored by the model's attention, [`crate::model::nn::Attention::scores_of`]: kvpress's
/// `1/sqrt(d_head)` unless the family scales or caps its own), cumulated over the keys and
/// averaged; then
/// averaged over each key/value group's query heads. Returns the number of texts.
fn duo(
    model: &Model,
    data: &Dataset,
    gates: &Gates,
    q_len: i64,
    stop: &dyn Fn() -> bool,
    sums: &mut [Vec<f64>],
) -> Result<usize, AnalysisError> {
    if data.is_empty() {
        return Err(AnalysisError::Input("kv_scores: the duo scorer's data is empty".into()));
    }
    for text in data.texts() {
        if stop() {
            return Err(ModelError::Interrupted.into());
        }
        let b = model.batch(&[text])?;
        let mut means: Vec<(Option<Tensor>, Option<Tensor>)> = (0..sums.len()).map(|_| (None, None)).collect();
        let mut on = |at: At, x: &Tensor| -> Result<(), ModelError> {
            let m = x.get(0).mean_dim([1i64].as_slice(), true, x.kind()); // [heads, 1, dh]
            match at.point {
                Point::Q => means[at.layer].0 = Some(m),
                _ => means[at.layer].1 = Some(m),
            }
            Ok(())
        };
        let mut rec = Record::new(&[Point::Q, Point::K], &mut on);
        let _ = model.encode(&b, gates, Some(&mut rec))?;
        for (l, (q, k)) in means.into_iter().enumerate() {
            let (Some(q), Some(k), Some(attn)) = (q, k, model.attention(Kind::Dec, l)) else { continue };
            let (h, hk, dh) = (q.size()[0], k.size()[0], q.size()[2]);
            // The repeated keys and rotated queries, the scores and their softmax (float64).
            let bytes = q_len as f64 * ((hk + 2 * h) * dh + 2 * h) as f64 * 8.0;
            crate::budget::check(&format!("kv_scores: q_len = {q_len} repeated queries and keys"), bytes)
                .map_err(AnalysisError::Input)?;
            // The last of `q_len` queries (at position q_len - 1) over `q_len` keys, scored as
            // the model's attention scores.
            let q = q.unsqueeze(0);
            let k = k.expand([hk, q_len, dh], false).unsqueeze(0);
            let w = attn.scores_of(&q, q_len - 1, &k)?;
            let w = w.softmax(-1, DType::Double).reshape([h, q_len]);
            let s = w.cumsum(1, DType::Double).mean_dim([1i64].as_slice(), false, DType::Double);
            let per = (h / hk.max(1)).max(1);
            let s = s
                .view([h / per, per])
                .mean_dim([1i64].as_slice(), true, DType::Double)
                .expand([h / per, per], false)
                .reshape([h]);
            for (x, y) in sums[l].iter_mut().zip(Vec::<f64>::try_from(s.to_device(Device::Cpu))?) {
                *x += y;
            }
        }
    }
    Ok(data.len())
}

/// Per key/value group `[layers][groups]`: the mean of its query heads' scores (removed heads
/// left out).
pub fn group_scores(v: &View, scores: &[Vec<f64>]) -> Vec<Vec<f64>> {
    scores
        .iter()
        .enumerate()
        .map(|(l, row)| {
            let per = v.group_size(Kind::Dec, l);
            row.chunks(per)
                .map(|g| {
                    let kept: Vec<f64> = g.iter().copied().filter(|x| x.is_finite()).collect();
                    if kept.is_empty() {
                        f64::NAN
                    } else {
                        kept.iter().sum::<f64>() / kept.len() as f64
                    }
                })
                .collect()
        })
        .collect()
}

/// The key/value cache of one sequence of `context` tokens under a view's streaming heads,
/// counted from shapes (docs/methods.md#streaming-heads).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvCost {
    /// Entries (one key and one value of one group at one position) kept, and of the full cache.
    pub entries: i64,
    pub full_entries: i64,
    /// Bytes of the keys and values kept, and of the full cache, in the model's dtype.
    pub bytes: i64,
    pub full_bytes: i64,
    /// Key/value groups, and those streaming.
    pub groups: i64,
    pub streaming: i64,
}

impl KvCost {
    pub fn fraction(&self) -> f64 {
        if self.full_entries == 0 {
            1.0
        } else {
            self.entries as f64 / self.full_entries as f64
        }
    }
}

/// The entries a streaming group keeps after `context` positions: `sink + recent` of them
/// (regime always), or, reading a prompt of `prompt` tokens in full, `sink + recent` of the
/// prompt and every position after it (regime decode, as kvpress compresses the prompt once).
pub fn streaming_entries(sink: i64, recent: i64, regime: Regime, context: i64, first: Option<i64>) -> i64 {
    let w = sink + recent;
    match regime {
        Regime::Always => context.min(w),
        Regime::Decode { prompt } => {
            let p = prompt.or(first).unwrap_or(context).min(context);
            p.min(w) + (context - p)
        }
    }
}

/// The exact cache of a view at `context` tokens (batch 1): per layer, each key/value group
/// keeps `context` keys and values, a streaming group [`streaming_entries`]; each entry is
/// `2 x d_head` numbers of the model's dtype. `first`: a generation's prompt length, the
/// decode regime's prompt when the view names none (else the whole context is prompt).
pub fn kv_cost(v: &View, context: i64, first: Option<i64>) -> KvCost {
    let m = &v.model;
    let elem = m.opts.dtype.elt_size_in_bytes() as i64;
    let (mut entries, mut full, mut bytes, mut full_bytes, mut groups, mut streaming) = (0, 0, 0, 0, 0, 0);
    let per_layer = m.layer_heads(Kind::Dec).len();
    for l in 0..per_layer {
        let Some(a) = m.mixer(Kind::Dec, l) else { continue };
        let per = v.group_size(Kind::Dec, l);
        let width = a.width();
        // Each entry of a group: a key and a value for attention (`2 x d_head`); a mixer whose
        // state does not grow holds a constant number of entries ([`crate::model::mixer`]).
        let numbers = a.numbers_per_entry();
        let whole = a.entries(context);
        if width == 0 {
            // A mixer without heads (a short convolution's last inputs) holds one state whatever
            // the context: one group that never streams.
            if numbers > 0 {
                groups += 1;
                entries += whole;
                full += whole;
                bytes += whole * numbers * elem;
                full_bytes += whole * numbers * elem;
            }
            continue;
        }
        // What the layer keeps beside its groups (a state-space layer's convolution inputs).
        let fixed = a.fixed_numbers();
        bytes += fixed * elem;
        full_bytes += fixed * elem;
        // A state that does not grow never streams.
        let grows = a.entries(context.max(2)) > a.entries(1);
        for g in 0..(width / per) {
            let present = (g * per..(g + 1) * per).any(|h| a.physical(h).is_some());
            if !present {
                continue;
            }
            let streams = v
                .streaming
                .as_ref()
                .is_some_and(|s| s.heads.get(l).and_then(|r| r.get(g * per)).copied().unwrap_or(false))
                && grows;
            let n = match (&v.streaming, streams) {
                (Some(s), true) => streaming_entries(s.sink, s.recent, s.regime, context, first),
                _ => whole,
            };
            groups += 1;
            streaming += streams as i64;
            entries += n;
            full += whole;
            bytes += n * numbers * elem;
            full_bytes += whole * numbers * elem;
        }
    }
    KvCost { entries, full_entries: full, bytes, full_bytes, groups, streaming }
}

/// PruLong's KV footprint of one sequence (docs/methods.md#kv-footprint): a prompt of
/// `prompt` tokens read in chunks of `chunk`, then `decode` tokens generated one at a time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Footprint {
    /// Sum over every query position and key/value group of the entries the group holds while
    /// that query runs (entries times their lifespan), and the same of the full cache.
    pub entry_steps: i64,
    pub full_entry_steps: i64,
    /// The most entries held at once (at the end of a step, summed over groups), and the full
    /// cache's (every group holding every position).
    pub peak: i64,
    pub full_peak: i64,
}

impl Footprint {
    pub fn fraction(&self) -> f64 {
        if self.full_entry_steps == 0 {
            1.0
        } else {
            self.entry_steps as f64 / self.full_entry_steps as f64
        }
    }
    pub fn peak_fraction(&self) -> f64 {
        if self.full_peak == 0 {
            1.0
        } else {
            self.peak as f64 / self.full_peak as f64
        }
    }
}

/// The entries a streaming group retains from before position `a` (the start of a step) for
/// the queries from `a` on: those a later query can still see.
fn retained(sink: i64, recent: i64, regime: Regime, prompt: i64, a: i64) -> i64 {
    match regime {
        // j < sink or j > a - recent.
        Regime::Always => a.min(sink + recent - 1),
        // The prompt is read in full; from it on, j < sink or j >= P - recent, and every
        // position after the prompt.
        Regime::Decode { .. } if a < prompt => a,
        Regime::Decode { .. } => prompt.min(sink + recent) + (a - prompt),
    }
}

/// Per step of the sequence (a chunk `[a, b)` of the prompt, or one generated position), for
/// one streaming group (`None`: a full one): the entry-steps of the step's queries (each holds
/// the entries retained from before `a` and the step's own up to itself) and the entries held
/// at the step's end.
fn group_steps(stream: Option<(i64, i64, Regime, i64)>, prompt: i64, decode: i64, chunk: i64) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    let mut a = 0;
    while a < prompt + decode {
        let b = if a < prompt { (a + chunk).min(prompt) } else { a + 1 };
        let n = b - a;
        let before = match stream {
            None => a,
            Some((sink, recent, regime, p)) => retained(sink, recent, regime, p, a),
        };
        out.push((n * before + n * (n + 1) / 2, before + n));
        a = b;
    }
    out
}

/// PruLong's KV footprint (Bhaskar et al. 2025) of a view's split for one sequence of
/// `prompt + decode` tokens, the prompt read in chunks of `chunk` tokens
/// (docs/methods.md#kv-footprint). The decode regime's prompt (read in full) is the view's,
/// else `prompt`.
pub fn kv_footprint(v: &View, prompt: i64, decode: i64, chunk: i64) -> Footprint {
    let m = &v.model;
    let (mut n_full, mut n_stream) = (0i64, 0i64);
    for l in 0..m.layer_heads(Kind::Dec).len() {
        let Some(a) = m.mixer(Kind::Dec, l) else { continue };
        // A state that does not grow (a state-space or convolution layer's) is not a cache of
        // entries with lifespans: the footprint counts the growing caches only.
        if a.entries(2) <= a.entries(1) {
            continue;
        }
        let per = v.group_size(Kind::Dec, l);
        for g in 0..(a.width() / per) {
            if !(g * per..(g + 1) * per).any(|h| a.physical(h).is_some()) {
                continue;
            }
            let streams = v
                .streaming
                .as_ref()
                .is_some_and(|s| s.heads.get(l).and_then(|r| r.get(g * per)).copied().unwrap_or(false));
            if streams {
                n_stream += 1
            } else {
                n_full += 1
            }
        }
    }
    let stream = v.streaming.as_ref().map(|s| {
        let p = match s.regime {
            Regime::Decode { prompt: Some(p) } => p.min(prompt + decode),
            _ => prompt,
        };
        (s.sink, s.recent, s.regime, p)
    });
    footprint(n_full, n_stream, stream, prompt, decode, chunk)
}

/// The footprint of `n_full` full key/value groups and `n_stream` streaming ones (`stream`:
/// sink, recent, regime and the prompt the decode regime reads in full).
pub fn footprint(
    n_full: i64,
    n_stream: i64,
    stream: Option<(i64, i64, Regime, i64)>,
    prompt: i64,
    decode: i64,
    chunk: i64,
) -> Footprint {
    let chunk = chunk.max(1);
    let full = group_steps(None, prompt, decode, chunk);
    let streaming = match (stream, n_stream) {
        (Some(s), 1..) => group_steps(Some(s), prompt, decode, chunk),
        _ => full.clone(),
    };
    let groups = n_full + n_stream;
    let sum = |v: &[(i64, i64)]| v.iter().map(|x| x.0).sum::<i64>();
    Footprint {
        entry_steps: n_full * sum(&full) + n_stream * sum(&streaming),
        full_entry_steps: groups * sum(&full),
        peak: full.iter().zip(&streaming).map(|(f, s)| n_full * f.1 + n_stream * s.1).max().unwrap_or(0),
        full_peak: groups * (prompt + decode),
    }
}

/// The split keeping the `fraction` of key/value groups with the highest score full (rounded
/// to whole groups) and streaming the rest (ties: earlier layer and group first to stream).
pub fn split(
    v: &View,
    groups: &[Vec<f64>],
    fraction: f64,
    sink: i64,
    recent: i64,
    regime: Regime,
    func: &str,
) -> Result<View, ModelError> {
    let mut all: Vec<(f64, usize, usize)> = groups
        .iter()
        .enumerate()
        .flat_map(|(l, r)| r.iter().enumerate().filter(|(_, s)| s.is_finite()).map(move |(g, &s)| (s, l, g)))
        .collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0).then((a.1, a.2).cmp(&(b.1, b.2))));
    let n_stream = ((1.0 - fraction) * all.len() as f64).round() as usize;
    let heads: Vec<HeadId> = all[..n_stream.min(all.len())]
        .iter()
        .map(|&(_, l, g)| HeadId { kind: Kind::Dec, layer_idx: l, head: g * v.group_size(Kind::Dec, l) })
        .collect();
    if heads.is_empty() {
        // Nothing streams: the view as given (its streaming setting echoed all the same).
        return v.streaming(&[], sink, recent, regime, func);
    }
    v.streaming(&heads, sink, recent, regime, func)
}

/// What a point of the curve measures (docs/methods.md#kv-curve).
#[derive(Debug, Clone)]
pub struct CurvePoint {
    /// Key/value groups kept full (the fraction asked) and the cache kept at the context.
    pub fraction: f64,
    pub cost: KvCost,
    /// PruLong's KV footprint of the sequence: the prompt read in chunks, the measured
    /// positions generated one at a time.
    pub footprint: Footprint,
    /// Mean next-token loss over the measured positions, and KL(full || streaming) there.
    pub loss: f64,
    pub kl: f64,
    /// Mean next-token loss over the second half of repeated random tokens.
    pub induction_loss: f64,
    /// Synthetic passkey retrieval: the fraction of needle tokens predicted (argmax) in its
    /// second occurrence.
    pub passkey: f64,
}

/// The curve's typed options.
#[derive(Debug, Clone)]
pub struct CurveOptions {
    pub fractions: Vec<f64>,
    pub context: i64,
    /// Positions `measure_from..context` are measured (the decode regime's prompt).
    pub measure_from: i64,
    pub sink: i64,
    pub recent: i64,
    pub regime: Regime,
    /// Prefill chunk of the footprint's prompt.
    pub chunk: i64,
    /// Repeated random sequences for the induction loss (0: none), their seed.
    pub induction: usize,
    pub seed: u64,
    /// Needle sequences of `context` tokens for the passkey (0: none), the needle's length.
    pub passkey: usize,
    pub needle: usize,
}

/// The tokens of text a sequence of `context` tokens leaves beside its needle of `needle`
/// tokens, twice (at its depth and at the end): more than none, or an error naming `func` and
/// both options.
pub fn passkey_room(func: &str, needle: usize, context: i64) -> Result<usize, AnalysisError> {
    needle
        .checked_mul(2)
        .and_then(|twice| usize::try_from(context).ok()?.checked_sub(twice))
        .filter(|h| *h > 0)
        .ok_or_else(|| {
            AnalysisError::Input(format!(
                "{func}: option 'needle' {needle} (a passkey of {needle} tokens, twice) does not fit option 'context' {context}"
            ))
        })
}

/// The passkey probes: `n` sequences of `context` tokens, each a random haystack with a needle
/// of `needle` random tokens at a seeded depth, and the needle again at the end. `func` and
/// `count` (the option giving `n`) name the caller in errors.
pub fn passkeys(
    model: &Model,
    (func, count): (&str, &str),
    n: usize,
    needle: usize,
    context: i64,
    seed: u64,
) -> Result<Vec<(Vec<i64>, usize)>, AnalysisError> {
    let haystack = passkey_room(func, needle, context)?;
    Ok(probes_counted(model, &ProbeOptions { seed, n, len: 2, needle, haystack }, func, count)?.needles)
}

/// Passkeys inside text: `n` sequences of `context` tokens, each the first `context - 2 needle`
/// tokens of one of `texts` (in turn) with a needle of `needle` random distinct tokens inserted
/// at a seeded depth, and the needle again at the end.
pub fn passkeys_in(
    model: &Model,
    (func, count): (&str, &str),
    texts: &[Vec<i64>],
    n: usize,
    needle: usize,
    context: i64,
    seed: u64,
) -> Result<Vec<(Vec<i64>, usize)>, AnalysisError> {
    let hay = passkey_room(func, needle, context)?;
    let needles = passkeys(model, (func, count), n, needle, context, seed)?;
    Ok(needles
        .into_iter()
        .enumerate()
        .map(|(k, (random, _))| {
            let key = &random[random.len() - needle..];
            let text = &texts[k % texts.len().max(1)];
            let at = (super::importance::uniform(seed ^ 0x9A55, k as u64, 0) * (hay + 1) as f64) as usize % (hay + 1);
            let seq: Vec<i64> = text[..at].iter().chain(key).chain(&text[at..hay]).chain(key).copied().collect();
            (seq, at)
        })
        .collect())
}

/// The fraction of a needle's tokens after its first that the view predicts (argmax, teacher
/// forced) in its second occurrence, the last `needle` tokens of `seq`.
pub fn passkey_accuracy(v: &View, gates: &Gates, seq: &[i64], needle: usize) -> Result<f64, AnalysisError> {
    let at_second = seq.len() - needle;
    if needle < 2 {
        return Ok(f64::NAN);
    }
    let logp = log_probs(v, gates, seq, (at_second + 1) as i64)?;
    let top = Vec::<i64>::try_from(logp.argmax(-1, false).reshape([-1]).to_device(Device::Cpu))?;
    let hits = top.iter().zip(&seq[at_second + 1..]).filter(|(a, b)| a == b).count();
    Ok(hits as f64 / (needle - 1) as f64)
}

/// The data as consecutive sequences of `context` tokens (every text's tokens, special tokens
/// included, one after another).
pub fn chunks(model: &Model, data: &Dataset, context: i64) -> Result<Vec<Vec<i64>>, AnalysisError> {
    let mut stream = Vec::new();
    for t in data.texts() {
        stream.extend(model.tokenize(t)?.ids);
    }
    let out: Vec<Vec<i64>> = stream.chunks_exact(context as usize).map(|c| c.to_vec()).collect();
    if out.is_empty() {
        return Err(AnalysisError::Input(format!(
            "kv_curve: {} has {} tokens, fewer than one context of {context}",
            data.name,
            stream.len()
        )));
    }
    Ok(out)
}

/// Next-token log-probabilities `[1, T - from, V]` predicting positions `from..T` of `ids`.
fn log_probs(v: &View, gates: &Gates, ids: &[i64], from: i64) -> Result<Tensor, AnalysisError> {
    let m = &v.model;
    let t = ids.len() as i64;
    let x = Tensor::from_slice(ids).view([1, t]).to_device(m.device());
    let mask = Tensor::ones([1, t], (DType::Float, m.device()));
    let states = m.net.encode(&x, &mask, gates, None)?;
    Ok(m.log_probs(&states.narrow(1, from - 1, t - from), DType::Float)?)
}

/// Mean loss of `targets` and KL(`full` || `logp`) over the positions.
fn loss_kl(logp: &Tensor, full: &Tensor, targets: &Tensor) -> (f64, f64) {
    let loss = crate::model::loss::nll(logp, targets).mean(DType::Double).double_value(&[]);
    let kl = (full.exp() * (full - logp))
        .sum_dim_intlist([-1i64].as_slice(), false, DType::Double)
        .mean(DType::Double)
        .double_value(&[]);
    (loss, kl)
}

/// Quality against the cache kept: for each scorer (its per-group scores) and fraction, the
/// view whose lowest-scored key/value groups stream ([`split`]) over `chunks` of the data,
/// next-token loss and KL to the view without streaming on positions `measure_from..`, the
/// induction loss and the passkey. The full model's log-probabilities are computed once per
/// sequence for every scorer, and splits that stream the same groups are measured once.
pub fn curve(
    v: &View,
    scorers: &[Vec<Vec<f64>>],
    chunks: &[Vec<i64>],
    o: &CurveOptions,
    stop: &dyn Fn() -> bool,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Vec<Vec<CurvePoint>>, AnalysisError> {
    let _g = tch::no_grad_guard();
    let m = &v.model;
    // Every (scorer, fraction) names one of the distinct splits.
    let mut views: Vec<View> = Vec::new();
    let mut keys: Vec<Vec<Vec<bool>>> = Vec::new();
    let mut which: Vec<Vec<usize>> = Vec::new();
    for groups in scorers {
        let mut row = Vec::new();
        for &f in &o.fractions {
            let w = split(v, groups, f, o.sink, o.recent, o.regime, "kv_curve")?;
            let key = w.streaming.as_ref().map(|s| s.heads.clone()).unwrap_or_default();
            let at = match keys.iter().position(|k| *k == key) {
                Some(at) => at,
                None => {
                    keys.push(key);
                    views.push(w);
                    views.len() - 1
                }
            };
            row.push(at);
        }
        which.push(row);
    }
    let gates: Vec<Gates> = views.iter().map(View::gates).collect::<Result<_, _>>()?;
    let base = v.gates()?;
    let mut acc = vec![(0.0, 0.0, 0.0); views.len()];
    let repeated: Vec<Vec<i64>> = if o.induction > 0 {
        let half = (o.context / 2) as usize;
        probes(m, &ProbeOptions { seed: o.seed, n: o.induction, len: half, needle: 1, haystack: 0 }, "kv_curve")?
            .repeated
    } else {
        vec![]
    };
    let keys_seq = if o.passkey > 0 {
        passkeys_in(m, ("kv_curve", "passkey"), chunks, o.passkey, o.needle, o.context, o.seed)?
    } else {
        vec![]
    };
    let mut pass = vec![0.0; views.len()];
    let total = chunks.len() + repeated.len() + keys_seq.len();
    for (i, ids) in chunks.iter().enumerate() {
        if stop() {
            return Err(ModelError::Interrupted.into());
        }
        let full = log_probs(v, &base, ids, o.measure_from)?;
        let targets = Tensor::from_slice(&ids[o.measure_from as usize..]).view([1, -1]).to_device(m.device());
        for ((a, w), g) in acc.iter_mut().zip(&views).zip(&gates) {
            let (l, k) = loss_kl(&log_probs(w, g, ids, o.measure_from)?, &full, &targets);
            a.0 += l / chunks.len() as f64;
            a.1 += k / chunks.len() as f64;
        }
        progress(i + 1, total);
    }
    for (i, ids) in repeated.iter().enumerate() {
        if stop() {
            return Err(ModelError::Interrupted.into());
        }
        let half = ids.len() as i64 / 2;
        let targets = Tensor::from_slice(&ids[half as usize..]).view([1, -1]).to_device(m.device());
        for ((a, w), g) in acc.iter_mut().zip(&views).zip(&gates) {
            let logp = log_probs(w, g, ids, half)?;
            a.2 +=
                crate::model::loss::nll(&logp, &targets).mean(DType::Double).double_value(&[]) / repeated.len() as f64;
        }
        progress(chunks.len() + i + 1, total);
    }
    for (i, (seq, _)) in keys_seq.iter().enumerate() {
        if stop() {
            return Err(ModelError::Interrupted.into());
        }
        for ((p, w), g) in pass.iter_mut().zip(&views).zip(&gates) {
            *p += passkey_accuracy(w, g, seq, o.needle)? / keys_seq.len() as f64;
        }
        progress(chunks.len() + repeated.len() + i + 1, total);
    }
    Ok(which
        .iter()
        .map(|row| {
            row.iter()
                .zip(&o.fractions)
                .map(|(&at, &fraction)| {
                    let (loss, kl, ind) = acc[at];
                    let w = &views[at];
                    CurvePoint {
                        fraction,
                        cost: kv_cost(w, o.context, None),
                        footprint: kv_footprint(w, o.measure_from, o.context - o.measure_from, o.chunk),
                        loss,
                        kl,
                        induction_loss: if repeated.is_empty() { f64::NAN } else { ind },
                        passkey: if keys_seq.is_empty() { f64::NAN } else { pass[at] },
                    }
                })
                .collect()
        })
        .collect())
}
