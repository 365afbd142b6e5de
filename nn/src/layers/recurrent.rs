//! Recurrent layers: [`Lstm`] (with `proj_size`) and [`Gru`], like
//! PyTorch's `nn.LSTM` and `nn.GRU` with `batch_first=True`: the same
//! parameter names (`weight_ih_l0`, `bias_hh_l1_reverse`, `weight_hr_l0`,
//! ...), shapes, gate order, initialisation and arithmetic.

use super::dropout::{check_dropout, DropoutRng};
use super::restore;
use crate::module::ok;
use crate::module::py_float;
use crate::module::Phase;
use crate::{Cx, Forward, Module, Role, Training, Visitor, VisitorMut};
use forma_core::device::Device;
use forma_core::ops::cat::{cat, stack, try_cat};
use forma_core::ops::rnn::{RnnLayerWeights, RnnMode};
use forma_core::shape::check::ConstMsg;
use forma_core::{Dim, Dyn, Error, Float, Result, Rng, Tensor, C};
use forma_cpu::Cpu;
use forma_macros::Module;

/// Asserts that the output features a caller states for a recurrent layer
/// are its hidden size times its number of directions. `None` (`Dyn`) is
/// always right.
pub const fn assert_rnn_features(
    layer: &str,
    hidden: usize,
    bidirectional: bool,
    stated: Option<usize>,
) {
    let want = if bidirectional { 2 * hidden } else { hidden };
    if let Some(stated) = stated {
        if stated != want {
            let dirs = if bidirectional {
                " in both directions"
            } else {
                ""
            };
            ConstMsg::new()
                .s(layer)
                .s(": a hidden size of ")
                .n(hidden)
                .s(dirs)
                .s(" gives ")
                .n(want)
                .s(" output features, not ")
                .n(stated)
                .panic()
        }
    }
}

/// The constructor arguments of a recurrent layer besides its sizes and
/// direction, with PyTorch's defaults: `num_layers=1`, `bias=True`,
/// `dropout=0` (between layers, in training mode). The layers are
/// batch-first ([`SeqFirst`](super::SeqFirst) gives `batch_first=False`);
/// an LSTM's `proj_size` is a type parameter ([`Lstm`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RnnOptions {
    /// Number of stacked layers.
    pub num_layers: usize,
    /// Whether the layers have biases.
    pub bias: bool,
    /// Dropout probability on the outputs of every layer but the last.
    pub dropout: f64,
}

impl Default for RnnOptions {
    fn default() -> Self {
        RnnOptions {
            num_layers: 1,
            bias: true,
            dropout: 0.0,
        }
    }
}

/// The parameters of one layer in one direction; `G` gates of size `H`
/// are stacked along the rows (LSTM: input, forget, cell, output; GRU:
/// reset, update, new). `R` is the width of the state fed back, `H` unless
/// an LSTM projects it (`proj_size`).
#[derive(Clone, Debug)]
pub struct RnnWeights<const H: usize, E: Float = f32, D: Device<E> = Cpu, const R: usize = H> {
    /// `weight_ih_l{k}`: `[G * H, input]` (input is the layer's input size,
    /// `R` or `2 * R` above the first layer).
    pub weight_ih: Tensor<(Dyn, Dyn), E, D>,
    /// `weight_hh_l{k}`: `[G * H, R]`.
    pub weight_hh: Tensor<(Dyn, C<R>), E, D>,
    /// `bias_ih_l{k}`: `[G * H]`, absent for `bias=False`.
    pub bias_ih: Option<Tensor<(Dyn,), E, D>>,
    /// `bias_hh_l{k}`: `[G * H]`, absent for `bias=False`.
    pub bias_hh: Option<Tensor<(Dyn,), E, D>>,
    /// `weight_hr_l{k}`: `[R, H]`, an LSTM's projection of its hidden state
    /// (`proj_size=R`); absent when `R` is `H`.
    pub weight_hr: Option<Tensor<(C<R>, C<H>), E, D>>,
}

impl<const H: usize, E: Float, D: Device<E>, const R: usize> RnnWeights<H, E, D, R> {
    /// `U(-1/sqrt(H), 1/sqrt(H))` for every tensor, like PyTorch's
    /// `reset_parameters`.
    fn init(gates: usize, input: usize, bias: bool, device: &D, rng: &mut Rng) -> Self {
        let k = if H == 0 { 0.0 } else { 1.0 / (H as f64).sqrt() };
        let rows = gates * H;
        let weight_ih =
            Tensor::uniform_on((Dyn(rows), Dyn(input)), -k, k, rng, device).requires_grad();
        let weight_hh = Tensor::uniform_on((Dyn(rows), C), -k, k, rng, device).requires_grad();
        let mut vector =
            || bias.then(|| Tensor::uniform_on((Dyn(rows),), -k, k, rng, device).requires_grad());
        let bias_ih = vector();
        let bias_hh = vector();
        let weight_hr =
            (R != H).then(|| Tensor::uniform_on((C, C), -k, k, rng, device).requires_grad());
        RnnWeights {
            weight_ih,
            weight_hh,
            bias_ih,
            bias_hh,
            weight_hr,
        }
    }

