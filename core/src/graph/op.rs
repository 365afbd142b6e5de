//! The ops a captured graph holds: one variant per core op, with the
//! attributes that decide its result, and its shape rule over symbolic
//! sizes ([`Op::out_dims`]). Variants are not named like the layers
//! (`Affine`, not `Linear`): a second item of a layer's name would make
//! rustc print the layers' full paths in compile errors.

use super::dim::{product, Dim};
use crate::dtype::DType;
use crate::ops::conv::Conv2dParams;
use crate::ops::pool::Pool2dParams;
use crate::ops::reduce::{ArgReduceOp, ReduceOp};
use std::fmt;

/// One op of a [`crate::graph::Graph`], with its attributes.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A row of the unary table by its method name (`relu`, `gelu`,
    /// `mul_scalar`, ...) with its parameters in the row's field order.
    Unary {
        /// The method name.
        name: &'static str,
        /// The row's parameters (`negative_slope`; `value`; `min, max`).
        params: Vec<f64>,
    },
    /// A broadcasting binary row (`add`, `sub`, `mul`, `div`, `pow`,
    /// `maximum`, `minimum`).
    Binary {
        /// The method name.
        name: &'static str,
    },
    /// An elementwise expression over the (broadcast) inputs, as
    /// [`crate::ops::fused::fused`] runs it in one pass: its nodes, operands first; the
    /// last is the result.
    Fused {
        /// The expression's nodes.
        nodes: Vec<Elem>,
    },
    /// A broadcasting comparison (`eq`, `ne`, `lt`, `le`, `gt`, `ge`) giving bool.
    Compare {
        /// The method name.
        name: &'static str,
    },
    /// `where(cond, a, b)`, broadcasting the three.
    Where,
    /// `masked_fill(x, mask, value)`: `value` where the mask is true.
    MaskedFill {
        /// The fill value.
        value: f64,
    },
    /// A reduction (`sum`, `mean`, `max`, `min`, `prod`) over one axis, or
    /// all of them (`axis: None`, a scalar result).
    Reduce {
        /// The reduction.
        op: ReduceOp,
        /// The axis, or `None` for all.
        axis: Option<usize>,
        /// Whether the reduced axis stays with size 1.
        keepdim: bool,
    },
    /// `argmax`/`argmin` along an axis, giving i64.
    ArgReduce {
        /// `argmax` or `argmin`.
        op: ArgReduceOp,
        /// The axis.
        axis: usize,
        /// Whether the reduced axis stays with size 1.
        keepdim: bool,
    },
    /// Inclusive prefix sum along an axis.
    Cumsum {
        /// The axis.
        axis: usize,
    },
    /// Softmax (or log-softmax) along an axis.
    SoftmaxAxis {
        /// The axis.
        axis: usize,
        /// Log-softmax.
        log: bool,
    },
    /// Matrix product with broadcast batch axes, like `torch.matmul`.
    Matmul,
    /// `x @ weight^T + bias`, like `F.linear`; inputs `x, weight[, bias]`.
    Affine,
    /// 2-d convolution; inputs `x, weight` (a bias is a separate `add`).
    Conv(Conv2dParams),
    /// 2-d transposed convolution; inputs `x, weight`.
    ConvTranspose {
        /// Stride, padding, dilation, groups.
        p: Conv2dParams,
        /// Extra size added on one side of the output.
        output_padding: [usize; 2],
    },
    /// 2-d max pooling.
    MaxPool(Pool2dParams),
    /// 2-d average pooling.
    AvgPool(Pool2dParams),
    /// Layer norm over the last axis; inputs `x[, weight][, bias]` as the
    /// flags say.
    LayerNormalization {
        /// The epsilon.
        eps: f64,
        /// Whether a weight input follows `x`.
        weight: bool,
        /// Whether a bias input follows.
        bias: bool,
    },
    /// Scaled dot-product attention; inputs `q, k, v[, mask]`.
    Attention {
        /// The scale of the scores.
        scale: f64,
        /// Whether key `j` is hidden from query `i` when `j > i`.
        causal: bool,
        /// Whether an additive mask input follows `v`.
        mask: bool,
    },
    /// Rows of `x` along `axis` picked by a 1-d i64 index (`index_select`).
    IndexSelect {
        /// The axis.
        axis: usize,
    },
    /// `gather(x, axis, index)`.
    Gather {
        /// The axis.
        axis: usize,
    },
    /// Concatenation along an axis.
    Cat {
        /// The axis.
        axis: usize,
    },
    /// A dtype conversion.
    Cast {
        /// The target dtype.
        to: DType,
    },
    /// Swaps two axes.
    Transpose {
        /// The axes.
        axes: [usize; 2],
    },
    /// Reorders the axes: output axis `i` is input axis `perm[i]`.
    Permute {
        /// The order.
        perm: Vec<usize>,
    },
    /// Inserts an axis of size 1.
    Unsqueeze {
        /// Its position in the output.
        axis: usize,
    },
    /// Removes an axis of size 1.
    Squeeze {
        /// Its position in the input.
        axis: usize,
    },
    /// Elements `start, start + step, ..` below `end` along an axis.
    Slice {
        /// The axis.
        axis: usize,
        /// The first index.
        start: Dim,
        /// One past the range.
        end: Dim,
        /// The step.
        step: usize,
    },
    /// Broadcasts size-1 axes (and new leading axes) to `dims`.
    Expand {
        /// The target sizes.
        dims: Vec<Dim>,
    },
    /// The same elements in row-major order with sizes `dims`.
    Reshape {
        /// The target sizes.
        dims: Vec<Dim>,
    },
    /// A stack of recurrent layers over a batch-first sequence `[batch, T,
    /// input]`, like `nn.LSTM`/`nn.GRU(batch_first=True)` from a zero
    /// state, giving `[batch, T, directions * hidden]`. Inputs: `x`, then
    /// for each layer and direction (forward first) `weight_ih`,
    /// `weight_hh` and, with `bias`, `bias_ih`, `bias_hh`, with PyTorch's
    /// gate order (LSTM: input, forget, cell, output; GRU: reset, update, new).
    Rnn {
        /// `"LSTM"` or `"GRU"`.
        cell: &'static str,
        /// The hidden size.
        hidden: usize,
        /// The number of layers.
        layers: usize,
        /// Whether each layer also runs backward.
        bidirectional: bool,
        /// Whether each layer and direction has the two biases.
        bias: bool,
    },
    /// `start, start + step, ..`, `len` values (no inputs), like `torch.arange`.
    Arange {
        /// The first value.
        start: f64,
        /// The step.
        step: f64,
        /// The count.
        len: Dim,
    },
}

