//! A Vision Transformer with the layout of Hugging Face's
//! `ViTForImageClassification`: its `state_dict` keys and shapes are those
//! of the `model.safetensors` files on the hub
//! (`vit.embeddings.cls_token`, `vit.embeddings.position_embeddings`,
//! `vit.embeddings.patch_embeddings.projection.weight`,
//! `vit.encoder.layer.0.attention.attention.query.weight`, ...,
//! `vit.layernorm.weight`, `classifier.weight`), so a Hugging Face checkpoint
//! loads with one call ([`ViTForImageClassification::from_safetensors`]) and
//! [`Module::save_safetensors`] writes a file that
//! `ViTForImageClassification.from_pretrained` reads.
//!
//! transformers 5 renamed ViT's modules in memory (`vit.layers.0.attention.q_proj`,
//! `mlp.fc1`, ...) but still writes and reads the names above, which are
//! the files'; the keys here follow the order of its modules (each layer's
//! attention, its two norms, then its MLP). A state dict in those in-memory
//! names loads too, renamed
//! ([`ViTForImageClassification::load_hf_state_dict`]).
//!
//! **Sizes.** Const generics fix what shapes the weights and the inputs:
//! image size `IMG` (square images), patch size `PATCH`, channels `CH`,
//! hidden size `H`, attention heads `HEADS`, the MLP's inner size `MLP` and
//! the classes `N`; so images are `[batch, CH, IMG, IMG]` and logits
//! `[batch, N]`, checked when the program is built. The position table holds
//! `(IMG / PATCH)^2 + 1` rows (the patches and the class token,
//! [`ViTModel::POSITIONS`]): stable Rust cannot write that in a type, so it
//! is a [`Dyn`] size, fixed when the model is built. The layer count, the
//! LayerNorm eps and the dropout rates are a run-time [`ViTConfig`].
//! [`ViTBase16`] is `google/vit-base-patch16-224`.
//!
//! **Numerics** follow `transformers`: patches embedded by a convolution
//! whose kernel and stride are the patch size (so an image size that is not
//! a multiple of the patch size drops the last pixels, as PyTorch's
//! convolution does), pre-norm layers (`x + attention(layernorm_before(x))`,
//! then `x + mlp(layernorm_after(x))`), exact (erf) GELU, scores scaled by
//! `1/sqrt(head_dim)`, the final `vit.layernorm`, and the classifier on the
//! class token (`sequence_output[:, 0, :]`). There is no pooler, as in
//! `ViTForImageClassification`, which builds `ViTModel(add_pooling_layer=False)`.
//!
//! [`ViTForImageClassification::run_with`] also returns every layer's hidden
//! states and attention probabilities on request ([`Outputs`]), like
//! `output_hidden_states=True` and `output_attentions=True`; the layers'
//! own forward passes ([`ViTEmbeddings::run`], [`ViTLayer::run`]) are
//! public too. The self-attention is BERT's module
//! ([`ViTSelfAttention`] is [`BertSelfAttention`]), so it prints under that
//! name.
//!
//! **Not here:** `interpolate_pos_encoding` (images of another size than
//! `IMG`, which the types refuse), rectangular images or patches, the mask
//! token of masked image modelling, and the pooler of a bare `ViTModel`
//! checkpoint.

use crate::bert::BertSelfAttention;
use crate::util::{count_layers, layout_of, load_strict, restore, Dyn4, HfKeys, Init};
use crate::{HfLoadReport, Loaded, ModelError, Outputs};
use forma::core::device::Device;
use forma::nn::layers::{Conv2d, Dropout, LayerNorm, Linear, PaddingMode};
use forma::nn::{scope, StateDict};
use forma::prelude::*;
use std::path::Path;

