//! The `Head` and `AttentionMatrix` script types: one head of a model, and its attention map
//! over one sentence.

use super::ScriptModel;
use crate::model::{AttentionMap, ExcludeKeys, HeadId};
use crate::output::{Output, Render};
use crate::plot::{Plot, PlotKind};
use crate::script::convert::ScriptErr;
use crate::script::convert::{err, quote, ScriptResult};
use rhai::plugin::*;
use rhai::{Array, Map};
use std::rc::Rc;

#[derive(Clone)]
pub struct Head {
    pub model: ScriptModel,
    pub id: HeadId,
}

#[derive(Clone)]
pub struct AttentionMatrix(pub Rc<AttentionMap>);

impl AttentionMatrix {
    pub fn heatmap(&self) -> Result<Plot, crate::plot::PlotError> {
        let m = &self.0;
        let mut p = Plot::new(
            PlotKind::Heatmap {
                values: m.weights.clone(),
                row_labels: m.query_tokens.clone(),
                col_labels: m.key_tokens.clone(),
                show_values: m.weights.len() * m.key_tokens.len() <= 400,
                vmin: Some(0.0),
                vmax: Some(1.0),
            },
            format!("attention of {}", m.head),
        )?;
        p.x_label = "key".into();
        p.y_label = "query".into();
        Ok(p)
    }
}

impl Render for AttentionMatrix {
    fn render(&self) -> Output {
        let text = text_listing(&self.0);
        match self.heatmap() {
            Ok(p) => {
                let mut o = p.render();
                o.text = text;
                o
            }
            Err(_) => Output::text(text),
        }
    }
}

/// Queries listed before the rest are counted (a long text's listing stays a summary).
const LISTED_QUERIES: usize = 40;

/// Each query's top key among the keys the listing keeps (`exclude_keys`), the largest weight
/// on an excluded key (the sink) shown apart in parentheses; a query with no weight on a kept
/// key lists its top key over all of them.
fn text_listing(m: &AttentionMap) -> String {
    let excluded = m.key_excluded.iter().any(|&x| x);
    let mut text = format!("<attention of {}: {} queries x {} keys", m.head, m.query_tokens.len(), m.key_tokens.len());
    if excluded {
        text += &format!(
            "; top keys without {} keys (exclude_keys {:?})",
            if m.exclude_keys == crate::model::ExcludeKeys::Eos { "EOS" } else { "special" },
            m.exclude_keys.to_string()
        );
    }
    text += ">";
    let top = |row: &[f64], keep: &dyn Fn(usize) -> bool| {
        row.iter().enumerate().filter(|(i, _)| keep(*i)).fold(None, |a: Option<(usize, f64)>, (i, &w)| {
            if a.is_none_or(|a| w > a.1) {
                Some((i, w))
            } else {
                a
            }
        })
    };
    // Tokens as a reader writes them (no tokenizer markers), as the heatmap labels them.
    let (queries, keys) = (crate::plot::reader_labels(&m.query_tokens), crate::plot::reader_labels(&m.key_tokens));
    for (n, (q, row)) in queries.iter().zip(&m.weights).enumerate() {
        if n == LISTED_QUERIES && queries.len() > LISTED_QUERIES + 1 {
            text += &format!(
                "\n  ... {} more queries (every weight: a.values[query][key], a.heatmap())",
                queries.len() - n
            );
            break;
        }
        let is_out = |i: usize| m.key_excluded.get(i).copied().unwrap_or(false);
        // A query that cannot see a kept key (the BOS query of a causal model) lists its own top key.
        let Some((k, w)) = top(row, &|i| !is_out(i) && row[i] > 0.0).or_else(|| top(row, &|_| true)) else { continue };
        text += &format!("\n  {q:>12} -> {:<12} {w:.3}", keys[k]);
        if let Some((s, sw)) = top(row, &|i| is_out(i) && i != k) {
            text += &format!("   ({} {sw:.3})", keys[s]);
        }
    }
    text
}

/// The heads a script names, checked against the model: a `Head`, a printed name
/// (`"enc.5.5"`), an array of either, or a table with a `head` column (what `r.top(k)`
/// returns). `func` names the calling function in errors, which quote the bad item.
pub fn head_ids(m: &ScriptModel, v: &Dynamic, func: &str) -> ScriptResult<Vec<HeadId>> {
    let one = |item: &Dynamic, at: &str| -> ScriptResult<HeadId> {
        if let Some(h) = item.clone().try_cast::<Head>() {
            if !Rc::ptr_eq(&h.model.model, &m.model) {
                return err(format!("{func}: {at}head {} belongs to another model", h.id));
            }
            return Ok(h.id);
        }
        if item.is_string() {
            return m.head(&item.to_string(), &format!("{func}: {at}")).script();
        }
        err(format!("{func}: {at}expected a Head or a head name like \"enc.5.5\", got {}", quote(item)))
    };
    if let Some(t) = v.clone().try_cast::<crate::table::Table>() {
        let c =
            t.column_index("head").or_else(|e| err(format!("{func}: a table of heads needs a 'head' column: {e}")))?;
        return t.rows.iter().enumerate().map(|(i, r)| one(&cell_value(&r[c]), &format!("row {i}: "))).collect();
    }
    if let Some(a) = v.clone().try_cast::<Array>() {
        return a.iter().enumerate().map(|(i, h)| one(h, &format!("heads[{i}]: "))).collect();
    }
    Ok(vec![one(v, "")?])
}

