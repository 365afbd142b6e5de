//! `F.linear`: `x @ weight^T + bias` over the last axis of `x`, the op of a
//! linear layer. Its shapes are those of `x.matmul(&weight.t())` (checked
//! at compile time when static), with a bias of one value per output
//! feature.
//!
//! A backend may add the bias inside the product ([`LinearKernel`]), as
//! PyTorch's `addmm` does: each output element is written once, its sum
//! plus the bias, where the composed ops write the product and then make a
//! second pass (and a second allocation) to add the bias. Both add the bias
//! to the finished sum, so they give the same bits. The fused form records
//! its own backward (`dx = g @ w`, `dw = g^T @ x`, `db = sum(g)`, the
//! composed ops' products and sum), so training runs it too; a backend
//! without the kernel runs the composed ops.

use crate::device::Backend;
use crate::dtype::Float;
use crate::error::{fmt_dims, Error, Result};
use crate::layout::Layout;
use crate::ops::matmul::{product, rounded};
use crate::shape::{Dim, Dyn, MatmulShape, Shape};
use crate::tape::util::{reshape, sum_to};
use crate::tape::Raw;
use crate::tensor::{ok, Tensor};

/// The op's name, for errors.
const NAME: &str = "linear";

/// Backend support for a matrix product with a bias added in it.
pub trait LinearKernel<E: Float>: Backend {
    /// `x @ w^T + bias` for `x` `[m, k]`, `w` `[n, k]` and `bias` `[n]`, at
    /// any strides; the result is row-major `[m, n]`, each element the
    /// product's sum with `bias[j]` added last.
    ///
    /// `Ok(None)` (the default) means the backend has no fused kernel (for
    /// this dtype), and the caller runs the composed ops.
    fn linear(
        &self,
        x: (&Self::Storage<E>, &Layout),
        w: (&Self::Storage<E>, &Layout),
        bias: (&Self::Storage<E>, &Layout),
    ) -> Result<Option<Self::Storage<E>>> {
        let _ = (x, w, bias);
        Ok(None)
    }
}

impl<S: Shape, E: Float, D: crate::device::Device<E>> Tensor<S, E, D> {
    /// A linear map over the last axis, like `F.linear(x, weight, bias)`:
    /// `x @ weight.t() + bias`, with `weight` `[out, in]` and `bias`
    /// `[out]`. The shapes are checked as for [`Tensor::matmul`]: at
    /// compile time when static.
    ///
    /// ```
    /// use forma::prelude::*;
    /// let x = Tensor::<(C<2>, C<3>)>::from_vec(vec![1., 2., 3., 4., 5., 6.], (C, C)).unwrap();
    /// let w = Tensor::<(C<1>, C<3>)>::from_vec(vec![1., 0., -1.], (C, C)).unwrap();
    /// let b = Tensor::<(C<1>,)>::from_vec(vec![10.], (C,)).unwrap();
    /// let y: Tensor<(C<2>, C<1>)> = x.linear(&w, Some(&b));
    /// assert_eq!(y.to_vec(), vec![8.0, 8.0]);
    /// ```
    ///
    /// # Panics
    /// If `Dyn` sizes disagree at run time; see [`Tensor::try_linear`].
    #[track_caller]
    pub fn linear<O: Dim, I: Dim>(
        &self,
        weight: &Tensor<(O, I), E, D>,
        bias: Option<&Tensor<(O,), E, D>>,
    ) -> Tensor<<S as MatmulShape<(I, O)>>::Output, E, D>
    where
        S: MatmulShape<(I, O)>,
    {
        ok(self.try_linear(weight, bias))
    }

