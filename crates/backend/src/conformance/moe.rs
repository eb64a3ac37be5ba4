//! Routing and routed experts over a bank.

use super::data::{bits, dequantized, f32_tensor, random_matrix, Rng};
use super::{compare, property, reference, ConformanceError, Context, Harness, Tolerances};
use crate::{
    BackendError, Device, ExpertBank, ExpertTensors, ExpertWeights, HostTensor, Limits, MoeInput,
    MoeScratch, Projection, Route, RouterSpec, RouterTables, SharedBytes, Stream,
};
use std::sync::Arc;
use turbospark_core::arch::{Activation, NormSpec, RouterKind};
use turbospark_core::QuantFormat;

/// Every router kind, with its correction bias or expert scales, over a
/// batch of tokens: the same experts as the f64 reference, in the same
/// order, with weights within `tol.route`.
pub fn check_route<D: Device>(dev: &D, tol: &Tolerances) -> Result<(), ConformanceError> {
    const OP: &str = "route";
    let (experts, k, n) = (12, 3, 5);
    let mut rng = Rng(31);
    let correction = rng.scaled(experts, 0.3);
    let scale: Vec<f32> = rng.vec(experts).iter().map(|v| 1.0 + v * 0.5).collect();
    let upload = |name, v: &[f32]| dev.upload_vector(&f32_tensor(name, vec![experts], v));
    let cv = upload("exp_probs_b.bias", &correction).at(OP, "upload")?;
    let sv = upload("ffn_gate_inp.expert_scale", &scale).at(OP, "upload")?;
    let limits = Limits {
        max_tokens: n,
        max_experts: experts,
        ..Limits::default()
    };
    let mut h = Harness::new(dev, limits)?;
    let logits = rng.scaled(n * experts, 3.0);
    let lb = h.buf(&logits)?;
    let mut routes = dev.alloc_routes(n, k).at(OP, "alloc")?;
    let kinds = [
        RouterKind::SoftmaxTopK { renormalize: true },
        RouterKind::SoftmaxTopK { renormalize: false },
        RouterKind::TopKSoftmax,
        RouterKind::SigmoidGrouped {
            n_group: 4,
            topk_group: 2,
            renormalize: true,
            scaling: 2.5,
        },
        RouterKind::SigmoidGrouped {
            n_group: 3,
            topk_group: 1,
            renormalize: false,
            scaling: 1.0,
        },
        RouterKind::Gemma4,
    ];
    for kind in kinds {
        let case = format!("{kind:?}");
        let spec = RouterSpec::new(kind, experts, k).at(OP, &case)?;
        let grouped = matches!(kind, RouterKind::SigmoidGrouped { .. });
        let gemma = kind == RouterKind::Gemma4;
        let tables = RouterTables {
            correction: grouped.then_some(&cv),
            expert_scale: gemma.then_some(&sv),
        };
        h.st.route(&lb, n, &spec, tables, &mut routes)
            .at(OP, &case)?;
        let mut got = vec![Route::default(); n * k];
        h.st.read_routes(&routes, &mut got).at(OP, &case)?;
        for t in 0..n {
            let want = reference::route(
                kind,
                k,
                &logits[t * experts..(t + 1) * experts],
                grouped.then_some(&correction[..]),
                gemma.then_some(&scale[..]),
            );
            let case = format!("{case}, token {t}");
            routes_match(OP, &case, &got[t * k..(t + 1) * k], &want, tol)?;
        }
    }
    // Ties go to the lower expert, -inf is a logit like any other.
    let inf = f32::NEG_INFINITY;
    let tied = [2.0, 5.0, inf, 5.0, 1.0, 5.0, -1.0, 0.5, 5.0, inf, 3.0, 0.0];
    let tb = h.buf(&tied)?;
    for (kind, k) in [
        (RouterKind::TopKSoftmax, 3),
        (RouterKind::TopKSoftmax, 11),
        (RouterKind::SoftmaxTopK { renormalize: true }, 3),
    ] {
        let case = format!("{kind:?}, top {k} of tied logits");
        let spec = RouterSpec::new(kind, experts, k).at(OP, &case)?;
        let mut routes = dev.alloc_routes(1, k).at(OP, "alloc")?;
        h.st.route(&tb, 1, &spec, RouterTables::default(), &mut routes)
            .at(OP, &case)?;
        let mut got = vec![Route::default(); k];
        h.st.read_routes(&routes, &mut got).at(OP, &case)?;
        let want = reference::route(kind, k, &tied, None, None);
        routes_match(OP, &case, &got, &want, tol)?;
    }
    // More experts than a warp has lanes (a CUDA router of at most 32 takes
    // a shorter path; this is the other).
    let wide = 40;
    let limits = Limits {
        max_tokens: 2,
        max_experts: wide,
        ..Limits::default()
    };
    let mut hw = Harness::new(dev, limits)?;
    let wide_logits = rng.scaled(2 * wide, 3.0);
    let wb = hw.buf(&wide_logits)?;
    for kind in [
        RouterKind::SoftmaxTopK { renormalize: true },
        RouterKind::TopKSoftmax,
    ] {
        let case = format!("{kind:?}, top 4 of {wide} experts");
        let spec = RouterSpec::new(kind, wide, 4).at(OP, &case)?;
        let mut routes = dev.alloc_routes(2, 4).at(OP, "alloc")?;
        hw.st
            .route(&wb, 2, &spec, RouterTables::default(), &mut routes)
            .at(OP, &case)?;
        let mut got = vec![Route::default(); 8];
        hw.st.read_routes(&routes, &mut got).at(OP, &case)?;
        for t in 0..2 {
            let want =
                reference::route(kind, 4, &wide_logits[t * wide..(t + 1) * wide], None, None);
            let case = format!("{case}, token {t}");
            routes_match(OP, &case, &got[t * 4..(t + 1) * 4], &want, tol)?;
        }
    }
    if h.st
        .route(
            &lb,
            n + 1,
            &RouterSpec::new(RouterKind::TopKSoftmax, experts, k).at(OP, "")?,
            RouterTables::default(),
            &mut routes,
        )
        .is_ok()
    {
        return Err(property(
            OP,
            "overlong",
            "routed more tokens than the buffers hold".into(),
        ));
    }
    Ok(())
}

