//! The trace: named hook points of the one forward pass, read and written.
//!
//! Every value the forward computes at a named place passes through [`Hooks`]: a hook sees the
//! value, may hand back a replacement, and the forward continues from it; everything downstream
//! (the layers above, a decoder's cached keys and values) sees the changed value. A hook may
//! fail: its error ends the run. A run that asks for nothing costs what the plain forward costs
//! (the fused attention kernel is used unless scores or pattern are asked for).
//!
//! Names follow TransformerLens, prefixed by the attention kind (`enc.`, `dec.`, `cross.`):
//! [`POINTS`] is the one table (docs/methods.md#hook-points). Internally per-head tensors are
//! `[B, H, T, dh]`; the table says which axis is which so that callers (the cache, the
//! interventions) can speak TransformerLens's axes.

use super::bias::TileBias;
use super::transformer::Placement;
use super::{Kind, ModelError};
use std::fmt;
use tch::Tensor;

/// A place in the forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Point {
    /// Token embeddings, before scaling and positions (`hook_embed`).
    Embed,
    /// Position embeddings added to them (learned or sinusoidal; `hook_pos_embed`).
    PosEmbed,
    /// A layer's input (`blocks.L.hook_resid_pre`).
    ResidPre,
    /// The output of the layer's first norm (`blocks.L.ln1.hook_normalized`): the attention's
    /// input in a pre-norm layer, `norm(resid_mid)` in a post-norm layer.
    Ln1,
    /// Latent attention's query latent before its norm `[B, T, q_rank]` (`attn.hook_q_latent`).
    QLatent,
    /// Latent attention's key/value latent before its norm `[B, T, kv_rank + rope]`
    /// (`attn.hook_kv_latent`): what the cache holds.
    KvLatent,
    /// Per-head queries before rotary positions `[B, H, T, dh]` (`attn.hook_q`).
    Q,
    /// Per key/value head keys before rotary positions `[B, Hkv, T, dh]` (`attn.hook_k`).
    K,
    /// Per key/value head values `[B, Hkv, T, dh]` (`attn.hook_v`).
    V,
    /// Queries and keys after rotary positions (`attn.hook_rot_q`, `attn.hook_rot_k`).
    RotQ,
    RotK,
    /// Scaled scores with the mask added `[B, H, Tq, Tk]` (`attn.hook_attn_scores`).
    Scores,
    /// Attention probabilities `[B, H, Tq, Tk]` (`attn.hook_pattern`).
    Pattern,
    /// Gated attention's (Qwen3-Next's) output gate `sigmoid(x W_G)` `[B, H, T, dh]`
    /// (`attn.hook_out_gate`): each head's context is multiplied by it before `hook_z`.
    OutGate,
    /// Per-head contexts, gated, the input of W^O `[B, H, T, dh]` (`attn.hook_z`).
    Z,
    /// Per-head outputs at W^O, without its bias `[B, H, T, D]` (`attn.hook_result`).
    Result,
    /// An SSRU decoder layer's (Marian `.bin`) forget gate `f = sigmoid(x Wf + bf)` `[B, T, D]`
    /// (`ssru.hook_forget`).
    SsruForget,
    /// Its candidate `x W` `[B, T, D]` (`ssru.hook_candidate`).
    SsruCandidate,
    /// Its cell states `c = f c' + (1 - f) x W` `[B, T, D]` (`ssru.hook_cell`); the block's
    /// output (`hook_attn_out`) is `relu(c)`.
    SsruCell,
    /// A gated short convolution's (LFM2's) gates and input from its input projection
    /// `[B, T, D]` each (`conv.hook_b`, `conv.hook_c`, `conv.hook_x`).
    ConvB,
    ConvC,
    ConvX,
    /// Its convolution's input `B * x` `[B, T, D]` (`conv.hook_bx`): what its state carries.
    ConvBx,
    /// Its output before the output projection, `C * conv(B * x)` `[B, T, D]` (`conv.hook_y`).
    ConvY,
    /// A Mamba-2 layer's gate `z` from its input projection `[B, T, I]` (`ssm.hook_gate`).
    SsmGate,
    /// Its heads' inputs after the convolution `[B, H, T, P]` (`ssm.hook_x`).
    SsmX,
    /// Its groups' `B` and `C` after the convolution `[B, G, T, N]` (`ssm.hook_b`, `ssm.hook_c`).
    SsmB,
    SsmC,
    /// Its heads' step sizes `softplus(dt + dt_bias)` `[B, T, H]` (`ssm.hook_dt`).
    SsmDt,
    /// Its heads' effective attention `alpha [B, H, T, T]` (`ssm.hook_alpha`,
    /// docs/methods.md#effective-attention): `y = alpha x + D x`.
    SsmAlpha,
    /// Its heads' outputs before the gate and norm, `alpha x + D x` `[B, H, T, P]`
    /// (`ssm.hook_y`).
    SsmY,
    /// A gated DeltaNet layer's (Qwen3-Next's) queries and keys after the convolution, per key
    /// head, L2-normalised `[B, Hk, T, dk]` (`delta.hook_q`, `delta.hook_k`).
    DeltaQ,
    DeltaK,
    /// Its values per head `[B, H, T, dv]` (`delta.hook_v`).
    DeltaV,
    /// Its heads' write strengths `beta = sigmoid(b)` and log decays
    /// `g = -exp(A_log) softplus(a + dt_bias)` `[B, T, H]` (`delta.hook_beta`, `delta.hook_g`).
    DeltaBeta,
    DeltaG,
    /// Its heads' effective attention `alpha [B, H, T, T]` (`delta.hook_alpha`,
    /// docs/methods.md#effective-attention): `y = alpha v`.
    DeltaAlpha,
    /// Its heads' outputs `alpha v` before the gated norm `[B, H, T, dv]` (`delta.hook_y`).
    DeltaY,
    /// The output gate `z` of the gated norm `[B, H, T, dv]` (`delta.hook_gate`).
    DeltaGate,
    /// The attention block's output `[B, T, D]` (`blocks.L.hook_attn_out`).
    AttnOut,
    /// The residual stream after the attention block (`blocks.L.hook_resid_mid`): `x + attn_out`.
    ResidMid,
    /// A four-norm layer's (Gemma's) norm of the attention output before its residual
    /// (`blocks.L.ln1_post.hook_normalized`).
    Ln1Post,
    /// Its norm of the MLP output before its residual (`blocks.L.ln2_post.hook_normalized`).
    Ln2Post,
    /// The output of the layer's second norm (`blocks.L.ln2.hook_normalized`): the MLP's input
    /// in a pre-norm layer, the layer's output in a post-norm layer.
    Ln2,
    /// A mixture of experts' router logits `[B, T, E]` (`mlp.hook_router_logits`).
    RouterLogits,
    /// Its routing: each expert's weight per token, zero where not chosen `[B, T, E]`
    /// (`mlp.hook_router_weights`).
    RouterWeights,
    /// Each expert's weighted output per token, zero where not chosen, held per expert as
    /// heads are `[B, E, T, D]` (`mlp.hook_expert_out`; `[pos, expert, d_model]` in
    /// TransformerLens's axes).
    ExpertOut,
    /// A shared expert's (gated) output `[B, T, D]` (`mlp.hook_shared_out`).
    SharedOut,
    /// The MLP's pre-activation `[B, T, F]` (`mlp.hook_pre`; of the gate in a gated MLP).
    MlpPre,
    /// A gated MLP's linear branch `[B, T, F]` (`mlp.hook_pre_linear`).
    MlpPreLinear,
    /// The MLP's hidden units after the activation (and gate) `[B, T, F]` (`mlp.hook_post`).
    MlpPost,
    /// The MLP block's output `[B, T, D]` (`blocks.L.hook_mlp_out`).
    MlpOut,
    /// The residual stream after the MLP (`blocks.L.hook_resid_post`), before a post-norm
    /// layer's last norm.
    ResidPost,
    /// The stack's final norm (`ln_final.hook_normalized`).
    LnFinal,
    /// The logits `[B, T, V]`: the output projection, soft-capped where the model says so
    /// (`hook_logits`; the one unembedding, `model::unembed`).
    Logits,
}

