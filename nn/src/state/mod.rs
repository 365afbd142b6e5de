//! State dicts: a module's tensors by dotted name, as PyTorch's `state_dict()`
//! holds them, and the strict or lenient load that writes them back.

pub mod file;
mod header;
mod training;

pub use file::{load_file, save_file, Checkpoint, CheckpointError};
pub use header::StoredDtype;
pub use training::TrainingState;

use crate::module::{Cx, Module, Role, Visitor, VisitorMut};
use forma_core::error::fmt_dims;
use forma_core::{Backend, DType, Dtype, Shape, Tensor, TensorData};
use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;

/// What a tensor of a module is, without its values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// The sizes.
    pub dims: Vec<usize>,
    /// The dtype.
    pub dtype: DType,
    /// Whether it accumulates a gradient.
    pub requires_grad: bool,
}

impl TensorInfo {
    /// Describes a tensor.
    pub fn of<S: Shape, E: Dtype, D: Backend>(t: &Tensor<S, E, D>) -> Self {
        TensorInfo {
            dims: t.dims().to_vec(),
            dtype: t.dtype(),
            requires_grad: t.needs_grad(),
        }
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.dims.iter().product()
    }
}

/// Named tensors in insertion order (a module's state_dict keeps PyTorch's
/// order), with lookup by name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StateDict {
    entries: Vec<(String, TensorData)>,
    index: HashMap<String, usize>,
}

impl StateDict {
    /// An empty state dict.
    pub fn new() -> Self {
        StateDict::default()
    }

    /// Adds or replaces an entry (a replaced entry keeps its position).
    pub fn insert(&mut self, key: impl Into<String>, data: TensorData) {
        let key = key.into();
        match self.index.get(&key) {
            Some(&i) => self.entries[i].1 = data,
            None => {
                self.index.insert(key.clone(), self.entries.len());
                self.entries.push((key, data));
            }
        }
    }

    /// The entry for `key`.
    pub fn get(&self, key: &str) -> Option<&TensorData> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// Whether `key` is present.
    pub fn contains_key(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// Removes and returns the entry for `key`.
    pub fn remove(&mut self, key: &str) -> Option<TensorData> {
        let i = self.index.remove(key)?;
        let (_, data) = self.entries.remove(i);
        for v in self.index.values_mut() {
            if *v > i {
                *v -= 1;
            }
        }
        Some(data)
    }

    /// The keys in order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(k, _)| k.as_str())
    }

    /// The entries in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &TensorData)> {
        self.entries.iter().map(|(k, d)| (k.as_str(), d))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Renames every key with `f` (for checkpoints whose layout differs);
    /// `None` drops the entry.
    pub fn remap(self, mut f: impl FnMut(&str) -> Option<String>) -> Self {
        let mut out = StateDict::new();
        for (k, d) in self.entries {
            if let Some(k2) = f(&k) {
                out.insert(k2, d);
            }
        }
        out
    }
}

impl StateDict {
    /// Applies prefix rules to every key (the first matching rule wins), for
    /// checkpoints whose layout differs only by where a model sits: e.g.
    /// `[("bert.", ""), ("module.", "")]` strips a wrapper's prefix.
    ///
    /// ```
    /// use forma::nn::StateDict;
    /// use forma::TensorData;
    /// let mut sd = StateDict::new();
    /// sd.insert("module.fc.weight", TensorData::from_vec(&[1.0f32], vec![1]).unwrap());
    /// let sd = sd.rename_prefixes(&[("module.", "")]);
    /// assert_eq!(sd.keys().collect::<Vec<_>>(), ["fc.weight"]);
    /// ```
    pub fn rename_prefixes(self, rules: &[(&str, &str)]) -> Self {
        self.remap(|k| {
            Some(
                rules
                    .iter()
                    .find_map(|(from, to)| k.strip_prefix(from).map(|rest| format!("{to}{rest}")))
                    .unwrap_or_else(|| k.to_string()),
            )
        })
    }
}

impl FromIterator<(String, TensorData)> for StateDict {
    fn from_iter<I: IntoIterator<Item = (String, TensorData)>>(iter: I) -> Self {
        let mut sd = StateDict::new();
        for (k, d) in iter {
            sd.insert(k, d);
        }
        sd
    }
}

/// How [`Module::load_state_dict_with`] treats keys that do not match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadOptions {
    /// Require every key of the module and no other (PyTorch's `strict=True`).
    pub strict: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { strict: true }
    }
}

/// What a successful load skipped (always empty for a strict load), like
/// PyTorch's `_IncompatibleKeys`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Keys of the module that the state dict lacks (left unchanged).
    pub missing_keys: Vec<String>,
    /// Keys of the state dict that the module lacks (ignored).
    pub unexpected_keys: Vec<String>,
}

