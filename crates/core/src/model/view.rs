//! The model as an analysis sees it: one core type for the model as given, the heads a view
//! closes, its continuous gates and what closed heads carry under mean ablation
//! (docs/methods.md#masking-and-ablation, #mean-ablation). Every verb reads its gates from here
//! and states here what it cannot run on ([`Needs`]); the script layer (`Model` in scripts) and
//! the library API (`api::Model`) only wrap it.

use super::experts::ExpertId;
use super::nn::{ExpertGates, Fills, Gates, Regime, Streaming};
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
    /// Streaming heads (docs/methods.md#streaming-heads): whole key/value groups.
    pub streaming: Option<std::sync::Arc<Streaming>>,
    /// Closed experts (docs/methods.md#experts-as-units).
    pub experts: Option<Rc<ExpertMask>>,
}

/// The experts a view closes, sorted, each checked against the model, and how: routed around,
/// or their output zeroed where chosen.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertMask {
    pub closed: Vec<ExpertId>,
    pub route: bool,
}

/// What closed heads take instead of zero (mean, per-position mean or resample ablation), and
/// where it came from.
pub struct MeanAblation {
    pub fills: Fills,
    /// A fill computed per batch (per-position mean, resample), for the stack's heads.
    pub source: Option<Rc<super::fill::FillSource>>,
    /// "mean", "mean per position" or "resample (seed S)".
    pub mode: String,
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
    /// The model as loaded: neither closed heads nor continuous gates nor streaming heads.
    Unmasked,
    /// No streaming heads (a verb whose computation does not run the one forward).
    NoStreaming,
}

/// One call's target language (`tgt_lang` of a translation analysis): forced first in every
/// translation, greedy target and reference target until this drops, then the model's own again
/// (the model is shared by every view of it; a call runs alone).
pub struct CallLanguage {
    model: Rc<Model>,
    previous: Option<i64>,
}

impl Drop for CallLanguage {
    fn drop(&mut self) {
        self.model.net.forced_bos.set(self.previous)
    }
}

impl View {
    pub fn new(model: Model) -> View {
        View {
            model: Rc::new(model),
            closed: Rc::new(vec![]),
            soft: None,
            ablation: None,
            streaming: None,
            experts: None,
        }
    }

