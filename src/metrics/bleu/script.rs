//! The script API of BLEU (`bleu`, `tokenize_13a`); the numbers are computed in `super`.

use super::corpus_counts;
use crate::script::convert::{err, opt, quote, OptSpec, ScriptResult};
use rhai::plugin::*;
use rhai::{Array, Dynamic, Engine, Map};

/// The options of the free `bleu(hyps, refs, #{...})` (the method `m.bleu(data, #{...})`
/// translates first and has its own list, `Model.bleu` in the registry).
pub const BLEU_OPTIONS: &[OptSpec] =
    &[opt("shard", "none", "\"I/N\": score slice I of N of the lines and keep BLEU's counts (docs/methods.md#shards)")];

fn lines(v: &Dynamic, what: &str) -> ScriptResult<Vec<String>> {
    if let Some(a) = v.clone().try_cast::<Array>() {
        return a
            .iter()
            .enumerate()
            .map(|(i, s)| {
                if s.is_string() {
                    Ok(s.to_string())
                } else {
                    err(format!("bleu: {what}[{i}] is not a string: {}", quote(s)))
                }
            })
            .collect();
    }
    err(format!("bleu: {what} must be an array of strings, got {}", quote(v)))
}

/// A BLEU score as the script map `bleu` returns.
pub fn bleu_map(b: &super::Bleu) -> Map {
    let mut m = Map::new();
    m.insert("score".into(), Dynamic::from(b.score));
    m.insert("precisions".into(), Dynamic::from(b.precisions.iter().map(|&p| Dynamic::from(p)).collect::<Array>()));
    m.insert("bp".into(), Dynamic::from(b.bp));
    m.insert("sys_len".into(), Dynamic::from(b.sys_len as i64));
    m.insert("ref_len".into(), Dynamic::from(b.ref_len as i64));
    m.insert("text".into(), Dynamic::from(b.to_string()));
    m
}

#[export_module]
pub mod api {
    use super::*;

    /// Corpus BLEU as sacreBLEU computes it by default (13a, exp smoothing): a map with
    /// `score`, `precisions`, `bp`, `sys_len`, `ref_len` and `text` (sacreBLEU's line).
    /// `refs` is one array of references, or an array of reference streams.
    ///
    /// ```rhai
    /// let b = bleu(["The cat sat on the mat."], ["The cat sat on the mat."]);
    /// assert(abs(b.score - 100.0) < 1e-9);
    /// let c = bleu(["a cat on a mat"], [["the cat is on the mat"], ["there is a cat on the mat"]]);
    /// assert(c.score > 0.0 && c.score < 100.0);
    /// ```
    #[rhai_fn(return_raw)]
    pub fn bleu(hyps: Array, refs: Array) -> ScriptResult<Map> {
        bleu_opts(hyps, refs, Map::new())
    }

    /// `bleu(hyps, refs)` on one slice of the lines: option `shard` ("I/N"). The result
    /// keeps BLEU's counts (`options.shard`), and `merge_results` adds the slices' counts
    /// into the corpus score (docs/methods.md#shards).
    ///
    /// ```rhai
    /// let h = ["a cat sat on the mat", "the dog barks", "hello world"];
    /// let r = ["the cat sat on the mat", "a dog barks loudly", "hello world"];
    /// let parts = [bleu(h, r, #{shard: "0/2"}), bleu(h, r, #{shard: "1/2"})];
    /// assert(abs(merge_results(parts).score - bleu(h, r).score) < 1e-9);
    /// ```
    #[rhai_fn(name = "bleu", return_raw)]
    pub fn bleu_opts(hyps: Array, refs: Array, options: Map) -> ScriptResult<Map> {
        let o = crate::script::convert::Opts::new(&options, "bleu", BLEU_OPTIONS)?;
        let mut h = lines(&Dynamic::from(hyps), "hypotheses")?;
        let mut streams: Vec<Vec<String>> = if refs.first().is_some_and(|r| r.is_array()) {
            refs.iter().enumerate().map(|(i, r)| lines(r, &format!("references[{i}]"))).collect::<ScriptResult<_>>()?
        } else {
            vec![lines(&Dynamic::from(refs), "references")?]
        };
        let shard = match o.string("shard")? {
            Some(s) => Some(s.parse::<crate::shard::Shard>().or_else(|e| err(format!("bleu: {e}")))?),
            None => None,
        };
        let total = h.len();
        let digest = crate::shard::digest(h.iter().chain(streams.iter().flatten()).map(|x| x.as_bytes()));
        if let Some(s) = shard {
            let rows = s.rows(total);
            h = h[rows.clone()].to_vec();
            for st in streams.iter_mut() {
                if st.len() != total {
                    return err(format!(
                        "bleu: reference stream has {} segments but there are {total} hypotheses",
                        st.len()
                    ));
                }
                *st = st[rows.clone()].to_vec();
            }
        }
        let c = corpus_counts(&h, &streams).or_else(|e| err(format!("bleu: {e}")))?;
        let mut m = bleu_map(&c.bleu());
        if let Some(s) = shard {
            let record = crate::shard::Partial {
                func: "bleu".into(),
                name: "bleu".into(),
                shard: s,
                rows: s.rows(total),
                total,
                identity: crate::shard::identity(
                    serde_json::Value::Null,
                    crate::shard::data_identity("", total, &digest),
                    serde_json::json!({"streams": streams.len()}),
                ),
                acc: serde_json::to_value(crate::metrics::bleu::BleuAcc { counts: c, sentences: h.len() })
                    .or_else(|e| err(format!("bleu: {e}")))?,
            };
            let mut opts = Map::new();
            opts.insert("shard".into(), crate::script::convert::json_value(&record.to_json()));
            m.insert("options".into(), Dynamic::from(opts));
        }
        Ok(m)
    }

    /// 13a tokenization (as sacreBLEU's default).
    ///
    /// ```rhai
    /// assert(tokenize_13a("Hello, world! It costs $3.50.") == "Hello , world ! It costs $ 3.50 .");
    /// ```
    pub fn tokenize_13a(line: &str) -> String {
        super::super::tokenize_13a(line)
    }
}

pub fn register(engine: &mut Engine) {
    engine.register_global_module(exported_module!(api).into());
}
