//! The one batching service: text -> tokens (once per dataset) -> length buckets -> padded
//! batches on the model's device, and teacher-forcing targets (references, else the model's
//! own greedy output). Every analysis, sweep, LRP run, pruning run and translation gets its
//! batches here; sentences of similar length go together, so padding is small.

use super::tokenize::tokenizer::Encoded;
use super::{nn::Gates, Batch, Model, ModelError};
use tch::Tensor;

/// Sentences are bucketed within windows of this many, in corpus order: a long dataset is a
/// series of windows like a short one, so peak memory does not grow with its size.
pub const WINDOW: usize = 1024;

/// Padded tokens per batch of a forward pass or an analysis, unless the user says otherwise.
/// On CPU, batches of 512-2048 tokens run fastest (larger ones fall out of cache and, on short
/// datasets, pad more); benches/analysis.sh measured 1024 against 4096: 2.24 s vs 2.69 s for
/// the analysis pass over the 1000 PUD sentences.
pub const DEFAULT_BATCH_TOKENS: usize = 1024;

/// Groups of indices, each of at most `max_tokens` padded tokens (at least one sentence per
/// group), sentences sorted by length within windows of [`WINDOW`] so each group's padding is
/// small. Callers scatter results back by index.
pub fn by_length(lengths: &[usize], max_tokens: usize) -> Vec<Vec<usize>> {
    let mut groups = Vec::new();
    for start in (0..lengths.len()).step_by(WINDOW) {
        let end = (start + WINDOW).min(lengths.len());
        groups.extend(window(lengths, start..end, max_tokens));
    }
    groups
}

/// What one more batch costs, in padded tokens: every product of a batch repacks its weight
/// matrix (MKL copies it into panels whatever the rows), about 50 ms a forward of SmolLM2 on
/// 2 cores, the compute of ~40 of its tokens. Measured on SmolLM2, 20 PUD sentences (516
/// tokens): one batch (940 padded) 1.23 s a forward, cut at cost 32 (4 batches, 571 padded)
/// 1.09 s, at cost 64 (2 batches, 664 padded) 1.02 s, 20 batches without padding 1.94 s.
pub const BATCH_COST: usize = 64;

/// The sentences of `range` sorted by length and cut into runs that minimise the padded tokens
/// plus [`BATCH_COST`] per batch, each run within `max_tokens` (a sentence longer than the
/// budget is alone): one batch of twenty sentences of 10 to 47 tokens pads to 940 tokens for
/// 516 real ones; cut in two, to 664.
fn window(lengths: &[usize], range: std::ops::Range<usize>, max_tokens: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = range.collect();
    order.sort_by_key(|&i| (lengths[i], i));
    let n = order.len();
    let cost = BATCH_COST;
    // best[j]: the least cost of the first j sentences; cut[j]: where the last run starts.
    let mut best = vec![usize::MAX; n + 1];
    let mut cut = vec![0usize; n + 1];
    best[0] = 0;
    for j in 1..=n {
        let longest = lengths[order[j - 1]]; // sorted ascending: the run's last is its longest
        for i in (0..j).rev() {
            let rows = j - i;
            if rows > 1 && rows * longest > max_tokens {
                break;
            }
            let c = best[i].saturating_add(rows * longest + cost);
            if c < best[j] {
                best[j] = c;
                cut[j] = i;
            }
        }
    }
    let mut groups = Vec::new();
    let mut j = n;
    while j > 0 {
        groups.push(order[cut[j]..j].to_vec());
        j = cut[j];
    }
    groups.reverse();
    groups
}

/// Real tokens a packed row holds (docs/methods.md#packing), unless its longest sentence is
/// longer: rows of a few hundred tokens keep the attention over a row (every query against the
/// row's keys, other sentences' masked) a few percent of a layer's products.
pub const PACK_ROW_TOKENS: usize = 256;

