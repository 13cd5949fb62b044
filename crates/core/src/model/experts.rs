//! A mixture of experts as an MLP kind ([`super::mlp`]): a router picks `top_k` of `n` gated
//! MLPs per token and sums their outputs weighted by the router's probabilities, as
//! transformers' Mixtral, OLMoE and Qwen2/3-MoE blocks compute it (docs/methods.md#experts):
//! `p = softmax(x W_router)` (in float32, float64 for a float64 model), the `top_k` largest
//! (renormalised to sum to 1 where the family does: Mixtral, `norm_topk_prob`), each chosen
//! expert's `down(silu(gate x) * up x)` times its weight, added in expert order; Qwen2-MoE adds
//! a shared expert behind a sigmoid gate. Without a capacity limit each token is routed alone,
//! so the block is position-wise.
//!
//! gpt-oss routes otherwise (the softmax of the `top_k` largest logits, a router with a bias)
//! and its experts are clamped SwiGLUs with biases ([`Expert::Clamped`]).
//!
//! Hook points: `mlp.hook_router_logits` (`[pos, expert]`), `mlp.hook_router_weights` (each
//! expert's weight per token, zero where it is not chosen: a replacement reroutes, an expert
//! whose weight is zero is not run), `mlp.hook_expert_out` (`[pos, expert, d_model]`: each
//! expert's weighted output, built only where a hook looks; a replacement's sum over experts
//! becomes the routed output), `mlp.hook_shared_out` (a shared expert's gated output), then
//! `hook_mlp_out`.

use super::hooks::{self, At, GradRules, HookSlot, Point, Rules};
use super::mixer::Inside;
use super::mlp::Mlp;
use super::nn::{divide_gradient, identity_rule, Ffn, Linear, Params};
use super::{Kind, ModelError};
use tch::{Kind as DType, Tensor};

/// One expert: `expert` (its number as loaded) of stack layer `layer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ExpertId {
    pub layer: usize,
    pub expert: usize,
}

impl std::fmt::Display for ExpertId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.e{}", self.layer, self.expert)
    }
}

/// One layer's expert gates in a run (`super::nn::ExpertGates`): `g [width]` in the experts'
/// numbering as loaded, and how a closed expert is ablated.
pub struct ExpertGate {
    pub g: Tensor,
    /// Routed around (a gate of 0 sets the expert's router logit to minus infinity), else the
    /// gate multiplies its router weight (0: its output zeroed where it was chosen).
    pub route: bool,
}

impl ExpertGate {
    /// The gate on `device`.
    pub fn on(self, device: tch::Device) -> Result<ExpertGate, ModelError> {
        Ok(ExpertGate { g: self.g.f_to_device(device)?, route: self.route })
    }
}

/// One expert.
pub enum Expert {
    /// `down(silu(gate x) * up x)` (Mixtral, OLMoE, Qwen).
    SwiGlu(Ffn),
    /// gpt-oss's: `g = min(gate x, limit)`, `u = clamp(up x, -limit, limit)`,
    /// `down((u + 1) * g * sigmoid(alpha g))`, every projection with a bias.
    Clamped { gate: Linear, up: Linear, down: Linear, alpha: f64, limit: f64 },
}

impl Expert {
    /// The expert over `x`, its SwiGLU under the run's gradient `rules` (AttnLRP's rules on
    /// the activation and the product, docs/methods.md#attnlrp).
    fn forward(&self, x: &Tensor, kind: Kind, layer: usize, rules: GradRules) -> Result<Tensor, ModelError> {
        match self {
            Expert::SwiGlu(f) => {
                let mut r = Rules(rules);
                Ok(f.forward_hooked(x, kind, layer, &mut Some(&mut r))?.2)
            }
            Expert::Clamped { gate, up, down, alpha, limit } => {
                let g = gate.forward(x).f_clamp_max(*limit)?;
                let u = up.forward(x).f_clamp(-limit, *limit)?;
                let glu = g.f_mul(&g.f_mul_scalar(*alpha)?.f_sigmoid()?)?;
                let hidden = if rules == GradRules::AttnLrp {
                    // AttnLRP (docs/methods.md#experts): the activation's identity rule, the
                    // uniform rule on the product (the clamps pass no gradient where they bite).
                    divide_gradient(&u.f_add_scalar(1.0)?.f_mul(&identity_rule(&glu, &g))?, 2.0)
                } else {
                    u.f_add_scalar(1.0)?.f_mul(&glu)?
                };
                Ok(down.forward(&hidden))
            }
        }
    }

