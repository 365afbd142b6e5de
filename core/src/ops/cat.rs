//! Joining tensors: `cat` along an existing axis and `stack` along a new one.
//! The operands share one shape type, so their other static sizes agree by
//! construction; `Dyn` sizes are checked at run time.

use crate::device::Backend;
use crate::dtype::Dtype;
use crate::error::{fmt_dims, Error, Result};
use crate::layout::Layout;
use crate::shape::{Dyn, HasAxis, InsertAxis, One, Shape};
use crate::tape::Raw;
use crate::tensor::{ok, Tensor};

/// Concatenates along `AX`, like `torch.cat(tensors, ax)`; the axis becomes `Dyn`.
///
/// # Errors
/// An empty list, or sizes that differ outside `AX`.
pub fn try_cat<const AX: isize, S: Shape + HasAxis<AX>, E: Dtype, D: Backend>(
    tensors: &[Tensor<S, E, D>],
) -> Result<Tensor<<S as HasAxis<AX>>::Replaced<Dyn>, E, D>> {
    let ax = <S as HasAxis<AX>>::INDEX;
    let first = tensors
        .first()
        .ok_or_else(|| Error::invalid("cat", "needs at least one tensor"))?;
    let mut total = 0;
    for t in tensors {
        first.same_device("cat", t)?;
        let same = (0..S::RANK).all(|i| i == ax || t.layout.dims[i] == first.layout.dims[i]);
        if !same {
            return Err(Error::shape(
                "cat",
                format!("{} outside axis {ax}", fmt_dims(&first.layout.dims)),
                &t.layout.dims,
            ));
        }
        total += t.layout.dims[ax];
    }
    let mut dims = first.layout.dims;
    dims[ax] = total;
    let dev = &first.device;
    let mut out = dev.full(dims.numel(), E::default())?;
    let full = Layout::contiguous(&dims);
    let mut start = 0;
    for t in tensors {
        let len = t.layout.dims[ax];
        dev.copy_strided(
            &t.storage(),
            &t.layout,
            &mut out,
            &full.narrow(ax, start, len),
        )?;
        start += len;
    }
    let lens: Vec<usize> = tensors.iter().map(|t| t.layout.dims[ax]).collect();
    let vars: Vec<_> = tensors.iter().map(|t| t.var.clone()).collect();
    Ok(Tensor::from_storage(out, &dims, dev.clone())
        .record("cat", &vars, vec![], move |g| {
            let mut start = 0;
            Ok(lens
                .iter()
                .map(|&len| {
                    let piece = Raw {
                        layout: g.layout.narrow(ax, start, len),
                        ..g.clone()
                    };
                    start += len;
                    Some(piece)
                })
                .collect())
        })
        .noted(|| {
            let ins = tensors.iter().map(|t| t.val()).collect();
            (crate::graph::Op::Cat { axis: ax }, ins)
        }))
}

/// [`try_cat`] that panics on mismatched sizes.
pub fn cat<const AX: isize, S: Shape + HasAxis<AX>, E: Dtype, D: Backend>(
    tensors: &[Tensor<S, E, D>],
) -> Tensor<<S as HasAxis<AX>>::Replaced<Dyn>, E, D> {
    ok(try_cat::<AX, S, E, D>(tensors))
}

/// Stacks along a new axis `AX`, like `torch.stack(tensors, ax)`.
///
/// # Errors
/// An empty list, or tensors of different sizes.
pub fn try_stack<const AX: isize, S, E: Dtype, D: Backend>(
    tensors: &[Tensor<S, E, D>],
) -> Result<Tensor<<S as InsertAxis<AX>>::Inserted<Dyn>, E, D>>
where
    S: Shape + InsertAxis<AX>,
    <S as InsertAxis<AX>>::Inserted<One>:
        HasAxis<AX, Replaced<Dyn> = <S as InsertAxis<AX>>::Inserted<Dyn>>,
{
    let parts: Vec<Tensor<<S as InsertAxis<AX>>::Inserted<One>, E, D>> =
        tensors.iter().map(|t| t.unsqueeze::<AX>()).collect();
    try_cat::<AX, _, E, D>(&parts)
}

/// [`try_stack`] that panics on mismatched sizes.
pub fn stack<const AX: isize, S, E: Dtype, D: Backend>(
    tensors: &[Tensor<S, E, D>],
) -> Tensor<<S as InsertAxis<AX>>::Inserted<Dyn>, E, D>
where
    S: Shape + InsertAxis<AX>,
    <S as InsertAxis<AX>>::Inserted<One>:
        HasAxis<AX, Replaced<Dyn> = <S as InsertAxis<AX>>::Inserted<Dyn>>,
{
    ok(try_stack::<AX, S, E, D>(tensors))
}
