//! Head analyses (Voita et al. 2019; docs/methods.md): confidence, positional, rare-word and syntactic
//! heads, computed together in one streaming pass per attention kind. Numeric core: no Rhai,
//! no printing; progress and interruption go through callbacks.

pub mod ablation;
pub mod accum;
pub mod attnlrp;
pub mod diversity;
pub mod experts;
pub mod importance;
pub mod lrp;
pub mod needle;
pub mod options;
pub mod patching;
pub mod result;
pub mod streaming;
pub mod taxonomy;

use crate::data::Dataset;
use crate::model::hooks::{At, Point, Record, Tile, Tiles};
use crate::model::nn::Gates;
use crate::model::tokenize::tokenizer::Encoded;
use crate::model::transformer::Stop;
use crate::model::{HeadId, Kind, Model, ModelError};
use accum::{Accumulator, BatchTensors, SentenceMeta, Words};
use options::{relation_of, ExcludeKeys, FreqSource, Options, Stat};
use result::{Analysis, KindResult, PosHead, Rare, RelDir};
use std::collections::{HashMap, HashSet};
use tch::Tensor;

#[derive(Debug, thiserror::Error)]
pub enum AnalysisError {
    #[error("{0}")]
    Model(#[from] ModelError),
    #[error("{0}")]
    Input(String),
}

impl From<tch::TchError> for AnalysisError {
    fn from(e: tch::TchError) -> Self {
        AnalysisError::Model(e.into())
    }
}

fn input<T>(msg: impl Into<String>) -> Result<T, AnalysisError> {
    Err(AnalysisError::Input(msg.into()))
}

/// Token frequencies under the model's tokenizer, and the `top_n` most frequent ids.
pub struct FreqTable {
    pub counts: HashMap<i64, u64>,
    pub top: HashSet<i64>,
    pub source: String,
}

impl FreqTable {
    pub fn count(&self, id: i64) -> u64 {
        self.counts.get(&id).copied().unwrap_or(0)
    }
}

pub fn freq_table(model: &Model, source: &FreqSource, top_n: usize) -> Result<FreqTable, AnalysisError> {
    let mut counts: HashMap<i64, u64> = HashMap::new();
    let (path, label) = match source {
        FreqSource::Text(p) => (p, format!("text {}", p.display())),
        FreqSource::Counts(p) => (p, format!("counts {}", p.display())),
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| AnalysisError::Input(format!("frequency source {}: {e}", path.display())))?;
    match source {
        FreqSource::Text(_) => {
            let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
            model.tok.count_ids(&lines, &mut counts)?;
        }
        FreqSource::Counts(_) => {
            for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
                let bad = || AnalysisError::Input(format!("{}:{}: expected token<TAB>count", path.display(), n + 1));
                let (tok, c) = line.rsplit_once('\t').ok_or_else(bad)?;
                let c: u64 = c.trim().parse().map_err(|_| bad())?;
                let id = model.tok.token_to_id(tok).ok_or_else(|| {
                    AnalysisError::Input(format!(
                        "{}:{}: '{tok}' is not a token of the model's vocabulary",
                        path.display(),
                        n + 1
                    ))
                })?;
                *counts.entry(id).or_default() += c;
            }
        }
    }
    if counts.is_empty() {
        return input(format!("frequency source {} has no tokens", path.display()));
    }
    let mut by: Vec<(i64, u64)> = counts.iter().map(|(k, v)| (*k, *v)).collect();
    by.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let top = by.iter().take(top_n).map(|(k, _)| *k).collect();
    Ok(FreqTable { counts, top, source: label })
}

/// Real queries and allowed keys of a tokenized sentence.
fn sides(e: &Encoded, exclude: ExcludeKeys, eos_ids: &[i64]) -> (Vec<bool>, Vec<bool>) {
    let real: Vec<bool> = e.special.iter().map(|s| !s).collect();
    let keys = e.ids.iter().zip(&e.special).map(|(&id, &sp)| !exclude.excludes(id, sp, eos_ids)).collect();
    (real, keys)
}

