//! Sharded runs (docs/methods.md#shards): a dataset split into `n` deterministic slices, each
//! run anywhere, merged into the result one process would have given.
//!
//! Every per-head statistic headscope computes is a ratio of additive accumulators (sums of
//! attention maxima, offset counts, token losses, BLEU n-gram counts, gradient magnitudes,
//! relevance shares, and their counts). A sharded call keeps them: its result carries, under
//! the echoed option `shard`, a [`Partial`] — the function, which slice, the [`identity`] of
//! the model, data and options, and the accumulators. [`merge`] checks that a set of partials
//! belongs together and covers every slice once; each function's accumulator type (an
//! [`Accumulate`]: `AnalysisAcc`, `SweepAcc`, `LrpAcc`, `ImportanceAcc`, `PatchAcc`,
//! `BleuAcc`) declares how its fields merge, and [`Merged::total`] adds the shards' by that
//! rule; each function's finisher (`engine::merge`) turns the total into its result, the same
//! code a one-process run goes through.
//!
//! A leaf module: plain JSON and serde, no model types.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// Slice `index` of `count` (`"I/N"` on the command line and in scripts, 0 <= I < N).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

impl std::str::FromStr for Shard {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("shard '{s}' is not I/N with 0 <= I < N (e.g. \"0/4\")");
        let (i, n) = s.trim().split_once('/').ok_or_else(bad)?;
        let (index, count): (usize, usize) =
            (i.trim().parse().map_err(|_| bad())?, n.trim().parse().map_err(|_| bad())?);
        if count == 0 || index >= count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl Shard {
    /// The rows of a dataset of `total` sentences this shard takes: contiguous, in order,
    /// `[total * I / N, total * (I + 1) / N)`; the slices of `0/N .. N-1/N` cover every row
    /// once.
    pub fn rows(&self, total: usize) -> Range<usize> {
        let at = |i: usize| ((total as u128 * i as u128) / self.count as u128) as usize;
        at(self.index)..at(self.index + 1)
    }

    /// `NAME.shard-I-of-N.json`, the file a sharded run writes.
    pub fn file_name(&self, name: &str) -> String {
        format!("{name}.shard-{}-of-{}.json", self.index, self.count)
    }
}

/// What a sharded call keeps, and what [`merge`] reads back.
#[derive(Debug, Clone, PartialEq)]
pub struct Partial {
    /// The script function that computed it (`analyze`, `ablation_sweep`, `lrp`,
    /// `head_importance`, `bleu`): its finisher turns merged accumulators into a result.
    pub func: String,
    /// The name shards of one computation share (`analyze-1`: the run's first `analyze`).
    pub name: String,
    pub shard: Shard,
    pub rows: Range<usize>,
    /// Sentences in the whole dataset.
    pub total: usize,
    /// Model, data and options: equal in every shard of a merge.
    pub identity: Value,
    /// The accumulators, as their function's [`Accumulate`] type serialises them.
    pub acc: Value,
}

impl Partial {
    pub fn to_json(&self) -> Value {
        json!({
            "func": self.func, "name": self.name, "index": self.shard.index, "count": self.shard.count,
            "rows": [self.rows.start, self.rows.end], "total": self.total,
            "identity": self.identity, "acc": self.acc,
        })
    }

    /// Reads the `shard` entry of a result (`options.shard`); `source` names it in errors.
    pub fn from_json(v: &Value, source: &str) -> Result<Partial, String> {
        let field = |k: &str| v.get(k).ok_or_else(|| format!("{source}: the shard record has no '{k}'"));
        let num = |k: &str| {
            field(k)?
                .as_u64()
                .map(|x| x as usize)
                .ok_or_else(|| format!("{source}: shard field '{k}' is not a count: {}", v[k]))
        };
        let text = |k: &str| {
            field(k)?
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| format!("{source}: shard field '{k}' is not a string: {}", v[k]))
        };
        let (index, count) = (num("index")?, num("count")?);
        if count == 0 || index >= count {
            return Err(format!("{source}: shard {index}/{count} is not a slice (0 <= index < count)"));
        }
        let rows = field("rows")?
            .as_array()
            .filter(|a| a.len() == 2)
            .and_then(|a| Some(a[0].as_u64()? as usize..a[1].as_u64()? as usize))
            .ok_or_else(|| format!("{source}: shard field 'rows' is not [start, end]: {}", v["rows"]))?;
        Ok(Partial {
            func: text("func")?,
            name: text("name")?,
            shard: Shard { index, count },
            rows,
            total: num("total")?,
            identity: field("identity")?.clone(),
            acc: field("acc")?.clone(),
        })
    }

