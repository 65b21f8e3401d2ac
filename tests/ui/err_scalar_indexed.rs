flash_macros::attention! {
    pub Bad {
        head_dim: 128,
        dtype: bf16,
        params: { cap: f32 },
        score: cap[h] * tanh(s / cap),
    }
}

fn main() {}