    fn params_mut<'a>(&'a mut self, prefix: &str, out: &mut Params<'a>) {
        match self {
            Expert::SwiGlu(f) => f.params_mut(prefix, out),
            Expert::Clamped { gate, up, down, .. } => {
                up.params_mut(prefix, "in", out);
                down.params_mut(prefix, "out", out);
                gate.params_mut(prefix, "gate", out);
            }
        }
    }

    fn width(&self) -> i64 {
        match self {
            Expert::SwiGlu(f) => f.up.w.size()[0],
            Expert::Clamped { up, .. } => up.w.size()[0],
        }
    }
}

/// How the router's logits become each token's expert weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Routing {
    /// `softmax` over every expert, the `top_k` largest kept (divided by their sum where
    /// `renormalise`: Mixtral, `norm_topk_prob`).
    Softmax { renormalise: bool },
    /// gpt-oss: the `top_k` largest logits, then the softmax over them alone.
    TopKSoftmax,
    /// Llama 4: the `top_k` largest logits, each one's sigmoid its weight (not renormalised).
    TopKSigmoid,
    /// DeepSeek: each expert's score is the `softmax` of the logits (V2) or their `sigmoid`
    /// (V3); the experts as loaded fall into `groups` equal groups, and the `top_groups` groups
    /// with the highest group score (V2: their best expert's score; V3, `top2_sum`: the sum of
    /// their two best, after the choice bias) hold the candidates; the `top_k` candidates with
    /// the highest score (plus the choice bias, `Experts::choice_bias`) are chosen, with their
    /// scores as weights, divided by their sum (plus 1e-20) where `renormalise`, times `scale`
    /// (`routed_scaling_factor`). V2's greedy routing is one group.
    Grouped { sigmoid: bool, groups: i64, top_groups: i64, top2_sum: bool, renormalise: bool, scale: f64 },
}

/// The experts of one layer and their router.
pub struct Experts {
    /// `[n_experts, d_model]` (a bias in gpt-oss).
    pub router: Linear,
    /// The experts, in the router's order.
    pub experts: Vec<Expert>,
    /// Experts chosen per token.
    pub top_k: i64,
    pub routing: Routing,
    /// Qwen2-MoE's shared expert, added to every token, and its sigmoid gate `[1, d_model]`.
    pub shared: Option<(Ffn, Option<Linear>)>,
    /// DeepSeek-V3's `e_score_correction_bias` `[n]`: added to the scores for choosing only
    /// (not to the weights).
    pub choice_bias: Option<Tensor>,
    /// Llama 4: each chosen expert reads its input times its weight (`expert(w x)`), instead of
    /// its output being weighted (`w expert(x)`).
    pub input_scaled: bool,
    /// Each expert's number as loaded (`experts[i]` is expert `ids[i]`): `prune_experts` keeps
    /// the numbers of those it keeps, as `prune_heads` does heads'.
    ids: Vec<usize>,
    /// How many experts the layer had as loaded.
    loaded: usize,
}

impl Experts {
    /// A layer's experts as loaded, numbered `0..experts.len()`.
    pub fn new(
        router: Linear,
        experts: Vec<Expert>,
        top_k: i64,
        routing: Routing,
        shared: Option<(Ffn, Option<Linear>)>,
    ) -> Experts {
        let ids = (0..experts.len()).collect();
        let loaded = experts.len();
        Experts { router, experts, top_k, routing, shared, choice_bias: None, input_scaled: false, ids, loaded }
    }

    /// Weights on the experts' inputs (Llama 4), not their outputs.
    pub fn with_input_scaled(mut self, input_scaled: bool) -> Experts {
        self.input_scaled = input_scaled;
        self
    }

    /// The bias added to the scores for choosing (DeepSeek-V3's `e_score_correction_bias`).
    pub fn with_choice_bias(mut self, bias: Option<Tensor>) -> Experts {
        self.choice_bias = bias;
        self
    }

    /// The experts' numbers as loaded, in the router's order.
    pub fn ids(&self) -> &[usize] {
        &self.ids
    }

    /// How many experts the layer had as loaded.
    pub fn loaded(&self) -> usize {
        self.loaded
    }

