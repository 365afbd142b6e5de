//! `MultiheadAttention`, like `nn.MultiheadAttention(EMBED, HEADS, batch_first=True)`.

use super::check::assert_heads;
use super::{fan_in_uniform, filled, restore, Linear};
use crate::Forward;
use forma_core::device::Device;
use forma_core::{Dim, Dyn, Float, Rng, Tensor, C};
use forma_cpu::Cpu;
use forma_macros::Module;

/// Multi-head scaled dot-product attention over `[batch, seq, EMBED]`
/// tensors, with PyTorch's parameter layout: the query, key and value
/// projections stacked in `in_proj_weight` (`[3 * EMBED, EMBED]`) and
/// `in_proj_bias`, then `out_proj`. `EMBED` must split evenly into `HEADS`
/// heads, checked when the program is built.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::{layers::MultiheadAttention, Forward};
/// let mut rng = Rng::seed_from(0);
/// let mha = MultiheadAttention::<8, 2>::new(&Cpu, &mut rng);
/// let x = Tensor::<(Dyn, Dyn, C<8>)>::randn((Dyn(2), Dyn(5), C), &mut rng);
/// let y = mha.forward(x);
/// assert_eq!(y.dims()[..], [2, 5, 8]);
/// ```
#[derive(Module, Clone, Debug)]
#[module(crate = "crate")]
pub struct MultiheadAttention<
    const EMBED: usize,
    const HEADS: usize,
    E: Float = f32,
    D: Device<E> = Cpu,
> {
    /// The stacked query, key and value projections, `[3 * EMBED, EMBED]`.
    pub in_proj_weight: Tensor<(Dyn, C<EMBED>), E, D>,
    /// Their biases, `[3 * EMBED]`.
    pub in_proj_bias: Tensor<(Dyn,), E, D>,
    /// The output projection.
    pub out_proj: Linear<EMBED, EMBED, E, D>,
}

impl<const EMBED: usize, const HEADS: usize, E: Float, D: Device<E>>
    MultiheadAttention<EMBED, HEADS, E, D>
{
    /// A layer initialised like PyTorch's (Xavier-uniform input projection,
    /// zero biases).
    pub fn new(device: &D, rng: &mut Rng) -> Self {
        const { assert_heads(EMBED, HEADS) };
        // xavier_uniform_ on [3E, E]: bound sqrt(6 / (fan_in + fan_out)).
        let bound = (6.0 / (4 * EMBED) as f64).sqrt();
        let in_proj_weight =
            Tensor::uniform_on((Dyn(3 * EMBED), C), -bound, bound, rng, device).requires_grad();
        let in_proj_bias = filled((Dyn(3 * EMBED),), 0.0, device).requires_grad();
        let mut out_proj = Linear::new(device, rng);
        out_proj.weight = fan_in_uniform((C, C), EMBED, device, rng);
        out_proj.bias = Some(filled((C,), 0.0, device).requires_grad());
        MultiheadAttention {
            in_proj_weight,
            in_proj_bias,
            out_proj,
        }
    }

    /// One of the query/key/value projections, split into heads:
    /// `[batch, len, EMBED]` to `[batch, HEADS, len, EMBED / HEADS]`.
    fn project(
        &self,
        x: &Tensor<(Dyn, Dyn, C<EMBED>), E, D>,
        part: usize,
    ) -> Tensor<(Dyn, Dyn, Dyn, Dyn), E, D> {
        let w = self.in_proj_weight.narrow_static::<0, EMBED>(part * EMBED);
        let b = self.in_proj_bias.narrow_static::<0, EMBED>(part * EMBED);
        let y = &x.matmul(&w.t()) + &b;
        let split = y
            .try_reshape_to((
                Dyn(y.size(0)),
                Dyn(y.size(1)),
                Dyn(HEADS),
                Dyn(EMBED / HEADS),
            ))
            .expect("EMBED splits into HEADS (checked at build time)");
        split.transpose::<1, 2>()
    }

    /// Attention of `query` over `key`/`value`, like
    /// `mha(q, k, v, key_padding_mask=..., is_causal=..., need_weights=False)`:
    /// `key_padding_mask` is `[batch, src]` with `true` for positions to ignore;
    /// `causal` hides later positions.
    pub fn attend<B: Dim, T: Dim, S: Dim>(
        &self,
        query: &Tensor<(B, T, C<EMBED>), E, D>,
        key: &Tensor<(B, S, C<EMBED>), E, D>,
        value: &Tensor<(B, S, C<EMBED>), E, D>,
        key_padding_mask: Option<&Tensor<(B, S), bool, D>>,
        causal: bool,
    ) -> Tensor<(B, T, C<EMBED>), E, D> {
        const { assert_heads(EMBED, HEADS) };
        let q = self.project(&restore(query.clone()), 0);
        let k = self.project(&restore(key.clone()), 1);
        let v = self.project(&restore(value.clone()), 2);
        let scale = 1.0 / ((EMBED / HEADS) as f64).sqrt();
        let mut scores = q.mul_scalar(scale).matmul(&k.transpose::<2, 3>());
        if let Some(m) = key_padding_mask {
            let m: Tensor<(Dyn, Dyn), bool, D> = m.into_dyn();
            scores = scores.masked_fill(&m.unsqueeze::<1>().unsqueeze::<1>(), f64::NEG_INFINITY);
        }
        if causal {
            let (t, s) = (query.size(1), key.size(1));
            let hide: Vec<bool> = (0..t).flat_map(|i| (0..s).map(move |j| j > i)).collect();
            let hide =
                Tensor::<(Dyn, Dyn), bool, D>::from_vec_on(hide, (Dyn(t), Dyn(s)), query.device())
                    .expect("the mask has t * s entries");
            scores = scores.masked_fill(&hide, f64::NEG_INFINITY);
        }
        let ctx = scores
            .softmax::<3>()
            .matmul(&v)
            .transpose::<1, 2>()
            .contiguous();
        let merged = ctx
            .try_reshape_to((Dyn(query.size(0)), Dyn(query.size(1)), C::<EMBED>))
            .expect("heads merge back into EMBED");
        restore(self.out_proj.forward(merged))
    }
}

impl<B: Dim, T: Dim, const EMBED: usize, const HEADS: usize, E: Float, D: Device<E>>
    Forward<Tensor<(B, T, C<EMBED>), E, D>, Tensor<(B, T, C<EMBED>), E, D>>
    for MultiheadAttention<EMBED, HEADS, E, D>
{
    /// Self-attention without masks.
    fn forward(&self, x: Tensor<(B, T, C<EMBED>), E, D>) -> Tensor<(B, T, C<EMBED>), E, D> {
        self.attend(&x, &x, &x, None, false)
    }
}
