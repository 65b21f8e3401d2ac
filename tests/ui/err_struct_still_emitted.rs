flash_macros::attention! {
    pub Bad {
        head_dim: 100,
        dtype: bf16,
    }
}

// The unit struct of a declaration with errors is still emitted, so using it adds no second
// error: the head dim is the only one reported.
fn main() {
    let _ = Bad;
}