/// A key whose tensor does not fit the module's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// The dotted name.
    pub key: String,
    /// The module's sizes and dtype.
    pub expected: (Vec<usize>, DType),
    /// The checkpoint's sizes and dtype, named as stored (PyTorch's names:
    /// a file's `U8` tensor is `uint8`, though it would be read as int64).
    pub found: (Vec<usize>, String),
}

/// Why a load was refused. Nothing was written: the module is as it was.
#[derive(Clone, Debug, Default, PartialEq, Eq, thiserror::Error)]
pub struct LoadError {
    /// Keys of the module that the state dict lacks.
    pub missing_keys: Vec<String>,
    /// Keys of the state dict that the module lacks, each with the closest
    /// missing key when one is near (a likely typo or renamed layer).
    pub unexpected_keys: Vec<(String, Option<String>)>,
    /// Keys whose sizes or dtype do not fit.
    pub mismatched: Vec<Mismatch>,
    /// A device failure while copying values.
    pub device: Option<String>,
}

impl LoadError {
    /// A load that failed on the device side.
    pub fn device(e: forma_core::Error) -> Self {
        LoadError {
            device: Some(e.to_string()),
            ..LoadError::default()
        }
    }

    fn is_empty(&self) -> bool {
        self.missing_keys.is_empty()
            && self.unexpected_keys.is_empty()
            && self.mismatched.is_empty()
            && self.device.is_none()
    }
}

/// How many entries of each kind a [`LoadError`] message lists before "and
/// K more" (a hostile file can hold thousands of bad keys).
pub const LISTED_IN_MESSAGE: usize = 20;

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let more = |f: &mut fmt::Formatter<'_>, n: usize, what: &str| {
            if n > LISTED_IN_MESSAGE {
                write!(f, "\n  ... and {} more {what}", n - LISTED_IN_MESSAGE)
            } else {
                Ok(())
            }
        };
        write!(f, "error(s) in loading state_dict:")?;
        if !self.missing_keys.is_empty() {
            let shown: Vec<_> = self
                .missing_keys
                .iter()
                .take(LISTED_IN_MESSAGE)
                .map(|k| header::shown_bare(k))
                .collect();
            write!(f, "\n  missing keys: {}", shown.join(", "))?;
            more(f, self.missing_keys.len(), "missing keys")?;
        }
        for (k, hint) in self.unexpected_keys.iter().take(LISTED_IN_MESSAGE) {
            write!(f, "\n  unexpected key: {}", header::shown_bare(k))?;
            if let Some(h) = hint {
                write!(f, " (did you mean {}?)", header::shown_bare(h))?;
            }
        }
        more(f, self.unexpected_keys.len(), "unexpected keys")?;
        for m in self.mismatched.iter().take(LISTED_IN_MESSAGE) {
            write!(
                f,
                "\n  {}: the checkpoint has {} {} but the model needs {} {}",
                header::shown_bare(&m.key),
                fmt_dims(&m.found.0),
                m.found.1,
                fmt_dims(&m.expected.0),
                m.expected.1
            )?;
        }
        more(f, self.mismatched.len(), "mismatched keys")?;
        if let Some(d) = &self.device {
            write!(f, "\n  device: {d}")?;
        }
        Ok(())
    }
}

/// Whether values of `from` may be stored in a tensor of `to` (floats among
/// floats, integers among integers, bools as bools).
fn convertible(from: DType, to: DType) -> bool {
    let class = |d: DType| match d {
        _ if d.is_float() => 0,
        DType::Bool => 2,
        _ => 1,
    };
    class(from) == class(to)
}

/// Hints are given for at most this many unexpected keys (the ones the
/// message lists), between names of at most [`HINT_NAME_LEN`] bytes, and
/// within a budget of [`HINT_BUDGET`] distance-table cells in all: a hostile
/// file cannot make a refusal slow.
const HINT_KEYS: usize = LISTED_IN_MESSAGE;
const HINT_NAME_LEN: usize = 256;
const HINT_BUDGET: usize = 20_000_000;

/// Levenshtein distance between `a` and `b` if it is at most `max`, else
/// `None`; counts the table cells it fills against `budget` (`None` once
/// the budget is spent). The common prefix and suffix are trimmed first,
/// which is where keys of one model agree.
fn edit_distance_within(a: &str, b: &str, max: usize, budget: &mut usize) -> Option<usize> {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let pre = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let (a, b) = (&a[pre..], &b[pre..]);
    let suf = a
        .iter()
        .rev()
        .zip(b.iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let (a, b) = (&a[..a.len() - suf], &b[..b.len() - suf]);
    if a.len().abs_diff(b.len()) > max {
        return None;
    }
    let cells = (a.len() + 1) * (b.len() + 1);
    *budget = budget.checked_sub(cells)?;
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, &ca) in a.iter().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        let mut best = row[0];
        for (j, &cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(cur + 1);
            best = best.min(row[j + 1]);
            prev = cur;
        }
        if best > max {
            return None;
        }
    }
    (row[b.len()] <= max).then_some(row[b.len()])
}

