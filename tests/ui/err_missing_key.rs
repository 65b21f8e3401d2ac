flash_macros::attention! {
    pub Bad {
        dtype: bf16,
        mask: causal,
    }
}

fn main() {}
