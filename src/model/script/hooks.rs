//! The script API of the trace: `run_with_cache` (hook points recorded, in TransformerLens's
//! axes), interventions written as maps, and `hook_points` (the table). Names and axes:
//! docs/methods.md#hook-points.

use super::{tensor_value, ScriptModel};
use crate::model::hooks::{to_tl_axes, At, Intervention, Interventions, Op, Point, POINTS};
use crate::model::{Kind, Model};
use crate::output::Output;
use crate::script::convert::ScriptErr;
use crate::script::convert::{err, opt, quote, OptSpec, Opts, ScriptResult};
use crate::table::{Cell, Table};
use rhai::plugin::*;
use rhai::{Array, Dynamic, Map};
use tch::{Kind as DType, Tensor};

pub const RUN_WITH_CACHE_OPTIONS: &[OptSpec] = &[
    opt("names", "[] (every point)", "hook names (\"enc.blocks.0.attn.hook_z\") or point names (\"hook_pattern\", \"attn.hook_z\") selecting every layer"),
    opt("interventions", "[]", "changes made during the pass: maps #{hook, replace | add | scale, heads, positions}"),
    crate::model::script::TGT_LANG,
];

/// What a list of names selects: whole hook names, or point names at every layer and kind.
struct Selection {
    exact: Vec<At>,
    points: Vec<Point>,
    all: bool,
}

impl Selection {
    fn keeps(&self, at: At) -> bool {
        self.all || self.points.contains(&at.point) || self.exact.contains(&at)
    }
}

fn point_named(name: &str) -> Option<Point> {
    POINTS
        .iter()
        .find(|s| {
            s.name == name || s.name.rsplit_once('.').is_some_and(|(_, last)| last == name) && !name.contains('.')
        })
        .map(|s| s.point)
}

fn selection(model: &Model, func: &str, names: &[String]) -> ScriptResult<Selection> {
    let mut sel = Selection { exact: vec![], points: vec![], all: names.is_empty() };
    for n in names {
        if let Some(p) = point_named(n) {
            sel.points.push(p);
        } else {
            sel.exact.push(model.hook_point(n).or_else(|e| err(format!("{func}: {e}")))?);
        }
    }
    Ok(sel)
}

/// A number or nested arrays of numbers as a float64 tensor (its shape from the nesting).
fn value_tensor(v: &Dynamic, what: &str) -> ScriptResult<Tensor> {
    fn walk(v: &Dynamic, depth: usize, shape: &mut Vec<i64>, flat: &mut Vec<f64>, what: &str) -> ScriptResult<()> {
        if let Some(a) = v.read_lock::<Array>() {
            if shape.len() == depth {
                shape.push(a.len() as i64);
            } else if shape[depth] != a.len() as i64 {
                return err(format!(
                    "{what}: ragged nested arrays (lengths {} and {} at depth {depth})",
                    shape[depth],
                    a.len()
                ));
            }
            for x in a.iter() {
                walk(x, depth + 1, shape, flat, what)?;
            }
            return Ok(());
        }
        if depth < shape.len() {
            return err(format!(
                "{what}: ragged nested arrays (a number where an array was expected at depth {depth})"
            ));
        }
        flat.push(crate::script::convert::to_f64(v, what)?);
        Ok(())
    }
    let (mut shape, mut flat) = (Vec::new(), Vec::new());
    walk(v, 0, &mut shape, &mut flat, what)?;
    Tensor::from_slice(&flat).f_view(shape.as_slice()).or_else(|e| err(format!("{what}: {e}")))
}

fn indices(v: &Dynamic, what: &str) -> ScriptResult<Vec<i64>> {
    let Some(a) = v.read_lock::<Array>() else {
        return match v.as_int() {
            Ok(i) => Ok(vec![i]),
            Err(_) => err(format!("{what}: expected an integer or an array of integers, got {}", quote(v))),
        };
    };
    a.iter().map(|x| x.as_int().or_else(|_| err(format!("{what}: expected integers, got {}", quote(x))))).collect()
}

