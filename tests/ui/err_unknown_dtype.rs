flash_macros::attention! {
    pub Bad {
        head_dim: 128,
        dtype: f32,
    }
}

fn main() {}