    /// `x W_ih^T + b_ih` for one step `[batch, input]`.
    fn input_projection(&self, x: &Tensor<(Dyn, Dyn), E, D>) -> Tensor<(Dyn, Dyn), E, D> {
        let y = x.matmul(&self.weight_ih.t());
        match &self.bias_ih {
            Some(b) => &y + b,
            None => y,
        }
    }

    /// `h W_hh^T + b_hh` for one step `[batch, R]`.
    fn hidden_projection(&self, h: &Tensor<(Dyn, Dyn), E, D>) -> Tensor<(Dyn, Dyn), E, D> {
        let y = h.matmul(&self.weight_hh.into_dyn().t());
        match &self.bias_hh {
            Some(b) => &y + b,
            None => y,
        }
    }

    /// `h W_hr^T`: the hidden state `[batch, H]` projected to `[batch, R]`
    /// (an LSTM's `proj_size`), or `h` itself.
    fn project_hidden(&self, h: Tensor<(Dyn, Dyn), E, D>) -> Tensor<(Dyn, Dyn), E, D> {
        match &self.weight_hr {
            Some(w) => h.matmul(&w.into_dyn().t()),
            None => h,
        }
    }
}

/// Every layer's and direction's [`RnnWeights`], named as PyTorch names
/// them: `weight_ih_l{k}`, `weight_hh_l{k}`, `bias_ih_l{k}`, `bias_hh_l{k}`,
/// with `_reverse` for the backward direction, layer by layer, forward
/// direction first.
///
/// `Module` is implemented by hand here: the layer index and direction are
/// part of each key's last segment (`weight_ih_l1_reverse`), not a dotted
/// path, and the number of layers is a run-time value, so neither a `Vec`
/// (`0.weight_ih`) nor `#[module(rename)]` (fixed keys) can produce these
/// names. The layers derive `Module` and hold this as a flattened field.
#[derive(Clone, Debug)]
pub struct RnnParams<const H: usize, E: Float = f32, D: Device<E> = Cpu, const R: usize = H> {
    /// The weights, at index `layer * directions + direction` (direction 1
    /// is the reverse one).
    pub cells: Vec<RnnWeights<H, E, D, R>>,
    directions: usize,
}

impl<const H: usize, E: Float, D: Device<E>, const R: usize> RnnParams<H, E, D, R> {
    fn init(
        gates: usize,
        input: usize,
        bidirectional: bool,
        options: &RnnOptions,
        device: &D,
        rng: &mut Rng,
    ) -> Self {
        let directions = if bidirectional { 2 } else { 1 };
        let mut cells = Vec::with_capacity(options.num_layers * directions);
        for layer in 0..options.num_layers {
            let input = if layer == 0 { input } else { R * directions };
            for _ in 0..directions {
                cells.push(RnnWeights::init(gates, input, options.bias, device, rng));
            }
        }
        RnnParams { cells, directions }
    }

    /// The weights of `layer` in the forward or the reverse direction.
    ///
    /// # Panics
    /// If there is no such layer or direction.
    pub fn get(&self, layer: usize, reverse: bool) -> &RnnWeights<H, E, D, R> {
        assert!(
            !reverse || self.directions == 2,
            "a unidirectional layer has no reverse weights"
        );
        &self.cells[layer * self.directions + reverse as usize]
    }

    /// The number of stacked layers.
    pub fn num_layers(&self) -> usize {
        self.cells.len() / self.directions
    }

    /// The key suffix of cell `i`: `l0`, `l0_reverse`, ...
    fn suffix(&self, i: usize) -> String {
        let rev = if i % self.directions == 1 {
            "_reverse"
        } else {
            ""
        };
        format!("l{}{rev}", i / self.directions)
    }
}

/// Enters a parameter key of the current module.
fn enter(cx: &mut Cx, key: &str) -> bool {
    cx.enter_field(Phase::Parameters, true, key, Role::Parameter)
}

/// By hand, as `Module` is: the cells are not a derived struct.
impl<const H: usize, E: Float, D: Device<E>, const R: usize, E2: Float, D2: Device<E2>>
    crate::module::Convert<RnnParams<H, E2, D2, R>, D2> for RnnParams<H, E, D, R>
{
    fn try_convert(&self, device: &D2) -> Result<RnnParams<H, E2, D2, R>> {
        Ok(RnnParams {
            cells: self
                .cells
                .iter()
                .map(|w| {
                    Ok(RnnWeights {
                        weight_ih: w.weight_ih.try_converted(device)?,
                        weight_hh: w.weight_hh.try_converted(device)?,
                        bias_ih: w.bias_ih.try_convert(device)?,
                        bias_hh: w.bias_hh.try_convert(device)?,
                        weight_hr: w.weight_hr.try_convert(device)?,
                    })
                })
                .collect::<Result<_>>()?,
            directions: self.directions,
        })
    }
}

impl<const H: usize, E: Float, D: Device<E>, const R: usize> Module for RnnParams<H, E, D, R> {
    fn visit<V: Visitor>(&self, cx: &mut Cx, v: &mut V) {
        for (i, w) in self.cells.iter().enumerate() {
            let sfx = self.suffix(i);
            if enter(cx, &format!("weight_ih_{sfx}")) {
                w.weight_ih.visit(cx, v);
                cx.leave();
            }
            if enter(cx, &format!("weight_hh_{sfx}")) {
                w.weight_hh.visit(cx, v);
                cx.leave();
            }
            if enter(cx, &format!("bias_ih_{sfx}")) {
                w.bias_ih.visit(cx, v);
                cx.leave();
            }
            if enter(cx, &format!("bias_hh_{sfx}")) {
                w.bias_hh.visit(cx, v);
                cx.leave();
            }
            if enter(cx, &format!("weight_hr_{sfx}")) {
                w.weight_hr.visit(cx, v);
                cx.leave();
            }
        }
    }