/// What a ViT's type does not fix, like the rest of Hugging Face's
/// `ViTConfig`.
#[derive(Clone, Debug, PartialEq)]
pub struct ViTConfig {
    /// Number of encoder layers (`num_hidden_layers`).
    pub num_hidden_layers: usize,
    /// LayerNorm eps (`layer_norm_eps`, 1e-12).
    pub layer_norm_eps: f64,
    /// Dropout after the embeddings and each sub-layer
    /// (`hidden_dropout_prob`, 0).
    pub hidden_dropout_prob: f64,
    /// Dropout on attention weights (`attention_probs_dropout_prob`, 0).
    pub attention_probs_dropout_prob: f64,
    /// Standard deviation of the initial weights (`initializer_range`, 0.02).
    pub initializer_range: f64,
}

impl ViTConfig {
    /// Hugging Face's defaults with `num_hidden_layers` layers.
    pub fn with_layers(num_hidden_layers: usize) -> Self {
        ViTConfig {
            num_hidden_layers,
            layer_norm_eps: 1e-12,
            hidden_dropout_prob: 0.0,
            attention_probs_dropout_prob: 0.0,
            initializer_range: 0.02,
        }
    }

    /// `google/vit-base-patch16-224`'s: 12 layers, otherwise the defaults.
    pub fn vit_base() -> Self {
        Self::with_layers(12)
    }
}

/// The shape of `google/vit-base-patch16-224` (224 x 224 RGB images in 16 x
/// 16 patches, hidden 768, 12 heads, MLP 3072; 12 layers from
/// [`ViTConfig::vit_base`]) with `N` classes (1000 for ImageNet), in f32 on
/// the CPU by default.
pub type ViTBase16<const N: usize = 1000, E = f32, D = Cpu> =
    ViTForImageClassification<224, 16, 3, 768, 12, 3072, N, E, D>;

/// The self-attention (`query`, `key`, `value` and the attention dropout),
/// the same module as BERT's, keyed `attention.attention` in a ViT layer.
pub type ViTSelfAttention<const H: usize, const HEADS: usize, E = f32, D = Cpu> =
    BertSelfAttention<H, HEADS, E, D>;

/// The patches' projection, like `ViTPatchEmbeddings`: a convolution from
/// `CH` channels to `H` whose kernel and stride are the patch size.
#[derive(Module, Debug)]
#[module(crate = "::forma::nn", name = "ViTPatchEmbeddings")]
pub struct ViTPatchEmbeddings<
    const PATCH: usize,
    const CH: usize,
    const H: usize,
    E: Float = f32,
    D: Device<E> = Cpu,
> {
    /// `[H, CH, PATCH, PATCH]`, and a bias `[H]`.
    pub projection: Conv2d<CH, H, PATCH, PATCH, 0, 1, E, D>,
}

/// The class token, the patches' projection and the position table, like
/// `ViTEmbeddings` (without the mask token of masked image modelling).
#[derive(Module, Debug)]
#[module(crate = "::forma::nn", name = "ViTEmbeddings")]
pub struct ViTEmbeddings<
    const IMG: usize,
    const PATCH: usize,
    const CH: usize,
    const H: usize,
    E: Float = f32,
    D: Device<E> = Cpu,
> {
    /// `[1, 1, H]`, put before the patches.
    pub cls_token: Tensor<(C<1>, C<1>, C<H>), E, D>,
    /// `[1, (IMG / PATCH)^2 + 1, H]`: the class token's row, then the
    /// patches' in row-major order.
    pub position_embeddings: Tensor<(C<1>, Dyn, C<H>), E, D>,
    /// The projection.
    pub patch_embeddings: ViTPatchEmbeddings<PATCH, CH, H, E, D>,
    /// `hidden_dropout_prob`.
    pub dropout: Dropout,
}

/// A projection and its dropout, like `ViTSelfOutput` (`I = H`, after the
/// attention) and `ViTOutput` (`I = MLP`, after the MLP). The residual is
/// added by [`ViTLayer`].
#[derive(Module, Debug)]
#[module(crate = "::forma::nn", name = "ViTOutput")]
pub struct ViTOutput<const I: usize, const H: usize, E: Float = f32, D: Device<E> = Cpu> {
    /// `[H, I]`.
    pub dense: Linear<I, H, E, D>,
    /// `hidden_dropout_prob`.
    pub dropout: Dropout,
}

