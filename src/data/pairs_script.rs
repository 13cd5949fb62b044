//! The `Pairs` script type: prompt pairs for activation patching (`pairs(file)`,
//! `pairs([...])`; docs/methods.md#activation-patching).

use super::pairs::{Pair, PairTokens, Pairs, COLUMNS};
use crate::output::Output;
use crate::script::convert::{err, quote, ScriptResult};
use rhai::plugin::*;
use rhai::{Array, Dynamic, Engine, Map};
use std::path::Path;

/// The pairs a script function was given, refused when they are not `Pairs`.
pub fn pairs_arg(v: &Dynamic, func: &str) -> ScriptResult<Pairs> {
    match v.clone().try_cast::<Pairs>() {
        Some(p) => Ok(p),
        None if v.is_array() => {
            let a = v.clone().cast::<Array>();
            from_array(&a, func)
        }
        None => err(format!(
            "{func}: expected Pairs (pairs(file) or pairs([[clean, corrupted, answer, wrong], ...])), got {}",
            quote(v)
        )),
    }
}

fn text_of(v: Option<&Dynamic>, i: usize, col: &str, func: &str) -> ScriptResult<String> {
    match v {
        Some(s) if s.is_string() && !s.to_string().trim().is_empty() => Ok(s.to_string()),
        Some(s) if s.is_string() => err(format!("{func}: pairs[{i}]: the {col} is empty")),
        Some(s) => err(format!("{func}: pairs[{i}]: the {col} must be a string, got {}", quote(s))),
        None => err(format!(
            "{func}: pairs[{i}]: the {col} is missing (a pair is [{}] or a map with those keys)",
            COLUMNS.join(", ")
        )),
    }
}

fn from_array(a: &Array, func: &str) -> ScriptResult<Pairs> {
    if a.is_empty() {
        return err(format!("{func}: no pairs given (an empty array)"));
    }
    let mut items = Vec::with_capacity(a.len());
    for (i, row) in a.iter().enumerate() {
        let cols: Vec<Option<Dynamic>> = if let Some(r) = row.read_lock::<Array>() {
            if r.len() != 4 && r.len() != 2 {
                return err(format!(
                    "{func}: pairs[{i}]: {} values, expected 4: {} (2 for a translation model's source pairs)",
                    r.len(),
                    COLUMNS.join(", ")
                ));
            }
            let mut c: Vec<Option<Dynamic>> = r.iter().cloned().map(Some).collect();
            c.resize(4, None);
            c
        } else if let Some(m) = row.read_lock::<Map>() {
            if let Some(k) = m.keys().find(|k| !COLUMNS.contains(&k.as_str())) {
                return err(format!("{func}: pairs[{i}]: unknown key '{k}' (the keys are {})", COLUMNS.join(", ")));
            }
            COLUMNS.iter().map(|c| m.get(*c).cloned()).collect()
        } else {
            return err(format!(
                "{func}: pairs[{i}]: expected [clean, corrupted, answer, wrong] or a map, got {}",
                quote(row)
            ));
        };
        if cols.iter().all(|c| c.as_ref().is_some_and(|v| v.is_array() || v.is_int())) {
            items.push(token_pair(&cols, i, func)?);
            continue;
        }
        let t = |k: usize| text_of(cols[k].as_ref(), i, COLUMNS[k], func);
        // Answers may be left out together (a translation model's source pairs).
        let (answer, wrong) =
            if cols[2].is_none() && cols[3].is_none() { (String::new(), String::new()) } else { (t(2)?, t(3)?) };
        items.push(Pair {
            clean: t(0)?.trim().into(),
            corrupted: t(1)?.trim().into(),
            answer,
            wrong,
            origin: format!("pairs[{i}]"),
            ids: None,
        });
    }
    Ok(Pairs::new("pairs", items))
}