/// Rarest and second-rarest real tokens (ties to the first), if the rarest is not frequent.
fn rarest(e: &Encoded, freq: &FreqTable) -> Option<(usize, usize)> {
    let mut real: Vec<usize> = (0..e.ids.len()).filter(|&i| !e.special[i]).collect();
    if real.is_empty() {
        return None;
    }
    real.sort_by_key(|&i| (freq.count(e.ids[i]), i));
    let r1 = real[0];
    if freq.top.contains(&e.ids[r1]) {
        return None;
    }
    Some((r1, *real.get(1).unwrap_or(&r1)))
}

/// Aligns treebank words with model tokens by character offsets; errors name the sentence
/// and the word that no token covers.
fn align(
    e: &Encoded,
    tree: &crate::data::conllu::Sentence,
    index: usize,
    reldirs: &HashMap<String, usize>,
    subtypes: bool,
) -> Result<Words, AnalysisError> {
    let spans = tree.word_spans();
    let words: Vec<&crate::data::conllu::Word> = tree.words().collect();
    let name = tree.sent_id().map(|s| format!("sentence {index} ({s})")).unwrap_or_else(|| format!("sentence {index}"));
    let mut words_of_token = vec![Vec::new(); e.ids.len()];
    for (t, &(a, b)) in e.offsets.iter().enumerate() {
        if e.special[t] || a >= b {
            continue;
        }
        for (w, span) in spans.iter().enumerate() {
            if let Some((ws, we)) = span {
                if b.min(*we) > a.max(*ws) {
                    words_of_token[t].push(w);
                }
            }
        }
    }
    for (w, span) in spans.iter().enumerate() {
        if span.is_none() {
            return input(format!("{name}: word {} '{}' is not found in the sentence text", w + 1, words[w].form));
        }
        if !words_of_token.iter().any(|ws| ws.contains(&w)) {
            return input(format!(
                "{name}: word {} '{}' cannot be aligned: no model token covers it",
                w + 1,
                words[w].form
            ));
        }
    }
    let mut edges = Vec::new();
    for w in &words {
        let Some(h) = w.head.filter(|&h| h > 0) else { continue };
        if let Some(&r) = reldirs.get(&relation_of(&w.deprel, subtypes)) {
            edges.push((2 * r, h - 1, w.id - 1)); // governor -> dependent: query g, target d
            edges.push((2 * r + 1, w.id - 1, h - 1)); // dependent -> governor
        }
    }
    Ok(Words { words_of_token, n_words: words.len(), edges })
}

/// The bytes one score tile of an analysis may take when its height is not given: a tile of
/// `n` query rows holds `B x H x n x Tk` float32 weights (docs/methods.md#score-tiles). Under
/// the allocator's 16 MiB mmap threshold (`bound_peak_memory` in the binary), so a tile's
/// scores and weights reuse heap blocks instead of being mapped and faulted in afresh for every
/// tile (SmolLM2, 8k tokens, 2 cores: 36 s at 15 MiB, 54 s at 32 MiB; benches/long_context.sh).
pub const TILE_BYTES: i64 = 15 << 20;

thread_local! {
    static TILE_BYTES_NOW: std::cell::Cell<i64> = const { std::cell::Cell::new(TILE_BYTES) };
}

/// Sets the bytes of one score tile for this thread's analyses (`0` restores [`TILE_BYTES`]):
/// smaller tiles hold less, larger ones make fewer, larger products. The numbers are the same.
pub fn set_tile_bytes(bytes: i64) {
    TILE_BYTES_NOW.with(|c| c.set(if bytes > 0 { bytes } else { TILE_BYTES }));
}