/// The layout of a hook point's value (batch first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `[B, T, X]`: residual stream, norms, MLP units.
    Seq,
    /// `[B, H, T, X]`: per-head vectors (`H` query heads, or key/value heads for `k` and `v`).
    Heads,
    /// `[B, H, Tq, Tk]`: scores and pattern.
    Scores,
}

/// One row of the hook table.
pub struct PointSpec {
    pub point: Point,
    /// The name after `KIND.blocks.L.` (or after `KIND.` for the whole-model points).
    pub name: &'static str,
    pub layout: Layout,
    /// Whether the point belongs to a layer (`blocks.L.`).
    pub per_layer: bool,
    /// Whether it belongs to an attention block (so exists for `cross` too).
    pub attention: bool,
    /// Shape in TransformerLens's axes, batch removed.
    pub axes: &'static str,
    pub doc: &'static str,
}

const fn spec(
    point: Point,
    name: &'static str,
    layout: Layout,
    per_layer: bool,
    attention: bool,
    axes: &'static str,
    doc: &'static str,
) -> PointSpec {
    PointSpec { point, name, layout, per_layer, attention, axes, doc }
}

/// The hook table: every point, in the order the forward meets them.
pub const POINTS: &[PointSpec] = &[
    spec(Point::Embed, "hook_embed", Layout::Seq, false, false, "[pos, d_model]", "token embeddings (before scale and positions)"),
    spec(Point::PosEmbed, "hook_pos_embed", Layout::Seq, false, false, "[pos, d_model]", "position embeddings (learned or sinusoidal models)"),
    spec(Point::ResidPre, "hook_resid_pre", Layout::Seq, true, false, "[pos, d_model]", "the layer's input"),
    spec(Point::Ln1, "ln1.hook_normalized", Layout::Seq, true, false, "[pos, d_model]", "first norm: attention input (pre-norm) or norm(resid_mid) (post-norm)"),
    spec(Point::QLatent, "attn.hook_q_latent", Layout::Seq, true, true, "[pos, q_lora_rank]", "latent attention (DeepSeek): the query latent, before its norm"),
    spec(Point::KvLatent, "attn.hook_kv_latent", Layout::Seq, true, true, "[pos, kv_lora_rank + rope]", "latent attention: the key/value latent (before its norm) and the shared rotary key, what the cache holds"),
    spec(Point::Q, "attn.hook_q", Layout::Heads, true, true, "[pos, head, d_head]", "queries, before rotary (after a per-head query norm)"),
    spec(Point::K, "attn.hook_k", Layout::Heads, true, true, "[pos, kv_head, d_head]", "keys by key/value head, before rotary"),
    spec(Point::V, "attn.hook_v", Layout::Heads, true, true, "[pos, kv_head, d_head]", "values by key/value head"),
    spec(Point::RotQ, "attn.hook_rot_q", Layout::Heads, true, true, "[pos, head, d_head]", "queries after rotary (rotary models)"),
    spec(Point::RotK, "attn.hook_rot_k", Layout::Heads, true, true, "[pos, kv_head, d_head]", "keys after rotary (rotary models)"),
    spec(Point::Scores, "attn.hook_attn_scores", Layout::Scores, true, true, "[head, q_pos, k_pos]", "scaled scores, mask added (-1e9)"),
    spec(Point::Pattern, "attn.hook_pattern", Layout::Scores, true, true, "[head, q_pos, k_pos]", "attention probabilities"),
    spec(Point::OutGate, "attn.hook_out_gate", Layout::Heads, true, true, "[pos, head, d_head]", "gated attention (Qwen3-Next): sigmoid(x W_G), each head's context times it before hook_z"),
    spec(Point::Z, "attn.hook_z", Layout::Heads, true, true, "[pos, head, d_head]", "per-head contexts, gated: the input of W^O"),
    spec(Point::Result, "attn.hook_result", Layout::Heads, true, true, "[pos, head, d_model]", "per-head outputs at W^O (bias not included)"),
    spec(Point::SsruForget, "ssru.hook_forget", Layout::Seq, true, false, "[pos, d_model]", "SSRU decoder layers (Marian .bin): the forget gate f"),
    spec(Point::SsruCandidate, "ssru.hook_candidate", Layout::Seq, true, false, "[pos, d_model]", "SSRU decoder layers: the candidate x W"),
    spec(Point::SsruCell, "ssru.hook_cell", Layout::Seq, true, false, "[pos, d_model]", "SSRU decoder layers: the cell c = f c' + (1 - f) x W (a change is not re-run through later steps of the same pass)"),
    spec(Point::ConvB, "conv.hook_b", Layout::Seq, true, false, "[pos, d_model]", "gated short-convolution layers (LFM2): the input gate B"),
    spec(Point::ConvC, "conv.hook_c", Layout::Seq, true, false, "[pos, d_model]", "gated short-convolution layers: the output gate C"),
    spec(Point::ConvX, "conv.hook_x", Layout::Seq, true, false, "[pos, d_model]", "gated short-convolution layers: the input x"),
    spec(Point::ConvBx, "conv.hook_bx", Layout::Seq, true, false, "[pos, d_model]", "gated short-convolution layers: B * x, the depthwise convolution's input (what a generation's state keeps)"),
    spec(Point::ConvY, "conv.hook_y", Layout::Seq, true, false, "[pos, d_model]", "gated short-convolution layers: C * conv(B * x), the output projection's input"),
    spec(Point::SsmGate, "ssm.hook_gate", Layout::Seq, true, false, "[pos, d_inner]", "Mamba-2 and Mamba layers: the gate z from the input projection"),
    spec(Point::SsmX, "ssm.hook_x", Layout::Heads, true, false, "[pos, head, d_head]", "Mamba-2 layers: each head's input x after the convolution (Mamba: each channel group's)"),
    spec(Point::SsmB, "ssm.hook_b", Layout::Heads, true, false, "[pos, group, d_state]", "Mamba-2 layers: B of each group after the convolution"),
    spec(Point::SsmC, "ssm.hook_c", Layout::Heads, true, false, "[pos, group, d_state]", "Mamba-2 layers: C of each group after the convolution"),
    spec(Point::SsmDt, "ssm.hook_dt", Layout::Seq, true, false, "[pos, head]", "Mamba-2 layers: each head's step size softplus(dt + dt_bias) (Mamba: each channel's, [pos, d_inner])"),
    spec(Point::SsmAlpha, "ssm.hook_alpha", Layout::Scores, true, false, "[head, q_pos, k_pos]", "Mamba-2 layers: the effective attention alpha (y = alpha x + D x; attn.hook_pattern shows |alpha| by row; Mamba: each channel group's mean, read only)"),
    spec(Point::SsmY, "ssm.hook_y", Layout::Heads, true, false, "[pos, head, d_head]", "Mamba-2 layers: alpha x + D x, before the gate and norm"),
    spec(Point::DeltaQ, "delta.hook_q", Layout::Heads, true, false, "[pos, k_head, d_k]", "gated DeltaNet layers (Qwen3-Next): the queries after the convolution, L2-normalised"),
    spec(Point::DeltaK, "delta.hook_k", Layout::Heads, true, false, "[pos, k_head, d_k]", "gated DeltaNet layers: the keys after the convolution, L2-normalised"),
    spec(Point::DeltaV, "delta.hook_v", Layout::Heads, true, false, "[pos, head, d_head]", "gated DeltaNet layers: the values after the convolution"),
    spec(Point::DeltaBeta, "delta.hook_beta", Layout::Seq, true, false, "[pos, head]", "gated DeltaNet layers: each head's write strength beta = sigmoid(b)"),
    spec(Point::DeltaG, "delta.hook_g", Layout::Seq, true, false, "[pos, head]", "gated DeltaNet layers: each head's log decay g = -exp(A_log) softplus(a + dt_bias)"),
    spec(Point::DeltaAlpha, "delta.hook_alpha", Layout::Scores, true, false, "[head, q_pos, k_pos]", "gated DeltaNet layers: the effective attention alpha (y = alpha v; attn.hook_pattern shows |alpha| by row)"),
    spec(Point::DeltaY, "delta.hook_y", Layout::Heads, true, false, "[pos, head, d_head]", "gated DeltaNet layers: alpha v, before the gated norm"),
    spec(Point::DeltaGate, "delta.hook_gate", Layout::Heads, true, false, "[pos, head, d_head]", "gated DeltaNet layers: the gate z of the gated norm (norm(y) w silu(z))"),
    spec(Point::AttnOut, "hook_attn_out", Layout::Seq, true, true, "[pos, d_model]", "the attention block's output"),
    spec(Point::Ln1Post, "ln1_post.hook_normalized", Layout::Seq, true, false, "[pos, d_model]", "four-norm layers (Gemma): the norm of attn_out added to the residual"),
    spec(Point::ResidMid, "hook_resid_mid", Layout::Seq, true, true, "[pos, d_model]", "resid_pre + attn_out (cross: its queries' stream + attn_out; Gemma: + ln1_post)"),
    spec(Point::Ln2, "ln2.hook_normalized", Layout::Seq, true, false, "[pos, d_model]", "second norm: MLP input (pre-norm) or the layer's output (post-norm)"),
    spec(Point::RouterLogits, "mlp.hook_router_logits", Layout::Seq, true, false, "[pos, expert]", "mixture of experts: the router's logits"),
    spec(Point::RouterWeights, "mlp.hook_router_weights", Layout::Seq, true, false, "[pos, expert]", "mixture of experts: each expert's weight per token, 0 where not chosen (a replacement reroutes)"),
    spec(Point::ExpertOut, "mlp.hook_expert_out", Layout::Heads, true, false, "[pos, expert, d_model]", "mixture of experts: each expert's weighted output, 0 where not chosen (a replacement's sum over experts is the routed part of the output)"),
    spec(Point::SharedOut, "mlp.hook_shared_out", Layout::Seq, true, false, "[pos, d_model]", "mixture of experts: the shared expert's gated output (Qwen2-MoE)"),
    spec(Point::MlpPre, "mlp.hook_pre", Layout::Seq, true, false, "[pos, d_mlp]", "MLP pre-activation (of the gate, in a gated MLP)"),
    spec(Point::MlpPreLinear, "mlp.hook_pre_linear", Layout::Seq, true, false, "[pos, d_mlp]", "a gated MLP's linear branch"),
    spec(Point::MlpPost, "mlp.hook_post", Layout::Seq, true, false, "[pos, d_mlp]", "MLP hidden units after the activation (and gate)"),
    spec(Point::MlpOut, "hook_mlp_out", Layout::Seq, true, false, "[pos, d_model]", "the MLP block's output"),
    spec(Point::Ln2Post, "ln2_post.hook_normalized", Layout::Seq, true, false, "[pos, d_model]", "four-norm layers (Gemma): the norm of mlp_out added to the residual"),
    spec(Point::ResidPost, "hook_resid_post", Layout::Seq, true, false, "[pos, d_model]", "resid_mid + mlp_out (before a post-norm layer's last norm)"),
    spec(Point::LnFinal, "ln_final.hook_normalized", Layout::Seq, false, false, "[pos, d_model]", "the stack's final norm (pre-norm models)"),
    spec(Point::Logits, "hook_logits", Layout::Seq, false, false, "[pos, d_vocab]", "the logits: output projection, then the final soft-cap where the model has one (Gemma 2)"),
];

