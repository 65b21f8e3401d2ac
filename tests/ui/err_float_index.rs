flash_macros::attention! {
    pub Bad {
        head_dim: 64,
        dtype: f16,
        params: { table: [f32; 64] },
        score: s + table[s * 10.0],
    }
}

fn main() {}
