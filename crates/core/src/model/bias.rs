//! The additive attention bias of one pass over a stack (docs/methods.md#score-tiles): either
//! a tensor (`[B|1, 1|H, Tq, Tk]`, as the fused kernel and the whole-pattern path read it), or,
//! in a pass that hands score tiles, a *described* bias (the keys' padding plus the causal,
//! window and chunk structure) whose rows a tile builds for itself, so no `Tq x Tk` tensor is
//! held: at 32k tokens the dense bias alone would be 4.3 GB.
//!
//! Both forms give the same numbers: [`Bias::rows`] of a described bias is, value for value, the
//! rows of [`Bias::dense`] (the same `-1e9` terms summed in the same order as
//! [`super::nn::causal_bias`], [`super::transformer::window_bias`] and
//! [`super::transformer::chunk_bias`]; `tests/models/tiles.rs` compares them).

use std::cell::OnceCell;

use tch::{Kind as DType, Tensor};

use super::ModelError;

/// The additive bias over keys of one attention call.
pub enum Bias {
    /// Materialised, broadcastable to `[B, H, Tq, Tk]`.
    Dense(Tensor),
    /// Described: query `i` at position `i` (no earlier steps) over the same `T` keys.
    Described(Described),
}

/// A bias over `t` queries and keys, described rather than held.
pub struct Described {
    /// The keys' padding, additive `[B, 1, 1, T]` (`super::nn::key_bias`).
    keys: Tensor,
    t: i64,
    /// Later keys hidden (a decoder-only stack).
    causal: bool,
    /// The stack's own window (Mistral): key `j` hidden from query `i` when `j <= i - w`.
    stack_window: Option<i64>,
    /// A layer's window (Gemma 2, gpt-oss): the same rule, a term of its own.
    layer_window: Option<i64>,
    /// A layer's chunks (Llama 4): key `j` hidden when `j < floor(i / c) c`.
    chunk: Option<i64>,
    /// [`Bias::dense`]'s tensor, built once if a path asks for it.
    dense: OnceCell<Tensor>,
    /// Whether no key is padding (the keys' bias all 0), found once.
    unpadded: OnceCell<bool>,
}

impl Bias {
    /// The bias over `t` positions with the keys' padding `keys [B, 1, 1, T]`, causal or not,
    /// and a causal stack's `window`, described.
    pub fn described(keys: Tensor, t: i64, causal: bool, window: Option<i64>) -> Bias {
        let stack_window = window.filter(|_| causal);
        Bias::Described(Described {
            keys,
            t,
            causal,
            stack_window,
            layer_window: None,
            chunk: None,
            dense: OnceCell::new(),
            unpadded: OnceCell::new(),
        })
    }

    /// The whole bias as a tensor (built once for a described bias, on the first ask).
    pub fn dense(&self) -> Result<Tensor, ModelError> {
        match self {
            Bias::Dense(t) => Ok(t.shallow_clone()),
            Bias::Described(c) => {
                if let Some(d) = c.dense.get() {
                    return Ok(d.shallow_clone());
                }
                let d = c.rows(0, c.t)?;
                Ok(c.dense.get_or_init(|| d).shallow_clone())
            }
        }
    }

    /// Query rows `q0 .. q0 + n` of the bias (`tq` queries in all): `[B|1, 1|H, n, Tk]`, or
    /// the bias itself where it is the same for every query row.
    pub fn rows(&self, q0: i64, n: i64, tq: i64) -> Result<Tensor, ModelError> {
        match self {
            Bias::Dense(t) => dense_rows(t, q0, n, tq),
            Bias::Described(c) => c.rows(q0, n),
        }
    }

