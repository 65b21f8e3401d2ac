flash_macros::attention! {
    pub TooMuch {
        head_dim: 128,
        dtype: bf16,
        dropout: 1.5,
    }
    pub IntRate {
        head_dim: 128,
        dtype: bf16,
        params: { rate: i32 },
        dropout: rate,
    }
}

fn main() {}
