flash_macros::attention! {
    pub Bad {
        head_dim: 128,
        dtype: bf16,
        score: softcap(s),
    }
}

fn main() {}