impl Point {
    pub fn spec(self) -> &'static PointSpec {
        // Every point has exactly one row (a unit test checks it).
        POINTS.iter().find(|s| s.point == self).unwrap_or(&POINTS[0])
    }
}

/// Where a value sits: the attention kind (for residual points of a decoder layer, `dec`; of
/// the decoder's embeddings, `dec`), the layer (0 for whole-model points) and the point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct At {
    pub kind: Kind,
    pub layer: usize,
    pub point: Point,
}

impl At {
    pub fn new(kind: Kind, layer: usize, point: Point) -> At {
        At { kind, layer, point }
    }
}

/// `enc.blocks.3.attn.hook_pattern`, `dec.hook_embed`, `enc.ln_final.hook_normalized`.
impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.point.spec();
        if s.per_layer {
            write!(f, "{}.blocks.{}.{}", self.kind, self.layer, s.name)
        } else {
            write!(f, "{}.{}", self.kind, s.name)
        }
    }
}

/// Parses a hook name. `default_kind` is used when the name has no kind prefix
/// (`blocks.0.attn.hook_z` on a decoder-only model, as TransformerLens writes it).
pub fn parse_name(name: &str, default_kind: Option<Kind>) -> Result<At, String> {
    let bad = |why: &str| {
        format!("'{name}' is not a hook name ({why}); names look like \"enc.blocks.0.attn.hook_pattern\", \"dec.hook_embed\" (`:help hooks` lists them)")
    };
    let (kind, rest) = match name.split_once('.') {
        Some((k, rest)) if matches!(k, "enc" | "dec" | "cross") => (k.parse::<Kind>().map_err(|e| bad(&e))?, rest),
        _ => (default_kind.ok_or_else(|| bad("no attention kind in front: enc., dec. or cross."))?, name),
    };
    let (layer, point_name) = match rest.strip_prefix("blocks.") {
        Some(r) => {
            let (l, p) = r.split_once('.').ok_or_else(|| bad("nothing after the layer"))?;
            (Some(l.parse::<usize>().map_err(|_| bad(&format!("'{l}' is not a layer number")))?), p)
        }
        None => (None, rest),
    };
    let Some(spec) = POINTS.iter().find(|s| s.name == point_name) else {
        let names: Vec<&str> = POINTS.iter().map(|s| s.name).collect();
        let near = crate::suggest::did_you_mean(point_name, names.iter().copied())
            .map_or(String::new(), |d| format!(" ({d})"));
        return Err(bad(&format!("unknown point '{point_name}'{near}; the points are {}", names.join(", "))));
    };
    match (spec.per_layer, layer) {
        (true, None) => Err(bad(&format!("'{}' belongs to a layer: blocks.L.{}", spec.name, spec.name))),
        (false, Some(_)) => Err(bad(&format!("'{}' belongs to no layer: {kind}.{}", spec.name, spec.name))),
        (_, l) => Ok(At { kind, layer: l.unwrap_or(0), point: spec.point }),
    }
}

