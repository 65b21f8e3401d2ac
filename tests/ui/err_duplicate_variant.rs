flash_macros::attention! {
    pub Same {
        head_dim: 128,
        dtype: bf16,
    }
    pub Same {
        head_dim: 64,
        dtype: f16,
    }
}

fn main() {}
