flash_macros::attention! {
    pub Bad {
        head_dim: 512,
        dtype: bf16,
    }
}

fn main() {}
