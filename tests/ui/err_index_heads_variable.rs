flash_macros::attention! {
    pub Bad {
        head_dim: 128,
        dtype: bf16,
        params: { slopes: [f32; heads] },
        score: s + slopes[b],
    }
}

fn main() {}
