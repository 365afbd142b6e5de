//! What the models share: Hugging Face's initialisation (or a "meta" init
//! that allocates nothing, for listing a full-size layout), the layer
//! builders on top of it, attention on erased sizes, and the bookkeeping of
//! checkpoints (counting layers, renaming and dropping known extra keys,
//! strict loads that name the file).

use crate::{HfLoadReport, ModelError};
use forma::core::device::Device;
use forma::core::shape::ExpandTo;
use forma::nn::layers::{Dropout, Embedding, LayerNorm, Linear};
use forma::nn::{Module, StateDict};
use forma::prelude::*;
use std::path::Path;

/// How a model's parameters are made.
pub(crate) enum Init<'a> {
    /// Hugging Face's `_init_weights`: weights from `N(0, std^2)`, biases
    /// zero, LayerNorm scales one.
    Normal { std: f64, rng: &'a mut Rng },
    /// Every tensor a zero-strided view of one zero: the model has its full
    /// keys and shapes but holds one element per tensor. Only for listing a
    /// layout; such a model must not be run or loaded into.
    Meta,
}

impl Init<'_> {
    /// A seed for a layer's own generator (dropout masks).
    pub(crate) fn seed(&mut self) -> Rng {
        match self {
            Init::Normal { rng, .. } => Rng::seed_from(rng.next_u64()),
            Init::Meta => Rng::seed_from(0),
        }
    }

    fn fill<S: Shape, E: Float, D: Device<E>>(
        &mut self,
        shape: S,
        value: Option<f64>,
        device: &D,
    ) -> Tensor<S, E, D>
    where
        (): ExpandTo<S>,
    {
        match self {
            Init::Meta => Tensor::<(), E, D>::zeros_on((), device).expand(shape),
            Init::Normal { std, rng } => match value {
                Some(v) => Tensor::full_on(shape, E::from_f64(v), device).requires_grad(),
                None => Tensor::normal_on(shape, 0.0, *std, rng, device).requires_grad(),
            },
        }
    }

    /// A parameter that `draw` makes from the generator (for scales other
    /// than `Init::Normal`'s own `std`), or for `Init::Meta` a view of one
    /// zero.
    pub(crate) fn draw<S: Shape, E: Float, D: Device<E>>(
        &mut self,
        shape: S,
        device: &D,
        draw: impl FnOnce(S, &mut Rng) -> Tensor<S, E, D>,
    ) -> Tensor<S, E, D>
    where
        (): ExpandTo<S>,
    {
        match self {
            Init::Normal { rng, .. } => draw(shape, rng).requires_grad(),
            Init::Meta => self.weight(shape, device),
        }
    }

    /// A weight drawn from `N(0, std^2)`.
    pub(crate) fn weight<S: Shape, E: Float, D: Device<E>>(
        &mut self,
        shape: S,
        device: &D,
    ) -> Tensor<S, E, D>
    where
        (): ExpandTo<S>,
    {
        self.fill(shape, None, device)
    }

    /// A tensor of `value` (biases, norm scales).
    pub(crate) fn constant<S: Shape, E: Float, D: Device<E>>(
        &mut self,
        shape: S,
        value: f64,
        device: &D,
    ) -> Tensor<S, E, D>
    where
        (): ExpandTo<S>,
    {
        self.fill(shape, Some(value), device)
    }

    pub(crate) fn linear<const I: usize, const O: usize, E: Float, D: Device<E>>(
        &mut self,
        device: &D,
    ) -> Linear<I, O, E, D> {
        Linear {
            weight: self.weight((C, C), device),
            bias: Some(self.constant((C,), 0.0, device)),
        }
    }

    pub(crate) fn embedding<const V: usize, const H: usize, E: Float, D: Device<E>>(
        &mut self,
        device: &D,
    ) -> Embedding<V, H, E, D> {
        Embedding {
            weight: self.weight((C, C), device),
            padding_idx: None,
            max_norm: None,
            norm_type: 2.0,
        }
    }

    pub(crate) fn layer_norm<const N: usize, E: Float, D: Device<E>>(
        &mut self,
        eps: f64,
        device: &D,
    ) -> LayerNorm<N, E, D> {
        LayerNorm {
            weight: Some(self.constant((C,), 1.0, device)),
            bias: Some(self.constant((C,), 0.0, device)),
            eps,
        }
    }

    pub(crate) fn dropout(&mut self, p: f64) -> Dropout {
        Dropout::new(p, &mut self.seed())
    }
}