    fn visit_mut<V: VisitorMut>(&mut self, cx: &mut Cx, v: &mut V) {
        for i in 0..self.cells.len() {
            let sfx = self.suffix(i);
            let w = &mut self.cells[i];
            if enter(cx, &format!("weight_ih_{sfx}")) {
                w.weight_ih.visit_mut(cx, v);
                cx.leave();
            }
            if enter(cx, &format!("weight_hh_{sfx}")) {
                w.weight_hh.visit_mut(cx, v);
                cx.leave();
            }
            if enter(cx, &format!("bias_ih_{sfx}")) {
                w.bias_ih.visit_mut(cx, v);
                cx.leave();
            }
            if enter(cx, &format!("bias_hh_{sfx}")) {
                w.bias_hh.visit_mut(cx, v);
                cx.leave();
            }
            if enter(cx, &format!("weight_hr_{sfx}")) {
                w.weight_hr.visit_mut(cx, v);
                cx.leave();
            }
        }
    }
}

/// PyTorch's `RNNBase.extra_repr` for a batch-first layer.
fn rnn_extra_repr(
    (input, hidden, proj): (usize, usize, usize),
    options: &RnnOptions,
    bidirectional: bool,
) -> String {
    let mut s = format!("{input}, {hidden}");
    if proj != hidden {
        s += &format!(", proj_size={proj}");
    }
    if options.num_layers != 1 {
        s += &format!(", num_layers={}", options.num_layers);
    }
    if !options.bias {
        s += ", bias=False";
    }
    s += ", batch_first=True";
    if options.dropout != 0.0 {
        s += &format!(", dropout={}", py_float(options.dropout));
    }
    if bidirectional {
        s += ", bidirectional=True";
    }
    s
}

/// What sets LSTM and GRU apart in [`run_stack`]: everything else about a
/// stack of gated layers (weights, directions, dropout between layers, the
/// caller's state layout) is the same.
trait RnnCell<const H: usize, const R: usize, E: Float, D: Device<E>> {
    /// The gates stacked along the weights' rows.
    const GATES: usize;
    /// The layer's name in messages (`LSTM`, `GRU`).
    const NAME: &'static str;
    /// The recurrence of the fused layer op.
    const MODE: RnnMode;
    /// One layer's and direction's state, erased.
    type State;
    /// The state the caller passes in and gets back, one
    /// `[layers * directions, batch, H or R]` tensor per part.
    type Outer<B: Dim>;

    /// Advances `state` by one input projection `[batch, G * H]`.
    fn step(
        w: &RnnWeights<H, E, D, R>,
        xt: Tensor<(Dyn, Dyn), E, D>,
        state: &Self::State,
    ) -> Self::State;
    /// A state's output `[batch, R]`.
    fn output(state: &Self::State) -> Tensor<(Dyn, Dyn), E, D>;
    /// A state's `h` and (LSTM) `c`, `[batch, H]` each.
    fn parts(state: &Self::State) -> (Tensor<(Dyn, Dyn), E, D>, Option<Tensor<(Dyn, Dyn), E, D>>);
    /// The state made of `h` and (LSTM) `c`.
    fn from_parts(h: Tensor<(Dyn, Dyn), E, D>, c: Option<Tensor<(Dyn, Dyn), E, D>>) -> Self::State;
    /// `n` per-layer states from the caller's (zeros when `None`).
    fn split<B: Dim>(
        outer: Option<&Self::Outer<B>>,
        n: usize,
        b: usize,
        device: &D,
    ) -> Result<Vec<Self::State>>;
    /// The caller's final state from the per-layer ones.
    fn join<B: Dim>(states: Vec<Self::State>) -> Self::Outer<B>;
}

/// LSTM's cell: gates input, forget, cell, output; the state is `(h, c)`,
/// `h` projected to `R` features by `weight_hr` with a `proj_size`.
struct LstmCell;

impl<const H: usize, const R: usize, E: Float, D: Device<E>> RnnCell<H, R, E, D> for LstmCell {
    const GATES: usize = 4;
    const NAME: &'static str = "LSTM";
    const MODE: RnnMode = RnnMode::LongShortTermMemory;
    type State = (Tensor<(Dyn, Dyn), E, D>, Tensor<(Dyn, Dyn), E, D>);
    type Outer<B: Dim> = LstmState<B, H, E, D, R>;

    fn step(
        w: &RnnWeights<H, E, D, R>,
        xt: Tensor<(Dyn, Dyn), E, D>,
        (h, c): &Self::State,
    ) -> Self::State {
        let gates = &xt + &w.hidden_projection(h);
        let i = gates.narrow::<1>(0, H).sigmoid();
        let f = gates.narrow::<1>(H, H).sigmoid();
        let g = gates.narrow::<1>(2 * H, H).tanh();
        let o = gates.narrow::<1>(3 * H, H).sigmoid();
        let c = &(&f * c) + &(&i * &g);
        let h = w.project_hidden(&o * &c.tanh());
        (h, c)
    }