/// Query rows per score tile: `asked` when given, else as many as fit in the tile bytes
/// ([`set_tile_bytes`], default [`TILE_BYTES`]) for a batch of `b` rows, `h` heads and `tk`
/// keys, from 1 to [`TILE_ROWS_MAX`].
pub fn tile_height(asked: usize, b: i64, h: usize, tk: usize) -> i64 {
    if asked > 0 {
        return asked as i64;
    }
    let row = (b.max(1) * (h as i64).max(1) * (tk as i64).max(1) * 4).max(1);
    (TILE_BYTES_NOW.with(|c| c.get()) / row).clamp(1, TILE_ROWS_MAX)
}

/// The score-tile reader of `model`'s stack for a batch of `b` rows of `t` tokens
/// (docs/methods.md#score-tiles): each layer read whole where its mixer hands no tiles, else in
/// tiles of [`tile_height`]`(asked, ..)` rows; `on` gets each tile.
pub(crate) fn stack_tiles<'a>(
    model: &Model,
    asked: usize,
    b: i64,
    t: usize,
    on: &'a mut dyn FnMut(At, &Tile) -> Result<(), ModelError>,
) -> Tiles<'a> {
    let kind = model.net.stack_kind;
    Tiles {
        kind,
        whole: model.net.stack.iter().map(|l| !l.mixer().hands_tiles()).collect(),
        rows: model.layer_heads(kind).iter().map(|&h| tile_height(asked, b, h, t)).collect(),
        on,
    }
}

/// The most query rows of a tile whose height is not given: taller tiles' products leave the
/// caches (SmolLM2 at 2k tokens, 2 cores: 5.6 s at 128 rows, 8.9 s at 459, 16 s at 2029).
pub const TILE_ROWS_MAX: i64 = 128;

