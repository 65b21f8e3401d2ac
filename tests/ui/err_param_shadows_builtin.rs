flash_macros::attention! {
    pub Bad {
        head_dim: 128,
        dtype: bf16,
        params: { seq_q: i32 },
    }
}

fn main() {}