    /// How query rows `q0 .. q0 + n` (of `tq`) meet the `tk` keys (docs/methods.md#score-tiles):
    /// the keys some row sees and those whose bias is 0 in every row. A described bias over
    /// unpadded keys answers from its rules alone; any other scans the tile's bias rows.
    pub fn tile(&self, q0: i64, n: i64, tq: i64, tk: i64) -> Result<TileBias<'_>, ModelError> {
        if let Bias::Described(c) = self {
            if tk == c.t && tq == c.t && c.unpadded()? {
                let (keys, clear) = c.reach(q0, n);
                return Ok(TileBias { bias: self, q0, n, tq, tk, keys, clear, rows: OnceCell::new() });
            }
        }
        let rows = self.rows(q0, n, tq)?;
        let keys = super::nn::visible_keys(&rows, tk)?;
        Ok(TileBias { bias: self, q0, n, tq, tk, keys, clear: (keys.0, keys.0), rows: OnceCell::from(rows) })
    }

    /// This bias with a layer's window and chunks added (`past` earlier steps, `t` new
    /// queries): a described bias stays described when nothing came before.
    pub fn with_layer(
        &self,
        t: i64,
        past: i64,
        window: Option<i64>,
        chunk: Option<i64>,
        dtype: DType,
        device: tch::Device,
    ) -> Result<Bias, ModelError> {
        if let Bias::Described(c) = self {
            if past == 0 && t == c.t && c.layer_window.is_none() && c.chunk.is_none() {
                return Ok(Bias::Described(Described {
                    keys: c.keys.shallow_clone(),
                    t,
                    causal: c.causal,
                    stack_window: c.stack_window,
                    layer_window: window,
                    chunk,
                    dense: OnceCell::new(),
                    unpadded: c.unpadded.clone(),
                }));
            }
        }
        let mut b = self.dense()?;
        if let Some(w) = window {
            b = b + super::transformer::window_bias(t, past, w, dtype, device);
        }
        if let Some(c) = chunk {
            b = b + super::transformer::chunk_bias(t, past, c, dtype, device)?;
        }
        Ok(Bias::Dense(b))
    }

    /// The bias on `device` (a described one moves its keys' padding alone).
    pub fn to_device(&self, device: tch::Device) -> Result<Bias, ModelError> {
        Ok(match self {
            Bias::Dense(t) => Bias::Dense(t.f_to_device(device)?),
            Bias::Described(c) => Bias::Described(Described {
                keys: c.keys.f_to_device(device)?,
                t: c.t,
                causal: c.causal,
                stack_window: c.stack_window,
                layer_window: c.layer_window,
                chunk: c.chunk,
                dense: OnceCell::new(),
                unpadded: c.unpadded.clone(),
            }),
        })
    }

    /// The bias's dtype and device.
    pub fn kind_device(&self) -> (DType, tch::Device) {
        let t = match self {
            Bias::Dense(t) => t,
            Bias::Described(c) => &c.keys,
        };
        (t.kind(), t.device())
    }

    /// Whether this bias is held as a tensor of every query row.
    pub fn is_dense(&self) -> bool {
        matches!(self, Bias::Dense(_))
    }
}

impl Described {
    /// Whether no key is padding.
    fn unpadded(&self) -> Result<bool, ModelError> {
        if let Some(&u) = self.unpadded.get() {
            return Ok(u);
        }
        let u = bool::try_from(self.keys.f_eq(0.0)?.f_all()?)?;
        Ok(*self.unpadded.get_or_init(|| u))
    }

    /// For rows `q0 .. q0 + n` over unpadded keys, from the rules alone: the keys `k0 .. k1`
    /// some row sees (row `i` sees `j` when `j <= i` in a causal stack, `j > i - w` under each
    /// window, `j >= floor(i / c) c` under chunks; every bound grows with `i` and each row sees
    /// itself, so they are one span from row `q0`'s lowest to the last row's highest) and the
    /// keys `c0 .. c1` every row sees (their bias is 0): from the last row's lowest to row
    /// `q0`'s highest.
    fn reach(&self, q0: i64, n: i64) -> ((i64, i64), (i64, i64)) {
        let last = q0 + n - 1;
        let lowest = |i: i64| {
            let mut lo = 0;
            for w in [self.stack_window, self.layer_window].into_iter().flatten() {
                lo = lo.max(i - w.max(1) + 1);
            }
            if let Some(c) = self.chunk {
                let c = c.max(1);
                lo = lo.max(i.div_euclid(c) * c);
            }
            lo.clamp(0, self.t)
        };
        let highest = |i: i64| if self.causal { (i + 1).min(self.t) } else { self.t };
        let keys = (lowest(q0), highest(last));
        let (c0, c1) = (lowest(last), highest(q0));
        (keys, if c0 < c1 { (c0, c1) } else { (keys.0, keys.0) })
    }

    /// Rows `q0 .. q0 + n`: the keys' padding, plus `-1e9` for each rule that hides a key,
    /// summed as the dense path sums them.
    fn rows(&self, q0: i64, n: i64) -> Result<Tensor, ModelError> {
        self.rows_of(q0, n, 0, self.t)
    }