    /// Removes the experts numbered `drop` (numbers as loaded) and their router rows: the
    /// router then picks among the others, renormalised as the family routes, which is what
    /// routing around them computes (docs/methods.md#experts-as-units). Refused where fewer
    /// than `top_k` would be left, or a number is not one of the layer's.
    pub fn remove(&mut self, drop: &[usize], layer: usize) -> Result<(), ModelError> {
        if let Some(e) = drop.iter().find(|e| !self.ids.contains(e)) {
            return Err(ModelError::Invalid(format!(
                "expert {e} of layer {layer} is not one of its experts ({})",
                self.describe_ids()
            )));
        }
        let keep: Vec<usize> = (0..self.ids.len()).filter(|&i| !drop.contains(&self.ids[i])).collect();
        if (keep.len() as i64) < self.top_k {
            return Err(ModelError::Invalid(format!(
                "layer {layer} would keep {} experts, fewer than the {} it routes each token to",
                keep.len(),
                self.top_k
            )));
        }
        let rows =
            Tensor::from_slice(&keep.iter().map(|&i| i as i64).collect::<Vec<_>>()).to_device(self.router.w.device());
        self.router.w = self.router.w.f_index_select(0, &rows)?;
        if let Some(b) = &self.router.b {
            self.router.b = Some(b.f_index_select(0, &rows)?);
        }
        if let Some(b) = &self.choice_bias {
            self.choice_bias = Some(b.f_index_select(0, &rows.f_to_device(b.device())?)?);
        }
        let mut old: Vec<Option<Expert>> = std::mem::take(&mut self.experts).into_iter().map(Some).collect();
        self.experts = keep.iter().filter_map(|&i| old[i].take()).collect();
        self.ids = keep.iter().map(|&i| self.ids[i]).collect();
        Ok(())
    }

    /// Whether `prune_experts` removed some of the layer's experts (their numbers are then not
    /// `0..loaded`).
    fn pruned(&self) -> bool {
        self.ids.len() != self.loaded || self.ids.iter().enumerate().any(|(i, &e)| i != e)
    }

    /// The experts' numbers as loaded, as an index tensor on `device`.
    fn ids_on(&self, device: tch::Device) -> Tensor {
        Tensor::from_slice(&self.ids.iter().map(|&e| e as i64).collect::<Vec<_>>()).to_device(device)
    }

    /// The experts' numbers, for messages (`0..8`, or the list after pruning).
    pub fn describe_ids(&self) -> String {
        if self.ids.iter().enumerate().all(|(i, &e)| i == e) {
            format!("0..{}", self.ids.len().saturating_sub(1))
        } else {
            self.ids.iter().map(|e| e.to_string()).collect::<Vec<_>>().join(", ")
        }
    }

    /// Each token's weight per expert `[.., n]`: the `top_k` largest router probabilities
    /// (renormalised where the family does), zero for the experts not chosen.
    fn route(&self, logits: &Tensor, dtype: DType) -> Result<Tensor, ModelError> {
        let wide = if dtype == DType::Double { DType::Double } else { DType::Float };
        let (w, idx) = match self.routing {
            Routing::Softmax { renormalise } => {
                let p = logits.f_softmax(-1, wide)?;
                let (mut w, idx) = p.f_topk(self.top_k, -1, true, true)?;
                if renormalise {
                    w = w.f_div(&w.f_sum_dim_intlist([-1i64].as_slice(), true, wide)?)?;
                }
                (w, idx)
            }
            Routing::TopKSoftmax => {
                let (v, idx) = logits.f_topk(self.top_k, -1, true, true)?;
                (v.f_softmax(-1, v.kind())?, idx)
            }
            Routing::TopKSigmoid => {
                let (v, idx) = logits.f_topk(self.top_k, -1, true, true)?;
                (v.f_to_kind(wide)?.f_sigmoid()?, idx)
            }
            Routing::Grouped { sigmoid, groups, top_groups, top2_sum, renormalise, scale } => {
                self.grouped(logits, wide, (sigmoid, groups, top_groups, top2_sum, renormalise, scale))?
            }
        };
        Ok(Tensor::f_zeros(logits.size(), (w.kind(), logits.device()))?.f_scatter(-1, &idx, &w)?.f_to_kind(dtype)?)
    }
}

