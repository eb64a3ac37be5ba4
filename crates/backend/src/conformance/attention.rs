//! The KV cache write and attention over it: rings that wrap, windows,
//! sinks, soft-caps, grouped-query heads.

use super::data::{bits, f32_tensor, Rng};
use super::elementwise::yarn_scaling;
use super::{compare, property, reference, ConformanceError, Context, Harness, Tolerances};
use crate::{AttentionParams, AttentionPart, BackendError, Device, Limits, RopeTable, Stream};
use turbospark_core::arch::{RopeKind, RopeScaling, RopeSpec};
use turbospark_core::QuantFormat;

/// Rows land at `(first_pos + t) % capacity`, in the device's KV dtype.
pub fn check_kv_write<D: Device>(dev: &D, tol: &Tolerances) -> Result<(), ConformanceError> {
    const OP: &str = "kv_write";
    let (row, capacity, n) = (12, 5, 3);
    let mut h = Harness::new(dev, Limits::default())?;
    let mut cache = dev.alloc(dev.kv_dtype(), capacity * row).at(OP, "alloc")?;
    let mut rng = Rng(21);
    let mut want = vec![0f64; capacity * row];
    // Positions 0..3, 3..6 (wraps), 6..9.
    for first in [0, 3, 6] {
        let src = rng.vec(n * row);
        let sb = h.buf(&src)?;
        h.st.kv_write(&mut cache, &sb, n, row, first, capacity)
            .at(OP, &format!("at {first}"))?;
        for t in 0..n {
            let slot = (first + t) % capacity;
            for i in 0..row {
                want[slot * row + i] = f64::from(src[t * row + i]);
            }
        }
    }
    let got = h.get(&cache, capacity * row)?;
    compare(OP, "ring", &got, &want, tol.kv, |i| want[i].abs())?;
    let big = h.zeros((capacity + 1) * row)?;
    if h.st
        .kv_write(&mut cache, &big, capacity + 1, row, 0, capacity)
        .is_ok()
    {
        return Err(property(OP, "overfull", "more rows than the cache".into()));
    }
    Ok(())
}

struct Case {
    n_heads: usize,
    n_kv: usize,
    hd: usize,
    window: Option<usize>,
    sinks: bool,
    softcap: Option<f32>,
}

impl Case {
    /// How a failure names the case.
    fn label(&self) -> String {
        format!(
            "{} heads / {} kv × {}, window {:?}, sinks {}, softcap {:?}",
            self.n_heads, self.n_kv, self.hd, self.window, self.sinks, self.softcap
        )
    }

    /// Ring rows for decoding up to position `total - 1`: the window, or
    /// without one room for more keys than are seen (blocks of a split
    /// kernel with no key to take).
    fn decode_capacity(&self, total: usize) -> usize {
        self.window.unwrap_or(total + 400)
    }

    /// Random keys and values of `total` positions (rows of
    /// `n_kv · hd`), then a sink per head.
    fn random_history(
        &self,
        total: usize,
        rng: &mut Rng,
    ) -> (Vec<Vec<f32>>, Vec<Vec<f32>>, Vec<f32>) {
        let row = self.n_kv * self.hd;
        let ks = (0..total).map(|_| rng.vec(row)).collect();
        let vs = (0..total).map(|_| rng.vec(row)).collect();
        (ks, vs, rng.scaled(self.n_heads, 2.0))
    }

    /// Limits of a stream decoding over `capacity` ring rows.
    fn decode_limits(&self, capacity: usize) -> Limits {
        Limits {
            max_tokens: 64,
            max_keys: capacity,
            max_head_dim: self.hd,
            max_experts: 0,
            ..Limits::default()
        }
    }

    /// One token's attention at `pos` over `capacity` ring rows.
    fn one_token(&self, pos: usize, capacity: usize) -> AttentionParams {
        AttentionParams {
            n_tokens: 1,
            first_pos: pos,
            n_heads: self.n_heads,
            n_kv_heads: self.n_kv,
            head_dim: self.hd,
            capacity,
            window: self.window,
            scale: 0.125,
            softcap: self.softcap,
        }
    }

    /// The f64 formula for every head of one token's query `q` over the
    /// history `ks`, `vs` (with each head's sink when the case has them).
    fn reference_heads(
        &self,
        p: &AttentionParams,
        q: &[f32],
        (ks, vs): (&[Vec<f32>], &[Vec<f32>]),
        sinks: &[f32],
    ) -> Vec<f64> {
        (0..self.n_heads)
            .flat_map(|head| {
                let sink = self.sinks.then_some(sinks[head]);
                reference::attention(p, q, ks, vs, 0, head, sink)
            })
            .collect()
    }
}