const INTERVENTION_KEYS: [&str; 7] = ["hook", "replace", "add", "scale", "heads", "positions", "rows"];

/// Interventions from script maps `#{hook, replace | add | scale, heads, positions, rows}`.
pub fn interventions(model: &Model, func: &str, specs: &Dynamic) -> ScriptResult<Interventions> {
    let list: Array = match specs.clone().try_cast::<Array>() {
        Some(a) => a,
        None if specs.is_map() => vec![specs.clone()],
        None => return err(format!("{func}: interventions must be a map or an array of maps, got {}", quote(specs))),
    };
    let mut out = Interventions::default();
    for (i, spec) in list.iter().enumerate() {
        let what = format!("{func}: option 'interventions'[{i}]");
        let Some(m) = spec.read_lock::<Map>() else {
            return err(format!("{what}: expected a map #{{hook, replace | add | scale, ...}}, got {}", quote(spec)));
        };
        if let Some(k) = m.keys().find(|k| !INTERVENTION_KEYS.contains(&k.as_str())) {
            return err(format!("{what}: unknown key '{k}' (valid keys: {})", INTERVENTION_KEYS.join(", ")));
        }
        let hook = match m.get("hook") {
            Some(h) if h.is_string() => h.to_string(),
            Some(h) => return err(format!("{what}: 'hook' must be a hook name, got {}", quote(h))),
            None => {
                return err(format!("{what}: 'hook' is missing (the hook name, e.g. \"enc.blocks.0.attn.hook_z\")"))
            }
        };
        let at = model.hook_point(&hook).or_else(|e| err(format!("{what}: {e}")))?;
        let ops: Vec<&str> = ["replace", "add", "scale"].into_iter().filter(|k| m.contains_key(*k)).collect();
        let op = match ops.as_slice() {
            ["replace"] => Op::Replace(value_tensor(&m["replace"], &format!("{what}: 'replace'"))?),
            ["add"] => Op::Add(value_tensor(&m["add"], &format!("{what}: 'add'"))?),
            ["scale"] => Op::Scale(crate::script::convert::to_f64(&m["scale"], &format!("{what}: 'scale'"))?),
            [] => return err(format!("{what}: give one of 'replace', 'add' or 'scale'")),
            many => return err(format!("{what}: give one of 'replace', 'add' or 'scale', not {}", many.join(" and "))),
        };
        let idx = |k: &str| m.get(k).map(|v| indices(v, &format!("{what}: '{k}'"))).transpose();
        out.list.push(Intervention { at, op, heads: idx("heads")?, positions: idx("positions")?, rows: idx("rows")? });
    }
    Ok(out)
}

/// What `run_with_cache` recorded: each hook point's value in TransformerLens's axes (batch
/// removed), kept as tensors; shown as a summary, read by name (`c["dec.blocks.0.attn.
/// hook_pattern"]`, as nested arrays), so that a whole cache never floods a terminal or a
/// notebook.
#[derive(Clone)]
pub struct Cache {
    /// Shared: a script that copies the cache (`let d = c;`) copies no tensor.
    pub entries: std::rc::Rc<Vec<(At, Tensor)>>,
    /// The kind a name without one means (a model with one stack: TransformerLens's names).
    default_kind: Option<Kind>,
    /// Tokens of the text run (of the source for a translation model).
    tokens: i64,
}

impl Cache {
    fn new(model: &Model, cache: Vec<(At, Tensor)>) -> Cache {
        let default_kind = model.net.decoder.is_empty().then_some(model.net.stack_kind);
        let entries: Vec<(At, Tensor)> = cache.into_iter().map(|(at, t)| (at, to_tl_axes(at.point, &t))).collect();
        // Positions of the first point recorded (the source's, for a translation model that
        // recorded its encoder): `[pos, ...]`, or `[head, q_pos, k_pos]`.
        let tokens = entries.first().map_or(0, |(at, t)| {
            let axis = usize::from(at.point.spec().layout == crate::model::hooks::Layout::Scores);
            t.size().get(axis).copied().unwrap_or(0)
        });
        Cache { entries: std::rc::Rc::new(entries), default_kind, tokens }
    }