    /// The shard record of a result's JSON (`{"options": {"shard": ...}}`), if it has one.
    pub fn in_result(result: &Value) -> Option<&Value> {
        result.get("options").and_then(|o| o.get("shard")).filter(|s| s.is_object())
    }
}

/// A complete, consistent set of shards: what they share, and each one's accumulators in shard
/// order, which [`Merged::total`] adds by their type's rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Merged {
    pub func: String,
    pub name: String,
    pub total: usize,
    pub shards: usize,
    pub identity: Value,
    /// `(source, accumulators)` of each shard, in shard order.
    pub accs: Vec<(String, Value)>,
}

impl Merged {
    /// The shards' accumulators read as `A` and added in shard order (so a merge does not
    /// depend on the order files are given in), by `A`'s rule; refused, naming the shard and
    /// the field, when one does not read as `A` or does not fit the others.
    pub fn total<A: Accumulate>(&self) -> Result<A, String> {
        let mut sum: Option<A> = None;
        for (src, v) in &self.accs {
            let a: A = serde_json::from_value(v.clone())
                .map_err(|e| format!("{} ({src}): the accumulators do not read: {e}", self.name))?;
            match sum.as_mut() {
                None => sum = Some(a),
                Some(s) => s
                    .accumulate(a, "acc")
                    .map_err(|e| format!("{} ({src}): the accumulators do not fit: {e}", self.name))?,
            }
        }
        sum.ok_or_else(|| format!("{}: no shards", self.name))
    }
}

/// Accumulators that shards add up: `self += other` by the type's declared rule. Numbers add
/// (counts checked for overflow), [`Max`] keeps the larger, lists add entry by entry and must
/// have one length, maps add key by key (a key one side lacks is taken as it is), options must
/// agree on being present; a struct declares its fields with [`accumulate_fields!`](crate::accumulate_fields), which
/// refuses to compile when a field is left out. `at` names the field in errors.
pub trait Accumulate: Serialize + DeserializeOwned {
    fn accumulate(&mut self, other: Self, at: &str) -> Result<(), String>;
}

/// Implements [`Accumulate`] for a struct field by field: `accumulate_fields!(T { a, b })`. A
/// field left out of the list fails to compile (the destructuring names them all).
#[macro_export]
macro_rules! accumulate_fields {
    ($t:ty { $($f:ident),* $(,)? }) => {
        impl $crate::shard::Accumulate for $t {
            fn accumulate(&mut self, other: Self, at: &str) -> Result<(), String> {
                let Self { $($f),* } = other;
                $( $crate::shard::Accumulate::accumulate(&mut self.$f, $f, &format!("{at}.{}", stringify!($f)))?; )*
                Ok(())
            }
        }
    };
}

impl Accumulate for f64 {
    fn accumulate(&mut self, other: f64, at: &str) -> Result<(), String> {
        *self += other;
        if self.is_finite() || !other.is_finite() {
            Ok(())
        } else {
            Err(format!("{at}: the sum is not finite"))
        }
    }
}

macro_rules! accumulate_count {
    ($($t:ty),*) => {$(
        impl Accumulate for $t {
            fn accumulate(&mut self, other: $t, at: &str) -> Result<(), String> {
                *self = self.checked_add(other).ok_or_else(|| format!("{at}: the count overflows"))?;
                Ok(())
            }
        }
    )*};
}
accumulate_count!(u64, usize);

impl<T: Accumulate> Accumulate for Vec<T> {
    fn accumulate(&mut self, other: Vec<T>, at: &str) -> Result<(), String> {
        if self.len() != other.len() {
            return Err(format!("{at} has {} entries in one shard and {} in another", self.len(), other.len()));
        }
        for (i, (a, b)) in self.iter_mut().zip(other).enumerate() {
            a.accumulate(b, &format!("{at}[{i}]"))?;
        }
        Ok(())
    }
}