/// Attention of prefill chunks through a ring cache, against the f64
/// formula over the whole history.
pub fn check_attention<D: Device>(dev: &D, tol: &Tolerances) -> Result<(), ConformanceError> {
    const OP: &str = "attention";
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
            n_heads: 6,
            n_kv: 2,
            hd: 40,
            window: Some(5),
            sinks: false,
            softcap: Some(3.0),
        },
        // gpt-oss's grouping: 8 query heads a KV head, width 64.
        Case {
            n_heads: 8,
            n_kv: 1,
            hd: 64,
            window: Some(6),
            sinks: true,
            softcap: None,
        },
        // Width 64, 4 query heads a KV head, no window: keys past one
        // 16-key tile of a tensor-core kernel, a soft-cap.
        Case {
            n_heads: 8,
            n_kv: 2,
            hd: 64,
            window: None,
            sinks: false,
            softcap: Some(5.0),
        },
        // Width 128 (Qwen3-MoE, Mixtral), 2 query heads a KV head.
        Case {
            n_heads: 4,
            n_kv: 2,
            hd: 128,
            window: Some(7),
            sinks: true,
            softcap: None,
        },
    ];
    let (total, chunk) = (23, 3);
    for c in &cases {
        let case = c.label();
        let mut rng = Rng(42);
        let capacity = c.window.map_or(total, |w| w + chunk - 1);
        let row = c.n_kv * c.hd;
        let ks: Vec<Vec<f32>> = (0..total).map(|_| rng.vec(row)).collect();
        let vs: Vec<Vec<f32>> = (0..total).map(|_| rng.vec(row)).collect();
        let qs: Vec<Vec<f32>> = (0..total).map(|_| rng.vec(c.n_heads * c.hd)).collect();
        let sinks: Vec<f32> = rng.scaled(c.n_heads, 2.0);
        let sink_vec = dev
            .upload_vector(&f32_tensor("sinks", vec![c.n_heads], &sinks))
            .at(OP, &case)?;
        let limits = Limits {
            max_tokens: chunk,
            max_keys: capacity,
            max_head_dim: c.hd,
            max_experts: 0,
            ..Limits::default()
        };
        let mut h = Harness::new(dev, limits)?;
        let mut kc = dev.alloc(dev.kv_dtype(), capacity * row).at(OP, &case)?;
        let mut vc = dev.alloc(dev.kv_dtype(), capacity * row).at(OP, &case)?;
        let mut first = 0;
        while first < total {
            let n = chunk.min(total - first);
            write_history(
                (OP, &case),
                &mut h,
                &mut (&mut kc, &mut vc),
                (&ks, &vs),
                first..first + n,
                capacity,
            )?;
            let q = qs[first..first + n].concat();
            let qb = h.buf(&q)?;
            let mut out = h.zeros(n * c.n_heads * c.hd)?;
            let p = AttentionParams {
                n_tokens: n,
                first_pos: first,
                n_heads: c.n_heads,
                n_kv_heads: c.n_kv,
                head_dim: c.hd,
                capacity,
                window: c.window,
                scale: 0.3,
                softcap: c.softcap,
            };
            h.st.attention(&qb, &kc, &vc, &p, c.sinks.then_some(&sink_vec), &mut out)
                .at(OP, &case)?;
            let got = h.get(&out, n * c.n_heads * c.hd)?;
            let want: Vec<f64> = (0..n * c.n_heads)
                .flat_map(|i| {
                    let (t, head) = (i / c.n_heads, i % c.n_heads);
                    let sink = c.sinks.then_some(sinks[head]);
                    reference::attention(&p, &q, &ks, &vs, t, head, sink)
                })
                .collect();
            let case = format!("{case}, positions {first}..{}", first + n);
            compare(OP, &case, &got, &want, tol.attention, |_| 1.0)?;
            first += n;
        }
    }
    check_evicted(dev)
}

/// One token's attention (the decode step) at long context and through a
/// ring that has wrapped, one position after another, against the f64
/// formula: the shapes a backend may give a kernel of its own (split over
/// the keys): gpt-oss's 8 query heads a KV head at width 64 with sinks
/// over 600 keys, a sliding window of 100 over a wrapped ring at width
/// 128 with a soft-cap, and one query head a KV head from the first key.
pub fn check_decode_attention<D: Device>(
    dev: &D,
    tol: &Tolerances,
) -> Result<(), ConformanceError> {
    const OP: &str = "attention (one token)";
    // (case, positions decoded after the prefix)
    let cases = [
        (
            Case {
                n_heads: 16,
                n_kv: 2,
                hd: 64,
                window: None,
                sinks: true,
                softcap: None,
            },
            597..600,
        ),
        (
            Case {
                n_heads: 4,
                n_kv: 1,
                hd: 128,
                window: Some(100),
                sinks: false,
                softcap: Some(5.0),
            },
            331..334,
        ),
        (
            Case {
                n_heads: 2,
                n_kv: 2,
                hd: 64,
                window: None,
                sinks: true,
                softcap: None,
            },
            0..3,
        ),
        // Groups that leave some of a block's warps without a head (the
        // CUDA kernel's warps split as key groups of G warps): 6 (one
        // split of a wrapped window) and 3 (many splits).
        (
            Case {
                n_heads: 12,
                n_kv: 2,
                hd: 64,
                window: Some(100),
                sinks: true,
                softcap: None,
            },
            250..253,
        ),
        (
            Case {
                n_heads: 6,
                n_kv: 2,
                hd: 128,
                window: None,
                sinks: false,
                softcap: None,
            },
            700..702,
        ),
    ];
    for (c, decoded) in &cases {
        let case = c.label();
        let mut rng = Rng(77);
        let capacity = c.decode_capacity(decoded.end);
        let row = c.n_kv * c.hd;
        let (ks, vs, sinks) = c.random_history(decoded.end, &mut rng);
        let sink_vec = dev
            .upload_vector(&f32_tensor("sinks", vec![c.n_heads], &sinks))
            .at(OP, &case)?;
        let mut h = Harness::new(dev, c.decode_limits(capacity))?;
        let mut kc = dev.alloc(dev.kv_dtype(), capacity * row).at(OP, &case)?;
        let mut vc = dev.alloc(dev.kv_dtype(), capacity * row).at(OP, &case)?;
        // The prefix, keeping only the keys the ring holds at the first
        // decoded position.
        let kept = decoded.start.saturating_sub(capacity - 1);
        let mut caches = (&mut kc, &mut vc);
        write_history(
            (OP, &case),
            &mut h,
            &mut caches,
            (&ks, &vs),
            kept..decoded.start,
            capacity,
        )?;
        for pos in decoded.clone() {
            write_history(
                (OP, &case),
                &mut h,
                &mut caches,
                (&ks, &vs),
                pos..pos + 1,
                capacity,
            )?;
            let q = rng.scaled(c.n_heads * c.hd, 2.0);
            let qb = h.buf(&q)?;
            let mut out = h.zeros(c.n_heads * c.hd)?;
            let p = c.one_token(pos, capacity);
            h.st.attention(
                &qb,
                caches.0,
                caches.1,
                &p,
                c.sinks.then_some(&sink_vec),
                &mut out,
            )
            .at(OP, &case)?;
            let got = h.get(&out, c.n_heads * c.hd)?;
            let want = c.reference_heads(&p, &q, (&ks, &vs), &sinks);
            compare(
                OP,
                &format!("{case}, position {pos}"),
                &got,
                &want,
                tol.attention,
                |_| 1.0,
            )?;
        }
    }
    Ok(())
}