/// A node of a [`Op::Fused`] expression.
#[derive(Clone, Debug, PartialEq)]
pub enum Elem {
    /// The fused op's input `i`.
    Arg(usize),
    /// A unary table row applied to node `x`.
    Unary {
        /// The row's method name.
        name: &'static str,
        /// Its parameters.
        params: Vec<f64>,
        /// The operand node.
        x: usize,
    },
    /// A binary table row applied to nodes `a` and `b`.
    Binary {
        /// The row's method name.
        name: &'static str,
        /// The left operand node.
        a: usize,
        /// The right operand node.
        b: usize,
    },
}

impl Op {
    /// The op's name as the graph prints it.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Unary { name, .. } | Op::Binary { name } | Op::Compare { name } => name,
            Op::Reduce { op, .. } => op.name(),
            Op::ArgReduce {
                op: ArgReduceOp::ArgMax,
                ..
            } => "argmax",
            Op::ArgReduce {
                op: ArgReduceOp::ArgMin,
                ..
            } => "argmin",
            Op::Where => "where",
            Op::Fused { .. } => "fused",
            Op::MaskedFill { .. } => "masked_fill",
            Op::Cumsum { .. } => "cumsum",
            Op::SoftmaxAxis { log: false, .. } => "softmax",
            Op::SoftmaxAxis { log: true, .. } => "log_softmax",
            Op::Matmul => "matmul",
            Op::Affine => "linear",
            Op::Conv(_) => "conv2d",
            Op::ConvTranspose { .. } => "conv_transpose2d",
            Op::MaxPool(_) => "max_pool2d",
            Op::AvgPool(_) => "avg_pool2d",
            Op::LayerNormalization { .. } => "layer_norm",
            Op::Attention { .. } => "scaled_dot_product_attention",
            Op::IndexSelect { .. } => "index_select",
            Op::Gather { .. } => "gather",
            Op::Cat { .. } => "cat",
            Op::Cast { .. } => "to_dtype",
            Op::Transpose { .. } => "transpose",
            Op::Permute { .. } => "permute",
            Op::Unsqueeze { .. } => "unsqueeze",
            Op::Squeeze { .. } => "squeeze",
            Op::Slice { .. } => "slice",
            Op::Expand { .. } => "expand",
            Op::Reshape { .. } => "reshape",
            Op::Arange { .. } => "arange",
            Op::Rnn { cell: "GRU", .. } => "gru",
            Op::Rnn { .. } => "lstm",
        }
    }

    /// The output's sizes from the inputs' symbolic sizes; `out` is what the
    /// op produced at capture, used for sizes no rule derives (a fixed
    /// number: the spatial sizes of a convolution of a fixed input).
    /// `None` when a symbolic size cannot be followed through this op.
    pub fn out_dims(&self, ins: &[&[Dim]], out: &[usize]) -> Option<Vec<Dim>> {
        let x = ins.first().copied().unwrap_or(&[]);
        let fixed_or_none = |lead: &[Dim]| -> Option<Vec<Dim>> {
            let mut d = lead.to_vec();
            for &n in &out[lead.len()..] {
                d.push(Dim::Fixed(n));
            }
            Some(d)
        };
        match self {
            Op::Unary { .. }
            | Op::Cumsum { .. }
            | Op::SoftmaxAxis { .. }
            | Op::Cast { .. }
            | Op::LayerNormalization { .. } => Some(x.to_vec()),
            Op::Binary { .. }
            | Op::Compare { .. }
            | Op::Where
            | Op::MaskedFill { .. }
            | Op::Fused { .. } => {
                Some(ins.iter().skip(1).fold(x.to_vec(), |a, b| broadcast(&a, b)))
            }
            Op::Reduce { axis: None, .. } => Some(vec![]),
            Op::Reduce {
                axis: Some(axis),
                keepdim,
                ..
            }
            | Op::ArgReduce { axis, keepdim, .. } => {
                let mut d = x.to_vec();
                if *keepdim {
                    d[*axis] = Dim::Fixed(1);
                } else {
                    d.remove(*axis);
                }
                Some(d)
            }
            Op::Matmul => {
                let w = ins[1];
                let (ra, rb) = (x.len(), w.len());
                let mut d = match (ra, rb) {
                    (1, 1) => vec![],
                    (1, _) => {
                        let mut d = w[..rb - 2].to_vec();
                        d.push(w[rb - 1].clone());
                        d
                    }
                    (_, 1) => x[..ra - 1].to_vec(),
                    _ => {
                        let mut d = broadcast(&x[..ra - 2], &w[..rb - 2]);
                        d.push(x[ra - 2].clone());
                        d.push(w[rb - 1].clone());
                        d
                    }
                };
                d.truncate(out.len());
                Some(d)
            }
            Op::Affine => {
                let mut d = x[..x.len() - 1].to_vec();
                d.push(ins[1][0].clone());
                Some(d)
            }
            Op::Conv(_) | Op::ConvTranspose { .. } => {
                spatial_fixed(x)?;
                let mut d = vec![x[0].clone(), ins[1][0].clone()];
                if let Op::ConvTranspose { p, .. } = self {
                    d[1] = ins[1][1].mul(&Dim::Fixed(p.groups));
                }
                fixed_or_none(&d)
            }
            Op::MaxPool(_) | Op::AvgPool(_) => {
                spatial_fixed(x)?;
                fixed_or_none(&x[..2])
            }
            Op::Attention { .. } => {
                let mut d = x[..x.len() - 1].to_vec();
                let v = ins[2];
                d.push(v[v.len() - 1].clone());
                Some(d)
            }
            Op::IndexSelect { axis } => {
                let mut d = x.to_vec();
                d[*axis] = ins[1][0].clone();
                Some(d)
            }
            Op::Gather { .. } => Some(ins[1].to_vec()),
            Op::Cat { axis } => {
                let mut d = x.to_vec();
                d[*axis] = ins
                    .iter()
                    .skip(1)
                    .fold(x[*axis].clone(), |s, t| s.add(&t[*axis]));
                Some(d)
            }
            Op::Transpose { axes: [a, b] } => {
                let mut d = x.to_vec();
                d.swap(*a, *b);
                Some(d)
            }
            Op::Permute { perm } => Some(perm.iter().map(|&p| x[p].clone()).collect()),
            Op::Unsqueeze { axis } => {
                let mut d = x.to_vec();
                d.insert(*axis, Dim::Fixed(1));
                Some(d)
            }
            Op::Squeeze { axis } => {
                let mut d = x.to_vec();
                d.remove(*axis);
                Some(d)
            }
            Op::Slice {
                axis,
                start,
                end,
                step,
            } => {
                let mut d = x.to_vec();
                let len = end.sub(start);
                d[*axis] = if *step == 1 {
                    len
                } else {
                    len.add(&Dim::Fixed(step - 1)).div(&Dim::Fixed(*step))
                };
                Some(d)
            }
            Op::Expand { dims } | Op::Reshape { dims } => Some(dims.clone()),
            Op::Arange { len, .. } => Some(vec![len.clone()]),
            Op::Rnn {
                hidden,
                bidirectional,
                ..
            } => {
                let dirs = if *bidirectional { 2 } else { 1 };
                Some(vec![x[0].clone(), x[1].clone(), Dim::Fixed(dirs * hidden)])
            }
        }
    }
}

