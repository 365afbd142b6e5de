//! Padding one axis, like `F.pad` restricted to one dim: `Constant` fills,
//! `Reflect`, `Replicate` and `Circular` repeat the tensor's own elements
//! with PyTorch's index rules. `F.pad(x, (l, r, t, b))` on an NCHW tensor is
//! `x.pad::<3>(l, r, m)?.pad::<2>(t, b, m)?` (PyTorch's pads list the last
//! axis first).
//!
//! The shape rule: the axis must exist ([`AxisOf`], whose message names
//! the op) and becomes [`Dyn`]; the rest of the shape is unchanged. Constant padding writes the input
//! into a filled output, and its gradient is the output gradient's middle;
//! the other modes are an `index_select` along the axis, whose gradient adds
//! up every copy of an element.

use crate::device::Device;
use crate::dtype::Float;
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::shape::{op, AxisOf, Dyn, HasAxis, Shape};
use crate::tape::Raw;
use crate::tensor::{ok, Tensor};

/// How [`Tensor::pad`] fills the new elements, like `F.pad`'s `mode`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PadMode {
    /// A constant value (`mode="constant", value=v`).
    Constant(f64),
    /// The mirror image without repeating the edge (`"reflect"`: `d c | a b c d | b a`);
    /// each pad must be smaller than the axis.
    Reflect,
    /// The edge element repeated (`"replicate"`: `a a | a b c d | d d`).
    Replicate,
    /// The axis wrapped around (`"circular"`: `c d | a b c d | a b`); each
    /// pad must be at most the axis size.
    Circular,
}

impl PadMode {
    /// The source index of output position `p` for an axis of `n` elements
    /// padded by `before` (not for `Constant`).
    fn source(self, p: usize, before: usize, n: usize) -> i64 {
        let (q, n) = (p as i64 - before as i64, n as i64);
        match self {
            PadMode::Constant(_) => q,
            PadMode::Reflect => {
                let q = q.abs();
                if q > n - 1 {
                    2 * (n - 1) - q
                } else {
                    q
                }
            }
            PadMode::Replicate => q.clamp(0, n - 1),
            PadMode::Circular => q.rem_euclid(n),
        }
    }

    fn name(self) -> &'static str {
        match self {
            PadMode::Constant(_) => "constant",
            PadMode::Reflect => "reflect",
            PadMode::Replicate => "replicate",
            PadMode::Circular => "circular",
        }
    }
}

impl<S: Shape, E: Float, D: Device<E>> Tensor<S, E, D> {
    /// Pads axis `AX` with `before` elements in front and `after` behind.
    ///
    /// ```
    /// use forma::prelude::*;
    /// use forma::core::ops::pad::PadMode;
    /// let x = Tensor::<(C<1>, C<4>)>::from_vec(vec![1., 2., 3., 4.], (C, C)).unwrap();
    /// assert_eq!(x.pad::<1>(1, 2, PadMode::Constant(0.)).to_vec(), [0., 1., 2., 3., 4., 0., 0.]);
    /// assert_eq!(x.pad::<1>(2, 1, PadMode::Reflect).to_vec(), [3., 2., 1., 2., 3., 4., 3.]);
    /// assert_eq!(x.pad::<1>(1, 1, PadMode::Replicate).to_vec(), [1., 1., 2., 3., 4., 4.]);
    /// assert_eq!(x.pad::<1>(2, 1, PadMode::Circular).to_vec(), [3., 4., 1., 2., 3., 4., 1.]);
    /// ```
    ///
    /// # Panics
    /// Where PyTorch raises; see [`Tensor::try_pad`].
    #[track_caller]
    pub fn pad<const AX: isize>(
        &self,
        before: usize,
        after: usize,
        mode: PadMode,
    ) -> Tensor<<S as AxisOf<AX, op::pad>>::Replaced<Dyn>, E, D>
    where
        S: AxisOf<AX, op::pad>,
    {
        ok(self.try_pad::<AX>(before, after, mode))
    }

    /// [`Tensor::pad`], returning PyTorch's refusals as errors.
    ///
    /// # Errors
    /// `Reflect` with a pad not smaller than the axis, `Circular` with a pad
    /// larger than the axis, `Replicate`/`Reflect`/`Circular` on an empty
    /// axis, or a backend failure.
    pub fn try_pad<const AX: isize>(
        &self,
        before: usize,
        after: usize,
        mode: PadMode,
    ) -> Result<Tensor<<S as AxisOf<AX, op::pad>>::Replaced<Dyn>, E, D>>
    where
        S: AxisOf<AX, op::pad>,
    {
        let ax = <S as HasAxis<AX>>::INDEX;
        let n = self.layout.dims[ax];
        let out_len = before + n + after;
        let fits = match mode {
            PadMode::Constant(_) => true,
            PadMode::Reflect => before < n && after < n,
            PadMode::Replicate => n > 0,
            PadMode::Circular => n > 0 && before <= n && after <= n,
        };
        if !fits {
            return Err(Error::invalid(
                "pad",
                format!(
                    "{} padding of ({before}, {after}) does not fit axis {ax} of size {n}",
                    mode.name()
                ),
            ));
        }
        if let PadMode::Constant(value) = mode {
            let mut dims = self.layout.dims;
            dims[ax] = out_len;
            let dev = &self.device;
            let mut out = dev.full(dims.numel(), E::from_f64(value))?;
            let full = Layout::contiguous(&dims);
            dev.copy_strided(
                &self.storage(),
                &self.layout,
                &mut out,
                &full.narrow(ax, before, n),
            )?;
            return Ok(Tensor::from_storage(out, &dims, dev.clone()).record(
                "pad",
                std::slice::from_ref(&self.var),
                vec![],
                move |g| {
                    Ok(vec![Some(Raw {
                        layout: g.layout.narrow(ax, before, n),
                        ..g.clone()
                    })])
                },
            ));
        }
        let idx = (0..out_len).map(|p| mode.source(p, before, n)).collect();
        Ok(self.select_along::<AX>(idx)?.retype())
    }
}