/// Keys and shapes of a module's state_dict, in order, read without copying
/// any values.
pub(crate) fn layout_of<M: Module>(m: &M) -> Vec<(String, Vec<usize>)> {
    struct Keys(Vec<(String, Vec<usize>)>);
    impl forma::nn::Visitor for Keys {
        fn tensor<S: Shape, E: Dtype, D: forma::core::Backend>(
            &mut self,
            cx: &forma::nn::Cx,
            t: &forma::core::Tensor<S, E, D>,
        ) {
            if cx.role() != forma::nn::Role::NonPersistentBuffer {
                self.0.push((cx.path().to_string(), t.dims().to_vec()));
            }
        }
    }
    let mut keys = Keys(Vec::new());
    m.visit(&mut forma::nn::Cx::new(), &mut keys);
    keys.0
}

/// Number of layers in a checkpoint, from keys `<prefix><n>.`.
pub(crate) fn count_layers(sd: &StateDict, prefix: &str) -> usize {
    sd.keys()
        .filter_map(|k| {
            k.strip_prefix(prefix)?
                .split('.')
                .next()?
                .parse::<usize>()
                .ok()
        })
        .map(|n| n + 1)
        .max()
        .unwrap_or(0)
}

/// Gives a result computed on erased sizes back its caller's shape type; the
/// sizes are unchanged, so this cannot fail.
pub(crate) fn restore<S: Shape, S2: Shape, E: Dtype, D: forma::core::Backend>(
    y: Tensor<S2, E, D>,
) -> Tensor<S, E, D> {
    match y.try_into_shape::<S>() {
        Ok(y) => y,
        Err(e) => unreachable!("a model changed the sizes of an intermediate result: {e}"),
    }
}

/// A `[batch, len, hidden]` tensor split into `heads`:
/// `[batch, heads, len, hidden / heads]`.
pub(crate) fn split_heads<E: Float, D: Device<E>>(
    x: &Tensor<(Dyn, Dyn, Dyn), E, D>,
    heads: usize,
) -> forma::Result<Tensor<(Dyn, Dyn, Dyn, Dyn), E, D>> {
    let (b, t, h) = (x.size(0), x.size(1), x.size(2));
    Ok(
        x.try_reshape_to((Dyn(b), Dyn(t), Dyn(heads), Dyn(h / heads)))?
            .transpose::<1, 2>(),
    )
}

/// `[batch, heads, len, head_dim]` back to `[batch, len, hidden]`.
pub(crate) fn merge_heads<E: Float, D: Device<E>>(
    x: &Tensor<(Dyn, Dyn, Dyn, Dyn), E, D>,
) -> forma::Result<Tensor<(Dyn, Dyn, Dyn), E, D>> {
    let (b, heads, t, hd) = (x.size(0), x.size(1), x.size(2), x.size(3));
    x.transpose::<1, 2>()
        .contiguous()
        .try_reshape_to((Dyn(b), Dyn(t), Dyn(heads * hd)))
}

/// Erased `[batch, heads, len, head_dim]` tensors (and attention scores).
pub(crate) type Dyn4<E, D> = Tensor<(Dyn, Dyn, Dyn, Dyn), E, D>;

/// Attention of the queries `q` over the keys `k` and values `v` (all
/// `[batch, heads, len, head_dim]`): `softmax(q @ k^T / sqrt(head_dim) +
/// mask) @ v` with `dropout` on the probabilities, like `transformers`' eager
/// attention; `mask` is additive (0 keeps a key, [`HIDDEN`] hides it) and
/// broadcasts to the scores `[batch, heads, queries, keys]`.
///
/// Returns the heads' context and, when `output_attentions`, the
/// probabilities (after dropout, as `transformers` returns them). Without
/// them and without active dropout it runs as one
/// [`Tensor::scaled_dot_product_attention`] (fused where the backend has a
/// kernel and nothing needs a gradient), which gives the same context within
/// float error but never materialises the probabilities.
pub(crate) fn attend<E: Float, D: Device<E>>(
    q: &Dyn4<E, D>,
    k: &Dyn4<E, D>,
    v: &Dyn4<E, D>,
    mask: Option<&Dyn4<E, D>>,
    dropout: &Dropout,
    output_attentions: bool,
) -> forma::Result<(Dyn4<E, D>, Option<Dyn4<E, D>>)> {
    let scale = 1.0 / (q.size(3) as f64).sqrt();
    let scores = (
        Dyn(q.size(0)),
        Dyn(q.size(1)),
        Dyn(q.size(2)),
        Dyn(k.size(2)),
    );
    let mask = match mask {
        Some(m) => Some(m.try_expand(scores)?),
        None => None,
    };
    let dropping = dropout.training.is_on() && dropout.p > 0.0;
    if !output_attentions && !dropping {
        let ctx = q.try_scaled_dot_product_attention(k, v, mask.as_ref(), false, Some(scale))?;
        return Ok((ctx, None));
    }
    let mut scores = q.try_matmul(&k.transpose::<2, 3>())?.mul_scalar(scale);
    if let Some(m) = &mask {
        scores = &scores + m;
    }
    let probs = dropout.forward(scores.softmax::<3>());
    let ctx = probs.try_matmul(v)?;
    Ok((ctx, output_attentions.then_some(probs)))
}

