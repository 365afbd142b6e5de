//! Parameter groups: which parameters (by dotted name) share which options,
//! like the dicts of PyTorch's `optimizer.param_groups`.

use std::fmt;
use std::sync::Arc;

/// Which parameters a group holds, chosen by their dotted state_dict names
/// (`fc1.weight`, `layers.0.attn.q.bias`).
#[derive(Clone)]
pub enum Select {
    /// Every parameter.
    All,
    /// The parameters whose name starts with one of these strings (use
    /// `"fc1."` rather than `"fc1"` so that `fc10.weight` is not included).
    Prefixes(Vec<String>),
    /// The parameters with exactly these names.
    Names(Vec<String>),
    /// The parameters for which the closure returns `true`.
    Matching(Arc<dyn Fn(&str) -> bool + Send + Sync>),
}

impl Select {
    /// Every parameter.
    pub fn all() -> Self {
        Select::All
    }

    /// The parameters whose name starts with one of `prefixes`.
    pub fn prefixes<I: IntoIterator<Item = S>, S: Into<String>>(prefixes: I) -> Self {
        Select::Prefixes(prefixes.into_iter().map(Into::into).collect())
    }

    /// The parameters named in `names`.
    pub fn names<I: IntoIterator<Item = S>, S: Into<String>>(names: I) -> Self {
        Select::Names(names.into_iter().map(Into::into).collect())
    }

    /// The parameters for which `f(name)` is true, e.g.
    /// `Select::matching(|n| n.ends_with(".bias"))`.
    pub fn matching(f: impl Fn(&str) -> bool + Send + Sync + 'static) -> Self {
        Select::Matching(Arc::new(f))
    }

    /// Whether the parameter `name` is selected.
    pub fn selects(&self, name: &str) -> bool {
        match self {
            Select::All => true,
            Select::Prefixes(p) => p.iter().any(|p| name.starts_with(p.as_str())),
            Select::Names(n) => n.iter().any(|n| n == name),
            Select::Matching(f) => f(name),
        }
    }
}

impl fmt::Debug for Select {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Select::All => f.write_str("All"),
            Select::Prefixes(p) => f.debug_tuple("Prefixes").field(p).finish(),
            Select::Names(n) => f.debug_tuple("Names").field(n).finish(),
            Select::Matching(_) => f.write_str("Matching(<closure>)"),
        }
    }
}

/// A parameter group: the parameters it selects and their options (`lr`,
/// `weight_decay`, ...), like one dict of PyTorch's `param_groups`.
///
/// A parameter belongs to the **first** group that selects it, so a
/// catch-all group can come last: `[biases without weight decay, everything
/// else]`. A parameter that no group selects is not updated.
#[derive(Clone, Debug)]
pub struct ParamGroup<O> {
    /// Which parameters the group holds.
    pub params: Select,
    /// The group's hyperparameters.
    pub options: O,
    /// The learning rate a scheduler started from (PyTorch's
    /// `group["initial_lr"]`), set by the first scheduler attached.
    pub(crate) initial_lr: Option<f64>,
}

impl<O> ParamGroup<O> {
    /// A group of the parameters `params` selects, with `options`.
    pub fn new(params: Select, options: O) -> Self {
        ParamGroup {
            params,
            options,
            initial_lr: None,
        }
    }

    /// The learning rate the group's first scheduler started from
    /// (`group["initial_lr"]`); `None` before a scheduler is attached.
    pub fn initial_lr(&self) -> Option<f64> {
        self.initial_lr
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_by_name() {
        assert!(Select::all().selects("x"));
        let p = Select::prefixes(["fc1."]);
        assert!(p.selects("fc1.weight") && !p.selects("fc10.weight"));
        let n = Select::names(["a.bias"]);
        assert!(n.selects("a.bias") && !n.selects("a.bias2"));
        let m = Select::matching(|n| n.ends_with(".bias"));
        assert!(m.selects("x.bias") && !m.selects("x.weight"));
        assert_eq!(format!("{m:?}"), "Matching(<closure>)");
    }
}
