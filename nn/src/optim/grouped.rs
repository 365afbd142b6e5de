//! [`GroupedOptimizer`]: what every optimizer shares (parameter groups,
//! per-parameter state by name, the step loop, state export and import);
//! an [`Algorithm`] supplies the update rule.

use super::options::decode_value;
use super::{
    Algorithm, LrGroups, OptimError, Optimizer, OptimizerState, OptionValue, ParamGroup, Select,
};
use crate::module::{parameters, Module, ParamRef};
use forma_core::device::Device;
use forma_core::{Dyn, Float, Tensor};
use forma_cpu::Cpu;
use std::collections::BTreeMap;

/// A parameter's values (or a state buffer) as one flat row, as optimizers
/// see them.
pub type Flat<E, D> = Tensor<(Dyn,), E, D>;

/// What an optimizer keeps for one parameter: the number of steps taken and
/// named buffers (`momentum_buffer`, `exp_avg`, ...), each as flat as the
/// parameter's [`ParamRef::value`].
///
/// Steps update the buffers in place (one fused pass over the parameter
/// and its buffers, where the backend has one), so a tensor taken from
/// [`ParamState::buffer`] follows later steps; copy its values
/// ([`forma_core::Tensor::to_vec`]) to keep them. Cloning a `ParamState`
/// (or its optimizer) copies the buffers.
#[derive(Debug)]
pub struct ParamState<E: Float, D: Device<E>> {
    /// Steps taken for this parameter (PyTorch's `state["step"]`).
    pub step: u64,
    buffers: BTreeMap<&'static str, Flat<E, D>>,
}

impl<E: Float, D: Device<E>> Default for ParamState<E, D> {
    fn default() -> Self {
        ParamState {
            step: 0,
            buffers: BTreeMap::new(),
        }
    }
}

impl<E: Float, D: Device<E>> Clone for ParamState<E, D> {
    fn clone(&self) -> Self {
        // Buffers are updated in place: a clone sharing their storages would
        // move with the original.
        let buffers = self
            .buffers
            .iter()
            .map(|(k, v)| {
                let copy = v.zeros_like();
                copy.assign(v);
                (*k, copy)
            })
            .collect();
        ParamState {
            step: self.step,
            buffers,
        }
    }
}

impl<E: Float, D: Device<E>> ParamState<E, D> {
    /// The buffer `name`, if the optimizer has created it.
    pub fn buffer(&self, name: &str) -> Option<&Flat<E, D>> {
        self.buffers.get(name)
    }

    /// Every buffer, by name.
    pub fn buffers(&self) -> impl Iterator<Item = (&'static str, &Flat<E, D>)> {
        self.buffers.iter().map(|(k, v)| (*k, v))
    }

    /// Stores the buffer `name`.
    pub fn set_buffer(&mut self, name: &'static str, value: Flat<E, D>) {
        self.buffers.insert(name, value);
    }

    /// The buffer `name`, or `init()` when it does not exist yet.
    pub fn buffer_or(&self, name: &str, init: impl FnOnce() -> Flat<E, D>) -> Flat<E, D> {
        self.buffers.get(name).cloned().unwrap_or_else(init)
    }

    /// The buffer `name`, created with `init()` and stored when it does not
    /// exist yet: a buffer to update in place.
    pub(crate) fn buffer_init(
        &mut self,
        name: &'static str,
        init: impl FnOnce() -> Flat<E, D>,
    ) -> Flat<E, D> {
        self.buffers.entry(name).or_insert_with(init).clone()
    }
}

/// An optimizer: parameter groups with options `A`, and per-parameter state
/// keyed by dotted parameter name, for the parameters of element type `E` on
/// device `D`. [`Sgd`](super::Sgd), [`Adam`](super::Adam) and the others are
/// this type with their options.
///
/// The optimizer does not hold the model: each [`Optimizer::step`] walks the
/// model it is given (its parameters of type `E` on `D`), finds each
/// parameter's group by name and updates the parameter in place from its
/// accumulated gradient. A parameter without a gradient is skipped, as in
/// PyTorch. A tensor registered under two names (tied weights) is updated
/// once, under its first name.
///
/// `E` and `D` do not follow from the model's type. The constructors
/// below (`new`, `try_new`, `with_groups`, `try_with_groups`) make the
/// default, f32 on the CPU, so `let mut opt = Adam::new(..)` needs no
/// annotation; for another element type or device name them in the type,
/// `Adam::<f64>::new(..)` or `Sgd::<f32, Cuda>::new(..)`, which calls the
/// same constructors through [`NewOptimizer`] (in the prelude).
#[derive(Clone, Debug)]
pub struct GroupedOptimizer<A: Algorithm, E: Float = f32, D: Device<E> = Cpu> {
    groups: Vec<ParamGroup<A>>,
    state: BTreeMap<String, ParamState<E, D>>,
}

