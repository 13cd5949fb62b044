//! What the per-head grid functions share to run sharded (docs/methods.md#shards): a shard
//! record's identity says which heads have a value, and each function's finisher reads its
//! grid back from merged accumulators through [`grid_from`].

use crate::model::{Kind, KindGrids};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Per kind, `[layer][head]`: whether a head has a value.
pub type HeadMask = Vec<(Kind, Vec<Vec<bool>>)>;

/// Per kind, in order, which heads have a value (`[layer][head]`): the identity part every
/// grid finisher reads.
pub fn valid_heads(kinds: &[(Kind, Vec<Vec<bool>>)]) -> Value {
    Value::Array(kinds.iter().map(|(k, v)| json!({"kind": k.to_string(), "valid": v})).collect())
}

/// Heads present in the model (not removed by prune_heads), per kind.
pub fn present_heads(m: &crate::model::Model, kinds: &[Kind]) -> HeadMask {
    kinds
        .iter()
        .filter_map(|&k| {
            let s = m.kind_shape(k).ok()?;
            Some((k, (0..s.n_layers).map(|l| (0..s.n_heads).map(|h| m.present(k, l).contains(&h)).collect()).collect()))
        })
        .collect()
}

/// [`valid_heads`] read back from an identity.
pub fn valid_of(identity: &Value) -> Result<HeadMask, String> {
    let heads = identity["heads"].as_array().ok_or("the shard record's identity lists no heads")?;
    heads
        .iter()
        .map(|k| {
            let name = k["kind"].as_str().ok_or("a kind without a name in the shard record")?;
            let rows = k["valid"].as_array().ok_or_else(|| format!("kind {name} without heads in the shard record"))?;
            let grid = rows
                .iter()
                .enumerate()
                .map(|(l, row)| {
                    row.as_array()
                        .map(|r| r.iter().map(|v| v.as_bool() == Some(true)).collect())
                        .ok_or_else(|| format!("kind {name} layer {l}: not a list of heads"))
                })
                .collect::<Result<_, String>>()?;
            Ok((name.parse::<Kind>()?, grid))
        })
        .collect()
}

/// The grids of a finished computation: `value(kind, layer, head)` for each valid head of
/// `identity.heads`, NaN for the others.
pub fn grid_from(
    identity: &Value,
    value: impl Fn(&str, usize, usize) -> Result<f64, String>,
) -> Result<KindGrids, String> {
    valid_of(identity)?
        .into_iter()
        .map(|(kind, valid)| {
            let name = kind.to_string();
            let grid = valid
                .iter()
                .enumerate()
                .map(|(l, row)| {
                    row.iter()
                        .enumerate()
                        .map(|(h, &ok)| if ok { value(&name, l, h) } else { Ok(f64::NAN) })
                        .collect::<Result<Vec<f64>, String>>()
                })
                .collect::<Result<_, _>>()?;
            Ok((kind, grid))
        })
        .collect()
}

/// An echo (options in order) from its JSON form, `[[key, value], ...]`.
pub fn echo_of(v: &Value) -> crate::output::Echo {
    v.as_array()
        .map(|a| a.iter().filter_map(|p| Some((p.get(0)?.as_str()?.to_string(), p.get(1)?.clone()))).collect())
        .unwrap_or_default()
}

/// A head's accumulator in by-kind-name `[layer][head]` grids.
pub fn cell<T: Clone>(grids: &BTreeMap<String, Vec<Vec<T>>>, kind: &str, l: usize, h: usize) -> Result<T, String> {
    grids
        .get(kind)
        .and_then(|g| g.get(l))
        .and_then(|row| row.get(h))
        .cloned()
        .ok_or_else(|| format!("the accumulators have no value for {kind}.{l}.{h}"))
}