    fn output((h, _): &Self::State) -> Tensor<(Dyn, Dyn), E, D> {
        h.clone()
    }

    fn parts((h, c): &Self::State) -> (Tensor<(Dyn, Dyn), E, D>, Option<Tensor<(Dyn, Dyn), E, D>>) {
        (h.clone(), Some(c.clone()))
    }

    fn from_parts(h: Tensor<(Dyn, Dyn), E, D>, c: Option<Tensor<(Dyn, Dyn), E, D>>) -> Self::State {
        let c = c.expect("an LSTM state has a cell");
        (h, c)
    }

    fn split<B: Dim>(
        outer: Option<&Self::Outer<B>>,
        n: usize,
        b: usize,
        device: &D,
    ) -> Result<Vec<Self::State>> {
        let (h0, c0) = match outer {
            Some((h, c)) => (Some(h), Some(c)),
            None => (None, None),
        };
        let h0 = split_state("LSTM", "h_0", h0, n, b, device)?;
        let c0 = split_state("LSTM", "c_0", c0, n, b, device)?;
        Ok(h0.into_iter().zip(c0).collect())
    }

    fn join<B: Dim>(states: Vec<Self::State>) -> Self::Outer<B> {
        let (hs, cs): (Vec<_>, Vec<_>) = states.into_iter().unzip();
        (join_state(&hs), join_state(&cs))
    }
}

/// GRU's cell: gates reset, update, new; the state is `h`.
struct GruCell;

impl<const H: usize, E: Float, D: Device<E>> RnnCell<H, H, E, D> for GruCell {
    const GATES: usize = 3;
    const NAME: &'static str = "GRU";
    const MODE: RnnMode = RnnMode::GatedRecurrentUnit;
    type State = Tensor<(Dyn, Dyn), E, D>;
    type Outer<B: Dim> = Tensor<(Dyn, B, C<H>), E, D>;

    fn step(
        w: &RnnWeights<H, E, D, H>,
        xt: Tensor<(Dyn, Dyn), E, D>,
        h: &Self::State,
    ) -> Self::State {
        let hg = w.hidden_projection(h);
        let r = (&xt.narrow::<1>(0, H) + &hg.narrow::<1>(0, H)).sigmoid();
        let z = (&xt.narrow::<1>(H, H) + &hg.narrow::<1>(H, H)).sigmoid();
        let n = (&xt.narrow::<1>(2 * H, H) + &(&r * &hg.narrow::<1>(2 * H, H))).tanh();
        // PyTorch's form of (1 - z) * n + z * h.
        &(&(h - &n) * &z) + &n
    }

    fn output(h: &Self::State) -> Tensor<(Dyn, Dyn), E, D> {
        h.clone()
    }

    fn parts(h: &Self::State) -> (Tensor<(Dyn, Dyn), E, D>, Option<Tensor<(Dyn, Dyn), E, D>>) {
        (h.clone(), None)
    }

    fn from_parts(h: Tensor<(Dyn, Dyn), E, D>, _: Option<Tensor<(Dyn, Dyn), E, D>>) -> Self::State {
        h
    }

    fn split<B: Dim>(
        outer: Option<&Self::Outer<B>>,
        n: usize,
        b: usize,
        device: &D,
    ) -> Result<Vec<Self::State>> {
        split_state("GRU", "h_0", outer, n, b, device)
    }

    fn join<B: Dim>(states: Vec<Self::State>) -> Self::Outer<B> {
        join_state(&states)
    }
}