/// What the forward hands each value to.
pub trait Hooks {
    /// Whether `visit` wants to see the value at `at` (checked before any work is done to
    /// produce a value nobody reads, such as the pattern or per-head results).
    fn wants(&self, at: At) -> bool;
    /// Sees the value at `at`; `Some(v)` replaces it (same shape), and the forward continues
    /// from `v`.
    fn visit(&mut self, at: At, x: &Tensor) -> Result<Option<Tensor>, ModelError>;
    /// How gradients flow through this run's forward (its values are the same either way).
    fn rules(&self) -> GradRules {
        GradRules::Autograd
    }
    /// At most this many query rows per tile where this run wants a mixer's attention weights
    /// at `at` (a `Pattern` point) handed over tile by tile ([`Hooks::tile`]); `None` (the
    /// default): no tiles. Where no hook of the run looks at `hook_attn_scores` or
    /// `hook_pattern` there, the layer never holds its `T x T` weights at once; where one does,
    /// the whole weights are visited (and may be replaced) first, and the tiles are their rows
    /// (docs/methods.md#score-tiles).
    fn tile_rows(&self, _at: At) -> Option<i64> {
        None
    }
    /// Sees query rows `q0 .. q0 + n` of a mixer's attention at `at` over the keys the tile
    /// computed ([`Tile`]), tiles in order of `q0`; read-only.
    fn tile(&mut self, _at: At, _tile: &Tile) -> Result<(), ModelError> {
        Ok(())
    }
    /// The residual stream moved from one placement to another before stack layer `layer`
    /// (`layer` = the stack's length: back to the unembedding's): a split model's transfers, in
    /// order (docs/methods.md#placement).
    fn moved(&mut self, _from: Placement, _to: Placement, _layer: usize) {}
}