/// One token's layer start as the engine issues it — the rope of q and of
/// k, the cache writes of k and v, then the attention — against the f64
/// formula over roped queries and keys, and bit for bit (output, roped q
/// and k) against the same ops with a `synchronize` before the attention,
/// which keeps a backend from joining the attention to the ops before it
/// (the CUDA backend holds the ropes and writes back to launch them as
/// one, and its split decode attention reads older cache rows before that
/// launch has finished). Positions run on after each case's prefix, so
/// later outputs also read the rows the earlier launches wrote.
pub fn check_rope_then_decode_attention<D: Device>(
    dev: &D,
    tol: &Tolerances,
) -> Result<(), ConformanceError> {
    const OP: &str = "rope, cache writes, then attention (one token)";
    let yarn = yarn_scaling();
    // (case, rope kind, rotated dims, scaling, positions after the prefix)
    let cases = [
        (
            Case {
                n_heads: 16,
                n_kv: 2,
                hd: 64,
                window: None,
                sinks: true,
                softcap: None,
            },
            RopeKind::Neox,
            64,
            RopeScaling::None,
            597..600,
        ),
        (
            Case {
                n_heads: 4,
                n_kv: 1,
                hd: 128,
                window: Some(100),
                sinks: false,
                softcap: Some(5.0),
            },
            RopeKind::Interleaved,
            64,
            RopeScaling::None,
            331..334,
        ),
        (
            Case {
                n_heads: 8,
                n_kv: 1,
                hd: 64,
                window: None,
                sinks: true,
                softcap: None,
            },
            RopeKind::Neox,
            32,
            yarn,
            0..3,
        ),
    ];
    for (c, kind, rotary_dim, scaling, decoded) in cases {
        let table = RopeTable::new(&RopeSpec {
            kind,
            theta: 10000.0,
            rotary_dim,
            scaling,
        });
        let case = format!("{}, {kind:?} over {rotary_dim} dims", c.label());
        let mut rng = Rng(78);
        let capacity = c.decode_capacity(decoded.end);
        let row = c.n_kv * c.hd;
        let qd = c.n_heads * c.hd;
        // Past keys as stored (already roped), then the new ones as the
        // projection gives them.
        let (mut ks, vs, sinks) = c.random_history(decoded.end, &mut rng);
        let sink_vec = dev
            .upload_vector(&f32_tensor("sinks", vec![c.n_heads], &sinks))
            .at(OP, &case)?;
        let mut h = Harness::new(dev, c.decode_limits(capacity))?;
        let mut caches = Vec::new();
        for _ in 0..2 {
            let kc = dev.alloc(dev.kv_dtype(), capacity * row).at(OP, &case)?;
            let vc = dev.alloc(dev.kv_dtype(), capacity * row).at(OP, &case)?;
            caches.push((kc, vc));
        }
        let kept = decoded.start.saturating_sub(capacity - 1);
        for (kc, vc) in &mut caches {
            write_history(
                (OP, &case),
                &mut h,
                &mut (kc, vc),
                (&ks, &vs),
                kept..decoded.start,
                capacity,
            )?;
        }
        for pos in decoded {
            let q = rng.scaled(qd, 2.0);
            let p = c.one_token(pos, capacity);
            let mut got = Vec::new();
            for (apart, (kc, vc)) in caches.iter_mut().enumerate() {
                let mut qb = h.buf(&q)?;
                let mut kb = h.buf(&ks[pos])?;
                let vb = h.buf(&vs[pos])?;
                let mut out = h.zeros(qd)?;
                h.st.rope(&mut qb, 1, c.n_heads, c.hd, pos, &table)
                    .at(OP, &case)?;
                h.st.rope(&mut kb, 1, c.n_kv, c.hd, pos, &table)
                    .at(OP, &case)?;
                h.st.kv_write(kc, &kb, 1, row, pos, capacity)
                    .at(OP, &case)?;
                h.st.kv_write(vc, &vb, 1, row, pos, capacity)
                    .at(OP, &case)?;
                if apart == 1 {
                    h.st.synchronize().at(OP, &case)?;
                }
                h.st.attention(&qb, kc, vc, &p, c.sinks.then_some(&sink_vec), &mut out)
                    .at(OP, &case)?;
                got.push((
                    h.get(&out, qd)?,
                    bits(&h.get(&qb, qd)?),
                    bits(&h.get(&kb, row)?),
                ));
            }
            for (what, same) in [
                ("output", got[0].0 == got[1].0),
                ("roped q", got[0].1 == got[1].1),
                ("roped k", got[0].2 == got[1].2),
            ] {
                if !same {
                    return Err(property(
                        OP,
                        &format!("{case}, position {pos}"),
                        format!("{what} differs from the ops' apart (a synchronize between)"),
                    ));
                }
            }
            // The f64 formula over the roped query and history.
            let rope_heads = |x: &[f32]| -> Vec<f32> {
                x.chunks_exact(c.hd)
                    .flat_map(|head| reference::rope(head, pos, &table))
                    .map(|v| v as f32)
                    .collect()
            };
            let roped_q = rope_heads(&q);
            ks[pos] = rope_heads(&ks[pos]);
            let want = c.reference_heads(&p, &roped_q, (&ks, &vs), &sinks);
            compare(
                OP,
                &format!("{case}, position {pos}"),
                &got[0].0,
                &want,
                tol.attention,
                |_| 1.0,
            )?;
        }
    }
    Ok(())
}