/// Runs a stack of `K` layers over `x` from the caller's `state`, on erased
/// sizes: the last layer's outputs `[batch, T, R * directions]` and the
/// final state.
#[allow(clippy::too_many_arguments)] // the layer's parts, borrowed apart
fn run_stack<K, B, T, O, const I: usize, const H: usize, const R: usize, E, D>(
    _cell: K,
    params: &RnnParams<H, E, D, R>,
    options: &RnnOptions,
    training: &Training,
    drop: &DropoutRng,
    x: Tensor<(B, T, C<I>), E, D>,
    state: Option<K::Outer<B>>,
) -> Result<(Tensor<(B, T, O), E, D>, K::Outer<B>)>
where
    K: RnnCell<H, R, E, D>,
    B: Dim,
    T: Dim,
    O: Dim,
    E: Float,
    D: Device<E>,
{
    // Under graph capture the stack is one op (`graph::Op::Rnn`): the loop
    // below, recorded step by step, would hold this length only. What that
    // op does not express is refused.
    let captured = forma_core::graph::capturing().then(|| {
        if state.is_some() {
            forma_core::graph::refuse(K::NAME, "an initial state has no graph form yet");
        }
        if training.is_on() && options.dropout > 0.0 && params.num_layers() > 1 {
            forma_core::graph::refuse(K::NAME, "dropout between layers in training mode");
        }
        if R != H {
            forma_core::graph::refuse(K::NAME, "proj_size has no graph form yet");
        }
        let mut ins = vec![x.val()];
        for w in &params.cells {
            ins.push(w.weight_ih.val());
            ins.push(w.weight_hh.val());
            ins.extend(w.bias_ih.iter().chain(&w.bias_hh).map(Tensor::val));
        }
        let op = forma_core::graph::Op::Rnn {
            cell: K::NAME,
            hidden: H,
            layers: params.num_layers(),
            bidirectional: params.directions == 2,
            bias: params.cells.iter().all(|w| w.bias_ih.is_some()),
        };
        (op, ins)
    });
    let dirs = params.directions;
    let layers = params.num_layers();
    let (b, t) = (x.size(0), x.size(1));
    let dev = x.device().clone();
    let mut init = K::split(state.as_ref(), params.cells.len(), b, &dev)?;
    let x: Tensor<(Dyn, Dyn, Dyn), E, D> = restore(x);
    if captured.is_none() && R == H {
        init.reverse(); // popped in order
        let (y, finals) = fused_layers::<K, H, R, E, D>(params, options, training, drop, x, init)?;
        return Ok((restore(y), K::join(finals)));
    }
    let features = x.size(2);
    // With `proj_size` or under capture, the composed loop. Each layer
    // reads the one below it step by step, `[batch, features]`
    // per step, so that no step's gradient is spread over a whole sequence:
    // projecting the sequence at once and narrowing it per step made each
    // step's backward write a sequence-sized tensor of zeros and add it up
    // (two thirds of a 64-step LSTM's backward).
    let mut steps: Vec<Tensor<(Dyn, Dyn), E, D>> = (0..t)
        .map(|i| x.narrow::<1>(i, 1).try_reshape_to((Dyn(b), Dyn(features))))
        .collect::<Result<_>>()?;
    let mut finals = Vec::with_capacity(init.len());
    init.reverse(); // popped in order below
    for layer in 0..layers {
        let mut outs = Vec::with_capacity(dirs);
        for dir in 0..dirs {
            let w = &params.cells[layer * dirs + dir];
            let mut state = init
                .pop()
                .expect("one initial state per layer and direction");
            let mut seq = Vec::with_capacity(t);
            let order: Vec<usize> = if dir == 0 {
                (0..t).collect()
            } else {
                (0..t).rev().collect()
            };
            for i in order {
                state = K::step(w, w.input_projection(&steps[i]), &state);
                seq.push(K::output(&state));
            }
            if dir == 1 {
                seq.reverse();
            }
            outs.push(seq);
            finals.push(state);
        }
        steps = if dirs == 1 {
            outs.pop().expect("one direction")
        } else {
            (0..t)
                .map(|i| cat::<1, _, _>(&[outs[0][i].clone(), outs[1][i].clone()]))
                .collect()
        };
        if training.is_on() && options.dropout > 0.0 && layer + 1 < layers {
            steps = steps
                .into_iter()
                .map(|s| drop.apply(s, options.dropout))
                .collect::<Result<_>>()?;
        }
    }
    let output: Tensor<(Dyn, Dyn, Dyn), E, D> = stack::<1, _, _>(&steps);
    if let Some((op, ins)) = captured {
        forma_core::graph::note(op, &ins, &output.val());
    }
    Ok((restore(output), K::join(finals)))
}

/// [`run_stack`] without `proj_size` and outside graph capture: per layer
/// and direction, the input projections of every step as one GEMM, then
/// the recurrence as one op ([`Tensor::try_rnn_layer`]), whose backward
/// runs through time by itself. `init` holds the initial states, last
/// layer first; returns the last layer's outputs and the final states.
fn fused_layers<K, const H: usize, const R: usize, E, D>(
    params: &RnnParams<H, E, D, R>,
    options: &RnnOptions,
    training: &Training,
    drop: &DropoutRng,
    x: Tensor<(Dyn, Dyn, Dyn), E, D>,
    mut init: Vec<K::State>,
) -> Result<(Tensor<(Dyn, Dyn, Dyn), E, D>, Vec<K::State>)>
where
    K: RnnCell<H, R, E, D>,
    E: Float,
    D: Device<E>,
{
    let (dirs, layers) = (params.directions, params.num_layers());
    let (b, t) = (x.size(0), x.size(1));
    let lstm = K::MODE == RnnMode::LongShortTermMemory;
    let mut finals = Vec::with_capacity(init.len());
    let mut input = x;
    for layer in 0..layers {
        let mut outs = Vec::with_capacity(dirs);
        for dir in 0..dirs {
            let w = &params.cells[layer * dirs + dir];
            let state = init
                .pop()
                .expect("one initial state per layer and direction");
            let (h0, c0) = K::parts(&state);
            let weights = RnnLayerWeights {
                weight_ih: &w.weight_ih,
                weight_hh: &w.weight_hh.into_dyn(),
                bias_ih: w.bias_ih.as_ref(),
                bias_hh: w.bias_hh.as_ref(),
            };
            let y = input.try_rnn_from_input(K::MODE, weights, &h0, c0.as_ref(), dir == 1)?;
            // The final state: the last step taken (the first position
            // for the reverse direction), or the initial one when `t` is 0.
            if t == 0 {
                finals.push(state);
            } else {
                let last = if dir == 1 { 0 } else { t - 1 };
                let at = |start: usize| {
                    y.try_narrow::<1>(last, 1)?
                        .try_narrow::<2>(start, H)?
                        .try_reshape_to((Dyn(b), Dyn(H)))
                };
                let c = if lstm { Some(at(H)?) } else { None };
                finals.push(K::from_parts(at(0)?, c));
            }
            outs.push(y.try_narrow::<2>(0, H)?);
        }
        input = if dirs == 1 {
            outs.pop().expect("one direction")
        } else {
            try_cat::<2, _, _>(&outs)?
        };
        if training.is_on() && options.dropout > 0.0 && layer + 1 < layers {
            input = drop.apply(input, options.dropout)?;
        }
    }
    Ok((input, finals))
}