/// Tells the run's hooks of a move between placements ([`Hooks::moved`]).
pub fn moved(h: &mut HookSlot, from: Placement, to: Placement, layer: usize) {
    if let Some(h) = h.as_deref_mut() {
        h.moved(from, to, layer);
    }
}

/// The tile height the run's hooks ask for at `at` ([`Hooks::tile_rows`]); none without hooks.
pub fn tile_rows(h: &HookSlot, at: At) -> Option<i64> {
    h.as_deref().and_then(|h| h.tile_rows(at)).filter(|&n| n > 0)
}

/// Hands one tile of attention at `at` to the run's hooks ([`Hooks::tile`]).
pub fn tile(h: &mut HookSlot, at: At, tile: &Tile) -> Result<(), ModelError> {
    match h.as_deref_mut() {
        Some(h) => h.tile(at, tile),
        None => Ok(()),
    }
}

/// Query rows `q0 .. q0 + n` of a mixer's attention over keys `k0 .. k0 + m` of `tk`
/// (docs/methods.md#score-tiles): the keys outside are hidden from every row of the tile by
/// the bias, their weights exactly 0, and the tile skipped them.
pub struct Tile<'a> {
    pub q0: i64,
    pub k0: i64,
    /// Every key's count.
    pub tk: i64,
    /// The weights `[B, H, n, m]` (`hook_pattern`'s rows, keys `k0 ..`).
    pub pattern: &'a Tensor,
    /// The scores `[B, H, n, m]` (scaled, soft-capped, masked: `hook_attn_scores`'s rows), where
    /// the mixer computed them.
    pub scores: Option<&'a Tensor>,
    /// The tile's bias (its rows over every key built on demand), where keys were skipped.
    pub bias: Option<&'a TileBias<'a>>,
}

impl Tile<'_> {
    /// A tile of every key.
    pub fn whole<'a>(q0: i64, pattern: &'a Tensor, scores: Option<&'a Tensor>) -> Tile<'a> {
        Tile { q0, k0: 0, tk: pattern.size().last().copied().unwrap_or(0), pattern, scores, bias: None }
    }

    /// Whether the tile holds every key.
    pub fn is_whole(&self) -> bool {
        self.k0 == 0 && self.pattern.size().last() == Some(&self.tk)
    }

    /// The weights over every key, `[B, H, n, tk]` (the skipped ones 0).
    pub fn full_pattern(&self) -> Result<Tensor, ModelError> {
        if self.is_whole() {
            return Ok(self.pattern.shallow_clone());
        }
        let mut size = self.pattern.size();
        let m = size[3];
        size[3] = self.tk;
        let full = Tensor::f_zeros(size.as_slice(), (self.pattern.kind(), self.pattern.device()))?;
        full.f_narrow(3, self.k0, m)?.f_copy_(self.pattern)?;
        Ok(full)
    }

    /// The scores over every key, `[B, H, n, tk]` (the skipped ones at their bias: in float32
    /// the whole path's `s - 1e9` rounds to it), where the mixer computed scores.
    pub fn full_scores(&self) -> Result<Option<Tensor>, ModelError> {
        let Some(s) = self.scores else { return Ok(None) };
        if self.is_whole() {
            return Ok(Some(s.shallow_clone()));
        }
        let size = s.size();
        let bias = self.bias.ok_or_else(|| ModelError::Invalid("a tile of some keys without its bias".into()))?;
        let full =
            bias.rows()?.f_to_kind(s.kind())?.f_expand([size[0], size[1], size[2], self.tk], false)?.f_contiguous()?;
        full.f_narrow(3, self.k0, size[3])?.f_copy_(s)?;
        Ok(Some(full))
    }
}

