//! Views: ops that only change the layout and share the storage (transpose,
//! permute, narrow, slice, expand, unsqueeze, squeeze, split, chunk), and the
//! reshapes that share it when the data is contiguous.

use super::{ok, Tensor};
use crate::device::Backend;
use crate::dtype::Dtype;
use crate::error::{fmt_dims, Error, Result};
use crate::graph::{self, note_op, Op};
use crate::layout::Layout;
use crate::shape::check::assert_same_numel;
use crate::shape::{
    op, AxisOf, Dim, Dyn, ExpandTo, HasAxis, InsertAxis, InsertAxisOf, One, PermuteShape, Shape,
    SizeOne, SwapAxes,
};
use crate::tape::util::{embed, reshape};
use crate::tape::Raw;

impl<S: Shape, E: Dtype, D: Backend> Tensor<S, E, D> {
    /// Swaps axes `A` and `B` (a view), like `tensor.transpose(a, b)`.
    ///
    /// ```
    /// use forma::prelude::*;
    /// let x = Tensor::<(C<2>, C<3>)>::zeros();
    /// let y: Tensor<(C<3>, C<2>)> = x.transpose::<0, 1>();
    /// assert!(y.shares_storage(&x));
    /// ```
    pub fn transpose<const A: isize, const B: isize>(
        &self,
    ) -> Tensor<<S as SwapAxes<A, B>>::Swapped, E, D>
    where
        S: SwapAxes<A, B>,
    {
        let (a, b) = <S as SwapAxes<A, B>>::INDICES;
        let y = self.view_with_grad(self.layout.swap(a, b), "transpose", move |g| {
            Ok(Raw {
                layout: g.layout.swap(a, b),
                ..g.clone()
            })
        });
        note_op!(Op::Transpose { axes: [a, b] }, [self], y);
        y
    }

    /// Reorders the axes (a view): `x.permute::<(Ax<2>, Ax<0>, Ax<1>)>()`.
    pub fn permute<P>(&self) -> Tensor<<S as PermuteShape<P>>::Permuted, E, D>
    where
        S: PermuteShape<P>,
    {
        let mut inverse = [0; crate::shape::MAX_RANK];
        for (i, &p) in S::PERM.iter().enumerate() {
            inverse[p] = i;
        }
        let y = self.view_with_grad(self.layout.permute(S::PERM), "permute", move |g| {
            Ok(Raw {
                layout: g.layout.permute(&inverse[..S::RANK]),
                ..g.clone()
            })
        });
        let perm = S::PERM.to_vec();
        note_op!(Op::Permute { perm }, [self], y);
        y
    }

    /// Inserts a size-1 axis at `AX` (a view), like `tensor.unsqueeze(ax)`.
    /// The new dim is [`One`], which broadcasts.
    pub fn unsqueeze<const AX: isize>(
        &self,
    ) -> Tensor<<S as InsertAxisOf<AX, op::unsqueeze>>::Inserted<One>, E, D>
    where
        S: InsertAxisOf<AX, op::unsqueeze>,
    {
        self.unsqueeze_at::<AX>().retype()
    }

    /// [`Tensor::unsqueeze`] under its types' rule only, for ops built on it.
    pub(crate) fn unsqueeze_at<const AX: isize>(
        &self,
    ) -> Tensor<<S as InsertAxis<AX>>::Inserted<One>, E, D>
    where
        S: InsertAxis<AX>,
    {
        let ax = <S as InsertAxis<AX>>::INDEX;
        let y = self.view_with_grad(self.layout.insert_axis(ax), "unsqueeze", move |g| {
            Ok(Raw {
                layout: g.layout.remove_axis(ax),
                ..g.clone()
            })
        });
        note_op!(Op::Unsqueeze { axis: ax }, [self], y);
        y
    }

