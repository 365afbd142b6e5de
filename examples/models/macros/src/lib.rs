//! `hf_config!`: a Hugging Face `config.json` read when the program is
//! built into the `forma-models` type it describes. Use it through
//! `forma_models::hf_config!`, whose documentation shows it.

use forma_models_config::{Config, ConfigError, ModelType};
use proc_macro::TokenStream;
use quote::{format_ident, quote};
use std::path::PathBuf;
use syn::parse::{Parse, ParseStream};
use syn::{parse_macro_input, Attribute, GenericParam, Generics, Ident, LitStr, Token, Visibility};

/// `#[attrs] vis type Name<E, D> = "path/config.json";` (the parameters
/// optional).
struct Alias {
    attrs: Vec<Attribute>,
    vis: Visibility,
    name: Ident,
    generics: Generics,
    path: LitStr,
}

impl Parse for Alias {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis = input.parse()?;
        input.parse::<Token![type]>()?;
        let name = input.parse()?;
        let generics: Generics = input.parse()?;
        if let Some(p) = generics
            .params
            .iter()
            .find(|p| !matches!(p, GenericParam::Type(_)))
        {
            return Err(syn::Error::new_spanned(
                p,
                "hf_config!: the alias takes the element type and device only (`type Model<E, D>`)",
            ));
        }
        input.parse::<Token![=]>()?;
        let path = input.parse()?;
        input.parse::<Option<Token![;]>>()?;
        Ok(Alias {
            attrs,
            vis,
            name,
            generics,
            path,
        })
    }
}

/// See `forma_models::hf_config!`.
#[proc_macro]
pub fn hf_config(input: TokenStream) -> TokenStream {
    let alias = parse_macro_input!(input as Alias);
    match expand(&alias) {
        Ok(tokens) => tokens.into(),
        Err(message) => syn::Error::new(alias.path.span(), message)
            .to_compile_error()
            .into(),
    }
}

/// The file, relative to the source file the macro is written in (as
/// `include_str!` resolves it), or to the crate's manifest where the
/// compiler does not tell the source file.
fn resolve(path: &LitStr) -> PathBuf {
    let given = PathBuf::from(path.value());
    if given.is_absolute() {
        return given;
    }
    // The source file's path may be relative to the compiler's working
    // directory; the result is absolute, for `include_bytes!` in the
    // expansion, which would resolve a relative one from the source file.
    let dir = path
        .span()
        .unwrap()
        .local_file()
        .and_then(|file| file.parent().map(PathBuf::from))
        .or_else(|| std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from))
        .unwrap_or_default();
    let dir = match std::env::current_dir() {
        Ok(cwd) => cwd.join(dir),
        Err(_) => dir,
    };
    dir.join(given)
}

fn expand(alias: &Alias) -> Result<proc_macro2::TokenStream, String> {
    let shown = alias.path.value();
    let file = resolve(&alias.path);
    let text = std::fs::read_to_string(&file)
        .map_err(|e| format!("hf_config!: cannot read {shown} ({}): {e}", file.display()))?;
    let described = Config::parse(&text, shown.as_str())
        .and_then(|config| ModelType::of(&config))
        .map_err(|e| match e {
            ConfigError::Mismatch {
                path,
                field,
                found,
                expected,
                ..
            } => format!(
                "hf_config!: {path} has {field} = {found}, which forma_models does not \
                 implement (it needs {expected})"
            ),
            e => format!("hf_config!: {e}"),
        })?;

    let Alias {
        attrs,
        vis,
        name,
        generics,
        ..
    } = alias;
    let params = generics.type_params().map(|p| &p.ident);
    let ty = described
        .path
        .split("::")
        .map(|segment| format_ident!("{segment}"));
    let sizes = described
        .args
        .iter()
        .map(|a| proc_macro2::Literal::usize_unsuffixed(a.value));
    let absolute = file.display().to_string();
    let listed: Vec<String> = described
        .args
        .iter()
        .map(|a| format!("`{}` = {} = {}", a.param, a.field, a.value))
        .collect();
    let doc = format!(
        "`{}`, as `{shown}` describes it ({}).",
        described.written(),
        listed.join(", ")
    );
    Ok(quote! {
        #(#attrs)*
        #[doc = ""]
        #[doc = #doc]
        #vis type #name #generics = ::forma_models::#(#ty)::*<#(#sizes,)* #(#params),*>;
        // Rebuilds when the file changes.
        const _: &[u8] = include_bytes!(#absolute);
    })
}