    /// The value at hook `name` (a kind may be left out on a model with one stack).
    fn get(&self, func: &str, name: &str) -> ScriptResult<&Tensor> {
        let at = crate::model::hooks::parse_name(name, self.default_kind).or_else(|e| err(format!("{func}: {e}")))?;
        if let Some((_, t)) = self.entries.iter().find(|(a, _)| *a == at) {
            return Ok(t);
        }
        let names: Vec<String> = self.entries.iter().map(|(a, _)| a.to_string()).collect();
        let near = crate::suggest::did_you_mean(&at.to_string(), names.iter().map(String::as_str))
            .map_or(String::new(), |d| format!("{d} "));
        err(format!("{func}: no value at '{at}' ({near}the cache holds {} hook points: c.keys() lists them; run_with_cache(text, names) records only the names given)", names.len()))
    }

    pub fn summary(&self) -> String {
        let mut layers: Vec<(Kind, usize)> = Vec::new();
        for (at, _) in self.entries.iter() {
            if at.point.spec().per_layer {
                match layers.iter_mut().find(|(k, _)| *k == at.kind) {
                    Some((_, n)) => *n = (*n).max(at.layer + 1),
                    None => layers.push((at.kind, at.layer + 1)),
                }
            }
        }
        let layers: Vec<String> = layers.iter().map(|(k, n)| format!("{k} {n} layers")).collect();
        let example = self
            .entries
            .iter()
            .find(|(a, _)| a.point == Point::Pattern)
            .or(self.entries.first())
            .map_or(String::new(), |(a, t)| format!("; c[\"{a}\"] is {:?} {}", t.size(), a.point.spec().axes));
        format!(
            "<cache: {} hook points, {} tokens, {}{example}; c.keys(), c.shape(name), c.to_map()>",
            self.entries.len(),
            self.tokens,
            layers.join(", ")
        )
    }
}

/// A cache renders as its summary.
pub fn render(v: &Dynamic) -> Option<Output> {
    v.read_lock::<Cache>().map(|c| Output::text(c.summary()))
}

pub fn register(engine: &mut rhai::Engine) {
    engine.register_type_with_name::<Cache>("Cache");
    engine.register_global_module(exported_module!(cache_api).into());
}

pub fn run_with_cache(m: &ScriptModel, text: &str, names: &[String], change: Option<&Dynamic>) -> ScriptResult<Cache> {
    const F: &str = "run_with_cache";
    let sel = selection(&m.model, F, names)?;
    let mut iv = match change {
        Some(c) => Some(interventions(&m.model, F, c)?),
        None => None,
    };
    let gates = m.gates().script()?;
    let keep = |at: At| sel.keeps(at);
    let cache = m
        .model
        .run_with_cache(text, &gates, &keep, iv.as_mut().map(|i| i as &mut dyn crate::model::hooks::Hooks))
        .or_else(|e| err(format!("{F}: {e}")))?;
    Ok(Cache::new(&m.model, cache))
}

#[export_module]
pub mod cache_api {
    use super::*;

    /// The value at a hook point, as nested arrays in TransformerLens's axes (batch removed);
    /// on a model with one stack the kind may be left out (`c["blocks.0.attn.hook_pattern"]`).
    ///
    /// ```rhai
    /// let c = load_model("minilm").run_with_cache("The cat sat.");
    /// assert(c["enc.blocks.0.attn.hook_pattern"].len() == 12);
    /// assert(c["blocks.0.attn.hook_pattern"] == c["enc.blocks.0.attn.hook_pattern"]);
    /// ```
    #[rhai_fn(index_get, return_raw, pure)]
    pub fn get(c: &mut Cache, name: &str) -> ScriptResult<Dynamic> {
        tensor_value(&c.get("cache", name)?.to_kind(DType::Double))
    }

    /// The summary (`print(c)`, string interpolation).
    #[rhai_fn(name = "to_string", pure)]
    pub fn to_string(c: &mut Cache) -> String {
        c.summary()
    }