    /// `code` ([`Model::target_language`]) as the target language of one call.
    pub fn call_language(&self, code: &str) -> Result<CallLanguage, ModelError> {
        let id = self.model.target_language(code)?;
        let previous = self.model.net.forced_bos.get();
        self.model.net.forced_bos.set(Some(id));
        Ok(CallLanguage { model: self.model.clone(), previous })
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
            g.source = a.source.clone();
        }
        g.stream = self.streaming.clone();
        if let Some(e) = &self.experts {
            let m = &self.model;
            let layers = m.net.stack.len();
            let width = (0..layers).filter_map(|l| m.experts(l)).map(|x| x.loaded()).max().unwrap_or(0);
            let mut flat = vec![1f32; layers * width];
            for id in &e.closed {
                flat[id.layer * width + id.expert] = 0.0;
            }
            let t = tch::Tensor::from_slice(&flat).view([layers as i64, width as i64]).to_device(m.device());
            g.experts = Some(ExpertGates { kind: m.net.stack_kind, g: t, route: e.route });
        }
        Ok(g)
    }

    /// A view with `experts` closed as well (docs/methods.md#experts-as-units): routed around
    /// (`route`) or their output zeroed where chosen, one way per view. Refused for an expert
    /// the model does not have, and, routing around, where a layer would keep fewer experts
    /// than it routes each token to. Errors start with `func`.
    pub fn closing_experts(&self, experts: &[ExpertId], route: bool, func: &str) -> Result<View, ModelError> {
        let m = &self.model;
        let mut closed = match &self.experts {
            Some(e) if e.route != route => {
                return Err(ModelError::Invalid(format!(
                    "{func}: this view closes experts by {} already: one way per view",
                    if e.route { "routing around them" } else { "zeroing their output" }
                )))
            }
            Some(e) => e.closed.clone(),
            None => vec![],
        };
        for id in experts {
            let Some(x) = m.experts(id.layer) else {
                return Err(ModelError::Invalid(format!("{func}: layer {} of {} has no experts", id.layer, m.name())));
            };
            if !x.ids().contains(&id.expert) {
                return Err(ModelError::Invalid(format!(
                    "{func}: expert {} of layer {} is not one of its experts ({})",
                    id.expert,
                    id.layer,
                    x.describe_ids()
                )));
            }
            closed.push(*id);
        }
        closed.sort();
        closed.dedup();
        if route {
            for l in 0..m.net.stack.len() {
                let Some(x) = m.experts(l) else { continue };
                let left = x.ids().len() - closed.iter().filter(|e| e.layer == l).count();
                if (left as i64) < x.top_k {
                    return Err(ModelError::Invalid(format!(
                        "{func}: routing around them leaves layer {l} {left} experts, fewer than the {} it routes each token to",
                        x.top_k
                    )));
                }
            }
        }
        Ok(View { experts: Some(Rc::new(ExpertMask { closed, route })), ..self.clone() })
    }

    /// A view with the key/value groups of `heads` streaming as well (docs/methods.md#streaming-heads):
    /// naming one query head of a group streams the whole group, whose keys and values the
    /// cache holds once. One setting (`sink`, `recent`, `regime`) per view; errors start with
    /// `func`.
    pub fn streaming(
        &self,
        heads: &[HeadId],
        sink: i64,
        recent: i64,
        regime: Regime,
        func: &str,
    ) -> Result<View, ModelError> {
        let m = &self.model;
        if !m.decoder_only() {
            let what = if m.net.decoder.is_empty() {
                "an encoder: it reads every token at once and keeps no key/value cache"
            } else {
                "an encoder-decoder: streaming heads are offered for decoder-only models"
            };
            return Err(ModelError::Invalid(format!("{func}: {} is {what}", m.name())));
        }
        if sink < 0 {
            return Err(ModelError::Invalid(format!("{func}: sink must be 0 or more, got {sink}")));
        }
        if recent < 1 {
            return Err(ModelError::Invalid(format!("{func}: recent must be 1 or more, got {recent}")));
        }
        if let Regime::Decode { prompt: Some(p) } = regime {
            if p < 1 {
                return Err(ModelError::Invalid(format!("{func}: prompt must be 1 or more tokens, got {p}")));
            }
        }
        let shape = m.kind_shape(super::Kind::Dec)?;
        let mut rows = match &self.streaming {
            Some(s) if (s.sink, s.recent, s.regime) != (sink, recent, regime) => {
                return Err(ModelError::Invalid(format!(
                    "{func}: this view streams with sink {}, recent {}, regime {} already: one setting per view",
                    s.sink,
                    s.recent,
                    regime_name(s.regime)
                )));
            }
            Some(s) => s.heads.clone(),
            None => vec![vec![false; shape.n_heads]; shape.n_layers],
        };
        for h in heads {
            m.check_head(*h)?;
            if let Some(a) = m.mixer(h.kind, h.layer_idx).filter(|a| a.entries(2) <= a.entries(1)) {
                return Err(ModelError::Invalid(format!(
                    "{func}: head {h} is a '{}' head: its state does not grow with the context, so it has no cache to stream; only attention heads stream (docs/methods.md#mixers)",
                    a.kind()
                )));
            }
            for q in self.group_of(*h) {
                rows[h.layer_idx][q] = true;
            }
        }
        Ok(View {
            streaming: Some(std::sync::Arc::new(Streaming { heads: rows, sink, recent, regime })),
            ..self.clone()
        })
    }

    /// The query heads sharing `h`'s keys and values (`h` alone without grouped-query attention),
    /// in the original numbering.
    pub fn group_of(&self, h: HeadId) -> Vec<usize> {
        let per = self.group_size(h.kind, h.layer_idx);
        let g = h.head / per;
        (g * per..(g + 1) * per).collect()
    }

    /// Query heads per key/value group in a layer (1 without grouped-query attention).
    pub fn group_size(&self, kind: super::Kind, layer_idx: usize) -> usize {
        self.model.mixer(kind, layer_idx).map_or(1, |a| a.heads_per_group())
    }

    /// The streaming key/value groups, each named `dec.L.kvG` with its query heads.
    pub fn streaming_groups(&self) -> Vec<(String, Vec<HeadId>)> {
        let Some(s) = &self.streaming else { return vec![] };
        let mut out = Vec::new();
        for (l, row) in s.heads.iter().enumerate() {
            let per = self.group_size(super::Kind::Dec, l);
            for g in 0..row.len() / per {
                if row[g * per] {
                    let heads = (g * per..(g + 1) * per)
                        .map(|h| HeadId { kind: super::Kind::Dec, layer_idx: l, head: h })
                        .collect();
                    out.push((format!("dec.{l}.kv{g}"), heads));
                }
            }
        }
        out
    }

    /// A view with `heads` closed as well (shared weights).
    pub fn closing(&self, heads: &[HeadId]) -> View {
        let mut closed: Vec<HeadId> = self.closed.as_ref().clone();
        closed.extend_from_slice(heads);
        closed.sort();
        closed.dedup();
        View { closed: Rc::new(closed), ..self.clone() }
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
        let closed = !self.closed.is_empty() || self.experts.is_some();
        let soft = self.soft.is_some();
        let streaming = self.streaming.is_some();
        match needs {
            Needs::NoClosed if closed => Err(ModelError::Invalid(format!(
                "{func}: run it on the unmasked model (this view masks heads already)"
            ))),
            Needs::NoSoft if soft => Err(ModelError::Invalid(format!(
                "{func}: train gates on a model without continuous gates (this view has them)"
            ))),
            Needs::Unmasked if closed || soft => Err(ModelError::Invalid(format!(
                "{func}: run it on the unmasked model (this view masks heads already)"
            ))),
            Needs::Unmasked | Needs::NoStreaming if streaming => Err(ModelError::Invalid(format!(
                "{func}: not on a view with streaming heads; run it on the model without `with_streaming`"
            ))),
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
            "experts_closed": self.experts.as_ref().map(|e| serde_json::json!({"experts": e.closed.iter().map(|x| x.to_string()).collect::<Vec<_>>(), "route": e.route})),
            "soft": self.soft.as_ref().map(|s| s.iter().map(|(k, g)| (k.to_string(), serde_json::json!(g))).collect::<serde_json::Map<_, _>>()),
            "ablation": self.ablation.as_ref().map(|a| serde_json::json!({"mode": a.mode, "mean": a.reference, "digest": a.digest})),
            "streaming": self.streaming.as_ref().map(|s| serde_json::json!({"sink": s.sink, "recent": s.recent, "regime": regime_name(s.regime), "prompt": match s.regime { Regime::Decode { prompt } => prompt, Regime::Always => None }, "groups": self.streaming_groups().into_iter().map(|(g, _)| g).collect::<Vec<_>>()})),
        })
    }

    pub fn describe(&self) -> String {
        let mut d = self.model.describe();
        if self.soft.is_some() {
            d = format!("{}, continuous gates>", d.trim_end_matches('>'));
        }
        if let Some(st) = &self.streaming {
            let groups: Vec<String> = self.streaming_groups().into_iter().map(|(g, _)| g).collect();
            d = format!(
                "{}, streaming ({} sink, {} recent, {}): {}>",
                d.trim_end_matches('>'),
                st.sink,
                st.recent,
                regime_name(st.regime),
                groups.join(" ")
            );
        }
        if let Some(e) = &self.experts {
            let names: Vec<String> = e.closed.iter().map(|x| x.to_string()).collect();
            let how = if e.route { "routed around" } else { "output zeroed" };
            d = format!("{}, experts {how}: {}>", d.trim_end_matches('>'), names.join(" "));
        }
        if self.closed.is_empty() {
            d
        } else {
            let heads: Vec<String> = self.closed.iter().map(|h| h.to_string()).collect();
            format!("{}, masked: {}>", d.trim_end_matches('>'), heads.join(" "))
        }
    }
}

/// The script name of a regime (`always`, `decode`).
pub fn regime_name(r: Regime) -> &'static str {
    match r {
        Regime::Always => "always",
        Regime::Decode { .. } => "decode",
    }
}