/// One head's attention on a sentence under the view's gates: what `h.attention(text)`,
/// `m.attention(head, text)` and the library API's `Model::attention` run.
pub fn attention_of(m: &ScriptModel, id: HeadId, text: &str) -> Result<AttentionMatrix, String> {
    let gates = m.gates().map_err(|e| e.to_string())?;
    let map = m.model.attention_map(text, id, &gates).map_err(|e| format!("attention: {e}"))?;
    // A decoder-only model's listing keeps its BOS sink apart (docs/methods.md#attention-sinks).
    let exclude = if m.model.decoder_only() { ExcludeKeys::Special } else { ExcludeKeys::Nothing };
    Ok(AttentionMatrix(Rc::new(map.listing_without(exclude))))
}

fn cell_value(c: &crate::table::Cell) -> Dynamic {
    use crate::table::Cell;
    match c {
        Cell::Text(s) => Dynamic::from(s.clone()),
        Cell::Int(i) => Dynamic::from(*i),
        Cell::Float(f) => Dynamic::from(*f),
        Cell::Empty => Dynamic::UNIT,
    }
}

#[export_module]
pub mod api {
    use super::*;

    /// The attention kind of a head.
    ///
    /// ```rhai
    /// assert(load_model("enpt").head("cross", 1, 2).kind == "cross");
    /// ```
    #[rhai_fn(get = "kind", pure)]
    pub fn head_kind(h: &mut Head) -> String {
        h.id.kind.to_string()
    }

    /// The layer of a head (zero-based).
    ///
    /// ```rhai
    /// assert(load_model("enpt").head("enc", 4, 2).layer == 4);
    /// ```
    #[rhai_fn(get = "layer", pure)]
    pub fn head_layer(h: &mut Head) -> i64 {
        h.id.layer_idx as i64
    }

    /// The index of a head within its layer (zero-based).
    ///
    /// ```rhai
    /// assert(load_model("enpt").head("enc", 4, 2).index == 2);
    /// ```
    #[rhai_fn(get = "index", pure)]
    pub fn head_index(h: &mut Head) -> i64 {
        h.id.head as i64
    }

    /// This head's attention on a sentence: a query x key matrix with token labels that shows
    /// as a heatmap. For "cross" heads the queries are the model's own translation.
    ///
    /// ```rhai
    /// let a = load_model("minilm").head("enc", 0, 0).attention("The cat sleeps.");
    /// assert(a.keys == ["[CLS]", "the", "cat", "sleeps", ".", "[SEP]"]);
    /// assert(a.values.len() == 6 && a.values[0].len() == 6);
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn attention(h: &mut Head, text: &str) -> ScriptResult<AttentionMatrix> {
        Ok(attention_of(&h.model, h.id, text)?)
    }

    /// A head's attention on a dataset row (its `text`), as a dataset gives it.
    ///
    /// ```rhai
    /// let m = load_model("minilm");
    /// let tb = treebank(asset("pud_en.conllu"));
    /// assert(m.head("enc", 0, 0).attention(tb[0]).keys == m.head("enc", 0, 0).attention(tb[0].text).keys);
    /// ```
    #[rhai_fn(name = "attention", return_raw, pure)]
    pub fn attention_row(h: &mut Head, row: Map) -> ScriptResult<AttentionMatrix> {
        let text = crate::data::script::one_text(&Dynamic::from(row), "attention")?;
        Ok(attention_of(&h.model, h.id, &text)?)
    }

    /// A head's attention on a dataset row (its `text`), the head given as a `Head` or by name.
    ///
    /// ```rhai
    /// let m = load_model("enpt");
    /// let row = #{text: "The cat sleeps."};
    /// assert(m.attention("enc.0.0", row).keys == m.attention("enc.0.0", "The cat sleeps.").keys);
    /// ```
    #[rhai_fn(name = "attention", return_raw, pure)]
    pub fn model_attention_row(m: &mut ScriptModel, head: Dynamic, row: Map) -> ScriptResult<AttentionMatrix> {
        let text = crate::data::script::one_text(&Dynamic::from(row), "attention")?;
        model_attention(m, head, &text)
    }

