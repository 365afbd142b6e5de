//! What the two decoders ([`crate::gpt2`], [`crate::llama`]) share: the
//! [`KvCache`], the causal mask, the loop over the layers that collects
//! their intermediate results ([`CausalLmOutputs`]), and generation
//! ([`Sampling`]).

use crate::util::{Dyn4, HIDDEN};
use crate::{ModelError, Outputs};
use forma::core::device::Device;
use forma::nn::scope;
use forma::prelude::*;

/// One layer's cached keys and values.
pub(crate) type Kv<E, D> = (Dyn4<E, D>, Dyn4<E, D>);

/// Hidden states `[batch, len, H]`.
pub(crate) type Hidden<const H: usize, E, D> = Tensor<(Dyn, Dyn, C<H>), E, D>;

/// Every layer's past keys and values (`[batch, heads, positions, head_dim]`
/// each; Llama's with the key/value heads only, its keys after the rotary
/// embedding), like `past_key_values`: with it, a decoder's
/// `logits_cached` ([`crate::gpt2::Gpt2LMHeadModel::logits_cached`],
/// [`crate::llama::LlamaForCausalLM::logits_cached`]) runs only the new
/// positions. A cache holds what the model that filled it computed; give it
/// to that model only.
#[derive(Debug)]
pub struct KvCache<E: Float = f32, D: Device<E> = Cpu> {
    pub(crate) layers: Vec<Option<Kv<E, D>>>,
}

impl<E: Float, D: Device<E>> Default for KvCache<E, D> {
    fn default() -> Self {
        KvCache { layers: Vec::new() }
    }
}

impl<E: Float, D: Device<E>> KvCache<E, D> {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of cached positions.
    pub fn len(&self) -> usize {
        match self.layers.first() {
            Some(Some((k, _))) => k.size(2),
            _ => 0,
        }
    }

    /// Whether no position is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets every position.
    pub fn clear(&mut self) {
        self.layers.clear();
    }
}

/// Runs `run` with `cache`, if any: on a copy with a slot for each of
/// `layers` layers, kept only when `run` succeeds (so a failed step leaves
/// the cache unchanged). A batch of another size than the cached one is
/// refused as [`ModelError::Input`] of `model`.
pub(crate) fn with_cache<T, E: Float, D: Device<E>>(
    cache: Option<&mut KvCache<E, D>>,
    model: &'static str,
    batch: usize,
    layers: usize,
    run: impl FnOnce(Option<&mut KvCache<E, D>>) -> Result<T, ModelError>,
) -> Result<T, ModelError> {
    let Some(cache) = cache else {
        return run(None);
    };
    if let Some(Some((k, _))) = cache.layers.first() {
        if k.size(0) != batch {
            return Err(ModelError::Input {
                model,
                what: format!("a batch of {batch} after a cache of {}", k.size(0)),
            });
        }
    }
    let mut next = KvCache {
        layers: cache.layers.clone(),
    };
    next.layers.resize(layers, None);
    let y = run(Some(&mut next))?;
    *cache = next;
    Ok(y)
}

/// The keys `k` and values `v` of new positions after those cached in
/// `slot` (a layer's cache entry, if any), which then holds them all.
pub(crate) fn extend<E: Float, D: Device<E>>(
    slot: Option<&mut Option<Kv<E, D>>>,
    mut k: Dyn4<E, D>,
    mut v: Dyn4<E, D>,
) -> forma::Result<Kv<E, D>> {
    if let Some(slot) = slot {
        if let Some((pk, pv)) = slot.take() {
            k = forma::try_cat::<2, _, _>(&[pk, k])?;
            v = forma::try_cat::<2, _, _>(&[pv, v])?;
        }
        *slot = Some((k.clone(), v.clone()));
    }
    Ok((k, v))
}

/// The additive causal mask `[1, 1, len, past + len]` of `len` new
/// positions after `past` cached ones: query `i` sits at position `past + i`
/// and sees the keys up to it (0), not the later ones (the most negative
/// f32). Built from tensor ops rather than on the host, so that graph
/// capture (ONNX export) sees it follow the sequence length.
pub(crate) fn causal_mask<E: Float, D: Device<E>>(
    len: usize,
    past: usize,
    device: &D,
) -> forma::Result<Dyn4<E, D>> {
    let s = past + len;
    let query = Tensor::<(Dyn,), E, D>::arange_on(past as f64, s as f64, 1.0, device)?;
    let key = Tensor::<(Dyn,), E, D>::arange_on(0.0, s as f64, 1.0, device)?;
    let later = key.unsqueeze::<0>().try_gt(&query.unsqueeze::<1>())?;
    later
        .to_dtype::<E>()
        .mul_scalar(HIDDEN)
        .try_reshape_to((Dyn(1), Dyn(1), Dyn(len), Dyn(s)))
}

