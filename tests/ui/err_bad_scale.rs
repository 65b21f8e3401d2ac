flash_macros::attention! {
    pub Bad {
        head_dim: 128,
        dtype: bf16,
        scale: -0.5,
    }
}

fn main() {}