/// One token's routes against the reference's `(expert, weight)`: the same
/// experts in the same ranks, weights within `tol.route` (relative to
/// 1 + |weight|).
fn routes_match(
    op: &'static str,
    case: &str,
    got: &[Route],
    want: &[(u32, f64)],
    tol: &Tolerances,
) -> Result<(), ConformanceError> {
    let slots: Vec<u32> = got.iter().map(|r| r.slot).collect();
    let want_slots: Vec<u32> = want.iter().map(|r| r.0).collect();
    if slots != want_slots {
        return Err(property(
            op,
            case,
            format!("routed to {slots:?}, the reference to {want_slots:?}"),
        ));
    }
    let weights: Vec<f32> = got.iter().map(|r| r.weight).collect();
    let want_w: Vec<f64> = want.iter().map(|r| r.1).collect();
    compare(op, case, &weights, &want_w, tol.route, |i| {
        1.0 + want_w[i].abs()
    })
}

const HIDDEN: usize = 320;
const INTER: usize = 160;
const EXPERTS: usize = 6;
const TOP_K: usize = 2;
/// Enough tokens that backends' batched (tensor-core) paths take part.
const TOKENS: usize = 40;

/// Formats of (gate, up, down): mixed, as gpt-oss stores them (MXFP4),
/// Q8_0 throughout, and formats that backends may decode onto float
/// kernels (bf16 experts as safetensors ship them; a 4-bit gate and up
/// with a 5-bit down, as llama.cpp's mixed quantizations store them).
const FORMAT_SETS: [[QuantFormat; 3]; 5] = [
    [QuantFormat::Mxfp4, QuantFormat::Q8_0, QuantFormat::F32],
    [QuantFormat::Mxfp4, QuantFormat::Mxfp4, QuantFormat::Mxfp4],
    [QuantFormat::Q8_0, QuantFormat::Q8_0, QuantFormat::Q8_0],
    [QuantFormat::Bf16, QuantFormat::Bf16, QuantFormat::Bf16],
    [QuantFormat::Q4_1, QuantFormat::Q4_1, QuantFormat::Q5_0],
];

/// One expert's host tensors and their reference-dequantized values.
struct Expert {
    tensors: ExpertTensors,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
    biases: [Vec<f32>; 3],
}

fn random_expert(e: usize, formats: [QuantFormat; 3], rng: &mut Rng) -> Expert {
    let [gf, uf, df] = formats;
    let gate = random_matrix(&format!("gate{e}"), gf, INTER, HIDDEN, rng);
    let up = random_matrix(&format!("up{e}"), uf, INTER, HIDDEN, rng);
    let down = random_matrix(&format!("down{e}"), df, HIDDEN, INTER, rng);
    let biases = [rng.vec(INTER), rng.vec(INTER), rng.vec(HIDDEN)];
    Expert {
        gate: dequantized(&gate),
        up: dequantized(&up),
        down: dequantized(&down),
        tensors: ExpertWeights {
            gate,
            up,
            down,
            gate_bias: Some(f32_tensor("bg", vec![INTER], &biases[0])),
            up_bias: Some(f32_tensor("bu", vec![INTER], &biases[1])),
            down_bias: Some(f32_tensor("bd", vec![HIDDEN], &biases[2])),
        },
        biases,
    }
}

/// What the MoE checks start from: [`EXPERTS`] random experts in
/// `formats`, a resident bank of them and a bank of [`TOP_K`] slots, a
/// stream sized for [`TOKENS`] tokens with its MoE scratch, and random
/// inputs `x` (on the host and the device).
struct MoeCase<'d, D: Device> {
    experts: Vec<Expert>,
    tensors: Vec<ExpertTensors>,
    bank: D::Bank,
    slots: D::Bank,
    h: Harness<'d, D>,
    scratch: MoeScratch<D::Buf>,
    x: Vec<f32>,
    xb: D::Buf,
}

fn moe_case<'d, D: Device>(
    dev: &'d D,
    op: &'static str,
    formats: [QuantFormat; 3],
    rng: &mut Rng,
) -> Result<MoeCase<'d, D>, ConformanceError> {
    let experts: Vec<Expert> = (0..EXPERTS)
        .map(|e| random_expert(e, formats, rng))
        .collect();
    let tensors: Vec<ExpertTensors> = experts.iter().map(|e| e.tensors.clone()).collect();
    let bank = dev.upload_bank(&tensors).at(op, "upload_bank")?;
    let slots = dev.upload_bank(&tensors[..TOP_K]).at(op, "slot bank")?;
    let limits = Limits {
        max_tokens: TOKENS,
        max_routes: TOKENS * TOP_K,
        max_expert_intermediate: INTER,
        max_experts: EXPERTS,
        ..Limits::default()
    };
    let mut h = Harness::new(dev, limits)?;
    let scratch = MoeScratch {
        x: h.zeros(TOKENS * HIDDEN)?,
        gate: h.zeros(TOKENS * INTER)?,
        up: h.zeros(TOKENS * INTER)?,
        y: h.zeros(TOKENS * TOP_K * HIDDEN)?,
    };
    let x = rng.vec(TOKENS * HIDDEN);
    let xb = h.buf(&x)?;
    Ok(MoeCase {
        experts,
        tensors,
        bank,
        slots,
        h,
        scratch,
        x,
        xb,
    })
}