/// Batches of packed rows (docs/methods.md#packing): each batch its rows, each row the
/// sentences (indices) it holds, in windows of [`WINDOW`] sentences, longest first, at most
/// `max_tokens` real tokens per batch (a longer sentence alone). Every sentence is in one row.
pub fn packed(lengths: &[usize], max_tokens: usize) -> Vec<Vec<Vec<usize>>> {
    let max_tokens = max_tokens.max(1);
    let mut batches = Vec::new();
    for start in (0..lengths.len()).step_by(WINDOW) {
        let end = (start + WINDOW).min(lengths.len());
        let mut order: Vec<usize> = (start..end).collect();
        order.sort_by_key(|&i| (std::cmp::Reverse(lengths[i]), i));
        let (mut batch, mut total) = (Vec::new(), 0);
        for i in order {
            if !batch.is_empty() && total + lengths[i] > max_tokens {
                batches.push(rows_of(lengths, std::mem::take(&mut batch)));
                total = 0;
            }
            batch.push(i);
            total += lengths[i];
        }
        if !batch.is_empty() {
            batches.push(rows_of(lengths, batch));
        }
    }
    batches
}

/// A batch's sentences (longest first) dealt into rows: as many rows as [`PACK_ROW_TOKENS`]
/// (or the longest sentence, if longer) divides their tokens into, each sentence into the row
/// with the fewest tokens so far (rows end within one sentence of each other).
fn rows_of(lengths: &[usize], sentences: Vec<usize>) -> Vec<Vec<usize>> {
    let total: usize = sentences.iter().map(|&i| lengths[i]).sum();
    let longest = sentences.iter().map(|&i| lengths[i]).max().unwrap_or(0);
    let k = total.div_ceil(PACK_ROW_TOKENS.max(longest).max(1)).max(1);
    let mut rows: Vec<(usize, Vec<usize>)> = vec![(0, Vec::new()); k];
    for i in sentences {
        if let Some(r) = rows.iter_mut().min_by_key(|r| r.0) {
            r.0 += lengths[i];
            r.1.push(i);
        }
    }
    rows.into_iter().map(|r| r.1).filter(|r| !r.is_empty()).collect()
}

/// One batch of a prepared dataset.
pub struct PBatch {
    /// The sentences in it (indices into the dataset); in a packed batch, row after row.
    pub rows: Vec<usize>,
    /// Whether its rows hold several sentences each (docs/methods.md#packing): `mask` then
    /// numbers each row's sentences 1, 2, ... (0: padding), and a row is not a sentence.
    pub packed: bool,
    pub ids: Tensor,
    pub mask: Tensor,
    /// Teacher-forced targets `[B, T]` (pad-filled) and their mask, when asked for.
    pub targets: Option<(Tensor, Tensor)>,
}

/// A dataset tokenized, bucketed and given teacher-forcing targets once, for everything that
/// runs it many times (the ablation metrics and sweeps, LRP through a decoder, pruning).
pub struct Prepared {
    pub batches: Vec<PBatch>,
    /// Target texts: the references, else the full model's greedy outputs (for BLEU).
    pub refs: Vec<String>,
    pub n_sentences: usize,
    /// Where the targets come from: "references", "teacher" or "next tokens" (a language model).
    pub targets_from: &'static str,
}

impl Model {
    /// Tokenizes `texts`, buckets them by length and, when `with_targets`, gives each batch
    /// its teacher-forcing targets: `references` when given, else the unmasked model's own
    /// greedy output under `gates` (the model as given). Needs no gradient.
    pub fn prepare(
        &self,
        texts: &[&str],
        references: Option<&[&str]>,
        with_targets: bool,
        batch_tokens: usize,
        gates: &Gates,
    ) -> Result<Prepared, ModelError> {
        self.prepare_with(texts, references, with_targets, batch_tokens, gates, false)
    }