/// A pair given as token ids: prompts as arrays of integers, answers as integers.
fn token_pair(cols: &[Option<Dynamic>], i: usize, func: &str) -> ScriptResult<Pair> {
    let ids = |k: usize| -> ScriptResult<Vec<i64>> {
        let Some(a) = cols[k].as_ref().and_then(|v| v.read_lock::<Array>().map(|a| a.clone())) else {
            return err(format!(
                "{func}: pairs[{i}]: the {} must be an array of token ids when ids are given",
                COLUMNS[k]
            ));
        };
        if a.is_empty() {
            return err(format!("{func}: pairs[{i}]: the {} has no token ids", COLUMNS[k]));
        }
        a.iter()
            .map(|x| {
                x.as_int().ok().filter(|&v| v >= 0).map_or_else(
                    || {
                        err(format!(
                            "{func}: pairs[{i}]: the {} holds {}, not a token id (an integer >= 0)",
                            COLUMNS[k],
                            quote(x)
                        ))
                    },
                    Ok,
                )
            })
            .collect()
    };
    let one = |k: usize| -> ScriptResult<i64> {
        match cols[k].as_ref().map(|v| v.as_int()) {
            Some(Ok(v)) if v >= 0 => Ok(v),
            _ => err(format!(
                "{func}: pairs[{i}]: the {} must be one token id (an integer >= 0) when the prompts are ids",
                COLUMNS[k]
            )),
        }
    };
    let t = PairTokens { clean: ids(0)?, corrupted: ids(1)?, answer: one(2)?, wrong: one(3)? };
    let show = |v: &[i64]| format!("{v:?}");
    Ok(Pair {
        clean: show(&t.clean),
        corrupted: show(&t.corrupted),
        answer: t.answer.to_string(),
        wrong: t.wrong.to_string(),
        origin: format!("pairs[{i}]"),
        ids: Some(t),
    })
}

pub fn describe(p: &Pairs) -> String {
    match p.items.first() {
        Some(first) => format!(
            "<Pairs {}: {} pairs; first: {:?} / {:?} -> {:?} vs {:?}>",
            p.name,
            p.len(),
            first.clean,
            first.corrupted,
            first.answer,
            first.wrong
        ),
        None => format!("<Pairs {}: empty>", p.name),
    }
}

#[export_module]
pub mod api {
    use super::*;

    /// Prompt pairs for activation patching from a TSV file, one pair per line:
    /// `clean<TAB>corrupted<TAB>answer<TAB>wrong` (blank lines and `#` lines skipped; the
    /// answers keep their leading space: `" Mary"` is GPT-2's token for the name after a space).
    /// A line with a missing column is an error naming the file and line.
    ///
    /// ```rhai
    /// let f = temp_path("ioi.tsv");
    /// write_text(f, "When Mary and John went to the store, John gave a drink to\tWhen Mary and John went to the store, Mary gave a drink to\t Mary\t John\n");
    /// let p = pairs(f);
    /// assert(p.len() == 1);
    /// ```
    #[rhai_fn(name = "pairs", return_raw)]
    pub fn pairs_file(path: &str) -> ScriptResult<Pairs> {
        Pairs::tsv(Path::new(path)).or_else(|e| err(format!("pairs: {e}")))
    }

    /// Prompt pairs built in a script: an array of `[clean, corrupted, answer, wrong]` or of
    /// maps `#{clean, corrupted, answer, wrong}` (a translation model's pairs: `[clean,
    /// corrupted]` sources, read over the clean translation); texts, or token ids (prompts as arrays of
    /// ids, answers as ids: used as given, as TransformerLens's token tensors are).
    ///
    /// ```rhai
    /// let p = pairs([["The capital of France is", "The capital of Italy is", " Paris", " Rome"]]);
    /// assert(p.len() == 1);
    /// let q = pairs([#{clean: "a b a", corrupted: "a c a", answer: " b", wrong: " c"}]);
    /// assert(q.len() == 1);
    /// let ids = pairs([#{clean: [5, 17, 42], corrupted: [5, 18, 42], answer: 33, wrong: 44}]);
    /// assert(ids.len() == 1);
    /// ```
    #[rhai_fn(name = "pairs", return_raw)]
    pub fn pairs_array(rows: Array) -> ScriptResult<Pairs> {
        from_array(&rows, "pairs")
    }

    /// The number of pairs.
    ///
    /// ```rhai
    /// assert(pairs([["a b", "a c", " b", " c"], ["x y", "x z", " y", " z"]]).len() == 2);
    /// ```
    #[rhai_fn(name = "len", pure)]
    pub fn len(p: &mut Pairs) -> i64 {
        p.len() as i64
    }

    #[rhai_fn(name = "to_string", pure)]
    pub fn to_string(p: &mut Pairs) -> String {
        describe(p)
    }

    #[rhai_fn(name = "to_debug", pure)]
    pub fn to_debug(p: &mut Pairs) -> String {
        describe(p)
    }
}

pub fn register(engine: &mut Engine) {
    engine.register_type_with_name::<Pairs>("Pairs");
    engine.register_global_module(exported_module!(api).into());
}

pub fn render(v: &Dynamic) -> Option<Output> {
    v.clone().try_cast::<Pairs>().map(|p| Output::text(describe(&p)))
}