/// `(value, magnitude)` of `expert(x) · weight` per output, in f64.
fn expert_ref(e: &Expert, act: Activation, x: &[f32], weight: f64) -> Vec<(f64, f64)> {
    let a: Vec<(f64, f64)> = (0..INTER)
        .map(|i| {
            let row = |m: &[f32]| reference::dot(&m[i * HIDDEN..(i + 1) * HIDDEN], x);
            let (g, gm) = row(&e.gate);
            let (u, um) = row(&e.up);
            let g = g + f64::from(e.biases[0][i]);
            let u = u + f64::from(e.biases[1][i]);
            (reference::glu(act, g, u), gm + um + 1.0)
        })
        .collect();
    (0..HIDDEN)
        .map(|o| {
            let d = &e.down[o * INTER..(o + 1) * INTER];
            let (y, m) = d.iter().zip(&a).fold((0.0, 0.0), |(s, m), (&w, &(v, vm))| {
                (
                    s + f64::from(w) * v,
                    m + (f64::from(w) * v).abs() + f64::from(w).abs() * vm,
                )
            });
            (
                weight * (y + f64::from(e.biases[2][o])),
                weight.abs() * (m + 1.0),
            )
        })
        .collect()
}

/// `moe` of the first `n` tokens of `input` (a whole batch, whose outputs
/// were `got`), for each `n` of `ns`: with `tol.batch_invariant`, the bits
/// those tokens have in the batch.
#[allow(clippy::too_many_arguments)]
pub(super) fn first_tokens_as_in_batch<D: Device>(
    h: &mut Harness<'_, D>,
    scratch: &mut MoeScratch<D::Buf>,
    input: MoeInput<'_, D>,
    got: &[f32],
    ns: &[usize],
    tol: &Tolerances,
    op: &'static str,
    case: &str,
) -> Result<(), ConformanceError> {
    let hidden = input.bank.hidden();
    for &n in ns {
        let part = MoeInput {
            n_tokens: n,
            ..input
        };
        let mut o = h.zeros(n * hidden)?;
        h.st.moe(part, scratch, &mut o).at(op, case)?;
        if tol.batch_invariant && h.get(&o, n * hidden)?[..] != got[..n * hidden] {
            return Err(property(
                op,
                case,
                format!("the first {n} tokens alone differ from the whole batch"),
            ));
        }
    }
    Ok(())
}

/// `moe` of each token of `input` (a whole batch of `x` routed by
/// `routes`, whose outputs were `got`) alone: with `tol.batch_invariant`,
/// the bits it has in the batch. The rows, in token order.
#[allow(clippy::too_many_arguments)]
pub(super) fn each_token_as_in_batch<D: Device>(
    h: &mut Harness<'_, D>,
    scratch: &mut MoeScratch<D::Buf>,
    input: MoeInput<'_, D>,
    routes: &[Route],
    x: &[f32],
    got: &[f32],
    tol: &Tolerances,
    op: &'static str,
    case: &str,
) -> Result<Vec<f32>, ConformanceError> {
    let (n, hidden) = (input.n_tokens, input.bank.hidden());
    let k = routes.len() / n;
    let mut rows = Vec::with_capacity(n * hidden);
    let mut one = h.dev.alloc_routes(1, k).at(op, case)?;
    for t in 0..n {
        h.st.write_routes(&mut one, &routes[t * k..(t + 1) * k])
            .at(op, case)?;
        let x1 = h.buf(&x[t * hidden..(t + 1) * hidden])?;
        let mut o1 = h.zeros(hidden)?;
        let alone = MoeInput {
            x: &x1,
            n_tokens: 1,
            routes: &one,
            ..input
        };
        h.st.moe(alone, scratch, &mut o1).at(op, case)?;
        let row = h.get(&o1, hidden)?;
        if tol.batch_invariant && row[..] != got[t * hidden..(t + 1) * hidden] {
            return Err(property(
                op,
                case,
                format!("token {t} alone differs from the batch"),
            ));
        }
        rows.extend(row);
    }
    Ok(rows)
}

/// Fills slot `slot` with `expert` through [`Stream::fill_slot_rows`] in
/// uneven pieces, last projection first, then the biases.
fn fill_in_pieces<D: Device>(
    st: &mut D::Stream,
    bank: &mut D::Bank,
    slot: usize,
    expert: &ExpertTensors,
) -> Result<(), BackendError> {
    for part in Projection::ALL.into_iter().rev() {
        let rows = expert.projection(part).shape.first().copied().unwrap_or(0);
        let mut at = 0;
        for piece in [1, rows / 3, rows] {
            let end = piece.clamp(at, rows);
            st.fill_slot_rows(bank, slot, expert, part, at..end)?;
            at = end;
        }
    }
    st.fill_slot_biases(bank, slot, expert)
}

