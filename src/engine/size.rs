//! What `:vars` reports as a value's size: the bytes of data the value holds, measured from
//! its structure, not from the allocator (so it leaves out allocator slack, libtorch's own
//! caches and the fixed cost of small structs).
//!
//! - A model: its weights, parameters × bytes per element of its dtype (`n_params`); the
//!   tokenizer and the network's small buffers are not counted. Views of one model
//!   (`m.closing(...)`, `let b = a`) share the weights: [`Size::shared`] names the model's
//!   identity so that `:vars` can say which variables share it and count it once.
//! - A pruning result: its model (shared as above), plus the trained weights of `joint: true`.
//! - Numbers in grids, analyses, diversity results, attention matrices and head types: 8 bytes
//!   each; tables: their cells and text; datasets: their texts (the parse trees are not
//!   counted).
//! - A `run_with_cache` cache: its tensors' bytes.
//! - Arrays and maps: the slots of every
//!   element (`size_of::<Dynamic>()`, 16 bytes) and what they hold; strings and blobs their bytes.
//! - Anything else (plots, views, heads, functions): `None`, shown as `-`.

use rhai::Dynamic;

/// A value's measured size.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Size {
    /// Bytes the value holds, shared weights included.
    pub bytes: u64,
    /// The address of the shared model whose weights `bytes` includes (views of one model,
    /// variables holding the same model), and those weights' bytes.
    pub shared: Option<(usize, u64)>,
}

const SLOT: u64 = std::mem::size_of::<Dynamic>() as u64;

fn model_bytes(m: &crate::model::Model) -> u64 {
    (m.n_params.max(0) as u64).saturating_mul(m.opts.dtype.elt_size_in_bytes() as u64)
}

fn grid_bytes(g: &[Vec<f64>]) -> u64 {
    g.iter().map(|r| r.len() as u64 * 8).sum()
}

fn text_bytes(s: &str) -> u64 {
    s.len() as u64
}

/// The size of `v`, or `None` for a type that is not measured.
pub fn of(v: &Dynamic) -> Option<Size> {
    use crate::model::script::ScriptModel;
    let plain = |bytes: u64| Some(Size { bytes, shared: None });
    if let Some(m) = v.read_lock::<ScriptModel>() {
        let w = model_bytes(&m.model);
        return Some(Size { bytes: w, shared: Some((std::rc::Rc::as_ptr(&m.model) as usize, w)) });
    }
    if let Some(p) = v.read_lock::<crate::prune::script::PruneResult>() {
        let w = model_bytes(&p.model.model);
        let trained: u64 = p
            .trained
            .as_ref()
            .map_or(0, |(_, ts)| ts.iter().map(|t| t.numel() as u64 * t.kind().elt_size_in_bytes() as u64).sum());
        let own = p.run.trained.as_ref().map_or(0, model_bytes);
        return Some(Size {
            bytes: w + trained.max(own),
            shared: Some((std::rc::Rc::as_ptr(&p.model.model) as usize, w)),
        });
    }
    if let Some(c) = v.read_lock::<crate::model::script::hooks::Cache>() {
        return plain(c.entries.iter().map(|(_, t)| t.numel() as u64 * t.kind().elt_size_in_bytes() as u64).sum());
    }
    if let Some(g) = v.read_lock::<crate::grid::Grid>() {
        return plain(g.kinds.iter().map(|(_, g)| grid_bytes(g)).sum());
    }
    if let Some(t) = v.read_lock::<crate::analysis::script::HeadTypes>() {
        return plain(t.grids.iter().flat_map(|(_, g)| g.kinds.iter()).map(|(_, g)| grid_bytes(g)).sum());
    }
    if let Some(d) = v.read_lock::<crate::analysis::script::DiversityObj>() {
        let layers = d.0.kinds.iter().flat_map(|(_, ls)| ls.iter());
        return plain(
            layers
                .map(|l| {
                    grid_bytes(&l.query) + grid_bytes(&l.context) + grid_bytes(&l.output) + l.intra.len() as u64 * 8
                })
                .sum(),
        );
    }
    if let Some(a) = v.read_lock::<crate::analysis::script::AnalysisObj>() {
        // Its numbers, counted through the JSON form that holds every one of them.
        fn numbers(v: &serde_json::Value) -> u64 {
            match v {
                serde_json::Value::Number(_) => 8,
                serde_json::Value::String(s) => s.len() as u64,
                serde_json::Value::Array(a) => a.iter().map(numbers).sum(),
                serde_json::Value::Object(o) => o.values().map(numbers).sum(),
                _ => 0,
            }
        }
        return plain(numbers(&a.0.to_json()));
    }
    if let Some(m) = v.read_lock::<crate::model::script::AttentionMatrix>() {
        let tokens: u64 = m.0.query_tokens.iter().chain(&m.0.key_tokens).map(|t| text_bytes(t)).sum();
        return plain(grid_bytes(&m.0.weights) + tokens);
    }
    if let Some(t) = v.read_lock::<crate::table::Table>() {
        let cells: u64 = t
            .rows
            .iter()
            .flatten()
            .map(|c| {
                std::mem::size_of_val(c) as u64 + if let crate::table::Cell::Text(s) = c { text_bytes(s) } else { 0 }
            })
            .sum();
        return plain(cells + t.columns.iter().map(|c| text_bytes(c)).sum::<u64>());
    }
    if let Some(d) = v.read_lock::<crate::data::Dataset>() {
        return plain(d.items.iter().map(|i| text_bytes(&i.text) + i.target.as_deref().map_or(0, text_bytes)).sum());
    }
    if let Some(a) = v.read_lock::<rhai::Array>() {
        return Some(a.iter().fold(Size { bytes: a.len() as u64 * SLOT, shared: None }, |acc, x| add(acc, of(x))));
    }
    if let Some(m) = v.read_lock::<rhai::Map>() {
        return Some(m.iter().fold(Size { bytes: m.len() as u64 * SLOT, shared: None }, |acc, (k, x)| {
            add(Size { bytes: acc.bytes + text_bytes(k), ..acc }, of(x))
        }));
    }
    if let Some(b) = v.read_lock::<rhai::Blob>() {
        return plain(b.len() as u64);
    }
    if v.is_string() {
        return plain(v.read_lock::<rhai::ImmutableString>().map_or(0, |s| text_bytes(&s)));
    }
    if v.is_int() || v.is_float() || v.is_bool() || v.is_char() || v.is_unit() {
        return plain(0);
    }
    None
}

/// An element's size added to a container's; a model inside a container is counted whole.
fn add(acc: Size, x: Option<Size>) -> Size {
    let x = x.unwrap_or_default();
    Size { bytes: acc.bytes + x.bytes, shared: acc.shared.or(x.shared) }
}

/// `1.5 MB`, `512 B`: decimal units, as memory figures in the docs are (the memory budget's
/// own rendering, `budget::human`).
pub fn human(bytes: u64) -> String {
    crate::budget::human(bytes as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containers_count_their_slots_and_contents() {
        let a: rhai::Array = vec![Dynamic::from(1.5_f64), Dynamic::from("abcd")];
        let s = of(&Dynamic::from(a)).unwrap();
        assert_eq!(s.bytes, 2 * SLOT + 4);
        assert_eq!(human(1_500_000), "1.5 MB");
        assert_eq!(human(999), "999 B");
    }
}
