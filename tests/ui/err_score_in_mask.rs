flash_macros::attention! {
    pub Bad {
        head_dim: 128,
        dtype: bf16,
        mask: causal && s > -10.0,
    }
}

fn main() {}
