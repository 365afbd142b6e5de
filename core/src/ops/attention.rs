//! Scaled dot-product attention, like `F.scaled_dot_product_attention`:
//! `softmax(q @ k^T * scale + mask) @ v` over `[batch, heads, T, K]`
//! queries, `[batch, heads, S, K]` keys and `[batch, heads, S, V]` values.
//!
//! A backend may run it fused ([`AttentionKernel`]): one pass per head that
//! keeps the `T x S` scores in cache instead of writing them out, reading them
//! back for the softmax and again for the product with `v`. The fused form
//! runs when no gradient is recorded (inference); with the tape on, or on a
//! backend without the kernel, the same computation runs as composed ops
//! (scale the queries, product, mask, softmax, product), as PyTorch's math
//! path does, and is differentiable. The two agree to rounding.
//!
//! The shape rule is in the types: the batch, head and key sizes are shared
//! type parameters, so static sizes that disagree are a compile error; `Dyn`
//! sizes are checked when the op runs.

use crate::device::Backend;
use crate::dtype::{DType, Float};
use crate::error::{fmt_dims, Error, Result};
use crate::layout::Layout;
use crate::ops::cmp::expand_layout;
use crate::shape::{Dim, Dyn, ExpandTo, Shape};
use crate::tape::is_grad_enabled;
use crate::tensor::{ok, Tensor};

/// The op's name, for errors.
const NAME: &str = "scaled_dot_product_attention";

/// Backend support for fused attention.
pub trait AttentionKernel<E: Float>: Backend {
    /// `softmax(q @ k^T * scale + mask) @ v` for `q` of `[b, h, t, dk]`, `k`
    /// of `[b, h, s, dk]`, `v` of `[b, h, s, dv]` (any strides) and an
    /// optional additive `mask` of `[b, h, t, s]` (stride 0 on broadcast
    /// dims); `causal` hides key `j` from query `i` when `j > i`. The result
    /// `[b, h, t, dv]` is written at the positions `out` gives (a layout over
    /// a fresh buffer of `out.numel()` elements that covers each once).
    ///
    /// `Ok(None)` (the default) means the backend has no fused kernel, and
    /// the caller runs the composed ops.
    #[allow(clippy::too_many_arguments)] // three operands, the mask and the options
    fn attention(
        &self,
        q: (&Self::Storage<E>, &Layout),
        k: (&Self::Storage<E>, &Layout),
        v: (&Self::Storage<E>, &Layout),
        mask: Option<(&Self::Storage<E>, &Layout)>,
        causal: bool,
        scale: f64,
        out: &Layout,
    ) -> Result<Option<Self::Storage<E>>> {
        let _ = (q, k, v, mask, causal, scale, out);
        Ok(None)
    }

    /// [`attention`](Self::attention) under autocast: `q`, `k` and `v`
    /// rounded to `low` (bf16 or f16) as they are read, the products summed
    /// in `E`, and the result rounded to `low`: the values of rounding the
    /// operands, calling `attention` and rounding its result, in one pass.
    /// The mask arrives rounded already.
    ///
    /// `Ok(None)` (the default) means the backend has no such kernel, and
    /// the caller rounds around the plain one.
    #[allow(clippy::too_many_arguments)] // as `attention`, and the low type
    fn attention_low(
        &self,
        q: (&Self::Storage<E>, &Layout),
        k: (&Self::Storage<E>, &Layout),
        v: (&Self::Storage<E>, &Layout),
        mask: Option<(&Self::Storage<E>, &Layout)>,
        causal: bool,
        scale: f64,
        out: &Layout,
        low: DType,
    ) -> Result<Option<Self::Storage<E>>> {
        let _ = (q, k, v, mask, causal, scale, out, low);
        Ok(None)
    }
}

/// The output layout of a fused call: `[b, h, t, dv]` stored as
/// `[b, t, h, dv]`, so that merging the heads back (`transpose(1, 2)` and a
/// reshape to `[b, t, h * dv]`) is a view, not a copy.
fn heads_inner([b, h, t, dv]: [usize; 4]) -> Layout {
    Layout::contiguous(&[b, t, h, dv]).swap(1, 2)
}

