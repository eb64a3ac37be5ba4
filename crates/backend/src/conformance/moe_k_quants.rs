//! Routed experts over banks of super-block formats (Q4_K gate and up
//! with a Q6_K down, as llama.cpp's Q4_K_M stores Mixtral's and
//! Qwen3-MoE's experts): rows a multiple of 256 wide, which
//! [`super::moe`]'s banks (320 and 160 wide, for partial blocks) cannot
//! hold.

use super::data::{dequantized, random_matrix, Rng};
use super::moe::{each_token_as_in_batch, first_tokens_as_in_batch};
use super::{compare, reference, ConformanceError, Context, Harness, Tolerances};
use crate::{Device, ExpertWeights, Limits, MoeInput, MoeScratch, Route, Stream};
use turbospark_core::arch::Activation;
use turbospark_core::QuantFormat;

const HIDDEN: usize = 512;
const INTER: usize = 768;
const EXPERTS: usize = 4;
const TOP_K: usize = 2;
/// Enough tokens that backends' batched (tensor-core) paths take part.
const TOKENS: usize = 24;
const FORMATS: [QuantFormat; 3] = [QuantFormat::Q4K, QuantFormat::Q4K, QuantFormat::Q6K];

/// `moe` over a bank of [`FORMATS`]: the f64 formula over the
/// reference-dequantized experts within `tol.moe`, and each token alone
/// (and the first few tokens together) the bits it has in the batch.
pub fn check_moe_k_quants<D: Device>(dev: &D, tol: &Tolerances) -> Result<(), ConformanceError> {
    const OP: &str = "moe (K-quant bank)";
    let mut rng = Rng(77);
    let [gf, uf, df] = FORMATS;
    let mut tensors = Vec::new();
    let mut values = Vec::new();
    for e in 0..EXPERTS {
        let gate = random_matrix(&format!("gate{e}"), gf, INTER, HIDDEN, &mut rng);
        let up = random_matrix(&format!("up{e}"), uf, INTER, HIDDEN, &mut rng);
        let down = random_matrix(&format!("down{e}"), df, HIDDEN, INTER, &mut rng);
        values.push([dequantized(&gate), dequantized(&up), dequantized(&down)]);
        tensors.push(ExpertWeights {
            gate,
            up,
            down,
            gate_bias: None,
            up_bias: None,
            down_bias: None,
        });
    }
    let bank = dev.upload_bank(&tensors).at(OP, "upload_bank")?;
    let limits = Limits {
        max_tokens: TOKENS,
        max_routes: TOKENS * TOP_K,
        max_expert_intermediate: INTER,
        max_experts: EXPERTS,
        ..Limits::default()
    };
    let mut h = Harness::new(dev, limits)?;
    let mut scratch = MoeScratch {
        x: h.zeros(TOKENS * HIDDEN)?,
        gate: h.zeros(TOKENS * INTER)?,
        up: h.zeros(TOKENS * INTER)?,
        y: h.zeros(TOKENS * TOP_K * HIDDEN)?,
    };
    let x = rng.vec(TOKENS * HIDDEN);
    let xb = h.buf(&x)?;
    let routes: Vec<Route> = (0..TOKENS * TOP_K)
        .map(|i| Route {
            slot: ((i * 3 + i / TOP_K) % EXPERTS) as u32,
            weight: 0.3 + (i % 3) as f32 * 0.2,
        })
        .collect();
    let mut rb = dev.alloc_routes(TOKENS, TOP_K).at(OP, "alloc_routes")?;
    h.st.write_routes(&mut rb, &routes).at(OP, "write_routes")?;
    let act = Activation::Swiglu;
    let case = format!("{gf}/{uf}/{df}, {HIDDEN} → {INTER}");
    let input = MoeInput {
        x: &xb,
        n_tokens: TOKENS,
        routes: &rb,
        bank: &bank,
        activation: act,
    };
    let mut out = h.zeros(TOKENS * HIDDEN)?;
    h.st.moe(input, &mut scratch, &mut out).at(OP, &case)?;
    let got = h.get(&out, TOKENS * HIDDEN)?;

    // The f64 formula: Σ_r weight_r · down_e(glu(gate_e · x, up_e · x)).
    let mut want = vec![(0f64, 0f64); TOKENS * HIDDEN];
    for t in 0..TOKENS {
        let xt = &x[t * HIDDEN..(t + 1) * HIDDEN];
        for r in 0..TOP_K {
            let Route { slot, weight } = routes[t * TOP_K + r];
            let [gate, up, down] = &values[slot as usize];
            let a: Vec<(f64, f64)> = (0..INTER)
                .map(|i| {
                    let (g, gm) = reference::dot(&gate[i * HIDDEN..(i + 1) * HIDDEN], xt);
                    let (u, um) = reference::dot(&up[i * HIDDEN..(i + 1) * HIDDEN], xt);
                    (reference::glu(act, g, u), gm + um + 1.0)
                })
                .collect();
            let w = f64::from(weight);
            for (o, slot) in want[t * HIDDEN..(t + 1) * HIDDEN].iter_mut().enumerate() {
                let d = &down[o * INTER..(o + 1) * INTER];
                let (y, m) = d
                    .iter()
                    .zip(&a)
                    .fold((0.0, 0.0), |(s, m), (&dw, &(v, vm))| {
                        let p = f64::from(dw) * v;
                        (s + p, m + p.abs() + f64::from(dw).abs() * vm)
                    });
                *slot = (slot.0 + w * y, slot.1 + w.abs() * (m + 1.0));
            }
        }
    }
    let (values, mags): (Vec<f64>, Vec<f64>) = want.into_iter().unzip();
    compare(OP, &case, &got, &values, tol.moe, |i| mags[i])?;

    // The first few tokens together, and each token alone, give the bits
    // they have in the batch.
    first_tokens_as_in_batch(
        &mut h,
        &mut scratch,
        input,
        &got,
        &[1, 3, 16],
        tol,
        OP,
        &case,
    )?;
    each_token_as_in_batch(
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
    Ok(())
}