impl<T: Accumulate, const N: usize> Accumulate for [T; N]
where
    [T; N]: Serialize + DeserializeOwned,
{
    fn accumulate(&mut self, other: [T; N], at: &str) -> Result<(), String> {
        for (i, (a, b)) in self.iter_mut().zip(other).enumerate() {
            a.accumulate(b, &format!("{at}[{i}]"))?;
        }
        Ok(())
    }
}

impl<T: Accumulate> Accumulate for BTreeMap<String, T> {
    fn accumulate(&mut self, other: BTreeMap<String, T>, at: &str) -> Result<(), String> {
        for (k, b) in other {
            match self.get_mut(&k) {
                Some(a) => a.accumulate(b, &format!("{at}.{k}"))?,
                None => {
                    self.insert(k, b);
                }
            }
        }
        Ok(())
    }
}

impl<T: Accumulate> Accumulate for Option<T> {
    fn accumulate(&mut self, other: Option<T>, at: &str) -> Result<(), String> {
        match (self.as_mut(), other) {
            (Some(a), Some(b)) => a.accumulate(b, at),
            (None, None) => Ok(()),
            (a, _) => Err(format!(
                "{at} is {} in one shard and not in another",
                if a.is_some() { "present" } else { "absent" }
            )),
        }
    }
}

/// A maximum over shards (an error bound, a worst case): merged by `max`.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Max(pub f64);

impl Accumulate for Max {
    fn accumulate(&mut self, other: Max, _at: &str) -> Result<(), String> {
        self.0 = self.0.max(other.0);
        Ok(())
    }
}

/// A sum that may be undefined (NaN, written `null`: a metric with nothing to average): merged
/// by `+`, an undefined side leaves it undefined.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Num(pub f64);

impl Serialize for Num {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.0.is_finite() {
            s.serialize_f64(self.0)
        } else {
            s.serialize_none()
        }
    }
}

impl<'de> Deserialize<'de> for Num {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Num, D::Error> {
        Ok(Num(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN)))
    }
}

impl Accumulate for Num {
    fn accumulate(&mut self, other: Num, _at: &str) -> Result<(), String> {
        self.0 += other.0;
        Ok(())
    }
}

/// A shard record's identity, built here and nowhere else: the model's (`View::identity`: name,
/// family, files, the view's gates), the data's (`data`: name, sentences, digest) and what else
/// the result depends on (`rest`: the echoed options, which heads have a value, an analysis's
/// frame, patching's spec). Shards merge only when their identities are equal.
pub fn identity(model: Value, data: Value, rest: Value) -> Value {
    let mut id = serde_json::Map::new();
    id.insert("model".into(), model);
    id.insert("data".into(), data);
    if let Value::Object(rest) = rest {
        id.extend(rest);
    }
    Value::Object(id)
}

/// The data part of an identity: a dataset's (or a list of lines') name, size and digest.
pub fn data_identity(name: &str, total: usize, digest: &str) -> Value {
    json!({"name": name, "sentences": total, "digest": digest})
}