    /// [`Model::prepare`] for computations that read tokens, not rows (the task loss, the
    /// ablation metrics loss and KL): a language model's sentences packed several to a row
    /// (docs/methods.md#packing) where the model and `gates` allow it
    /// ([`super::transformer::Transformer::packs`]), else as `prepare` batches them.
    pub fn prepare_packed(
        &self,
        texts: &[&str],
        with_targets: bool,
        batch_tokens: usize,
        gates: &Gates,
    ) -> Result<Prepared, ModelError> {
        self.prepare_with(texts, None, with_targets, batch_tokens, gates, true)
    }

    fn prepare_with(
        &self,
        texts: &[&str],
        references: Option<&[&str]>,
        with_targets: bool,
        batch_tokens: usize,
        gates: &Gates,
        pack: bool,
    ) -> Result<Prepared, ModelError> {
        let _g = tch::no_grad_guard();
        let encoded = self.tokenize_all(texts.iter().copied())?;
        let mut refs = vec![String::new(); texts.len()];
        let mut batches = Vec::new();
        if pack && self.is_lm() && self.net.packs(gates) {
            for (rows, b) in self.packed_batches(&encoded, batch_tokens) {
                let targets = if with_targets { Some(next_token_targets(&b.ids, &b.mask)?) } else { None };
                batches.push(PBatch { rows, packed: true, ids: b.ids, mask: b.mask, targets });
            }
            return Ok(Prepared { batches, refs, n_sentences: texts.len(), targets_from: "next tokens" });
        }
        for (rows, b) in self.batches(&encoded, batch_tokens) {
            let targets = if !with_targets {
                None
            } else if self.is_lm() {
                Some(next_token_targets(&b.ids, &b.mask)?)
            } else {
                let tgt = match references {
                    Some(all) => {
                        let r: Vec<&str> = rows.iter().map(|&i| all[i]).collect();
                        for (&i, t) in rows.iter().zip(&r) {
                            refs[i] = t.to_string();
                        }
                        self.reference_targets(&r)?
                    }
                    None => {
                        let enc = self.net.encode(&b.ids, &b.mask, gates, None)?;
                        let tgt = self.greedy_targets(&b, &enc, gates)?;
                        for (&i, o) in rows.iter().zip(&tgt) {
                            refs[i] = self.detokenize(&o.ids[..o.ids.len() - 1])?;
                        }
                        tgt
                    }
                };
                Some(self.target_tensors(&tgt))
            };
            batches.push(PBatch { rows, packed: false, ids: b.ids, mask: b.mask, targets });
        }
        let targets_from = if self.is_lm() {
            "next tokens"
        } else if references.is_some() {
            "references"
        } else {
            "teacher"
        };
        Ok(Prepared { batches, refs, n_sentences: texts.len(), targets_from })
    }