    /// A head's attention on a sentence, the head given as a `Head` or by name.
    ///
    /// ```rhai
    /// let m = load_model("minilm");
    /// assert(m.attention("enc.0.0", "The cat sleeps.").keys == m.head("enc", 0, 0).attention("The cat sleeps.").keys);
    /// ```
    #[rhai_fn(name = "attention", return_raw, pure)]
    pub fn model_attention(m: &mut ScriptModel, head: Dynamic, text: &str) -> ScriptResult<AttentionMatrix> {
        let ids = head_ids(m, &head, "attention")?;
        let [id] = ids.as_slice() else { return err(format!("attention: expected one head, got {}", ids.len())) };
        Ok(attention_of(m, *id, text)?)
    }

    /// An interactive head view of a sentence (docs/methods.md#head-view): tokens on both sides
    /// with a line per attention weight, a kind, layer and head picker, hover a token to
    /// isolate its lines; every kind the model has (a translation model's source and its own
    /// translation together). Self-contained: nothing is fetched from the network. Shows in
    /// Jupyter; `.to_html(path)` writes the page.
    ///
    /// ```rhai
    /// let v = load_model("enpt").view("The cat sleeps.");
    /// assert(v.to_string().contains("enc 6 layers x 8 heads") && v.to_string().contains("cross"));
    /// ```
    #[rhai_fn(name = "view", return_raw, pure)]
    pub fn view(m: &mut ScriptModel, text: &str) -> ScriptResult<crate::view::HeadView> {
        let gates = m.gates().script()?;
        let maps = m.model.attention_maps(text, &gates).or_else(|e| err(format!("view: {e}")))?;
        let mut kinds = Vec::new();
        for k in maps {
            let (tq, tk) = (k.query_tokens.len(), k.key_tokens.len());
            let width = m.model.kind_shape(k.kind).or_else(|e| err(format!("view: {e}")))?.n_heads;
            let mut attn = Vec::with_capacity(k.layers.len() * width * tq * tk);
            for (l, a) in k.layers.iter().enumerate() {
                let flat = match a {
                    Some(a) => Vec::<f32>::try_from(a.to_kind(tch::Kind::Float).reshape([-1]))
                        .or_else(|e| err(format!("view: {e}")))?,
                    None => vec![],
                };
                let heads: Vec<Vec<f32>> = flat.chunks(tq * tk).map(|c| c.to_vec()).collect();
                for head in m.model.spread_with(k.kind, l, heads, vec![f32::NAN; tq * tk]) {
                    attn.extend(head);
                }
            }
            kinds.push(crate::view::ViewKind {
                name: k.kind.to_string(),
                n_layers: k.layers.len(),
                n_heads: width,
                query_tokens: k.query_tokens,
                key_tokens: k.key_tokens,
                attn,
                scores: None,
            });
        }
        crate::view::HeadView::new(format!("{}: {text}", m.model.name()), kinds).or_else(|e| err(format!("view: {e}")))
    }

    /// The weights, one row per query token; each row sums to 1.
    ///
    /// ```rhai
    /// let a = load_model("minilm").head("enc", 3, 1).attention("Cats sleep.");
    /// let total = 0.0;
    /// for w in a.values[1] { total += w; }
    /// assert(abs(total - 1.0) < 1e-5);
    /// ```
    #[rhai_fn(get = "values", pure)]
    pub fn attn_values(a: &mut AttentionMatrix) -> Array {
        a.0.weights.iter().map(|r| Dynamic::from(r.iter().map(|&w| Dynamic::from(w)).collect::<Array>())).collect()
    }

    /// The query tokens (rows).
    ///
    /// ```rhai
    /// let a = load_model("minilm").head("enc", 0, 0).attention("Hi");
    /// assert(a.queries == a.keys);
    /// ```
    #[rhai_fn(get = "queries", pure)]
    pub fn attn_queries(a: &mut AttentionMatrix) -> Array {
        a.0.query_tokens.iter().map(|t| Dynamic::from(t.clone())).collect()
    }

    /// The key tokens (columns).
    ///
    /// ```rhai
    /// let a = load_model("enpt").head("cross", 1, 0).attention("Hello.");
    /// assert(a.keys[a.keys.len() - 1] == "</s>");
    /// ```
    #[rhai_fn(get = "keys", pure)]
    pub fn attn_keys(a: &mut AttentionMatrix) -> Array {
        a.0.key_tokens.iter().map(|t| Dynamic::from(t.clone())).collect()
    }

    /// The attention matrix as a heatmap plot (queries down, keys across).
    ///
    /// ```rhai
    /// let p = load_model("minilm").head("enc", 1, 3).attention("A dog.").heatmap();
    /// assert(p.to_svg().contains("dog"));
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn heatmap(a: &mut AttentionMatrix) -> ScriptResult<Plot> {
        a.heatmap().or_else(|e| err(e.to_string()))
    }

