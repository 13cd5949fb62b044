//! Datasets: sentences with optional targets (references) and dependency trees, read from a
//! plain corpus, a parallel pair of files or a TSV, or a CoNLL-U treebank.

pub mod conllu;
pub mod pairs;

use conllu::Sentence;
use std::path::Path;
use std::rc::Rc;

#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    pub text: String,
    pub target: Option<String>,
    pub tree: Option<Rc<Sentence>>,
}

#[derive(Debug, Clone)]
pub struct Dataset {
    pub name: String,
    pub items: Rc<Vec<Item>>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DataError {
    #[error("{0}: {1}")]
    Io(String, String),
    #[error("{file}:{line}: {msg}")]
    Line { file: String, line: usize, msg: String },
    #[error(transparent)]
    Conllu(#[from] conllu::ConlluError),
    #[error(
        "{src} has {n_src} sentences but {tgt} has {n_tgt}: a parallel corpus needs one target line per source line"
    )]
    Mismatch { src: String, n_src: usize, tgt: String, n_tgt: usize },
}

fn read(path: &Path) -> Result<String, DataError> {
    let p = path.display().to_string();
    if path.is_dir() {
        return Err(DataError::Io(p, "is a directory".into()));
    }
    let bytes = std::fs::read(path).map_err(|e| DataError::Io(p.clone(), e.to_string()))?;
    String::from_utf8(bytes).map_err(|e| {
        let off = e.utf8_error().valid_up_to();
        let line = e.as_bytes()[..off].iter().filter(|&&b| b == b'\n').count() + 1;
        DataError::Line { file: p, line, msg: "not valid UTF-8".into() }
    })
}

fn lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines().enumerate().map(|(i, l)| (i + 1, l.trim())).filter(|(_, l)| !l.is_empty())
}

fn name_of(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| path.display().to_string())
}

impl Dataset {
    pub fn new(name: impl Into<String>, items: Vec<Item>) -> Self {
        Dataset { name: name.into(), items: Rc::new(items) }
    }

    /// One sentence per line; blank lines are skipped.
    pub fn corpus(path: &Path) -> Result<Dataset, DataError> {
        let text = read(path)?;
        Ok(Dataset::new(
            name_of(path),
            lines(&text).map(|(_, l)| Item { text: l.to_string(), target: None, tree: None }).collect(),
        ))
    }

    /// Two aligned files, line by line.
    pub fn parallel(src: &Path, tgt: &Path) -> Result<Dataset, DataError> {
        let (s, t) = (read(src)?, read(tgt)?);
        let s: Vec<&str> = s.lines().map(str::trim).collect();
        let t: Vec<&str> = t.lines().map(str::trim).collect();
        let trim_end = |v: &[&str]| v.len() - v.iter().rev().take_while(|l| l.is_empty()).count();
        let (ns, nt) = (trim_end(&s), trim_end(&t));
        if ns != nt {
            return Err(DataError::Mismatch {
                src: src.display().to_string(),
                n_src: ns,
                tgt: tgt.display().to_string(),
                n_tgt: nt,
            });
        }
        let mut items = Vec::with_capacity(ns);
        for i in 0..ns {
            if s[i].is_empty() != t[i].is_empty() {
                let (file, which) = if s[i].is_empty() { (src, "source") } else { (tgt, "target") };
                return Err(DataError::Line {
                    file: file.display().to_string(),
                    line: i + 1,
                    msg: format!("empty {which} line opposite a non-empty one"),
                });
            }
            if !s[i].is_empty() {
                items.push(Item { text: s[i].to_string(), target: Some(t[i].to_string()), tree: None });
            }
        }
        Ok(Dataset::new(format!("{}+{}", name_of(src), name_of(tgt)), items))
    }

    /// `source<TAB>target` per line.
    pub fn tsv(path: &Path) -> Result<Dataset, DataError> {
        let text = read(path)?;
        let mut items = Vec::new();
        for (n, l) in lines(&text) {
            let Some((s, t)) = l.split_once('\t') else {
                return Err(DataError::Line {
                    file: path.display().to_string(),
                    line: n,
                    msg: "expected source<TAB>target".into(),
                });
            };
            items.push(Item { text: s.trim().to_string(), target: Some(t.trim().to_string()), tree: None });
        }
        Ok(Dataset::new(name_of(path), items))
    }

