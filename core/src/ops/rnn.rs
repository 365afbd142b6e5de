//! A recurrent layer's loop over time as one op on the tape, like cuDNN's
//! RNN: [`Tensor::try_rnn_layer`].
//!
//! Written as composed ops, an LSTM step is a dozen tape nodes (the hidden
//! projection, the sum with the input projection, four narrows and
//! activations, the cell update), each allocating, and its backward as
//! many again, one time step at a time. Here the caller projects every
//! time step's input in one GEMM beforehand (`x W_ih^T + b`, ordinary ops
//! on the tape), and this op runs the recurrence: per step one GEMM
//! `h W_hh^T` and one pass of the cell (its gate activations and update,
//! [`RnnKernel`]); the backward runs through time with one GEMM and one
//! cell pass per step, and gives `W_hh`'s gradient as one GEMM over every
//! step at the end. Backends without a cell kernel run the cell as
//! composed ops (untaped), with the same loop.

use crate::device::{Backend, Device};
use crate::dtype::Float;
use crate::error::{fmt_dims, Error, Result};
use crate::layout::Layout;
use crate::ops::cat::try_stack;
use crate::ops::matmul::PackedRhs;
use crate::shape::Dyn;
use crate::tape::{no_grad, Raw};
use crate::tensor::Tensor;

/// The op's name, for errors and the tape.
const NAME: &str = "rnn_layer";

/// A 2-D operand of a cell kernel: its storage and view.
pub type Operand<'a, S> = (&'a S, &'a Layout);

/// Which recurrence [`Tensor::try_rnn_layer`] runs, with PyTorch's gate
/// order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RnnMode {
    /// `nn.LSTM`'s cell: gates input, forget, cell, output (`G = 4`); the
    /// state is `(h, c)`. (Not named `Lstm`: a second item of that name
    /// makes rustc spell nn's `Lstm` by its full path in messages.)
    LongShortTermMemory,
    /// `nn.GRU`'s cell: gates reset, update, new (`G = 3`); the state is
    /// `h`.
    GatedRecurrentUnit,
}

impl RnnMode {
    /// The number of gates `G`: the projections are `[.., G * H]`.
    pub fn gates(self) -> usize {
        match self {
            RnnMode::LongShortTermMemory => 4,
            RnnMode::GatedRecurrentUnit => 3,
        }
    }
}

/// One time step of a recurrent cell, fused: the gate activations and the
/// state update in one pass, and their backward in one. Every operand is a
/// 2-D `[batch, n]` view (rows may be strided); every result is row-major.
/// The defaults decline (`Ok(None)`), and the op runs the cell as composed
/// ops.
pub trait RnnKernel<E: Float>: Backend {
    /// LSTM: with `gates = xp + hg` (`[b, 4H]`), `i, f, g, o` the sigmoid,
    /// sigmoid, tanh and sigmoid of its four blocks, `c = f * c_prev + i *
    /// g` and `h = o * tanh(c)`. Returns `[h, c, act]`, `act` the
    /// activated gates `[b, 4H]` in that order (the backward reads them).
    fn lstm_cell(
        &self,
        xp: Operand<'_, Self::Storage<E>>,
        hg: Operand<'_, Self::Storage<E>>,
        c_prev: Operand<'_, Self::Storage<E>>,
    ) -> Result<Option<[Self::Storage<E>; 3]>> {
        let _ = (xp, hg, c_prev);
        Ok(None)
    }