/// The constructors of a [`GroupedOptimizer`] for any element type and
/// device. The f32 CPU optimizer has the same methods inherently, which
/// Rust picks when the types are left to inference (as `HashMap::new` picks
/// the default hasher); this trait serves a type written out,
/// `Adam::<f64>::new(..)`.
pub trait NewOptimizer: Sized {
    /// The options of every group.
    type Options: Algorithm;

    /// One group holding every parameter, with `options`.
    ///
    /// # Errors
    /// [`OptimError::InvalidOption`] for an option PyTorch rejects (a
    /// negative learning rate, Nesterov momentum without momentum, ...).
    fn try_new(options: Self::Options) -> Result<Self, OptimError> {
        Self::try_with_groups(vec![ParamGroup::new(Select::All, options)])
    }

    /// [`NewOptimizer::try_new`] for options known to be valid.
    ///
    /// # Panics
    /// On an invalid option, with [`OptimError`]'s message.
    fn new(options: Self::Options) -> Self {
        Self::try_new(options).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Several parameter groups, each with its own options; a parameter
    /// belongs to the first group that selects it.
    ///
    /// # Errors
    /// [`OptimError::InvalidOption`] for an invalid option or an empty list.
    fn try_with_groups(groups: Vec<ParamGroup<Self::Options>>) -> Result<Self, OptimError>;

    /// [`NewOptimizer::try_with_groups`] for options known to be valid.
    ///
    /// # Panics
    /// On an invalid option or an empty list.
    fn with_groups(groups: Vec<ParamGroup<Self::Options>>) -> Self {
        Self::try_with_groups(groups).unwrap_or_else(|e| panic!("{e}"))
    }
}

impl<A: Algorithm, E: Float, D: Device<E>> NewOptimizer for GroupedOptimizer<A, E, D> {
    type Options = A;

    fn try_with_groups(groups: Vec<ParamGroup<A>>) -> Result<Self, OptimError> {
        if groups.is_empty() {
            return Err(OptimError::invalid(
                A::NAME,
                "param_groups",
                "[]",
                "an optimizer needs at least one parameter group",
            ));
        }
        for g in &groups {
            g.options.validate()?;
        }
        Ok(GroupedOptimizer {
            groups,
            state: BTreeMap::new(),
        })
    }
}

/// The constructors for f32 parameters on the CPU, which type inference
/// picks when nothing names the types (see [`NewOptimizer`] for the rest).
impl<A: Algorithm> GroupedOptimizer<A> {
    /// One group holding every parameter, with `options`.
    ///
    /// # Errors
    /// [`OptimError::InvalidOption`] for an option PyTorch rejects (a
    /// negative learning rate, Nesterov momentum without momentum, ...).
    pub fn try_new(options: A) -> Result<Self, OptimError> {
        NewOptimizer::try_new(options)
    }

    /// [`GroupedOptimizer::try_new`] for options known to be valid.
    ///
    /// # Panics
    /// On an invalid option, with [`OptimError`]'s message.
    pub fn new(options: A) -> Self {
        NewOptimizer::new(options)
    }

    /// Several parameter groups, each with its own options; a parameter
    /// belongs to the first group that selects it.
    ///
    /// # Errors
    /// [`OptimError::InvalidOption`] for an invalid option or an empty list.
    pub fn try_with_groups(groups: Vec<ParamGroup<A>>) -> Result<Self, OptimError> {
        NewOptimizer::try_with_groups(groups)
    }

    /// [`GroupedOptimizer::try_with_groups`] for options known to be valid.
    ///
    /// # Panics
    /// On an invalid option or an empty list.
    pub fn with_groups(groups: Vec<ParamGroup<A>>) -> Self {
        NewOptimizer::with_groups(groups)
    }
}

impl<A: Algorithm, E: Float, D: Device<E>> GroupedOptimizer<A, E, D> {
    /// The parameter groups.
    pub fn groups(&self) -> &[ParamGroup<A>] {
        &self.groups
    }

