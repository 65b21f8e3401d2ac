flash_macros::attention! {
    pub BadBlock {
        head_dim: 128,
        dtype: e4m3,
        scales: per_block(64),
    }
    pub NotFp8 {
        head_dim: 128,
        dtype: bf16,
        scales: per_head,
    }
}

fn main() {}
