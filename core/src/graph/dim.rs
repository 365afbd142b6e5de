//! Sizes in a captured graph: a number, or an expression of the symbols
//! that stand for the `Dyn` sizes of the inputs (`batch`, `seq`), so that a
//! graph captured at one size runs at any other.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

/// One size of a value in a [`crate::graph::Graph`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Dim {
    /// A size fixed by the program (a static dim, or one computed from them).
    Fixed(usize),
    /// A size that follows the inputs' symbolic sizes.
    Sym(Arc<Expr>),
}

/// A symbolic size.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Expr {
    /// An input's `Dyn` size, by its symbol name.
    Var(String),
    /// `a + b`.
    Add(Dim, Dim),
    /// `a - b`.
    Sub(Dim, Dim),
    /// `a * b`.
    Mul(Dim, Dim),
    /// `a / b`, rounding down.
    Div(Dim, Dim),
}

impl Dim {
    /// The symbol `name`.
    pub fn var(name: &str) -> Dim {
        Dim::Sym(Arc::new(Expr::Var(name.to_string())))
    }

    /// The number, when this size is fixed.
    pub fn fixed(&self) -> Option<usize> {
        match self {
            Dim::Fixed(n) => Some(*n),
            Dim::Sym(_) => None,
        }
    }

    /// The size when every symbol takes its value in `env`; `None` when a
    /// symbol is missing or a step underflows or divides by zero.
    pub fn eval(&self, env: &HashMap<String, usize>) -> Option<usize> {
        match self {
            Dim::Fixed(n) => Some(*n),
            Dim::Sym(e) => match &**e {
                Expr::Var(v) => env.get(v).copied(),
                Expr::Add(a, b) => a.eval(env)?.checked_add(b.eval(env)?),
                Expr::Sub(a, b) => a.eval(env)?.checked_sub(b.eval(env)?),
                Expr::Mul(a, b) => a.eval(env)?.checked_mul(b.eval(env)?),
                Expr::Div(a, b) => a.eval(env)?.checked_div(b.eval(env)?),
            },
        }
    }

    /// The symbols this size reads.
    pub fn symbols(&self, out: &mut Vec<String>) {
        if let Dim::Sym(e) = self {
            match &**e {
                Expr::Var(v) => {
                    if !out.contains(v) {
                        out.push(v.clone());
                    }
                }
                Expr::Add(a, b) | Expr::Sub(a, b) | Expr::Mul(a, b) | Expr::Div(a, b) => {
                    a.symbols(out);
                    b.symbols(out);
                }
            }
        }
    }

    /// `self + other`, folding numbers.
    pub fn add(&self, other: &Dim) -> Dim {
        match (self, other) {
            (Dim::Fixed(a), Dim::Fixed(b)) => Dim::Fixed(a + b),
            (x, Dim::Fixed(0)) | (Dim::Fixed(0), x) => x.clone(),
            _ => Dim::Sym(Arc::new(Expr::Add(self.clone(), other.clone()))),
        }
    }

    /// `self - other`, folding numbers (`x - x` is 0).
    pub fn sub(&self, other: &Dim) -> Dim {
        match (self, other) {
            (Dim::Fixed(a), Dim::Fixed(b)) if a >= b => Dim::Fixed(a - b),
            (x, Dim::Fixed(0)) => x.clone(),
            (a, b) if a == b => Dim::Fixed(0),
            _ => Dim::Sym(Arc::new(Expr::Sub(self.clone(), other.clone()))),
        }
    }

    /// `self * other`, folding numbers.
    pub fn mul(&self, other: &Dim) -> Dim {
        match (self, other) {
            (Dim::Fixed(a), Dim::Fixed(b)) => Dim::Fixed(a * b),
            (x, Dim::Fixed(1)) | (Dim::Fixed(1), x) => x.clone(),
            _ => Dim::Sym(Arc::new(Expr::Mul(self.clone(), other.clone()))),
        }
    }

    /// `self / other` rounding down, folding numbers and cancelling a
    /// factor of a product (`(batch * 12) / 12` is `batch`).
    pub fn div(&self, other: &Dim) -> Dim {
        match (self, other) {
            (Dim::Fixed(a), Dim::Fixed(b)) if *b > 0 => Dim::Fixed(a / b),
            (x, Dim::Fixed(1)) => x.clone(),
            (a, b) if a == b => Dim::Fixed(1),
            _ => {
                let mut factors = self.factors();
                if let Some(i) = factors.iter().position(|f| f == other) {
                    factors.remove(i);
                    return product(&factors);
                }
                Dim::Sym(Arc::new(Expr::Div(self.clone(), other.clone())))
            }
        }
    }

    /// The factors of a product (itself for anything else).
    pub fn factors(&self) -> Vec<Dim> {
        match self {
            Dim::Sym(e) => match &**e {
                Expr::Mul(a, b) => {
                    let mut f = a.factors();
                    f.extend(b.factors());
                    f
                }
                _ => vec![self.clone()],
            },
            Dim::Fixed(_) => vec![self.clone()],
        }
    }
}

/// The product of `dims` (1 for none).
pub fn product(dims: &[Dim]) -> Dim {
    dims.iter().fold(Dim::Fixed(1), |acc, d| acc.mul(d))
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Fixed(n) => write!(f, "{n}"),
            Dim::Sym(e) => match &**e {
                Expr::Var(v) => f.write_str(v),
                Expr::Add(a, b) => write!(f, "({a} + {b})"),
                Expr::Sub(a, b) => write!(f, "({a} - {b})"),
                Expr::Mul(a, b) => write!(f, "{a}*{b}"),
                Expr::Div(a, b) => write!(f, "({a} // {b})"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn products_cancel_and_evaluate() {
        let (b, s) = (Dim::var("batch"), Dim::var("seq"));
        let bs = b.mul(&s);
        assert_eq!(bs.to_string(), "batch*seq");
        assert_eq!(bs.div(&s), b);
        assert_eq!(bs.mul(&Dim::Fixed(12)).div(&Dim::Fixed(12)), bs);
        let env = HashMap::from([("batch".to_string(), 3), ("seq".to_string(), 5)]);
        assert_eq!(bs.sub(&Dim::Fixed(1)).eval(&env), Some(14));
        assert_eq!(Dim::Fixed(6).div(&Dim::Fixed(4)), Dim::Fixed(1));
        assert_eq!(s.sub(&s), Dim::Fixed(0));
    }
}
