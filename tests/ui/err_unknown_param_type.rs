flash_macros::attention! {
    pub Bad {
        head_dim: 128,
        dtype: bf16,
        params: { cap: f64 },
    }
}

fn main() {}
