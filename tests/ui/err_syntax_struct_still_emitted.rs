flash_macros::attention! {
    pub Good {
        head_dim: 128,
        dtype: bf16,
    }
    pub Broken {
        head_dim: 128,
        dtype: bf16,
        params: { cap f32 },
    }
}

// After a syntax error the unit structs are still emitted: only the syntax error is reported.
fn main() {
    let _ = (Good, Broken);
}
