flash_macros::attention! {
    pub Bad {
        head_dim: 128,
        dtype: bf16,
        window_size: 128,
    }
}

fn main() {}