/// Self-attention and its output projection, like `ViTAttention`.
#[derive(Module, Debug)]
#[module(crate = "::forma::nn", name = "ViTAttention")]
pub struct ViTAttention<const H: usize, const HEADS: usize, E: Float = f32, D: Device<E> = Cpu> {
    /// `query`, `key`, `value`.
    pub attention: ViTSelfAttention<H, HEADS, E, D>,
    /// `ViTSelfOutput`.
    pub output: ViTOutput<H, H, E, D>,
}

/// The MLP's expansion with exact GELU, like `ViTIntermediate`.
#[derive(Module, Debug)]
#[module(crate = "::forma::nn", name = "ViTIntermediate")]
pub struct ViTIntermediate<const H: usize, const MLP: usize, E: Float = f32, D: Device<E> = Cpu> {
    /// `[MLP, H]`.
    pub dense: Linear<H, MLP, E, D>,
}

/// One pre-norm encoder layer, like `ViTLayer`.
#[derive(Module, Debug)]
#[module(crate = "::forma::nn", name = "ViTLayer")]
pub struct ViTLayer<
    const H: usize,
    const HEADS: usize,
    const MLP: usize,
    E: Float = f32,
    D: Device<E> = Cpu,
> {
    /// Self-attention and its projection.
    pub attention: ViTAttention<H, HEADS, E, D>,
    /// Before the attention.
    pub layernorm_before: LayerNorm<H, E, D>,
    /// Before the MLP.
    pub layernorm_after: LayerNorm<H, E, D>,
    /// `H -> MLP`.
    pub intermediate: ViTIntermediate<H, MLP, E, D>,
    /// `MLP -> H`.
    pub output: ViTOutput<MLP, H, E, D>,
}

/// The stack of layers, like `ViTEncoder`.
#[derive(Module, Debug)]
#[module(crate = "::forma::nn", name = "ViTEncoder")]
pub struct ViTEncoder<
    const H: usize,
    const HEADS: usize,
    const MLP: usize,
    E: Float = f32,
    D: Device<E> = Cpu,
> {
    /// `encoder.layer.<n>`.
    pub layer: Vec<ViTLayer<H, HEADS, MLP, E, D>>,
}

/// The ViT encoder, like `transformers.ViTModel(add_pooling_layer=False)`:
/// embeddings, layers and the final LayerNorm.
#[derive(Module, Debug)]
#[module(crate = "::forma::nn", name = "ViTModel")]
pub struct ViTModel<
    const IMG: usize,
    const PATCH: usize,
    const CH: usize,
    const H: usize,
    const HEADS: usize,
    const MLP: usize,
    E: Float = f32,
    D: Device<E> = Cpu,
> {
    /// Class token, patches and positions.
    pub embeddings: ViTEmbeddings<IMG, PATCH, CH, H, E, D>,
    /// The layers.
    pub encoder: ViTEncoder<H, HEADS, MLP, E, D>,
    /// After the last layer.
    pub layernorm: LayerNorm<H, E, D>,
}

/// A ViT with a linear classifier on the class token, like
/// `transformers.ViTForImageClassification`: `[batch, CH, IMG, IMG]` images
/// to `[batch, N]` logits.
///
/// ```
/// use forma::prelude::*;
/// use forma_models::vit::{ViTConfig, ViTForImageClassification};
///
/// // 16 x 16 RGB images in 4 x 4 patches, hidden 8, 2 heads, MLP 16,
/// // 3 classes, 1 layer.
/// type Tiny = ViTForImageClassification<16, 4, 3, 8, 2, 16, 3>;
/// let mut vit = Tiny::new(&ViTConfig::with_layers(1), &Cpu, &mut Rng::seed_from(0));
/// vit.eval();
/// let images = Tensor::<(Dyn, C<3>, C<16>, C<16>)>::zeros_with((Dyn(2), C, C, C));
/// let logits: Tensor<(Dyn, C<3>)> = vit.forward(images.clone());
/// assert_eq!(logits.dims()[..], [2, 3]);
///
/// // Like `output_hidden_states=True, output_attentions=True`.
/// let out = vit.run_with(&images, forma_models::Outputs::ALL).unwrap();
/// assert_eq!(Tiny::POSITIONS, 17); // 4 x 4 patches and the class token
/// assert_eq!(out.vit.last_hidden_state.dims()[..], [2, 17, 8]);
/// assert_eq!(out.vit.attentions.unwrap()[0].dims()[..], [2, 2, 17, 17]);
/// assert_eq!(vit.state_dict().keys().nth(4), Some("vit.encoder.layer.0.attention.attention.query.weight"));
/// ```
#[derive(Module, Debug)]
#[module(crate = "::forma::nn", name = "ViTForImageClassification")]
pub struct ViTForImageClassification<
    const IMG: usize,
    const PATCH: usize,
    const CH: usize,
    const H: usize,
    const HEADS: usize,
    const MLP: usize,
    const N: usize,
    E: Float = f32,
    D: Device<E> = Cpu,