/// Writes the keys and values of positions `at` into their ring caches,
/// at most `max_tokens` of the harness's limits at a time (64); errors
/// name `op` and `case`.
fn write_history<D: Device>(
    (op, case): (&'static str, &str),
    h: &mut Harness<'_, D>,
    caches: &mut (&mut D::Buf, &mut D::Buf),
    (ks, vs): (&[Vec<f32>], &[Vec<f32>]),
    at: std::ops::Range<usize>,
    capacity: usize,
) -> Result<(), ConformanceError> {
    let row = ks.first().map_or(0, Vec::len);
    let mut first = at.start;
    while first < at.end {
        let n = 64.min(at.end - first);
        let k_new = h.buf(&ks[first..first + n].concat())?;
        let v_new = h.buf(&vs[first..first + n].concat())?;
        h.st.kv_write(caches.0, &k_new, n, row, first, capacity)
            .at(op, case)?;
        h.st.kv_write(caches.1, &v_new, n, row, first, capacity)
            .at(op, case)?;
        first += n;
    }
    Ok(())
}

/// The inputs of the long checks below: gpt-oss's grouping (8 query heads
/// a KV head, width 64, scale 1/8) with sinks, over small random keys, so
/// each scores ~0, and three "needle" keys (near the start, in the middle,
/// among the last) that are the queries' common direction scaled to score
/// about ln of the keys' count, so they share the weight with all the
/// others (two thirds to one third): a kernel that skipped keys anywhere
/// (lost needles, or a wrong denominator) is off by far more than the
/// tolerance, where plain random keys would average to ~0.
struct NeedleKeys {
    dir: Vec<f32>,
    ks: Vec<Vec<f32>>,
    vs: Vec<Vec<f32>>,
}

/// What [`NeedleKeys::setup`] makes: the sinks on the device, the stream
/// and the k and v caches.
struct NeedleRun<'d, D: Device> {
    sink_vec: D::Vector,
    h: Harness<'d, D>,
    kc: D::Buf,
    vc: D::Buf,
}

/// (query heads, KV heads, width) of the long checks.
const NEEDLE_SHAPE: (usize, usize, usize) = (8, 1, 64);
const NEEDLE_SCALE: f32 = 0.125;

impl NeedleKeys {
    /// `total` positions' keys and values; key `at` of each of `needles`
    /// scores ≈ `score` against the queries.
    fn new(rng: &mut Rng, total: usize, needles: [(usize, f32); 3]) -> Self {
        let hd = NEEDLE_SHAPE.2;
        let dir = rng.vec(hd);
        let norm2: f32 = dir.iter().map(|x| x * x).sum();
        let mut ks: Vec<Vec<f32>> = (0..total).map(|_| rng.scaled(hd, 0.25)).collect();
        let vs: Vec<Vec<f32>> = (0..total).map(|_| rng.vec(hd)).collect();
        for (at, score) in needles {
            let alpha = score / (NEEDLE_SCALE * norm2);
            ks[at] = dir.iter().map(|x| alpha * x).collect();
        }
        NeedleKeys { dir, ks, vs }
    }