/// What a decoder's `run_with` returns
/// ([`crate::gpt2::Gpt2LMHeadModel::run_with`],
/// [`crate::llama::LlamaForCausalLM::run_with`]), like
/// `CausalLMOutputWithPast` (the cache is passed in instead).
#[derive(Debug)]
pub struct CausalLmOutputs<const V: usize, const H: usize, E: Float = f32, D: Device<E> = Cpu> {
    /// `[batch, len, V]`.
    pub logits: Tensor<(Dyn, Dyn, C<V>), E, D>,
    /// With [`Outputs::output_hidden_states`]: one tensor `[batch, len, H]`
    /// of the new positions per layer and one more, as `transformers`
    /// returns them: the input of each layer (the first is the embeddings'
    /// output: GPT-2's `dropout(wte[ids] + wpe[positions])`, Llama's token
    /// embedding), then, last, the final norm of the last layer's output
    /// (the input of the head, not the raw layer output). `None` otherwise.
    pub hidden_states: Option<Vec<Tensor<(Dyn, Dyn, C<H>), E, D>>>,
    /// With [`Outputs::output_attentions`]: each layer's causal attention
    /// probabilities `[batch, heads, len, past + len]` (`[.., query, key]`,
    /// after the softmax and the attention dropout); later keys get exactly
    /// 0. `None` otherwise.
    pub attentions: Option<Vec<Dyn4<E, D>>>,
}

/// The layers of a decoder on `x`, then its final norm: layer `i` is
/// `step(i, x, slot, output_attentions)` with its cache entry `slot`, run in
/// the scope `<outer>.<list>.<i>`, and `finish` runs in `<outer>`. Returns
/// the outputs with the logits `head` computes from the final norm's output,
/// with the hidden states and attentions `outputs` asks for.
pub(crate) fn run_layers<const V: usize, const H: usize, E: Float, D: Device<E>>(
    mut x: Hidden<H, E, D>,
    mut cache: Option<&mut KvCache<E, D>>,
    layers: usize,
    outputs: Outputs,
    (outer, list): (&'static str, &'static str),
    mut step: impl FnMut(
        usize,
        Hidden<H, E, D>,
        Option<&mut Option<Kv<E, D>>>,
        bool,
    ) -> forma::Result<(Hidden<H, E, D>, Option<Dyn4<E, D>>)>,
    finish: impl FnOnce(Hidden<H, E, D>) -> forma::Result<Hidden<H, E, D>>,
    head: impl FnOnce(Hidden<H, E, D>) -> forma::Result<Tensor<(Dyn, Dyn, C<V>), E, D>>,
) -> Result<CausalLmOutputs<V, H, E, D>, ModelError> {
    let mut hidden_states = outputs.output_hidden_states.then(Vec::new);
    let mut attentions = outputs.output_attentions.then(Vec::new);
    for i in 0..layers {
        if let Some(all) = &mut hidden_states {
            all.push(x.clone());
        }
        let slot = cache.as_mut().map(|c| &mut c.layers[i]);
        let (y, probs) = scope::run(outer, || {
            scope::run(list, || {
                scope::run(i, || step(i, x, slot, outputs.output_attentions))
            })
        })?;
        if let (Some(all), Some(p)) = (&mut attentions, probs) {
            all.push(p);
        }
        x = y;
    }
    let x = scope::run(outer, || finish(x))?;
    if let Some(all) = &mut hidden_states {
        all.push(x.clone());
    }
    Ok(CausalLmOutputs {
        logits: head(x)?,
        hidden_states,
        attentions,
    })
}

/// How a decoder's `generate` picks each token
/// ([`crate::gpt2::Gpt2LMHeadModel::generate`],
/// [`crate::llama::LlamaForCausalLM::generate_with`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sampling {
    /// The most likely token (the first one on a tie), like
    /// `generate(do_sample=False)`.
    Greedy,
    /// A draw from the `k` most likely tokens after dividing the logits by
    /// `temperature`, like `generate(do_sample=True, top_k=k,
    /// temperature=temperature)`.
    TopK {
        /// How many tokens stay candidates (at least 1).
        k: usize,
        /// Above 0; below 1 sharpens, above 1 flattens.
        temperature: f64,
    },
}

impl Sampling {
    /// Refuses `k = 0` and a temperature that is not positive.
    fn check(self) -> Result<(), ModelError> {
        if let Sampling::TopK { k, temperature } = self {
            if k == 0 || temperature.is_nan() || temperature <= 0.0 {
                return Err(ModelError::Sampling(format!(
                    "top-k needs k >= 1 and a positive temperature, not k={k}, temperature={temperature}"
                )));
            }
        }
        Ok(())
    }