/// The candidate nearest `key` within a third of the longer name's length,
/// if any (a likely typo or renamed layer).
fn closest<'a>(key: &str, candidates: &'a [String], budget: &mut usize) -> Option<&'a String> {
    if key.len() > HINT_NAME_LEN {
        return None;
    }
    let mut best: Option<(usize, &String)> = None;
    for c in candidates.iter().filter(|c| c.len() <= HINT_NAME_LEN) {
        let max = key.len().max(c.len()) / 3;
        let max = best.map_or(max, |(d, _)| max.min(d.saturating_sub(1)));
        if let Some(d) = edit_distance_within(key, c, max, budget) {
            best = Some((d, c));
        }
        if *budget == 0 {
            break;
        }
    }
    best.map(|(_, c)| c)
}

/// Whether a key the state dict lacks is filled in rather than missing, as
/// PyTorch does: BatchNorm's `num_batches_tracked` (absent from checkpoints
/// written before PyTorch 0.4.1, and from many converted ones) keeps the
/// module's own counter, which `_NormBase._load_from_state_dict` does for
/// every state dict without version metadata (every safetensors file).
fn filled_in_when_missing(key: &str, info: &TensorInfo) -> bool {
    let last = key.rsplit('.').next().unwrap_or(key);
    last == "num_batches_tracked" && info.dims.is_empty() && info.dtype == DType::I64
}

/// The persistent tensors of a module, in order.
fn expected<M: Module>(m: &M) -> Vec<(String, TensorInfo)> {
    struct Spec(Vec<(String, TensorInfo)>);
    impl Visitor for Spec {
        fn tensor<S: Shape, E: Dtype, D: Backend>(&mut self, cx: &Cx, t: &Tensor<S, E, D>) {
            if cx.role() != Role::NonPersistentBuffer {
                self.0.push((cx.path().to_string(), TensorInfo::of(t)));
            }
        }
    }
    let mut s = Spec(Vec::new());
    m.visit(&mut Cx::new(), &mut s);
    s.0
}

pub(crate) fn collect<M: Module>(m: &M) -> forma_core::Result<StateDict> {
    struct Collect(StateDict, Option<forma_core::Error>);
    impl Visitor for Collect {
        fn tensor<S: Shape, E: Dtype, D: Backend>(&mut self, cx: &Cx, t: &Tensor<S, E, D>) {
            if cx.role() == Role::NonPersistentBuffer || self.1.is_some() {
                return;
            }
            match t.try_to_data() {
                Ok(d) => self.0.insert(cx.path(), d),
                Err(e) => self.1 = Some(e),
            }
        }
    }
    let mut c = Collect(StateDict::new(), None);
    m.visit(&mut Cx::new(), &mut c);
    match c.1 {
        Some(e) => Err(e),
        None => Ok(c.0),
    }
}

/// What a load reads: a state dict in memory, or a file's entries read
/// from its header and converted one at a time.
pub(crate) trait Source {
    /// The keys, in order.
    fn keys(&self) -> Vec<&str>;
    /// The sizes, the dtype the values would be read as (`None` when Forma
    /// cannot hold it) and the dtype's name as stored.
    fn info(&self, key: &str) -> Option<(&[usize], Option<DType>, &'static str)>;
    /// The values of `key`, read only once every check has passed.
    fn data(&self, key: &str) -> Result<Cow<'_, TensorData>, String>;
}

impl Source for StateDict {
    fn keys(&self) -> Vec<&str> {
        StateDict::keys(self).collect()
    }
    fn info(&self, key: &str) -> Option<(&[usize], Option<DType>, &'static str)> {
        self.get(key)
            .map(|d| (d.dims(), Some(d.dtype()), d.dtype().torch_name()))
    }
    fn data(&self, key: &str) -> Result<Cow<'_, TensorData>, String> {
        self.get(key)
            .map(Cow::Borrowed)
            .ok_or_else(|| format!("`{key}` vanished"))
    }
}

pub(crate) fn load<M: Module>(
    m: &mut M,
    sd: &impl Source,
    options: LoadOptions,
) -> Result<LoadReport, LoadError> {
    let want = expected(m);
    load_expected(m, &want, sd, options)
}