/// The score PyTorch models give a hidden position: the most negative f32,
/// so that a row with every position hidden stays finite (as Hugging Face's
/// `torch.finfo(dtype).min` masks do) rather than turning into NaN.
pub(crate) const HIDDEN: f64 = f32::MIN as f64;

/// The ids of a `[batch, len]` int64 tensor, on the host.
pub(crate) fn host_ids<D: forma::core::Backend>(t: &Tensor<(Dyn, Dyn), i64, D>) -> Vec<i64> {
    t.to_vec()
}

/// The renames and drops a checkpoint's keys get before a strict load, each
/// recorded in the [`HfLoadReport`] that [`HfKeys::finish`] returns.
pub(crate) struct HfKeys {
    sd: StateDict,
    report: HfLoadReport,
}

impl HfKeys {
    pub(crate) fn new(sd: StateDict) -> Self {
        HfKeys {
            sd,
            report: HfLoadReport::default(),
        }
    }

    /// Renames each key that `to` gives a new name (the others keep
    /// theirs), recording `prefix` as the one changed.
    pub(crate) fn rename(mut self, prefix: &str, to: impl Fn(&str) -> Option<String>) -> Self {
        self.report.prefix = Some(prefix.into());
        self.rename_keys(to)
    }

    /// Renames each key that `to` gives a new name (the others keep
    /// theirs), with no prefix changed.
    pub(crate) fn rename_keys(mut self, to: impl Fn(&str) -> Option<String>) -> Self {
        let renamed = &mut self.report.renamed;
        self.sd = self.sd.remap(|k| {
            Some(match to(k) {
                Some(new) => {
                    renamed.push((k.to_string(), new.clone()));
                    new
                }
                None => k.to_string(),
            })
        });
        self
    }

    /// Whether some key starts with `prefix`.
    pub(crate) fn has_prefix(&self, prefix: &str) -> bool {
        self.sd.keys().any(|k| k.starts_with(prefix))
    }

    /// Adds `prefix` to the keys of a bare decoder file (one where no key
    /// has it), all but the head's (`lm_head.*`).
    pub(crate) fn add_prefix(self, prefix: &str) -> Self {
        if self.has_prefix(prefix) {
            return self;
        }
        self.rename(prefix, |k| {
            (!k.starts_with("lm_head.")).then(|| format!("{prefix}{k}"))
        })
    }

    /// Drops an `lm_head.weight` equal to the token embedding `embedding`
    /// (a head tied to it); one that differs is refused.
    pub(crate) fn drop_tied_head(mut self, embedding: &str) -> Result<Self, ModelError> {
        if let Some(head) = self.sd.get("lm_head.weight") {
            match self.sd.get(embedding) {
                Some(emb)
                    if emb.dims() == head.dims()
                        && emb.dtype() == head.dtype()
                        && emb.bytes() == head.bytes() =>
                {
                    self.sd.remove("lm_head.weight");
                    self.report.dropped.push("lm_head.weight".into());
                }
                _ => return Err(ModelError::UntiedHead),
            }
        }
        Ok(self)
    }

    /// Drops the keys `unused` names.
    pub(crate) fn drop(mut self, unused: impl Fn(&str) -> bool) -> Self {
        let dropped = &mut self.report.dropped;
        self.sd = self.sd.remap(|k| {
            if unused(k) {
                dropped.push(k.to_string());
                None
            } else {
                Some(k.to_string())
            }
        });
        self
    }

    /// The adjusted keys, and the report with its lists sorted.
    pub(crate) fn finish(mut self) -> (StateDict, HfLoadReport) {
        self.report.dropped.sort_unstable();
        self.report.renamed.sort_unstable();
        (self.sd, self.report)
    }
}

/// `model.load_state_dict(sd)`, strict; the error names `path`, or
/// `<state_dict>` for an in-memory load.
pub(crate) fn load_strict<M: Module>(
    model: &mut M,
    sd: &StateDict,
    path: Option<&Path>,
) -> Result<(), ModelError> {
    match model.load_state_dict(sd) {
        Ok(_) => Ok(()),
        Err(source) => Err(ModelError::Load {
            path: path.map_or("<state_dict>".into(), |p| p.display().to_string()),
            source: Box::new(source),
        }),
    }
}
