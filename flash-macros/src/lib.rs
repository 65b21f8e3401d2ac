//! The `attention!` macro: declare attention variants in Rust source, checked at compile time.
//!
//! It parses and validates the declarations with the same code the `flash` command uses for
//! `.flash` files (`flash_dsl::parse` and `flash_dsl::validate`), reports every error at the
//! offending tokens, and emits only Rust: a unit struct per variant, its typed params struct
//! and the `flash_runtime::Variant` impl. It never generates CUDA: the runtime re-parses
//! `Variant::SOURCE` and runs the generator itself, so the kernels follow the flash-runtime
//! version the program links, and `Variant::generate` hands them out for snapshot tests.
//!
//! The language is described in the README's "The language" section and `docs/grammar.md`.

#![warn(missing_docs)]

use flash_dsl::ast::Decl;
use flash_dsl::diag::Report;
use flash_dsl::spec::{ParamKind, ScalarTy, VariantSpec};
use flash_dsl::validate::validate_reports;
use proc_macro2::{Ident, Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};

/// Declare attention variants.
///
/// ```
/// use flash_runtime::Variant;
///
/// flash_macros::attention! {
///     /// Gemma-2 local layers: a causal sliding window with soft-capped logits.
///     pub GemmaLocal {
///         head_dim: 128,
///         dtype: bf16,
///         params: { cap: f32 },
///         mask: causal && q - k < 4096,
///         score: softcap(s, cap),
///     }
///     /// Document masking: a query sees only keys of its own document.
///     Document {
///         head_dim: 64,
///         dtype: f16,
///         params: { doc: [i32; batch, seq] },
///         mask: doc[b, q] == doc[b, k],
///     }
/// }
///
/// assert_eq!(GemmaLocal::NAME, "GemmaLocal");
/// let params = GemmaLocalParams::new(50.0);
/// assert_eq!(params.cap, 50.0);
/// let spec = Document::spec().unwrap();
/// assert_eq!((spec.head_dim_qk, spec.params.len()), (64, 1));
/// ```
///
/// Mistakes are compile errors at the offending tokens, all of them at once:
///
/// ```compile_fail
/// flash_macros::attention! {
///     pub Broken { head_dim: 100, dtype: bf16, mask: q >= kk }
/// }
/// ```
///
/// For each declaration `Name` this emits:
/// - `struct Name;` (unit, `Debug + Clone + Copy + Default`) carrying the doc comment;
/// - `struct NameParams<'a>` with one public field per declared parameter, in order: tensors as
///   `&'a CudaSlice<f32 | i32>`, scalars as `f32`/`i32`, plus a public `_marker: PhantomData`;
///   `NameParams::new(..)` takes the parameters in declaration order and fills the marker;
/// - `impl flash_runtime::Variant for Name`.
///
/// Visibility follows the declaration (`pub Name` or private `Name`). Every error of every
/// declaration is reported at once, at the offending tokens; the unit structs are still emitted
/// so that the rest of the crate (and the IDE) keeps resolving the names.
#[proc_macro]
pub fn attention(input: proc_macro::TokenStream) -> proc_macro::TokenStream {
    expand(input.into()).into()
}

fn expand(input: TokenStream) -> TokenStream {
    let decls = match flash_dsl::parse::parse_tokens(input.clone()) {
        Ok(d) => d,
        Err(e) => {
            let mut out = e.to_compile_error();
            out.extend(guess_unit_structs(input));
            return out;
        }
    };
    let mut out = TokenStream::new();
    let mut errors: Option<syn::Error> = None;
    let mut seen = std::collections::HashMap::new();
    for decl in &decls {
        let name = decl.name.to_string();
        // Kernel entry points are lower case: names differing only by case would share one.
        if let Some(first) = seen.insert(name.to_lowercase(), name.clone()) {
            let msg = if first == name {
                format!("duplicate variant name `{name}`")
            } else {
                format!("variant names `{first}` and `{name}` differ only by case; kernel and file names are lower case, so they would collide")
            };
            push_error(&mut errors, &Report::at(decl.name.span(), msg));
            continue;
        }
        match validate_reports(decl) {
            Ok(spec) => out.extend(emit(decl, &spec)),
            Err(reports) => {
                for r in &reports {
                    push_error(&mut errors, r);
                }
                out.extend(emit_unit_struct(decl));
            }
        }
    }
    if let Some(e) = errors {
        out.extend(e.to_compile_error());
    }
    out
}

/// After a syntax error: unit structs for every top-level `pub? Name { .. }` that can still be
/// recognised, so that uses of the names elsewhere do not pile more errors on the real one.
fn guess_unit_structs(input: TokenStream) -> TokenStream {
    use proc_macro2::{Delimiter, TokenTree};
    let tts: Vec<TokenTree> = input.into_iter().collect();
    let mut out = TokenStream::new();
    let mut seen = std::collections::HashSet::new();
    for (i, pair) in tts.windows(2).enumerate() {
        let (TokenTree::Ident(name), TokenTree::Group(g)) = (&pair[0], &pair[1]) else {
            continue;
        };
        if g.delimiter() != Delimiter::Brace || name == "pub" || !seen.insert(name.to_string()) {
            continue;
        }
        let is_pub = i > 0 && matches!(&tts[i - 1], TokenTree::Ident(p) if p == "pub");
        let vis = if is_pub {
            quote!(pub)
        } else {
            TokenStream::new()
        };
        out.extend(quote! {
            #[derive(Debug, Clone, Copy, Default)]
            #vis struct #name;
        });
    }
    out
}

