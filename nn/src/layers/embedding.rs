//! `Embedding`, like `nn.Embedding(num_embeddings, embedding_dim, padding_idx)`.

use crate::module::py_float;
use crate::Forward;
use forma_core::device::Device;
use forma_core::shape::{op, AppendDimOf};
use forma_core::{Dtype, Float, Result, Rng, Tensor, C};
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
/// With a `max_norm` ([`Embedding::max_norm`]), each lookup first rescales
/// in place every row it reads whose `norm_type`-norm exceeds `max_norm` to
/// that norm (`row * max_norm / (norm + 1e-7)`), outside the autograd
/// graph, as PyTorch's `embedding_renorm_` does: the table itself changes.
///
/// Only PyTorch's defaults for `scale_grad_by_freq` and `sparse` (false)
/// are supported.
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
    /// The largest norm a row may have when it is read (`max_norm`); `None`
    /// leaves the rows as they are.
    pub max_norm: Option<f64>,
    /// The `p` of the norm `max_norm` bounds (`norm_type`, 2).
    pub norm_type: f64,
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
            max_norm: None,
            norm_type: 2.0,
        }
    }

    /// The same table with rows rescaled to at most `max_norm` (in the
    /// `norm_type`-norm) when they are read, like `nn.Embedding(..,
    /// max_norm=max_norm, norm_type=norm_type)`.
    ///
    /// ```
    /// use forma::prelude::*;
    /// use forma::nn::{layers::Embedding, Forward, Module};
    /// let emb = Embedding::<4, 2>::new(&Cpu, &mut Rng::seed_from(0)).max_norm(1.0, 2.0);
    /// emb.weight.assign(&Tensor::from_vec(vec![3., 4., 0.3, 0.4, 0., 0., 6., 8.], (C, C)).unwrap());
    /// let idx = Tensor::<(C<2>,), i64>::from_vec(vec![0, 1], (C,)).unwrap();
    /// let y: Tensor<(C<2>, C<2>)> = emb.forward(idx);
    /// // Row 0 (norm 5) is rescaled to norm 1 in the table; row 1 (norm 0.5)
    /// // and row 3 (not read) are left alone.
    /// assert!((y.to_vec()[0] - 0.6).abs() < 1e-6);
    /// assert_eq!(emb.weight.to_vec()[2..], [0.3, 0.4, 0., 0., 6., 8.]);
    /// assert_eq!(emb.repr(), "Embedding(4, 2, max_norm=1.0)");
    /// ```
    pub fn max_norm(self, max_norm: f64, norm_type: f64) -> Self {
        Embedding {
            max_norm: Some(max_norm),
            norm_type,
            ..self
        }
    }

    fn extra_repr(&self) -> String {
        let mut s = format!("{V}, {DIM}");
        if let Some(p) = self.padding_idx {
            s += &format!(", padding_idx={p}");
        }
        if let Some(m) = self.max_norm {
            s += &format!(", max_norm={}", py_float(m));
        }
        if self.norm_type != 2.0 {
            s += &format!(", norm_type={}", py_float(self.norm_type));
        }
        s
    }

    /// Rescales the rows `idx` reads whose norm exceeds `max_norm`, in
    /// place (PyTorch's `embedding_renorm_`); indices outside the table are
    /// left to the lookup to refuse.
    fn renorm(&self, max_norm: f64, idx: &[i64]) -> Result<()> {
        let mut rows: Vec<usize> = idx
            .iter()
            .filter_map(|&i| usize::try_from(i).ok().filter(|&i| i < V))
            .collect();
        rows.sort_unstable();
        rows.dedup();
        let mut table = self.weight.to_vec();
        let mut changed = false;
        for r in rows {
            let row = &mut table[r * DIM..(r + 1) * DIM];
            let p = self.norm_type;
            let norm = if p.is_infinite() {
                row.iter()
                    .map(|&v| Dtype::to_f64(v).abs())
                    .fold(0.0, f64::max)
            } else {
                row.iter()
                    .map(|&v| Dtype::to_f64(v).abs().powf(p))
                    .sum::<f64>()
                    .powf(1.0 / p)
            };
            if norm > max_norm {
                let scale = max_norm / (norm + 1e-7);
                for v in row.iter_mut() {
                    *v = E::from_f64(Dtype::to_f64(*v) * scale);
                }
                changed = true;
            }
        }
        if changed {
            let renormed: Tensor<(C<V>, C<DIM>), E, D> =
                Tensor::from_vec_on(table, (C, C), self.weight.device())?;
            self.weight.try_assign(&renormed)?;
        }
        Ok(())
    }

    /// The rows of `idx`, with `DIM` appended to its shape: `forward` on a
    /// borrowed index tensor.
    ///
    /// # Errors
    /// [`forma_core::Error::IndexOutOfRange`] for an index outside `0..V`.
    pub fn try_lookup<Si: AppendDimOf<op::embedding_indices>>(
        &self,
        idx: &Tensor<Si, i64, D>,
    ) -> Result<Tensor<<Si as AppendDimOf<op::embedding_indices>>::Appended<C<DIM>>, E, D>> {
        if let Some(max_norm) = self.max_norm {
            forma_core::graph::refuse(
                "Embedding(max_norm)",
                "the in-place renormalisation of the table has no graph form",
            );
            self.renorm(max_norm, &idx.to_vec())?;
        }
        self.weight.try_embedding_padded(idx, self.padding_idx)
    }
}

impl<
        Si: AppendDimOf<op::embedding_indices>,
        const V: usize,
        const DIM: usize,
        E: Float,
        D: Device<E>,
    >
    Forward<
        Tensor<Si, i64, D>,
        Tensor<<Si as AppendDimOf<op::embedding_indices>>::Appended<C<DIM>>, E, D>,
    > for Embedding<V, DIM, E, D>
{
    /// # Errors
    /// [`forma_core::Error::IndexOutOfRange`] for an index outside `0..V`.
    fn try_forward(
        &self,
        idx: Tensor<Si, i64, D>,
    ) -> Result<Tensor<<Si as AppendDimOf<op::embedding_indices>>::Appended<C<DIM>>, E, D>> {
        self.try_lookup(&idx)
    }
}
