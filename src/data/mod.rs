//! Datasets: sentences with optional targets (references) and dependency trees, read from a
//! plain corpus, a parallel pair of files or a TSV, or a CoNLL-U treebank.

pub mod conllu;

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
    #[error("{src} has {n_src} sentences but {tgt} has {n_tgt}: a parallel corpus needs one target line per source line")]
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
        Ok(Dataset::new(name_of(path), lines(&text).map(|(_, l)| Item { text: l.to_string(), target: None, tree: None }).collect()))
    }

    /// Two aligned files, line by line.
    pub fn parallel(src: &Path, tgt: &Path) -> Result<Dataset, DataError> {
        let (s, t) = (read(src)?, read(tgt)?);
        let s: Vec<&str> = s.lines().map(str::trim).collect();
        let t: Vec<&str> = t.lines().map(str::trim).collect();
        let trim_end = |v: &[&str]| v.len() - v.iter().rev().take_while(|l| l.is_empty()).count();
        let (ns, nt) = (trim_end(&s), trim_end(&t));
        if ns != nt {
            return Err(DataError::Mismatch { src: src.display().to_string(), n_src: ns, tgt: tgt.display().to_string(), n_tgt: nt });
        }
        let mut items = Vec::with_capacity(ns);
        for i in 0..ns {
            if s[i].is_empty() != t[i].is_empty() {
                let (file, which) = if s[i].is_empty() { (src, "source") } else { (tgt, "target") };
                return Err(DataError::Line { file: file.display().to_string(), line: i + 1, msg: format!("empty {which} line opposite a non-empty one") });
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
                return Err(DataError::Line { file: path.display().to_string(), line: n, msg: "expected source<TAB>target".into() });
            };
            items.push(Item { text: s.trim().to_string(), target: Some(t.trim().to_string()), tree: None });
        }
        Ok(Dataset::new(name_of(path), items))
    }

    pub fn treebank(path: &Path) -> Result<Dataset, DataError> {
        let text = read(path)?;
        let sents = conllu::parse(&text, &path.display().to_string())?;
        Ok(Dataset::new(name_of(path), sents.into_iter().map(|s| Item { text: s.text(), target: None, tree: Some(Rc::new(s)) }).collect()))
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn take(&self, n: usize) -> Dataset {
        Dataset::new(format!("{}[:{n}]", self.name), self.items.iter().take(n).cloned().collect())
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
        Dataset::new(format!("{}~sample({n}, seed {seed})", self.name), chosen.into_iter().map(|i| self.items[i].clone()).collect())
    }

    pub fn texts(&self) -> Vec<&str> {
        self.items.iter().map(|i| i.text.as_str()).collect()
    }
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

pub mod script {
    use super::{DataError, Dataset, Item};
    use crate::output::Output;
    use crate::script::convert::{err, ScriptResult};
    use rhai::plugin::*;
    use rhai::{Array, Dynamic, Engine, Map};
    use std::path::Path;

    /// The dataset a script function was given, refused when it is not a Dataset or has no
    /// sentences (an analysis of nothing would print a result "over 0 sentences").
    pub fn dataset_arg(v: &Dynamic, func: &str) -> ScriptResult<Dataset> {
        let Some(d) = v.clone().try_cast::<Dataset>() else {
            return err(format!("{func}: expected a Dataset (corpus, parallel or treebank), got {}", crate::script::convert::quote(v)));
        };
        if d.is_empty() {
            return err(format!("{func}: the dataset {} is empty (no sentences)", d.name));
        }
        Ok(d)
    }

    fn e(what: &str, x: DataError) -> Box<rhai::EvalAltResult> {
        err::<()>(format!("{what}: {x}")).unwrap_err()
    }

    fn item_map(it: &Item) -> Map {
        let mut m = Map::new();
        m.insert("text".into(), Dynamic::from(it.text.clone()));
        if let Some(t) = &it.target {
            m.insert("target".into(), Dynamic::from(t.clone()));
        }
        if let Some(tree) = &it.tree {
            if let Some(id) = tree.sent_id() {
                m.insert("sent_id".into(), Dynamic::from(id.to_string()));
            }
            let words: Array = tree
                .words()
                .map(|w| {
                    let mut wm = Map::new();
                    wm.insert("id".into(), Dynamic::from(w.id as i64));
                    wm.insert("form".into(), Dynamic::from(w.form.clone()));
                    wm.insert("upos".into(), Dynamic::from(w.upos.clone()));
                    wm.insert("head".into(), w.head.map_or(Dynamic::UNIT, |h| Dynamic::from(h as i64)));
                    wm.insert("deprel".into(), Dynamic::from(w.deprel.clone()));
                    Dynamic::from(wm)
                })
                .collect();
            m.insert("words".into(), Dynamic::from(words));
        }
        m
    }

    #[export_module]
    pub mod api {
        use super::*;

        /// A corpus: one sentence per line (blank lines skipped).
        ///
        /// ```rhai
        /// let d = corpus(asset("pud_en.txt"));
        /// assert(d.len() == 1000);
        /// ```
        #[rhai_fn(return_raw)]
        pub fn corpus(path: &str) -> ScriptResult<Dataset> {
            Dataset::corpus(Path::new(path)).map_err(|x| e("corpus", x))
        }

        /// A parallel corpus from two line-aligned files (source, target).
        ///
        /// ```rhai
        /// let s = temp_path("s.txt"); let t = temp_path("t.txt");
        /// write_text(s, "Hello.\nThank you.\n"); write_text(t, "Olá.\nObrigado.\n");
        /// let d = parallel(s, t);
        /// assert(d[1].target == "Obrigado.");
        /// ```
        #[rhai_fn(name = "parallel", return_raw)]
        pub fn parallel2(src: &str, tgt: &str) -> ScriptResult<Dataset> {
            Dataset::parallel(Path::new(src), Path::new(tgt)).map_err(|x| e("parallel", x))
        }

        /// A parallel corpus from a TSV file: `source<TAB>target` per line.
        ///
        /// ```rhai
        /// let p = temp_path("p.tsv");
        /// write_text(p, "Hello.\tOlá.\n");
        /// assert(parallel(p)[0].target == "Olá.");
        /// ```
        #[rhai_fn(name = "parallel", return_raw)]
        pub fn parallel1(tsv: &str) -> ScriptResult<Dataset> {
            Dataset::tsv(Path::new(tsv)).map_err(|x| e("parallel", x))
        }

        /// A dependency treebank (CoNLL-U); each sentence keeps its words, heads and relations.
        ///
        /// ```rhai
        /// let tb = treebank(asset("pud_en.conllu"));
        /// assert(tb.len() == 1000);
        /// assert(tb[0].words[0].form == "“");
        /// ```
        #[rhai_fn(return_raw)]
        pub fn treebank(path: &str) -> ScriptResult<Dataset> {
            Dataset::treebank(Path::new(path)).map_err(|x| e("treebank", x))
        }

        /// Number of sentences.
        ///
        /// ```rhai
        /// assert(corpus(asset("pud_en.txt")).take(5).len() == 5);
        /// ```
        #[rhai_fn(name = "len", pure)]
        pub fn len(d: &mut Dataset) -> i64 {
            d.len() as i64
        }

        /// The first `n` sentences.
        ///
        /// ```rhai
        /// let d = corpus(asset("pud_en.txt"));
        /// assert(d.take(3)[2].text == d[2].text);
        /// ```
        #[rhai_fn(return_raw, pure)]
        pub fn take(d: &mut Dataset, n: i64) -> ScriptResult<Dataset> {
            if n < 0 {
                return err(format!("take: n must be >= 0, got {n}"));
            }
            Ok(d.take(n as usize))
        }

        /// Everything after the first `n` sentences (a held-out part: `d.skip(900)`).
        ///
        /// ```rhai
        /// let d = corpus(asset("pud_en.txt"));
        /// assert(d.skip(990).len() == 10 && d.skip(990)[0].text == d[990].text);
        /// ```
        #[rhai_fn(return_raw, pure)]
        pub fn skip(d: &mut Dataset, n: i64) -> ScriptResult<Dataset> {
            if n < 0 {
                return err(format!("skip: n must be >= 0, got {n}"));
            }
            Ok(d.skip(n as usize))
        }

        /// `n` distinct sentences drawn with a seed (same seed, same sentences), in corpus order.
        ///
        /// ```rhai
        /// let d = corpus(asset("pud_en.txt"));
        /// let a = d.sample(10, 1); let b = d.sample(10, 1);
        /// assert(a.len() == 10 && a[0].text == b[0].text);
        /// ```
        #[rhai_fn(return_raw, pure)]
        pub fn sample(d: &mut Dataset, n: i64, seed: i64) -> ScriptResult<Dataset> {
            if n < 0 {
                return err(format!("sample: n must be >= 0, got {n}"));
            }
            Ok(d.sample(n as usize, seed as u64))
        }

        /// Sentence `i` as a map: `text`, and `target`, `sent_id`, `words` when the dataset has them.
        ///
        /// ```rhai
        /// let tb = treebank(asset("pud_en.conllu"));
        /// assert(tb[-1].text.len() > 0 && tb[0].sent_id == "n01001011");
        /// ```
        #[rhai_fn(index_get, return_raw, pure)]
        pub fn get(d: &mut Dataset, i: i64) -> ScriptResult<Map> {
            let n = d.len() as i64;
            let idx = if i < 0 { i + n } else { i };
            if idx < 0 || idx >= n {
                return err(format!("sentence index {i} out of range: the dataset has {n} sentences"));
            }
            Ok(item_map(&d.items[idx as usize]))
        }

        /// The sentence texts.
        ///
        /// ```rhai
        /// assert(corpus(asset("pud_en.txt")).take(2).texts.len() == 2);
        /// ```
        #[rhai_fn(get = "texts", pure)]
        pub fn texts(d: &mut Dataset) -> Array {
            d.items.iter().map(|i| Dynamic::from(i.text.clone())).collect()
        }

        /// The dataset's name (its file, and how it was cut).
        ///
        /// ```rhai
        /// assert(corpus(asset("pud_en.txt")).take(2).name == "pud_en.txt[:2]");
        /// ```
        #[rhai_fn(get = "name", pure)]
        pub fn name(d: &mut Dataset) -> String {
            d.name.clone()
        }

        #[rhai_fn(name = "to_string", pure)]
        pub fn to_string(d: &mut Dataset) -> String {
            describe(d)
        }
        #[rhai_fn(name = "to_debug", pure)]
        pub fn to_debug(d: &mut Dataset) -> String {
            describe(d)
        }
    }

    pub fn describe(d: &Dataset) -> String {
        let what = match d.items.first() {
            Some(Item { tree: Some(_), .. }) => "treebank",
            Some(Item { target: Some(_), .. }) => "parallel corpus",
            _ => "corpus",
        };
        format!("<Dataset {}: {what} of {} sentences>", d.name, d.len())
    }

    pub fn register(engine: &mut Engine) {
        engine.register_type_with_name::<Dataset>("Dataset");
        engine.register_iterator_result::<Dataset, Dynamic>();
        engine.register_global_module(exported_module!(api).into());
    }

    pub fn render(v: &Dynamic) -> Option<Output> {
        v.clone().try_cast::<Dataset>().map(|d| Output::text(describe(&d)))
    }
}

/// Iterating a dataset in a script yields one map per sentence (see `script::api::get`).
impl IntoIterator for Dataset {
    type Item = Result<rhai::Dynamic, Box<rhai::EvalAltResult>>;
    type IntoIter = std::vec::IntoIter<Self::Item>;
    fn into_iter(self) -> Self::IntoIter {
        let mut d = self;
        (0..d.len() as i64).map(|i| script::api::get(&mut d, i).map(rhai::Dynamic::from)).collect::<Vec<_>>().into_iter()
    }
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
}