/// Merges the partials of one computation (each with the file or value it came from):
/// refused, with one line naming the shard and the field, when they differ in function,
/// model, data or options, overlap, or leave a slice missing.
pub fn merge(parts: &[(String, Partial)]) -> Result<Merged, String> {
    let Some((src0, first)) = parts.first() else {
        return Err("nothing to merge: no shard results given".into());
    };
    let mut by_index: HashMap<usize, &str> = HashMap::new();
    for (src, p) in parts {
        let what = format!("{} ({src})", p.name);
        if p.func != first.func {
            return Err(format!(
                "{what} comes from {}, {src0} from {}: shards of different functions",
                p.func, first.func
            ));
        }
        if p.shard.count != first.shard.count {
            return Err(format!(
                "{what} is shard {} but {src0} is shard {}: the shards split the data differently",
                p.shard, first.shard
            ));
        }
        if p.total != first.total {
            return Err(format!(
                "{what} is a shard of {} sentences, {src0} of {}: different data",
                p.total, first.total
            ));
        }
        if let Some((path, mine, theirs)) = first_difference(&p.identity, &first.identity, "") {
            let show = |v: Option<&Value>| v.map_or("nothing".to_string(), short);
            return Err(format!(
                "{what} and {src0} differ in {}: {} vs {}",
                path.trim_start_matches('.'),
                show(mine),
                show(theirs)
            ));
        }
        let want = p.shard.rows(p.total);
        if p.rows != want {
            return Err(format!(
                "{what}: shard {} covers rows {}..{} but that slice is {}..{}",
                p.shard, p.rows.start, p.rows.end, want.start, want.end
            ));
        }
        if let Some(other) = by_index.insert(p.shard.index, src) {
            return Err(format!("shard {} of {} is given twice: {other} and {src}", p.shard, p.name));
        }
    }
    let missing: Vec<String> = (0..first.shard.count)
        .filter(|i| !by_index.contains_key(i))
        .map(|i| format!("{i}/{}", first.shard.count))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "{} is missing shard{} {} (have {} of {})",
            first.name,
            if missing.len() > 1 { "s" } else { "" },
            missing.join(", "),
            by_index.len(),
            first.shard.count
        ));
    }
    let mut sorted: Vec<&(String, Partial)> = parts.iter().collect();
    sorted.sort_by_key(|(_, p)| p.shard.index);
    Ok(Merged {
        func: first.func.clone(),
        name: first.name.clone(),
        total: first.total,
        shards: first.shard.count,
        identity: first.identity.clone(),
        accs: sorted.into_iter().map(|(src, p)| (src.clone(), p.acc.clone())).collect(),
    })
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 80 {
        format!("{}...", s.chars().take(77).collect::<String>())
    } else {
        s
    }
}

/// An option pair of an echo, `[key, value]`.
fn pair(v: &Value) -> Option<(&str, &Value)> {
    match v.as_array().map(|a| a.as_slice()) {
        Some([Value::String(k), v]) => Some((k, v)),
        _ => None,
    }
}

/// The first place where `a` and `b` differ, with the two values there: its path
/// (`.model.name`, `.frame.options.batch_tokens`: echoed `[key, value]` pairs by key; the
/// model and the data are compared first, then the rest in key order).
pub fn first_difference<'a>(
    a: &'a Value,
    b: &'a Value,
    path: &str,
) -> Option<(String, Option<&'a Value>, Option<&'a Value>)> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort_by_key(|k| (!matches!(k.as_str(), "model" | "data") as u8, k.as_str() != "model", k.to_string()));
            keys.dedup();
            keys.into_iter().find_map(|k| match (x.get(k), y.get(k)) {
                (Some(p), Some(q)) => first_difference(p, q, &format!("{path}.{k}")),
                (p, q) => Some((format!("{path}.{k}"), p, q)),
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            x.iter().zip(y).enumerate().find_map(|(i, (p, q))| match (pair(p), pair(q)) {
                (Some((k, v)), Some((l, w))) if k == l => first_difference(v, w, &format!("{path}.{k}")),
                _ => first_difference(p, q, &format!("{path}.[{i}]")),
            })
        }
        _ if a == b => None,
        _ => Some((if path.is_empty() { ".".into() } else { path.to_string() }, Some(a), Some(b))),
    }
}

/// A stable 64-bit FNV-1a digest (hex) of byte strings, each terminated so that `["ab", "c"]`
/// and `["a", "bc"]` differ: the data's identity in a shard record.
pub fn digest<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in p.iter().chain(&[0xff]) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

/// The shard a `headscope run --shard I/N` runs, and where its partials go.
struct RunShard {
    shard: Shard,
    dir: PathBuf,
    calls: HashMap<String, usize>,
}

thread_local! {
    static RUN: RefCell<Option<RunShard>> = const { RefCell::new(None) };
}

/// Makes every dataset-consuming analysis on this thread run on `shard` and write its
/// partial into `dir` (`headscope run --shard I/N --shard-dir DIR`).
pub fn set_run(shard: Shard, dir: PathBuf) {
    RUN.with(|r| *r.borrow_mut() = Some(RunShard { shard, dir, calls: HashMap::new() }));
}

/// The shard of this thread's run, if it is sharded.
pub fn run_shard() -> Option<Shard> {
    RUN.with(|r| r.borrow().as_ref().map(|s| s.shard))
}

/// The name of the next call of `func` in a sharded run: `analyze-1`, `analyze-2`, ... (the
/// same script makes the same calls in every shard, so names match across shards).
pub fn next_name(func: &str) -> String {
    RUN.with(|r| match r.borrow_mut().as_mut() {
        Some(s) => {
            let n = s.calls.entry(func.to_string()).or_insert(0);
            *n += 1;
            format!("{func}-{n}")
        }
        None => func.to_string(),
    })
}