/// NumPy broadcasting of symbolic sizes: a fixed 1 takes the other size.
fn broadcast(a: &[Dim], b: &[Dim]) -> Vec<Dim> {
    let n = a.len().max(b.len());
    (0..n)
        .map(|i| {
            let da = (i + a.len()).checked_sub(n).map(|j| &a[j]);
            let db = (i + b.len()).checked_sub(n).map(|j| &b[j]);
            match (da, db) {
                (Some(x), None) | (None, Some(x)) => x.clone(),
                (Some(x), Some(Dim::Fixed(1))) => x.clone(),
                (Some(Dim::Fixed(1)), Some(y)) => y.clone(),
                (Some(x @ Dim::Sym(_)), Some(_)) => x.clone(),
                (Some(_), Some(y)) => y.clone(),
                (None, None) => unreachable!("i < n"),
            }
        })
        .collect()
}

/// `Some(())` when the spatial sizes (after batch and channels) are fixed.
fn spatial_fixed(x: &[Dim]) -> Option<()> {
    x.iter().skip(2).all(|d| d.fixed().is_some()).then_some(())
}

/// Sizes of `to` (row-major, the same elements as `from`) as expressions of
/// `from`'s sizes, whose values `eval` gives: runs of axes whose products
/// agree are matched; in a run, output axes take the run's symbolic
/// factors of equal value in order, and the first output axis left takes
/// what remains of the run's product when that is symbolic. `None` when
/// the products do not agree.
pub(crate) fn reshape_dims(
    from: &[Dim],
    to: &[usize],
    eval: &dyn Fn(&Dim) -> Option<usize>,
) -> Option<Vec<Dim>> {
    if from.iter().all(|d| d.fixed().is_some()) {
        return Some(to.iter().map(|&n| Dim::Fixed(n)).collect());
    }
    let from_n: Vec<usize> = from.iter().map(eval).collect::<Option<_>>()?;
    let mut out = Vec::with_capacity(to.len());
    let (mut i, mut j) = (0, 0);
    while i < from.len() || j < to.len() {
        let (i0, j0) = (i, j);
        let (mut pa, mut pb) = (1usize, 1usize);
        if i < from.len() {
            pa *= from_n[i];
            i += 1;
        }
        if j < to.len() {
            pb *= to[j];
            j += 1;
        }
        while pa != pb {
            if pa < pb && i < from.len() {
                pa *= from_n[i];
                i += 1;
            } else if pb < pa && j < to.len() {
                pb *= to[j];
                j += 1;
            } else {
                return None;
            }
        }
        let outs = &to[j0..j];
        let factors: Vec<Dim> = from[i0..i].iter().flat_map(Dim::factors).collect();
        // For each output size, the factor it is (by index), if one is.
        let mut taken: Vec<Option<usize>> = vec![None; outs.len()];
        for (k, &n) in outs.iter().enumerate() {
            taken[k] = (0..factors.len()).find(|&p| {
                !taken.contains(&Some(p))
                    && factors[p].fixed().is_none()
                    && eval(&factors[p]) == Some(n)
            });
        }
        let rest = |also: Option<usize>| -> Dim {
            let keep: Vec<Dim> = (0..factors.len())
                .filter(|&p| Some(p) == also || !taken.contains(&Some(p)))
                .map(|p| factors[p].clone())
                .collect();
            product(&keep)
        };
        let whole = rest(None);
        let mut slots: Vec<Option<Dim>> = taken
            .iter()
            .map(|t| t.map(|p| factors[p].clone()))
            .collect();
        let open: Vec<usize> = (0..outs.len()).filter(|&k| slots[k].is_none()).collect();
        if let (Some(&target), None) = (open.first(), whole.fixed()) {
            let others: usize = open[1..].iter().map(|&k| outs[k]).product();
            slots[target] = Some(whole.div(&Dim::Fixed(others)));
        } else if let (None, None, Some(&last)) = (open.first(), whole.fixed(), taken.last()) {
            // Symbols left over with every size named: their product is 1
            // at this example (a batch of 1: `[batch, seq]` to `[9]`), so
            // they join the last size, in their order (the second capture
            // checks the guess), rather than vanish.
            *slots.last_mut().expect("a last size") = Some(rest(last));
        }
        for (k, slot) in slots.iter_mut().enumerate() {
            slot.get_or_insert(Dim::Fixed(outs[k]));
        }
        out.extend(slots.into_iter().flatten());
    }
    Some(out)
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |d: &[Dim]| {
            d.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            Op::Unary { name, params } if params.is_empty() => f.write_str(name),
            Op::Unary { name, params } => write!(f, "{name}{params:?}"),
            Op::MaskedFill { value } => write!(f, "masked_fill[value={value}]"),
            Op::Fused { nodes } => {
                let mut parts = Vec::new();
                for n in nodes {
                    parts.push(match n {
                        Elem::Arg(i) => format!("${i}"),
                        Elem::Unary { name, params, x } if params.is_empty() => {
                            format!("{name}(#{x})")
                        }
                        Elem::Unary { name, params, x } => format!("{name}(#{x}, {params:?})"),
                        Elem::Binary { name, a, b } => format!("{name}(#{a}, #{b})"),
                    });
                }
                write!(f, "fused[{}]", parts.join("; "))
            }
            Op::Reduce { axis, keepdim, .. } => match axis {
                Some(a) => write!(f, "{}[axis={a}, keepdim={keepdim}]", self.name()),
                None => write!(f, "{}[all]", self.name()),
            },
            Op::ArgReduce { axis, keepdim, .. } => {
                write!(f, "{}[axis={axis}, keepdim={keepdim}]", self.name())
            }
            Op::Cumsum { axis } => write!(f, "cumsum[axis={axis}]"),
            Op::SoftmaxAxis { axis, .. } => write!(f, "{}[axis={axis}]", self.name()),
            Op::Conv(p) => write!(
                f,
                "conv2d[stride={:?}, padding={:?}, dilation={:?}, groups={}]",
                p.stride, p.padding, p.dilation, p.groups
            ),
            Op::ConvTranspose { p, output_padding } => write!(
                f,
                "conv_transpose2d[stride={:?}, padding={:?}, output_padding={output_padding:?}, dilation={:?}, groups={}]",
                p.stride, p.padding, p.dilation, p.groups
            ),
            Op::MaxPool(p) | Op::AvgPool(p) => write!(
                f,
                "{}[kernel={:?}, stride={:?}, padding={:?}]",
                self.name(),
                p.kernel,
                p.stride,
                p.padding
            ),
            Op::LayerNormalization { eps, .. } => write!(f, "layer_norm[eps={eps}]"),
            Op::Attention { scale, causal, .. } => write!(
                f,
                "scaled_dot_product_attention[scale={scale}, causal={causal}]"
            ),
            Op::IndexSelect { axis } | Op::Gather { axis } | Op::Cat { axis } => {
                write!(f, "{}[axis={axis}]", self.name())
            }
            Op::Cast { to } => write!(f, "to_dtype[{to:?}]"),
            Op::Transpose { axes } => write!(f, "transpose{axes:?}"),
            Op::Permute { perm } => write!(f, "permute{perm:?}"),
            Op::Unsqueeze { axis } | Op::Squeeze { axis } => {
                write!(f, "{}[axis={axis}]", self.name())
            }
            Op::Slice {
                axis,
                start,
                end,
                step,
            } => write!(f, "slice[axis={axis}, {start}..{end}, step={step}]"),
            Op::Expand { dims } | Op::Reshape { dims } => {
                write!(f, "{}[{}]", self.name(), list(dims))
            }
            Op::Arange { start, step, len } => {
                write!(f, "arange[start={start}, step={step}, len={len}]")
            }
            Op::Rnn {
                hidden,
                layers,
                bidirectional,
                bias,
                ..
            } => write!(
                f,
                "{}[hidden={hidden}, layers={layers}, bidirectional={bidirectional}, bias={bias}]",
                self.name()
            ),
            _ => f.write_str(self.name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reshape_keeps_symbols_through_head_splits_and_flattens() {
        let (b, s) = (Dim::var("batch"), Dim::var("seq"));
        let env = std::collections::HashMap::from([("batch".into(), 2), ("seq".into(), 5)]);
        let ev = |d: &Dim| d.eval(&env);
        let from = [b.clone(), s.clone(), Dim::Fixed(384)];
        let split = reshape_dims(&from, &[2, 5, 12, 32], &ev).unwrap();
        assert_eq!(
            split,
            vec![b.clone(), s.clone(), Dim::Fixed(12), Dim::Fixed(32)]
        );
        let flat = reshape_dims(&from, &[10, 384], &ev).unwrap();
        assert_eq!(flat, vec![b.mul(&s), Dim::Fixed(384)]);
        let back = reshape_dims(&flat, &[2, 5, 384], &ev).unwrap();
        assert_eq!(back, vec![b.clone(), s.clone(), Dim::Fixed(384)]);
        let img = [b.clone(), Dim::Fixed(16), Dim::Fixed(4), Dim::Fixed(4)];
        let f = reshape_dims(&img, &[2, 256], &ev).unwrap();
        assert_eq!(f, vec![b.clone(), Dim::Fixed(256)]);
        let m = reshape_dims(&split, &[2, 5, 384], &ev).unwrap();
        assert_eq!(m, from.to_vec());
        let bh = reshape_dims(&[b.clone(), Dim::Fixed(12)], &[24], &ev).unwrap();
        assert_eq!(bh, vec![b.mul(&Dim::Fixed(12))]);
        assert_eq!(
            reshape_dims(&bh, &[2, 12], &ev).unwrap(),
            vec![b.clone(), Dim::Fixed(12)]
        );
        let tail = reshape_dims(&[s.clone(), Dim::Fixed(384)], &[1920], &ev).unwrap();
        assert_eq!(tail, vec![s.mul(&Dim::Fixed(384))]);
        assert_eq!(reshape_dims(&from, &[7, 384], &ev), None);
    }

    #[test]
    fn a_batch_of_one_keeps_its_symbol_through_a_flatten() {
        let (b, s) = (Dim::var("batch"), Dim::var("seq"));
        let env = std::collections::HashMap::from([("batch".into(), 1), ("seq".into(), 9)]);
        let ev = |d: &Dim| d.eval(&env);
        let flat = reshape_dims(&[b.clone(), s.clone()], &[9], &ev).unwrap();
        assert_eq!(flat, vec![b.mul(&s)]);
        let rows = reshape_dims(&[b.clone(), s.clone(), Dim::Fixed(32)], &[9, 32], &ev).unwrap();
        assert_eq!(rows, vec![b.mul(&s), Dim::Fixed(32)]);
        let back = reshape_dims(&flat, &[1, 9, 32], &ev);
        assert_eq!(back, None, "9 elements are not 1 * 9 * 32");
        let back = reshape_dims(&rows, &[1, 9, 32], &ev).unwrap();
        assert_eq!(back, vec![b.clone(), s.clone(), Dim::Fixed(32)]);
    }
}
