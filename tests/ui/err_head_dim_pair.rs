flash_macros::attention! {
    pub Bad {
        head_dim: (192, 130),
        dtype: bf16,
    }
}

fn main() {}
