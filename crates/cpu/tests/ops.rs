//! CPU attention and routed-expert ops against straightforward f64
//! re-implementations of the HF formulas (`eager_attention_forward` with
//! sinks / soft-cap / sliding window / GQA; the expert loop of
//! `GptOssExperts` and `MixtralExperts`).

mod common;

use common::{f32_tensor, random_matrix, Rng};
use turbospark_backend::{
    AttentionParams, Backend, ExpertWeights, Limits, MoeInput, MoeScratch, Route,
};
use turbospark_core::arch::Activation;
use turbospark_core::QuantFormat;
use turbospark_cpu::{CpuBackend, CpuBuf};

fn buf(be: &CpuBackend, v: &[f32]) -> CpuBuf {
    let mut b = be.alloc(v.len()).unwrap();
    be.write(&mut b, v).unwrap();
    b
}

const SCALE: f32 = 0.3;

struct Case {
    n_heads: usize,
    n_kv: usize,
    hd: usize,
    window: Option<usize>,
    sinks: bool,
    softcap: Option<f32>,
}

/// f64 attention of query head `h` at position `pos` over the full history.
fn reference(
    c: &Case,
    q: &[f32],
    ks: &[Vec<f32>],
    vs: &[Vec<f32>],
    pos: usize,
    h: usize,
    sink: Option<f32>,
) -> Vec<f64> {
    let scale = SCALE;
    let kvh = h / (c.n_heads / c.n_kv);
    let lo = c.window.map_or(0, |w| (pos + 1).saturating_sub(w));
    let mut s: Vec<f64> = (lo..=pos)
        .map(|j| {
            let k = &ks[j][kvh * c.hd..(kvh + 1) * c.hd];
            let mut v = q
                .iter()
                .zip(k)
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum::<f64>()
                * scale as f64;
            if let Some(cap) = c.softcap {
                v = (v / cap as f64).tanh() * cap as f64;
            }
            v
        })
        .collect();
    let m = s
        .iter()
        .cloned()
        .chain(sink.map(f64::from))
        .fold(f64::NEG_INFINITY, f64::max);
    s.iter_mut().for_each(|v| *v = (*v - m).exp());
    let denom: f64 = s.iter().sum::<f64>() + sink.map_or(0.0, |x| (x as f64 - m).exp());
    let mut out = vec![0f64; c.hd];
    for (w, j) in s.iter().zip(lo..=pos) {
        for (o, &v) in out.iter_mut().zip(&vs[j][kvh * c.hd..(kvh + 1) * c.hd]) {
            *o += w / denom * v as f64;
        }
    }
    out
}

#[test]
fn attention_matches_reference_through_a_ring_buffer() {
    let cases = [
        Case {
            n_heads: 4,
            n_kv: 2,
            hd: 16,
            window: None,
            sinks: false,
            softcap: None,
        },
        Case {
            n_heads: 4,
            n_kv: 1,
            hd: 8,
            window: Some(4),
            sinks: true,
            softcap: None,
        },
        Case {
            n_heads: 2,
            n_kv: 2,
            hd: 32,
            window: Some(5),
            sinks: false,
            softcap: Some(3.0),
        },
    ];
    for threads in [1, 2] {
        let be = CpuBackend::new(threads).unwrap();
        for c in &cases {
            let mut rng = Rng(42);
            let total = 23;
            let chunk = 4;
            let capacity = c.window.map_or(total, |w| w + chunk - 1);
            be.reserve(&Limits {
                max_tokens: chunk,
                max_keys: capacity,
                max_head_dim: c.hd,
            })
            .unwrap();
            let row = c.n_kv * c.hd;
            let ks: Vec<Vec<f32>> = (0..total).map(|_| rng.vec(row)).collect();
            let vs: Vec<Vec<f32>> = (0..total).map(|_| rng.vec(row)).collect();
            let qs: Vec<Vec<f32>> = (0..total).map(|_| rng.vec(c.n_heads * c.hd)).collect();
            let sinks: Vec<f32> = rng.vec(c.n_heads).iter().map(|v| v * 2.0).collect();
            let sink_vec = be
                .upload_vector(&f32_tensor("sinks", vec![c.n_heads], &sinks))
                .unwrap();
            let mut kc = be.alloc(capacity * row).unwrap();
            let mut vc = be.alloc(capacity * row).unwrap();
            let scale = SCALE;
            let mut first = 0;
            while first < total {
                let n = chunk.min(total - first);
                let k_new = buf(&be, &ks[first..first + n].concat());
                let v_new = buf(&be, &vs[first..first + n].concat());
                be.kv_write(&mut kc, &k_new, n, row, first, capacity)
                    .unwrap();
                be.kv_write(&mut vc, &v_new, n, row, first, capacity)
                    .unwrap();
                let q = buf(&be, &qs[first..first + n].concat());
                let mut out = be.alloc(n * c.n_heads * c.hd).unwrap();
                let p = AttentionParams {
                    n_tokens: n,
                    first_pos: first,
                    n_heads: c.n_heads,
                    n_kv_heads: c.n_kv,
                    head_dim: c.hd,
                    capacity,
                    window: c.window,
                    scale,
                    softcap: c.softcap,
                };
                be.attention(&q, &kc, &vc, &p, c.sinks.then_some(&sink_vec), &mut out)
                    .unwrap();
                let mut got = vec![0f32; n * c.n_heads * c.hd];
                be.read(&out, &mut got).unwrap();
                for t in 0..n {
                    for h in 0..c.n_heads {
                        let q = &qs[first + t][h * c.hd..(h + 1) * c.hd];
                        let sink = c.sinks.then_some(sinks[h]);
                        let want = reference(c, q, &ks, &vs, first + t, h, sink);
                        let at = (t * c.n_heads + h) * c.hd;
                        for (g, w) in got[at..at + c.hd].iter().zip(&want) {
                            assert!(
                                (*g as f64 - w).abs() < 1e-5,
                                "pos {} head {h}: {g} vs {w}",
                                first + t
                            );
                        }
                    }
                }
                first += n;
            }
        }
    }
}

