flash_macros::attention! {
    pub Bad {
        head_dim: 0,
        dtype: bf16,
    }
}

fn main() {}
