flash_macros::attention! {
    pub Bad {
        head_dim: 128,
        dtype: bf16,
        params: { bias: [f32; rows] },
    }
}

fn main() {}