/// Writes a sharded run's result (with its shard record) as `DIR/NAME.shard-I-of-N.json`,
/// atomically; returns the path.
pub fn write_run_result(name: &str, result: &Value) -> Result<PathBuf, String> {
    let Some((shard, dir)) = RUN.with(|r| r.borrow().as_ref().map(|s| (s.shard, s.dir.clone()))) else {
        return Err("internal: not a sharded run".into());
    };
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create the shard directory {}: {e}", dir.display()))?;
    let path = dir.join(shard.file_name(name));
    let text = serde_json::to_string(result).map_err(|e| format!("{}: {e}", path.display()))?;
    crate::files::write_atomic(&path, text.as_bytes()).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(path)
}

/// Shard records by name, each with the file it came from.
pub type Groups = Vec<(String, Vec<(String, Partial)>)>;

/// The shard records found in `paths` (files, or directories whose `*.json` files are read),
/// by name; files without one are skipped and listed in the second value.
pub fn read_partials(paths: &[PathBuf]) -> Result<(Groups, Vec<String>), String> {
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut inside: Vec<PathBuf> = std::fs::read_dir(p)
                .map_err(|e| format!("{}: {e}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.extension().is_some_and(|x| x == "json"))
                .collect();
            inside.sort();
            files.extend(inside);
        } else if p.exists() {
            files.push(p.clone());
        } else {
            return Err(format!("{}: no such file or directory", p.display()));
        }
    }
    let mut groups: Groups = Vec::new();
    let mut skipped = Vec::new();
    for f in files {
        let src = f.display().to_string();
        let text = std::fs::read_to_string(&f).map_err(|e| format!("{src}: {e}"))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| format!("{src}: not JSON: {e}"))?;
        let Some(rec) = Partial::in_result(&v) else {
            skipped.push(src);
            continue;
        };
        let p = Partial::from_json(rec, &src)?;
        match groups.iter_mut().find(|(n, _)| *n == p.name) {
            Some((_, g)) => g.push((src, p)),
            None => groups.push((p.name.clone(), vec![(src, p)])),
        }
    }
    Ok((groups, skipped))
}