    /// Removes the size-1 axis `AX` (a view), like `tensor.squeeze(ax)`.
    ///
    /// # Panics
    /// If the axis is a `Dyn` whose size is not 1; see [`Tensor::try_squeeze`].
    #[track_caller]
    pub fn squeeze<const AX: isize>(&self) -> Tensor<<S as AxisOf<AX, op::squeeze>>::Removed, E, D>
    where
        S: AxisOf<AX, op::squeeze>,
        <S as AxisOf<AX, op::squeeze>>::At: SizeOne,
    {
        ok(self.try_squeeze::<AX>())
    }

    /// Fallible [`Tensor::squeeze`].
    ///
    /// # Errors
    /// A [`crate::ShapeError`] when the axis does not have size 1.
    pub fn try_squeeze<const AX: isize>(
        &self,
    ) -> Result<Tensor<<S as AxisOf<AX, op::squeeze>>::Removed, E, D>>
    where
        S: AxisOf<AX, op::squeeze>,
        <S as AxisOf<AX, op::squeeze>>::At: SizeOne,
    {
        let ax = <S as HasAxis<AX>>::INDEX;
        if self.layout.dims[ax] != 1 {
            return Err(Error::shape(
                "squeeze",
                format!("size 1 at axis {ax}"),
                &self.layout.dims,
            ));
        }
        let y = self.view_with_grad(self.layout.remove_axis(ax), "squeeze", move |g| {
            Ok(Raw {
                layout: g.layout.insert_axis(ax),
                ..g.clone()
            })
        });
        note_op!(Op::Squeeze { axis: ax }, [self], y);
        Ok(y)
    }

    /// Keeps `len` elements of axis `AX` from `start` (a view), like
    /// `tensor.narrow(ax, start, len)`. The axis becomes [`Dyn`].
    ///
    /// # Panics
    /// If the range does not fit; see [`Tensor::try_narrow`].
    #[track_caller]
    pub fn narrow<const AX: isize>(
        &self,
        start: usize,
        len: usize,
    ) -> Tensor<<S as AxisOf<AX, op::narrow>>::Replaced<Dyn>, E, D>
    where
        S: AxisOf<AX, op::narrow>,
    {
        ok(self.try_narrow::<AX>(start, len))
    }

    /// Fallible [`Tensor::narrow`].
    ///
    /// # Errors
    /// When `start + len` exceeds the axis size.
    pub fn try_narrow<const AX: isize>(
        &self,
        start: usize,
        len: usize,
    ) -> Result<Tensor<<S as AxisOf<AX, op::narrow>>::Replaced<Dyn>, E, D>>
    where
        S: AxisOf<AX, op::narrow>,
    {
        self.slice_at::<AX>(start, start + len, 1)
            .map(Tensor::retype)
    }

    /// Keeps a static number `LEN` of elements of axis `AX` from `start` (a view).
    ///
    /// # Panics
    /// If the range does not fit the axis.
    pub fn narrow_static<const AX: isize, const LEN: usize>(
        &self,
        start: usize,
    ) -> Tensor<<S as AxisOf<AX, op::narrow>>::Replaced<crate::C<LEN>>, E, D>
    where
        S: AxisOf<AX, op::narrow>,
    {
        let v = ok(self.slice_at::<AX>(start, start + LEN, 1));
        v.retype()
    }

    /// Elements `start, start + step, ...` below `end` of axis `AX` (a view),
    /// like `tensor[..., start:end:step, ...]`.
    ///
    /// # Errors
    /// When the range is out of bounds or `step` is zero.
    pub fn try_slice<const AX: isize>(
        &self,
        start: usize,
        end: usize,
        step: usize,
    ) -> Result<Tensor<<S as AxisOf<AX, op::slice>>::Replaced<Dyn>, E, D>>
    where
        S: AxisOf<AX, op::slice>,
    {
        self.slice_at::<AX>(start, end, step).map(Tensor::retype)
    }