    #[rhai_fn(name = "to_debug", pure)]
    pub fn to_debug(c: &mut Cache) -> String {
        c.summary()
    }

    /// The hook names the cache holds, in the order the forward met them.
    ///
    /// ```rhai
    /// let c = load_model("minilm").run_with_cache("The cat sat.", ["hook_pattern"]);
    /// assert(c.keys().len() == 6 && c.keys()[0] == "enc.blocks.0.attn.hook_pattern");
    /// ```
    #[rhai_fn(pure)]
    pub fn keys(c: &mut Cache) -> Array {
        c.entries.iter().map(|(a, _)| Dynamic::from(a.to_string())).collect()
    }

    /// The number of hook points held.
    ///
    /// ```rhai
    /// assert(load_model("minilm").run_with_cache("The cat sat.", ["hook_z"]).len() == 6);
    /// ```
    #[rhai_fn(pure, name = "len")]
    pub fn len(c: &mut Cache) -> i64 {
        c.entries.len() as i64
    }

    /// Whether the cache holds hook `name` (`"enc.blocks.0.attn.hook_z" in c`).
    ///
    /// ```rhai
    /// let c = load_model("minilm").run_with_cache("The cat sat.", ["hook_z"]);
    /// assert("enc.blocks.0.attn.hook_z" in c && !("enc.blocks.0.attn.hook_q" in c));
    /// ```
    #[rhai_fn(pure)]
    pub fn contains(c: &mut Cache, name: &str) -> bool {
        c.get("contains", name).is_ok()
    }

    /// The shape of the value at `name`, in TransformerLens's axes.
    ///
    /// ```rhai
    /// let c = load_model("minilm").run_with_cache("The cat sat.");
    /// assert(c.shape("enc.blocks.0.attn.hook_z")[1] == 12);
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn shape(c: &mut Cache, name: &str) -> ScriptResult<Array> {
        Ok(c.get("shape", name)?.size().into_iter().map(Dynamic::from).collect())
    }

    /// Every value as a map from hook name to nested arrays (large: the whole cache as
    /// script numbers).
    ///
    /// ```rhai
    /// let c = load_model("minilm").run_with_cache("The cat sat.", ["hook_embed"]);
    /// assert(c.to_map()["enc.hook_embed"] == c["enc.hook_embed"]);
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn to_map(c: &mut Cache) -> ScriptResult<Map> {
        let mut out = Map::new();
        for (at, t) in c.entries.iter() {
            out.insert(at.to_string().into(), tensor_value(&t.to_kind(DType::Double))?);
        }
        Ok(out)
    }
}

#[export_module]
pub mod api {
    use super::*;

    /// Every hook point of one forward pass over `text`, as TransformerLens's `run_with_cache`:
    /// a `Cache` (shown as a summary) whose `c[name]` is nested arrays in TransformerLens's axes, the batch removed
    /// (`[pos, d_model]` for the residual stream, `[pos, head, d_head]` for `hook_q`/`hook_z`,
    /// `[pos, kv_head, d_head]` for `hook_k`/`hook_v`, `[head, q_pos, k_pos]` for
    /// `hook_attn_scores`/`hook_pattern`, `[pos, head, d_model]` for `hook_result`). Names:
    /// `m.hook_points()` and docs/methods.md#hook-points. Translation models add the decoder's
    /// points (`dec.*`, `cross.*`) on their own greedy translation. The view's mask applies.
    ///
    /// ```rhai
    /// let m = load_model("minilm");
    /// let c = m.run_with_cache("The cat sat.");
    /// let p = c["enc.blocks.0.attn.hook_pattern"];
    /// assert(p.len() == 12 && p[0].len() == p[0][0].len());
    /// assert(c["enc.blocks.5.hook_resid_post"][0].len() == 384);
    /// assert(c["enc.blocks.0.attn.hook_z"][0].len() == 12);
    /// ```
    #[rhai_fn(name = "run_with_cache", return_raw, pure)]
    pub fn run_with_cache_all(m: &mut ScriptModel, text: &str) -> ScriptResult<Cache> {
        run_with_cache(m, text, &[], None)
    }

