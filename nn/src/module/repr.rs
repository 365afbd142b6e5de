//! [`ReprNode`]: a module's printed form, laid out like PyTorch's
//! `Module.__repr__` (extra lines, then `(name): child` lines, indented by two)
//! and `ModuleList.__repr__` (runs of equal children collapsed to
//! `(0-5): 6 x Block(...)`).

use std::fmt;

/// One module in a repr tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReprNode {
    name: String,
    extra: String,
    children: Vec<(String, ReprNode)>,
    collapse_runs: bool,
    text: Option<String>,
}

impl ReprNode {
    /// A module named `name` (its type name) with its `extra_repr` text.
    pub fn new(name: impl Into<String>, extra: impl Into<String>) -> Self {
        ReprNode {
            name: name.into(),
            extra: extra.into(),
            children: Vec::new(),
            collapse_runs: false,
            text: None,
        }
    }

    /// A list (`ModuleList`): runs of equal children print once with a count.
    pub fn list(name: impl Into<String>) -> Self {
        ReprNode {
            collapse_runs: true,
            ..ReprNode::new(name, "")
        }
    }

    /// A line printed as is (a parameter inside a `ParameterList`).
    pub fn text(text: impl Into<String>) -> Self {
        ReprNode {
            text: Some(text.into()),
            ..ReprNode::new("", "")
        }
    }

    /// Adds a child under `key`; a flattened child (`key` empty) gives its own
    /// children to this node.
    pub fn child(&mut self, key: &str, node: ReprNode) {
        if key.is_empty() {
            self.children.extend(node.children);
        } else {
            self.children.push((key.to_string(), node));
        }
    }

    /// The children added so far.
    pub fn children(&self) -> &[(String, ReprNode)] {
        &self.children
    }

    /// The node with its `extra_repr` text rewritten by `f`.
    pub fn map_extra(mut self, f: impl FnOnce(&str) -> String) -> Self {
        self.extra = f(&self.extra);
        self
    }
}

/// Indents every line after the first by `n` spaces (PyTorch's `_addindent`).
fn add_indent(s: &str, n: usize) -> String {
    let mut lines = s.split('\n');
    let mut out = lines.next().unwrap_or_default().to_string();
    for l in lines {
        out.push('\n');
        out.push_str(&" ".repeat(n));
        out.push_str(l);
    }
    out
}

impl fmt::Display for ReprNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(t) = &self.text {
            return f.write_str(t);
        }
        let mut lines: Vec<String> = if self.extra.is_empty() {
            Vec::new()
        } else {
            self.extra.split('\n').map(str::to_string).collect()
        };
        let n_extra = lines.len();
        if self.collapse_runs {
            let reprs: Vec<(String, String)> = self
                .children
                .iter()
                .map(|(k, c)| (k.clone(), c.to_string()))
                .collect();
            let mut i = 0;
            while i < reprs.len() {
                let mut j = i;
                while j + 1 < reprs.len() && reprs[j + 1].1 == reprs[i].1 {
                    j += 1;
                }
                let line = if i == j {
                    format!("({}): {}", reprs[i].0, reprs[i].1)
                } else {
                    format!(
                        "({}-{}): {} x {}",
                        reprs[i].0,
                        reprs[j].0,
                        j - i + 1,
                        reprs[i].1
                    )
                };
                lines.push(add_indent(&line, 2));
                i = j + 1;
            }
        } else {
            for (k, c) in &self.children {
                lines.push(format!("({k}): {}", add_indent(&c.to_string(), 2)));
            }
        }
        write!(f, "{}(", self.name)?;
        if n_extra == 1 && lines.len() == 1 {
            f.write_str(&lines[0])?;
        } else if !lines.is_empty() {
            write!(f, "\n  {}\n", lines.join("\n  "))?;
        }
        f.write_str(")")
    }
}

/// Formats a float like Python's `repr` (`1e-05`, `0.1`, `1.0`), as PyTorch's
/// reprs print hyper-parameters: for a module's `extra_repr` that should
/// read like its PyTorch twin's.
///
/// ```
/// use forma::nn::module::py_float;
/// assert_eq!(py_float(1e-5), "1e-05");
/// assert_eq!(py_float(0.1), "0.1");
/// assert_eq!(py_float(1.0), "1.0");
/// ```
pub fn py_float(x: f64) -> String {
    if x != 0.0 && (x.abs() < 1e-4 || x.abs() >= 1e16) {
        let s = format!("{x:e}");
        match s.split_once('e') {
            Some((m, e)) => {
                let (sign, digits) = e.strip_prefix('-').map_or(("+", e), |d| ("-", d));
                format!("{m}e{sign}{digits:0>2}")
            }
            None => s,
        }
    } else if x.fract() == 0.0 {
        format!("{x:.1}")
    } else {
        format!("{x}")
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn floats_print_like_python() {
        assert_eq!(super::py_float(1e-5), "1e-05");
        assert_eq!(super::py_float(0.1), "0.1");
        assert_eq!(super::py_float(1.0), "1.0");
        assert_eq!(super::py_float(1e-12), "1e-12");
    }

    use super::*;

    #[test]
    fn prints_like_pytorch() {
        let lin = || ReprNode::new("Linear", "in_features=4, out_features=4, bias=True");
        let mut list = ReprNode::list("ModuleList");
        for i in 0..3 {
            list.child(&i.to_string(), lin());
        }
        list.child("3", ReprNode::new("ReLU", ""));
        let mut net = ReprNode::new("Net", "");
        net.child("layers", list);
        net.child("head", lin());
        assert_eq!(
            net.to_string(),
            "Net(\n  (layers): ModuleList(\n    (0-2): 3 x Linear(in_features=4, out_features=4, bias=True)\n    (3): ReLU()\n  )\n  (head): Linear(in_features=4, out_features=4, bias=True)\n)"
        );
    }
}
