//! Corpus BLEU equal to sacreBLEU's default: 13a tokenization, case-sensitive, 4-grams,
//! `exp` smoothing, closest reference length (shorter on ties).

use regex::Regex;
use std::collections::HashMap;
use std::sync::OnceLock;

const MAX_ORDER: usize = 4;

fn rules() -> &'static [(Regex, &'static str); 4] {
    static R: OnceLock<[(Regex, &'static str); 4]> = OnceLock::new();
    R.get_or_init(|| {
        let re = |s: &str| Regex::new(s).unwrap_or_else(|e| panic!("built-in 13a pattern {s}: {e}"));
        [
            // language-dependent part (Western languages): punctuation and symbols
            (re(r"([\{-\~\[-` -\&\(-\+:-@/])"), " $1 "),
            // period and comma unless preceded by a digit
            (re(r"([^0-9])([\.,])"), "$1 $2 "),
            // period and comma unless followed by a digit
            (re(r"([\.,])([^0-9])"), " $1 $2"),
            // dash when preceded by a digit
            (re(r"([0-9])(-)"), "$1 $2 "),
        ]
    })
}

/// mteval-v13a tokenization as sacreBLEU does it.
pub fn tokenize_13a(line: &str) -> String {
    let mut line = line.trim_end().replace("<skipped>", "").replace("-\n", "").replace('\n', " ");
    if line.contains('&') {
        line = line.replace("&quot;", "\"").replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">");
    }
    let mut s = format!(" {line} ");
    for (re, rep) in rules() {
        s = re.replace_all(&s, *rep).into_owned();
    }
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn ngrams(tokens: &[&str]) -> HashMap<Vec<String>, usize> {
    let mut m = HashMap::new();
    for n in 1..=MAX_ORDER {
        for w in tokens.windows(n) {
            *m.entry(w.iter().map(|s| s.to_string()).collect()).or_insert(0) += 1;
        }
    }
    m
}

#[derive(Debug, Clone, PartialEq)]
pub struct Bleu {
    pub score: f64,
    /// Per order, in percent.
    pub precisions: [f64; MAX_ORDER],
    pub bp: f64,
    pub sys_len: usize,
    pub ref_len: usize,
    pub correct: [usize; MAX_ORDER],
    pub total: [usize; MAX_ORDER],
}

impl std::fmt::Display for Bleu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p: Vec<String> = self.precisions.iter().map(|p| format!("{p:.1}")).collect();
        let ratio = if self.ref_len > 0 { self.sys_len as f64 / self.ref_len as f64 } else { 0.0 };
        write!(f, "BLEU = {:.2} {} (BP = {:.3} ratio = {ratio:.3} hyp_len = {} ref_len = {})", self.score, p.join("/"), self.bp, self.sys_len, self.ref_len)
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum BleuError {
    #[error("reference stream {stream} has {got} segments but there are {want} hypotheses")]
    Length { stream: usize, got: usize, want: usize },
    #[error("no reference streams given")]
    NoReferences,
}

/// BLEU's sufficient statistics: n-gram matches and totals per order, hypothesis and
/// (closest) reference lengths. They add over sentences, so shards of a corpus add up to the
/// corpus (docs/methods.md#shards).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BleuCounts {
    pub correct: [u64; MAX_ORDER],
    pub total: [u64; MAX_ORDER],
    pub sys_len: u64,
    pub ref_len: u64,
}

impl BleuCounts {
    pub fn add(&mut self, o: &BleuCounts) {
        for n in 0..MAX_ORDER {
            self.correct[n] += o.correct[n];
            self.total[n] += o.total[n];
        }
        self.sys_len += o.sys_len;
        self.ref_len += o.ref_len;
    }

    /// The corpus score of these counts, as sacreBLEU computes it (exp smoothing).
    pub fn bleu(&self) -> Bleu {
        let (correct, total) = (self.correct.map(|c| c as usize), self.total.map(|c| c as usize));
        let (sys_len, ref_len) = (self.sys_len as usize, self.ref_len as usize);
        let bp = if sys_len < ref_len { if sys_len > 0 { (1.0 - ref_len as f64 / sys_len as f64).exp() } else { 0.0 } } else { 1.0 };
        let mut precisions = [0.0; MAX_ORDER];
        if correct.iter().all(|&c| c == 0) {
            return Bleu { score: 0.0, precisions, bp, sys_len, ref_len, correct, total };
        }
        let mut smooth = 1.0;
        for n in 0..MAX_ORDER {
            if total[n] == 0 {
                break;
            }
            precisions[n] = if correct[n] == 0 {
                smooth *= 2.0;
                100.0 / (smooth * total[n] as f64)
            } else {
                100.0 * correct[n] as f64 / total[n] as f64
            };
        }
        let log = |p: f64| if p > 0.0 { p.ln() } else { -9_999_999_999.0 };
        let score = bp * (precisions.iter().map(|&p| log(p)).sum::<f64>() / MAX_ORDER as f64).exp();
        Bleu { score, precisions, bp, sys_len, ref_len, correct, total }
    }
}

/// Corpus BLEU of `hyps` against one or more reference streams (each as long as `hyps`).
pub fn corpus_bleu<S: AsRef<str>, R: AsRef<str>>(hyps: &[S], refs: &[Vec<R>]) -> Result<Bleu, BleuError> {
    Ok(corpus_counts(hyps, refs)?.bleu())
}

/// The counts [`corpus_bleu`] scores.
pub fn corpus_counts<S: AsRef<str>, R: AsRef<str>>(hyps: &[S], refs: &[Vec<R>]) -> Result<BleuCounts, BleuError> {
    if refs.is_empty() {
        return Err(BleuError::NoReferences);
    }
    for (i, r) in refs.iter().enumerate() {
        if r.len() != hyps.len() {
            return Err(BleuError::Length { stream: i, got: r.len(), want: hyps.len() });
        }
    }
    let mut c = BleuCounts::default();
    for (i, h) in hyps.iter().enumerate() {
        let ht = tokenize_13a(h.as_ref());
        let htoks: Vec<&str> = ht.split(' ').filter(|s| !s.is_empty()).collect();
        let mut ref_counts: HashMap<Vec<String>, usize> = HashMap::new();
        let mut closest: Option<(usize, usize)> = None; // (diff, len)
        for stream in refs {
            let rt = tokenize_13a(stream[i].as_ref());
            let rtoks: Vec<&str> = rt.split(' ').filter(|s| !s.is_empty()).collect();
            let diff = rtoks.len().abs_diff(htoks.len());
            closest = match closest {
                None => Some((diff, rtoks.len())),
                Some((d, l)) if diff < d || (diff == d && rtoks.len() < l) => Some((diff, rtoks.len())),
                c => c,
            };
            for (g, n) in ngrams(&rtoks) {
                let e = ref_counts.entry(g).or_insert(0);
                *e = (*e).max(n);
            }
        }
        c.sys_len += htoks.len() as u64;
        c.ref_len += closest.map_or(0, |c| c.1) as u64;
        for (g, n) in ngrams(&htoks) {
            c.correct[g.len() - 1] += n.min(ref_counts.get(&g).copied().unwrap_or(0)) as u64;
        }
        for n in 1..=MAX_ORDER {
            c.total[n - 1] += htoks.len().saturating_sub(n - 1) as u64;
        }
    }
    Ok(c)
}

pub mod script {
    use super::corpus_counts;
    use crate::script::convert::{err, opt, quote, OptSpec, ScriptResult};
    use rhai::plugin::*;
    use rhai::{Array, Dynamic, Engine, Map};

    /// The options of the free `bleu(hyps, refs, #{...})` (the method `m.bleu(data, #{...})`
    /// translates first and has its own list, `Model.bleu` in the registry).
    pub const BLEU_OPTIONS: &[OptSpec] = &[opt("shard", "none", "\"I/N\": score slice I of N of the lines and keep BLEU's counts (docs/methods.md#shards)")];

    fn lines(v: &Dynamic, what: &str) -> ScriptResult<Vec<String>> {
        if let Some(a) = v.clone().try_cast::<Array>() {
            return a.iter().enumerate().map(|(i, s)| if s.is_string() { Ok(s.to_string()) } else { err(format!("bleu: {what}[{i}] is not a string: {}", quote(s))) }).collect();
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
                        return err(format!("bleu: reference stream has {} segments but there are {total} hypotheses", st.len()));
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
                    identity: serde_json::json!({"streams": streams.len(), "digest": digest}),
                    acc: serde_json::json!({"counts": c, "sentences": h.len()}),
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizes_like_mteval_13a() {
        // The apostrophe (0x27) is outside 13a's symbol class: "It's" stays one token.
        assert_eq!(tokenize_13a("Hello, world! It's 3.5-4 km."), "Hello , world ! It's 3.5 - 4 km .");
        assert_eq!(tokenize_13a("a&amp;b &lt;x&gt;"), "a & b < x >");
        assert_eq!(tokenize_13a("1,000.5 people"), "1,000.5 people");
    }

    #[test]
    fn hand_computed_score() {
        // hyp "the cat" vs ref "the cat sat": p1 = 2/2, p2 = 1/1, p3: total 0 -> stop.
        // Orders 3 and 4 keep precision 0, so log(0) dominates: BLEU = 0 unless all orders match.
        let b = corpus_bleu(&["the cat"], &[vec!["the cat sat"]]).unwrap();
        assert_eq!(b.total, [2, 1, 0, 0]);
        assert_eq!(b.correct, [2, 1, 0, 0]);
        assert!((b.bp - (1.0f64 - 1.5).exp()).abs() < 1e-12);
        assert!(b.score < 1e-6);
        // Exp smoothing: the first zero-match order gets 100 / (2 * total).
        // hyp 1-grams a b c d e vs ref a b c x e: 4/5; 2-grams ab bc cd de vs ab bc cx xe: 2/4;
        // 3-grams abc bcd cde vs abc bcx cxe: 1/3; 4-grams: 0/2 -> 100 / (2 * 2) = 25.
        let b = corpus_bleu(&["a b c d e"], &[vec!["a b c x e"]]).unwrap();
        assert_eq!(b.correct, [4, 2, 1, 0]);
        assert_eq!(b.precisions[3], 25.0);
        let want = ((80.0f64.ln() + 50f64.ln() + (100.0f64 / 3.0).ln() + 25f64.ln()) / 4.0).exp();
        assert!((b.score - want).abs() < 1e-9);
        assert!(corpus_bleu(&["x"], &[vec!["a", "b"]]).is_err());
    }
}
