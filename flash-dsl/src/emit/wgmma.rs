//! The `wgmma.mma_async` wrappers a Hopper skeleton calls, written out per plan.
//!
//! A wgmma instruction names every accumulator register of the thread (`n / 2` of them for
//! m64nNk16 with fp32 accumulation), so a wrapper cannot be one C++ template over `n`; each
//! kernel gets exactly the shapes it issues, from [`hopper_wgmmas`], instead of a partial with
//! hand-written operand lists per shape.

use crate::plan::{KernelFamily, KernelKind, KernelPlan};

/// One m64nNk16 wgmma wrapper: fp32 accumulate, A and B in the storage type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wgmma {
    /// The C++ function name.
    pub name: &'static str,
    /// The N extent (a multiple of 8, at most 256).
    pub n: u32,
    /// A from registers (four `u32` fragments per thread) instead of a shared-memory descriptor.
    pub a_regs: bool,
    /// A is M-major in shared memory (read transposed); only with `a_regs == false`.
    pub trans_a: bool,
    /// B is N-major in shared memory (read transposed).
    pub trans_b: bool,
    /// What the doc comment of the wrapper says it is for.
    pub what: &'static str,
}

/// The wrappers of a Hopper plan: the forward's S = Q·Kᵀ (`wgmma_s`) and O += P·V (`wgmma_o`);
/// the backward main kernel's Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (`wgmma_s`, n = queries per step),
/// dV += Pᵀ·dO and dK += dSᵀ·Q (`wgmma_dv`, `wgmma_dk`, A from registers) and dQ = dS·K over
/// one 64-column plane (`wgmma_dq`, dS read transposed from shared memory).
pub fn hopper_wgmmas(plan: &KernelPlan) -> Vec<Wgmma> {
    let pad64 = |d: u32| d.div_ceil(64) * 64;
    let cfg = plan.config;
    if cfg.family == KernelFamily::Sm80 {
        return Vec::new();
    }
    match plan.kind {
        KernelKind::BlockMap
        | KernelKind::BlockMapKeys
        | KernelKind::SplitKv
        | KernelKind::SplitKvPaged
        | KernelKind::SplitKvPagedVarlen
        | KernelKind::Quantize => Vec::new(),
        KernelKind::Forward | KernelKind::ForwardVarlen => vec![
            Wgmma {
                name: "wgmma_s",
                n: cfg.block_n,
                a_regs: false,
                trans_a: false,
                trans_b: false,
                what: "S = Q·Kᵀ: Q and K both K-major in shared memory",
            },
            Wgmma {
                name: "wgmma_o",
                n: plan.spec.head_dim_v.div_ceil(16) * 16,
                a_regs: true,
                trans_a: false,
                trans_b: true,
                what: "O += P·V: P from the score registers, V N-major (read transposed)",
            },
        ],
        KernelKind::BackwardMain => vec![
            Wgmma {
                name: "wgmma_s",
                n: cfg.block_m,
                a_regs: false,
                trans_a: false,
                trans_b: false,
                what: "Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ: both operands K-major in shared memory",
            },
            Wgmma {
                name: "wgmma_dk",
                n: pad64(plan.spec.head_dim_qk),
                a_regs: true,
                trans_a: false,
                trans_b: true,
                what: "dK += dSᵀ·Q: dSᵀ from registers, Q N-major (read transposed)",
            },
            Wgmma {
                name: "wgmma_dv",
                n: pad64(plan.spec.head_dim_v),
                a_regs: true,
                trans_a: false,
                trans_b: true,
                what: "dV += Pᵀ·dO: Pᵀ from registers, dO N-major (read transposed)",
            },
            Wgmma {
                name: "wgmma_dq",
                n: 64,
                a_regs: false,
                trans_a: true,
                trans_b: true,
                what: "dQ = dS·K over one 64-column plane: dSᵀ and K both read transposed",
            },
        ],
        KernelKind::BackwardPre | KernelKind::DqConvert => Vec::new(),
    }
}