    /// The options of group `group`, to change between steps (they are
    /// checked again at the next step).
    ///
    /// # Panics
    /// If there is no such group.
    pub fn options_mut(&mut self, group: usize) -> &mut A {
        &mut self.groups[group].options
    }

    /// The group that holds the parameter `name`: the first that selects it.
    pub fn group_of(&self, name: &str) -> Option<usize> {
        self.groups.iter().position(|g| g.params.selects(name))
    }

    /// The state kept for the parameter `name` (none before its first step).
    pub fn param_state(&self, name: &str) -> Option<&ParamState<E, D>> {
        self.state.get(name)
    }

    /// The parameters of `model` this optimizer updates, each with its
    /// group, in state_dict order (tied duplicates removed).
    fn assigned<M: Module>(&self, model: &M) -> Vec<(usize, ParamRef<E, D>)> {
        let mut out: Vec<(usize, ParamRef<E, D>)> = Vec::new();
        for p in parameters::<M, E, D>(model) {
            let tied = out.iter().any(|(_, q)| {
                q.value.shares_storage(&p.value) && q.value.layout() == p.value.layout()
            });
            if tied {
                continue;
            }
            if let Some(g) = self.group_of(&p.name) {
                out.push((g, p));
            }
        }
        out
    }
}

impl<A: Algorithm, E: Float, D: Device<E>> LrGroups for GroupedOptimizer<A, E, D> {
    fn num_groups(&self) -> usize {
        self.groups.len()
    }

    fn lr(&self, group: usize) -> f64 {
        self.groups[group].options.lr()
    }

    fn set_lr(&mut self, group: usize, lr: f64) {
        self.groups[group].options.set_lr(lr);
    }

    fn initial_lr(&self, group: usize) -> Option<f64> {
        self.groups[group].initial_lr
    }

    fn set_initial_lr(&mut self, group: usize, lr: f64) {
        self.groups[group].initial_lr = Some(lr);
    }

    fn momentum(&self, group: usize) -> Option<f64> {
        self.groups[group].options.momentum()
    }

    fn set_momentum(&mut self, group: usize, momentum: f64) {
        self.groups[group].options.set_momentum(momentum);
    }
}

const KIND: &str = "optimizer";
const GROUPS: &str = "param_groups";

impl<A: Algorithm, E: Float, D: Device<E>> Optimizer for GroupedOptimizer<A, E, D> {
    fn try_step<M: Module>(&mut self, model: &M) -> Result<(), OptimError> {
        for g in &self.groups {
            g.options.validate()?;
        }
        let mut work = Vec::new();
        for (group, p) in self.assigned(model) {
            let Some(grad) = p.grad else { continue };
            // A state loaded for a parameter of another size is refused
            // before anything is written.
            if let Some(st) = self.state.get(&p.name) {
                if let Some((b, t)) = st.buffers().find(|(_, t)| t.numel() != p.value.numel()) {
                    return Err(OptimError::StateSize {
                        param: p.name,
                        buffer: b.to_string(),
                        expected: p.value.numel(),
                        found: t.dims().to_vec(),
                    });
                }
            }
            work.push((group, p.name, p.value, grad));
        }
        let _no_grad = forma_core::tape::no_grad();
        for (group, name, value, grad) in work {
            let st = self.state.entry(name).or_default();
            self.groups[group].options.update(st, &value, grad)?;
        }
        Ok(())
    }

    fn try_state_dict(&self) -> Result<OptimizerState, OptimError> {
        let mut out = OptimizerState::default();
        out.meta.insert(KIND.into(), A::NAME.into());
        out.meta
            .insert(GROUPS.into(), self.groups.len().to_string());
        for (i, g) in self.groups.iter().enumerate() {
            for (field, value) in g.options.fields() {
                out.meta.insert(format!("{GROUPS}.{i}.{field}"), value);
            }
            if let Some(lr) = g.initial_lr {
                out.meta
                    .insert(format!("{GROUPS}.{i}.initial_lr"), lr.encode());
            }
        }
        for (name, st) in &self.state {
            out.meta
                .insert(format!("state.{name}.step"), st.step.to_string());
            for (buf, t) in st.buffers() {
                out.tensors
                    .insert(format!("state.{name}.{buf}"), t.try_to_data()?);
            }
        }
        Ok(out)
    }

