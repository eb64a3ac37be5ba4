//! Row-wise and element-wise ops: bias, RMS norm, rope, GLU, add, scale,
//! sigmoid gate, soft-cap.

use super::data::{f32_tensor, Rng};
use super::{compare_rel, property, reference, ConformanceError, Context, Harness, Tolerances};
use crate::{Device, Limits, RopeTable, Stream};
use turbospark_core::arch::{Activation, NormSpec, RopeKind, RopeScaling, RopeSpec};

/// An odd length that is not a multiple of any SIMD width.
const LEN: usize = 7 * 37;

pub fn check_add_bias<D: Device>(dev: &D, tol: &Tolerances) -> Result<(), ConformanceError> {
    const OP: &str = "add_bias";
    let (n, d) = (7, 37);
    let mut rng = Rng(11);
    let (x, b) = (rng.vec(n * d), rng.vec(d));
    let bias = dev
        .upload_vector(&f32_tensor("bias", vec![d], &b))
        .at(OP, "upload")?;
    if dev.vector_len(&bias) != d {
        return Err(property(OP, "upload", "vector_len".into()));
    }
    let mut h = Harness::new(dev, Limits::default())?;
    let mut xb = h.buf(&x)?;
    h.st.add_bias(&mut xb, &bias, n).at(OP, "7 rows")?;
    let got = h.get(&xb, n * d)?;
    let want: Vec<f64> = (0..n * d)
        .map(|i| f64::from(x[i]) + f64::from(b[i % d]))
        .collect();
    compare_rel(OP, "7 rows", &got, &want, tol.elementwise)?;
    if h.st.add_bias(&mut xb, &bias, n + 1).is_ok() {
        return Err(property(OP, "8 rows", "wrote past the buffer".into()));
    }
    Ok(())
}

/// Every norm scale (plain `w`, centered `1 + w`, none), rows of an odd
/// width, the per-head shape (many rows of a head's width), and rows a
/// multiple of 32 wide (gpt-oss's 2880; 96, part of a warp), which a
/// backend may lay out differently.
pub fn check_rms_norm<D: Device>(dev: &D, tol: &Tolerances) -> Result<(), ConformanceError> {
    const OP: &str = "rms_norm";
    let mut rng = Rng(12);
    let mut cases = Vec::new();
    for (rows, dim) in [(5, 203), (24, 16), (3, 2880), (4, 96)] {
        let w = rng.vec(dim);
        let wv = dev
            .upload_vector(&f32_tensor("norm", vec![dim], &w))
            .at(OP, "upload")?;
        let x: Vec<f32> = rng.scaled(rows * dim, 3.0);
        cases.push((rows, dim, w, wv, x));
    }
    let mut h = Harness::new(dev, Limits::default())?;
    for (rows, dim, w, wv, x) in &cases {
        for spec in [
            NormSpec::plain(1e-6),
            NormSpec::centered(1e-5),
            NormSpec::no_scale(1e-6),
        ] {
            let case = format!("{rows}×{dim}, {:?}", spec.scale);
            let weight = spec.has_weight().then_some(wv);
            let mut xb = h.buf(x)?;
            h.st.rms_norm(&mut xb, *rows, *dim, spec, weight)
                .at(OP, &case)?;
            let got = h.get(&xb, rows * dim)?;
            let want: Vec<f64> = x
                .chunks_exact(*dim)
                .flat_map(|r| reference::rms_norm(r, spec, spec.has_weight().then_some(&w[..])))
                .collect();
            compare_rel(OP, &case, &got, &want, tol.elementwise)?;
            let wrong = if spec.has_weight() { None } else { Some(wv) };
            if h.st.rms_norm(&mut xb, *rows, *dim, spec, wrong).is_ok() {
                return Err(property(OP, &case, "accepted a mismatched weight".into()));
            }
        }
    }
    Ok(())
}

/// The YaRN scaling the rope checks use: a 4× extension of 64 positions
/// with an attention factor (cos/sin scaled) of 1.2.
pub(super) fn yarn_scaling() -> RopeScaling {
    RopeScaling::Yarn {
        factor: 4.0,
        original_max_position: 64,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attention_factor: 1.2,
        truncate: true,
    }
}