impl<B: Dim, H: Dim, T: Dim, K: Dim, E: Float, D: crate::device::Device<E>>
    Tensor<(B, H, T, K), E, D>
{
    /// Attention of these queries (`[batch, heads, T, K]`) over `key`
    /// (`[batch, heads, S, K]`) and `value` (`[batch, heads, S, V]`), like
    /// `F.scaled_dot_product_attention(q, k, v, attn_mask, is_causal=..., scale=...)`:
    /// `softmax(q @ k^T * scale + attn_mask) @ v`. `attn_mask` is added to
    /// the scores and broadcasts to `[batch, heads, T, S]` (`-inf` hides a
    /// key); `is_causal` hides key `j` from query `i` when `j > i`; `scale`
    /// defaults to `1 / sqrt(K)`. There is no `dropout_p`: apply dropout to
    /// the weights with the composed ops when training needs it.
    ///
    /// ```
    /// use forma::prelude::*;
    /// let mut rng = Rng::seed_from(0);
    /// let q = Tensor::<(C<1>, C<2>, C<3>, C<4>)>::randn((C, C, C, C), &mut rng);
    /// let k = Tensor::<(C<1>, C<2>, C<5>, C<4>)>::randn((C, C, C, C), &mut rng);
    /// let v = Tensor::<(C<1>, C<2>, C<5>, C<6>)>::randn((C, C, C, C), &mut rng);
    /// let y = q.scaled_dot_product_attention(&k, &v, None::<&Tensor<(C<3>, C<5>)>>, false, None);
    /// let z = q.mul_scalar(0.5).matmul(&k.transpose::<2, 3>()).softmax::<3>().matmul(&v);
    /// for (a, b) in y.to_vec().iter().zip(z.to_vec()) {
    ///     assert!((a - b).abs() < 1e-5);
    /// }
    /// ```
    ///
    /// # Panics
    /// If `Dyn` sizes disagree at run time; see
    /// [`Tensor::try_scaled_dot_product_attention`].
    #[track_caller]
    pub fn scaled_dot_product_attention<S: Dim, V: Dim, Sm: Shape>(
        &self,
        key: &Tensor<(B, H, S, K), E, D>,
        value: &Tensor<(B, H, S, V), E, D>,
        attn_mask: Option<&Tensor<Sm, E, D>>,
        is_causal: bool,
        scale: Option<f64>,
    ) -> Tensor<(B, H, T, V), E, D>
    where
        Sm: ExpandTo<(B, H, T, S)>,
    {
        ok(self.try_scaled_dot_product_attention(key, value, attn_mask, is_causal, scale))
    }

    fn try_scaled_dot_product_attention_unnoted<S: Dim, V: Dim, Sm: Shape>(
        &self,
        key: &Tensor<(B, H, S, K), E, D>,
        value: &Tensor<(B, H, S, V), E, D>,
        attn_mask: Option<&Tensor<Sm, E, D>>,
        is_causal: bool,
        scale: Option<f64>,
    ) -> Result<Tensor<(B, H, T, V), E, D>>
    where
        Sm: ExpandTo<(B, H, T, S)>,
    {
        self.same_device(NAME, key)?;
        self.same_device(NAME, value)?;
        if let Some(low) = crate::autocast::target::<E, D>(&self.device) {
            let _inner = crate::autocast::suspend();
            let m = attn_mask.map(|m| m.try_round_to(low)).transpose()?;
            if let Some(y) = self.fused(key, value, m.as_ref(), is_causal, scale, Some(low))? {
                return Ok(y);
            }
            let (q, k) = (self.try_round_to(low)?, key.try_round_to(low)?);
            let v = value.try_round_to(low)?;
            let y =
                q.try_scaled_dot_product_attention_unnoted(&k, &v, m.as_ref(), is_causal, scale)?;
            return y.try_round_to(low);
        }
        if let Some(y) = self.fused(key, value, attn_mask, is_causal, scale, None)? {
            return Ok(y);
        }
        let scores = [self.size(0), self.size(1), self.size(2), key.size(2)];
        let scale = scale.unwrap_or_else(|| 1.0 / (self.size(3) as f64).sqrt());
        let mask = match attn_mask {
            Some(m) => Some(m.try_expand_dims::<Dyn4>(&scores)?),
            None => None,
        };
        let (q, k, v) = (self.clone(), key.clone(), value.clone());
        let y = composed(q.retype(), k.retype(), v.retype(), mask, is_causal, scale)?;
        Ok(y.retype())
    }

    /// The fused kernel's result, when the backend has one and nothing
    /// records a gradient (`None` otherwise), after the shape checks; under
    /// autocast (`low`) the backend rounds as it reads and writes.
    fn fused<S: Dim, V: Dim, Sm: Shape>(
        &self,
        key: &Tensor<(B, H, S, K), E, D>,
        value: &Tensor<(B, H, S, V), E, D>,
        attn_mask: Option<&Tensor<Sm, E, D>>,
        is_causal: bool,
        scale: Option<f64>,
        low: Option<DType>,
    ) -> Result<Option<Tensor<(B, H, T, V), E, D>>>
    where
        Sm: ExpandTo<(B, H, T, S)>,
    {
        let (q, k, v) = (self.layout.dims, key.layout.dims, value.layout.dims);
        if k[..2] != q[..2] || k[3] != q[3] {
            return Err(Error::shape(
                NAME,
                format!(
                    "a key of [{}, {}, S, {}] (the query's batch, heads and size)",
                    q[0], q[1], q[3]
                ),
                &k,
            ));
        }
        if v[..3] != k[..3] {
            return Err(Error::shape(
                NAME,
                format!(
                    "a value of [{}, {}, {}, V] (the key's batch, heads and length)",
                    k[0], k[1], k[2]
                ),
                &v,
            ));
        }
        let scores = [q[0], q[1], q[2], k[2]];
        let lm = match attn_mask {
            Some(m) => {
                self.same_device(NAME, m)?;
                let l = expand_layout(NAME, &m.layout, &scores).map_err(|_| {
                    Error::shape(
                        NAME,
                        format!("an attn_mask that broadcasts to {}", fmt_dims(&scores)),
                        &m.layout.dims,
                    )
                })?;
                Some(l)
            }
            None => None,
        };
        let scale = scale.unwrap_or_else(|| 1.0 / (q[3] as f64).sqrt());
        let out = [q[0], q[1], q[2], v[3]];
        let taped = is_grad_enabled()
            && (self.needs_grad()
                || key.needs_grad()
                || value.needs_grad()
                || attn_mask.is_some_and(|m| m.needs_grad()));
        if taped || out.contains(&0) || scores[3] == 0 {
            return Ok(None);
        }
        let lo = heads_inner(out);
        let ms = attn_mask.map(|m| m.storage());
        let (qs, ks, vs) = (self.storage(), key.storage(), value.storage());
        let (q, k, v) = (
            (&*qs, &self.layout),
            (&*ks, &key.layout),
            (&*vs, &value.layout),
        );
        let mask = ms.as_deref().zip(lm.as_ref());
        let fused = match low {
            None => self
                .device
                .attention(q, k, v, mask, is_causal, scale, &lo)?,
            Some(low) => self
                .device
                .attention_low(q, k, v, mask, is_causal, scale, &lo, low)?,
        };
        Ok(fused.map(|s| {
            let flat = Tensor::<(B, H, T, V), E, D>::from_storage(s, &out, self.device.clone());
            flat.view_as(lo)
        }))
    }

    /// Fallible [`Tensor::scaled_dot_product_attention`].
    ///
    /// # Errors
    /// A [`crate::ShapeError`] when the batch, head or key sizes of the
    /// operands disagree, or the mask does not broadcast to the scores.
    pub fn try_scaled_dot_product_attention<S: Dim, V: Dim, Sm: Shape>(
        &self,
        key: &Tensor<(B, H, S, K), E, D>,
        value: &Tensor<(B, H, S, V), E, D>,
        attn_mask: Option<&Tensor<Sm, E, D>>,
        is_causal: bool,
        scale: Option<f64>,
    ) -> Result<Tensor<(B, H, T, V), E, D>>
    where
        Sm: ExpandTo<(B, H, T, S)>,
    {
        let y =
            self.try_scaled_dot_product_attention_unnoted(key, value, attn_mask, is_causal, scale)?;
        Ok(y.noted(|| {
            let mut ins = vec![self.val(), key.val(), value.val()];
            ins.extend(attn_mask.map(|m| m.val()));
            let op = crate::graph::Op::Attention {
                scale: scale.unwrap_or(1.0 / (self.layout.dims[3] as f64).sqrt()),
                causal: is_causal,
                mask: attn_mask.is_some(),
            };
            (op, ins)
        }))
    }
}

