//! The `Dataset` script type: `corpus`, `parallel`, `treebank`, and the dataset methods.

use super::{DataError, Dataset, Item};
use crate::output::Output;
use crate::script::convert::{err, ScriptResult};
use rhai::plugin::*;
use rhai::{Array, Dynamic, Engine, Map};
use std::path::Path;

/// The dataset a script function was given: a Dataset, or text as it comes to hand (a
/// string, an array of strings, a dataset row `#{text, target}` or an array of rows), which
/// becomes an in-memory corpus. Refused when it has no sentences (an analysis of nothing would
/// print a result "over 0 sentences") or a text is empty.
pub fn dataset_arg(v: &Dynamic, func: &str) -> ScriptResult<Dataset> {
    let d = match v.clone().try_cast::<Dataset>() {
        Some(d) => d,
        None => texts_dataset(v, func)?,
    };
    d.require_sentences(func)?;
    Ok(d)
}

/// One sentence from a string or a dataset row (a map with `text`, optionally `target`);
/// `item` is its place in an array, named in errors.
fn text_item(v: &Dynamic, func: &str, item: Option<usize>) -> ScriptResult<Item> {
    let at = item.map(|i| format!(" (item {i})")).unwrap_or_default();
    let (text, target) = if let Some(t) = v.read_lock::<rhai::ImmutableString>() {
        if looks_like_file(&t) {
            let t = t.as_str();
            return err(format!("{func}: \"{t}\" looks like a file name, not a text{at}: read the file with corpus(\"{t}\") (or treebank, parallel)"));
        }
        (t.to_string(), None)
    } else if let Some(m) = v.read_lock::<Map>() {
        let Some(t) = m.get("text").and_then(|t| t.read_lock::<rhai::ImmutableString>().map(|t| t.to_string())) else {
            return err(format!(
                "{func}: a dataset row needs a string `text`, got {}{at}",
                crate::script::convert::quote(v)
            ));
        };
        let target = match m.get("target") {
            None => None,
            Some(g) => match g.read_lock::<rhai::ImmutableString>() {
                Some(g) => Some(g.to_string()),
                None => {
                    return err(format!(
                        "{func}: a dataset row's `target` must be a string, got {}{at}",
                        crate::script::convert::quote(g)
                    ))
                }
            },
        };
        (t, target)
    } else {
        return err(format!("{func}: expected a Dataset (corpus, parallel or treebank), a text, an array of texts or dataset rows, got {}{at}", crate::script::convert::quote(v)));
    };
    if text.trim().is_empty() {
        return err(match item {
            Some(i) => format!("{func}: sentence {i} is empty"),
            None => format!("{func}: the text is empty: there is nothing to run the model on"),
        });
    }
    Ok(Item { text, target, tree: None })
}

/// A string given as a text that is surely meant as a file: one word that names an existing
/// path or ends in a data file's extension.
fn looks_like_file(s: &str) -> bool {
    const EXTENSIONS: &[&str] = &["txt", "conllu", "tsv", "csv", "json", "jsonl", "src", "tgt", "tok", "gz"];
    !s.is_empty()
        && !s.contains(char::is_whitespace)
        && (Path::new(s).is_file()
            || Path::new(s)
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| EXTENSIONS.contains(&e.to_ascii_lowercase().as_str())))
}

/// The text of a string or of a dataset row (`#{text, ...}`), for functions that take one text.
pub(crate) fn one_text(v: &Dynamic, func: &str) -> ScriptResult<String> {
    Ok(text_item(v, func, None)?.text)
}

/// An in-memory corpus from a text, a row, or an array of them (see [`dataset_arg`]).
fn texts_dataset(v: &Dynamic, func: &str) -> ScriptResult<Dataset> {
    let items = match v.read_lock::<Array>() {
        Some(a) if a.is_empty() => return err(format!("{func}: no sentences given (an empty array)")),
        Some(a) => a.iter().enumerate().map(|(i, x)| text_item(x, func, Some(i))).collect::<ScriptResult<Vec<_>>>()?,
        None => vec![text_item(v, func, None)?],
    };
    Ok(Dataset::new(format!("texts[{}]", items.len()), items))
}

/// The `shard` option every dataset-consuming analysis accepts (docs/methods.md#shards).
pub const SHARD_OPTION: crate::script::convert::OptSpec = crate::script::convert::opt(
    "shard",
    "none (or the run's --shard)",
    "\"I/N\": run on slice I of N of the data and keep the accumulators for merge_results (docs/methods.md#shards)",
);

/// How a dataset-consuming function runs: on the whole dataset, or on one shard of it
/// (the function's `shard` option, else the run's `--shard`). The typed functions the script
/// functions and the library API share take a plan; the API's is always [`Plan::whole`].
pub struct Plan {
    pub shard: Option<crate::shard::Shard>,
    /// Given as the function's option (the result is returned with its shard record) rather
    /// than by the run (`--shard`: the record is also written to the run's shard directory).
    pub explicit: bool,
    pub rows: std::ops::Range<usize>,
    pub total: usize,
    /// The data's part of a shard record's identity (`shard::data_identity`).
    data: serde_json::Value,
}

impl Plan {
    /// The plan of a script call: its `shard` option, else the run's `--shard`, else whole.
    pub fn new(d: &Dataset, o: &crate::script::convert::Opts, func: &str) -> ScriptResult<Plan> {
        let (shard, explicit) = Plan::shard_of(o, func)?;
        Ok(Plan::of(d, shard, explicit))
    }