/// Runs the analyses of `opts` over `data`. `freq` is needed for the rare-word statistic.
#[allow(clippy::too_many_arguments)]
pub fn analyze(
    model: &Model,
    data: &Dataset,
    opts: &Options,
    freq: Option<&FreqTable>,
    gates: &Gates,
    stop: &dyn Fn() -> bool,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Analysis, AnalysisError> {
    let (frame, acc) = accumulate(model, data, 0..data.len(), opts, freq, gates, stop, progress)?;
    finish(&frame, &acc)
}

/// The analyses' additive accumulators over sentences `rows` of `data` (the whole dataset, or
/// a shard: docs/methods.md#shards), with the frame their results are read in. The data is
/// checked as a whole (every relation asked for must occur in it), whatever the rows.
#[allow(clippy::too_many_arguments)]
pub fn accumulate(
    model: &Model,
    data: &Dataset,
    rows: std::ops::Range<usize>,
    opts: &Options,
    freq: Option<&FreqTable>,
    gates: &Gates,
    stop: &dyn Fn() -> bool,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<(Frame, AnalysisAcc), AnalysisError> {
    let t0 = std::time::Instant::now();
    if data.is_empty() {
        return input(format!("the dataset {} is empty", data.name));
    }
    if opts.stats.is_empty() {
        return input("no statistics asked for");
    }
    for k in &opts.kinds {
        model.kind_shape(*k)?;
    }
    let want_syn = opts.wants(Stat::Syntactic);
    let want_rare = opts.wants(Stat::Rare);
    if want_rare && freq.is_none() {
        return input("the rare-word statistic needs a frequency source");
    }
    // Relations: each must occur in the treebank.
    let mut reldirs: HashMap<String, usize> = HashMap::new();
    let mut rel_names: Vec<String> = Vec::new();
    if want_syn {
        if !data.items.iter().all(|i| i.tree.is_some()) {
            return input(format!(
                "the syntactic statistic needs a treebank: {} has no dependency trees (load it with treebank(path))",
                data.name
            ));
        }
        let mut seen: HashMap<String, usize> = HashMap::new();
        for it in data.items.iter() {
            for w in it.tree.as_ref().map(|t| t.words().collect::<Vec<_>>()).unwrap_or_default() {
                *seen.entry(relation_of(&w.deprel, opts.subtypes)).or_default() += 1;
            }
        }
        for r in &opts.relations {
            if !seen.contains_key(r) {
                let mut known: Vec<&String> = seen.keys().collect();
                known.sort();
                return input(format!(
                    "relation '{r}' does not occur in {} (relations there: {})",
                    data.name,
                    known.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
                ));
            }
            reldirs.insert(r.clone(), rel_names.len());
            rel_names.push(r.clone());
        }
    }
    let n_rd = 2 * rel_names.len();
    let eos_ids: Vec<i64> = model.tok.eos_id.into_iter().collect();
    let device = model.device();
    let _guard = tch::no_grad_guard();

    // Tokenize and describe every sentence of the rows once.
    let first_row = rows.start;
    let data = &data.slice(rows);
    let encoded: Vec<Encoded> = model.tokenize_all(data.texts())?;
    let mut metas = Vec::with_capacity(encoded.len());
    let mut baseline: Vec<HashMap<i64, usize>> = vec![HashMap::new(); n_rd];
    for (i, e) in encoded.iter().enumerate() {
        let (real_query, key_ok) = sides(e, opts.exclude_keys, &eos_ids);
        let rare = if want_rare { freq.and_then(|f| rarest(e, f)) } else { None };
        let words = if want_syn {
            let w = align(
                e,
                data.items[i]
                    .tree
                    .as_ref()
                    .map(|t| t.as_ref())
                    .ok_or_else(|| AnalysisError::Input(format!("sentence {} has no tree", first_row + i)))?,
                first_row + i,
                &reldirs,
                opts.subtypes,
            )?;
            for &(rd, q, t) in &w.edges {
                *baseline[rd].entry(t as i64 - q as i64).or_default() += 1;
            }
            Some(w)
        } else {
            None
        };
        metas.push(SentenceMeta { real_query, key_ok, rare, words });
    }

    let shapes: Vec<_> = opts.kinds.iter().map(|k| model.kind_shape(*k)).collect::<Result<_, _>>()?;
    // The self-attention stack (`enc`, or `dec` of a decoder-only model) reads the sentence itself.
    let stack = model.net.stack_kind;
    let mut accs: HashMap<Kind, Accumulator> = shapes
        .iter()
        .map(|s| (s.kind, Accumulator::new(&model.layer_heads(s.kind), if s.kind == stack { n_rd } else { 0 }, device)))
        .collect();
    // Progress in layers of sentences: a long text's single batch reports each layer of the
    // stack as its last tile is read (an 8k-token pass takes minutes).
    let per = if accs.contains_key(&stack) { model.net.stack.len().max(1) } else { 1 };
    let total = encoded.len() * per;
    let mut done = 0;
    let mut tokens = 0;
    for (group, b) in model.batches(&encoded, opts.batch_tokens) {
        if stop() {
            return Err(ModelError::Interrupted.into());
        }
        let s = b.ids.size()[1] as usize;
        tokens += b.encoded.iter().map(|e| e.ids.len()).sum::<usize>();
        let enc_meta: Vec<SentenceMeta> = group.iter().map(|&i| metas[i].clone()).collect();
        let need_enc_capture = accs.contains_key(&stack);
        let mut enc_out: Option<Tensor> = None;
        if need_enc_capture {
            let bt = BatchTensors::new(&enc_meta, s, s, device, want_rare, want_syn);
            let acc = accs
                .get_mut(&stack)
                .ok_or_else(|| AnalysisError::Input("internal: no accumulator for the self-attention stack".into()))?;
            acc.count_batch(&enc_meta);
            // The pattern tile by tile (docs/methods.md#score-tiles): no layer holds its T x T
            // weights, and the pass stops at the final norm (no logits).
            let sentences = group.len();
            let mut on = |at: At, t: &Tile| {
                acc.update_rows(at.layer, t.q0, t.k0, t.pattern, &bt)?;
                if t.q0 + t.pattern.size().get(2).copied().unwrap_or(0) >= s as i64 && per > 1 {
                    progress(done + (at.layer + 1) * sentences, total);
                }
                Ok(())
            };
            let mut tiles = stack_tiles(model, opts.tile_rows, b.ids.size()[0], s, &mut on);
            enc_out = Some(model.net.encode(&b.ids, &b.mask, gates, Some(&mut tiles))?);
        }
        // The decoder's kinds (`cross`, and `dec` of a translation model with decoder
        // self-attention) read teacher-forced targets.
        let dec_kinds: Vec<Kind> = accs.keys().copied().filter(|&k| k != stack).collect();
        if !dec_kinds.is_empty() {
            let h = match enc_out {
                Some(h) => h,
                None => model.net.encode(&b.ids, &b.mask, gates, None)?,
            };
            // Every decoder layer's patterns are kept until the teacher-forced pass ends: cross
            // attention's `t x s` and the decoder's own `t x t` per head (float32), and a
            // layer's scores and weights beside them while it runs; checked against the memory
            // budget before the targets are made (a greedy translation of a long source is
            // minutes), with the longest target they can have.
            let (bsz, heads, n_dec) = (b.ids.size()[0] as f64, model.net.widths().1, model.net.decoder.len());
            let budget = |t: usize| -> Result<(), AnalysisError> {
                let per_layer = 4.0 * bsz * heads * t as f64 * (s + t) as f64;
                crate::budget::check(
                    &format!("the decoder's attention patterns over {s} source x {t} target tokens ({n_dec} layers)"),
                    per_layer * (dec_kinds.len() * n_dec + 2) as f64,
                )
                .map_err(AnalysisError::Input)
            };
            // Targets: references when the dataset has them, else the model's own greedy output.
            let refs: Option<Vec<&str>> = group.iter().map(|&i| data.items[i].target.as_deref()).collect();
            let targets = match refs {
                Some(r) => {
                    let targets = model.reference_targets(&r)?;
                    budget(targets.iter().map(|e| e.ids.len()).max().unwrap_or(1))?;
                    targets
                }
                None => {
                    let longest = b.encoded.iter().map(|e| model.max_output_len(e.ids.len())).max().unwrap_or(1);
                    budget(longest.max(1) as usize + 1)?;
                    model.greedy_targets(&b, &h, gates)?
                }
            };
            let t = targets.iter().map(|e| e.ids.len()).max().unwrap_or(1);
            let (tgt, _) = model.target_tensors(&targets);
            let n_layers = model.net.decoder.len();
            let mut steps: HashMap<Kind, Vec<Vec<Tensor>>> =
                dec_kinds.iter().map(|&k| (k, (0..n_layers).map(|_| Vec::new()).collect())).collect();
            let mut on = |at: At, p: &Tensor| {
                if let Some(st) = steps.get_mut(&at.kind).and_then(|st| st.get_mut(at.layer)) {
                    st.push(p.shallow_clone());
                }
                Ok(())
            };
            let mut rec = Record::new(&[Point::Pattern], &mut on);
            let _ = model.net.teacher(&h, &b.mask, &tgt, Stop::FinalNorm, gates, Some(&mut rec))?;
            for (kind, steps) in steps {
                let acc = accs
                    .get_mut(&kind)
                    .ok_or_else(|| AnalysisError::Input(format!("internal: no accumulator for {kind}")))?;
                // Queries are the target tokens. `cross` keys: the source's; `dec` keys: the
                // decoder's inputs (the start token, then the targets shifted right), the
                // rarest-token statistic only for `cross` (word frequencies are source-side).
                let meta: Vec<SentenceMeta> = targets
                    .iter()
                    .zip(&enc_meta)
                    .map(|(te, src)| {
                        let real_query: Vec<bool> = te.special.iter().map(|s| !s).collect();
                        if kind == Kind::Cross {
                            SentenceMeta { real_query, key_ok: src.key_ok.clone(), rare: src.rare, words: None }
                        } else {
                            // Keys under `exclude_keys` as for the source; the start token
                            // counts as special.
                            let (_, ok) = sides(te, opts.exclude_keys, &eos_ids);
                            let start_ok = match (opts.exclude_keys, model.net.dec_start) {
                                (ExcludeKeys::Nothing, _) => true,
                                (ExcludeKeys::Eos, Some(id)) => !eos_ids.contains(&id),
                                (ExcludeKeys::Eos, None) => true,
                                (ExcludeKeys::Special, _) => false,
                            };
                            let key_ok = std::iter::once(start_ok).chain(ok).take(real_query.len()).collect();
                            SentenceMeta { real_query, key_ok, rare: None, words: None }
                        }
                    })
                    .collect();
                acc.count_batch(&meta);
                let keys = if kind == Kind::Cross { s } else { t };
                let bt = BatchTensors::new(&meta, t, keys, device, want_rare && kind == Kind::Cross, false);
                // A layer left without heads (prune_heads) hands out no attention.
                for (l, st) in steps.iter().enumerate().filter(|(_, st)| !st.is_empty()) {
                    acc.update(l, &Tensor::cat(st, 2), &bt)?;
                }
            }
        }
        done += group.len() * per;
        progress(done, total);
    }

    // The accumulators, in the original head numbering (0 where prune_heads removed a head:
    // the frame says which heads are present).
    let mut kinds_acc = std::collections::BTreeMap::new();
    for s in &shapes {
        let acc = &accs[&s.kind];
        let spread = |g: Vec<Vec<f64>>| -> Vec<Vec<f64>> {
            g.into_iter().enumerate().map(|(l, row)| model.spread_with(s.kind, l, row, 0.0)).collect()
        };
        let hist = acc
            .offsets()?
            .into_iter()
            .enumerate()
            .map(|(l, rows)| model.spread_with(s.kind, l, rows, vec![0.0; accum::BINS as usize]))
            .collect();
        let (rare1, rare2) = acc.rare_hits()?;
        let syn = acc
            .syntactic_correct()?
            .into_iter()
            .enumerate()
            .map(|(l, rds)| rds.into_iter().map(|row| model.spread_with(s.kind, l, row, 0.0)).collect())
            .collect();
        kinds_acc.insert(
            s.kind.to_string(),
            KindAcc {
                queries: acc.queries as u64,
                rare_queries: acc.rare_queries as u64,
                rare_sentences: acc.rare_sentences as u64,
                edges: acc.edges.iter().map(|&e| e as u64).collect(),
                conf: spread(acc.confidence_sums()?),
                hist,
                rare1: spread(rare1),
                rare2: spread(rare2),
                syn,
            },
        );
    }
    let frame = Frame {
        model: model.name(),
        dataset: data.name.clone(),
        kinds: shapes
            .iter()
            .map(|s| FrameKind {
                kind: s.kind.to_string(),
                n_layers: s.n_layers,
                n_heads: s.n_heads,
                present: (0..s.n_layers).map(|l| model.present(s.kind, l)).collect(),
            })
            .collect(),
        stack: stack.to_string(),
        confidence: opts.wants(Stat::Confidence),
        positional: opts.wants(Stat::Positional),
        rare: want_rare,
        syntactic: want_syn,
        relations: rel_names,
        options: opts.echo(),
        positional_threshold: opts.positional_threshold,
        rare_threshold: opts.rare_threshold,
        margin: opts.margin,
        freq_source: freq.map(|f| f.source.clone()),
    };
    let baseline =
        baseline.into_iter().map(|m| m.into_iter().map(|(o, n)| (o.to_string(), n as u64)).collect()).collect();
    Ok((
        frame,
        AnalysisAcc {
            sentences: encoded.len() as u64,
            tokens: tokens as u64,
            seconds: t0.elapsed().as_secs_f64(),
            baseline,
            kinds: kinds_acc,
        },
    ))
}

/// What an analysis's results are read in besides its accumulators: the model's heads, the
/// options, the relations. Equal in every shard of one analysis (part of its identity).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Frame {
    pub model: String,
    pub dataset: String,
    pub kinds: Vec<FrameKind>,
    /// The self-attention stack's kind (the syntactic statistic's).
    pub stack: String,
    pub confidence: bool,
    pub positional: bool,
    pub rare: bool,
    pub syntactic: bool,
    pub relations: Vec<String>,
    pub options: crate::output::Echo,
    pub positional_threshold: f64,
    pub rare_threshold: f64,
    pub margin: f64,
    pub freq_source: Option<String>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct FrameKind {
    pub kind: String,
    pub n_layers: usize,
    pub n_heads: usize,
    /// Per layer, the heads present (all of them unless prune_heads removed some).
    pub present: Vec<Vec<usize>>,
}

/// An analysis's additive accumulators (docs/methods.md#shards): counts and sums that shards
/// add up; [`finish`] divides them.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct AnalysisAcc {
    pub sentences: u64,
    pub tokens: u64,
    pub seconds: f64,
    /// Per relation-direction, the count of each word offset `target - query` (its keys).
    pub baseline: Vec<std::collections::BTreeMap<String, u64>>,
    pub kinds: std::collections::BTreeMap<String, KindAcc>,
}

/// One kind's accumulators, `[layer][head]` in the original numbering.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct KindAcc {
    pub queries: u64,
    pub rare_queries: u64,
    pub rare_sentences: u64,
    pub edges: Vec<u64>,
    /// Sums of each head's largest allowed weight over real queries.
    pub conf: Vec<Vec<f64>>,
    /// Counts of `argmax - t`, `[layer][head][bin]` (bin `i` is offset `i - MAX_OFFSET`).
    pub hist: Vec<Vec<Vec<f64>>>,
    /// Queries whose argmax is the rarest token / one of the two rarest.
    pub rare1: Vec<Vec<f64>>,
    pub rare2: Vec<Vec<f64>>,
    /// Correct word-level predictions, `[layer][relation-direction][head]`.
    pub syn: Vec<Vec<Vec<f64>>>,
}