    /// `run_with_cache` keeping only some points: whole hook names, or point names
    /// (`"hook_pattern"`, `"attn.hook_z"`) that select every layer and kind. An unknown name is
    /// an error saying what exists.
    ///
    /// ```rhai
    /// let m = load_model("enpt");
    /// let c = m.run_with_cache("Hello world.", ["hook_pattern"]);
    /// assert(c.keys().len() == 6 + 2 && c["cross.blocks.1.attn.hook_pattern"].len() == 8);
    /// // A Mamba-2 layer's effective attention (docs/methods.md#effective-attention).
    /// let g = load_model("tests/fixtures/tiny_hf/granite_h");
    /// let a = g.run_with_cache("the cat sat on the mat", ["ssm.hook_alpha", "hook_pattern"]);
    /// assert(a["dec.blocks.0.ssm.hook_alpha"].len() == 8 && a["dec.blocks.1.attn.hook_pattern"].len() == 4);
    /// ```
    #[rhai_fn(name = "run_with_cache", return_raw, pure)]
    pub fn run_with_cache_names(m: &mut ScriptModel, text: &str, names: Array) -> ScriptResult<Cache> {
        let names: Vec<String> = names
            .iter()
            .map(|n| {
                if n.is_string() {
                    Ok(n.to_string())
                } else {
                    err(format!("run_with_cache: names must be strings, got {}", quote(n)))
                }
            })
            .collect::<ScriptResult<_>>()?;
        run_with_cache(m, text, &names, None)
    }

    /// `run_with_cache` with options: `names` (as above) and `interventions`, changes made
    /// during the pass so that everything downstream sees them: maps
    /// `#{hook, replace: v | add: v | scale: s, heads: [..], positions: [..]}` (values in the
    /// point's axes without batch, or anything that broadcasts to them; heads and positions
    /// select where the change applies). Replacing a head's `hook_z` by 0 is masking it.
    ///
    /// ```rhai
    /// let m = load_model("minilm");
    /// let zero = #{hook: "enc.blocks.0.attn.hook_z", replace: 0.0, heads: [3]};
    /// let c = m.run_with_cache("The cat sat.", #{names: ["enc.blocks.0.attn.hook_z", "enc.blocks.1.hook_resid_pre"], interventions: [zero]});
    /// assert(c["enc.blocks.0.attn.hook_z"][1][3][0] == 0.0);
    /// let masked = m.with_mask(["enc.0.3"]).run_with_cache("The cat sat.", ["enc.blocks.1.hook_resid_pre"]);
    /// assert(masked["enc.blocks.1.hook_resid_pre"] == c["enc.blocks.1.hook_resid_pre"]);
    /// ```
    #[rhai_fn(name = "run_with_cache", return_raw, pure)]
    pub fn run_with_cache_opts(m: &mut ScriptModel, text: &str, options: Map) -> ScriptResult<Cache> {
        let o = Opts::new(&options, "run_with_cache", RUN_WITH_CACHE_OPTIONS)?;
        let _lang = crate::model::script::call_language(m, &o)?;
        let names = o.labels("names")?.unwrap_or_default();
        run_with_cache(m, text, &names, options.get("interventions").filter(|v| !v.is_unit()))
    }

    /// The model's hook points as a table: name, TransformerLens axes (batch removed) and what
    /// the value is (docs/methods.md#hook-points).
    ///
    /// ```rhai
    /// let t = load_model("enpt").hook_points();
    /// assert(t.column("name").contains("cross.blocks.1.attn.hook_pattern"));
    /// assert(t.column("name")[0] == "enc.hook_embed");
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn hook_points(m: &mut ScriptModel) -> ScriptResult<Table> {
        let mut t = Table::new(vec!["name".into(), "axes".into(), "value".into()]);
        for at in m.model.hook_points() {
            let s = at.point.spec();
            t.push_row(vec![Cell::Text(at.to_string()), Cell::Text(s.axes.into()), Cell::Text(s.doc.into())])
                .or_else(|e| err(e.to_string()))?;
        }
        Ok(t)
    }
}