    /// [`Tensor::try_slice`] under its types' rule only, for ops built on it.
    pub(crate) fn slice_at<const AX: isize>(
        &self,
        start: usize,
        end: usize,
        step: usize,
    ) -> Result<Tensor<<S as HasAxis<AX>>::Replaced<Dyn>, E, D>>
    where
        S: HasAxis<AX>,
    {
        let ax = <S as HasAxis<AX>>::INDEX;
        let size = self.layout.dims[ax];
        if step == 0 || start > end || end > size {
            return Err(Error::invalid(
                "slice",
                format!("range {start}..{end} step {step} does not fit axis {ax} of size {size}"),
            ));
        }
        let len = (end - start).div_ceil(step);
        let dims = self.layout.dims;
        let y = self.view_with_grad(
            self.layout.slice_step(ax, start, len, step),
            "slice",
            move |g| {
                embed(
                    g,
                    &dims,
                    &Layout::contiguous(&dims).slice_step(ax, start, len, step),
                )
            },
        );
        if graph::capturing() {
            graph::note_slice(&self.val(), ax, start, end, step, &y.val());
        }
        Ok(y)
    }

    /// [`Tensor::try_slice`] that panics on a bad range.
    #[track_caller]
    pub fn slice<const AX: isize>(
        &self,
        start: usize,
        end: usize,
        step: usize,
    ) -> Tensor<<S as AxisOf<AX, op::slice>>::Replaced<Dyn>, E, D>
    where
        S: AxisOf<AX, op::slice>,
    {
        ok(self.try_slice::<AX>(start, end, step))
    }

    /// Splits axis `AX` into views of `size` elements (the last may be
    /// shorter), like `tensor.split(size, ax)`.
    ///
    /// # Panics
    /// If `size` is zero.
    pub fn split<const AX: isize>(
        &self,
        size: usize,
    ) -> Vec<Tensor<<S as AxisOf<AX, op::split>>::Replaced<Dyn>, E, D>>
    where
        S: AxisOf<AX, op::split>,
    {
        let ax = <S as HasAxis<AX>>::INDEX;
        assert!(size > 0, "split: the piece size must be positive");
        self.pieces_at::<AX, _>(self.layout.dims[ax], size)
    }

    /// Views of `size` elements along `AX` (of `n`), the last maybe shorter.
    fn pieces_at<const AX: isize, S2: Shape>(&self, n: usize, size: usize) -> Vec<Tensor<S2, E, D>>
    where
        S: HasAxis<AX>,
    {
        (0..n)
            .step_by(size)
            .map(|s| ok(self.slice_at::<AX>(s, s + size.min(n - s), 1)).retype())
            .collect()
    }

    /// Splits axis `AX` into `chunks` views of near-equal size, like `tensor.chunk(chunks, ax)`.
    ///
    /// # Panics
    /// If `chunks` is zero.
    pub fn chunk<const AX: isize>(
        &self,
        chunks: usize,
    ) -> Vec<Tensor<<S as AxisOf<AX, op::chunk>>::Replaced<Dyn>, E, D>>
    where
        S: AxisOf<AX, op::chunk>,
    {
        let ax = <S as HasAxis<AX>>::INDEX;
        assert!(chunks > 0, "chunk: the number of chunks must be positive");
        let n = self.layout.dims[ax];
        self.pieces_at::<AX, _>(n, n.div_ceil(chunks).max(1))
    }

    /// Broadcasts to `shape` (a view with stride 0 on stretched dims), like
    /// `tensor.expand(shape)`.
    ///
    /// # Panics
    /// If a `Dyn` size does not fit; see [`Tensor::try_expand`].
    #[track_caller]
    pub fn expand<S2: Shape>(&self, shape: S2) -> Tensor<S2, E, D>
    where
        S: ExpandTo<S2>,
    {
        ok(self.try_expand(shape))
    }

    /// Fallible [`Tensor::expand`].
    ///
    /// # Errors
    /// A [`crate::ShapeError`] when a size is neither equal nor 1.
    pub fn try_expand<S2: Shape>(&self, shape: S2) -> Result<Tensor<S2, E, D>>
    where
        S: ExpandTo<S2>,
    {
        self.try_expand_dims(&shape.dims())
    }

