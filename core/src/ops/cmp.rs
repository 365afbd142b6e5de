//! Comparisons (to `bool` masks), `where` and `masked_fill`, with broadcasting.
//! Comparisons are not differentiable: their results are `bool` tensors, which
//! have no float ops, so a gradient cannot flow through them by mistake.

use crate::device::Backend;
use crate::dtype::Float;
use crate::error::{fmt_dims, Error, Result};
use crate::graph::Op;
use crate::layout::{broadcast_dims, Layout};
use crate::ops::binary::broadcast_layouts;
use crate::shape::{op, BroadcastShape, Broadcasts, ExpandTo, Shape};
use crate::tape::util::sum_to;
use crate::tape::Raw;
use crate::tensor::{ok, Tensor};

/// A comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmpOp {
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

impl CmpOp {
    /// The method's name (`eq`, `lt`, ...).
    pub fn name(self) -> &'static str {
        match self {
            CmpOp::Eq => "eq",
            CmpOp::Ne => "ne",
            CmpOp::Lt => "lt",
            CmpOp::Le => "le",
            CmpOp::Gt => "gt",
            CmpOp::Ge => "ge",
        }
    }
}

/// Backend support for comparisons and selection.
pub trait CmpKernel<E: Float>: Backend {
    /// Compares pairwise; `la` and `lb` have the output's sizes. NaN compares
    /// unequal to everything, as in IEEE arithmetic.
    fn cmp(
        &self,
        op: CmpOp,
        a: &Self::Storage<E>,
        la: &Layout,
        b: &Self::Storage<E>,
        lb: &Layout,
    ) -> Result<Self::Storage<bool>>;
    /// Picks `a` where `cond` holds and `b` elsewhere; all three layouts have
    /// the output's sizes.
    fn where_cond(
        &self,
        cond: &Self::Storage<bool>,
        lc: &Layout,
        a: &Self::Storage<E>,
        la: &Layout,
        b: &Self::Storage<E>,
        lb: &Layout,
    ) -> Result<Self::Storage<E>>;
}