/// Routed experts over a resident bank and over a slot bank refilled with
/// [`Stream::fill_slot`] (and in pieces, [`Stream::fill_slot_rows`]): the
/// f64 formula within `tol.moe`; each token the same bits alone as in the
/// batch; `moe_experts` split by slot plus `moe_combine` the same bits as
/// `moe`; routes outside the bank refused.
pub fn check_moe<D: Device>(dev: &D, tol: &Tolerances) -> Result<(), ConformanceError> {
    for formats in FORMAT_SETS {
        check_moe_formats(dev, tol, formats)?;
    }
    Ok(())
}

fn check_moe_formats<D: Device>(
    dev: &D,
    tol: &Tolerances,
    formats: [QuantFormat; 3],
) -> Result<(), ConformanceError> {
    const OP: &str = "moe";
    let mut rng = Rng(9);
    let MoeCase {
        experts,
        tensors,
        bank,
        mut slots,
        mut h,
        mut scratch,
        x,
        xb,
    } = moe_case(dev, OP, formats, &mut rng)?;
    if (bank.slots(), bank.hidden(), bank.intermediate()) != (EXPERTS, HIDDEN, INTER) {
        return Err(property(OP, "upload_bank", "the bank's shape".into()));
    }
    let routes: Vec<Route> = (0..TOKENS * TOP_K)
        .map(|i| Route {
            slot: ((i * 7 + i / TOP_K) % EXPERTS) as u32,
            weight: 0.25 + (i % 3) as f32 * 0.2,
        })
        .collect();
    let mut rb = dev.alloc_routes(TOKENS, TOP_K).at(OP, "alloc_routes")?;
    h.st.write_routes(&mut rb, &routes).at(OP, "write_routes")?;
    let mut out = h.zeros(TOKENS * HIDDEN)?;
    for act in [
        Activation::Swiglu,
        Activation::ClampedSwiglu {
            alpha: 1.702,
            limit: 0.5,
        },
        Activation::GeluTanh,
    ] {
        let case = format!("{act:?}, {}/{}/{}", formats[0], formats[1], formats[2]);
        let input = MoeInput {
            x: &xb,
            n_tokens: TOKENS,
            routes: &rb,
            bank: &bank,
            activation: act,
        };
        h.st.moe(input, &mut scratch, &mut out).at(OP, &case)?;
        let got = h.get(&out, TOKENS * HIDDEN)?;
        let mut want = vec![(0f64, 0f64); TOKENS * HIDDEN];
        for t in 0..TOKENS {
            for r in 0..TOP_K {
                let Route { slot, weight } = routes[t * TOP_K + r];
                let xt = &x[t * HIDDEN..(t + 1) * HIDDEN];
                let y = expert_ref(&experts[slot as usize], act, xt, f64::from(weight));
                for (w, (v, m)) in want[t * HIDDEN..(t + 1) * HIDDEN].iter_mut().zip(y) {
                    *w = (w.0 + v, w.1 + m);
                }
            }
        }
        let (values, mags): (Vec<f64>, Vec<f64>) = want.into_iter().unzip();
        compare(OP, &case, &got, &values, tol.moe, |i| mags[i])?;

        // Smaller batches (the backends' other batched paths) give the
        // bits of the same tokens in the whole batch.
        first_tokens_as_in_batch(
            &mut h,
            &mut scratch,
            input,
            &got,
            &[2, 7, 16, 24],
            tol,
            OP,
            &case,
        )?;

        // The split: odd slots first, then even ones, then the sum.
        for parity in [1, 0] {
            let only: Vec<bool> = (0..EXPERTS).map(|s| s % 2 == parity).collect();
            h.st.moe_experts(input, &mut scratch, Some(&only))
                .at(OP, &case)?;
        }
        let mut split = h.zeros(TOKENS * HIDDEN)?;
        h.st.moe_combine(TOKENS, HIDDEN, &rb, &scratch, &mut split)
            .at(OP, &case)?;
        if h.get(&split, TOKENS * HIDDEN)? != got {
            return Err(property(
                OP,
                &case,
                "moe_experts split by slot differs from moe".into(),
            ));
        }

        // Each token alone.
        let alone = each_token_as_in_batch(
            &mut h,
            &mut scratch,
            input,
            &routes,
            &x,
            &got,
            tol,
            OP,
            &case,
        )?;

        // A slot bank refilled with the routed experts gives the same bits.
        let mut one_slot = dev.alloc_routes(1, TOP_K).at(OP, &case)?;
        for t in 0..TOKENS {
            let r = &routes[t * TOP_K..(t + 1) * TOP_K];
            let mut remap = [Route::default(); TOP_K];
            for (s, (m, r)) in remap.iter_mut().zip(r).enumerate() {
                let expert = &tensors[r.slot as usize];
                // Every other token's slots in pieces, where the stream
                // fills them so: the same bank.
                if t % 2 == 1 && h.st.fills_slot_rows() {
                    fill_in_pieces::<D>(&mut h.st, &mut slots, s, expert)
                        .at(OP, "fill_slot_rows")?;
                } else {
                    h.st.fill_slot(&mut slots, s, expert).at(OP, "fill_slot")?;
                }
                *m = Route {
                    slot: s as u32,
                    weight: r.weight,
                };
            }
            h.st.write_routes(&mut one_slot, &remap).at(OP, &case)?;
            let x1 = h.buf(&x[t * HIDDEN..(t + 1) * HIDDEN])?;
            let mut o1 = h.zeros(HIDDEN)?;
            let input = MoeInput {
                x: &x1,
                n_tokens: 1,
                routes: &one_slot,
                bank: &slots,
                activation: act,
            };
            h.st.moe(input, &mut scratch, &mut o1).at(OP, &case)?;
            if h.get(&o1, HIDDEN)?[..] != alone[t * HIDDEN..(t + 1) * HIDDEN] {
                return Err(property(
                    OP,
                    &case,
                    format!("token {t} over refilled slots differs from the resident bank"),
                ));
            }
        }
    }

    let bad = [Route {
        slot: EXPERTS as u32,
        weight: 1.0,
    }; TOP_K];
    let mut rb1 = dev.alloc_routes(1, TOP_K).at(OP, "bad route")?;
    h.st.write_routes(&mut rb1, &bad).at(OP, "bad route")?;
    let input = MoeInput {
        x: &xb,
        n_tokens: 1,
        routes: &rb1,
        bank: &bank,
        activation: Activation::Swiglu,
    };
    match h.st.moe(input, &mut scratch, &mut out) {
        Err(BackendError::BadRoute { .. }) => Ok(()),
        other => Err(property(
            OP,
            "bad route",
            format!("expected BadRoute, got {other:?}"),
        )),
    }
}