/// How the forward's gradients flow. The values are the same under both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GradRules {
    /// Autograd's own gradients.
    #[default]
    Autograd,
    /// The AttnLRP rules (Achtibat et al. 2024, as the LXT library implements them;
    /// docs/methods.md#attnlrp), so that gradient x input is the relevance: norms with their
    /// scale held fixed, activations by the identity rule, a gated MLP's product and the
    /// attention's query-key and weight-value products by the uniform rule.
    AttnLrp,
}

/// The hooks of one run, as the forward passes them down.
pub type HookSlot<'a> = Option<&'a mut dyn Hooks>;

/// The gradient rules the run's hooks ask for (autograd's without hooks).
pub fn rules(h: &HookSlot) -> GradRules {
    h.as_deref().map_or(GradRules::Autograd, |h| h.rules())
}

/// Whether anybody looks at `at`.
pub fn wants(h: &HookSlot, at: At) -> bool {
    h.as_deref().is_some_and(|h| h.wants(at))
}

/// The value at `at` after the hooks: `x` itself, or its replacement (checked to keep the
/// shape, since everything downstream is built for it).
pub fn at(h: &mut HookSlot, at: At, x: Tensor) -> Result<Tensor, ModelError> {
    Ok(match replaced(h, at, &x)? {
        Some(v) => v,
        None => x,
    })
}

/// The hooks' replacement of the value `x` at `at`, if any.
pub fn replaced(h: &mut HookSlot, at: At, x: &Tensor) -> Result<Option<Tensor>, ModelError> {
    let Some(h) = h.as_deref_mut() else { return Ok(None) };
    if !h.wants(at) {
        return Ok(None);
    }
    match h.visit(at, x)? {
        None => Ok(None),
        Some(v) if v.size() == x.size() => Ok(Some(if v.kind() == x.kind() && v.device() == x.device() {
            v
        } else {
            v.f_to_device(x.device())?.f_to_kind(x.kind())?
        })),
        Some(v) => Err(ModelError::Invalid(format!(
            "hook {at}: the replacement has shape {:?}, the value there has {:?}",
            v.size(),
            x.size()
        ))),
    }
}

/// A hook that records: `on` gets every value whose point is in `points` (all points when
/// empty) and kind in `kinds` (all when empty); it changes nothing.
pub struct Record<'a> {
    pub points: &'a [Point],
    pub kinds: &'a [Kind],
    pub on: &'a mut dyn FnMut(At, &Tensor) -> Result<(), ModelError>,
}

impl<'a> Record<'a> {
    pub fn new(points: &'a [Point], on: &'a mut dyn FnMut(At, &Tensor) -> Result<(), ModelError>) -> Record<'a> {
        Record { points, kinds: &[], on }
    }
}

impl Hooks for Record<'_> {
    fn wants(&self, at: At) -> bool {
        (self.points.is_empty() || self.points.contains(&at.point))
            && (self.kinds.is_empty() || self.kinds.contains(&at.kind))
    }
    fn visit(&mut self, at: At, x: &Tensor) -> Result<Option<Tensor>, ModelError> {
        (self.on)(at, x)?;
        Ok(None)
    }
}

/// A hook that reads one kind's attention weights tile by tile (docs/methods.md#score-tiles):
/// `on(at, tile)` gets rows `q0 .. q0 + n` of each layer's `hook_pattern` ([`Tile`]), at most
/// `rows[layer]` rows at a time, so no layer holds its `T x T` weights. A layer whose mixer
/// hands no tiles (`whole[layer]`) is visited whole instead (one tile of every row and key).
/// It changes nothing.
pub struct Tiles<'a> {
    pub kind: Kind,
    /// Per layer of the kind: read the whole pattern (its mixer hands no tiles).
    pub whole: Vec<bool>,
    /// Per layer of the kind: the tile height.
    pub rows: Vec<i64>,
    pub on: &'a mut dyn FnMut(At, &Tile) -> Result<(), ModelError>,
}

impl Hooks for Tiles<'_> {
    fn wants(&self, at: At) -> bool {
        at.kind == self.kind && at.point == Point::Pattern && self.whole.get(at.layer).copied().unwrap_or(true)
    }
    fn visit(&mut self, at: At, x: &Tensor) -> Result<Option<Tensor>, ModelError> {
        (self.on)(at, &Tile::whole(0, x, None))?;
        Ok(None)
    }
    fn tile_rows(&self, at: At) -> Option<i64> {
        (at.kind == self.kind && at.point == Point::Pattern).then(|| self.rows.get(at.layer).copied()).flatten()
    }
    fn tile(&mut self, at: At, tile: &Tile) -> Result<(), ModelError> {
        if at.kind == self.kind {
            (self.on)(at, tile)?;
        }
        Ok(())
    }
}

/// Hooks that look at nothing and carry a run's gradient rules into a computation the run
/// makes without its hooks (a mixture of experts' experts under AttnLRP).
pub struct Rules(pub GradRules);