    /// The call's `shard` option, else the run's `--shard`; and whether the call gave it.
    fn shard_of(o: &crate::script::convert::Opts, func: &str) -> ScriptResult<(Option<crate::shard::Shard>, bool)> {
        let explicit = match o.string("shard")? {
            Some(s) => Some(s.parse::<crate::shard::Shard>().or_else(|e| err(format!("{func}: {e}")))?),
            None => None,
        };
        Ok((explicit.or_else(crate::shard::run_shard), explicit.is_some()))
    }

    /// The whole dataset, whatever the run's `--shard` (the library API runs whole).
    pub fn whole(d: &Dataset) -> Plan {
        Plan::of(d, None, false)
    }

    fn of(d: &Dataset, shard: Option<crate::shard::Shard>, explicit: bool) -> Plan {
        Plan::of_items(&d.name, d.len(), d.digest(), shard, explicit)
    }

    fn of_items(name: &str, total: usize, digest: String, shard: Option<crate::shard::Shard>, explicit: bool) -> Plan {
        let rows = shard.map_or(0..total, |s| s.rows(total));
        let data = crate::shard::data_identity(name, total, &digest);
        Plan { shard, explicit, rows, total, data }
    }

    /// The plan of a script call over prompt pairs (patching): as [`Plan::new`], by pairs.
    pub fn for_pairs(p: &super::pairs::Pairs, o: &crate::script::convert::Opts, func: &str) -> ScriptResult<Plan> {
        let (shard, explicit) = Plan::shard_of(o, func)?;
        let plan = Plan::of_items(&p.name, p.len(), p.digest(), shard, explicit);
        if let (Some(s), true) = (plan.shard, plan.rows.is_empty()) {
            return err(format!(
                "{func}: shard {s} of {} ({} pairs) holds no pairs: use fewer shards than pairs",
                p.name, plan.total
            ));
        }
        Ok(plan)
    }

    /// Refuses a shard that holds no sentences.
    pub fn check(&self, d: &Dataset, func: &str) -> Result<(), String> {
        match self.shard {
            Some(s) if self.rows.is_empty() => Err(format!(
                "{func}: shard {s} of {} ({} sentences) holds no sentences: use fewer shards than sentences",
                d.name, self.total
            )),
            _ => Ok(()),
        }
    }

    /// The sentences this call runs on; refused when the shard is empty.
    pub fn data(&self, d: &Dataset, func: &str) -> Result<Dataset, String> {
        self.check(d, func)?;
        Ok(if self.shard.is_some() { d.slice(self.rows.clone()) } else { d.clone() })
    }

    /// A shard record's identity for this plan's data (`shard::identity`): the model's
    /// (`View::identity`) and `rest` (an object: the echoed options, which heads have a value,
    /// ...).
    pub fn identity(&self, model: serde_json::Value, rest: serde_json::Value) -> serde_json::Value {
        crate::shard::identity(model, self.data.clone(), rest)
    }

    /// Adds the shard record (function, slice, identity, accumulators) to a sharded result's
    /// echoed options, and in a `--shard` run writes the result to the shard directory.
    pub fn seal<T, A: crate::shard::Accumulate>(
        &self,
        func: &str,
        identity: serde_json::Value,
        acc: &A,
        mut result: T,
        echo: impl FnOnce(&mut T) -> &mut crate::output::Echo,
        json: impl Fn(&T) -> serde_json::Value,
    ) -> Result<T, String> {
        let Some(shard) = self.shard else { return Ok(result) };
        let acc = serde_json::to_value(acc).map_err(|e| format!("{func}: the accumulators: {e}"))?;
        let name = if self.explicit { func.to_string() } else { crate::shard::next_name(func) };
        let record = crate::shard::Partial {
            func: func.into(),
            name: name.clone(),
            shard,
            rows: self.rows.clone(),
            total: self.total,
            identity,
            acc,
        };
        echo(&mut result).push(("shard".into(), record.to_json()));
        if !self.explicit {
            crate::shard::write_run_result(&name, &json(&result)).map_err(|e| format!("{func}: {e}"))?;
        }
        Ok(result)
    }
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

    /// A corpus held in memory: an array of texts or of dataset rows (`#{text, target}`).
    /// Every function that takes a dataset also takes such an array, one text or one row
    /// directly; `corpus([...])` names it once to reuse it.
    ///
    /// ```rhai
    /// let d = corpus(["The cat sleeps.", "A dog barks."]);
    /// assert(d.len() == 2 && d[1].text == "A dog barks.");
    /// let p = corpus([#{text: "Hello.", target: "Olá."}]);
    /// assert(p[0].target == "Olá.");
    /// ```
    #[rhai_fn(name = "corpus", return_raw)]
    pub fn corpus_of(texts: Array) -> ScriptResult<Dataset> {
        let d = super::texts_dataset(&Dynamic::from(texts), "corpus")?;
        d.require_sentences("corpus")?;
        Ok(d)
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
    // Iterating a dataset in a script yields one map per sentence (see `api::get`).
    let mut iter = rhai::Module::new();
    iter.set_iter_result(std::any::TypeId::of::<Dataset>(), |d: Dynamic| {
        let mut d = d.cast::<Dataset>();
        let items: Vec<_> = (0..d.len() as i64).map(|i| api::get(&mut d, i).map(Dynamic::from)).collect();
        Box::new(items.into_iter())
    });
    engine.register_global_module(iter.into());
    engine.register_global_module(exported_module!(api).into());
}

pub fn render(v: &Dynamic) -> Option<Output> {
    v.clone().try_cast::<Dataset>().map(|d| Output::text(describe(&d)))
}
