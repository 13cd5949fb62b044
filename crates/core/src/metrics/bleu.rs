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
        write!(
            f,
            "BLEU = {:.2} {} (BP = {:.3} ratio = {ratio:.3} hyp_len = {} ref_len = {})",
            self.score,
            p.join("/"),
            self.bp,
            self.sys_len,
            self.ref_len
        )
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

crate::accumulate_fields!(BleuCounts { correct, total, sys_len, ref_len });

/// `bleu`'s shard accumulators (docs/methods.md#shards): the counts and the sentences behind them.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BleuAcc {
    pub counts: BleuCounts,
    pub sentences: usize,
}
crate::accumulate_fields!(BleuAcc { counts, sentences });

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
        let bp = if sys_len < ref_len {
            if sys_len > 0 {
                (1.0 - ref_len as f64 / sys_len as f64).exp()
            } else {
                0.0
            }
        } else {
            1.0
        };
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
        // Rounded to 10 decimals: the sum of logarithms leaves 100.00000000000004 for a
        // perfect match (sacreBLEU's own `score` too), which is noise, not a difference.
        let score = (score * 1e10).round() / 1e10;
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

    #[test]
    fn a_perfect_match_scores_exactly_100() {
        // Unrounded, exp((4 ln 100) / 4) is 100.00000000000004 (issue #30).
        let b = corpus_bleu(&["the cat sat on the mat"], &[vec!["the cat sat on the mat"]]).unwrap();
        assert_eq!(b.score, 100.0);
        assert_eq!(format!("{}", b.score), "100");
    }
}