/// Neox and interleaved pairs, a partial rotary width, a YaRN factor, at
/// positions past the first.
pub fn check_rope<D: Device>(dev: &D, tol: &Tolerances) -> Result<(), ConformanceError> {
    const OP: &str = "rope";
    let (n, heads, hd) = (3, 5, 24);
    let limits = Limits {
        max_tokens: n,
        max_head_dim: hd,
        ..Limits::default()
    };
    let mut h = Harness::new(dev, limits)?;
    let mut rng = Rng(13);
    let yarn = yarn_scaling();
    for (kind, rotary_dim, scaling) in [
        (RopeKind::Neox, hd, RopeScaling::None),
        (RopeKind::Interleaved, hd, RopeScaling::None),
        (RopeKind::Neox, 16, yarn),
    ] {
        let spec = RopeSpec {
            kind,
            theta: 10000.0,
            rotary_dim,
            scaling,
        };
        let table = RopeTable::new(&spec);
        let case = format!("{kind:?}, {rotary_dim} of {hd} dims, {scaling:?}");
        let x = rng.vec(n * heads * hd);
        let first = 29;
        let mut xb = h.buf(&x)?;
        h.st.rope(&mut xb, n, heads, hd, first, &table)
            .at(OP, &case)?;
        let got = h.get(&xb, x.len())?;
        let want: Vec<f64> = x
            .chunks_exact(hd)
            .enumerate()
            .flat_map(|(i, head)| reference::rope(head, first + i / heads, &table))
            .collect();
        compare_rel(OP, &case, &got, &want, tol.elementwise.max(1e-5))?;
    }
    Ok(())
}

/// Every activation, including the clamp of gpt-oss's SwiGLU.
pub fn check_glu<D: Device>(dev: &D, tol: &Tolerances) -> Result<(), ConformanceError> {
    const OP: &str = "glu";
    let mut h = Harness::new(dev, Limits::default())?;
    let mut rng = Rng(14);
    let (g, u) = (rng.scaled(LEN, 4.0), rng.scaled(LEN, 4.0));
    for act in [
        Activation::Swiglu,
        Activation::GeluTanh,
        Activation::ClampedSwiglu {
            alpha: 1.702,
            limit: 2.5,
        },
    ] {
        let case = format!("{act:?}");
        let mut gb = h.buf(&g)?;
        let ub = h.buf(&u)?;
        h.st.glu(&mut gb, &ub, LEN, act).at(OP, &case)?;
        let got = h.get(&gb, LEN)?;
        let want: Vec<f64> = (0..LEN)
            .map(|i| reference::glu(act, f64::from(g[i]), f64::from(u[i])))
            .collect();
        compare_rel(OP, &case, &got, &want, tol.activation)?;
    }
    Ok(())
}

/// `dst += src` over a prefix; the rest stays. Also with the source
/// dropped as soon as the call returns, and dropped after the add was
/// recorded in a decode step that is then replayed.
pub fn check_add<D: Device>(dev: &D, tol: &Tolerances) -> Result<(), ConformanceError> {
    const OP: &str = "add";
    let mut h = Harness::new(dev, Limits::default())?;
    let mut rng = Rng(15);
    let (a, b) = (rng.vec(LEN), rng.vec(LEN));
    let mut ab = h.buf(&a)?;
    let bb = h.buf(&b)?;
    let len = LEN - 3;
    h.st.add(&mut ab, &bb, len).at(OP, "prefix")?;
    let got = h.get(&ab, LEN)?;
    let want: Vec<f64> = (0..LEN)
        .map(|i| f64::from(a[i]) + if i < len { f64::from(b[i]) } else { 0.0 })
        .collect();
    compare_rel(OP, "prefix", &got, &want, tol.elementwise)?;
    // The source dropped as soon as the add's call returns, and a new
    // buffer of its size allocated and written before anything waits:
    // the add (held back, or queued, by an asynchronous backend) must
    // still read the source's values, not what took its memory.
    let mut cb = h.buf(&a)?;
    {
        let dropped = h.buf(&b)?;
        h.st.add(&mut cb, &dropped, LEN).at(OP, "dropped source")?;
    }
    let other = rng.vec(LEN);
    let _taken = h.buf(&other)?;
    let got = h.get(&cb, LEN)?;
    let want: Vec<f64> = (0..LEN)
        .map(|i| f64::from(a[i]) + f64::from(b[i]))
        .collect();
    compare_rel(OP, "dropped source", &got, &want, tol.elementwise)?;
    // The same in a recorded decode step, where the backend records them:
    // the source dropped once the step is recorded, a new buffer written
    // before a replay; the replay must still add the source's values.
    if h.st.records_steps() {
        let mut acc = h.buf(&a)?;
        h.st.synchronize().at(OP, "recorded step")?;
        {
            let dropped = h.buf(&b)?;
            h.st.synchronize().at(OP, "recorded step")?;
            h.st.begin_step(0, 0).at(OP, "recorded step")?;
            h.st.add(&mut acc, &dropped, LEN).at(OP, "recorded step")?;
            h.st.end_step().at(OP, "recorded step")?;
            h.st.synchronize().at(OP, "recorded step")?;
        }
        let _taken = h.buf(&other)?;
        if !h.st.replay_step(0, 1).at(OP, "recorded step")? {
            return Err(property(OP, "recorded step", "no step to replay".into()));
        }
        let got = h.get(&acc, LEN)?;
        let want: Vec<f64> = (0..LEN)
            .map(|i| f64::from(a[i]) + f64::from(b[i]) + f64::from(b[i]))
            .collect();
        compare_rel(OP, "recorded step", &got, &want, tol.elementwise)?;
    }
    if h.st.add(&mut ab, &bb, LEN + 1).is_ok() {
        return Err(property(OP, "overlong", "read past the buffers".into()));
    }
    Ok(())
}

