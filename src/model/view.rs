//! The model as an analysis sees it: one core type for the model as given, the heads a view
//! closes, its continuous gates and what closed heads carry under mean ablation
//! (docs/methods.md#masking-and-ablation, #mean-ablation). Every verb reads its gates from here
//! and states here what it cannot run on ([`Needs`]); the script layer (`Model` in scripts) and
//! the library API (`api::Model`) only wrap it.

use super::nn::{Fills, Gates};
use super::{HeadId, KindGrids, Model, ModelError};
use std::rc::Rc;

/// A view of a model: shared weights plus what this view changes. Cheap to clone.
#[derive(Clone)]
pub struct View {
    pub model: Rc<Model>,
    /// Closed heads, sorted, each checked against the model.
    pub closed: Rc<Vec<HeadId>>,
    /// Continuous gates (a pruning result's `eval_gates: "continuous"`), multiplied into the
    /// mask: per kind `[layers, heads]`.
    pub soft: Option<Rc<KindGrids>>,
    /// Mean ablation: what closed heads carry instead of zero.
    pub ablation: Option<Rc<MeanAblation>>,
}

/// The reference means closed heads take under mean ablation, and where they came from.
pub struct MeanAblation {
    pub fills: Fills,
    /// The reference dataset's name and digest.
    pub reference: String,
    pub digest: String,
}

/// What a verb cannot run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// No closed heads (sweeps close each head themselves; diversity compares open heads).
    NoClosed,
    /// No continuous gates (training gates starts from the model without any).
    NoSoft,
    /// The model as loaded: neither closed heads nor continuous gates.
    Unmasked,
}

impl View {
    pub fn new(model: Model) -> View {
        View { model: Rc::new(model), closed: Rc::new(vec![]), soft: None, ablation: None }
    }

    /// The gates of this view: its closed heads (filled with the reference means under mean
    /// ablation) times its continuous gates.
    pub fn gates(&self) -> Result<Gates, ModelError> {
        let mut g = self.model.gates_closing(&self.closed)?;
        for (kind, values) in self.soft.iter().flat_map(|s| s.iter()) {
            let (l, h) = (values.len() as i64, values.first().map_or(0, |r| r.len()) as i64);
            let flat: Vec<f32> = values.iter().flatten().map(|&v| v as f32).collect();
            g.multiply(*kind, tch::Tensor::from_slice(&flat).view([1, l, h]).to_device(self.model.device()));
        }
        if let Some(a) = &self.ablation {
            g.fill = a.fills.share();
        }
        Ok(g)
    }

    /// A view with `heads` closed as well (shared weights).
    pub fn closing(&self, heads: &[HeadId]) -> View {
        let mut closed: Vec<HeadId> = self.closed.as_ref().clone();
        closed.extend_from_slice(heads);
        closed.sort();
        closed.dedup();
        View { model: self.model.clone(), closed: Rc::new(closed), soft: self.soft.clone(), ablation: self.ablation.clone() }
    }

    /// A head by its printed name (`"enc.2.5"`), checked against the model; an error starts
    /// with `context` (the function called and where the name stood: `"with_mask: heads[2]: "`).
    pub fn head(&self, name: &str, context: &str) -> Result<HeadId, ModelError> {
        let id: HeadId = name.parse().map_err(|e: String| ModelError::Invalid(format!("{context}{e}")))?;
        self.model.check_head(id).map_err(|e| ModelError::Invalid(format!("{context}{e}")))?;
        Ok(id)
    }

    /// Refuses `func` on a view it cannot run on, in one line naming the function.
    pub fn require(&self, func: &str, needs: Needs) -> Result<(), ModelError> {
        let closed = !self.closed.is_empty();
        let soft = self.soft.is_some();
        match needs {
            Needs::NoClosed if closed => Err(ModelError::Invalid(format!("{func}: run it on the unmasked model (this view masks heads already)"))),
            Needs::NoSoft if soft => Err(ModelError::Invalid(format!("{func}: train gates on a model without continuous gates (this view has them)"))),
            Needs::Unmasked if closed || soft => Err(ModelError::Invalid(format!("{func}: run it on the unmasked model (this view masks heads already)"))),
            _ => Ok(()),
        }
    }

    /// The model as a shard record names it (docs/methods.md#shards): checkpoint, precision,
    /// the heads each layer holds, the heads this view closes, its continuous gates and mean
    /// ablation's reference.
    pub fn identity(&self) -> serde_json::Value {
        let m = &self.model;
        serde_json::json!({
            "name": m.name(),
            "dtype": format!("{:?}", m.opts.dtype),
            "kinds": m.kinds().iter().map(|s| serde_json::json!({"kind": s.kind.to_string(), "layers": s.n_layers, "heads": s.n_heads, "present": (0..s.n_layers).map(|l| m.present(s.kind, l)).collect::<Vec<_>>()})).collect::<Vec<_>>(),
            "closed": self.closed.iter().map(|h| h.to_string()).collect::<Vec<_>>(),
            "soft": self.soft.as_ref().map(|s| s.iter().map(|(k, g)| (k.to_string(), serde_json::json!(g))).collect::<serde_json::Map<_, _>>()),
            "ablation": self.ablation.as_ref().map(|a| serde_json::json!({"mean": a.reference, "digest": a.digest})),
        })
    }

    pub fn describe(&self) -> String {
        let mut d = self.model.describe();
        if self.soft.is_some() {
            d = format!("{}, continuous gates>", d.trim_end_matches('>'));
        }
        if self.closed.is_empty() {
            d
        } else {
            let heads: Vec<String> = self.closed.iter().map(|h| h.to_string()).collect();
            format!("{}, masked: {}>", d.trim_end_matches('>'), heads.join(" "))
        }
    }
}
