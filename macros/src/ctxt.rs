//! [`Ctxt`]: the errors found while reading a derive's input, collected so
//! that the user sees every mistake at once.

use proc_macro2::TokenStream;
use quote::ToTokens;
use std::cell::RefCell;
use std::fmt::Display;

/// Collects errors; must be consumed with [`Ctxt::check`] (dropping it
/// unchecked panics, so no error can be silently lost).
#[derive(Debug)]
pub struct Ctxt {
    errors: RefCell<Option<Vec<syn::Error>>>,
}

impl Ctxt {
    pub fn new() -> Self {
        Ctxt {
            errors: RefCell::new(Some(Vec::new())),
        }
    }

    /// Records `msg`, spanned on the tokens of `obj`.
    pub fn error_spanned_by<A: ToTokens, T: Display>(&self, obj: A, msg: T) {
        self.syn_error(syn::Error::new_spanned(obj.into_token_stream(), msg));
    }

    /// Records a parse error.
    pub fn syn_error(&self, err: syn::Error) {
        if let Some(errors) = self.errors.borrow_mut().as_mut() {
            errors.push(err);
        }
    }

    /// Consumes the context: `Err` with the `compile_error!`s of every
    /// recorded error, in the order they were found.
    pub fn check(self) -> Result<(), TokenStream> {
        let errors = self.errors.borrow_mut().take().unwrap_or_default();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.iter().map(syn::Error::to_compile_error).collect())
        }
    }
}

impl Drop for Ctxt {
    fn drop(&mut self) {
        if !std::thread::panicking() && self.errors.borrow().is_some() {
            panic!("forma-macros: Ctxt dropped without being checked");
        }
    }
}
