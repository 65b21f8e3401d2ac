flash_macros::attention! {
    pub Bad {
        head_dim: 128,
        dtype: bf16,
        score: s % 2,
    }
}

fn main() {}