    /// A token from one row of logits.
    fn pick(self, logits: &[f64], rng: &mut Rng) -> usize {
        match self {
            Sampling::Greedy => argmax(logits),
            Sampling::TopK { k, temperature } => {
                let mut order: Vec<usize> = (0..logits.len()).collect();
                // Stable, so equal logits keep the lower id first (as torch.topk
                // does on the CPU).
                order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
                order.truncate(k.min(logits.len()));
                let top = logits[order[0]] / temperature;
                let weights: Vec<f64> = order
                    .iter()
                    .map(|&i| (logits[i] / temperature - top).exp())
                    .collect();
                let total: f64 = weights.iter().sum();
                let mut u = rng.uniform() * total;
                for (&i, w) in order.iter().zip(&weights) {
                    if u < *w {
                        return i;
                    }
                    u -= w;
                }
                order[order.len() - 1]
            }
        }
    }
}

/// Index of the largest value, the first on a tie (as `argmax` does).
fn argmax(xs: &[f64]) -> usize {
    let mut best = 0;
    for (i, &x) in xs.iter().enumerate() {
        if x > xs[best] {
            best = i;
        }
    }
    best
}

/// The prompt followed by `max_new_tokens` tokens, each picked by
/// `sampling` from the logits of the last position, which
/// `logits_cached(ids, cache)` gives for the new `ids` after those in a
/// [`KvCache`], so that each new token runs one position (no graph is
/// recorded). `context` is the model's name and its number of positions, if
/// it has a limit.
///
/// # Errors
/// [`ModelError::Sampling`] for an empty prompt, `k = 0` or a temperature
/// that is not positive; [`ModelError::SequenceTooLong`] when the prompt and
/// the new tokens exceed the context; what `logits_cached` returns.
pub(crate) fn generate<const V: usize, E: Float, D: Device<E>>(
    prompt: &[i64],
    max_new_tokens: usize,
    sampling: Sampling,
    rng: &mut Rng,
    context: Option<(&'static str, usize)>,
    device: &D,
    mut logits_cached: impl FnMut(
        &Tensor<(Dyn, Dyn), i64, D>,
        &mut KvCache<E, D>,
    ) -> Result<Tensor<(Dyn, Dyn, C<V>), E, D>, ModelError>,
) -> Result<Vec<i64>, ModelError> {
    if prompt.is_empty() {
        return Err(ModelError::Sampling("the prompt is empty".into()));
    }
    sampling.check()?;
    if let Some((model, max)) = context {
        if prompt.len() + max_new_tokens > max {
            return Err(ModelError::SequenceTooLong {
                model,
                len: prompt.len() + max_new_tokens,
                max,
            });
        }
    }
    let _guard = forma::core::tape::no_grad();
    let mut cache = KvCache::new();
    let mut out = prompt.to_vec();
    let mut ids = Tensor::<(Dyn, Dyn), i64, D>::from_vec_on(
        prompt.to_vec(),
        (Dyn(1), Dyn(prompt.len())),
        device,
    )?;
    for _ in 0..max_new_tokens {
        let logits = logits_cached(&ids, &mut cache)?;
        let t = logits.size(1);
        let last = logits.narrow::<1>(t - 1, 1).to_dtype::<f64>().to_vec();
        let next = sampling.pick(&last, rng) as i64;
        out.push(next);
        ids = Tensor::from_vec_on(vec![next], (Dyn(1), Dyn(1)), device)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_takes_the_first_of_equal_values() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
    }

    #[test]
    fn top_1_is_greedy_and_top_k_stays_in_the_top_k() {
        let logits = [0.5, 2.0, -1.0, 1.5, 1.9];
        let mut rng = Rng::seed_from(3);
        let one = Sampling::TopK {
            k: 1,
            temperature: 0.7,
        };
        assert_eq!(one.pick(&logits, &mut rng), 1);
        let three = Sampling::TopK {
            k: 3,
            temperature: 1.0,
        };
        let mut seen = [0usize; 5];
        for _ in 0..2000 {
            seen[three.pick(&logits, &mut rng)] += 1;
        }
        assert_eq!((seen[0], seen[2]), (0, 0), "{seen:?}");
        // exp(2.0), exp(1.9), exp(1.5) normalised: 0.39, 0.35, 0.26.
        assert!(
            seen[1] > seen[4] && seen[4] > seen[3] && seen[3] > 400,
            "{seen:?}"
        );
    }
}
