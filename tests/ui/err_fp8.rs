flash_macros::attention! {
    pub Bad {
        head_dim: 128,
        dtype: fp8,
    }
}

fn main() {}