#[test]
fn attention_refuses_keys_the_ring_dropped() {
    let be = CpuBackend::new(1).unwrap();
    be.reserve(&Limits {
        max_tokens: 8,
        max_keys: 16,
        max_head_dim: 4,
    })
    .unwrap();
    let q = be.alloc(8 * 4).unwrap();
    let kc = be.alloc(4 * 4).unwrap();
    let vc = be.alloc(4 * 4).unwrap();
    let mut out = be.alloc(8 * 4).unwrap();
    let p = AttentionParams {
        n_tokens: 4,
        first_pos: 10,
        n_heads: 1,
        n_kv_heads: 1,
        head_dim: 4,
        capacity: 4,
        window: Some(3),
        scale: 1.0,
        softcap: None,
    };
    let err = be.attention(&q, &kc, &vc, &p, None, &mut out).unwrap_err();
    assert!(
        matches!(err, turbospark_backend::BackendError::KeysEvicted { .. }),
        "{err}"
    );
}

fn act_ref(act: Activation, g: f64, u: f64) -> f64 {
    let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
    match act {
        Activation::Swiglu => g * sig(g) * u,
        Activation::GeluTanh => {
            0.5 * g
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g.powi(3))).tanh())
                * u
        }
        Activation::ClampedSwiglu { alpha, limit } => {
            let (a, l) = (alpha as f64, limit as f64);
            let g = g.min(l);
            let u = u.clamp(-l, l);
            (u + 1.0) * g * sig(a * g)
        }
    }
}