> {
    /// The encoder, without a pooler.
    pub vit: ViTModel<IMG, PATCH, CH, H, HEADS, MLP, E, D>,
    /// `H -> N`, on the class token.
    pub classifier: Linear<H, N, E, D>,
}

/// What [`ViTModel::run_with`] returns, like `BaseModelOutput`.
#[derive(Debug)]
pub struct ViTOutputs<const H: usize, E: Float = f32, D: Device<E> = Cpu> {
    /// `[batch, positions, H]`, after the final LayerNorm.
    pub last_hidden_state: Tensor<(Dyn, Dyn, C<H>), E, D>,
    /// With [`Outputs::output_hidden_states`]: `1 + layers` tensors
    /// `[batch, positions, H]`, the embeddings' output and then each
    /// layer's, before the final LayerNorm (so the last one is not
    /// `last_hidden_state`, as in `transformers`). `None` otherwise.
    pub hidden_states: Option<Vec<Tensor<(Dyn, Dyn, C<H>), E, D>>>,
    /// With [`Outputs::output_attentions`]: each layer's attention
    /// probabilities `[batch, HEADS, positions, positions]` (`[.., query,
    /// key]`, after the softmax and the attention dropout). `None` otherwise.
    pub attentions: Option<Vec<Dyn4<E, D>>>,
}

/// What [`ViTForImageClassification::run_with`] returns, like
/// `ImageClassifierOutput`, with the encoder's output beside the logits.
#[derive(Debug)]
pub struct ViTClassifierOutputs<const H: usize, const N: usize, E: Float = f32, D: Device<E> = Cpu>
{
    /// `[batch, N]`.
    pub logits: Tensor<(Dyn, C<N>), E, D>,
    /// The encoder's output, intermediate results included on request.
    pub vit: ViTOutputs<H, E, D>,
}