    /// `rows` query rows: the needles' direction plus small noise.
    fn queries(&self, rng: &mut Rng, rows: usize) -> Vec<f32> {
        (0..rows)
            .flat_map(|_| {
                let noise = rng.scaled(self.dir.len(), 0.1);
                self.dir
                    .iter()
                    .zip(noise)
                    .map(|(d, e)| d + e)
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// The sinks uploaded (before the stream, which sees what the device
    /// holds when it is made), a harness, and k and v caches of `capacity`
    /// rows holding positions `0..upto`.
    fn setup<'d, D: Device>(
        &self,
        dev: &'d D,
        (op, case): (&'static str, &str),
        sinks: &[f32],
        capacity: usize,
        upto: usize,
    ) -> Result<NeedleRun<'d, D>, ConformanceError> {
        let (n_heads, _, hd) = NEEDLE_SHAPE;
        let sink_vec = dev
            .upload_vector(&f32_tensor("sinks", vec![n_heads], sinks))
            .at(op, case)?;
        let limits = Limits {
            max_tokens: 64,
            max_keys: capacity,
            max_head_dim: hd,
            max_experts: 0,
            ..Limits::default()
        };
        let mut h = Harness::new(dev, limits)?;
        let mut kc = dev.alloc(dev.kv_dtype(), capacity * hd).at(op, case)?;
        let mut vc = dev.alloc(dev.kv_dtype(), capacity * hd).at(op, case)?;
        write_history(
            (op, case),
            &mut h,
            &mut (&mut kc, &mut vc),
            (&self.ks, &self.vs),
            0..upto,
            capacity,
        )?;
        Ok(NeedleRun {
            sink_vec,
            h,
            kc,
            vc,
        })
    }

    /// The attention's parameters for `n_tokens` from `first_pos`.
    fn params(n_tokens: usize, first_pos: usize, capacity: usize) -> AttentionParams {
        let (n_heads, n_kv_heads, head_dim) = NEEDLE_SHAPE;
        AttentionParams {
            n_tokens,
            first_pos,
            n_heads,
            n_kv_heads,
            head_dim,
            capacity,
            window: None,
            scale: NEEDLE_SCALE,
            softcap: None,
        }
    }

    /// Beyond the op's tolerance, the f32 rounding of sums over `keys`
    /// keys: at most N·u · Σ_j w_j·|v_j| for N keys (u = 2⁻²⁴, the weights
    /// w summing to at most 1, |v| ≤ 1) — 3.6e-3 at 60k keys, where a
    /// CPU's exact sums in key order are ~2.4e-6 off, past exact numerics'
    /// 2e-6 for short rows. Losing the last needle moves an output by ~0.3.
    fn length_term(keys: usize) -> f64 {
        keys as f64 * f64::from(f32::EPSILON) / 2.0
    }
}

/// A prefill chunk past 60,000 keys, against the f64 formula: past what a
/// kernel keeping a score a key in shared memory can hold (~57k keys on
/// an H100's 227 KiB), so a backend must walk the keys in tiles or chunks
/// — as the CUDA backend's tensor-core prefill attention does in fast
/// numerics, and its scalar kernels' long form in exact numerics. 20
/// tokens (a whole and a partial tile of 16) at positions 60000..60020,
/// over [`NeedleKeys`].
pub fn check_long_prefill_attention<D: Device>(
    dev: &D,
    tol: &Tolerances,
) -> Result<(), ConformanceError> {
    const OP: &str = "attention (a prefill chunk past 60k keys)";
    let (n_heads, n_kv, hd) = NEEDLE_SHAPE;
    let (first, n) = (60_000, 20);
    let total = first + n;
    let capacity = total;
    let case = format!("{n_heads} heads / {n_kv} kv × {hd}, positions {first}..{total}");
    let mut rng = Rng(909);
    // Needle scores ≈ 10, 10.5 and 11 against e^0 · 60,000 ≈ e^11: a
    // third of the weight on the other keys.
    let keys = NeedleKeys::new(&mut rng, total, [(7, 10.0), (31_000, 10.5), (59_990, 11.0)]);
    let q = keys.queries(&mut rng, n * n_heads);
    let sinks = rng.scaled(n_heads, 2.0);
    let NeedleRun {
        sink_vec,
        mut h,
        kc,
        vc,
    } = keys.setup(dev, (OP, &case), &sinks, capacity, total)?;
    let qb = h.buf(&q)?;
    let mut out = h.zeros(n * n_heads * hd)?;
    let p = NeedleKeys::params(n, first, capacity);
    h.st.attention(&qb, &kc, &vc, &p, Some(&sink_vec), &mut out)
        .at(OP, &case)?;
    let got = h.get(&out, n * n_heads * hd)?;
    let want: Vec<f64> = (0..n * n_heads)
        .flat_map(|i| {
            let (t, head) = (i / n_heads, i % n_heads);
            reference::attention(&p, &q, &keys.ks, &keys.vs, t, head, Some(sinks[head]))
        })
        .collect();
    let tol = tol.attention + NeedleKeys::length_term(total);
    compare(OP, &case, &got, &want, tol, |_| 1.0)
}

/// One token's attention over 40,000 keys, three decode steps in turn,
/// against the f64 formula: long enough that the CUDA backend takes its
/// tensor-core decode kernel (`attention_dec.cu`, from 4096 keys) with
/// more splits than its finishing block adds at once (64 by default for
/// its one KV head, 16 at a time: the partials' groups rescaled), over
/// [`NeedleKeys`] (needles near the start, in the middle and among the
/// last keys).
pub fn check_long_decode_attention<D: Device>(
    dev: &D,
    tol: &Tolerances,
) -> Result<(), ConformanceError> {
    const OP: &str = "attention (one token over 40k keys)";
    let (n_heads, n_kv, hd) = NEEDLE_SHAPE;
    let first = 40_000;
    let total = first + 3;
    let capacity = total + 400;
    let case = format!("{n_heads} heads / {n_kv} kv × {hd}, capacity {capacity}");
    let mut rng = Rng(911);
    // Needle scores ≈ 10, 10.5 and 11 against e^0 · 40,000 ≈ e^10.6.
    let keys = NeedleKeys::new(&mut rng, total, [(7, 10.0), (20_500, 10.5), (39_990, 11.0)]);
    let sinks = rng.scaled(n_heads, 2.0);
    let NeedleRun {
        sink_vec,
        mut h,
        mut kc,
        mut vc,
    } = keys.setup(dev, (OP, &case), &sinks, capacity, first)?;
    let mut caches = (&mut kc, &mut vc);
    for pos in first..total {
        let history = (&keys.ks[..], &keys.vs[..]);
        write_history(
            (OP, &case),
            &mut h,
            &mut caches,
            history,
            pos..pos + 1,
            capacity,
        )?;
        let q = keys.queries(&mut rng, n_heads);
        let qb = h.buf(&q)?;
        let mut out = h.zeros(n_heads * hd)?;
        let p = NeedleKeys::params(1, pos, capacity);
        h.st.attention(&qb, caches.0, caches.1, &p, Some(&sink_vec), &mut out)
            .at(OP, &case)?;
        let got = h.get(&out, n_heads * hd)?;
        let want: Vec<f64> = (0..n_heads)
            .flat_map(|head| {
                reference::attention(&p, &q, &keys.ks, &keys.vs, 0, head, Some(sinks[head]))
            })
            .collect();
        let tol = tol.attention + NeedleKeys::length_term(pos + 1);
        compare(
            OP,
            &format!("{case}, position {pos}"),
            &got,
            &want,
            tol,
            |_| 1.0,
        )?;
    }
    Ok(())
}

/// Attention of several sequences in one call (decode tokens and a prefill
/// chunk, each over its own ring cache): against the f64 formula, and each
/// part's rows bit for bit what `attention` gives that part alone.
/// Backends without `attention_parts` skip it.
pub fn check_attention_parts<D: Device>(dev: &D, tol: &Tolerances) -> Result<(), ConformanceError> {
    const OP: &str = "attention_parts";
    let (n_heads, n_kv, hd, window) = (4, 2, 16, Some(6));
    // (positions already cached, new tokens) per sequence
    let seqs = [(5usize, 1usize), (9, 3), (0, 1), (2, 2)];
    let capacity = 6 + 3 - 1;
    let row = n_kv * hd;
    let limits = Limits {
        max_tokens: 8,
        max_keys: capacity,
        max_head_dim: hd,
        max_experts: 0,
        ..Limits::default()
    };
    let mut h = Harness::new(dev, limits)?;
    if !h.st.attends_parts() {
        return Ok(());
    }
    let mut rng = Rng(7);
    let sinks: Vec<f32> = rng.scaled(n_heads, 2.0);
    let sink_vec = dev
        .upload_vector(&f32_tensor("sinks", vec![n_heads], &sinks))
        .at(OP, "sinks")?;
    let mut caches = Vec::new();
    let mut history = Vec::new();
    let mut params = Vec::new();
    let mut q_all = Vec::new();
    for &(cached, n) in &seqs {
        let total = cached + n;
        let ks: Vec<Vec<f32>> = (0..total).map(|_| rng.vec(row)).collect();
        let vs: Vec<Vec<f32>> = (0..total).map(|_| rng.vec(row)).collect();
        let mut kc = dev.alloc(dev.kv_dtype(), capacity * row).at(OP, "alloc")?;
        let mut vc = dev.alloc(dev.kv_dtype(), capacity * row).at(OP, "alloc")?;
        // Written in chunks of at most 3, as the decoder would.
        let mut first = 0;
        while first < total {
            let m = 3.min(total - first);
            let kb = h.buf(&ks[first..first + m].concat())?;
            let vb = h.buf(&vs[first..first + m].concat())?;
            h.st.kv_write(&mut kc, &kb, m, row, first, capacity)
                .at(OP, "kv_write")?;
            h.st.kv_write(&mut vc, &vb, m, row, first, capacity)
                .at(OP, "kv_write")?;
            first += m;
        }
        let q: Vec<f32> = rng.vec(n * n_heads * hd);
        q_all.extend_from_slice(&q);
        params.push(AttentionParams {
            n_tokens: n,
            first_pos: cached,
            n_heads,
            n_kv_heads: n_kv,
            head_dim: hd,
            capacity,
            window,
            scale: 0.25,
            softcap: Some(4.0),
        });
        caches.push((kc, vc));
        history.push((ks, vs, q));
    }
    let rows: usize = seqs.iter().map(|s| s.1).sum();
    let qb = h.buf(&q_all)?;
    let mut out = h.zeros(rows * n_heads * hd)?;
    let parts: Vec<AttentionPart<'_, D::Buf>> = caches
        .iter()
        .zip(&params)
        .map(|((k, v), p)| AttentionPart {
            k_cache: k,
            v_cache: v,
            params: *p,
        })
        .collect();
    h.st.attention_parts(&qb, &parts, Some(&sink_vec), &mut out)
        .at(OP, "four sequences")?;
    let got = h.get(&out, rows * n_heads * hd)?;
    let mut at = 0;
    for (i, ((ks, vs, q), p)) in history.iter().zip(&params).enumerate() {
        let len = p.n_tokens * n_heads * hd;
        let want: Vec<f64> = (0..p.n_tokens * n_heads)
            .flat_map(|j| {
                let (t, head) = (j / n_heads, j % n_heads);
                reference::attention(p, q, ks, vs, t, head, Some(sinks[head]))
            })
            .collect();
        let case = format!("sequence {i}");
        compare(OP, &case, &got[at..at + len], &want, tol.attention, |_| 1.0)?;
        let qi = h.buf(q)?;
        let mut alone = h.zeros(len)?;
        let (kc, vc) = &caches[i];
        h.st.attention(&qi, kc, vc, p, Some(&sink_vec), &mut alone)
            .at(OP, &case)?;
        let alone = h.get(&alone, len)?;
        if alone != got[at..at + len] {
            return Err(property(
                OP,
                &case,
                "differs from attention of the sequence alone".into(),
            ));
        }
        at += len;
    }
    // Parts of other head shapes are refused.
    let mut odd = parts[0];
    odd.params.n_kv_heads = 1;
    let mixed = [parts[0], odd];
    if h.st.attention_parts(&qb, &mixed, None, &mut out).is_ok() {
        return Err(property(OP, "mixed heads", "accepted".into()));
    }
    Ok(())
}

/// A query whose window reaches keys the ring has overwritten is refused.
fn check_evicted<D: Device>(dev: &D) -> Result<(), ConformanceError> {
    const OP: &str = "attention";
    let limits = Limits {
        max_tokens: 8,
        max_keys: 16,
        max_head_dim: 4,
        max_experts: 0,
        ..Limits::default()
    };
    let mut h = Harness::new(dev, limits)?;
    let q = h.zeros(8 * 4)?;
    let kc = dev.alloc(dev.kv_dtype(), 4 * 4).at(OP, "evicted")?;
    let vc = dev.alloc(dev.kv_dtype(), 4 * 4).at(OP, "evicted")?;
    let mut out = h.zeros(8 * 4)?;
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
    match h.st.attention(&q, &kc, &vc, &p, None, &mut out) {
        Err(BackendError::KeysEvicted { .. }) => Ok(()),
        other => Err(property(
            OP,
            "evicted keys",
            format!("expected KeysEvicted, got {other:?}"),
        )),
    }
}

/// One token's attention and the product of its output (the o
/// projection), issued one after another as a decode step does — which a
/// backend may fuse (the CUDA backend's attention quantizes its output for
/// the fast product, unless `TURBOSPARK_CUDA_FUSE=0`) —
/// give the same bits as the same ops with a copy of
/// the attention's output between them, which nothing fuses across.
pub fn check_attention_then_product<D: Device>(dev: &D) -> Result<(), ConformanceError> {
    const OP: &str = "attention, then its product";
    let (keys, rows) = (9, 48);
    for (n_heads, n_kv, hd) in [(8, 1, 64), (4, 2, 32), (2, 1, 128)] {
        let case = format!("{n_heads} heads / {n_kv} kv × {hd}");
        let mut rng = Rng(57);
        let (row, width) = (n_kv * hd, n_heads * hd);
        let limits = Limits {
            max_tokens: keys,
            max_keys: keys,
            max_head_dim: hd,
            max_experts: 0,
            ..Limits::default()
        };
        // (The matrix first: a stream's scratch is sized for the widest
        // matrix its device holds when it is made.)
        let o = super::data::random_matrix("attn_output", QuantFormat::Q8_0, rows, width, &mut rng);
        let o = dev.upload_matrix(&o).at(OP, &case)?;
        let mut h = Harness::new(dev, limits)?;
        let mut kc = dev.alloc(dev.kv_dtype(), keys * row).at(OP, "alloc")?;
        let mut vc = dev.alloc(dev.kv_dtype(), keys * row).at(OP, "alloc")?;
        let kb = h.buf(&rng.vec(keys * row))?;
        let vb = h.buf(&rng.vec(keys * row))?;
        h.st.kv_write(&mut kc, &kb, keys, row, 0, keys)
            .at(OP, &case)?;
        h.st.kv_write(&mut vc, &vb, keys, row, 0, keys)
            .at(OP, &case)?;
        let qb = h.buf(&rng.scaled(width, 2.0))?;
        let p = AttentionParams {
            n_tokens: 1,
            first_pos: keys - 1,
            n_heads,
            n_kv_heads: n_kv,
            head_dim: hd,
            capacity: keys,
            window: None,
            scale: 0.3,
            softcap: None,
        };
        let mut got = Vec::new();
        for split in [false, true] {
            let mut att = h.zeros(width)?;
            let mut copied = h.zeros(width)?;
            let mut out = h.zeros(rows)?;
            h.st.attention(&qb, &kc, &vc, &p, None, &mut att)
                .at(OP, &case)?;
            let x = if split {
                h.st.copy(&att, 0, &mut copied, 0, width).at(OP, &case)?;
                &copied
            } else {
                &att
            };
            h.st.matmul(&o, x, 1, &mut out).at(OP, &case)?;
            got.push((bits(&h.get(&att, width)?), bits(&h.get(&out, rows)?)));
        }
        if got[0] != got[1] {
            return Err(property(
                OP,
                &case,
                "attention output or its product differ from the unfused ops'".into(),
            ));
        }
    }
    Ok(())
}

/// One token's q, k and v products of one input with their biases, then
/// the ropes of q and k and the cache writes of k and v, as the engine
/// issues them (the CUDA backend can launch all of it as one,
/// `TURBOSPARK_CUDA_QKV_ROPE=1`): the roped q and k, v and both cache
/// rings the same bits as the same ops
/// with a `synchronize` between the products and the ropes, which keeps a
/// backend from joining them (each of those ops is checked against its
/// f64 formula elsewhere in the suite); and the roped q within
/// `tol.matmul` of the f64 formula (the product's reference, rotated).
/// Positions run past the ring's capacity, so rows are overwritten.
pub fn check_projections_then_rope<D: Device>(
    dev: &D,
    tol: &Tolerances,
) -> Result<(), ConformanceError> {
    const OP: &str = "q, k and v products, then ropes and cache writes (one token)";
    let yarn = yarn_scaling();
    // (q heads, kv heads, head size, rope kind, rotated dims, scaling,
    // input width, biases): gpt-oss's width and rope; another width
    // (a kernel for any width), interleaved pairs and no biases; a
    // partial rope (not joined on the CUDA backend).
    let cases = [
        (8, 2, 64, RopeKind::Neox, 64, yarn, 2880, true),
        (
            4,
            2,
            32,
            RopeKind::Interleaved,
            32,
            RopeScaling::None,
            256,
            false,
        ),
        (4, 1, 64, RopeKind::Neox, 32, RopeScaling::None, 256, true),
    ];
    let capacity = 5;
    for (n_heads, n_kv, hd, kind, rotary_dim, scaling, cols, biased) in cases {
        let table = RopeTable::new(&RopeSpec {
            kind,
            theta: 10000.0,
            rotary_dim,
            scaling,
        });
        let case =
            format!("{n_heads} heads / {n_kv} kv × {hd}, {kind:?} over {rotary_dim}, {cols} wide");
        let mut rng = Rng(79);
        let rows = [n_heads * hd, n_kv * hd, n_kv * hd];
        let ts: Vec<_> = rows
            .iter()
            .zip(["q", "k", "v"])
            .map(|(&r, name)| {
                super::data::random_matrix(name, QuantFormat::Q8_0, r, cols, &mut rng)
            })
            .collect();
        let ms = ts
            .iter()
            .map(|t| dev.upload_matrix(t).at(OP, &case))
            .collect::<Result<Vec<_>, _>>()?;
        let bias_values: Vec<Vec<f32>> = rows.iter().map(|&r| rng.vec(r)).collect();
        let biases = bias_values
            .iter()
            .map(|b| {
                dev.upload_vector(&f32_tensor("bias", vec![b.len()], b))
                    .at(OP, &case)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let limits = Limits {
            max_tokens: 1,
            max_keys: capacity,
            max_head_dim: hd,
            max_experts: 0,
            ..Limits::default()
        };
        let mut h = Harness::new(dev, limits)?;
        let row = n_kv * hd;
        let mut caches = Vec::new();
        for _ in 0..2 {
            let kc = dev.alloc(dev.kv_dtype(), capacity * row).at(OP, &case)?;
            let vc = dev.alloc(dev.kv_dtype(), capacity * row).at(OP, &case)?;
            caches.push((kc, vc));
        }
        for pos in 0..capacity + 3 {
            let x = rng.vec(cols);
            let xb = h.buf(&x)?;
            let mut got = Vec::new();
            for (apart, (kc, vc)) in caches.iter_mut().enumerate() {
                let mut outs = rows
                    .iter()
                    .map(|&r| h.zeros(r))
                    .collect::<Result<Vec<_>, _>>()?;
                for ((m, out), b) in ms.iter().zip(outs.iter_mut()).zip(&biases) {
                    h.st.matmul(m, &xb, 1, out).at(OP, &case)?;
                    if biased {
                        h.st.add_bias(out, b, 1).at(OP, &case)?;
                    }
                }
                if apart == 1 {
                    h.st.synchronize().at(OP, &case)?;
                }
                let [q, k, v] = &mut outs[..] else {
                    unreachable!("three outputs")
                };
                h.st.rope(q, 1, n_heads, hd, pos, &table).at(OP, &case)?;
                h.st.rope(k, 1, n_kv, hd, pos, &table).at(OP, &case)?;
                h.st.kv_write(kc, k, 1, row, pos, capacity).at(OP, &case)?;
                h.st.kv_write(vc, v, 1, row, pos, capacity).at(OP, &case)?;
                let mut values = Vec::new();
                for (b, len) in outs.iter().zip(rows) {
                    values.push(bits(&h.get(b, len)?));
                }
                values.push(bits(&h.get(kc, capacity * row)?));
                values.push(bits(&h.get(vc, capacity * row)?));
                got.push(values);
            }
            for (i, what) in ["roped q", "roped k", "v", "k cache", "v cache"]
                .iter()
                .enumerate()
            {
                if got[0][i] != got[1][i] {
                    return Err(property(
                        OP,
                        &format!("{case}, position {pos}"),
                        format!("{what} differs from the ops' apart (a synchronize between)"),
                    ));
                }
            }
            // The roped q against the f64 formula: the product over the
            // dequantized rows plus the bias, rotated; each element within
            // the tolerance of its pair's magnitude.
            let w = super::data::dequantized(&ts[0]);
            let (mut product, mut mag) = (Vec::new(), Vec::new());
            for r in 0..rows[0] {
                let (v, m) = reference::dot(&w[r * cols..(r + 1) * cols], &x);
                let b = if biased {
                    f64::from(bias_values[0][r])
                } else {
                    0.0
                };
                product.push((v + b) as f32);
                mag.push(m + b.abs());
            }
            let want: Vec<f64> = product
                .chunks_exact(hd)
                .flat_map(|head| reference::rope(head, pos, &table))
                .collect();
            let scale: Vec<f64> = mag
                .chunks_exact(hd)
                .flat_map(|head| {
                    let top = head.iter().cloned().fold(0.0, f64::max);
                    vec![top * f64::from(table.attention_factor).max(1.0); hd]
                })
                .collect();
            let q: Vec<f32> = got[0][0].iter().map(|&b| f32::from_bits(b)).collect();
            compare(
                OP,
                &format!("{case}, position {pos}"),
                &q,
                &want,
                tol.matmul,
                |i| scale[i],
            )?;
        }
    }
    Ok(())
}
