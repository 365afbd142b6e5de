//! Options of a parameter group as plain named values: how an optimizer's
//! hyperparameters travel in its exported state (as text, so a checkpoint can
//! keep them in a safetensors header), and the `options!` macro that writes an
//! options struct with PyTorch's defaults, builder methods and that mapping.

use super::OptimError;

/// A hyperparameter type that round-trips through text exactly.
pub trait OptionValue: Sized {
    /// The value as text (`f64`s in their shortest exact form).
    fn encode(&self) -> String;
    /// Parses what [`OptionValue::encode`] wrote.
    fn decode(text: &str) -> Option<Self>;
    /// What the text should look like, for error messages.
    const EXPECTED: &'static str;
}

impl OptionValue for f64 {
    fn encode(&self) -> String {
        // `{:?}` is the shortest text that parses back to the same bits
        // (`0.1`, `1e-8`, `inf`, `NaN`).
        format!("{self:?}")
    }
    fn decode(text: &str) -> Option<Self> {
        text.parse().ok()
    }
    const EXPECTED: &'static str = "a number";
}

impl OptionValue for bool {
    fn encode(&self) -> String {
        self.to_string()
    }
    fn decode(text: &str) -> Option<Self> {
        text.parse().ok()
    }
    const EXPECTED: &'static str = "`true` or `false`";
}

impl OptionValue for u64 {
    fn encode(&self) -> String {
        self.to_string()
    }
    fn decode(text: &str) -> Option<Self> {
        text.parse().ok()
    }
    const EXPECTED: &'static str = "a non-negative integer";
}

impl OptionValue for i64 {
    fn encode(&self) -> String {
        self.to_string()
    }
    fn decode(text: &str) -> Option<Self> {
        text.parse().ok()
    }
    const EXPECTED: &'static str = "an integer";
}

impl OptionValue for (f64, f64) {
    fn encode(&self) -> String {
        format!("{:?},{:?}", self.0, self.1)
    }
    fn decode(text: &str) -> Option<Self> {
        let (a, b) = text.split_once(',')?;
        Some((a.parse().ok()?, b.parse().ok()?))
    }
    const EXPECTED: &'static str = "two numbers `a,b`";
}

impl<T: OptionValue> OptionValue for Vec<T> {
    fn encode(&self) -> String {
        self.iter()
            .map(OptionValue::encode)
            .collect::<Vec<_>>()
            .join(";")
    }
    fn decode(text: &str) -> Option<Self> {
        if text.is_empty() {
            return Some(Vec::new());
        }
        text.split(';').map(T::decode).collect()
    }
    const EXPECTED: &'static str = "a `;`-separated list";
}

/// Parses `text` stored under `key` as a `T`.
pub(crate) fn decode_value<T: OptionValue>(key: &str, text: &str) -> Result<T, OptimError> {
    T::decode(text).ok_or_else(|| OptimError::BadValue {
        key: key.to_string(),
        value: text.to_string(),
        expected: T::EXPECTED,
    })
}

/// The options of a parameter group as named values.
pub trait OptionFields: Sized {
    /// Every option with its value as text, in declaration order.
    fn fields(&self) -> Vec<(&'static str, String)>;

    /// Sets the option `name` from text; `Ok(false)` when there is no such
    /// option.
    ///
    /// # Errors
    /// [`OptimError::BadValue`] when the text does not parse (`key` names the
    /// entry in error messages).
    fn set_field(&mut self, name: &str, text: &str, key: &str) -> Result<bool, OptimError>;
}

/// Writes an options struct: public fields with PyTorch's defaults, a
/// builder method per field, and [`OptionFields`].
macro_rules! options {
    (
        $(#[$meta:meta])*
        $name:ident {
            $(
                $(#[$fmeta:meta])*
                $field:ident : $ty:ty = $default:expr
            ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq)]
        pub struct $name {
            $(
                $(#[$fmeta])*
                pub $field: $ty,
            )*
        }

        impl Default for $name {
            fn default() -> Self {
                $name { $($field: $default),* }
            }
        }

        impl $name {
            $(
                #[doc = concat!("Sets `", stringify!($field), "`.")]
                #[must_use]
                pub fn $field(mut self, value: $ty) -> Self {
                    self.$field = value;
                    self
                }
            )*
        }

        impl $crate::optim::OptionFields for $name {
            fn fields(&self) -> Vec<(&'static str, String)> {
                vec![$((
                    stringify!($field),
                    $crate::optim::OptionValue::encode(&self.$field),
                )),*]
            }

            fn set_field(
                &mut self,
                name: &str,
                text: &str,
                key: &str,
            ) -> Result<bool, $crate::optim::OptimError> {
                match name {
                    $(stringify!($field) => {
                        self.$field = $crate::optim::options::decode_value(key, text)?;
                        Ok(true)
                    })*
                    _ => Ok(false),
                }
            }
        }
    };
}
pub(crate) use options;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_exactly() {
        for v in [0.1, 1e-8, 1.0 / 3.0, f64::INFINITY, -0.0, 5e-324] {
            assert_eq!(
                f64::decode(&v.encode()).map(f64::to_bits),
                Some(v.to_bits())
            );
        }
        assert!(f64::decode(&f64::NAN.encode()).is_some_and(f64::is_nan));
        assert_eq!(<(f64, f64)>::decode("0.9,0.999"), Some((0.9, 0.999)));
        assert_eq!(
            Vec::<f64>::decode(&vec![0.5, 0.25].encode()),
            Some(vec![0.5, 0.25])
        );
        assert_eq!(Vec::<f64>::decode(""), Some(vec![]));
        assert_eq!(bool::decode("yes"), None);
    }
}