impl<
        const IMG: usize,
        const PATCH: usize,
        const CH: usize,
        const H: usize,
        const HEADS: usize,
        const MLP: usize,
        E: Float,
        D: Device<E>,
    > ViTModel<IMG, PATCH, CH, H, HEADS, MLP, E, D>
{
    /// Rows of the position table: `(IMG / PATCH)^2` patches and the class
    /// token.
    pub const POSITIONS: usize = (IMG / PATCH) * (IMG / PATCH) + 1;

    const SIZES_FIT: () = {
        assert!(
            HEADS > 0 && H.is_multiple_of(HEADS),
            "ViT: the hidden size must split into equal heads"
        );
        assert!(
            PATCH > 0 && PATCH <= IMG,
            "ViT: the patch size must be between 1 and the image size"
        );
    };

    fn build(config: &ViTConfig, init: &mut Init<'_>, device: &D) -> Self {
        let () = Self::SIZES_FIT;
        let eps = config.layer_norm_eps;
        let p = config.hidden_dropout_prob;
        let embeddings = ViTEmbeddings {
            cls_token: init.weight((C, C, C), device),
            position_embeddings: init.weight((C, Dyn(Self::POSITIONS), C), device),
            patch_embeddings: ViTPatchEmbeddings {
                projection: Conv2d {
                    weight: init.weight((C, Dyn(CH), C, C), device),
                    bias: Some(init.constant((C,), 0.0, device)),
                    groups: 1,
                    padding_mode: PaddingMode::Zeros,
                },
            },
            dropout: init.dropout(p),
        };
        let layer = (0..config.num_hidden_layers)
            .map(|_| ViTLayer {
                attention: ViTAttention {
                    attention: BertSelfAttention {
                        query: init.linear(device),
                        key: init.linear(device),
                        value: init.linear(device),
                        dropout: init.dropout(config.attention_probs_dropout_prob),
                    },
                    output: ViTOutput {
                        dense: init.linear(device),
                        dropout: init.dropout(p),
                    },
                },
                layernorm_before: init.layer_norm(eps, device),
                layernorm_after: init.layer_norm(eps, device),
                intermediate: ViTIntermediate {
                    dense: init.linear(device),
                },
                output: ViTOutput {
                    dense: init.linear(device),
                    dropout: init.dropout(p),
                },
            })
            .collect();
        ViTModel {
            embeddings,
            encoder: ViTEncoder { layer },
            layernorm: init.layer_norm(eps, device),
        }
    }

    /// The encoder initialised like Hugging Face's (`N(0,
    /// initializer_range^2)` weights, class token and position table, zero
    /// biases, unit LayerNorm scales), in training mode.
    pub fn new(config: &ViTConfig, device: &D, rng: &mut Rng) -> Self {
        let std = config.initializer_range;
        Self::build(config, &mut Init::Normal { std, rng }, device)
    }

    /// The encoder's output for images `[batch, CH, IMG, IMG]`, like
    /// `ViTModel(pixel_values, output_hidden_states=..,
    /// output_attentions=..)`.
    ///
    /// # Errors
    /// [`ModelError::Tensor`] when the device fails.
    pub fn run_with(
        &self,
        pixel_values: &Tensor<(Dyn, C<CH>, C<IMG>, C<IMG>), E, D>,
        outputs: Outputs,
    ) -> Result<ViTOutputs<H, E, D>, ModelError> {
        let mut x = scope::run("embeddings", || self.embeddings.run(pixel_values))?;
        let mut hidden_states = outputs.output_hidden_states.then(Vec::new);
        let mut attentions = outputs.output_attentions.then(Vec::new);
        for (i, layer) in self.encoder.layer.iter().enumerate() {
            if let Some(all) = &mut hidden_states {
                all.push(x.clone());
            }
            let (y, probs) = scope::run("encoder", || {
                scope::run("layer", || {
                    scope::run(i, || layer.run(x, outputs.output_attentions))
                })
            })?;
            if let (Some(all), Some(p)) = (&mut attentions, probs) {
                all.push(p);
            }
            x = y;
        }
        if let Some(all) = &mut hidden_states {
            all.push(x.clone());
        }
        let last_hidden_state = self.layernorm.try_forward_as("layernorm", x)?;
        Ok(ViTOutputs {
            last_hidden_state,
            hidden_states,
            attentions,
        })
    }
}