/// Host bytes a check rewrites between slot fills: the expert store's
/// slot buffer in miniature (its owner must be shareable, as
/// [`SharedBytes`] requires, and written in place, as the store's reads
/// write it).
struct Rewritable(std::cell::UnsafeCell<Vec<u8>>);

// SAFETY: written only by `write`, from the one thread that runs the
// check, never while a slice from `as_ref` is alive (each is used within
// one op call) nor before the device's copies from it were waited for.
unsafe impl Sync for Rewritable {}

impl AsRef<[u8]> for Rewritable {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: see the `Sync` impl.
        unsafe { &*self.0.get() }
    }
}

impl Rewritable {
    /// Copies `bytes` to `at`.
    ///
    /// # Safety
    /// No slice from `as_ref` is in use and no device copy reads the bytes.
    unsafe fn write(&self, at: usize, bytes: &[u8]) {
        let v: &mut Vec<u8> = &mut *self.0.get();
        v[at..at + bytes.len()].copy_from_slice(bytes);
    }
}

/// [`Stream::fill_slot`] from host memory the device pinned
/// ([`Device::pin_host`]), as the expert store fills its slots: device slot
/// `s` always from host slot `s`, the host slot rewritten for the next
/// token only after [`Stream::wait_slot_fills`], with nothing else waited
/// for between two tokens (their outputs go to two buffers, read after the
/// second). Each token's bits must be those of the resident bank. On a
/// device that pins nothing the fills are ordinary ones.
pub fn check_pinned_slot_fills<D: Device>(dev: &D) -> Result<(), ConformanceError> {
    const OP: &str = "fill_slot (pinned)";
    let mut rng = Rng(23);
    for formats in FORMAT_SETS {
        let case = format!("{}/{}/{}", formats[0], formats[1], formats[2]);
        let MoeCase {
            tensors,
            bank,
            mut slots,
            mut h,
            mut scratch,
            x,
            ..
        } = moe_case(dev, OP, formats, &mut rng)?;
        // The bytes of an expert, part by part, as one host slot holds them.
        fn parts(e: &ExpertTensors) -> Vec<&[u8]> {
            let mut v = vec![
                e.gate.bytes.as_slice(),
                e.up.bytes.as_slice(),
                e.down.bytes.as_slice(),
            ];
            for b in [&e.gate_bias, &e.up_bias, &e.down_bias]
                .into_iter()
                .flatten()
            {
                v.push(b.bytes.as_slice());
            }
            v
        }
        let slot_len: usize = parts(&tensors[0]).iter().map(|p| p.len()).sum();
        let region = Arc::new(Rewritable(std::cell::UnsafeCell::new(vec![
            0;
            TOP_K * slot_len
        ])));
        let owner: crate::host::ByteOwner = region.clone();
        let pin = dev.pin_host(&owner).at(OP, "pin_host")?;
        let memory = if pin.is_some() { "pinned" } else { "ordinary" };
        let slot_tensors: Vec<ExpertTensors> = (0..TOP_K)
            .map(|s| {
                let mut at = s * slot_len;
                let mut over = |t: &HostTensor| -> Result<HostTensor, ConformanceError> {
                    let bytes = SharedBytes::new(owner.clone(), at..at + t.bytes.len())
                        .at(OP, "slot bytes")?;
                    at += t.bytes.len();
                    Ok(HostTensor { bytes, ..t.clone() })
                };
                let e = &tensors[0];
                Ok(ExpertWeights {
                    gate: over(&e.gate)?,
                    up: over(&e.up)?,
                    down: over(&e.down)?,
                    gate_bias: e.gate_bias.as_ref().map(&mut over).transpose()?,
                    up_bias: e.up_bias.as_ref().map(&mut over).transpose()?,
                    down_bias: e.down_bias.as_ref().map(&mut over).transpose()?,
                })
            })
            .collect::<Result<_, _>>()?;
        let routes: Vec<Route> = (0..TOKENS * TOP_K)
            .map(|i| Route {
                slot: ((i * 5 + i / TOP_K + 1) % EXPERTS) as u32,
                weight: 0.3 + (i % 4) as f32 * 0.15,
            })
            .collect();
        let mut one = dev.alloc_routes(1, TOP_K).at(OP, "alloc_routes")?;
        let mut outs = [h.zeros(HIDDEN)?, h.zeros(HIDDEN)?];
        let mut want = h.zeros(HIDDEN)?;
        let xs: Vec<D::Buf> = (0..TOKENS)
            .map(|t| h.buf(&x[t * HIDDEN..(t + 1) * HIDDEN]))
            .collect::<Result<_, _>>()?;
        for t in 0..TOKENS {
            h.st.wait_slot_fills().at(OP, "wait_slot_fills")?;
            let mut remap = [Route::default(); TOP_K];
            for (s, m) in remap.iter_mut().enumerate() {
                let Route { slot, weight } = routes[t * TOP_K + s];
                let mut at = s * slot_len;
                for p in parts(&tensors[slot as usize]) {
                    // SAFETY: the fills queued from these bytes were waited
                    // for above, and no slice of them is in use.
                    unsafe { region.write(at, p) };
                    at += p.len();
                }
                h.st.fill_slot(&mut slots, s, &slot_tensors[s])
                    .at(OP, &case)?;
                *m = Route {
                    slot: s as u32,
                    weight,
                };
            }
            h.st.write_routes(&mut one, &remap).at(OP, &case)?;
            let input = MoeInput {
                x: &xs[t],
                n_tokens: 1,
                routes: &one,
                bank: &slots,
                activation: Activation::Swiglu,
            };
            h.st.moe(input, &mut scratch, &mut outs[t % 2])
                .at(OP, &case)?;
            if t % 2 == 0 && t + 1 < TOKENS {
                continue;
            }
            h.st.wait_slot_fills().at(OP, "wait_slot_fills")?;
            for u in t + 1 - (t % 2 + 1)..=t {
                let got = h.get(&outs[u % 2], HIDDEN)?;
                h.st.write_routes(&mut one, &routes[u * TOP_K..(u + 1) * TOP_K])
                    .at(OP, &case)?;
                let input = MoeInput {
                    x: &xs[u],
                    n_tokens: 1,
                    routes: &one,
                    bank: &bank,
                    activation: Activation::Swiglu,
                };
                h.st.moe(input, &mut scratch, &mut want).at(OP, &case)?;
                if h.get(&want, HIDDEN)? != got {
                    return Err(property(
                        OP,
                        &case,
                        format!("token {u} over slots filled from {memory} host memory differs from the resident bank"),
                    ));
                }
            }
        }
        drop(pin);
    }
    Ok(())
}