impl Experts {
    /// [`Routing::Grouped`] as transformers' `DeepseekV3TopkRouter` and `DeepseekV2MoEGate`
    /// compute it: `(weights, chosen)` `[.., top_k]`. Groups are formed over the experts as
    /// loaded: after `prune_experts` (or where a logit is minus infinity: routed around) an
    /// expert missing from its group is no candidate, and a group's score counts those left.
    /// As transformers, the experts outside the chosen groups score 0 (not minus infinity) in
    /// the final choice.
    fn grouped(
        &self,
        logits: &Tensor,
        wide: DType,
        (sigmoid, groups, top_groups, top2_sum, renormalise, scale): (bool, i64, i64, bool, bool, f64),
    ) -> Result<(Tensor, Tensor), ModelError> {
        let lw = logits.f_to_kind(wide)?;
        let scores = if sigmoid { lw.f_sigmoid()? } else { lw.f_softmax(-1, wide)? };
        let mut choice = match &self.choice_bias {
            Some(b) => scores.f_add(&b.f_to_kind(wide)?.f_to_device(scores.device())?)?,
            None => scores.shallow_clone(),
        };
        choice = choice.f_masked_fill(&lw.f_isneginf()?, f64::NEG_INFINITY)?;
        let n = self.loaded as i64;
        let shape = logits.size();
        let lead: Vec<i64> = shape[..shape.len() - 1].to_vec();
        let pruned = self.pruned();
        let ids = self.ids_on(logits.device());
        let full = if pruned {
            let mut all = lead.clone();
            all.push(n);
            Tensor::f_full(&all, f64::NEG_INFINITY, (wide, logits.device()))?.f_index_copy(-1, &ids, &choice)?
        } else {
            choice.shallow_clone()
        };
        let per = n / groups;
        let by_group = full.f_reshape([-1, groups, per])?;
        let group_score = if top2_sum {
            by_group.f_topk(2.min(per), -1, true, true)?.0.f_sum_dim_intlist([-1i64].as_slice(), false, wide)?
        } else {
            by_group.f_amax([-1i64].as_slice(), false)?
        };
        let (_, g_idx) = group_score.f_topk(top_groups, -1, true, true)?;
        let g_mask = group_score.f_zeros_like()?.f_scatter_value(1, &g_idx, 1.0)?;
        let keep = g_mask
            .f_unsqueeze(-1)?
            .f_expand([-1, groups, per], false)?
            .f_reshape(full.size())?
            .f_to_kind(DType::Bool)?;
        let mut masked = full.f_masked_fill(&keep.f_logical_not()?, 0.0)?;
        if pruned {
            masked = masked.f_index_select(-1, &ids)?;
        }
        let (_, idx) = masked.f_topk(self.top_k, -1, true, true)?;
        // V3 weighs by the scores, V2 by the masked scores it chose from.
        let mut w = if sigmoid { scores.f_gather(-1, &idx, false)? } else { masked.f_gather(-1, &idx, false)? };
        if renormalise {
            w = w.f_div(&w.f_sum_dim_intlist([-1i64].as_slice(), true, wide)?.f_add_scalar(1e-20)?)?;
        }
        Ok((w.f_mul_scalar(scale)?, idx))
    }
}

