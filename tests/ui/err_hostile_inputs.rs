// Issue 14: a deeply nested expression (once a rustc crash: the macro overflowed its stack),
// a long `||` chain, a non-ASCII parameter name, `%` by a constant zero, an i32 overflow and
// names differing only by case: each a diagnostic at its tokens.
flash_macros::attention! {
    pub Deep {
        head_dim: 64,
        dtype: bf16,
        mask: ((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((causal)))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))),
    }
}

flash_macros::attention! {
    pub Chain {
        head_dim: 64,
        dtype: bf16,
        mask: q - k == 0 || q - k == 1 || q - k == 2 || q - k == 3 || q - k == 4 || q - k == 5 || q - k == 6 || q - k == 7 || q - k == 8 || q - k == 9 || q - k == 10 || q - k == 11 || q - k == 12 || q - k == 13 || q - k == 14 || q - k == 15 || q - k == 16 || q - k == 17 || q - k == 18 || q - k == 19 || q - k == 20 || q - k == 21 || q - k == 22 || q - k == 23 || q - k == 24 || q - k == 25 || q - k == 26 || q - k == 27 || q - k == 28 || q - k == 29 || q - k == 30 || q - k == 31 || q - k == 32 || q - k == 33 || q - k == 34 || q - k == 35 || q - k == 36 || q - k == 37 || q - k == 38 || q - k == 39 || q - k == 40 || q - k == 41 || q - k == 42 || q - k == 43 || q - k == 44 || q - k == 45 || q - k == 46 || q - k == 47 || q - k == 48 || q - k == 49 || q - k == 50 || q - k == 51 || q - k == 52 || q - k == 53 || q - k == 54 || q - k == 55 || q - k == 56 || q - k == 57 || q - k == 58 || q - k == 59 || q - k == 60 || q - k == 61 || q - k == 62 || q - k == 63 || q - k == 64 || q - k == 65 || q - k == 66 || q - k == 67 || q - k == 68 || q - k == 69 || q - k == 70 || q - k == 71 || q - k == 72 || q - k == 73 || q - k == 74 || q - k == 75 || q - k == 76 || q - k == 77 || q - k == 78 || q - k == 79 || q - k == 80 || q - k == 81 || q - k == 82 || q - k == 83 || q - k == 84 || q - k == 85 || q - k == 86 || q - k == 87 || q - k == 88 || q - k == 89 || q - k == 90 || q - k == 91 || q - k == 92 || q - k == 93 || q - k == 94 || q - k == 95 || q - k == 96 || q - k == 97 || q - k == 98 || q - k == 99,
    }
}

// Validation errors, all reported together.
flash_macros::attention! {
    pub Arith {
        head_dim: 64,
        dtype: bf16,
        params: { é: f32, p: i32 },
        mask: q % 0 == 1 && p * p * p > 0,
    }
    pub Case { head_dim: 64, dtype: bf16 }
    pub CASE { head_dim: 64, dtype: bf16 }
}

fn main() {}
