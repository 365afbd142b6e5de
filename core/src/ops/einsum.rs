//! `torch.einsum` for one or two operands: [`einsum`] and [`try_einsum`].
//!
//! The shape rule is checked when the program runs: the equation names each
//! operand's axes by letter, and the result type `O` must have as many axes
//! as the output has letters (its static sizes checked against them). One
//! operand permutes and sums (`"ij->ji"`, `"ij->i"`); two are contracted as
//! PyTorch does it: letters only one operand has and the output lacks are
//! summed first, then both are arranged as `[batch, free, contracted]` and
//! multiplied as one batched matmul, and the product is arranged in the
//! output's order. The gradient of each operand is itself an einsum (of the
//! output's gradient with the other operand), so it runs on the same path.
//!
//! Not offered: `...` (ellipsis), a letter repeated within one operand (a
//! diagonal, `"ii->i"`), size-1 broadcasting between operands, three or more
//! operands (chain two einsums). Capture for export and compile has no
//! graph form for einsum yet: a capture that meets one fails naming it.

use crate::device::Device;
use crate::dtype::Float;
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::ops::reduce::ReduceOp;
use crate::shape::{Dims, Dyn, Shape};
use crate::tape::util::reshape;
use crate::tape::{Raw, Var};
use crate::tensor::{ok, Tensor};
use std::sync::Arc;

/// One operand of an einsum, erased (see [`EinsumOperands`]).
#[derive(Debug)]
pub struct Operand<E: Float, D: Device<E>> {
    raw: Raw<E, D>,
    var: Option<Arc<Var<E, D>>>,
}

/// The operands [`einsum`] takes: one tensor `(&a,)` or two `(&a, &b)`, of
/// any shapes.
pub trait EinsumOperands<E: Float, D: Device<E>> {
    /// The operands, erased.
    fn operands(&self) -> Vec<Operand<E, D>>;
}

fn operand<S: Shape, E: Float, D: Device<E>>(t: &Tensor<S, E, D>) -> Operand<E, D> {
    Operand {
        raw: t.raw(),
        var: t.var.clone(),
    }
}

impl<S: Shape, E: Float, D: Device<E>> EinsumOperands<E, D> for (&Tensor<S, E, D>,) {
    fn operands(&self) -> Vec<Operand<E, D>> {
        vec![operand(self.0)]
    }
}

impl<S1: Shape, S2: Shape, E: Float, D: Device<E>> EinsumOperands<E, D>
    for (&Tensor<S1, E, D>, &Tensor<S2, E, D>)
{
    fn operands(&self) -> Vec<Operand<E, D>> {
        vec![operand(self.0), operand(self.1)]
    }
}

/// Sums products of the operands' elements over the letters the equation
/// names, like `torch.einsum(equation, *operands)`.
///
/// ```
/// use forma::prelude::*;
/// use forma::einsum;
/// let a = Tensor::<(C<2>, C<3>)>::from_vec(vec![1., 2., 3., 4., 5., 6.], (C, C)).unwrap();
/// let b = Tensor::<(C<3>, C<2>)>::from_vec(vec![1., 0., 0., 1., 1., 1.], (C, C)).unwrap();
/// let ab: Tensor<(C<2>, C<2>)> = einsum("ij,jk->ik", (&a, &b));
/// assert_eq!(ab.to_vec(), a.matmul(&b).to_vec());
/// let at: Tensor<(Dyn, Dyn)> = einsum("ij->ji", (&a,));
/// assert_eq!(at.to_vec(), [1., 4., 2., 5., 3., 6.]);
/// // Without `->`, the output is the letters used once, in alphabetical
/// // order: `ji,jk` is `ji,jk->ik`, here aᵀ·a.
/// let ata: Tensor<(C<3>, C<3>)> = einsum("ji,jk", (&a, &a));
/// assert_eq!(ata.to_vec()[..3], [17., 22., 27.]);
/// let total: Tensor<()> = einsum("ij->", (&a,));
/// assert_eq!(total.item(), 21.);
/// ```
#[track_caller]
pub fn einsum<O: Shape, E: Float, D: Device<E>>(
    equation: &str,
    operands: impl EinsumOperands<E, D>,
) -> Tensor<O, E, D> {
    ok(try_einsum(equation, operands))
}