    /// [`Tensor::try_expand`] to sizes `target` given at run time, for
    /// callers whose shape types cannot name the bound.
    pub(crate) fn try_expand_dims<S2: Shape>(&self, target: &[usize]) -> Result<Tensor<S2, E, D>> {
        let Some(extra) = target.len().checked_sub(S::RANK) else {
            return Err(Error::shape("expand", fmt_dims(target), &self.layout.dims));
        };
        for i in 0..S::RANK {
            let d = self.layout.dims[i];
            if d != target[extra + i] && d != 1 {
                return Err(Error::shape("expand", fmt_dims(target), &self.layout.dims));
            }
        }
        let (dims, ops) = (self.layout.dims, self.var.as_ref().map(|v| v.ops()));
        let y = self.view_with_grad(
            self.layout.broadcast_to(target),
            "expand",
            move |g| match ops {
                Some(ops) => ops.sum_to(g, &dims),
                None => Ok(g.clone()),
            },
        );
        if graph::capturing() {
            graph::note_expand(&self.val(), &y.val());
        }
        Ok(y)
    }

    /// Broadcasts to the shape of `other`.
    pub fn expand_as<S2: Shape, E2: Dtype>(&self, other: &Tensor<S2, E2, D>) -> Tensor<S2, E, D>
    where
        S: ExpandTo<S2>,
    {
        self.expand(other.shape())
    }

    /// Reinterprets the elements with a new shape, like `tensor.reshape`: a view
    /// when the data is contiguous, else a copy. Element counts of static shapes
    /// are checked at compile time; one `Dyn` dim in `S2` is inferred (like `-1`).
    ///
    /// ```
    /// use forma::prelude::*;
    /// let x = Tensor::<(C<2>, C<6>)>::zeros();
    /// let y: Tensor<(C<3>, C<4>)> = x.reshape();
    /// let z: Tensor<(Dyn, C<3>)> = x.reshape();
    /// assert_eq!(z.dims().to_vec(), vec![4, 3]);
    /// ```
    ///
    /// Several `Dyn` dims in `S2` keep the sizes of a leading run of `Dyn`
    /// dims the input has at the same positions, the last one inferred: a
    /// head split `(B, S, 384)` to `(B, S, 12, 32)` with `B` and `S` both
    /// `Dyn`, as `x.view(b, s, 12, 32)` in PyTorch.
    ///
    /// ```
    /// use forma::prelude::*;
    /// let x = Tensor::<(Dyn, Dyn, C<384>)>::zeros_with((Dyn(2), Dyn(5), C));
    /// let heads: Tensor<(Dyn, Dyn, C<12>, C<32>)> = x.reshape();
    /// assert_eq!(heads.dims().to_vec(), vec![2, 5, 12, 32]);
    /// let merged: Tensor<(Dyn, Dyn, C<384>)> = heads.reshape();
    /// assert_eq!(merged.dims().to_vec(), vec![2, 5, 384]);
    /// ```
    ///
    /// # Panics
    /// If the counts disagree at run time; see [`Tensor::try_reshape`].
    #[track_caller]
    pub fn reshape<S2: Shape>(&self) -> Tensor<S2, E, D> {
        const { assert_same_numel("reshape", S::STATIC_NUMEL, S2::STATIC_NUMEL) };
        ok(self.try_reshape::<S2>())
    }

    /// Fallible [`Tensor::reshape`].
    ///
    /// # Errors
    /// A [`crate::ShapeError`] when the element count differs, or `S2` has
    /// more than one `Dyn` dim besides those kept from the input (use
    /// [`Tensor::try_reshape_to`]).
    pub fn try_reshape<S2: Shape>(&self) -> Result<Tensor<S2, E, D>> {
        let mut statics = S2::static_dims();
        let from = S::static_dims();
        // Several `Dyn`s: the leading ones the input also has keep its
        // sizes, until one is left to infer.
        let mut i = 0;
        while statics.iter().filter(|d| d.is_none()).count() > 1
            && i < statics.len().min(from.len())
            && statics[i].is_none()
            && from[i].is_none()
        {
            statics[i] = Some(self.layout.dims[i]);
            i += 1;
        }
        let numel = self.numel();
        let known: usize = statics.iter().flatten().product();
        let dyns = statics.iter().filter(|d| d.is_none()).count();
        let err = || Error::shape("reshape", S2::describe(), &self.layout.dims);
        let dims: Vec<usize> = match dyns {
            0 => statics.iter().map(|d| d.unwrap_or(0)).collect(),
            1 if known > 0 && numel.is_multiple_of(known) => {
                statics.iter().map(|d| d.unwrap_or(numel / known)).collect()
            }
            _ => return Err(err()),
        };
        let shape = S2::from_dims(&dims).ok_or_else(err)?;
        self.try_reshape_to(shape)
    }