    pub fn treebank(path: &Path) -> Result<Dataset, DataError> {
        let text = read(path)?;
        let sents = conllu::parse(&text, &path.display().to_string())?;
        Ok(Dataset::new(
            name_of(path),
            sents.into_iter().map(|s| Item { text: s.text(), target: None, tree: Some(Rc::new(s)) }).collect(),
        ))
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Refuses a dataset without sentences for `func` (an analysis of nothing would print a
    /// result "over 0 sentences"); the message names the function and the dataset.
    pub fn require_sentences(&self, func: &str) -> Result<(), String> {
        if self.is_empty() {
            return Err(format!("{func}: the dataset {} is empty (no sentences)", self.name));
        }
        Ok(())
    }

    /// This corpus with the trees of `tb`, a treebank of the same sentences in the same order
    /// (`analyze`'s `treebank` option); errors start with `func`.
    pub fn with_trees(&self, tb: &Dataset, func: &str) -> Result<Dataset, String> {
        if tb.items.iter().any(|i| i.tree.is_none()) {
            return Err(format!("{func}: option 'treebank': {} is not a treebank", tb.name));
        }
        if tb.len() != self.len() {
            return Err(format!(
                "{func}: the treebank {} has {} sentences but the dataset {} has {}",
                tb.name,
                tb.len(),
                self.name,
                self.len()
            ));
        }
        let mut items = Vec::with_capacity(self.len());
        for (i, (d, t)) in self.items.iter().zip(tb.items.iter()).enumerate() {
            if d.text != t.text {
                return Err(format!(
                    "{func}: sentence {i} of the treebank {} does not match the dataset {}: {:?} vs {:?}",
                    tb.name, self.name, t.text, d.text
                ));
            }
            items.push(Item { tree: t.tree.clone(), ..d.clone() });
        }
        Ok(Dataset::new(self.name.clone(), items))
    }

    /// The first `n` sentences, named `NAME[:n]`; a take of a take is one take
    /// (`d.take(20).take(5)` is `NAME[:5]`, `d.take(20).take(20)` is `NAME[:20]`).
    pub fn take(&self, n: usize) -> Dataset {
        let name = match take_of(&self.name) {
            Some((base, k)) => format!("{base}[:{}]", n.min(k)),
            None => format!("{}[:{n}]", self.name),
        };
        Dataset::new(name, self.items.iter().take(n).cloned().collect())
    }

    /// Everything after the first `n` sentences.
    pub fn skip(&self, n: usize) -> Dataset {
        Dataset::new(format!("{}[{n}:]", self.name), self.items.iter().skip(n).cloned().collect())
    }

    /// `n` distinct sentences chosen with a seeded generator, kept in corpus order.
    pub fn sample(&self, n: usize, seed: u64) -> Dataset {
        let mut idx: Vec<usize> = (0..self.len()).collect();
        let mut state = seed;
        let k = n.min(idx.len());
        for i in 0..k {
            let j = i + (splitmix64(&mut state) % (idx.len() - i) as u64) as usize;
            idx.swap(i, j);
        }
        let mut chosen = idx[..k].to_vec();
        chosen.sort_unstable();
        Dataset::new(
            format!("{}~sample({n}, seed {seed})", self.name),
            chosen.into_iter().map(|i| self.items[i].clone()).collect(),
        )
    }

    pub fn texts(&self) -> Vec<&str> {
        self.items.iter().map(|i| i.text.as_str()).collect()
    }

    /// Sentences `rows` (a shard's slice, `shard::Shard::rows`), under the same name.
    pub fn slice(&self, rows: std::ops::Range<usize>) -> Dataset {
        let rows = rows.start.min(self.len())..rows.end.min(self.len());
        Dataset { name: self.name.clone(), items: Rc::new(self.items[rows].to_vec()) }
    }

    /// A digest of every sentence, target and tree: shards of one dataset share it
    /// (`shard::digest`).
    pub fn digest(&self) -> String {
        let trees: Vec<String> =
            self.items.iter().map(|i| i.tree.as_ref().map_or(String::new(), |t| format!("{t:?}"))).collect();
        crate::shard::digest(self.items.iter().zip(&trees).flat_map(|(i, t)| {
            [i.text.as_bytes(), i.target.as_deref().map_or(&[0xfe][..], str::as_bytes), t.as_bytes()]
        }))
    }
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `NAME[:k]` -> (`NAME`, k).
fn take_of(name: &str) -> Option<(&str, usize)> {
    let (base, k) = name.strip_suffix(']')?.rsplit_once("[:")?;
    Some((base, k.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_is_seeded_distinct_and_ordered() {
        let d = Dataset::new("t", (0..100).map(|i| Item { text: i.to_string(), target: None, tree: None }).collect());
        let a = d.sample(10, 42);
        assert_eq!(a.texts(), d.sample(10, 42).texts());
        assert_ne!(a.texts(), d.sample(10, 43).texts());
        let nums: Vec<usize> = a.texts().iter().map(|t| t.parse().unwrap()).collect();
        assert!(nums.windows(2).all(|w| w[0] < w[1]), "{nums:?}");
        assert_eq!(d.sample(1000, 1).len(), 100);
    }

    #[test]
    fn parallel_mismatch_names_both_files() {
        let dir = tempfile::tempdir().unwrap();
        let (s, t) = (dir.path().join("a.en"), dir.path().join("a.pt"));
        std::fs::write(&s, "one\ntwo\nthree\n").unwrap();
        std::fs::write(&t, "um\ndois\n").unwrap();
        let e = Dataset::parallel(&s, &t).unwrap_err().to_string();
        assert!(e.contains("a.en has 3 sentences but") && e.contains("a.pt has 2"), "{e}");
        std::fs::write(dir.path().join("x.tsv"), "ok\tbem\nno tab here\n").unwrap();
        let e = Dataset::tsv(&dir.path().join("x.tsv")).unwrap_err().to_string();
        assert!(e.ends_with("x.tsv:2: expected source<TAB>target"), "{e}");
    }

    #[test]
    fn a_take_of_a_take_is_one_take() {
        let d = Dataset::new("pud_en.txt", vec![]);
        assert_eq!(d.take(20).take(20).name, "pud_en.txt[:20]");
        assert_eq!(d.take(20).take(5).name, "pud_en.txt[:5]");
        assert_eq!(d.take(5).take(20).name, "pud_en.txt[:5]");
        assert_eq!(d.skip(3).take(2).name, "pud_en.txt[3:][:2]");
    }
}