impl<
        const IMG: usize,
        const PATCH: usize,
        const CH: usize,
        const H: usize,
        const HEADS: usize,
        const MLP: usize,
        const N: usize,
        E: Float,
        D: Device<E>,
    > ViTForImageClassification<IMG, PATCH, CH, H, HEADS, MLP, N, E, D>
{
    /// Rows of the position table ([`ViTModel::POSITIONS`]).
    pub const POSITIONS: usize = ViTModel::<IMG, PATCH, CH, H, HEADS, MLP, E, D>::POSITIONS;

    /// A model initialised like Hugging Face's (`N(0, initializer_range^2)`
    /// weights, class token and position table, zero biases, unit
    /// LayerNorm scales), in training mode.
    pub fn new(config: &ViTConfig, device: &D, rng: &mut Rng) -> Self {
        let std = config.initializer_range;
        Self::build(config, &mut Init::Normal { std, rng }, device)
    }

    fn build(config: &ViTConfig, init: &mut Init<'_>, device: &D) -> Self {
        ViTForImageClassification {
            vit: ViTModel::build(config, init, device),
            classifier: init.linear(device),
        }
    }

    /// The `state_dict` keys and shapes of a model of this type and
    /// `config`, in order, without allocating its weights (each tensor of
    /// the model built to list them is a view of a single zero).
    ///
    /// ```
    /// use forma::prelude::*;
    /// use forma_models::vit::{ViTBase16, ViTConfig};
    /// let keys = ViTBase16::<1000>::state_dict_layout(&ViTConfig::vit_base(), &Cpu);
    /// assert_eq!(keys[1], ("vit.embeddings.position_embeddings".to_string(), vec![1, 197, 768]));
    /// assert_eq!(keys.len(), 4 + 12 * 16 + 2 + 2);
    /// ```
    pub fn state_dict_layout(config: &ViTConfig, device: &D) -> Vec<(String, Vec<usize>)> {
        layout_of(&Self::build(config, &mut Init::Meta, device))
    }

    /// Loads a Hugging Face `ViTForImageClassification` checkpoint
    /// (`model.safetensors`) strictly, in eval mode, with the layer count
    /// read from the file and the other settings from
    /// [`ViTConfig::with_layers`] (`from_pretrained_dir` reads them from
    /// `config.json`). Keys in transformers 5's module names are renamed
    /// as [`ViTForImageClassification::load_hf_state_dict`] does; the
    /// returned [`Loaded::report`] lists them (it is empty for the files
    /// `save_pretrained` writes).
    ///
    /// ```no_run
    /// use forma::prelude::*;
    /// use forma_models::vit::ViTBase16;
    ///
    /// # fn main() -> Result<(), forma_models::ModelError> {
    /// let vit: ViTBase16 = ViTBase16::from_safetensors("vit-base-patch16-224/model.safetensors", &Cpu)?.model;
    /// let images = Tensor::<(Dyn, C<3>, C<224>, C<224>)>::zeros_with((Dyn(1), C, C, C));
    /// let logits: Tensor<(Dyn, C<1000>)> = vit.forward(images);
    /// # let _ = logits;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`ModelError::Checkpoint`] when the file cannot be read,
    /// [`ModelError::NoLayers`] when it holds no encoder layer, and
    /// [`ModelError::Load`] listing every missing, unexpected and mismatched
    /// key (a file with another image, patch or class count is refused that
    /// way).
    pub fn from_safetensors(
        path: impl AsRef<Path>,
        device: &D,
    ) -> Result<Loaded<Self>, ModelError> {
        let path = path.as_ref();
        let sd = forma::nn::state::load_file(path)?.tensors;
        let (sd, report) = normalize_hf_vit(sd);
        let layers = count_layers(&sd, "vit.encoder.layer.");
        if layers == 0 {
            return Err(ModelError::NoLayers("encoder"));
        }
        let mut model = Self::new(
            &ViTConfig::with_layers(layers),
            device,
            &mut Rng::seed_from(0),
        );
        load_strict(&mut model, &sd, Some(path))?;
        Ok(Loaded::eval(model, report))
    }

    /// Loads a Hugging Face `ViTForImageClassification` state dict
    /// strictly. The files `save_pretrained` writes, and the hub's, load as
    /// they are. The names transformers 5 gives ViT's modules in memory
    /// (`vit.layers.N.attention.q_proj`, `k_proj`, `v_proj`, `o_proj`,
    /// `mlp.fc1`, `mlp.fc2`: what `save_file(model.state_dict())` writes
    /// there) are renamed to the file's
    /// (`vit.encoder.layer.N.attention.attention.query`, ...,
    /// `attention.output.dense`, `intermediate.dense`, `output.dense`), as
    /// its `from_pretrained` converts between them, and listed in
    /// [`HfLoadReport::renamed`]. Every other key must match. On error the
    /// model is unchanged.
    ///
    /// # Errors
    /// [`ModelError::Load`] listing every missing, unexpected and mismatched key.
    pub fn load_hf_state_dict(&mut self, sd: StateDict) -> Result<HfLoadReport, ModelError> {
        let (sd, report) = normalize_hf_vit(sd);
        load_strict(self, &sd, None)?;
        Ok(report)
    }

    /// The logits and the encoder's output for images `[batch, CH, IMG,
    /// IMG]`, like `model(pixel_values)`. No hidden states or attentions
    /// are kept ([`ViTForImageClassification::run_with`] returns them).
    ///
    /// # Errors
    /// [`ModelError::Tensor`] when the device fails.
    pub fn run(
        &self,
        pixel_values: &Tensor<(Dyn, C<CH>, C<IMG>, C<IMG>), E, D>,
    ) -> Result<ViTClassifierOutputs<H, N, E, D>, ModelError> {
        self.run_with(pixel_values, Outputs::NONE)
    }

    /// [`ViTForImageClassification::run`] that also returns the
    /// intermediate results `outputs` asks for, like `model(pixel_values,
    /// output_hidden_states=.., output_attentions=..)`: see
    /// [`ViTOutputs::hidden_states`] and [`ViTOutputs::attentions`].
    ///
    /// # Errors
    /// As [`ViTForImageClassification::run`].
    pub fn run_with(
        &self,
        pixel_values: &Tensor<(Dyn, C<CH>, C<IMG>, C<IMG>), E, D>,
        outputs: Outputs,
    ) -> Result<ViTClassifierOutputs<H, N, E, D>, ModelError> {
        let vit = scope::run("vit", || Ok(self.vit.run_with(pixel_values, outputs)?))?;
        let x = &vit.last_hidden_state;
        let first = x
            .narrow::<1>(0, 1)
            .try_reshape_to((Dyn(x.size(0)), C::<H>))?;
        let logits = self.classifier.try_forward_as("classifier", first)?;
        Ok(ViTClassifierOutputs { logits, vit })
    }
}