    /// LSTM's backward: from the activated gates, the states, and the
    /// gradients of `h` and `c` (each a sum of the operands listed), the
    /// gradient of the pre-activation gates `[b, 4H]` and of `c_prev`.
    fn lstm_cell_backward(
        &self,
        act: Operand<'_, Self::Storage<E>>,
        c_prev: Operand<'_, Self::Storage<E>>,
        c: Operand<'_, Self::Storage<E>>,
        dh: &[Operand<'_, Self::Storage<E>>],
        dc: &[Operand<'_, Self::Storage<E>>],
    ) -> Result<Option<[Self::Storage<E>; 2]>> {
        let _ = (act, c_prev, c, dh, dc);
        Ok(None)
    }

    /// GRU, as PyTorch: `r = σ(xp_r + hg_r)`, `z = σ(xp_z + hg_z)`,
    /// `n = tanh(xp_n + r * hg_n)`, `h = (1 - z) * n + z * h_prev`, with
    /// `xp` and `hg` `[b, 3H]` (each with its bias). Returns `[h, act]`,
    /// `act` being `[r, z, n, hg_n]` (`[b, 4H]`).
    fn gru_cell(
        &self,
        xp: Operand<'_, Self::Storage<E>>,
        hg: Operand<'_, Self::Storage<E>>,
        h_prev: Operand<'_, Self::Storage<E>>,
    ) -> Result<Option<[Self::Storage<E>; 2]>> {
        let _ = (xp, hg, h_prev);
        Ok(None)
    }

    /// GRU's backward: from `act`, `h_prev` and the gradient of `h` (a
    /// sum of the operands listed), the gradients of `xp` and `hg`
    /// (`[b, 3H]` each) and the part of `h_prev`'s that does not go through
    /// `hg` (`dh * z`).
    fn gru_cell_backward(
        &self,
        act: Operand<'_, Self::Storage<E>>,
        h_prev: Operand<'_, Self::Storage<E>>,
        dh: &[Operand<'_, Self::Storage<E>>],
    ) -> Result<Option<[Self::Storage<E>; 3]>> {
        let _ = (act, h_prev, dh);
        Ok(None)
    }
}

thread_local! {
    /// Set by [`with_composed_cells`].
    static COMPOSED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with the cells as composed ops even where the backend has a
/// fused kernel, forward and backward (on this thread): how the CPU's tests
/// compare the two, the composed form being what runs on CUDA.
#[doc(hidden)]
pub fn with_composed_cells<R>(f: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            COMPOSED.with(|c| c.set(self.0));
        }
    }
    let _reset = Reset(COMPOSED.with(|c| c.replace(true)));
    f()
}

/// Whether the backend's fused cell may run.
fn fused_cells() -> bool {
    !COMPOSED.with(std::cell::Cell::get)
}

/// An untaped 2-D tensor, the loop's currency.
type T2<E, D> = Tensor<(Dyn, Dyn), E, D>;

/// The view of `t` as a kernel operand.
macro_rules! operand {
    ($guard:expr, $t:expr) => {
        (&*$guard, &$t.layout)
    };
}

/// A right operand used at every time step: packed once where the backend
/// has a packed product (not under autocast, whose products round their
/// operands first).
struct Weight<E: Float, D: Device<E>> {
    b: T2<E, D>,
    packed: Option<PackedRhs>,
}

impl<E: Float, D: Device<E>> Weight<E, D> {
    fn new(b: T2<E, D>) -> Result<Self> {
        let dev = b.device().clone();
        let packed = match crate::autocast::autocast_dtype(&dev) {
            None => dev.pack_rhs(&b.storage(), &b.layout)?,
            Some(_) => None,
        };
        Ok(Weight { b, packed })
    }

    /// `a @ b`.
    fn mul(&self, a: &T2<E, D>) -> Result<T2<E, D>> {
        if let Some(p) = &self.packed {
            let dev = a.device().clone();
            if let Some(s) = dev.matmul_packed(&a.storage(), &a.layout, p)? {
                return Ok(T2::from_storage(s, &[a.size(0), p.n], dev));
            }
        }
        a.try_matmul(&self.b)
    }
}

/// Step `step` of `t` (`[b, T, n]`), viewed `[b, n]`.
fn flat<E: Float, D: Device<E>>(
    t: &Tensor<(Dyn, Dyn, Dyn), E, D>,
    step: usize,
) -> Result<T2<E, D>> {
    let (b, n) = (t.size(0), t.size(2));
    t.try_narrow::<1>(step, 1)?.try_reshape_to((Dyn(b), Dyn(n)))
}

/// A sum of tensors of one shape.
fn sum_all<E: Float, D: Device<E>>(parts: &[T2<E, D>]) -> T2<E, D> {
    let mut it = parts.iter();
    let first = it.next().expect("at least one addend").clone();
    it.fold(first, |acc, p| &acc + p)
}

/// `1 - x`.
fn one_minus<E: Float, D: Device<E>>(x: &T2<E, D>) -> T2<E, D> {
    x.mul_scalar(-1.0).add_scalar(1.0)
}

/// One LSTM step: `[h, c, act]`.
fn lstm_step<E: Float, D: Device<E>>(
    xp: &T2<E, D>,
    hg: &T2<E, D>,
    c_prev: &T2<E, D>,
) -> Result<[T2<E, D>; 3]> {
    let dev = xp.device().clone();
    let fused = if !fused_cells() {
        None
    } else {
        dev.lstm_cell(
            operand!(xp.storage(), xp),
            operand!(hg.storage(), hg),
            operand!(c_prev.storage(), c_prev),
        )?
    };
    let (b, h) = (c_prev.size(0), c_prev.size(1));
    if let Some([hs, cs, act]) = fused {
        let t = |s, n| T2::from_storage(s, &[b, n], dev.clone());
        return Ok([t(hs, h), t(cs, h), t(act, 4 * h)]);
    }
    let gates = xp + hg;
    let i = gates.try_narrow::<1>(0, h)?.sigmoid();
    let f = gates.try_narrow::<1>(h, h)?.sigmoid();
    let g = gates.try_narrow::<1>(2 * h, h)?.tanh();
    let o = gates.try_narrow::<1>(3 * h, h)?.sigmoid();
    let c = &(&f * c_prev) + &(&i * &g);
    let hn = &o * &c.tanh();
    let act = crate::ops::cat::try_cat::<1, _, _>(&[i, f, g, o])?;
    Ok([hn, c, act])
}

/// One LSTM step backward: `[dgates, dc_prev]`.
fn lstm_step_backward<E: Float, D: Device<E>>(
    act: &T2<E, D>,
    c_prev: &T2<E, D>,
    c: &T2<E, D>,
    dh: &[T2<E, D>],
    dc: &[T2<E, D>],
) -> Result<[T2<E, D>; 2]> {
    let dev = act.device().clone();
    let (b, h) = (c.size(0), c.size(1));
    if fused_cells() {
        let guards: Vec<_> = dh.iter().chain(dc).map(|t| t.storage()).collect();
        let ops: Vec<_> = guards
            .iter()
            .zip(dh.iter().chain(dc))
            .map(|(g, t)| (&**g, &t.layout))
            .collect();
        let fused = dev.lstm_cell_backward(
            operand!(act.storage(), act),
            operand!(c_prev.storage(), c_prev),
            operand!(c.storage(), c),
            &ops[..dh.len()],
            &ops[dh.len()..],
        )?;
        if let Some([dg, dcp]) = fused {
            let t = |s, n| T2::from_storage(s, &[b, n], dev.clone());
            return Ok([t(dg, 4 * h), t(dcp, h)]);
        }
    }
    let part = |k: usize| act.try_narrow::<1>(k * h, h);
    let (i, f, g, o) = (part(0)?, part(1)?, part(2)?, part(3)?);
    let dh = sum_all(dh);
    let tc = c.tanh();
    let dc = &sum_all(dc) + &(&(&dh * &o) * &one_minus(&tc.square()));
    let d_o = &(&(&dh * &tc) * &o) * &one_minus(&o);
    let di = &(&(&dc * &g) * &i) * &one_minus(&i);
    let df = &(&(&dc * c_prev) * &f) * &one_minus(&f);
    let dg = &(&dc * &i) * &one_minus(&g.square());
    let dgates = crate::ops::cat::try_cat::<1, _, _>(&[di, df, dg, d_o])?;
    Ok([dgates, &dc * &f])
}

/// One GRU step: `[h, act]`.
fn gru_step<E: Float, D: Device<E>>(
    xp: &T2<E, D>,
    hg: &T2<E, D>,
    h_prev: &T2<E, D>,
) -> Result<[T2<E, D>; 2]> {
    let dev = xp.device().clone();
    let fused = if !fused_cells() {
        None
    } else {
        dev.gru_cell(
            operand!(xp.storage(), xp),
            operand!(hg.storage(), hg),
            operand!(h_prev.storage(), h_prev),
        )?
    };
    let (b, h) = (h_prev.size(0), h_prev.size(1));
    if let Some([hs, act]) = fused {
        let t = |s, n| T2::from_storage(s, &[b, n], dev.clone());
        return Ok([t(hs, h), t(act, 4 * h)]);
    }
    let x = |k: usize| xp.try_narrow::<1>(k * h, h);
    let g = |k: usize| hg.try_narrow::<1>(k * h, h);
    let r = (&x(0)? + &g(0)?).sigmoid();
    let z = (&x(1)? + &g(1)?).sigmoid();
    let hn = g(2)?;
    let n = (&x(2)? + &(&r * &hn)).tanh();
    let out = &(&(h_prev - &n) * &z) + &n;
    let act = crate::ops::cat::try_cat::<1, _, _>(&[r, z, n, hn.contiguous()])?;
    Ok([out, act])
}

/// One GRU step backward: `[dxp, dhg, dh_prev]` (the last without the
/// part through `hg`).
fn gru_step_backward<E: Float, D: Device<E>>(
    act: &T2<E, D>,
    h_prev: &T2<E, D>,
    dh: &[T2<E, D>],
) -> Result<[T2<E, D>; 3]> {
    let dev = act.device().clone();
    let (b, h) = (h_prev.size(0), h_prev.size(1));
    if fused_cells() {
        let guards: Vec<_> = dh.iter().map(|t| t.storage()).collect();
        let ops: Vec<_> = guards
            .iter()
            .zip(dh)
            .map(|(g, t)| (&**g, &t.layout))
            .collect();
        let fused = dev.gru_cell_backward(
            operand!(act.storage(), act),
            operand!(h_prev.storage(), h_prev),
            &ops,
        )?;
        if let Some([dx, dg, dhp]) = fused {
            let t = |s, n| T2::from_storage(s, &[b, n], dev.clone());
            return Ok([t(dx, 3 * h), t(dg, 3 * h), t(dhp, h)]);
        }
    }
    let part = |k: usize| act.try_narrow::<1>(k * h, h);
    let (r, z, n, hn) = (part(0)?, part(1)?, part(2)?, part(3)?);
    let dh = sum_all(dh);
    let dn = &(&(&dh * &one_minus(&z)) * &one_minus(&n.square())).contiguous();
    let dz = &(&(&dh * &(h_prev - &n)) * &z) * &one_minus(&z);
    let dr = &(&(dn * &hn) * &r) * &one_minus(&r);
    let dxp = crate::ops::cat::try_cat::<1, _, _>(&[dr.clone(), dz.clone(), dn.clone()])?;
    let dhg = crate::ops::cat::try_cat::<1, _, _>(&[dr, dz, dn * &r])?;
    Ok([dxp, dhg, &dh * &z])
}

/// One layer's weights in one direction, under PyTorch's names:
/// `weight_ih` `[G * H, features]`, `weight_hh` `[G * H, H]`, the biases
/// `[G * H]` (both or neither).
#[derive(Debug)]
pub struct RnnLayerWeights<'a, E: Float, D: Device<E>> {
    /// `weight_ih_l{k}`.
    pub weight_ih: &'a Tensor<(Dyn, Dyn), E, D>,
    /// `weight_hh_l{k}`.
    pub weight_hh: &'a Tensor<(Dyn, Dyn), E, D>,
    /// `bias_ih_l{k}`.
    pub bias_ih: Option<&'a Tensor<(Dyn,), E, D>>,
    /// `bias_hh_l{k}`.
    pub bias_hh: Option<&'a Tensor<(Dyn,), E, D>>,
}

impl<E: Float, D: Device<E>> Tensor<(Dyn, Dyn, Dyn), E, D> {
    /// One recurrent layer in one direction from its input `self`
    /// (`[batch, T, features]`): every step's input projection as one
    /// product, the biases added (an LSTM's two as one sum; a GRU's
    /// `b_hh` goes inside its reset gate's product), then the recurrence
    /// ([`Tensor::try_rnn_layer`], whose output it returns). nn's LSTM and
    /// GRU run this, and so does a compiled graph's replay, so the two
    /// tapes are the same ops in the same order.
    ///
    /// # Errors
    /// As [`Tensor::try_rnn_layer`], and a shape error when `weight_ih`
    /// does not take `features`.
    pub fn try_rnn_from_input(
        &self,
        mode: RnnMode,
        w: RnnLayerWeights<'_, E, D>,
        h0: &Tensor<(Dyn, Dyn), E, D>,
        c0: Option<&Tensor<(Dyn, Dyn), E, D>>,
        reverse: bool,
    ) -> Result<Self> {
        let [b, t, features] = [self.size(0), self.size(1), self.size(2)];
        let lstm = mode == RnnMode::LongShortTermMemory;
        let flat = self.try_reshape_to((Dyn(b * t), Dyn(features)))?;
        let mut xp = flat.try_matmul(&w.weight_ih.t())?;
        let bias = match (w.bias_ih, w.bias_hh) {
            (Some(bi), Some(bh)) if lstm => Some(bi.try_zip(crate::ops::binary::Add, bh)?),
            (bi, _) => bi.cloned(),
        };
        if let Some(bias) = &bias {
            xp = xp.try_zip(crate::ops::binary::Add, bias)?;
        }
        let gates = w.weight_ih.size(0);
        let xp = xp.try_reshape_to((Dyn(b), Dyn(t), Dyn(gates)))?;
        let b_hh = if lstm { None } else { w.bias_hh };
        xp.try_rnn_layer(mode, w.weight_hh, b_hh, h0, c0, reverse)
    }