/// [`einsum`], returning a malformed equation, sizes that disagree or an
/// output that does not fit `O` as an error.
///
/// # Errors
/// [`Error::Invalid`](crate::Error) naming what is wrong with the equation
/// (a letter count that differs from an operand's rank, a letter repeated
/// within an operand or in the output, an output letter no operand has,
/// `...`), a shape error when one letter has two sizes or the output does
/// not fit `O`; a backend failure.
pub fn try_einsum<O: Shape, E: Float, D: Device<E>>(
    equation: &str,
    operands: impl EinsumOperands<E, D>,
) -> Result<Tensor<O, E, D>> {
    crate::graph::refuse("einsum", "has no graph form yet");
    let ops = operands.operands();
    let ranks: Vec<usize> = ops.iter().map(|o| o.raw.layout.rank()).collect();
    let spec = Spec::parse(equation, &ranks)?;
    let mut sizes = [0usize; 128];
    let mut seen = [false; 128];
    for (o, letters) in ops.iter().zip(&spec.inputs) {
        for (&l, &n) in letters.iter().zip(o.raw.layout.dims.iter()) {
            let (known, i) = (sizes[l as usize], l as usize);
            if seen[i] && known != n {
                return Err(Error::shape(
                    "einsum",
                    format!(
                        "size {known} for '{}', as an earlier operand has it",
                        l as char
                    ),
                    &o.raw.layout.dims,
                ));
            }
            (sizes[i], seen[i]) = (n, true);
        }
    }
    let out_dims: Vec<usize> = spec.output.iter().map(|&l| sizes[l as usize]).collect();
    if O::from_dims(&out_dims).is_none() {
        return Err(Error::shape("einsum", O::describe(), &out_dims));
    }
    let inputs: Vec<(Raw<E, D>, &[u8])> = ops
        .iter()
        .zip(&spec.inputs)
        .map(|(o, l)| (o.raw.clone(), &l[..]))
        .collect();
    // The kernels run on erased tensors without autograd variables, so
    // nothing inside is taped; the one node below is the op's.
    let y = contract(&inputs, &spec.output, &sizes)?;
    let out = Tensor::<O, E, D>::from_raw(y)?;
    let vars: Vec<_> = ops.iter().map(|o| o.var.clone()).collect();
    let saved: Vec<Raw<E, D>> = ops.iter().map(|o| o.raw.clone()).collect();
    let Spec {
        inputs: letters,
        output,
    } = spec;
    // Each operand's gradient reads the other operand.
    let reads = if saved.len() == 2 {
        saved.iter().map(Raw::saved).collect()
    } else {
        vec![]
    };
    Ok(out.record("einsum", &vars, reads, move |g| {
        (0..saved.len())
            .map(|k| {
                let mut from = vec![(g.clone(), &output[..])];
                if saved.len() == 2 {
                    from.push((saved[1 - k].clone(), &letters[1 - k][..]));
                }
                contract(&from, &letters[k], &sizes).map(Some)
            })
            .collect()
    }))
}

/// An equation's letters: one list per operand and the output's.
struct Spec {
    inputs: Vec<Vec<u8>>,
    output: Vec<u8>,
}

impl Spec {
    fn parse(equation: &str, ranks: &[usize]) -> Result<Self> {
        let bad = |what: String| Error::invalid("einsum", format!("\"{equation}\": {what}"));
        let eq: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
        if eq.contains("...") {
            return Err(bad(
                "`...` (ellipsis) is not supported; name every axis".into()
            ));
        }
        let (lhs, rhs) = match eq.split_once("->") {
            Some((l, r)) => (l, Some(r)),
            None => (&eq[..], None),
        };
        let letters = |s: &str| -> Result<Vec<u8>> {
            match s.bytes().find(|b| !b.is_ascii_alphabetic()) {
                Some(b) => Err(bad(format!("'{}' is not a letter", b as char))),
                None => Ok(s.bytes().collect()),
            }
        };
        let inputs: Vec<Vec<u8>> = lhs.split(',').map(letters).collect::<Result<_>>()?;
        if inputs.len() != ranks.len() {
            return Err(bad(format!(
                "{} operand(s) named, {} given",
                inputs.len(),
                ranks.len()
            )));
        }
        for (i, (l, &r)) in inputs.iter().zip(ranks).enumerate() {
            if l.len() != r {
                return Err(bad(format!(
                    "operand {i} has {r} axes, the equation names {}",
                    l.len()
                )));
            }
            if let Some(d) = repeated(l) {
                return Err(bad(format!(
                    "'{}' appears twice in operand {i} (a diagonal), which is not supported",
                    d as char
                )));
            }
        }
        let count = |c: u8| inputs.iter().flatten().filter(|&&x| x == c).count();
        let output = match rhs {
            Some(r) => {
                let out = letters(r)?;
                if let Some(d) = repeated(&out) {
                    return Err(bad(format!("'{}' appears twice in the output", d as char)));
                }
                if let Some(&m) = out.iter().find(|&&c| count(c) == 0) {
                    return Err(bad(format!(
                        "output letter '{}' names no operand's axis",
                        m as char
                    )));
                }
                out
            }
            None => {
                let mut once: Vec<u8> = inputs
                    .iter()
                    .flatten()
                    .copied()
                    .filter(|&c| count(c) == 1)
                    .collect();
                once.sort_unstable();
                once
            }
        };
        Ok(Spec { inputs, output })
    }
}