    /// Writes the weights as an `.npz`, atomically: `weights`, float64 `[queries, keys]`, and
    /// `headscope_metadata` (UTF-8 JSON bytes: the head, the query and key tokens, the key ids,
    /// headscope's version; docs/methods.md#export). numpy: `np.load(path)["weights"]`.
    ///
    /// ```rhai
    /// let a = load_model("minilm").head("enc", 1, 3).attention("A dog.");
    /// let p = temp_path("a.npz");
    /// a.to_npz(p);
    /// assert(file_size(p) > a.queries.len() * a.keys.len() * 8);
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn to_npz(a: &mut AttentionMatrix, path: &str) -> ScriptResult<()> {
        let m = &a.0;
        let mut meta = serde_json::Map::new();
        meta.insert("head".into(), serde_json::json!(m.head.to_string()));
        meta.insert("queries".into(), serde_json::json!(m.query_tokens));
        meta.insert("keys".into(), serde_json::json!(m.key_tokens));
        meta.insert("key_ids".into(), serde_json::json!(m.key_ids));
        let weights = crate::export::NpArray {
            name: "weights".into(),
            shape: vec![m.weights.len(), m.key_tokens.len()],
            values: m.weights.iter().flatten().copied().collect(),
        };
        let bytes = crate::export::npz_bytes(&[weights], &crate::export::provenance(meta))
            .or_else(|e| err(format!("to_npz: {e}")))?;
        crate::export::write(path, &bytes).or_else(|e| err(format!("to_npz: {e}")))
    }

    /// The head's name, as `print(h)` and string interpolation show it.
    ///
    /// ```rhai
    /// let h = load_model("minilm").head("enc", 1, 2);
    /// assert(h.to_string() == "enc.1.2" && `${h}` == "enc.1.2");
    /// ```
    #[rhai_fn(name = "to_string", pure)]
    pub fn head_to_string(h: &mut Head) -> String {
        h.id.to_string()
    }

    /// The head's name, as `debug(h)` and a head inside an array or a map show it.
    ///
    /// ```rhai
    /// let h = load_model("minilm").head("enc", 1, 2);
    /// assert(h.to_debug() == "enc.1.2" && `${[h]}` == "[enc.1.2]");
    /// ```
    #[rhai_fn(name = "to_debug", pure)]
    pub fn head_to_debug(h: &mut Head) -> String {
        h.id.to_string()
    }

    /// Whether two heads are the same head of the same model.
    ///
    /// ```rhai
    /// let m = load_model("enpt");
    /// assert(m.head("enc", 1, 2) == m.heads("enc")[10]);
    /// ```
    #[rhai_fn(name = "==", pure)]
    pub fn head_eq(a: &mut Head, b: Head) -> bool {
        a.id == b.id && Rc::ptr_eq(&a.model.model, &b.model.model)
    }

    /// How the listing was made: `exclude_keys`, the keys left out of each query's top key
    /// ("special" for a decoder-only model, whose BOS sink is shown apart; "none" otherwise).
    /// The weights (`values`, the heatmap) keep every key.
    ///
    /// ```rhai
    /// assert(load_model("smollm2").head("dec", 3, 0).attention("The cat sat.").options.exclude_keys == "special");
    /// assert(load_model("minilm").head("enc", 0, 0).attention("The cat sat.").options.exclude_keys == "none");
    /// ```
    #[rhai_fn(get = "options", pure)]
    pub fn attn_options(a: &mut AttentionMatrix) -> rhai::Map {
        let mut m = rhai::Map::new();
        m.insert("exclude_keys".into(), Dynamic::from(a.0.exclude_keys.to_string()));
        m
    }

    /// The same attention listed under another `exclude_keys` ("eos", "special" or "none"):
    /// `"none"` gives the listing of every key, the BOS sink included.
    ///
    /// ```rhai
    /// let a = load_model("smollm2").head("dec", 3, 0).attention("The cat sat.");
    /// let all = a.with_exclude_keys("none");
    /// assert(all.options.exclude_keys == "none" && all.values == a.values);
    /// assert(a.to_string().contains("exclude_keys") && !all.to_string().contains("exclude_keys"));
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn with_exclude_keys(a: &mut AttentionMatrix, exclude_keys: &str) -> ScriptResult<AttentionMatrix> {
        let e: ExcludeKeys = exclude_keys.parse().or_else(|e: String| err(format!("with_exclude_keys: {e}")))?;
        Ok(AttentionMatrix(Rc::new(a.0.relisted(e))))
    }

    #[rhai_fn(name = "to_string", pure)]
    pub fn attn_to_string(a: &mut AttentionMatrix) -> String {
        a.render().text
    }
}