/// [`Stream::moe_intermediate`] over a resident bank: the f64 GLU
/// intermediate of every route within `tol.moe`; each token the same bits
/// alone as in the batch, and over a slot bank refilled with its experts
/// (what a census of streamed experts relies on); routes outside the bank
/// and an output too small refused.
pub fn check_moe_intermediate<D: Device>(
    dev: &D,
    tol: &Tolerances,
) -> Result<(), ConformanceError> {
    const OP: &str = "moe_intermediate";
    let mut rng = Rng(17);
    let MoeCase {
        experts,
        tensors,
        bank,
        mut slots,
        mut h,
        mut scratch,
        x,
        xb,
    } = moe_case(dev, OP, FORMAT_SETS[0], &mut rng)?;
    let routes: Vec<Route> = (0..TOKENS * TOP_K)
        .map(|i| Route {
            slot: ((i * 5 + i / TOP_K) % EXPERTS) as u32,
            weight: 0.5,
        })
        .collect();
    let mut rb = dev.alloc_routes(TOKENS, TOP_K).at(OP, "alloc_routes")?;
    h.st.write_routes(&mut rb, &routes).at(OP, "write_routes")?;
    let mut out = h.zeros(TOKENS * TOP_K * INTER)?;
    let mut one = dev.alloc_routes(1, TOP_K).at(OP, "alloc_routes")?;
    let mut one_out = h.zeros(TOP_K * INTER)?;
    for act in [
        Activation::Swiglu,
        Activation::ClampedSwiglu {
            alpha: 1.702,
            limit: 0.5,
        },
        Activation::GeluTanh,
    ] {
        let case = format!("{act:?}");
        let input = MoeInput {
            x: &xb,
            n_tokens: TOKENS,
            routes: &rb,
            bank: &bank,
            activation: act,
        };
        h.st.moe_intermediate(input, &mut scratch, &mut out)
            .at(OP, &case)?;
        let got = h.get(&out, TOKENS * TOP_K * INTER)?;
        let mut want = Vec::with_capacity(TOKENS * TOP_K * INTER);
        let mut mags = Vec::with_capacity(TOKENS * TOP_K * INTER);
        for (i, r) in routes.iter().enumerate() {
            let e = &experts[r.slot as usize];
            let xt = &x[(i / TOP_K) * HIDDEN..(i / TOP_K + 1) * HIDDEN];
            for j in 0..INTER {
                let row = |m: &[f32]| reference::dot(&m[j * HIDDEN..(j + 1) * HIDDEN], xt);
                let ((g, gm), (u, um)) = (row(&e.gate), row(&e.up));
                let g = g + f64::from(e.biases[0][j]);
                let u = u + f64::from(e.biases[1][j]);
                want.push(reference::glu(act, g, u));
                // Each projection's error scaled by the GLU's slope in it:
                // the secant over the error the tolerance allows that
                // projection, so that a clamp's kink inside that interval
                // counts (8-bit activations move g and u by up to it).
                let (dg, du) = (tol.moe * (1.0 + gm), tol.moe * (1.0 + um));
                let (dg, du) = (
                    dg.max(1e-4 * (1.0 + g.abs())),
                    du.max(1e-4 * (1.0 + u.abs())),
                );
                let sg =
                    (reference::glu(act, g + dg, u) - reference::glu(act, g - dg, u)) / (2.0 * dg);
                let su =
                    (reference::glu(act, g, u + du) - reference::glu(act, g, u - du)) / (2.0 * du);
                mags.push(sg.abs() * gm + su.abs() * um + 1.0);
            }
        }
        compare(OP, &case, &got, &want, tol.moe, |i| mags[i])?;

        // Each token alone, over the resident bank and over slots
        // refilled with its experts.
        let width = TOP_K * INTER;
        let x1 = |h: &mut Harness<'_, D>, t: usize| h.buf(&x[t * HIDDEN..(t + 1) * HIDDEN]);
        for t in 0..TOKENS {
            let r = &routes[t * TOP_K..(t + 1) * TOP_K];
            let xt = x1(&mut h, t)?;
            h.st.write_routes(&mut one, r).at(OP, &case)?;
            let input = MoeInput {
                x: &xt,
                n_tokens: 1,
                routes: &one,
                bank: &bank,
                activation: act,
            };
            h.st.moe_intermediate(input, &mut scratch, &mut one_out)
                .at(OP, &case)?;
            let alone = h.get(&one_out, width)?;
            if tol.batch_invariant && alone[..] != got[t * width..(t + 1) * width] {
                return Err(property(
                    OP,
                    &case,
                    format!("token {t} alone differs from the batch"),
                ));
            }
            let mut remap = [Route::default(); TOP_K];
            for (s, (m, r)) in remap.iter_mut().zip(r).enumerate() {
                h.st.fill_slot(&mut slots, s, &tensors[r.slot as usize])
                    .at(OP, "fill_slot")?;
                *m = Route {
                    slot: s as u32,
                    weight: r.weight,
                };
            }
            h.st.write_routes(&mut one, &remap).at(OP, &case)?;
            let input = MoeInput {
                x: &xt,
                n_tokens: 1,
                routes: &one,
                bank: &slots,
                activation: act,
            };
            h.st.moe_intermediate(input, &mut scratch, &mut one_out)
                .at(OP, &case)?;
            if h.get(&one_out, width)? != alone {
                return Err(property(
                    OP,
                    &case,
                    format!("token {t} over refilled slots differs from the resident bank"),
                ));
            }
        }
    }

    let input = MoeInput {
        x: &xb,
        n_tokens: TOKENS,
        routes: &rb,
        bank: &bank,
        activation: Activation::Swiglu,
    };
    let mut short = h.zeros(TOKENS * TOP_K * INTER - 1)?;
    if h.st
        .moe_intermediate(input, &mut scratch, &mut short)
        .is_ok()
    {
        return Err(property(
            OP,
            "short output",
            "wrote into a buffer smaller than [n · top_k, intermediate]".into(),
        ));
    }
    let bad = [Route {
        slot: EXPERTS as u32,
        weight: 1.0,
    }; TOP_K];
    h.st.write_routes(&mut one, &bad).at(OP, "bad route")?;
    let input = MoeInput {
        n_tokens: 1,
        routes: &one,
        ..input
    };
    match h.st.moe_intermediate(input, &mut scratch, &mut one_out) {
        Err(BackendError::BadRoute { .. }) => Ok(()),
        other => Err(property(
            OP,
            "bad route",
            format!("expected BadRoute, got {other:?}"),
        )),
    }
}