macro_rules! cmp_methods {
    ($($(#[$doc:meta])* $m:ident, $try_m:ident => $op:ident;)*) => {
        impl<S: Shape, E: Float, D: crate::device::Device<E>> Tensor<S, E, D> {$(
            $(#[$doc])*
            ///
            /// # Panics
            /// If `Dyn` sizes do not broadcast (see the `try_` form).
            #[track_caller]
            pub fn $m<S2: Shape>(&self, rhs: &Tensor<S2, E, D>) -> Tensor<<S as BroadcastShape<S2>>::Output, bool, D>
            where
                S: Broadcasts<S2, op::$m>,
            {
                ok(self.$try_m(rhs))
            }

            $(#[$doc])*
            ///
            /// # Errors
            /// A [`crate::ShapeError`] when `Dyn` sizes do not broadcast.
            pub fn $try_m<S2: Shape>(&self, rhs: &Tensor<S2, E, D>) -> Result<Tensor<<S as BroadcastShape<S2>>::Output, bool, D>>
            where
                S: Broadcasts<S2, op::$m>,
            {
                self.try_compare(CmpOp::$op, rhs)
            }
        )*}
    };
}

cmp_methods! {
    /// Elementwise `a == b` as a `bool` mask, like `torch.eq`.
    eq, try_eq => Eq;
    /// Elementwise `a != b`.
    ne, try_ne => Ne;
    /// Elementwise `a < b`.
    lt, try_lt => Lt;
    /// Elementwise `a <= b`.
    le, try_le => Le;
    /// Elementwise `a > b`.
    gt, try_gt => Gt;
    /// Elementwise `a >= b`.
    ge, try_ge => Ge;
}

macro_rules! logical_methods {
    ($($(#[$doc:meta])* $m:ident, $try_m:ident => |$a:ident, $b:ident| $f:expr;)*) => {
        impl<S: Shape, D: crate::device::Device<f32>> Tensor<S, bool, D> {$(
            $(#[$doc])*
            ///
            /// # Panics
            /// If `Dyn` sizes do not broadcast (see the `try_` form).
            #[track_caller]
            pub fn $m<S2: Shape>(&self, rhs: &Tensor<S2, bool, D>) -> Tensor<<S as BroadcastShape<S2>>::Output, bool, D>
            where
                S: Broadcasts<S2, op::$m>,
            {
                ok(self.$try_m(rhs))
            }

            $(#[$doc])*
            ///
            /// # Errors
            /// A [`crate::ShapeError`] when `Dyn` sizes do not broadcast, or
            /// operands on different devices.
            pub fn $try_m<S2: Shape>(&self, rhs: &Tensor<S2, bool, D>) -> Result<Tensor<<S as BroadcastShape<S2>>::Output, bool, D>>
            where
                S: Broadcasts<S2, op::$m>,
            {
                // As 0/1 floats, where the result is nonzero exactly when
                // the relation holds; the cast back maps nonzero to true.
                let ($a, $b) = (self.to_dtype::<f32>(), rhs.to_dtype::<f32>());
                Ok($f?.to_dtype::<bool>())
            }
        )*}
    };
}

logical_methods! {
    /// Elementwise `a && b` with broadcasting, like `torch.logical_and`.
    logical_and, try_logical_and => |a, b| a.try_zip(crate::ops::binary::Mul, &b);
    /// Elementwise `a || b` with broadcasting, like `torch.logical_or`.
    logical_or, try_logical_or => |a, b| a.try_zip(crate::ops::binary::Add, &b);
    /// Elementwise `a != b` (exclusive or) with broadcasting, like
    /// `torch.logical_xor`.
    logical_xor, try_logical_xor => |a, b| a.try_zip(crate::ops::binary::Sub, &b);
}

impl<S: Shape, D: crate::device::Device<f32>> Tensor<S, bool, D> {
    /// Elementwise `!a`, like `torch.logical_not` (or `~mask`).
    ///
    /// ```
    /// use forma::prelude::*;
    ///
    /// let a = Tensor::<(C<3>,)>::from_vec(vec![1., 2., 3.], (C,)).unwrap();
    /// let keep = a.gt(&Tensor::<(One,)>::from_vec(vec![1.5], (One,)).unwrap());
    /// assert_eq!(keep.logical_not().to_vec(), [true, false, false]);
    /// let small = a.lt(&Tensor::<(One,)>::from_vec(vec![2.5], (One,)).unwrap());
    /// assert_eq!(keep.logical_and(&small).to_vec(), [false, true, false]);
    /// assert_eq!(keep.logical_or(&small).to_vec(), [true, true, true]);
    /// assert_eq!(keep.logical_xor(&small).to_vec(), [true, false, true]);
    /// ```
    pub fn logical_not(&self) -> Self {
        self.to_dtype::<f32>()
            .mul_scalar(-1.0)
            .add_scalar(1.0)
            .to_dtype::<bool>()
    }
}

/// The layout `l` stretched to `dims`, or a shape error when it does not
/// broadcast to exactly `dims`.
pub(crate) fn expand_layout(op: &'static str, l: &Layout, dims: &[usize]) -> Result<Layout> {
    match broadcast_dims(dims, &l.dims) {
        Some(d) if &*d == dims => Ok(l.broadcast_to(dims)),
        _ => Err(Error::shape(
            op,
            format!("a shape that broadcasts to {}", fmt_dims(dims)),
            &l.dims,
        )),
    }
}

impl<S: Shape, E: Float, D: crate::device::Device<E>> Tensor<S, E, D> {
    pub(crate) fn try_compare<S2: Shape>(
        &self,
        op: CmpOp,
        rhs: &Tensor<S2, E, D>,
    ) -> Result<Tensor<<S as BroadcastShape<S2>>::Output, bool, D>>
    where
        S: BroadcastShape<S2>,
    {
        self.same_device("compare", rhs)?;
        let (out, la, lb) = broadcast_layouts::<<S as BroadcastShape<S2>>::Output>(
            "compare",
            &self.layout,
            &rhs.layout,
        )?;
        let s = self
            .device
            .cmp(op, &self.storage(), &la, &rhs.storage(), &lb)?;
        Ok(
            Tensor::from_storage(s, &out, self.device.clone()).noted(|| {
                let name = op.name();
                (Op::Compare { name }, vec![self.val(), rhs.val()])
            }),
        )
    }

    /// Replaces the elements where `mask` is true by `value`, like
    /// `x.masked_fill(mask, value)`. The mask broadcasts to `self`'s shape.
    ///
    /// # Panics
    /// If a `Dyn` size of the mask does not broadcast (see [`Tensor::try_masked_fill`]).
    #[track_caller]
    pub fn masked_fill<Sm: Shape>(&self, mask: &Tensor<Sm, bool, D>, value: f64) -> Self
    where
        Sm: ExpandTo<S, op::masked_fill>,
    {
        ok(self.try_masked_fill(mask, value))
    }

    /// Fallible [`Tensor::masked_fill`].
    ///
    /// # Errors
    /// A [`crate::ShapeError`] when the mask does not broadcast to `self`.
    pub fn try_masked_fill<Sm: Shape>(&self, mask: &Tensor<Sm, bool, D>, value: f64) -> Result<Self>
    where
        Sm: ExpandTo<S, op::masked_fill>,
    {
        self.try_fill_where(mask, value)
    }

    /// [`Tensor::try_masked_fill`] with the mask's sizes checked only at run
    /// time (for ops built on it, whose own bounds state their rule).
    pub(crate) fn try_fill_where<Sm: Shape>(
        &self,
        mask: &Tensor<Sm, bool, D>,
        value: f64,
    ) -> Result<Self> {
        self.same_device("masked_fill", mask)?;
        let dims = self.layout.dims;
        let lm = expand_layout("masked_fill", &mask.layout, &dims)?;
        let fill = self.device.full(1, E::from_f64(value))?;
        let lf = Layout::contiguous(&[]).broadcast_to(&dims);
        let s = self.device.where_cond(
            &mask.storage(),
            &lm,
            &fill,
            &lf,
            &self.storage(),
            &self.layout,
        )?;
        let m = Raw {
            layout: lm,
            ..mask.raw()
        };
        Ok(Self::from_storage(s, &dims, self.device.clone())
            .record(
                "masked_fill",
                std::slice::from_ref(&self.var),
                vec![m.saved()],
                move |g| {
                    let (zero, lz) = zeros_like_view(g)?;
                    let gx = g.device.where_cond(
                        &m.storage(),
                        &m.layout,
                        &zero,
                        &lz,
                        &g.storage(),
                        &g.layout,
                    )?;
                    Ok(vec![Some(Raw::new(gx, &g.layout.dims, g.device.clone()))])
                },
            )
            .noted(|| (Op::MaskedFill { value }, vec![self.val(), mask.val()])))
    }
}

/// A single zero viewed with `g`'s sizes (stride 0), for masking gradients.
fn zeros_like_view<E: Float, D: Backend>(g: &Raw<E, D>) -> Result<(D::Storage<E>, Layout)> {
    Ok((
        g.device.full(1, E::from_f64(0.0))?,
        Layout::contiguous(&[]).broadcast_to(&g.layout.dims),
    ))
}

/// Elementwise selection, like `torch.where(cond, a, b)`: `a` where `cond`
/// holds, else `b`. `a` and `b` broadcast together and `cond` broadcasts to
/// their shape.
///
/// # Panics
/// If `Dyn` sizes do not broadcast (see [`try_where_cond`]).
#[track_caller]
pub fn where_cond<Sc: Shape, Sa: Shape, Sb: Shape, E: Float, D: crate::device::Device<E>>(
    cond: &Tensor<Sc, bool, D>,
    a: &Tensor<Sa, E, D>,
    b: &Tensor<Sb, E, D>,
) -> Tensor<<Sa as BroadcastShape<Sb>>::Output, E, D>
where
    Sa: Broadcasts<Sb, op::where_cond_branches>,
    Sc: ExpandTo<<Sa as BroadcastShape<Sb>>::Output, op::where_cond_mask>,
{
    ok(try_where_cond(cond, a, b))
}

/// Fallible [`where_cond`].
///
/// # Errors
/// A [`crate::ShapeError`] when sizes do not broadcast.
pub fn try_where_cond<Sc: Shape, Sa: Shape, Sb: Shape, E: Float, D: crate::device::Device<E>>(
    cond: &Tensor<Sc, bool, D>,
    a: &Tensor<Sa, E, D>,
    b: &Tensor<Sb, E, D>,
) -> Result<Tensor<<Sa as BroadcastShape<Sb>>::Output, E, D>>
where
    Sa: Broadcasts<Sb, op::where_cond_branches>,
    Sc: ExpandTo<<Sa as BroadcastShape<Sb>>::Output, op::where_cond_mask>,
{
    a.same_device("where", b)?;
    a.same_device("where", cond)?;
    let (out, la, lb) =
        broadcast_layouts::<<Sa as BroadcastShape<Sb>>::Output>("where", &a.layout, &b.layout)?;
    let lc = expand_layout("where", &cond.layout, &out)?;
    let s = a
        .device
        .where_cond(&cond.storage(), &lc, &a.storage(), &la, &b.storage(), &lb)?;
    let c = Raw {
        layout: lc,
        ..cond.raw()
    };
    let (da, db) = (a.layout.dims, b.layout.dims);
    Ok(Tensor::from_storage(s, &out, a.device.clone())
        .record(
            "where",
            &[a.var.clone(), b.var.clone()],
            vec![c.saved()],
            move |g| {
                let (zero, lz) = zeros_like_view(g)?;
                let ga = g.device.where_cond(
                    &c.storage(),
                    &c.layout,
                    &g.storage(),
                    &g.layout,
                    &zero,
                    &lz,
                )?;
                let gb = g.device.where_cond(
                    &c.storage(),
                    &c.layout,
                    &zero,
                    &lz,
                    &g.storage(),
                    &g.layout,
                )?;
                let ga = sum_to(&Raw::new(ga, &g.layout.dims, g.device.clone()), &da)?;
                let gb = sum_to(&Raw::new(gb, &g.layout.dims, g.device.clone()), &db)?;
                Ok(vec![Some(ga), Some(gb)])
            },
        )
        .noted(|| (Op::Where, vec![cond.val(), a.val(), b.val()])))
}