crate::accumulate_fields!(AnalysisAcc { sentences, tokens, seconds, baseline, kinds });
crate::accumulate_fields!(KindAcc { queries, rare_queries, rare_sentences, edges, conf, hist, rare1, rare2, syn });

/// The results of an analysis from its frame and accumulators (one process's, or the sum of
/// a complete set of shards'): every statistic is a ratio of them.
pub fn finish(frame: &Frame, acc: &AnalysisAcc) -> Result<Analysis, AnalysisError> {
    let mut kinds = Vec::new();
    for fk in &frame.kinds {
        let kind: Kind = fk.kind.parse().map_err(|e: String| AnalysisError::Input(e))?;
        let a = acc
            .kinds
            .get(&fk.kind)
            .ok_or_else(|| AnalysisError::Input(format!("the accumulators have no '{}' attention", fk.kind)))?;
        let present = |l: usize, h: usize| fk.present.get(l).is_some_and(|p| p.contains(&h));
        // A removed head has no value.
        let grid = |g: &Vec<Vec<f64>>, scale: f64| -> Vec<Vec<f64>> {
            (0..fk.n_layers)
                .map(|l| {
                    (0..fk.n_heads)
                        .map(|h| {
                            if present(l, h) {
                                g.get(l).and_then(|r| r.get(h)).copied().unwrap_or(0.0) / scale
                            } else {
                                f64::NAN
                            }
                        })
                        .collect()
                })
                .collect()
        };
        let mut kr = KindResult {
            kind,
            n_layers: fk.n_layers,
            n_heads: fk.n_heads,
            queries: a.queries as usize,
            confidence: None,
            positional: None,
            rare: None,
            syntactic: None,
        };
        if frame.confidence {
            kr.confidence = Some(grid(&a.conf, a.queries.max(1) as f64));
        }
        if frame.positional {
            kr.positional =
                Some(
                    (0..fk.n_layers)
                        .map(|l| {
                            (0..fk.n_heads)
                                .map(|h| {
                                    let Some(bins) = a.hist.get(l).and_then(|r| r.get(h)).filter(|_| present(l, h))
                                    else {
                                        return PosHead { offset: 0, fraction: f64::NAN };
                                    };
                                    let total: f64 = bins.iter().sum();
                                    let (bin, count) = bins.iter().enumerate().fold(
                                        (accum::MAX_OFFSET as usize, -1.0),
                                        |a, (i, &c)| if c > a.1 { (i, c) } else { a },
                                    );
                                    PosHead {
                                        offset: bin as i64 - accum::MAX_OFFSET,
                                        fraction: if total > 0.0 { count / total } else { 0.0 },
                                    }
                                })
                                .collect()
                        })
                        .collect(),
                );
        }
        if frame.rare {
            let n = a.rare_queries.max(1) as f64;
            kr.rare = Some(Rare {
                score: grid(&a.rare1, n),
                two: grid(&a.rare2, n),
                sentences: a.rare_sentences as usize,
                queries: a.rare_queries as usize,
            });
        }
        if frame.syntactic && fk.kind == frame.stack {
            let mut rels = Vec::new();
            for (ri, rel) in frame.relations.iter().enumerate() {
                let (gd, dg) = options::direction_names(rel);
                for (dir, (direction, label)) in [("g->d", gd), ("d->g", dg)].into_iter().enumerate() {
                    let rd = 2 * ri + dir;
                    let edges = a.edges.get(rd).copied().unwrap_or(0) as usize;
                    let counts: Vec<(i64, u64)> = acc
                        .baseline
                        .get(rd)
                        .map(|m| m.iter().filter_map(|(o, n)| Some((o.parse::<i64>().ok()?, *n))).collect())
                        .unwrap_or_default();
                    let (off, n) = counts
                        .iter()
                        .max_by(|a, b| a.1.cmp(&b.1).then(b.0.abs().cmp(&a.0.abs())).then(b.0.cmp(&a.0)))
                        .copied()
                        .unwrap_or((0, 0));
                    let per_head: Vec<Vec<f64>> = (0..fk.n_layers)
                        .map(|l| a.syn.get(l).and_then(|r| r.get(rd)).cloned().unwrap_or_default())
                        .collect();
                    let accuracy = grid(&per_head, edges.max(1) as f64);
                    rels.push(RelDir {
                        relation: rel.clone(),
                        direction: direction.to_string(),
                        label,
                        edges,
                        baseline_offset: off,
                        baseline: n as f64 / edges.max(1) as f64,
                        accuracy,
                    });
                }
            }
            kr.syntactic = Some(rels);
        }
        kinds.push(kr);
    }
    Ok(Analysis {
        model: frame.model.clone(),
        dataset: frame.dataset.clone(),
        sentences: acc.sentences as usize,
        tokens: acc.tokens as usize,
        seconds: acc.seconds,
        options: frame.options.clone(),
        positional_threshold: frame.positional_threshold,
        rare_threshold: frame.rare_threshold,
        margin: frame.margin,
        freq_source: frame.freq_source.clone(),
        kinds,
    })
}

/// Every head of a result's kinds, in order.
pub fn heads_of(k: &KindResult) -> impl Iterator<Item = HeadId> + '_ {
    (0..k.n_layers).flat_map(move |l| (0..k.n_heads).map(move |h| HeadId { kind: k.kind, layer_idx: l, head: h }))
}