/// A token's router product, its bias, its routing and its routed experts
/// issued one after another — the decode step's order, which a backend may
/// fuse (the CUDA backend, with `TURBOSPARK_CUDA_FUSE=1`, routes in a Q8_0
/// product's launch and quantizes the experts' input there; with
/// `TURBOSPARK_CUDA_BF16=stream+route`, in a bf16 product's) — give the
/// same logits, routes and output bits as the same ops with a copy of the
/// logits between product and routing and another between routing and
/// experts, which nothing fuses across. Also when a logit is NaN (a bias
/// of NaN: routers then take their general path). Both with the product's
/// input given, and
/// with it made just before by the decode step's residual add, copy and
/// RMS norm (one CUDA launch, which also quantizes the product's input):
/// then the residual stream and the normed input must match too, and so
/// must the next layer's start — the experts' output added into the
/// residual stream, copied and normed (one CUDA launch that also forms
/// the sum of the routes' outputs).
pub fn check_router_then_experts<D: Device>(dev: &D) -> Result<(), ConformanceError> {
    const OP: &str = "route after the router product";
    let mut rng = Rng(41);
    // A Q8_0 router (8-bit activations) and a bf16 one (gpt-oss's own
    // format; the CUDA backend can route in its product's launch too).
    let routers = [QuantFormat::Q8_0, QuantFormat::Bf16].map(|f| {
        let m = random_matrix("ffn_gate_inp", f, EXPERTS, HIDDEN, &mut rng);
        dev.upload_matrix(&m).at(OP, "upload")
    });
    let [q8_router, bf16_router] = routers;
    let routers = [
        (QuantFormat::Q8_0, q8_router?),
        (QuantFormat::Bf16, bf16_router?),
    ];
    let bias = rng.scaled(EXPERTS, 0.5);
    let mut nan_bias = bias.clone();
    nan_bias[2] = f32::NAN;
    let [bias, nan_bias] = [bias, nan_bias].map(|b| {
        dev.upload_vector(&f32_tensor("ffn_gate_inp.bias", vec![EXPERTS], &b))
            .at(OP, "upload")
    });
    let (bias, nan_bias) = (bias?, nan_bias?);
    let spec = RouterSpec::new(RouterKind::TopKSoftmax, EXPERTS, TOP_K).at(OP, "spec")?;
    let norm_w = rng.scaled(HIDDEN, 1.0);
    let norm_w = dev
        .upload_vector(&f32_tensor("ffn_norm", vec![HIDDEN], &norm_w))
        .at(OP, "upload")?;
    for (formats, (router_format, router)) in FORMAT_SETS
        .iter()
        .flat_map(|f| routers.iter().map(move |r| (f, r)))
    {
        let case = format!(
            "{}/{}/{}, {router_format} router",
            formats[0], formats[1], formats[2]
        );
        let MoeCase {
            bank,
            mut h,
            mut scratch,
            x,
            ..
        } = moe_case(dev, OP, *formats, &mut rng)?;
        for t in 0..7 {
            // Tokens 3..6: the input normed from a residual stream; token
            // 6: a NaN logit.
            let normed = (3..6).contains(&t);
            let bias = if t == 6 { &nan_bias } else { &bias };
            let xs = &x[(t % 3) * HIDDEN..(t % 3 + 1) * HIDDEN];
            let o = rng.scaled(HIDDEN, 1.0);
            let mut got = Vec::new();
            for split in [false, true] {
                let mut xt = h.buf(xs)?;
                let mut resid = h.buf(xs)?;
                if normed {
                    let ob = h.buf(&o)?;
                    h.st.add(&mut resid, &ob, HIDDEN).at(OP, &case)?;
                    h.st.copy(&resid, 0, &mut xt, 0, HIDDEN).at(OP, &case)?;
                    h.st.rms_norm(&mut xt, 1, HIDDEN, NormSpec::plain(1e-5), Some(&norm_w))
                        .at(OP, &case)?;
                }
                let mut logits = h.zeros(EXPERTS)?;
                let mut copied = h.zeros(EXPERTS)?;
                let mut spare = h.zeros(EXPERTS)?;
                let mut routes = dev.alloc_routes(1, TOP_K).at(OP, "alloc_routes")?;
                let mut out = h.zeros(HIDDEN)?;
                let mut out_copy = h.zeros(HIDDEN)?;
                let mut next = h.zeros(HIDDEN)?;
                h.st.matmul(router, &xt, 1, &mut logits).at(OP, &case)?;
                h.st.add_bias(&mut logits, bias, 1).at(OP, &case)?;
                let routed = if split {
                    h.st.copy(&logits, 0, &mut copied, 0, EXPERTS)
                        .at(OP, &case)?;
                    &copied
                } else {
                    &logits
                };
                h.st.route(routed, 1, &spec, RouterTables::default(), &mut routes)
                    .at(OP, &case)?;
                if split {
                    h.st.copy(routed, 0, &mut spare, 0, EXPERTS).at(OP, &case)?;
                }
                let input = MoeInput {
                    x: &xt,
                    n_tokens: 1,
                    routes: &routes,
                    bank: &bank,
                    activation: Activation::Swiglu,
                };
                h.st.moe(input, &mut scratch, &mut out).at(OP, &case)?;
                if normed {
                    // The next layer's start: the MoE output added into the
                    // residual stream, copied and normed (the CUDA backend
                    // forms the routes' sum in that norm) — split: after a
                    // copy of the output, which nothing fuses across.
                    if split {
                        h.st.copy(&out, 0, &mut out_copy, 0, HIDDEN).at(OP, &case)?;
                        h.st.add(&mut resid, &out_copy, HIDDEN).at(OP, &case)?;
                    } else {
                        h.st.add(&mut resid, &out, HIDDEN).at(OP, &case)?;
                    }
                    h.st.copy(&resid, 0, &mut next, 0, HIDDEN).at(OP, &case)?;
                    h.st.rms_norm(&mut next, 1, HIDDEN, NormSpec::plain(1e-5), Some(&norm_w))
                        .at(OP, &case)?;
                }
                let mut r = vec![Route::default(); TOP_K];
                h.st.read_routes(&routes, &mut r).at(OP, &case)?;
                let r: Vec<(u32, u32)> = r.iter().map(|r| (r.slot, r.weight.to_bits())).collect();
                got.push((
                    bits(&h.get(&logits, EXPERTS)?),
                    r,
                    bits(&h.get(&out, HIDDEN)?),
                    bits(&h.get(&xt, HIDDEN)?),
                    bits(&h.get(&resid, HIDDEN)?),
                    bits(&h.get(&next, HIDDEN)?),
                ));
            }
            for (what, same) in [
                ("logits", got[0].0 == got[1].0),
                ("routes", got[0].1 == got[1].1),
                ("experts' output", got[0].2 == got[1].2),
                ("normed input", got[0].3 == got[1].3),
                ("residual stream", got[0].4 == got[1].4),
                ("next layer's normed input", got[0].5 == got[1].5),
            ] {
                if !same {
                    return Err(property(
                        OP,
                        &case,
                        format!("token {t}: {what} differ from the unfused ops'"),
                    ));
                }
            }
        }
    }
    Ok(())
}