/// transformers 5's in-memory names of a ViT layer's weights, after
/// `vit.layers.N.`, and the file's, after `vit.encoder.layer.N.` (the
/// norms keep theirs).
const MODULE_NAMES: [(&str, &str); 6] = [
    ("attention.q_proj.", "attention.attention.query."),
    ("attention.k_proj.", "attention.attention.key."),
    ("attention.v_proj.", "attention.attention.value."),
    ("attention.o_proj.", "attention.output.dense."),
    ("mlp.fc1.", "intermediate.dense."),
    ("mlp.fc2.", "output.dense."),
];

/// The file's name of a key in transformers 5's module names, `None` for
/// the others.
fn file_name(key: &str) -> Option<String> {
    let (n, rest) = key.strip_prefix("vit.layers.")?.split_once('.')?;
    let rest = MODULE_NAMES
        .iter()
        .find_map(|(module, file)| Some(format!("{file}{}", rest.strip_prefix(module)?)))
        .unwrap_or_else(|| rest.to_string());
    Some(format!("vit.encoder.layer.{n}.{rest}"))
}

/// Renames transformers 5's module names to the file's.
fn normalize_hf_vit(sd: StateDict) -> (StateDict, HfLoadReport) {
    HfKeys::new(sd).rename_keys(file_name).finish()
}

impl<
        const IMG: usize,
        const PATCH: usize,
        const CH: usize,
        const H: usize,
        E: Float,
        D: Device<E>,
    > ViTEmbeddings<IMG, PATCH, CH, H, E, D>
{
    /// `dropout(cat(cls_token, patches) + position_embeddings)` `[batch,
    /// (IMG / PATCH)^2 + 1, H]` for images `[batch, CH, IMG, IMG]`, like
    /// `ViTEmbeddings(pixel_values)`: the first of
    /// [`ViTOutputs::hidden_states`]. The patches' projections are in
    /// row-major order (`projection(x).flatten(2).transpose(1, 2)`).
    ///
    /// # Errors
    /// When the device fails.
    pub fn run(
        &self,
        pixel_values: &Tensor<(Dyn, C<CH>, C<IMG>, C<IMG>), E, D>,
    ) -> forma::Result<Tensor<(Dyn, Dyn, C<H>), E, D>> {
        let b = pixel_values.size(0);
        let grid: Tensor<(Dyn, C<H>, Dyn, Dyn), E, D> = scope::run("patch_embeddings", || {
            self.patch_embeddings
                .projection
                .try_forward_as("projection", pixel_values.clone())
        })?;
        let patches = grid.size(2) * grid.size(3);
        let patches = grid
            .try_reshape_to((Dyn(b), C::<H>, Dyn(patches)))?
            .transpose::<1, 2>()
            .into_dyn();
        let cls = self
            .cls_token
            .into_dyn()
            .try_expand((Dyn(b), Dyn(1), Dyn(H)))?;
        let x = forma::try_cat::<1, _, _>(&[cls, patches])?;
        let x: Tensor<(Dyn, Dyn, C<H>), E, D> =
            restore(x.try_add(&self.position_embeddings.into_dyn())?);
        self.dropout.try_forward_as("dropout", x)
    }
}