/// Splits an initial state `[layers * directions, batch, H]` into one
/// `[batch, H]` per layer and direction, or zeros when absent.
fn split_state<B: Dim, const H: usize, E: Float, D: Device<E>>(
    layer: &'static str,
    name: &str,
    state: Option<&Tensor<(Dyn, B, C<H>), E, D>>,
    n: usize,
    b: usize,
    device: &D,
) -> Result<Vec<Tensor<(Dyn, Dyn), E, D>>> {
    match state {
        None => Ok((0..n)
            .map(|_| Tensor::zeros_on((Dyn(b), Dyn(H)), device))
            .collect()),
        Some(s) => {
            if s.dims()[..] != [n, b, H] {
                return Err(Error::shape(
                    layer,
                    format!("an initial {name} of [{n}, {b}, {H}] (layers * directions, batch, features)"),
                    &s.dims(),
                ));
            }
            Ok((0..n)
                .map(|i| {
                    s.narrow::<0>(i, 1)
                        .try_reshape_to((Dyn(b), Dyn(H)))
                        .expect("one layer's state")
                })
                .collect())
        }
    }
}

/// Stacks per-layer final states `[batch, H]` into `[layers * directions, batch, H]`.
fn join_state<B: Dim, const H: usize, E: Float, D: Device<E>>(
    states: &[Tensor<(Dyn, Dyn), E, D>],
) -> Tensor<(Dyn, B, C<H>), E, D> {
    restore(stack::<0, _, _>(states))
}