    /// Runs one recurrent layer (one direction) over time: `self` holds
    /// the input projections of every step, `[batch, T, G * H]`
    /// (`x W_ih^T + b_ih`; an LSTM may fold `b_hh` in too), `w_hh` is `[G * H, H]`,
    /// `b_hh` `[G * H]`, `h0` (and an LSTM's `c0`) `[batch, H]`. With
    /// `reverse` the steps run from the last to the first (a
    /// bidirectional layer's second direction).
    ///
    /// Returns every step's output, in time order: `[batch, T, 2H]` for
    /// an LSTM (`h` then `c` at each step, so the final `c` is on the tape
    /// too), `[batch, T, H]` for a GRU. One node on the tape.
    ///
    /// ```
    /// use forma::prelude::*;
    /// use forma::core::ops::rnn::RnnMode;
    /// // One step of a GRU with H = 1 and zero weights: r = z = n = 1/2,
    /// // tanh(0) = 0, so h = (1 - 1/2) * 0 + 1/2 * h0.
    /// let xp = Tensor::<(Dyn, Dyn, Dyn), f64>::zeros_with((Dyn(1), Dyn(1), Dyn(3)));
    /// let w = Tensor::<(Dyn, Dyn), f64>::zeros_with((Dyn(3), Dyn(1)));
    /// let h0 = Tensor::<(Dyn, Dyn), f64>::full_with((Dyn(1), Dyn(1)), 0.8);
    /// let y = xp.try_rnn_layer(RnnMode::GatedRecurrentUnit, &w, None, &h0, None, false).unwrap();
    /// assert_eq!(y.to_vec(), [0.4]);
    /// ```
    ///
    /// # Errors
    /// A shape error when the sizes do not fit together (or an LSTM gets
    /// no `c0`, a GRU one); an error when an operand is on another device.
    pub fn try_rnn_layer(
        &self,
        mode: RnnMode,
        w_hh: &Tensor<(Dyn, Dyn), E, D>,
        b_hh: Option<&Tensor<(Dyn,), E, D>>,
        h0: &Tensor<(Dyn, Dyn), E, D>,
        c0: Option<&Tensor<(Dyn, Dyn), E, D>>,
        reverse: bool,
    ) -> Result<Self> {
        let [b, t, gh] = [self.size(0), self.size(1), self.size(2)];
        let h = w_hh.size(1);
        let gates = mode.gates();
        let lstm = mode == RnnMode::LongShortTermMemory;
        let want = |what: &str, t: &[usize], dims: &[usize]| -> Result<()> {
            if t == dims {
                return Ok(());
            }
            Err(Error::shape(
                NAME,
                format!(
                    "{what} of {} (input projections {}, {gates} gates of {h})",
                    fmt_dims(t),
                    fmt_dims(&self.layout.dims)
                ),
                dims,
            ))
        };
        want("a w_hh", &[gates * h, h], &w_hh.layout.dims)?;
        want("projections", &[b, t, gates * h], &self.layout.dims)?;
        want("an h0", &[b, h], &h0.layout.dims)?;
        if let Some(bias) = b_hh {
            self.same_device(NAME, bias)?;
            want("a b_hh", &[gates * h], &bias.layout.dims)?;
        }
        match (lstm, c0) {
            (true, Some(c0)) => {
                self.same_device(NAME, c0)?;
                want("a c0", &[b, h], &c0.layout.dims)?;
            }
            (false, None) => {}
            (true, None) => return Err(Error::invalid(NAME, "an LSTM needs an initial c0")),
            (false, Some(_)) => return Err(Error::invalid(NAME, "a GRU has no cell state c0")),
        }
        self.same_device(NAME, w_hh)?;
        self.same_device(NAME, h0)?;
        debug_assert_eq!(gh, gates * h);
        let order: Vec<usize> = if reverse {
            (0..t).rev().collect()
        } else {
            (0..t).collect()
        };
        // Forward, untaped: every step's `h` (and `c`), and the activated
        // gates the backward reads.
        let (y, acts) = {
            let _g = no_grad();
            let xp = self.detach();
            let wt = Weight::new(w_hh.detach().t())?;
            let bias = b_hh.map(Tensor::detach);
            let mut hp = h0.detach();
            let mut cp = c0.map(Tensor::detach);
            let mut hs = vec![None; t];
            let mut cs = vec![None; t];
            let mut acts = vec![None; t];
            for &s in &order {
                let xs = flat(&xp, s)?;
                let mut hg = wt.mul(&hp)?;
                if let Some(bias) = &bias {
                    hg = &hg + bias;
                }
                if let Some(c) = &cp {
                    let [hn, cn, act] = lstm_step(&xs, &hg, c)?;
                    cs[s] = Some(cn.clone());
                    cp = Some(cn);
                    hp = hn;
                    acts[s] = Some(act);
                } else {
                    let [hn, act] = gru_step(&xs, &hg, &hp)?;
                    hp = hn;
                    acts[s] = Some(act);
                }
                hs[s] = Some(hp.clone());
            }
            let hs: Vec<_> = hs.into_iter().flatten().collect();
            let cs: Vec<_> = cs.into_iter().flatten().collect();
            let y = if t == 0 {
                let width = if lstm { 2 * h } else { h };
                Tensor::zeros_on((Dyn(b), Dyn(0), Dyn(width)), self.device())
            } else if lstm {
                let both: Vec<_> = hs
                    .iter()
                    .zip(&cs)
                    .map(|(h, c)| crate::ops::cat::try_cat::<1, _, _>(&[h.clone(), c.clone()]))
                    .collect::<Result<_>>()?;
                try_stack::<1, _, _>(&both)?
            } else {
                try_stack::<1, _, _>(&hs)?
            };
            let acts: Vec<Raw<E, D>> = acts.into_iter().flatten().map(|a| a.raw()).collect();
            (y, acts)
        };
        let inputs = [
            self.var.clone(),
            w_hh.var.clone(),
            b_hh.and_then(|b| b.var.clone()),
            h0.var.clone(),
            c0.and_then(|c| c.var.clone()),
        ];
        if inputs.iter().all(Option::is_none) {
            return Ok(y);
        }
        let need: Vec<bool> = inputs.iter().map(Option::is_some).collect();
        let mut saved = vec![w_hh.saved(), h0.saved(), y.saved()];
        saved.extend(c0.map(Tensor::saved));
        let (w, hz, cz, yr) = (
            w_hh.detach().raw(),
            h0.detach().raw(),
            c0.map(|c| c.detach().raw()),
            y.raw(),
        );
        Ok(y.record(NAME, &inputs, saved, move |g| {
            let y = Tensor::<(Dyn, Dyn, Dyn), E, D>::from_raw(yr.clone())?;
            let g = Tensor::<(Dyn, Dyn, Dyn), E, D>::from_raw(g.clone())?;
            let w = Weight::new(T2::<E, D>::from_raw(w.clone())?)?;
            let h0 = T2::<E, D>::from_raw(hz.clone())?;
            let c0 = cz.clone().map(T2::<E, D>::from_raw).transpose()?;
            let acts = acts
                .iter()
                .map(|a| T2::<E, D>::from_raw(a.clone()))
                .collect::<Result<Vec<_>>>()?;
            // Step `s`'s h and c, and the state before it.
            let hy = |s: usize| flat(&y.try_narrow::<2>(0, h)?, s);
            let cy = |s: usize| flat(&y.try_narrow::<2>(h, h)?, s);
            let prev = |k: usize| (k > 0).then(|| order[k - 1]);
            let gy_h = g.try_narrow::<2>(0, h)?;
            let gy_c = if lstm {
                Some(g.try_narrow::<2>(h, h)?)
            } else {
                None
            };
            let mut dxp = vec![None; t];
            let mut dhg = vec![None; t];
            let mut dh_rec: Vec<T2<E, D>> = Vec::new();
            let mut dc_rec: Option<T2<E, D>> = None;
            for k in (0..t).rev() {
                let s = order[k];
                let mut dh = vec![flat(&gy_h, s)?];
                dh.append(&mut dh_rec);
                if let (Some(gy_c), Some(c0)) = (&gy_c, &c0) {
                    let c_prev = match prev(k) {
                        Some(p) => cy(p)?,
                        None => c0.clone(),
                    };
                    let mut dc = vec![flat(gy_c, s)?];
                    dc.extend(dc_rec.take());
                    let [dg, dcp] = lstm_step_backward(&acts[s], &c_prev, &cy(s)?, &dh, &dc)?;
                    dh_rec = vec![w.mul(&dg)?];
                    dc_rec = Some(dcp);
                    dxp[s] = Some(dg);
                } else {
                    let h_prev = match prev(k) {
                        Some(p) => hy(p)?,
                        None => h0.clone(),
                    };
                    let [dx, dg, dhp] = gru_step_backward(&acts[s], &h_prev, &dh)?;
                    dh_rec = vec![dhp, w.mul(&dg)?];
                    dhg[s] = Some(dg);
                    dxp[s] = Some(dx);
                }
            }
            let stacked = |parts: Vec<Option<T2<E, D>>>| -> Result<Tensor<(Dyn, Dyn, Dyn), E, D>> {
                let parts: Vec<_> = parts.into_iter().flatten().collect();
                if parts.is_empty() {
                    return Ok(Tensor::zeros_on((Dyn(b), Dyn(0), Dyn(gh)), g.device()));
                }
                try_stack::<1, _, _>(&parts)
            };
            let mut grads: Vec<Option<Raw<E, D>>> = vec![None; 5];
            let rows = b * t;
            // An LSTM's `dhg` is its `dxp` (the two are summed into one
            // pre-activation).
            let dxp_all = (need[0] || lstm).then(|| stacked(dxp)).transpose()?;
            if need[0] {
                grads[0] = dxp_all.as_ref().map(Tensor::raw);
            }
            if need[1] || need[2] {
                let dhg_all = match &dxp_all {
                    Some(d) if lstm => d.clone(),
                    _ => stacked(dhg)?,
                };
                let dhg_all = dhg_all.try_reshape_to((Dyn(rows), Dyn(gh)))?;
                if need[1] {
                    // Each step's `h_prev`, in time order, against its
                    // `dhg`: one GEMM over every step.
                    let mut hp = vec![None; t];
                    for (k, &s) in order.iter().enumerate() {
                        hp[s] = Some(match prev(k) {
                            Some(p) => hy(p)?,
                            None => h0.clone(),
                        });
                    }
                    let hp: Vec<_> = hp.into_iter().flatten().collect();
                    let hp_all = if t == 0 {
                        T2::<E, D>::zeros_on((Dyn(0), Dyn(h)), g.device())
                    } else {
                        try_stack::<1, _, _>(&hp)?.try_reshape_to((Dyn(rows), Dyn(h)))?
                    };
                    grads[1] = Some(dhg_all.t().try_matmul(&hp_all)?.raw());
                }
                if need[2] {
                    grads[2] = Some(dhg_all.sum::<0>().raw());
                }
            }
            let rec = |parts: Vec<T2<E, D>>, dims: [usize; 2]| -> Raw<E, D> {
                if parts.is_empty() {
                    T2::<E, D>::zeros_on((Dyn(dims[0]), Dyn(dims[1])), g.device()).raw()
                } else {
                    sum_all(&parts).raw()
                }
            };
            if need[3] {
                grads[3] = Some(rec(dh_rec, [b, h]));
            }
            if need[4] {
                grads[4] = Some(rec(dc_rec.into_iter().collect(), [b, h]));
            }
            Ok(grads)
        }))
    }
}