    /// Tokenizes every sentence once. An empty (or blank) sentence is refused, naming it:
    /// there is nothing to run the model on.
    pub fn tokenize_all<'a>(&self, texts: impl IntoIterator<Item = &'a str>) -> Result<Vec<Encoded>, ModelError> {
        let texts: Vec<&str> = texts.into_iter().collect();
        let one = texts.len() == 1;
        texts
            .iter()
            .enumerate()
            .map(|(i, t)| {
                if t.trim().is_empty() {
                    let what = if one { "the text is empty".to_string() } else { format!("sentence {i} is empty") };
                    return Err(ModelError::Invalid(format!("{what}: there is nothing to run the model on")));
                }
                self.tok.encode(t)
            })
            .collect()
    }

    /// The length-bucketed batches of tokenized sentences (see [`by_length`]): each comes with
    /// its rows (indices into `encoded`), on the model's device.
    pub fn batches<'a>(
        &'a self,
        encoded: &'a [Encoded],
        max_tokens: usize,
    ) -> impl Iterator<Item = (Vec<usize>, Batch)> + 'a {
        let lengths: Vec<usize> = encoded.iter().map(|e| e.ids.len()).collect();
        by_length(&lengths, max_tokens.max(1)).into_iter().map(move |rows| {
            let b = self.batch_encoded(rows.iter().map(|&i| encoded[i].clone()).collect());
            (rows, b)
        })
    }

    /// Batches of packed rows (see [`packed`]; docs/methods.md#packing), on the model's
    /// device: each with its sentences (indices into `encoded`, row after row), `ids [R, T]`
    /// and a mask numbering each row's sentences 1, 2, ... (0: padding); `encoded` holds the
    /// sentences in the same order.
    pub fn packed_batches<'a>(
        &'a self,
        encoded: &'a [Encoded],
        max_tokens: usize,
    ) -> impl Iterator<Item = (Vec<usize>, Batch)> + 'a {
        let lengths: Vec<usize> = encoded.iter().map(|e| e.ids.len()).collect();
        packed(&lengths, max_tokens).into_iter().map(move |rows| {
            let t = rows.iter().map(|r| r.iter().map(|&i| encoded[i].ids.len()).sum::<usize>()).max().unwrap_or(0);
            let (mut ids, mut mask) = (Vec::with_capacity(rows.len() * t), Vec::with_capacity(rows.len() * t));
            for row in &rows {
                let mut used = 0;
                for (seg, &i) in row.iter().enumerate() {
                    let n = encoded[i].ids.len();
                    ids.extend_from_slice(&encoded[i].ids);
                    mask.extend(std::iter::repeat_n((seg + 1) as f32, n));
                    used += n;
                }
                ids.extend(std::iter::repeat_n(self.tok.pad_id, t - used));
                mask.extend(std::iter::repeat_n(0f32, t - used));
            }
            let (r, t) = (rows.len() as i64, t as i64);
            let flat: Vec<usize> = rows.into_iter().flatten().collect();
            let b = Batch {
                ids: Tensor::from_slice(&ids).view([r, t]).to_device(self.device()),
                mask: Tensor::from_slice(&mask).view([r, t]).to_device(self.device()),
                encoded: flat.iter().map(|&i| encoded[i].clone()).collect(),
            };
            (flat, b)
        })
    }

    /// Teacher-forcing targets from references (one per row of a batch), tokenized as the
    /// model's targets.
    /// A model that forces a target-language token first (`forced_bos`) gets it in front of
    /// the reference's pieces (the tokenizer's source-language framing left out), then EOS, as
    /// its greedy targets are framed.
    pub fn reference_targets(&self, references: &[&str]) -> Result<Vec<Encoded>, ModelError> {
        references
            .iter()
            .map(|r| {
                let e = self.tok.encode_target(r)?;
                let Some(forced) = self.net.forced_bos.get() else { return Ok(e) };
                let mut out = Encoded {
                    ids: vec![forced],
                    tokens: vec![self.tok.id_to_token(forced)],
                    offsets: vec![(0, 0)],
                    special: vec![true],
                };
                for i in (0..e.ids.len()).filter(|&i| !e.special[i]) {
                    out.ids.push(e.ids[i]);
                    out.tokens.push(e.tokens[i].clone());
                    out.offsets.push(e.offsets[i]);
                    out.special.push(false);
                }
                out.ids.push(self.net.eos_id);
                out.tokens.push(self.tok.id_to_token(self.net.eos_id));
                out.offsets.push((0, 0));
                out.special.push(true);
                Ok(out)
            })
            .collect()
    }

    /// The most tokens greedy decoding emits for a source of `src_tokens` tokens: 2.5 x + 2,
    /// and no more than the decoder's positions allow (the targets add EOS after them).
    pub fn max_output_len(&self, src_tokens: usize) -> i64 {
        let cap = match &self.net.dec_embeddings().positions {
            super::transformer::Positions::Learned(t) => t.size()[0] - 1,
            _ => i64::MAX,
        };
        ((2.5 * src_tokens as f64) as i64 + 2).min(cap)
    }

    /// Teacher-forcing targets when there are no references: the model's own greedy output
    /// under `gates` (at most 2.5 x the source length + 2 tokens, and what the decoder's
    /// positions allow), ending in EOS. `enc` is the
    /// batch's encoder output.
    pub fn greedy_targets(&self, batch: &Batch, enc: &Tensor, gates: &Gates) -> Result<Vec<Encoded>, ModelError> {
        let max_len: Vec<i64> = batch.encoded.iter().map(|e| self.max_output_len(e.ids.len())).collect();
        let outs = self.net.greedy(enc, &batch.mask, &max_len, gates)?;
        Ok(outs
            .into_iter()
            .map(|mut ids| {
                ids.push(self.net.eos_id);
                let n = ids.len();
                let mut special = vec![false; n];
                special[n - 1] = true;
                // The forced target-language token is framing, as EOS is.
                if self.net.forced_bos.get().is_some() && self.net.forced_bos.get() == ids.first().copied() {
                    special[0] = true;
                }
                Encoded { tokens: self.tok.ids_to_tokens(&ids), offsets: vec![(0, 0); n], special, ids }
            })
            .collect())
    }

    /// `[B, len]` float mask, 1 on the real (not special, not padding) tokens of `encoded`.
    pub fn real_mask(&self, encoded: &[Encoded], len: i64) -> Tensor {
        let real: Vec<f32> = encoded
            .iter()
            .flat_map(|e| {
                e.special.iter().map(|&sp| if sp { 0.0 } else { 1.0 }).chain(std::iter::repeat(0.0)).take(len as usize)
            })
            .collect();
        Tensor::from_slice(&real).view([encoded.len() as i64, len]).to_device(self.device())
    }

    /// Targets as padded `[B, T]` ids and a `[B, T]` float mask (1 on real target tokens), on
    /// the model's device; `T` is at least 1.
    pub fn target_tensors(&self, targets: &[Encoded]) -> (Tensor, Tensor) {
        let t = targets.iter().map(|e| e.ids.len()).max().unwrap_or(1).max(1);
        let ids: Vec<i64> = targets
            .iter()
            .flat_map(|e| e.ids.iter().copied().chain(std::iter::repeat(self.tok.pad_id)).take(t))
            .collect();
        let m: Vec<f32> = targets
            .iter()
            .flat_map(|e| std::iter::repeat_n(1f32, e.ids.len()).chain(std::iter::repeat(0f32)).take(t))
            .collect();
        let n = targets.len() as i64;
        (
            Tensor::from_slice(&ids).view([n, t as i64]).to_device(self.device()),
            Tensor::from_slice(&m).view([n, t as i64]).to_device(self.device()),
        )
    }
}