impl Hooks for Rules {
    fn wants(&self, _: At) -> bool {
        false
    }
    fn visit(&mut self, _: At, _: &Tensor) -> Result<Option<Tensor>, ModelError> {
        Ok(None)
    }
    fn rules(&self) -> GradRules {
        self.0
    }
}

/// Two hooks in turn: the first's replacement is what the second sees.
pub struct Both<'a>(pub &'a mut dyn Hooks, pub &'a mut dyn Hooks);

impl Hooks for Both<'_> {
    fn wants(&self, at: At) -> bool {
        self.0.wants(at) || self.1.wants(at)
    }
    fn visit(&mut self, at: At, x: &Tensor) -> Result<Option<Tensor>, ModelError> {
        let first = if self.0.wants(at) { self.0.visit(at, x)? } else { None };
        let seen = first.as_ref().unwrap_or(x);
        let second = if self.1.wants(at) { self.1.visit(at, seen)? } else { None };
        Ok(second.or(first))
    }
    fn tile_rows(&self, at: At) -> Option<i64> {
        match (self.0.tile_rows(at).filter(|&n| n > 0), self.1.tile_rows(at).filter(|&n| n > 0)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
    fn tile(&mut self, at: At, tile: &Tile) -> Result<(), ModelError> {
        self.0.tile(at, tile)?;
        self.1.tile(at, tile)
    }
    fn moved(&mut self, from: Placement, to: Placement, layer: usize) {
        self.0.moved(from, to, layer);
        self.1.moved(from, to, layer);
    }
    fn rules(&self) -> GradRules {
        if self.0.rules() == GradRules::AttnLrp || self.1.rules() == GradRules::AttnLrp {
            GradRules::AttnLrp
        } else {
            GradRules::Autograd
        }
    }
}

/// What an intervention does to the selected entries.
#[derive(Debug)]
pub enum Op {
    /// Set them to a value (broadcast over the selection).
    Replace(Tensor),
    /// Add a value.
    Add(Tensor),
    /// Multiply by a factor.
    Scale(f64),
}

/// A change at one hook point: `op` on the entries of the chosen heads, positions (query
/// positions for scores and pattern) and batch rows (all when `None`). A value is given in
/// TransformerLens's axes without batch (`[pos, head, d_head]` for `hook_z`), or any shape
/// that broadcasts to that.
#[derive(Debug)]
pub struct Intervention {
    pub at: At,
    pub op: Op,
    pub heads: Option<Vec<i64>>,
    pub positions: Option<Vec<i64>>,
    pub rows: Option<Vec<i64>>,
}

impl Intervention {
    /// The value after the change (`x` in internal layout).
    pub fn apply(&self, x: &Tensor) -> Result<Tensor, ModelError> {
        let layout = self.at.point.spec().layout;
        let size = x.size();
        let name = self.at;
        let (head_axis, pos_axis) = match layout {
            Layout::Seq => (None, 1),
            Layout::Heads | Layout::Scores => (Some(1), 2),
        };
        // The value in internal layout.
        let to_internal = |v: &Tensor| -> Result<Tensor, ModelError> {
            let v = v.f_to_device(x.device())?.f_to_kind(x.kind())?;
            // [pos, head, X] -> [head, pos, X] for per-head points (given with all three axes).
            let v = if layout == Layout::Heads && v.dim() == 3 { v.f_transpose(0, 1)? } else { v };
            let want: Vec<i64> = size[1..].to_vec();
            v.f_broadcast_to(want.as_slice()).map_err(|_| {
                ModelError::Invalid(format!("intervention at {name}: a value of shape {:?} does not fit the point's shape {} = {:?} (TransformerLens axes, batch removed)", v.size(), name.point.spec().axes, tl_shape(layout, &want)))
            })
        };
        let changed = match &self.op {
            Op::Replace(v) => to_internal(v)?.unsqueeze(0).f_expand_as(x)?,
            Op::Add(v) => x + to_internal(v)?.unsqueeze(0),
            Op::Scale(s) => x * *s,
        };
        if self.heads.is_none() && self.positions.is_none() && self.rows.is_none() {
            return Ok(changed);
        }
        // A boolean selection broadcast over the value's axes.
        let dev = x.device();
        let pick = |axis: usize, idx: &Option<Vec<i64>>, what: &str| -> Result<Option<Tensor>, ModelError> {
            let Some(idx) = idx else { return Ok(None) };
            let n = size[axis];
            if let Some(bad) = idx.iter().find(|&&i| i < 0 || i >= n) {
                return Err(ModelError::Invalid(format!(
                    "intervention at {name}: {what} {bad} out of range 0..{}",
                    n - 1
                )));
            }
            let mut m = vec![false; n as usize];
            for &i in idx {
                m[i as usize] = true;
            }
            let mut shape = vec![1i64; size.len()];
            shape[axis] = n;
            Ok(Some(Tensor::from_slice(&m).view(shape.as_slice()).to_device(dev)))
        };
        let mut sel: Option<Tensor> = None;
        let parts = [
            pick(0, &self.rows, "batch row")?,
            match head_axis {
                Some(a) => pick(a, &self.heads, "head")?,
                None if self.heads.is_some() => {
                    return Err(ModelError::Invalid(format!(
                        "intervention at {name}: the point has no heads; give heads only at attn.* points"
                    )))
                }
                None => None,
            },
            pick(pos_axis, &self.positions, "position")?,
        ];
        for p in parts.into_iter().flatten() {
            sel = Some(match sel {
                None => p,
                Some(s) => s.f_logical_and(&p)?,
            });
        }
        match sel {
            None => Ok(changed),
            Some(s) => Ok(changed.f_where_self(&s, x)?),
        }
    }
}

/// An internal per-point shape (batch removed) in TransformerLens's axes.
fn tl_shape(layout: Layout, s: &[i64]) -> Vec<i64> {
    match (layout, s) {
        (Layout::Heads, [h, t, x]) => vec![*t, *h, *x],
        _ => s.to_vec(),
    }
}

/// The internal value at a point (batch row removed) -> TransformerLens's axes:
/// `[H, T, X]` -> `[T, H, X]` for per-head points; others unchanged.
pub fn to_tl_axes(point: Point, x: &Tensor) -> Tensor {
    match point.spec().layout {
        Layout::Heads if x.dim() == 3 => x.transpose(0, 1),
        _ => x.shallow_clone(),
    }
}

/// A set of interventions as a hook.
#[derive(Default)]
pub struct Interventions {
    pub list: Vec<Intervention>,
}

impl Hooks for Interventions {
    fn wants(&self, at: At) -> bool {
        self.list.iter().any(|i| i.at == at)
    }
    fn visit(&mut self, at: At, x: &Tensor) -> Result<Option<Tensor>, ModelError> {
        let mut v: Option<Tensor> = None;
        for i in self.list.iter().filter(|i| i.at == at) {
            v = Some(i.apply(v.as_ref().unwrap_or(x))?);
        }
        Ok(v)
    }
}

/// A hook replacing one point's value (a patch, a resumed row's changed value).
pub struct Put<'a> {
    pub at: At,
    pub value: &'a Tensor,
}

