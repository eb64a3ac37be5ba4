//! Routed experts over a batch (HF `MixtralExperts`, `GptOssExperts`,
//! `Glm4MoeExperts` forward):
//!
//! ```text
//! for each expert slot e used by some route:
//!     X   = the rows x[t] of the routes (t, r) that chose e, gathered
//!     Y   = down(act(gate·X + bg) ⊙ (up·X + bu)) + bd
//!     y[t, r] = Y row of (t, r)
//! out[t] = Σ_r w[t, r] · y[t, r]      (r = 0, 1, … — router rank order)
//! ```
//!
//! Batching per expert reads each expert's weights once per call; the final
//! sum runs in rank order, so a token's output depends only on its route,
//! not on which other tokens share the batch.

use crate::types::{CpuBuf, CpuMatrix, CpuVector};
use crate::{check_len, shape_err, CpuBackend};
use turbospark_backend::{BackendError, ExpertWeights, MoeInput, MoeScratch, Route};

fn expert_dims(e: &ExpertWeights<CpuMatrix, CpuVector>) -> Result<(usize, usize), BackendError> {
    let (hidden, inter) = (e.gate.cols, e.gate.rows);
    let ok = e.up.rows == inter
        && e.up.cols == hidden
        && e.down.rows == hidden
        && e.down.cols == inter
        && e.gate_bias.as_ref().is_none_or(|b| b.data.len() == inter)
        && e.up_bias.as_ref().is_none_or(|b| b.data.len() == inter)
        && e.down_bias.as_ref().is_none_or(|b| b.data.len() == hidden);
    if !ok {
        return Err(shape_err(
            "moe",
            format!(
                "expert {} has gate [{inter}, {hidden}], up [{}, {}], down [{}, {}] or mismatched biases",
                e.gate.name, e.up.rows, e.up.cols, e.down.rows, e.down.cols
            ),
        ));
    }
    Ok((hidden, inter))
}

/// `k` and `hidden` of a batch, after checking routes, `x` and `y`.
fn batch_dims(
    input: &MoeInput<'_, CpuBuf, CpuMatrix, CpuVector>,
    y: &CpuBuf,
) -> Result<Option<(usize, usize)>, BackendError> {
    let MoeInput {
        x,
        n_tokens: n,
        routes,
        experts,
        ..
    } = *input;
    if n == 0 {
        return Ok(None);
    }
    if routes.len() % n != 0 || routes.is_empty() {
        return Err(shape_err(
            "moe",
            format!("{} routes for {n} tokens", routes.len()),
        ));
    }
    let k = routes.len() / n;
    if let Some(r) = routes.iter().find(|r| r.slot as usize >= experts.len()) {
        return Err(BackendError::BadRoute {
            slot: r.slot as usize,
            available: experts.len(),
        });
    }
    let Some(first) = routes.first().map(|r| &experts[r.slot as usize]) else {
        return Ok(None);
    };
    let (hidden, _) = expert_dims(first)?;
    check_len("moe", "x", x.data.len(), n * hidden)?;
    check_len("moe", "scratch.y", y.data.len(), n * k * hidden)?;
    Ok(Some((k, hidden)))
}

/// `y[i] = E_slot(x[t])` for every route `i = t·k + r` (whose slot `only`
/// marks, when given): each used expert once, over its gathered rows.
pub(crate) fn moe_experts(
    be: &CpuBackend,
    input: MoeInput<'_, CpuBuf, CpuMatrix, CpuVector>,
    scratch: &mut MoeScratch<CpuBuf>,
    only: Option<&[bool]>,
) -> Result<(), BackendError> {
    let Some((k, hidden)) = batch_dims(&input, &scratch.y)? else {
        return Ok(());
    };
    let MoeInput {
        x,
        routes,
        experts,
        activation,
        ..
    } = input;
    if let Some(only) = only {
        check_len("moe", "only", only.len(), experts.len())?;
    }
    let MoeScratch {
        x: sx,
        gate: sg,
        up: su,
        y,
    } = scratch;
    for (slot, e) in experts.iter().enumerate() {
        if only.is_some_and(|o| !o[slot]) {
            continue;
        }
        let m = routes.iter().filter(|r| r.slot as usize == slot).count();
        if m == 0 {
            continue;
        }
        let (h, inter) = expert_dims(e)?;
        if h != hidden {
            return Err(shape_err(
                "moe",
                format!("expert {} is {h} wide, the batch {hidden}", e.gate.name),
            ));
        }
        check_len("moe", "scratch.x", sx.data.len(), m * hidden)?;
        check_len("moe", "scratch.gate", sg.data.len(), m * inter)?;
        check_len("moe", "scratch.up", su.data.len(), m * inter)?;
        let chosen = routes
            .iter()
            .enumerate()
            .filter(|(_, r)| r.slot as usize == slot)
            .map(|(i, _)| i);
        for (j, i) in chosen.clone().enumerate() {
            let t = i / k;
            sx.data[j * hidden..(j + 1) * hidden]
                .copy_from_slice(&x.data[t * hidden..(t + 1) * hidden]);
        }
        be.matmul_slices(&e.gate, &sx.data, m, &mut sg.data)?;
        be.matmul_slices(&e.up, &sx.data, m, &mut su.data)?;
        if let Some(b) = &e.gate_bias {
            be.add_bias_slice(&mut sg.data, b, m)?;
        }
        if let Some(b) = &e.up_bias {
            be.add_bias_slice(&mut su.data, b, m)?;
        }
        be.glu_slices(&mut sg.data, &su.data, m * inter, activation)?;
        be.matmul_slices(&e.down, &sg.data, m, &mut sx.data)?;
        if let Some(b) = &e.down_bias {
            be.add_bias_slice(&mut sx.data, b, m)?;
        }
        for (j, i) in chosen.enumerate() {
            y.data[i * hidden..(i + 1) * hidden]
                .copy_from_slice(&sx.data[j * hidden..(j + 1) * hidden]);
        }
    }
    Ok(())
}

/// `out[t] = Σ_r w[t, r] · y[t·k + r]`, in rank order, for rows of
/// `hidden`.
pub(crate) fn moe_combine(
    n: usize,
    hidden: usize,
    routes: &[Route],
    scratch: &MoeScratch<CpuBuf>,
    out: &mut CpuBuf,
) -> Result<(), BackendError> {
    if n == 0 {
        return Ok(());
    }
    if routes.len() % n != 0 || routes.is_empty() {
        return Err(shape_err(
            "moe",
            format!("{} routes for {n} tokens", routes.len()),
        ));
    }
    let k = routes.len() / n;
    let y = &scratch.y.data;
    check_len("moe", "out", out.data.len(), n * hidden)?;
    check_len("moe", "scratch.y", y.len(), n * k * hidden)?;
    let out = &mut out.data[..n * hidden];
    out.fill(0.0);
    for (t, row) in out.chunks_exact_mut(hidden).enumerate() {
        for r in 0..k {
            let i = t * k + r;
            let w = routes[i].weight;
            for (o, &v) in row.iter_mut().zip(&y[i * hidden..(i + 1) * hidden]) {
                *o += w * v;
            }
        }
    }
    Ok(())
}
