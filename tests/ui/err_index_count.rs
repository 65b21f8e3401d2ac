flash_macros::attention! {
    pub Bad {
        head_dim: 64,
        dtype: f16,
        params: { bias: [f32; heads, 256] },
        score: s + bias[q - k],
    }
}

fn main() {}