/// Defines a recurrent layer on `$cell`: the struct (PyTorch's class name
/// `$py`), its constructors and repr, and a `Forward` from a zero state (as
/// `$call(x)[0]`). `$r` names the width of the state fed back and of the
/// outputs: `H`, or an LSTM's `P` (`proj_size`), declared by the tokens
/// after `where`. Each layer writes its `forward_with` itself, its state
/// type (and so its signature) being its own.
macro_rules! rnn_layer {
    (
        $(#[$doc:meta])* $name:ident, $py:tt, $call:tt, $cell:ty,
        $r:ident where [$($decl:tt)*] [$($gen:tt)*] [$($arg:tt)*]
    ) => {
        $(#[$doc])*
        #[derive(Module, Clone, Debug)]
        #[module(crate = "crate", name = $py, extra_repr = "Self::extra_repr")]
        pub struct $name<
            const I: usize,
            const H: usize,
            const BIDIR: bool = false,
            E: Float = f32,
            D: Device<E> = Cpu,
            $($decl)*
        > {
            /// The weights, under PyTorch's names.
            #[module(flatten)]
            pub params: RnnParams<H, E, D, $r>,
            /// The constructor arguments.
            #[module(skip)]
            pub options: RnnOptions,
            /// Train/eval mode (dropout between layers).
            pub training: Training,
            #[module(skip)]
            drop: DropoutRng,
        }

        impl<const I: usize, const H: usize, const BIDIR: bool, E: Float, D: Device<E> $($gen)*>
            $name<I, H, BIDIR, E, D $($arg)*>
        {
            /// `num_layers` stacked layers with PyTorch's other defaults and
            /// initialisation (`U(-1/sqrt(H), 1/sqrt(H))`).
            pub fn new(num_layers: usize, device: &D, rng: &mut Rng) -> Self {
                Self::with_options(
                    RnnOptions {
                        num_layers,
                        ..RnnOptions::default()
                    },
                    device,
                    rng,
                )
            }

            /// A stack with the given options.
            ///
            /// # Panics
            /// If `options.dropout` is outside `[0, 1]` or `num_layers` is 0.
            pub fn with_options(options: RnnOptions, device: &D, rng: &mut Rng) -> Self {
                const { assert_proj_size($r, H) };
                check_dropout($py, options.dropout);
                assert!(
                    options.num_layers > 0,
                    concat!($py, ": num_layers must be at least 1")
                );
                let gates = <$cell as RnnCell<H, $r, E, D>>::GATES;
                $name {
                    params: RnnParams::init(gates, I, BIDIR, &options, device, rng),
                    options,
                    training: Training::default(),
                    drop: DropoutRng::new(rng),
                }
            }

            fn extra_repr(&self) -> String {
                rnn_extra_repr((I, H, $r), &self.options, BIDIR)
            }
        }

        impl<
                B: Dim,
                T: Dim,
                O: Dim,
                const I: usize,
                const H: usize,
                const BIDIR: bool,
                E: Float,
                D: Device<E>
                $($gen)*
            > Forward<Tensor<(B, T, C<I>), E, D>, Tensor<(B, T, O), E, D>>
            for $name<I, H, BIDIR, E, D $($arg)*>
        {
            #[doc = concat!(" The outputs from a zero state, like `", $call, "(x)[0]`.")]
            fn try_forward(&self, x: Tensor<(B, T, C<I>), E, D>) -> Result<Tensor<(B, T, O), E, D>> {
                Ok(self.try_forward_with(x, None)?.0)
            }
        }

        impl<const I: usize, const H: usize, const BIDIR: bool, E: Float, D: Device<E> $($gen)*>
            crate::shape_step::ShapeStep for $name<I, H, BIDIR, E, D $($arg)*>
        {
            /// `[batch, seq, I]` to `[batch, seq, R]` (`2 * R` bidirectional).
            const STEP: crate::shape_step::Step = crate::shape_step::Step::LastAxis {
                layer: $py,
                input: I,
                output: if BIDIR { 2 * $r } else { $r },
                rank: 3,
            };
        }
    };
}

/// The final `(h_n, c_n)` of an LSTM, `[layers * directions, batch, P]`
/// and `[layers * directions, batch, H]` (`P` is `H` without a
/// `proj_size`).
pub type LstmState<B, const H: usize, E = f32, D = Cpu, const P: usize = H> =
    (Tensor<(Dyn, B, C<P>), E, D>, Tensor<(Dyn, B, C<H>), E, D>);

/// Refuses a `proj_size` that PyTorch refuses: not below the hidden size
/// (`P == H` is the default, no projection).
const fn assert_proj_size(p: usize, h: usize) {
    if p > h || (p == 0 && h > 0) {
        ConstMsg::new()
            .s("LSTM: proj_size ")
            .n(p)
            .s(" must be positive and smaller than the hidden size ")
            .n(h)
            .s(" (leave P out for no projection)")
            .panic()
    }
}

rnn_layer!(
    /// A stack of LSTM layers, like
    /// `nn.LSTM(I, H, num_layers, batch_first=True, bidirectional=BIDIR)`.
    /// Inputs are `[batch, T, I]`; the output is `[batch, T, H]`, or
    /// `[batch, T, 2 * H]` when bidirectional (stated by the caller's type and
    /// checked when the program is built; `Dyn` accepts either). Gates follow
    /// PyTorch's order (input, forget, cell, output):
    ///
    /// `c' = f * c + i * g`, `h' = o * tanh(c')`.
    ///
    /// `Lstm<I, H, BIDIR, E, D, P>` with `P < H` is PyTorch's
    /// `proj_size=P`: `h'` is projected to `P` features by `weight_hr_l{k}`
    /// (`[P, H]`), so the outputs and `h_n` have `P` features per direction,
    /// `c_n` keeps `H`, and `weight_hh_l{k}` is `[4 * H, P]`.
    ///
    /// ```
    /// use forma::prelude::*;
    /// use forma::nn::layers::Lstm;
    /// use forma::nn::Module;
    /// let mut rng = Rng::seed_from(0);
    /// let lstm = Lstm::<3, 6, false, f32, Cpu, 2>::new(1, &Cpu, &mut rng);  // proj_size=2
    /// let x = Tensor::<(Dyn, Dyn, C<3>)>::randn((Dyn(4), Dyn(5), C), &mut rng);
    /// let (y, (h_n, c_n)): (Tensor<(Dyn, Dyn, C<2>)>, _) = lstm.forward_with(x, None);
    /// assert_eq!(y.dims()[..], [4, 5, 2]);
    /// assert_eq!(h_n.dims()[..], [1, 4, 2]);
    /// assert_eq!(c_n.dims()[..], [1, 4, 6]);
    /// assert_eq!(lstm.state_dict().keys().last(), Some("weight_hr_l0"));
    /// assert_eq!(lstm.repr(), "LSTM(3, 6, proj_size=2, batch_first=True)");
    /// ```
    ///
    /// ```
    /// use forma::prelude::*;
    /// use forma::nn::layers::Lstm;
    /// use forma::nn::Module;
    /// let mut rng = Rng::seed_from(0);
    /// let lstm = Lstm::<3, 4>::new(2, &Cpu, &mut rng);
    /// let x = Tensor::<(Dyn, Dyn, C<3>)>::randn((Dyn(2), Dyn(5), C), &mut rng);
    /// let (y, (h_n, c_n)): (Tensor<(Dyn, Dyn, C<4>)>, _) = lstm.forward_with(x, None);
    /// assert_eq!(y.dims()[..], [2, 5, 4]);
    /// assert_eq!(h_n.dims()[..], [2, 2, 4]);
    /// assert_eq!(c_n.dims()[..], [2, 2, 4]);
    /// let keys: Vec<String> = lstm.state_dict().keys().map(String::from).collect();
    /// assert_eq!(keys[..4], ["weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"]);
    /// assert_eq!(lstm.repr(), "LSTM(3, 4, num_layers=2, batch_first=True)");
    /// ```
    Lstm,
    "LSTM",
    "lstm",
    LstmCell,
    P where [const P: usize = H] [, const P: usize] [, P]
);

impl<const I: usize, const H: usize, const BIDIR: bool, E: Float, D: Device<E>, const P: usize>
    Lstm<I, H, BIDIR, E, D, P>
{
    /// The stack over `x` from the initial `(h_0, c_0)` (zeros when `None`),
    /// like `lstm(x, (h_0, c_0))`: the last layer's outputs and the final
    /// `(h_n, c_n)`.
    ///
    /// # Panics
    /// If the initial state's sizes are wrong; see [`Lstm::try_forward_with`].
    #[track_caller]
    pub fn forward_with<B: Dim, T: Dim, O: Dim>(
        &self,
        x: Tensor<(B, T, C<I>), E, D>,
        state: Option<LstmState<B, H, E, D, P>>,
    ) -> (Tensor<(B, T, O), E, D>, LstmState<B, H, E, D, P>) {
        ok(self.try_forward_with(x, state))
    }

    /// Fallible [`Lstm::forward_with`].
    ///
    /// # Errors
    /// A shape error when `h_0` is not `[layers * directions, batch, P]` or
    /// `c_0` not `[layers * directions, batch, H]`.
    #[allow(clippy::type_complexity)] // PyTorch's (output, (h_n, c_n))
    pub fn try_forward_with<B: Dim, T: Dim, O: Dim>(
        &self,
        x: Tensor<(B, T, C<I>), E, D>,
        state: Option<LstmState<B, H, E, D, P>>,
    ) -> Result<(Tensor<(B, T, O), E, D>, LstmState<B, H, E, D, P>)> {
        const { assert_rnn_features("LSTM", P, BIDIR, O::STATIC) };
        let Self {
            params,
            options,
            training,
            drop,
        } = self;
        run_stack(LstmCell, params, options, training, drop, x, state)
    }
}

rnn_layer!(
    /// A stack of GRU layers, like
    /// `nn.GRU(I, H, num_layers, batch_first=True, bidirectional=BIDIR)`.
    /// Inputs are `[batch, T, I]`; the output is `[batch, T, H]`, or
    /// `[batch, T, 2 * H]` when bidirectional (stated by the caller's type).
    /// Gates follow PyTorch's order (reset, update, new):
    ///
    /// `n = tanh(W_in x + b_in + r * (W_hn h + b_hn))`, `h' = (1 - z) * n + z * h`.
    ///
    /// ```
    /// use forma::prelude::*;
    /// use forma::nn::layers::Gru;
    /// use forma::nn::Module;
    /// let mut rng = Rng::seed_from(0);
    /// let gru = Gru::<3, 4, true>::new(1, &Cpu, &mut rng);   // bidirectional
    /// let x = Tensor::<(Dyn, Dyn, C<3>)>::randn((Dyn(2), Dyn(5), C), &mut rng);
    /// let (y, h_n): (Tensor<(Dyn, Dyn, C<8>)>, _) = gru.forward_with(x, None);
    /// assert_eq!(y.dims()[..], [2, 5, 8]);
    /// assert_eq!(h_n.dims()[..], [2, 2, 4]);
    /// assert_eq!(gru.repr(), "GRU(3, 4, batch_first=True, bidirectional=True)");
    /// ```
    Gru,
    "GRU",
    "gru",
    GruCell,
    H where [] [] []
);

impl<const I: usize, const H: usize, const BIDIR: bool, E: Float, D: Device<E>>
    Gru<I, H, BIDIR, E, D>
{
    /// The stack over `x` from the initial `h_0` (zeros when `None`), like
    /// `gru(x, h_0)`: the last layer's outputs and the final `h_n`
    /// (`[layers * directions, batch, H]`).
    ///
    /// # Panics
    /// If the initial state's sizes are wrong; see [`Gru::try_forward_with`].
    #[track_caller]
    pub fn forward_with<B: Dim, T: Dim, O: Dim>(
        &self,
        x: Tensor<(B, T, C<I>), E, D>,
        state: Option<Tensor<(Dyn, B, C<H>), E, D>>,
    ) -> (Tensor<(B, T, O), E, D>, Tensor<(Dyn, B, C<H>), E, D>) {
        ok(self.try_forward_with(x, state))
    }

    /// Fallible [`Gru::forward_with`].
    ///
    /// # Errors
    /// A shape error when `h_0` is not `[layers * directions, batch, H]`.
    #[allow(clippy::type_complexity)] // PyTorch's (output, h_n)
    pub fn try_forward_with<B: Dim, T: Dim, O: Dim>(
        &self,
        x: Tensor<(B, T, C<I>), E, D>,
        state: Option<Tensor<(Dyn, B, C<H>), E, D>>,
    ) -> Result<(Tensor<(B, T, O), E, D>, Tensor<(Dyn, B, C<H>), E, D>)> {
        const { assert_rnn_features("GRU", H, BIDIR, O::STATIC) };
        let Self {
            params,
            options,
            training,
            drop,
        } = self;
        run_stack(GruCell, params, options, training, drop, x, state)
    }
}

#[cfg(test)]
mod tests {
    use super::assert_rnn_features;

    #[test]
    fn stated_output_features_must_match_the_directions() {
        assert_rnn_features("LSTM", 4, false, Some(4));
        assert_rnn_features("LSTM", 4, true, Some(8));
        assert_rnn_features("LSTM", 4, true, None);
        let err = std::panic::catch_unwind(|| assert_rnn_features("GRU", 4, true, Some(4)))
            .expect_err("8 features, not 4");
        let msg = err.downcast_ref::<String>().expect("a formatted message");
        assert_eq!(
            msg,
            "GRU: a hidden size of 4 in both directions gives 8 output features, not 4"
        );
    }
}