/// [`load`] given the module's persistent tensors (`expected(m)`), for a
/// caller that needed them first.
pub(crate) fn load_expected<M: Module>(
    m: &mut M,
    want: &[(String, TensorInfo)],
    sd: &impl Source,
    options: LoadOptions,
) -> Result<LoadReport, LoadError> {
    let mut err = LoadError::default();
    for (key, info) in want {
        match sd.info(key) {
            None if filled_in_when_missing(key, info) => {}
            None => err.missing_keys.push(key.clone()),
            Some((dims, read_as, stored))
                if dims != info.dims.as_slice()
                    || !read_as.is_some_and(|d| convertible(d, info.dtype)) =>
            {
                err.mismatched.push(Mismatch {
                    key: key.clone(),
                    expected: (info.dims.clone(), info.dtype),
                    found: (dims.to_vec(), stored.to_string()),
                })
            }
            Some(_) => {}
        }
    }
    let known: std::collections::HashSet<&str> = want.iter().map(|(k, _)| k.as_str()).collect();
    let unexpected: Vec<&str> = sd
        .keys()
        .into_iter()
        .filter(|k| !known.contains(k))
        .collect();
    let report = LoadReport {
        missing_keys: err.missing_keys.clone(),
        unexpected_keys: unexpected.iter().map(|k| k.to_string()).collect(),
    };
    if options.strict {
        // Hints only where the message will show them.
        let mut budget = HINT_BUDGET;
        err.unexpected_keys = unexpected
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let hint = (i < HINT_KEYS)
                    .then(|| closest(k, &err.missing_keys, &mut budget).cloned())
                    .flatten();
                (k.to_string(), hint)
            })
            .collect();
    } else {
        err.missing_keys.clear();
    }
    if !err.is_empty() {
        return Err(err);
    }

    struct Apply<'a, S>(&'a S, Option<String>);
    impl<S: Source> VisitorMut for Apply<'_, S> {
        fn tensor<Sh: Shape, E: Dtype, D: Backend>(&mut self, cx: &Cx, t: &mut Tensor<Sh, E, D>) {
            if cx.role() == Role::NonPersistentBuffer || self.1.is_some() {
                return;
            }
            if self.0.info(cx.path()).is_none() {
                return;
            }
            let written = self
                .0
                .data(cx.path())
                .and_then(|d| t.try_assign_data(&d).map_err(|e| e.to_string()));
            if let Err(e) = written {
                self.1 = Some(e);
            }
        }
    }
    let mut apply = Apply(sd, None);
    m.visit_mut(&mut Cx::new(), &mut apply);
    match apply.1 {
        Some(e) => Err(LoadError {
            device: Some(e),
            ..LoadError::default()
        }),
        None => Ok(report),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_near_misses_only() {
        let missing = vec!["layers.0.weight".to_string(), "head.bias".to_string()];
        let mut budget = HINT_BUDGET;
        assert_eq!(
            closest("layers.0.wieght", &missing, &mut budget),
            Some(&"layers.0.weight".to_string())
        );
        assert_eq!(closest("encoder.pos", &missing, &mut budget), None);
        let mut none = 0;
        assert_eq!(
            closest("layers.0.wieght", &missing, &mut none),
            None,
            "no budget"
        );
    }

    #[test]
    fn the_bounded_distance_agrees_with_the_full_one() {
        let full = |a: &str, b: &str| {
            let b: Vec<char> = b.chars().collect();
            let mut row: Vec<usize> = (0..=b.len()).collect();
            for (i, ca) in a.chars().enumerate() {
                let mut prev = row[0];
                row[0] = i + 1;
                for (j, &cb) in b.iter().enumerate() {
                    let cur = row[j + 1];
                    row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(cur + 1);
                    prev = cur;
                }
            }
            row[b.len()]
        };
        let words = [
            "",
            "a",
            "ab",
            "layer.1.weight",
            "layer.10.weight",
            "lyaer.1.wieght",
            "bias",
            "abcabc",
        ];
        for a in words {
            for b in words {
                let d = full(a, b);
                for max in 0..8 {
                    let mut budget = usize::MAX;
                    let got = edit_distance_within(a, b, max, &mut budget);
                    assert_eq!(got, (d <= max).then_some(d), "{a:?} {b:?} max {max}");
                }
            }
        }
    }

    #[test]
    fn remove_keeps_order_and_lookup() {
        let d = || TensorData::from_vec(&[1.0f32], vec![1]).unwrap();
        let mut sd: StateDict = ["a", "b", "c"]
            .iter()
            .map(|k| (k.to_string(), d()))
            .collect();
        sd.remove("a");
        assert_eq!(sd.keys().collect::<Vec<_>>(), ["b", "c"]);
        assert!(sd.get("c").is_some());
    }
}
