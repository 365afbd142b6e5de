//! `Embedding`, like `nn.Embedding(num_embeddings, embedding_dim, padding_idx)`.

use crate::Forward;
use forma_core::device::Device;
use forma_core::shape::AppendDim;
use forma_core::{Float, Result, Rng, Tensor, C};
use forma_cpu::Cpu;
use forma_macros::Module;

/// A lookup table of `V` vectors of size `DIM`, like
/// `nn.Embedding(V, DIM, padding_idx=..)`: `weight` is `[V, DIM]`, drawn from
/// `N(0, 1)` as in PyTorch. Indices (`i64`, any shape) become their rows, with
/// `DIM` appended to the index's shape.
///
/// With a `padding_idx`, that row starts at zeros and receives no gradient:
/// the positions holding it pass no gradient to the table, so training leaves
/// it as it is.
///
/// Only PyTorch's defaults for `max_norm` (none), `scale_grad_by_freq` and
/// `sparse` (false) are supported.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::{layers::Embedding, Forward, Module};
/// let emb = Embedding::<10, 3>::with_padding_idx(Some(0), &Cpu, &mut Rng::seed_from(0));
/// let idx = Tensor::<(Dyn, C<2>), i64>::from_vec(vec![0, 4, 7, 0], (Dyn(2), C)).unwrap();
/// let y: Tensor<(Dyn, C<2>, C<3>)> = emb.forward(idx);
/// assert_eq!(y.to_vec()[..3], [0.0, 0.0, 0.0]); // the padding row
/// assert_eq!(emb.repr(), "Embedding(10, 3, padding_idx=0)");
/// ```
#[derive(Module, Clone, Debug)]
#[module(crate = "crate", extra_repr = "Self::extra_repr")]
pub struct Embedding<const V: usize, const DIM: usize, E: Float = f32, D: Device<E> = Cpu> {
    /// `[num_embeddings, embedding_dim]`.
    pub weight: Tensor<(C<V>, C<DIM>), E, D>,
    /// The row that stands for padding: no gradient reaches it.
    pub padding_idx: Option<usize>,
}

impl<const V: usize, const DIM: usize, E: Float, D: Device<E>> Embedding<V, DIM, E, D> {
    /// A table drawn from `N(0, 1)`, without a padding row.
    pub fn new(device: &D, rng: &mut Rng) -> Self {
        Self::with_padding_idx(None, device, rng)
    }

    /// A table drawn from `N(0, 1)` whose row `padding_idx` (if any) is zeros.
    ///
    /// # Panics
    /// If `padding_idx` is not below `V`.
    pub fn with_padding_idx(padding_idx: Option<usize>, device: &D, rng: &mut Rng) -> Self {
        if let Some(p) = padding_idx {
            assert!(
                p < V,
                "Embedding: padding_idx={p} must be below num_embeddings={V}"
            );
        }
        let mut values: Vec<E> = (0..V * DIM).map(|_| E::from_f64(rng.normal())).collect();
        if let Some(p) = padding_idx {
            values[p * DIM..(p + 1) * DIM].fill(E::from_f64(0.0));
        }
        let weight = match Tensor::from_vec_on(values, (C, C), device) {
            Ok(w) => w.requires_grad(),
            Err(e) => unreachable!("the values fill the table: {e}"),
        };
        Embedding {
            weight,
            padding_idx,
        }
    }

    fn extra_repr(&self) -> String {
        match self.padding_idx {
            Some(p) => format!("{V}, {DIM}, padding_idx={p}"),
            None => format!("{V}, {DIM}"),
        }
    }

    /// The rows of `idx`, with `DIM` appended to its shape: `forward` on a
    /// borrowed index tensor.
    ///
    /// # Errors
    /// [`forma_core::Error::IndexOutOfRange`] for an index outside `0..V`.
    pub fn try_lookup<Si: AppendDim>(
        &self,
        idx: &Tensor<Si, i64, D>,
    ) -> Result<Tensor<<Si as AppendDim>::Appended<C<DIM>>, E, D>> {
        self.weight.try_embedding_padded(idx, self.padding_idx)
    }
}

impl<Si: AppendDim, const V: usize, const DIM: usize, E: Float, D: Device<E>>
    Forward<Tensor<Si, i64, D>, Tensor<<Si as AppendDim>::Appended<C<DIM>>, E, D>>
    for Embedding<V, DIM, E, D>
{
    /// # Errors
    /// [`forma_core::Error::IndexOutOfRange`] for an index outside `0..V`.
    fn try_forward(
        &self,
        idx: Tensor<Si, i64, D>,
    ) -> Result<Tensor<<Si as AppendDim>::Appended<C<DIM>>, E, D>> {
        self.try_lookup(&idx)
    }
}