    /// Reshapes to a runtime shape value (any number of `Dyn` dims).
    ///
    /// # Errors
    /// A [`crate::ShapeError`] when the element count differs.
    pub fn try_reshape_to<S2: Shape>(&self, shape: S2) -> Result<Tensor<S2, E, D>> {
        let dims = shape.dims();
        if dims.numel() != self.numel() {
            return Err(Error::shape("reshape", fmt_dims(&dims), &self.layout.dims));
        }
        let src = if self.layout.reshape(&dims).is_some() {
            self.clone()
        } else {
            self.contiguous()
        };
        let layout = src
            .layout
            .reshape(&dims)
            .expect("a contiguous layout reshapes");
        let from = self.layout.dims;
        let y = src.view_with_grad(layout, "reshape", move |g| reshape(g, &from));
        if graph::capturing() {
            graph::note_reshape(&src.val(), &y.val());
        }
        Ok(y)
    }

    /// Flattens every axis after the first into one of size `O`, like
    /// `torch.flatten(x, 1)`; the element count is checked at compile time when
    /// the flattened axes are static.
    ///
    /// ```
    /// use forma::prelude::*;
    /// let x = Tensor::<(Dyn, C<16>, C<5>, C<5>)>::zeros_with((Dyn(2), C, C, C));
    /// let y: Tensor<(Dyn, C<400>)> = x.flatten();
    /// assert_eq!(y.dims().to_vec(), vec![2, 400]);
    /// ```
    ///
    /// # Panics
    /// If `O` disagrees with a `Dyn` size at run time; see [`Tensor::try_flatten`].
    #[track_caller]
    pub fn flatten<O: Dim>(&self) -> Tensor<(<S as AxisOf<0, op::flatten>>::At, O), E, D>
    where
        S: AxisOf<0, op::flatten>,
    {
        ok(self.try_flatten())
    }

    /// [`Tensor::flatten`], returning the error.
    ///
    /// # Errors
    /// A shape error when `O` disagrees with the sizes at run time.
    pub fn try_flatten<O: Dim>(
        &self,
    ) -> Result<Tensor<(<S as AxisOf<0, op::flatten>>::At, O), E, D>>
    where
        S: AxisOf<0, op::flatten>,
    {
        const {
            assert_same_numel(
                "flatten",
                <<S as HasAxis<0>>::Removed as Shape>::STATIC_NUMEL,
                O::STATIC,
            )
        };
        let first = self.layout.dims[0];
        let rest = self.numel().checked_div(first).unwrap_or(0);
        let shape = <(<S as AxisOf<0, op::flatten>>::At, O)>::from_dims(&[first, rest]);
        shape
            .ok_or_else(|| {
                Error::shape(
                    "flatten",
                    <(<S as AxisOf<0, op::flatten>>::At, O)>::describe(),
                    &self.layout.dims,
                )
            })
            .and_then(|s| self.try_reshape_to(s))
    }

    /// All elements as a rank-1 tensor.
    #[track_caller]
    pub fn flatten_all(&self) -> Tensor<(Dyn,), E, D> {
        ok(self.try_reshape_to((Dyn(self.numel()),)))
    }
}

impl<A: Dim, B: Dim, E: Dtype, D: Backend> Tensor<(A, B), E, D> {
    /// The transpose of a matrix (a view), like `tensor.t()`.
    pub fn t(&self) -> Tensor<(B, A), E, D> {
        self.transpose::<0, 1>()
    }
}
