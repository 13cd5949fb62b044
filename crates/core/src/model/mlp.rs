//! The MLP of a stack layer (the part that reads each position's residual stream and writes
//! back to it) behind one interface, [`Mlp`], as the token mixer is behind
//! [`super::mixer::Mixer`]: its forward with the hook points it visits, its parameters, the width
//! of its intermediate, and whether it reads each position alone. A dense MLP
//! ([`super::nn::Ffn`], gated or not) is the kind most families load; a mixture of experts
//! ([`super::experts`]) is the other (routed token by token, so position-wise; a kind with
//! capacity limits would not be, and resumed passes that flatten positions would refuse it).
//!
//! Adding a kind is a file that implements [`Mlp`] and its name in [`KINDS`].

use super::experts::ExpertGate;
use super::hooks::{At, HookSlot};
use super::mixer::Inside;
use super::nn::{Ffn, Params};
use super::{Kind, ModelError};
use tch::Tensor;

/// The MLP kinds headscope knows, by the name [`Mlp::kind`] reports.
pub const KINDS: &[&str] = &["dense", "experts"];

/// One layer's MLP.
pub trait Mlp: Send {
    /// The kind's name, one of [`KINDS`] (or a test's own).
    fn kind(&self) -> &'static str;

    /// The MLP's output `[.., D]` for its input `x [.., D]` (after the layer's norm), every hook
    /// point of [`Mlp::points`] seen by `h`; `experts`: the layer's expert gates `[width]`
    /// (`super::nn::ExpertGates`), read by a kind with experts.
    fn forward(
        &self,
        x: &Tensor,
        experts: Option<&ExpertGate>,
        kind: Kind,
        layer: usize,
        h: &mut HookSlot,
        inside: Inside,
    ) -> Result<Tensor, ModelError>;

    /// The hook points [`Mlp::forward`] visits at `(kind, layer)`, in order, through
    /// `hook_mlp_out`.
    fn points(&self, kind: Kind, layer: usize, out: &mut Vec<At>);

    /// The MLP's parameters under `prefix`, in a fixed order (TransformerLens's names).
    fn params_mut<'a>(&'a mut self, prefix: &str, out: &mut Params<'a>);

    /// Whether each position's output reads that position alone, so that rows at different
    /// positions may run as one flattened batch (resumed passes, `super::resume`).
    fn position_wise(&self) -> bool {
        true
    }

    /// The numbers its widest intermediate holds per token (what bounds a resumed pass's
    /// memory).
    fn width(&self) -> i64;

    /// The MLP as a dense one, where it is one (LRP's rules read its weights and refuse other
    /// kinds by name).
    fn as_dense(&self) -> Option<&Ffn> {
        None
    }

    /// The MLP as its own type, for an analysis that knows the kind's parts (the expert
    /// analyses read and prune a [`super::experts::Experts`]); `None` where a kind offers none.
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }

    /// [`Mlp::as_any`], to change.
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        None
    }
}

impl Mlp for Ffn {
    fn kind(&self) -> &'static str {
        "dense"
    }
    fn forward(
        &self,
        x: &Tensor,
        _: Option<&ExpertGate>,
        kind: Kind,
        layer: usize,
        h: &mut HookSlot,
        _: Inside,
    ) -> Result<Tensor, ModelError> {
        Ok(self.forward_hooked(x, kind, layer, h)?.2)
    }
    fn points(&self, kind: Kind, layer: usize, out: &mut Vec<At>) {
        Ffn::points(self, kind, layer, out)
    }
    fn params_mut<'a>(&'a mut self, prefix: &str, out: &mut Params<'a>) {
        Ffn::params_mut(self, prefix, out)
    }
    fn position_wise(&self) -> bool {
        Ffn::position_wise(self)
    }
    fn width(&self) -> i64 {
        self.up.w.size()[0].max(self.down.w.size()[0])
    }
    fn as_dense(&self) -> Option<&Ffn> {
        Some(self)
    }
}

/// A kind chosen at load time, layer by layer (a mixture of experts' dense layers beside its
/// sparse ones): the boxed MLP is the MLP.
impl Mlp for Box<dyn Mlp> {
    fn kind(&self) -> &'static str {
        self.as_ref().kind()
    }
    fn forward(
        &self,
        x: &Tensor,
        experts: Option<&ExpertGate>,
        kind: Kind,
        layer: usize,
        h: &mut HookSlot,
        inside: Inside,
    ) -> Result<Tensor, ModelError> {
        self.as_ref().forward(x, experts, kind, layer, h, inside)
    }
    fn points(&self, kind: Kind, layer: usize, out: &mut Vec<At>) {
        self.as_ref().points(kind, layer, out)
    }
    fn params_mut<'a>(&'a mut self, prefix: &str, out: &mut Params<'a>) {
        self.as_mut().params_mut(prefix, out)
    }
    fn position_wise(&self) -> bool {
        self.as_ref().position_wise()
    }
    fn width(&self) -> i64 {
        self.as_ref().width()
    }
    fn as_dense(&self) -> Option<&Ffn> {
        self.as_ref().as_dense()
    }
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        self.as_ref().as_any()
    }
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        self.as_mut().as_any_mut()
    }
}