impl Hooks for Put<'_> {
    fn wants(&self, at: At) -> bool {
        at == self.at
    }
    fn visit(&mut self, _: At, _: &Tensor) -> Result<Option<Tensor>, ModelError> {
        Ok(Some(self.value.shallow_clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind as DType};

    #[test]
    fn every_point_has_one_row_and_names_round_trip() {
        for s in POINTS {
            assert_eq!(POINTS.iter().filter(|r| r.point == s.point).count(), 1, "{:?}", s.point);
            for kind in [Kind::Enc, Kind::Dec, Kind::Cross] {
                let at = At::new(kind, if s.per_layer { 3 } else { 0 }, s.point);
                assert_eq!(parse_name(&at.to_string(), None), Ok(at));
            }
        }
        let at = parse_name("blocks.2.attn.hook_z", Some(Kind::Dec)).unwrap();
        assert_eq!(at, At::new(Kind::Dec, 2, Point::Z));
    }

    #[test]
    fn bad_names_say_why() {
        let e = parse_name("enc.blocks.0.attn.hook_patern", None).unwrap_err();
        assert!(e.contains("unknown point 'attn.hook_patern' (did you mean 'attn.hook_pattern'?)"), "{e}");
        assert!(parse_name("blocks.0.hook_resid_pre", None).unwrap_err().contains("no attention kind"));
        assert!(parse_name("enc.blocks.x.hook_resid_pre", None).unwrap_err().contains("'x' is not a layer number"));
        assert!(parse_name("enc.hook_resid_pre", None).unwrap_err().contains("belongs to a layer"));
        assert!(parse_name("enc.blocks.1.hook_embed", None).unwrap_err().contains("belongs to no layer"));
    }

    #[test]
    fn interventions_touch_only_their_selection() {
        // [B=2, H=3, T=4, dh=2]
        let x = Tensor::arange(48, (DType::Double, Device::Cpu)).view([2, 3, 4, 2]);
        let at = At::new(Kind::Enc, 0, Point::Z);
        let i = Intervention {
            at,
            op: Op::Replace(Tensor::zeros([1], (DType::Double, Device::Cpu))),
            heads: Some(vec![1]),
            positions: Some(vec![2, 3]),
            rows: Some(vec![1]),
        };
        let y = i.apply(&x).unwrap();
        let changed = x.ne_tensor(&y).sum(DType::Int64).int64_value(&[]);
        assert_eq!(changed, 2 * 2, "row 1, head 1, positions 2 and 3, both dims (value 0 at none of them)");
        assert_eq!(y.double_value(&[1, 1, 2, 0]), 0.0);
        assert_eq!(y.double_value(&[0, 1, 2, 0]), x.double_value(&[0, 1, 2, 0]));
        // A [pos, head, d_head] value is read in TransformerLens's axes.
        let v = Tensor::arange(24, (DType::Double, Device::Cpu)).view([4, 3, 2]);
        let y = Intervention { at, op: Op::Add(v.shallow_clone()), heads: None, positions: None, rows: None }
            .apply(&x)
            .unwrap();
        assert_eq!(y.double_value(&[0, 2, 1, 1]) - x.double_value(&[0, 2, 1, 1]), v.double_value(&[1, 2, 1]));
        // Out of range and misfit values are errors naming the point.
        let e = Intervention { at, op: Op::Scale(0.0), heads: Some(vec![3]), positions: None, rows: None }
            .apply(&x)
            .unwrap_err()
            .to_string();
        assert!(e.contains("enc.blocks.0.attn.hook_z") && e.contains("head 3 out of range 0..2"), "{e}");
        let e = Intervention {
            at,
            op: Op::Add(Tensor::zeros([5], (DType::Double, Device::Cpu))),
            heads: None,
            positions: None,
            rows: None,
        }
        .apply(&x)
        .unwrap_err()
        .to_string();
        assert!(e.contains("does not fit") && e.contains("[4, 3, 2]"), "{e}");
    }
}