    fn load_state_dict<M: Module>(
        &mut self,
        model: &M,
        state: &OptimizerState,
    ) -> Result<(), OptimError> {
        let meta = &state.meta;
        let get = |k: &str| meta.get(k).ok_or_else(|| OptimError::MissingKey(k.into()));
        let kind = get(KIND)?;
        if kind != A::NAME {
            return Err(OptimError::WrongKind {
                expected: A::NAME,
                found: kind.clone(),
            });
        }
        let n: usize = decode_value::<u64>(GROUPS, get(GROUPS)?)? as usize;
        if n != self.groups.len() {
            return Err(OptimError::GroupCount {
                what: "optimizer state",
                expected: self.groups.len(),
                found: n,
            });
        }
        // Group options: every option of every group must be present.
        let mut groups = self.groups.clone();
        for (i, g) in groups.iter_mut().enumerate() {
            for (field, _) in g.options.fields() {
                let key = format!("{GROUPS}.{i}.{field}");
                g.options.set_field(field, get(&key)?, &key)?;
            }
            let key = format!("{GROUPS}.{i}.initial_lr");
            g.initial_lr = match meta.get(&key) {
                Some(v) => Some(decode_value(&key, v)?),
                None => None,
            };
            g.options.validate()?;
        }
        // Per-parameter steps, then buffers, checked against the model.
        let params: BTreeMap<String, ParamRef<E, D>> = self
            .assigned(model)
            .into_iter()
            .map(|(_, p)| (p.name.clone(), p))
            .collect();
        let mut new_state: BTreeMap<String, ParamState<E, D>> = BTreeMap::new();
        for (key, value) in meta {
            if key == KIND || key == GROUPS {
                continue;
            }
            if let Some(rest) = key.strip_prefix(&format!("{GROUPS}.")) {
                let known = rest.split_once('.').is_some_and(|(i, f)| {
                    i.parse::<usize>().is_ok_and(|i| i < n)
                        && (f == "initial_lr"
                            || groups[0].options.fields().iter().any(|(k, _)| *k == f))
                });
                if !known {
                    return Err(OptimError::UnexpectedKey {
                        key: key.clone(),
                        reason: format!("not an option of {}", A::NAME),
                    });
                }
                continue;
            }
            let name = key
                .strip_prefix("state.")
                .and_then(|r| r.strip_suffix(".step"))
                .ok_or_else(|| OptimError::UnexpectedKey {
                    key: key.clone(),
                    reason: "not an optimizer entry".into(),
                })?;
            if !params.contains_key(name) {
                return Err(OptimError::UnexpectedKey {
                    key: key.clone(),
                    reason: format!(
                        "the model has no parameter `{name}` that this optimizer updates"
                    ),
                });
            }
            new_state.insert(
                name.to_string(),
                ParamState {
                    step: decode_value(key, value)?,
                    buffers: BTreeMap::new(),
                },
            );
        }
        for (key, data) in state.tensors.iter() {
            let unexpected = |reason: String| OptimError::UnexpectedKey {
                key: key.to_string(),
                reason,
            };
            let (head, buf) = key
                .strip_prefix("state.")
                .and_then(|r| r.rsplit_once('.'))
                .ok_or_else(|| unexpected("not an optimizer entry".into()))?;
            let buf = A::BUFFERS
                .iter()
                .find(|b| **b == buf)
                .ok_or_else(|| unexpected(format!("{} keeps no buffer `{buf}`", A::NAME)))?;
            let (Some(st), Some(p)) = (new_state.get_mut(head), params.get(head)) else {
                return Err(unexpected(format!("no `state.{head}.step` entry for it")));
            };
            if data.numel() != p.value.numel() {
                return Err(OptimError::StateSize {
                    param: head.to_string(),
                    buffer: buf.to_string(),
                    expected: p.value.numel(),
                    found: data.dims().to_vec(),
                });
            }
            let flat = flatten_data(data);
            let t = Flat::<E, D>::try_from_data(&flat, p.value.device())?;
            st.buffers.insert(buf, t);
        }
        self.groups = groups;
        self.state = new_state;
        Ok(())
    }
}

/// A state entry's values as one flat row (a saved buffer may carry its
/// parameter's shape).
fn flatten_data(data: &forma_core::TensorData) -> forma_core::TensorData {
    forma_core::TensorData::from_bytes(data.dtype(), vec![data.numel()], data.bytes().to_vec())
        .expect("the same bytes fill the flattened sizes")
}
