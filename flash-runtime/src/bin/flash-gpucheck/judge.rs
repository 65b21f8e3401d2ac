//! The verdict on one case: each family's output against the float64 reference, by
//! FlashAttention's rule (see the crate docs).

use flash_dsl::model::reference;

use crate::cases::{CaseResult, GpuOut};

/// Compares each family's result with the references (computed once); `(passed, line)` each.
pub fn judge(r: &CaseResult) -> Vec<(bool, String)> {
    let ref64 = reference::forward(&r.spec, &r.problem);
    let plain = reference::forward_lowp(&r.spec, &r.problem, reference::rounding(r.spec.dtype));
    let err_plain = reference::max_abs_diff(&plain.o, &ref64.o);
    r.runs
        .iter()
        .map(|(fam, run)| match run {
            Err(e) => (false, format!("FAIL {} {fam}  error: {e}", r.name)),
            Ok(out) => judge_one(r, fam, out, &ref64, err_plain),
        })
        .collect()
}

fn judge_one(
    r: &CaseResult,
    fam: &str,
    (o, lse, stray): &GpuOut,
    ref64: &reference::Output,
    err_plain: f64,
) -> (bool, String) {
    let err = reference::max_abs_diff(o, &ref64.o);
    let nan_o = o.iter().filter(|x| x.is_nan()).count();
    let nan_lse = lse.iter().filter(|x| x.is_nan()).count();
    let dv = r.spec.head_dim_v as usize;
    let (sq, hq) = (r.problem.seq_q, r.problem.heads_q);
    let mut lse_err: f64 = 0.0;
    let mut inf_mismatch = 0usize;
    let mut masked_rows = 0usize;
    let mut masked_nonzero = 0usize;
    for (idx, (&got, &want)) in lse.iter().zip(&ref64.lse).enumerate() {
        if want == f64::NEG_INFINITY {
            masked_rows += 1;
            if got != f64::NEG_INFINITY {
                inf_mismatch += 1;
            }
            // idx = (b·hq + h)·sq + i  →  O row (b, i, h).
            let (bh, i) = (idx / sq.max(1), idx % sq.max(1));
            let (b, h) = (bh / hq, bh % hq);
            let row = ((b * sq + i) * hq + h) * dv;
            if o[row..row + dv].iter().any(|&x| x != 0.0) {
                masked_nonzero += 1;
            }
        } else if got == f64::NEG_INFINITY || got.is_nan() {
            inf_mismatch += 1;
        } else {
            lse_err = lse_err.max((got - want).abs() / want.abs().max(1.0));
        }
    }
    let ok = nan_o == 0
        && nan_lse == 0
        && err <= 2.0 * err_plain + 1e-6
        && lse_err <= 1e-3
        && inf_mismatch == 0
        && masked_nonzero == 0
        && *stray == 0;
    let mut line = format!(
        "{} {} {fam:<4} err {:.2e} plain {:.2e} ratio {:.2} lse {:.1e} masked_rows {}",
        if ok { "ok  " } else { "FAIL" },
        r.name,
        err,
        err_plain,
        if err_plain > 0.0 {
            err / err_plain
        } else {
            0.0
        },
        lse_err,
        masked_rows,
    );
    if nan_o + nan_lse > 0 {
        line += &format!(" NaN(o {nan_o}, lse {nan_lse})");
    }
    if inf_mismatch > 0 {
        line += &format!(" lse_inf_mismatch {inf_mismatch}");
    }
    if masked_nonzero > 0 {
        line += &format!(" masked_rows_nonzero {masked_nonzero}");
    }
    if *stray > 0 {
        line += &format!(" stray_writes {stray}");
    }
    (ok, line)
}
