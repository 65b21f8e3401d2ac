//! Validation into `VariantSpec`. (Owned by the front-end work.)
