flash_macros::attention! {
    pub Bad {
        head_dim: 128,
        dtype: bf16,
        params: { doc: [i32; seq] },
        mask: doc[q] == doc[k + 1],
    }
}

fn main() {}