/// Add a report as a `syn::Error` spanning from its first to its last token.
fn push_error(acc: &mut Option<syn::Error>, r: &Report) {
    let mut first = Ident::new("x", r.span());
    let last = {
        let mut i = Ident::new("x", r.end);
        i.set_span(r.end);
        i
    };
    first.set_span(r.span());
    let err = syn::Error::new_spanned(quote!(#first #last), r.message());
    match acc {
        Some(a) => a.combine(err),
        None => *acc = Some(err),
    }
}

fn vis(decl: &Decl) -> TokenStream {
    match &decl.vis {
        Some(p) => quote!(#p),
        None => TokenStream::new(),
    }
}

fn doc_attrs(decl: &Decl) -> TokenStream {
    let attrs = &decl.attrs;
    quote!(#(#attrs)*)
}

fn emit_unit_struct(decl: &Decl) -> TokenStream {
    let vis = vis(decl);
    let name = &decl.name;
    let docs = if decl
        .attrs
        .iter()
        .all(|a| flash_dsl::ast::doc_text(a).is_some())
    {
        doc_attrs(decl)
    } else {
        TokenStream::new()
    };
    quote! {
        #docs
        #[derive(Debug, Clone, Copy, Default)]
        #vis struct #name;
    }
}

fn emit(decl: &Decl, spec: &VariantSpec) -> TokenStream {
    let vis = vis(decl);
    let name = &decl.name;
    let name_str = name.to_string();
    let source = decl.tokens.to_string();
    let params_ty = format_ident!("{}Params", name);
    let unit = emit_unit_struct(decl);
    let rt = quote!(::flash_runtime);
    let slice = quote!(#rt::cudarc::driver::CudaSlice);

    let mut fields = Vec::new();
    let mut ctor_args = Vec::new();
    let mut field_names = Vec::new();
    let mut args = Vec::new();
    for p in &spec.params {
        let f = Ident::new(&p.name, Span::call_site());
        let (ty, arg, desc) = match &p.kind {
            ParamKind::Scalar(ScalarTy::F32) => (
                quote!(f32),
                quote!(#rt::ParamArg::F32(params.#f)),
                "f32".to_string(),
            ),
            ParamKind::Scalar(ScalarTy::I32) => (
                quote!(i32),
                quote!(#rt::ParamArg::I32(params.#f)),
                "i32".to_string(),
            ),
            ParamKind::Tensor { elem, dims } => {
                let dims: Vec<String> = dims
                    .iter()
                    .map(|d| match d {
                        flash_dsl::spec::Dim::Batch => "batch".to_string(),
                        flash_dsl::spec::Dim::Heads => "heads".to_string(),
                        flash_dsl::spec::Dim::Seq => "seq".to_string(),
                        flash_dsl::spec::Dim::Fixed(n) => n.to_string(),
                        flash_dsl::spec::Dim::SeqBlocks(n) => format!("seq / {n}"),
                    })
                    .collect();
                let desc = format!("[{}; {}], row-major", elem.name(), dims.join(", "));
                match elem {
                    ScalarTy::F32 => (
                        quote!(&'a #slice<f32>),
                        quote!(#rt::ParamArg::tensor_f32(params.#f, stream)),
                        desc,
                    ),
                    ScalarTy::I32 => (
                        quote!(&'a #slice<i32>),
                        quote!(#rt::ParamArg::tensor_i32(params.#f, stream)),
                        desc,
                    ),
                }
            }
        };
        let doc = format!("Parameter `{}`: {desc}.", p.name);
        fields.push(quote!(#[doc = #doc] pub #f: #ty,));
        ctor_args.push(quote!(#f: #ty));
        field_names.push(f);
        args.push(arg);
    }
    if spec.dropout.is_some() {
        // The dropout generator's state travels with the params, after the declared ones.
        let (seed, offset) = (
            Ident::new("dropout_seed", Span::call_site()),
            Ident::new("dropout_offset", Span::call_site()),
        );
        fields.push(quote!(
            #[doc = "Seed of the dropout generator: the same seed and offset give the same mask in the forward and the backward."]
            pub #seed: u64,
        ));
        fields.push(quote!(
            #[doc = "Offset of the dropout generator: advance it between steps that must draw different masks."]
            pub #offset: u64,
        ));
        ctor_args.push(quote!(#seed: u64));
        ctor_args.push(quote!(#offset: u64));
        field_names.push(seed.clone());
        field_names.push(offset.clone());
        args.push(quote!(#rt::ParamArg::dropout(params.#seed, params.#offset)));
    }
    let params_doc = format!("Runtime parameters of [`{name_str}`], in declaration order.");
    let new_doc = format!("The parameters of [`{name_str}`], in declaration order.");
    let span = name.span();
    let impl_block = quote_spanned! {span=>
        impl #rt::Variant for #name {
            const NAME: &'static str = #name_str;
            const SOURCE: &'static str = #source;
            type Params<'a> = #params_ty<'a>;
            fn param_args<'a>(
                params: &Self::Params<'a>,
                stream: &#rt::cudarc::driver::CudaStream,
            ) -> ::std::vec::Vec<#rt::ParamArg<'a>> {
                let _ = (&params, &stream);
                ::std::vec![#(#args),*]
            }
        }
    };
    quote! {
        #unit

        #[doc = #params_doc]
        #[derive(Clone, Copy)]
        #vis struct #params_ty<'a> {
            #(#fields)*
            /// Ties the struct to `'a` even without tensor parameters; `PhantomData`.
            pub _marker: ::core::marker::PhantomData<&'a ()>,
        }

        impl<'a> #params_ty<'a> {
            #[doc = #new_doc]
            #[allow(clippy::too_many_arguments, clippy::new_without_default)]
            pub fn new(#(#ctor_args),*) -> Self {
                Self { #(#field_names,)* _marker: ::core::marker::PhantomData }
            }
        }

        #impl_block
    }
}