/// A language model's targets: each position predicts the next token; `[B, T-1]` ids and their
/// float mask (1 where the next token is real, not padding, and of the same sentence: a packed
/// row's sentence does not predict the next one's first token).
fn next_token_targets(ids: &Tensor, mask: &Tensor) -> Result<(Tensor, Tensor), ModelError> {
    let t = ids.size()[1] - 1;
    let (here, next) = (mask.f_narrow(1, 0, t)?, mask.f_narrow(1, 1, t)?);
    let tm = next.f_gt(0.0)?.f_logical_and(&next.f_eq_tensor(&here)?)?;
    Ok((ids.f_narrow(1, 1, t)?, tm.f_to_kind(tch::Kind::Float)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_rows_hold_every_sentence_once_within_the_budget_and_even() {
        // 300 sentences of 3..60 tokens (a fixed pseudo-random draw) and one of 700.
        let mut lengths: Vec<usize> = (0..300u64).map(|i| 3 + ((i * 2654435761) % 58) as usize).collect();
        lengths.push(700);
        let batches = packed(&lengths, 1024);
        let mut seen: Vec<usize> = batches.iter().flatten().flatten().copied().collect();
        seen.sort();
        assert_eq!(seen, (0..lengths.len()).collect::<Vec<_>>(), "every sentence once");
        let (mut real, mut padded) = (0, 0);
        for b in &batches {
            let loads: Vec<usize> = b.iter().map(|r| r.iter().map(|&i| lengths[i]).sum()).collect();
            let total: usize = loads.iter().sum();
            let longest_sentence = b.iter().flatten().map(|&i| lengths[i]).max().unwrap();
            assert!(b.iter().flatten().count() == 1 || total <= 1024, "batch {b:?} over budget ({total})");
            // Rows end within one sentence of each other (dealt to the least-loaded row).
            let (lo, hi) = (*loads.iter().min().unwrap(), *loads.iter().max().unwrap());
            assert!(hi - lo <= longest_sentence, "rows {loads:?} uneven");
            assert!(hi <= PACK_ROW_TOKENS.max(longest_sentence) * 2, "row of {hi} tokens");
            real += total;
            padded += hi * b.len();
        }
        // The 700-token sentence is alone in its row; padding stays a few percent overall.
        assert!(batches.iter().flatten().any(|r| r == &vec![300]));
        assert!(padded as f64 <= 1.1 * real as f64, "{padded} padded for {real} real tokens");
    }

    #[test]
    fn groups_respect_the_token_budget_and_cover_everything() {
        let lengths = [5, 30, 6, 7, 31, 100, 4];
        let groups = by_length(&lengths, 64);
        let mut seen: Vec<usize> = groups.iter().flatten().copied().collect();
        seen.sort();
        assert_eq!(seen, (0..lengths.len()).collect::<Vec<_>>());
        for g in &groups {
            let longest = g.iter().map(|&i| lengths[i]).max().unwrap();
            assert!(g.len() == 1 || g.len() * longest <= 64, "group {g:?} over budget");
        }
        // The 100-token sentence is alone; the short ones share a batch.
        assert!(groups.iter().any(|g| g == &vec![5]));
        assert!(groups.iter().any(|g| g.len() >= 4));
    }

    /// A long sentence among short ones gets its own batch even when the budget would take
    /// them all (padding the short ones to its length costs more than a batch); equal lengths
    /// share one.
    #[test]
    fn batches_are_cut_where_padding_costs_more_than_a_batch() {
        let mut lengths = vec![5; 10];
        lengths.push(100);
        let groups = by_length(&lengths, 4096);
        assert_eq!(groups.len(), 2, "{groups:?}");
        assert_eq!(groups[1], vec![10]);
        let same = vec![20; 30];
        assert_eq!(by_length(&same, 4096).len(), 1);
        // Every cut is no worse than one batch per budget (the greedy rule it replaced).
        let mixed: Vec<usize> = (0..200).map(|i| 3 + (i * 29) % 70).collect();
        let cost = |g: &Vec<Vec<usize>>| -> usize {
            g.iter().map(|b| b.len() * b.iter().map(|&i| mixed[i]).max().unwrap() + BATCH_COST).sum()
        };
        let mut sorted: Vec<usize> = (0..mixed.len()).collect();
        sorted.sort_by_key(|&i| (mixed[i], i));
        let mut greedy: Vec<Vec<usize>> = vec![vec![]];
        for i in sorted {
            if (greedy.last().unwrap().len() + 1) * mixed[i] > 1024 {
                greedy.push(vec![]);
            }
            greedy.last_mut().unwrap().push(i);
        }
        assert!(cost(&by_length(&mixed, 1024)) <= cost(&greedy));
    }

    #[test]
    fn long_inputs_are_windows_of_short_ones() {
        let lengths: Vec<usize> = (0..3000).map(|i| 5 + (i * 37) % 60).collect();
        let groups = by_length(&lengths, 512);
        // No group mixes sentences of two windows.
        for g in &groups {
            let w = g[0] / WINDOW;
            assert!(g.iter().all(|&i| i / WINDOW == w));
        }
        assert_eq!(groups.iter().map(|g| g.len()).sum::<usize>(), 3000);
    }
}
