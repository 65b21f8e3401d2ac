flash_macros::attention! {
    pub Bad {
        head_dim: 128,
        dtype: bf16,
        mask: k - q,
    }
}

fn main() {}