/// `OUT/NAME.json`.
pub fn merged_path(out: &Path, name: &str) -> PathBuf {
    out.join(format!("{name}.json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(i: usize, n: usize, total: usize, acc: Value) -> (String, Partial) {
        let s = Shard { index: i, count: n };
        (
            format!("s{i}.json"),
            Partial {
                func: "f".into(),
                name: "f-1".into(),
                shard: s,
                rows: s.rows(total),
                total,
                identity: json!({"model": "m", "options": {"metric": "loss"}}),
                acc,
            },
        )
    }

    #[test]
    fn slices_cover_every_row_once() {
        for total in [0, 1, 5, 7, 100, 1001] {
            for n in 1..=9 {
                let mut next = 0;
                for i in 0..n {
                    let r = Shard { index: i, count: n }.rows(total);
                    assert_eq!(r.start, next);
                    next = r.end;
                }
                assert_eq!(next, total);
            }
        }
        assert_eq!("2/7".parse::<Shard>().unwrap(), Shard { index: 2, count: 7 });
        for bad in ["7/7", "1/0", "a/3", "3", "-1/2"] {
            assert!(bad.parse::<Shard>().unwrap_err().contains(bad), "{bad}");
        }
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Acc {
        n: u64,
        x: Vec<f64>,
        max_err: Max,
        m: BTreeMap<String, u64>,
        b: Option<[u64; 2]>,
        u: Num,
    }
    crate::accumulate_fields!(Acc { n, x, max_err, m, b, u });

    #[test]
    fn sums_counts_maxima_and_maps_by_the_declared_rule() {
        let parts = vec![
            part(0, 2, 10, json!({"n": 3, "x": [1.5, 2.0], "max_err": 0.1, "m": {"-1": 2}, "b": [1, 2], "u": null})),
            part(
                1,
                2,
                10,
                json!({"n": 4, "x": [0.25, 1.0], "max_err": 0.3, "m": {"-1": 1, "2": 5}, "b": [3, 4], "u": 2.0}),
            ),
        ];
        let m = merge(&parts).unwrap();
        let total: Acc = m.total().unwrap();
        let want = json!({"n": 7, "x": [1.75, 3.0], "max_err": 0.3, "m": {"-1": 3, "2": 5}, "b": [4, 6], "u": null});
        assert_eq!(serde_json::to_value(&total).unwrap(), want);
        assert!(total.u.0.is_nan());
        // The order the shards are given in changes nothing.
        let rev: Vec<_> = parts.iter().rev().cloned().collect();
        assert_eq!(merge(&rev).unwrap(), m);
        // What does not fit is refused naming the shard and the field.
        let short = vec![
            parts[0].clone(),
            part(1, 2, 10, json!({"n": 1, "x": [1.0], "max_err": 0.0, "m": {}, "b": null, "u": 0.0})),
        ];
        let e = merge(&short).unwrap().total::<Acc>().unwrap_err();
        assert!(
            e.contains("f-1 (s1.json): the accumulators do not fit: acc.x has 2 entries in one shard and 1 in another"),
            "{e}"
        );
        let absent = vec![
            parts[0].clone(),
            part(1, 2, 10, json!({"n": 1, "x": [1.0, 1.0], "max_err": 0.0, "m": {}, "b": null, "u": 0.0})),
        ];
        let e = merge(&absent).unwrap().total::<Acc>().unwrap_err();
        assert!(e.contains("acc.b is present in one shard and not in another"), "{e}");
        let over = vec![
            part(0, 2, 10, json!({"n": u64::MAX, "x": [], "max_err": 0.0, "m": {}, "b": null, "u": 0.0})),
            part(1, 2, 10, json!({"n": 1, "x": [], "max_err": 0.0, "m": {}, "b": null, "u": 0.0})),
        ];
        assert!(merge(&over).unwrap().total::<Acc>().unwrap_err().contains("acc.n: the count overflows"));
    }

    #[test]
    fn bad_merges_are_refused_naming_the_shard_and_field() {
        let ok = |i| part(i, 3, 9, json!({"n": 1}));
        let e = merge(&[ok(0), ok(2)]).unwrap_err();
        assert!(e.contains("missing shard 1/3"), "{e}");
        let e = merge(&[ok(0), ok(1), ok(1), ok(2)]).unwrap_err();
        assert!(e.contains("shard 1/3 of f-1 is given twice: s1.json and s1.json"), "{e}");
        let mut other = ok(1);
        other.1.identity["options"]["metric"] = json!("kl");
        let e = merge(&[ok(0), other, ok(2)]).unwrap_err();
        assert!(e.contains("differ in options.metric: \"kl\" vs \"loss\""), "{e}");
        let (path, _, _) = first_difference(
            &json!({"o": [["a", 1], ["b", 2]], "model": "x"}),
            &json!({"o": [["a", 1], ["b", 3]], "model": "y"}),
            "",
        )
        .unwrap();
        assert_eq!(path, ".model");
        assert_eq!(
            first_difference(&json!({"o": [["a", 1], ["b", 2]]}), &json!({"o": [["a", 1], ["b", 3]]}), "").unwrap().0,
            ".o.b"
        );
        let mut four = part(1, 4, 9, json!({"n": 1}));
        four.0 = "x.json".into();
        let e = merge(&[ok(0), four]).unwrap_err();
        assert!(e.contains("is shard 1/4 but s0.json is shard 0/3"), "{e}");
        let mut shifted = ok(1);
        shifted.1.rows = 2..6;
        assert!(merge(&[ok(0), shifted, ok(2)]).unwrap_err().contains("covers rows 2..6 but that slice is 3..6"));
        let e = merge(&[ok(0), part(1, 3, 9, json!({"n": [1]})), ok(2)])
            .unwrap()
            .total::<BTreeMap<String, u64>>()
            .unwrap_err();
        assert!(e.contains("f-1 (s1.json): the accumulators do not read"), "{e}");
        assert!(merge(&[]).is_err());
    }

    #[test]
    fn digest_separates_parts() {
        assert_ne!(digest([b"ab".as_slice(), b"c"]), digest([b"a".as_slice(), b"bc"]));
        assert_eq!(digest([b"x".as_slice()]), digest([b"x".as_slice()]));
    }
}