fn repeated(letters: &[u8]) -> Option<u8> {
    letters
        .iter()
        .enumerate()
        .find(|(i, c)| letters[..*i].contains(c))
        .map(|(_, &c)| c)
}

/// The einsum of one or two erased operands into `out`'s letters. An output
/// letter no operand has is broadcast to its size in `sizes` (the gradient
/// of a summed letter).
fn contract<E: Float, D: Device<E>>(
    ops: &[(Raw<E, D>, &[u8])],
    out: &[u8],
    sizes: &[usize; 128],
) -> Result<Raw<E, D>> {
    // Letters only one operand has and the output lacks are summed first.
    let mut reduced: Vec<(Raw<E, D>, Vec<u8>)> = Vec::with_capacity(ops.len());
    for (k, (raw, letters)) in ops.iter().enumerate() {
        let elsewhere = |c: u8| {
            out.contains(&c)
                || ops
                    .iter()
                    .enumerate()
                    .any(|(j, o)| j != k && o.1.contains(&c))
        };
        let (mut raw, mut letters) = (raw.clone(), letters.to_vec());
        for axis in (0..letters.len()).rev() {
            if !elsewhere(letters[axis]) {
                raw = sum_axis(&raw, axis)?;
                letters.remove(axis);
            }
        }
        reduced.push((raw, letters));
    }
    let (raw, letters) = match &reduced[..] {
        [one] => (one.0.clone(), one.1.clone()),
        [(a, la), (b, lb)] => {
            let batch: Vec<u8> = out
                .iter()
                .copied()
                .filter(|c| la.contains(c) && lb.contains(c))
                .collect();
            let contracted: Vec<u8> = la
                .iter()
                .copied()
                .filter(|c| lb.contains(c) && !out.contains(c))
                .collect();
            let left: Vec<u8> = la.iter().copied().filter(|c| !lb.contains(c)).collect();
            let right: Vec<u8> = lb.iter().copied().filter(|c| !la.contains(c)).collect();
            let n = |ls: &[u8]| ls.iter().map(|&c| sizes[c as usize]).product::<usize>();
            let a3 = arrange(a, la, &[&batch[..], &left, &contracted], sizes)?;
            let a3 = reshape(&a3, &[n(&batch), n(&left), n(&contracted)])?;
            let b3 = arrange(b, lb, &[&batch[..], &contracted, &right], sizes)?;
            let b3 = reshape(&b3, &[n(&batch), n(&contracted), n(&right)])?;
            let ab = Tensor::<(Dyn, Dyn, Dyn), E, D>::from_raw(a3)?
                .try_matmul(&Tensor::<(Dyn, Dyn, Dyn), E, D>::from_raw(b3)?)?
                .raw();
            let letters: Vec<u8> = [batch, left, right].concat();
            let dims: Vec<usize> = letters.iter().map(|&c| sizes[c as usize]).collect();
            (reshape(&ab, &dims)?, letters)
        }
        _ => unreachable!("einsum takes one or two operands"),
    };
    arrange(&raw, &letters, &[out], sizes)
}

/// `raw` (axes named by `letters`) with its axes in the order of `order`'s
/// lists, contiguous; a letter of `order` that `letters` lacks is broadcast
/// to its size.
fn arrange<E: Float, D: Device<E>>(
    raw: &Raw<E, D>,
    letters: &[u8],
    order: &[&[u8]],
    sizes: &[usize; 128],
) -> Result<Raw<E, D>> {
    let order: Vec<u8> = order.concat();
    let present: Vec<usize> = order
        .iter()
        .filter_map(|c| letters.iter().position(|l| l == c))
        .collect();
    let permuted = raw.layout.permute(&present);
    // Size-1 axes where a letter is missing, then stretched (stride 0).
    let mut dims = Vec::with_capacity(order.len());
    let mut strides = Vec::with_capacity(order.len());
    let mut next = 0;
    for &c in &order {
        if letters.contains(&c) {
            dims.push(permuted.dims[next]);
            strides.push(permuted.strides[next]);
            next += 1;
        } else {
            dims.push(sizes[c as usize]);
            strides.push(0);
        }
    }
    let layout = Layout {
        dims: Dims::from_slice(&dims),
        strides: Dims::from_slice(&strides),
        offset: permuted.offset,
    };
    let s = raw.device.contiguous(&raw.storage(), &layout)?;
    Ok(Raw::new(s, &dims, raw.device.clone()))
}

/// `raw` summed over `axis`, which goes.
fn sum_axis<E: Float, D: Device<E>>(raw: &Raw<E, D>, axis: usize) -> Result<Raw<E, D>> {
    let s = raw
        .device
        .reduce(ReduceOp::Sum, &raw.storage(), &raw.layout, axis)?;
    let mut dims = raw.layout.dims.to_vec();
    dims.remove(axis);
    Ok(Raw::new(s, &dims, raw.device.clone()))
}