pub fn check_scale<D: Device>(dev: &D, tol: &Tolerances) -> Result<(), ConformanceError> {
    const OP: &str = "scale";
    let mut h = Harness::new(dev, Limits::default())?;
    let x = Rng(16).vec(LEN);
    let mut xb = h.buf(&x)?;
    h.st.scale(&mut xb, LEN, -0.37).at(OP, "all")?;
    let got = h.get(&xb, LEN)?;
    let want: Vec<f64> = x
        .iter()
        .map(|&v| f64::from(v) * f64::from(-0.37f32))
        .collect();
    compare_rel(OP, "all", &got, &want, tol.elementwise)
}

/// Ablation (`alpha = −1, beta = 0`), clamping (`−1, c`) and a general
/// affine change of each row's component along a unit vector; the ablated
/// rows must then have no component left along it.
pub fn check_adjust_projection<D: Device>(
    dev: &D,
    tol: &Tolerances,
) -> Result<(), ConformanceError> {
    const OP: &str = "adjust_projection";
    let (n, d) = (5, 37);
    let mut rng = Rng(19);
    let x = rng.scaled(n * d, 4.0);
    let raw = rng.vec(d);
    let norm = raw
        .iter()
        .map(|&v| f64::from(v) * f64::from(v))
        .sum::<f64>()
        .sqrt();
    let u: Vec<f32> = raw.iter().map(|&v| (f64::from(v) / norm) as f32).collect();
    let uv = dev
        .upload_vector(&f32_tensor("direction", vec![d], &u))
        .at(OP, "upload")?;
    let mut h = Harness::new(dev, Limits::default())?;
    for (alpha, beta) in [(-1.0f32, 0.0f32), (-1.0, 2.5), (0.5, -1.25)] {
        let case = format!("{n}×{d}, alpha {alpha}, beta {beta}");
        let mut xb = h.buf(&x)?;
        h.st.adjust_projection(&mut xb, n, &uv, alpha, beta)
            .at(OP, &case)?;
        let got = h.get(&xb, n * d)?;
        let want: Vec<f64> = x
            .chunks_exact(d)
            .flat_map(|row| {
                let (dot, _) = reference::dot(row, &u);
                let c = f64::from(alpha) * dot + f64::from(beta);
                row.iter()
                    .zip(&u)
                    .map(move |(&v, &b)| f64::from(v) + c * f64::from(b))
            })
            .collect();
        compare_rel(OP, &case, &got, &want, tol.elementwise)?;
        if alpha == -1.0 {
            for (t, row) in got.chunks_exact(d).enumerate() {
                let (dot, mag) = reference::dot(row, &u);
                if (dot - f64::from(beta)).abs() > tol.matmul * (1.0 + mag) {
                    return Err(property(
                        OP,
                        &case,
                        format!("row {t} keeps a component {dot} along u, {beta} was asked"),
                    ));
                }
            }
        }
    }
    let mut xb = h.buf(&x)?;
    if h.st
        .adjust_projection(&mut xb, n + 1, &uv, -1.0, 0.0)
        .is_ok()
    {
        return Err(property(OP, "6 rows", "wrote past the buffer".into()));
    }
    Ok(())
}

pub fn check_mul_sigmoid<D: Device>(dev: &D, tol: &Tolerances) -> Result<(), ConformanceError> {
    const OP: &str = "mul_sigmoid";
    let mut h = Harness::new(dev, Limits::default())?;
    let mut rng = Rng(17);
    let (x, g) = (rng.vec(LEN), rng.scaled(LEN, 6.0));
    let mut xb = h.buf(&x)?;
    let gb = h.buf(&g)?;
    h.st.mul_sigmoid(&mut xb, &gb, LEN).at(OP, "all")?;
    let got = h.get(&xb, LEN)?;
    let want: Vec<f64> = (0..LEN)
        .map(|i| f64::from(x[i]) * reference::sigmoid(f64::from(g[i])))
        .collect();
    compare_rel(OP, "all", &got, &want, tol.elementwise)
}

pub fn check_softcap<D: Device>(dev: &D, tol: &Tolerances) -> Result<(), ConformanceError> {
    const OP: &str = "softcap";
    let mut h = Harness::new(dev, Limits::default())?;
    let x = Rng(18).scaled(LEN, 60.0);
    for cap in [30.0f32, 2.5] {
        let case = format!("cap {cap}");
        let mut xb = h.buf(&x)?;
        h.st.softcap(&mut xb, LEN, cap).at(OP, &case)?;
        let got = h.get(&xb, LEN)?;
        let want: Vec<f64> = x
            .iter()
            .map(|&v| reference::softcap(f64::from(v), f64::from(cap)))
            .collect();
        compare_rel(OP, &case, &got, &want, tol.elementwise.max(1e-5))?;
    }
    Ok(())
}