#[test]
fn moe_matches_reference_and_is_batch_independent() {
    let (hidden, inter, n_experts, k, n) = (64, 32, 6, 2, 5);
    let be = CpuBackend::new(2).unwrap();
    let mut rng = Rng(9);
    let deq = |t: &turbospark_backend::HostTensor| {
        let (r, c) = (t.shape[0], t.shape[1]);
        let rb = t.bytes.len() / r;
        let mut out = vec![0f32; r * c];
        for i in 0..r {
            turbospark_core::quant::dequantize_row(
                t.format,
                &t.bytes.as_slice()[i * rb..(i + 1) * rb],
                &mut out[i * c..(i + 1) * c],
            )
            .unwrap();
        }
        out
    };
    for act in [
        Activation::Swiglu,
        Activation::ClampedSwiglu {
            alpha: 1.702,
            limit: 0.5,
        },
    ] {
        let mut host = Vec::new();
        let mut experts = Vec::new();
        for e in 0..n_experts {
            let g = random_matrix(
                &format!("gate{e}"),
                QuantFormat::Mxfp4,
                inter,
                hidden,
                &mut rng,
            );
            let u = random_matrix(
                &format!("up{e}"),
                QuantFormat::Q8_0,
                inter,
                hidden,
                &mut rng,
            );
            let d = random_matrix(
                &format!("down{e}"),
                QuantFormat::F32,
                hidden,
                inter,
                &mut rng,
            );
            let (bg, bu, bd) = (rng.vec(inter), rng.vec(inter), rng.vec(hidden));
            experts.push(ExpertWeights {
                gate: be.upload_matrix(&g).unwrap(),
                up: be.upload_matrix(&u).unwrap(),
                down: be.upload_matrix(&d).unwrap(),
                gate_bias: Some(
                    be.upload_vector(&f32_tensor("bg", vec![inter], &bg))
                        .unwrap(),
                ),
                up_bias: Some(
                    be.upload_vector(&f32_tensor("bu", vec![inter], &bu))
                        .unwrap(),
                ),
                down_bias: Some(
                    be.upload_vector(&f32_tensor("bd", vec![hidden], &bd))
                        .unwrap(),
                ),
            });
            host.push((deq(&g), deq(&u), deq(&d), bg, bu, bd));
        }
        let x = rng.vec(n * hidden);
        let routes: Vec<Route> = (0..n * k)
            .map(|i| Route {
                slot: ((i * 7 + i / k) % n_experts) as u32,
                weight: 0.25 + (i % 3) as f32 * 0.2,
            })
            .collect();
        let mut scratch = MoeScratch {
            x: be.alloc(n * hidden).unwrap(),
            gate: be.alloc(n * inter).unwrap(),
            up: be.alloc(n * inter).unwrap(),
            y: be.alloc(n * k * hidden).unwrap(),
        };
        let xb = buf(&be, &x);
        let mut out = be.alloc(n * hidden).unwrap();
        be.moe(
            MoeInput {
                x: &xb,
                n_tokens: n,
                routes: &routes,
                experts: &experts,
                activation: act,
            },
            &mut scratch,
            &mut out,
        )
        .unwrap();
        let mut got = vec![0f32; n * hidden];
        be.read(&out, &mut got).unwrap();
        for t in 0..n {
            let xt = &x[t * hidden..(t + 1) * hidden];
            let mut want = vec![0f64; hidden];
            for r in 0..k {
                let Route { slot, weight } = routes[t * k + r];
                let (g, u, d, bg, bu, bd) = &host[slot as usize];
                let a: Vec<f64> = (0..inter)
                    .map(|i| {
                        let dotx = |m: &[f32]| {
                            m[i * hidden..(i + 1) * hidden]
                                .iter()
                                .zip(xt)
                                .map(|(&w, &v)| w as f64 * v as f64)
                                .sum::<f64>()
                        };
                        act_ref(act, dotx(g) + bg[i] as f64, dotx(u) + bu[i] as f64)
                    })
                    .collect();
                for o in 0..hidden {
                    let y: f64 = d[o * inter..(o + 1) * inter]
                        .iter()
                        .zip(&a)
                        .map(|(&w, &v)| w as f64 * v)
                        .sum::<f64>()
                        + bd[o] as f64;
                    want[o] += weight as f64 * y;
                }
            }
            for (gv, wv) in got[t * hidden..(t + 1) * hidden].iter().zip(&want) {
                assert!(
                    (*gv as f64 - wv).abs() < 1e-4 * (1.0 + wv.abs()),
                    "token {t}: {gv} vs {wv}"
                );
            }
            // The same token alone gives the same bits.
            let x1 = buf(&be, xt);
            let mut o1 = be.alloc(hidden).unwrap();
            be.moe(
                MoeInput {
                    x: &x1,
                    n_tokens: 1,
                    routes: &routes[t * k..(t + 1) * k],
                    experts: &experts,
                    activation: act,
                },
                &mut scratch,
                &mut o1,
            )
            .unwrap();
            let mut alone = vec![0f32; hidden];
            be.read(&o1, &mut alone).unwrap();
            assert_eq!(alone[..], got[t * hidden..(t + 1) * hidden], "token {t}");
        }
        let bad = [Route {
            slot: n_experts as u32,
            weight: 1.0,
        }];
        let err = be
            .moe(
                MoeInput {
                    x: &xb,
                    n_tokens: 1,
                    routes: &bad,
                    experts: &experts,
                    activation: act,
                },
                &mut scratch,
                &mut out,
            )
            .unwrap_err();
        assert!(matches!(
            err,
            turbospark_backend::BackendError::BadRoute { .. }
        ));
    }
}