/// The erased shape the composed form runs on.
type Dyn4 = (Dyn, Dyn, Dyn, Dyn);

/// The attention as composed ops, in PyTorch's order: the queries are scaled
/// before the product.
fn composed<E: Float, D: crate::device::Device<E>>(
    q: Tensor<Dyn4, E, D>,
    k: Tensor<Dyn4, E, D>,
    v: Tensor<Dyn4, E, D>,
    mask: Option<Tensor<Dyn4, E, D>>,
    is_causal: bool,
    scale: f64,
) -> Result<Tensor<Dyn4, E, D>> {
    let mut scores = q.mul_scalar(scale).try_matmul(&k.transpose::<2, 3>())?;
    if let Some(m) = mask {
        scores = &scores + &m;
    }
    if is_causal {
        let hide = causal_mask(scores.size(2), scores.size(3), &q.device)?;
        scores = scores.try_masked_fill(&hide, f64::NEG_INFINITY)?;
    }
    scores.softmax::<3>().try_matmul(&v)
}

/// The causal mask of `t` queries over `s` keys, `true` where key `j` is
/// hidden from query `i` (`j > i`), like
/// `torch.ones(t, s, dtype=torch.bool).triu(1)`.
///
/// # Errors
/// When the device cannot hold it.
pub fn causal_mask<D: Backend>(
    t: usize,
    s: usize,
    device: &D,
) -> Result<Tensor<(Dyn, Dyn), bool, D>> {
    let hide: Vec<bool> = (0..t).flat_map(|i| (0..s).map(move |j| j > i)).collect();
    Tensor::from_vec_on(hide, (Dyn(t), Dyn(s)), device)
}
