flash_macros::attention! {
    pub Bad {
        head_dim: 100,
        dtype: bf16,
    }
}

fn main() {}