    /// Rows `q0 .. q0 + n` over keys `k0 .. k1` alone (the same values as [`Described::rows`]
    /// there), `[B|1, 1, n|1, k1 - k0]`.
    fn rows_of(&self, q0: i64, n: i64, k0: i64, k1: i64) -> Result<Tensor, ModelError> {
        let keys =
            if (k0, k1) == (0, self.t) { self.keys.shallow_clone() } else { self.keys.f_narrow(3, k0, k1 - k0)? };
        if !self.causal && self.layer_window.is_none() && self.chunk.is_none() {
            // Padding alone: the same for every row.
            return Ok(keys);
        }
        let m = k1 - k0;
        let (dtype, device) = (self.keys.kind(), self.keys.device());
        let q = Tensor::f_arange_start(q0, q0 + n, (DType::Int64, device))?.f_view([n, 1])?;
        let k = Tensor::f_arange_start(k0, k1, (DType::Int64, device))?.f_view([1, m])?;
        let term = |hidden: Tensor| -> Result<Tensor, ModelError> {
            Ok(hidden.f_to_kind(dtype)?.f_mul_scalar(-1e9)?.f_view([1, 1, n, m])?)
        };
        // nn::causal_bias: later keys, and with the stack's window, keys `j <= i - w`.
        let mut b = keys;
        if self.causal {
            let mut hidden = k.f_gt_tensor(&q)?;
            if let Some(w) = self.stack_window {
                hidden = hidden.f_logical_or(&k.f_le_tensor(&q.f_sub_scalar(w.max(1))?)?)?;
            }
            b = b.f_add(&term(hidden)?)?;
        }
        if let Some(w) = self.layer_window {
            b = b.f_add(&term(k.f_le_tensor(&q.f_sub_scalar(w.max(1))?)?)?)?;
        }
        if let Some(c) = self.chunk {
            let c = c.max(1);
            let first = q.f_floor_divide_scalar(c)?.f_mul_scalar(c)?;
            b = b.f_add(&term(k.f_lt_tensor(&first)?)?)?;
        }
        Ok(b)
    }
}

/// One score tile's bias ([`Bias::tile`]): the keys `k0 .. k1` some row sees, and within them
/// the keys `c0 .. c1` whose bias is 0 in every row (nothing to add there).
pub struct TileBias<'a> {
    bias: &'a Bias,
    q0: i64,
    n: i64,
    tq: i64,
    tk: i64,
    /// `(k0, k1)`.
    pub keys: (i64, i64),
    /// `(c0, c1)`, empty when `c0 == c1`.
    pub clear: (i64, i64),
    rows: OnceCell<Tensor>,
}

impl TileBias<'_> {
    /// The tile's bias rows over every key (`[B|1, 1|H, n|1, tk]`), built on the first ask.
    pub fn rows(&self) -> Result<Tensor, ModelError> {
        if let Some(r) = self.rows.get() {
            return Ok(r.shallow_clone());
        }
        let r = self.bias.rows(self.q0, self.n, self.tq)?;
        Ok(self.rows.get_or_init(|| r).shallow_clone())
    }

    /// The bias over keys `a .. b`.
    fn cols(&self, a: i64, b: i64) -> Result<Tensor, ModelError> {
        if let (None, Bias::Described(c)) = (self.rows.get(), self.bias) {
            return c.rows_of(self.q0, self.n, a, b);
        }
        let r = self.rows()?;
        Ok(if (a, b) != (0, self.tk) && r.size().last() == Some(&self.tk) { r.f_narrow(-1, a, b - a)? } else { r })
    }

    /// `s + bias` over the tile's keys (`s`: `[B, H, n, k1 - k0]`, the raw scores), the same
    /// values as the whole path's sum: the bias is added only outside the clear keys (adding 0
    /// changes no value), in place where `s` carries no gradient.
    pub fn add_to(&self, mut s: Tensor) -> Result<Tensor, ModelError> {
        let (k0, k1) = self.keys;
        let (c0, c1) = self.clear;
        if s.requires_grad() {
            return Ok(s.f_add(&self.cols(k0, k1)?)?);
        }
        if c0 >= c1 {
            let _ = s.f_add_(&self.cols(k0, k1)?)?;
            return Ok(s);
        }
        for (a, b) in [(k0, c0), (c1, k1)] {
            if a < b {
                let _ = s.f_narrow(-1, a - k0, b - a)?.f_add_(&self.cols(a, b)?)?;
            }
        }
        Ok(s)
    }
}

