flash_macros::attention! {
    /// Several mistakes: every one is reported in one compile.
    pub Bad {
        head_dim: 100,
        dtype: f32,
        params: { q: f32 },
        mask: s > 0.0,
        score: gelu(s),
    }
    pub AlsoBad {
        head_dim: 64,
        dtype: bf16,
        mask: false,
    }
}

fn main() {}
