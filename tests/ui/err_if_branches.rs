flash_macros::attention! {
    pub Bad {
        head_dim: 128,
        dtype: bf16,
        score: if q == k { s } else { false },
    }
}

fn main() {}