impl Mlp for Experts {
    fn kind(&self) -> &'static str {
        "experts"
    }
    fn forward(
        &self,
        x: &Tensor,
        gate: Option<&ExpertGate>,
        kind: Kind,
        layer: usize,
        h: &mut HookSlot,
        _: Inside,
    ) -> Result<Tensor, ModelError> {
        let at = |p| At::new(kind, layer, p);
        // AttnLRP through experts: the router's weights (and a shared expert's gate) act as
        // gates, fixed (no relevance flows into the router), on each expert's output or (Llama
        // 4) its input, each expert a SwiGLU under the rules (gpt-oss's clamped one too).
        let rules = hooks::rules(h);
        let lrp = rules == GradRules::AttnLrp;
        // The view's expert gates (numbered as loaded), applied before the hook points: a
        // closed expert routed around has a logit of minus infinity, else its gate multiplies
        // its weight.
        let own = match gate {
            Some(g) => Some((g.g.f_index_select(0, &self.ids_on(g.g.device()))?, g.route)),
            None => None,
        };
        let mut logits = self.router.forward(x);
        if let Some((g, true)) = &own {
            logits = logits.f_masked_fill(&g.f_le(0.0)?.f_to_device(logits.device())?, f64::NEG_INFINITY)?;
        }
        let logits = hooks::at(h, at(Point::RouterLogits), logits)?;
        let mut weights = self.route(&logits, x.kind())?;
        if let Some((g, false)) = &own {
            weights = weights.f_mul(&g.f_to_kind(weights.kind())?.f_to_device(weights.device())?)?;
        }
        let weights = hooks::at(h, at(Point::RouterWeights), weights)?;
        let weights = if lrp { weights.f_detach()? } else { weights };
        let d = *x.size().last().unwrap_or(&0);
        let n = self.experts.len() as i64;
        let flat = x.f_reshape([-1, d])?;
        let weights = weights.f_reshape([-1, n])?;
        let mut out = flat.f_zeros_like()?;
        // Each expert's weighted output `[N, D]`, kept only where a hook looks at them.
        let mut each: Option<Vec<Tensor>> = if hooks::wants(h, at(Point::ExpertOut)) { Some(Vec::new()) } else { None };
        for (e, expert) in self.experts.iter().enumerate() {
            let w = weights.f_select(1, e as i64)?;
            let rows = w.f_nonzero()?.f_squeeze_dim(1)?;
            if rows.size()[0] == 0 {
                if let Some(all) = each.as_mut() {
                    all.push(flat.f_zeros_like()?);
                }
                continue;
            }
            let w_rows = w.f_index_select(0, &rows)?.f_unsqueeze(1)?;
            let y = if self.input_scaled {
                expert.forward(&flat.f_index_select(0, &rows)?.f_mul(&w_rows)?, kind, layer, rules)?
            } else {
                expert.forward(&flat.f_index_select(0, &rows)?, kind, layer, rules)?.f_mul(&w_rows)?
            };
            out = out.f_index_add(0, &rows, &y)?;
            if let Some(all) = each.as_mut() {
                all.push(flat.f_zeros_like()?.f_index_add(0, &rows, &y)?);
            }
        }
        if let Some(all) = each {
            let all = Tensor::f_stack(&all, 1)?;
            // Seen per expert as heads are seen, `[B, expert, T, D]` (a flattened pass's rows as
            // one sequence). The output above is summed in expert order: a hook that only reads
            // changes nothing; a replacement's sum over experts becomes the routed output.
            let (b, t) = if x.dim() == 3 { (x.size()[0], x.size()[1]) } else { (1, flat.size()[0]) };
            let seen = all.f_reshape([b, t, n, d])?.f_transpose(1, 2)?;
            if let Some(v) = hooks::replaced(h, at(Point::ExpertOut), &seen)? {
                let v = v.f_transpose(1, 2)?.f_reshape([-1, n, d])?;
                out = v.f_sum_dim_intlist([1i64].as_slice(), false, flat.kind())?;
            }
        }
        if let Some((shared, gate)) = &self.shared {
            let mut s = shared.forward_hooked(&flat, kind, layer, &mut Some(&mut Rules(rules)))?.2;
            if let Some(g) = gate {
                let g = g.forward(&flat).f_sigmoid()?;
                s = s.f_mul(&if lrp { g.f_detach()? } else { g })?;
            }
            let s = hooks::at(h, at(Point::SharedOut), s.f_reshape(x.size())?)?;
            out = out.f_add(&s.f_reshape([-1, d])?)?;
        }
        hooks::at(h, at(Point::MlpOut), out.f_reshape(x.size())?)
    }
    fn points(&self, kind: Kind, layer: usize, out: &mut Vec<At>) {
        out.extend([Point::RouterLogits, Point::RouterWeights, Point::ExpertOut].map(|p| At::new(kind, layer, p)));
        if self.shared.is_some() {
            out.push(At::new(kind, layer, Point::SharedOut));
        }
        out.push(At::new(kind, layer, Point::MlpOut));
    }
    /// `W_gate` (the router, TransformerLens's name; `b_gate_choice`: DeepSeek-V3's choice bias,
    /// a buffer in transformers), then each expert's `experts.E.` weights, then the shared
    /// expert's (`shared_expert.`) and its gate (`W_shared_gate`).
    fn params_mut<'a>(&'a mut self, prefix: &str, out: &mut Params<'a>) {
        self.router.params_mut(prefix, "gate", out);
        if let Some(b) = self.choice_bias.as_mut() {
            out.push((format!("{prefix}b_gate_choice"), b));
        }
        for (expert, e) in self.experts.iter_mut().zip(&self.ids) {
            expert.params_mut(&format!("{prefix}experts.{e}."), out);
        }
        if let Some((shared, gate)) = self.shared.as_mut() {
            shared.params_mut(&format!("{prefix}shared_expert."), out);
            if let Some(g) = gate {
                g.params_mut(prefix, "shared_gate", out);
            }
        }
    }
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }
    fn width(&self) -> i64 {
        let routed = self.experts.iter().map(Expert::width).max().unwrap_or(0) * self.top_k;
        routed + self.shared.as_ref().map_or(0, |(s, _)| s.up.w.size()[0]) + self.experts.len() as i64
    }
}