/// Query rows `q0 .. q0 + n` of a bias tensor over `tq` queries, or the tensor itself where it
/// has one row for all (`[B, 1, 1, Tk]`).
pub fn dense_rows(t: &Tensor, q0: i64, n: i64, tq: i64) -> Result<Tensor, ModelError> {
    Ok(if t.dim() == 4 && t.size()[2] == tq && tq > 1 { t.f_narrow(2, q0, n)? } else { t.shallow_clone() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::nn::{causal_bias, key_bias};
    use crate::model::transformer::{chunk_bias, window_bias};
    use tch::Device;

    /// Every row block of a described bias equals the same rows of the tensor the dense path
    /// sums (padding, causal with the stack's window, a layer's window, chunks), value for
    /// value: for tile heights that do not divide the length, and with padding in a row.
    #[test]
    fn described_rows_are_the_dense_rows() {
        let t = 11i64;
        let mask = Tensor::from_slice(&[1i64, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1])
            .view([2, t])
            .to_kind(DType::Float);
        for dtype in [DType::Float, DType::Double, DType::BFloat16] {
            let keys = key_bias(&mask, dtype);
            for causal in [true, false] {
                for (sw, lw, chunk) in
                    [(None, None, None), (Some(4), None, None), (None, Some(3), Some(5)), (Some(6), Some(2), None)]
                {
                    let sw = sw.filter(|_| causal);
                    let mut dense =
                        if causal { &keys + causal_bias(t, sw, dtype, Device::Cpu) } else { keys.shallow_clone() };
                    if let Some(w) = lw {
                        dense = dense + window_bias(t, 0, w, dtype, Device::Cpu);
                    }
                    if let Some(c) = chunk {
                        dense = dense + chunk_bias(t, 0, c, dtype, Device::Cpu).unwrap();
                    }
                    let b = Bias::described(keys.shallow_clone(), t, causal, sw)
                        .with_layer(t, 0, lw, chunk, dtype, Device::Cpu)
                        .unwrap();
                    let full = b.dense().unwrap().expand([2, 1, t, t], false);
                    assert!(
                        full.equal(&dense.expand([2, 1, t, t], false)),
                        "{dtype:?} {causal} {sw:?} {lw:?} {chunk:?}"
                    );
                    for n in [1, 3, 4, t] {
                        let mut q0 = 0;
                        while q0 < t {
                            let m = n.min(t - q0);
                            let rows = b.rows(q0, m, t).unwrap().expand([2, 1, m, t], false);
                            assert!(
                                rows.equal(&full.narrow(2, q0, m)),
                                "rows {q0}+{m} {dtype:?} {causal} {lw:?} {chunk:?}"
                            );
                            q0 += m;
                        }
                    }
                }
            }
        }
    }

    /// A tile's keys from the rules alone ([`Bias::tile`] over unpadded keys) are the span the
    /// scan of its rows finds, and its clear keys are exactly those with bias 0 in every row;
    /// the bias added outside them gives the whole sum, value for value (causal or not, the
    /// stack's window, a layer's window, chunks; heights that do not divide the length).
    #[test]
    fn a_tiles_reach_is_what_its_rows_show() {
        let t = 13i64;
        let keys = key_bias(&Tensor::ones([1, t], (DType::Float, Device::Cpu)), DType::Float);
        for causal in [true, false] {
            for (sw, lw, chunk) in [
                (None, None, None),
                (Some(4), None, None),
                (None, Some(3), Some(5)),
                (Some(6), Some(2), None),
                (None, None, Some(4)),
            ] {
                let sw = sw.filter(|_| causal);
                let b = Bias::described(keys.shallow_clone(), t, causal, sw)
                    .with_layer(t, 0, lw, chunk, DType::Float, Device::Cpu)
                    .unwrap();
                for n in [1, 3, 5, t] {
                    let mut q0 = 0;
                    while q0 < t {
                        let m = n.min(t - q0);
                        let tb = b.tile(q0, m, t, t).unwrap();
                        let rows = b.rows(q0, m, t).unwrap().expand([1, 1, m, t], false);
                        let what = format!("{causal} {sw:?} {lw:?} {chunk:?} rows {q0}+{m}");
                        assert_eq!(tb.keys, crate::model::nn::visible_keys(&rows, t).unwrap(), "{what}");
                        let zero: Vec<bool> = Vec::try_from(rows.eq(0.0).all_dim(2, false).view([t])).unwrap();
                        let (c0, c1) = tb.clear;
                        for (j, z) in zero.iter().enumerate() {
                            let j = j as i64;
                            assert_eq!(*z, c0 <= j && j < c1, "{what}: key {j} clear {:?}", tb.clear);
                        }
                        let raw = Tensor::randn([1, 2, m, tb.keys.1 - tb.keys.0], (DType::Float, Device::Cpu));
                        let want = &raw + rows.narrow(3, tb.keys.0, tb.keys.1 - tb.keys.0);
                        assert!(tb.add_to(raw.copy()).unwrap().equal(&want), "{what}: the sum");
                        q0 += m;
                    }
                }
            }
        }
    }
}
