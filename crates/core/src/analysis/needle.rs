//! Needle in a haystack (docs/methods.md#needle-test): a passkey of random tokens placed at a
//! chosen depth of a haystack of a chosen length and repeated at its end, and the fraction of
//! its tokens a view copies there (teacher forced, argmax). The haystack is the data's text, or
//! random tokens without data; every sequence comes from the seed.

use super::streaming::{passkey_accuracy, passkey_room, passkeys};
use super::AnalysisError;
use crate::data::Dataset;
use crate::model::view::View;
use crate::model::{Model, ModelError};

/// What `needle_test` measures.
#[derive(Debug, Clone)]
pub struct NeedleOptions {
    /// Sequence lengths in tokens (haystack, needle, needle again).
    pub contexts: Vec<i64>,
    /// Where the needle starts, as a fraction of the haystack before it (0: first, 1: last).
    pub depths: Vec<f64>,
    /// Sequences per (context, depth): each its own needle and stretch of haystack.
    pub n: usize,
    /// The needle's length in tokens.
    pub needle: usize,
    pub seed: u64,
}

/// One (context, depth): the mean fraction of needle tokens after the first copied.
#[derive(Debug, Clone, PartialEq)]
pub struct NeedleRow {
    pub context: i64,
    pub depth: f64,
    pub accuracy: f64,
    pub sequences: usize,
}

/// The `o.n` sequences of `context` tokens with the needle at `depth`, and where it starts:
/// sequence `k` is `hay[:a] needle_k hay[a:] needle_k`, `a = round(depth x |hay|)`, its
/// haystack the `k`-th stretch of the data's tokens (one text after another, wrapping round),
/// or the random haystack of the retrieval probe's `k`-th sequence without data.
pub fn needle_sequences(
    model: &Model,
    data: Option<&Dataset>,
    context: i64,
    depth: f64,
    o: &NeedleOptions,
) -> Result<Vec<(Vec<i64>, usize)>, AnalysisError> {
    let f = "needle_test";
    if !(0.0..=1.0).contains(&depth) {
        return Err(AnalysisError::Input(format!("{f}: depths must lie in [0, 1], got {depth}")));
    }
    let hay = passkey_room(f, o.needle, context)?;
    let probes = passkeys(model, (f, "n"), o.n, o.needle, context, o.seed)?;
    let stream: Vec<i64> = match data {
        Some(d) => {
            let mut s = Vec::new();
            for t in d.texts() {
                s.extend(model.tokenize(t)?.ids);
            }
            if s.len() < hay {
                return Err(AnalysisError::Input(format!(
                    "{f}: option 'data': {} has {} tokens, fewer than the haystack of {hay} a context of {context} needs",
                    d.name,
                    s.len()
                )));
            }
            s
        }
        None => vec![],
    };
    let at = ((depth * hay as f64).round() as usize).min(hay);
    Ok(probes
        .into_iter()
        .enumerate()
        .map(|(k, (seq, first))| {
            let key = &seq[seq.len() - o.needle..];
            let haystack: Vec<i64> = if stream.is_empty() {
                seq[..first].iter().chain(&seq[first + o.needle..seq.len() - o.needle]).copied().collect()
            } else {
                let start = (k * hay) % (stream.len() - hay + 1);
                stream[start..start + hay].to_vec()
            };
            let s: Vec<i64> = haystack[..at].iter().chain(key).chain(&haystack[at..]).chain(key).copied().collect();
            (s, at)
        })
        .collect())
}

/// Every (context, depth) of `o` on `v` (its masks, gates and streaming heads applied).
pub fn needle_test(
    v: &View,
    data: Option<&Dataset>,
    o: &NeedleOptions,
    stop: &dyn Fn() -> bool,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Vec<NeedleRow>, AnalysisError> {
    let _g = tch::no_grad_guard();
    if o.needle < 2 {
        return Err(AnalysisError::Input(format!("needle_test: needle must be 2 or more tokens, got {}", o.needle)));
    }
    let gates = v.gates()?;
    let total = o.contexts.len() * o.depths.len() * o.n;
    let (mut rows, mut done) = (Vec::new(), 0);
    for &context in &o.contexts {
        for &depth in &o.depths {
            let seqs = needle_sequences(&v.model, data, context, depth, o)?;
            let mut sum = 0.0;
            for (seq, _) in &seqs {
                if stop() {
                    return Err(ModelError::Interrupted.into());
                }
                sum += passkey_accuracy(v, &gates, seq, o.needle)?;
                done += 1;
                progress(done, total);
            }
            rows.push(NeedleRow { context, depth, accuracy: sum / seqs.len().max(1) as f64, sequences: seqs.len() });
        }
    }
    Ok(rows)
}