/// The C++ of one wrapper for element type `ty` (`bf16`, `f16`, `e4m3`, `e5m2` or `s8`).
/// `scale_d == 0` overwrites the accumulator instead of adding into it. With `s8` the
/// accumulator is s32, held in the caller's float registers as raw bits (see the int8 Q·Kᵀ of
/// the fp8 forward).
pub fn wgmma_def(w: &Wgmma, ty: &str) -> String {
    let regs = w.n / 2;
    let int = ty == "s8";
    let outs: Vec<String> = (0..regs).map(|i| format!("%{i}")).collect();
    let binds: Vec<String> = (0..regs)
        .map(|i| {
            if int {
                format!("\"+r\"(reinterpret_cast<u32&>(d[{i}]))")
            } else {
                format!("\"+f\"(d[{i}])")
            }
        })
        .collect();
    let (a_param, a_operand, a_inputs, next) = if w.a_regs {
        (
            "const u32* a",
            format!(
                "{{ %{}, %{}, %{}, %{} }}",
                regs,
                regs + 1,
                regs + 2,
                regs + 3
            ),
            "\"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3])".to_string(),
            regs + 4,
        )
    } else {
        (
            "u64 da",
            format!("%{regs}"),
            "\"l\"(da)".to_string(),
            regs + 1,
        )
    };
    let (b_operand, scale_operand) = (format!("%{next}"), next + 1);
    // 8-bit operands take 32 elements of k per instruction and have no transposed layouts
    // (both operands K-major in shared memory): no transpose immediates.
    // Integer operands have no negation immediates either, and accumulate in s32.
    let eight_bit = matches!(ty, "e4m3" | "e5m2" | "s8");
    let k = if eight_bit { 32 } else { 16 };
    let tail = if int {
        String::new()
    } else if eight_bit {
        ", 1, 1".to_string()
    } else if w.a_regs {
        format!(", 1, 1, {}", w.trans_b as u8)
    } else {
        format!(", 1, 1, {}, {}", w.trans_a as u8, w.trans_b as u8)
    };
    let acc = if int { "s32" } else { "f32" };
    format!(
        "/// {what}; m64n{n}k{k}, {regs} accumulator registers per thread.\n\
         __device__ __forceinline__ void {name}(float* d, {a_param}, u64 db, int scale_d = 1) {{\n  \
         asm volatile(\"{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{scale_operand}, 0;\\n\"\n    \
         \"wgmma.mma_async.sync.aligned.m64n{n}k{k}.{acc}.{ty}.{ty} {{ {outs} }}, {a_operand}, {b_operand}, p{tail};\\n}}\"\n    \
         : {binds}\n    : {a_inputs}, \"l\"(db), \"r\"(scale_d));\n}}\n",
        what = w.what,
        n = w.n,
        name = w.name,
        outs = outs.join(", "),
        binds = binds.join(", "),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operand_numbering_follows_the_accumulators() {
        let ss = wgmma_def(
            &Wgmma {
                name: "f",
                n: 16,
                a_regs: false,
                trans_a: true,
                trans_b: true,
                what: "t",
            },
            "bf16",
        );
        // 8 accumulators, then A's and B's descriptors and the scale predicate.
        assert!(ss.contains("setp.ne.b32 p, %10, 0;"), "{ss}");
        assert!(ss.contains("m64n16k16.f32.bf16.bf16 { %0, %1, %2, %3, %4, %5, %6, %7 }, %8, %9, p, 1, 1, 1, 1;"), "{ss}");
        let rs = wgmma_def(
            &Wgmma {
                name: "g",
                n: 8,
                a_regs: true,
                trans_a: false,
                trans_b: true,
                what: "t",
            },
            "f16",
        );
        assert!(
            rs.contains("{ %0, %1, %2, %3 }, { %4, %5, %6, %7 }, %8, p, 1, 1, 1;"),
            "{rs}"
        );
        assert!(rs.contains("setp.ne.b32 p, %9, 0;"), "{rs}");
        // 8-bit operands: k32 and no transpose immediates (fp8 wgmma has none).
        let e = wgmma_def(
            &Wgmma {
                name: "h",
                n: 8,
                a_regs: true,
                trans_a: false,
                trans_b: true,
                what: "t",
            },
            "e4m3",
        );
        assert!(
            e.contains(
                "m64n8k32.f32.e4m3.e4m3 { %0, %1, %2, %3 }, { %4, %5, %6, %7 }, %8, p, 1, 1;"
            ),
            "{e}"
        );
        // int8: s32 accumulators bound as the float registers' bits, no immediates at all.
        let i = wgmma_def(
            &Wgmma {
                name: "s",
                n: 8,
                a_regs: false,
                trans_a: false,
                trans_b: false,
                what: "t",
            },
            "s8",
        );
        assert!(
            i.contains("m64n8k32.s32.s8.s8 { %0, %1, %2, %3 }, %4, %5, p;"),
            "{i}"
        );
        assert!(i.contains("\"+r\"(reinterpret_cast<u32&>(d[3]))"), "{i}");
    }
}