    fn try_linear_unnoted<O: Dim, I: Dim>(
        &self,
        weight: &Tensor<(O, I), E, D>,
        bias: Option<&Tensor<(O,), E, D>>,
    ) -> Result<Tensor<<S as MatmulShape<(I, O)>>::Output, E, D>>
    where
        S: MatmulShape<(I, O)>,
    {
        let low = crate::autocast::target::<E, D>(&self.device);
        if let Some(low) = low.filter(|&l| !self.device.has_matmul_low(l)) {
            // No low-precision kernel: round the operands and the result as
            // ops of their own around the plain op.
            let _inner = crate::autocast::suspend();
            let x = self.try_round_to(low)?;
            let w = weight.try_round_to(low)?;
            let b = bias.map(|b| b.try_round_to(low)).transpose()?;
            return x.try_linear_unnoted(&w, b.as_ref())?.try_round_to(low);
        }
        let Some(b) = bias else {
            return self.try_matmul(&weight.t());
        };
        self.same_device(NAME, weight)?;
        self.same_device(NAME, b)?;
        let (n, k) = (weight.layout.dims[0], weight.layout.dims[1]);
        if b.layout.dims[..] != [n] {
            return Err(Error::shape(
                NAME,
                format!(
                    "a bias of [{n}] (the weight's first size, {})",
                    fmt_dims(&weight.layout.dims)
                ),
                &b.layout.dims,
            ));
        }
        let dims = &self.layout.dims[..];
        if dims.last() != Some(&k) {
            // A size mismatch that `matmul` reports.
            return composed(self, weight, b);
        }
        // The rows of `x` as one `[rows, k]` matrix (a view when they fold).
        let rows = dims[..dims.len() - 1].iter().product();
        let x2 = self.try_reshape_to((Dyn(rows), Dyn(k)))?;
        let fused = match low {
            // Autocast: the product of the rounded operands, the rounded
            // bias added, the sums rounded, in one kernel; in inference on
            // the weight packed once (the same values).
            Some(low) => {
                let taped = crate::tape::is_grad_enabled()
                    && (self.var.is_some() || weight.var.is_some() || b.var.is_some());
                let wt = weight.layout.swap(0, 1);
                let packed = match taped {
                    true => None,
                    false => crate::ops::packed_weights::packed(&weight.storage, &wt, low, || {
                        self.device.pack_rhs_low((&weight.storage(), &wt), low)
                    })?,
                };
                let bias = (&*b.storage(), &b.layout);
                let x = (&*x2.storage(), &x2.layout);
                let pre = match &packed {
                    Some(p) => self.device.linear_low_packed(x, p, Some(bias), low, true)?,
                    None => None,
                };
                match pre {
                    Some(y) => Some(y),
                    None => Some(self.device.matmul_low(
                        x,
                        (&weight.storage(), &wt),
                        Some(bias),
                        low,
                        true,
                    )?),
                }
            }
            None => self.device.linear(
                (&x2.storage(), &x2.layout),
                (&weight.storage(), &weight.layout),
                (&b.storage(), &b.layout),
            )?,
        };
        let Some(s) = fused else {
            return composed(self, weight, b);
        };
        let mut out = dims.to_vec();
        *out.last_mut().expect("x has rank 1 or more") = n;
        let y = Tensor::from_storage(s, &out, self.device.clone());
        let need = [self.var.is_some(), weight.var.is_some(), b.var.is_some()];
        let (xr, wr, xdims) = (x2.raw(), weight.raw(), self.layout.dims);
        let saved = [need[1].then(|| xr.saved()), need[0].then(|| wr.saved())];
        Ok(y.record(
            NAME,
            &[self.var.clone(), weight.var.clone(), b.var.clone()],
            saved.into_iter().flatten().collect(),
            move |g| {
                let g = reshape(g, &[rows, n])?;
                let dev = &g.device;
                // The composed ops' gradients: `g @ w` for `x @ w^T`, `w`'s
                // as `g^T @ x` (row-major in `w`'s orientation, as matmul's
                // backward gives a transposed right operand), the bias's
                // summed over the rows as the broadcast add's backward does.
                // Under autocast (`low`) each product rounds its operands
                // and result, and the bias's gradient is the rounded sum of
                // the rounded `g`, as for the ops composed around bf16 ones.
                let gx = match need[0] {
                    true => {
                        let s = product(
                            dev,
                            (&g.storage(), &g.layout),
                            (&wr.storage(), &wr.layout),
                            low,
                            true,
                        )?;
                        Some(reshape(&Raw::new(s, &[rows, k], dev.clone()), &xdims)?)
                    }
                    false => None,
                };
                let gw = match need[1] {
                    true => {
                        let s = product(
                            dev,
                            (&g.storage(), &g.layout.swap(0, 1)),
                            (&xr.storage(), &xr.layout),
                            low,
                            true,
                        )?;
                        Some(Raw::new(s, &[n, k], dev.clone()))
                    }
                    false => None,
                };
                let gb = match need[2] {
                    true => {
                        let g = rounded(g, low, true)?;
                        Some(rounded(sum_to(&g, &[n])?, low, true)?)
                    }
                    false => None,
                };
                Ok(vec![gx, gw, gb])
            },
        ))
    }

    /// Fallible [`Tensor::linear`].
    ///
    /// # Errors
    /// A shape error when the last size of `x` is not the weight's second
    /// or the bias is not `[out]`; an error when an operand is on another
    /// device.
    pub fn try_linear<O: Dim, I: Dim>(
        &self,
        weight: &Tensor<(O, I), E, D>,
        bias: Option<&Tensor<(O,), E, D>>,
    ) -> Result<Tensor<<S as MatmulShape<(I, O)>>::Output, E, D>>
    where
        S: MatmulShape<(I, O)>,
    {
        let y = self.try_linear_unnoted(weight, bias)?;
        Ok(y.noted(|| {
            let mut ins = vec![self.val(), weight.val()];
            ins.extend(bias.map(|b| b.val()));
            (crate::graph::Op::Affine, ins)
        }))
    }
}

/// The composed, differentiable form: the product, then the bias added to
/// each of its rows.
fn composed<S, O: Dim, I: Dim, E: Float, D: crate::device::Device<E>>(
    x: &Tensor<S, E, D>,
    weight: &Tensor<(O, I), E, D>,
    bias: &Tensor<(O,), E, D>,
) -> Result<Tensor<<S as MatmulShape<(I, O)>>::Output, E, D>>
where
    S: MatmulShape<(I, O)>,
{
    let y = x.try_matmul(&weight.t())?;
    let shape = <S as MatmulShape<(I, O)>>::Output::from_dims(&y.layout.dims)
        .expect("a product's dims fit its shape");
    let (dims, n) = (&y.layout.dims, weight.layout.dims[0]);
    let rows = dims[..dims.len() - 1].iter().product();
    let y = &y.try_reshape_to((Dyn(rows), Dyn(n)))? + &bias.into_dyn();
    y.try_reshape_to(shape)
}
