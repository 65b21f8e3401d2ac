flash_macros::attention! {
    pub SmallBlocks {
        head_dim: 128,
        dtype: bf16,
        params: { blocks: [i32; heads, seq / 64, 8] },
        sparsity: blocks,
    }
    pub FloatLayout {
        head_dim: 128,
        dtype: bf16,
        params: { blocks: [f32; seq / 128, 8] },
        sparsity: blocks,
    }
}

fn main() {}