impl<const H: usize, const HEADS: usize, const MLP: usize, E: Float, D: Device<E>>
    ViTLayer<H, HEADS, MLP, E, D>
{
    /// One encoder layer on hidden states `[batch, positions, H]`, like
    /// `ViTLayer(hidden_states)`: `x + attention(layernorm_before(x))`,
    /// then `x + mlp(layernorm_after(x))`, each sub-layer's output through
    /// its dropout. Returns the layer's output and, when
    /// `output_attentions`, its attention probabilities `[batch, HEADS,
    /// positions, positions]` (see [`BertSelfAttention::run`]).
    ///
    /// # Errors
    /// When the device fails.
    pub fn run(
        &self,
        x: Tensor<(Dyn, Dyn, C<H>), E, D>,
        output_attentions: bool,
    ) -> forma::Result<(Tensor<(Dyn, Dyn, C<H>), E, D>, Option<Dyn4<E, D>>)> {
        let att = &self.attention;
        let h = self
            .layernorm_before
            .try_forward_as("layernorm_before", x.clone())?;
        let (ctx, probs) = scope::run("attention", || {
            scope::run("attention", || {
                att.attention.run(&h, None, output_attentions)
            })
        })?;
        let a = scope::run("attention", || scope::run("output", || att.output.run(ctx)))?;
        let x = &a + &x;
        let h = self
            .layernorm_after
            .try_forward_as("layernorm_after", x.clone())?;
        let h = scope::run("intermediate", || {
            self.intermediate.dense.try_forward_as("dense", h)
        })?
        .gelu();
        let y = scope::run("output", || self.output.run(h))?;
        Ok((&y + &x, probs))
    }
}

impl<const I: usize, const H: usize, E: Float, D: Device<E>> ViTOutput<I, H, E, D> {
    /// `dropout(dense(x))`, like `ViTSelfOutput` and `ViTOutput`'s
    /// projection (the residual is [`ViTLayer`]'s).
    ///
    /// # Errors
    /// When the device fails.
    pub fn run(
        &self,
        x: Tensor<(Dyn, Dyn, C<I>), E, D>,
    ) -> forma::Result<Tensor<(Dyn, Dyn, C<H>), E, D>> {
        let y = self.dense.try_forward_as("dense", x)?;
        self.dropout.try_forward_as("dropout", y)
    }
}

impl<
        B: Dim,
        const IMG: usize,
        const PATCH: usize,
        const CH: usize,
        const H: usize,
        const HEADS: usize,
        const MLP: usize,
        const N: usize,
        E: Float,
        D: Device<E>,
    > Forward<Tensor<(B, C<CH>, C<IMG>, C<IMG>), E, D>, Tensor<(B, C<N>), E, D>>
    for ViTForImageClassification<IMG, PATCH, CH, H, HEADS, MLP, N, E, D>
{
    /// The logits of [`ViTForImageClassification::run`].
    ///
    /// # Errors
    /// Where [`ViTForImageClassification::run`] returns one, as a tensor
    /// error.
    fn try_forward(
        &self,
        x: Tensor<(B, C<CH>, C<IMG>, C<IMG>), E, D>,
    ) -> forma::Result<Tensor<(B, C<N>), E, D>> {
        let out = self.run(&restore(x))?;
        Ok(restore(out.logits))
    }
}
