//! Router math, shared by every backend: one token's router logits →
//! `(expert, weight)` pairs, best rank first ([`route_token`]). A backend's
//! [`Stream::route`](crate::Stream::route) runs it per token on the device;
//! the CPU backend calls this code directly and a GPU backend's kernel is
//! held to it by the conformance suite.
//!
//! - [`RouterKind::SoftmaxTopK`] (HF `MixtralTopKRouter`,
//!   `Qwen3MoeTopKRouter`): `p = softmax(z)`; the `k` largest `p`;
//!   renormalised to sum 1 when asked.
//! - [`RouterKind::TopKSoftmax`] (HF `GptOssTopKRouter`; the router bias is
//!   already in `z`): the `k` largest `z`, softmax over those `k`.
//! - [`RouterKind::SigmoidGrouped`] (HF `Glm4MoeTopkRouter`, DeepSeek-V3):
//!   `s = sigmoid(z)`, `c = s + correction_bias`; each of `n_group` groups
//!   scores the sum of its two largest `c`; the best `topk_group` groups stay
//!   eligible; the `k` largest `c` among them are chosen; weights are their
//!   `s`, divided by `Σ s + 1e-20` when renormalising, times `scaling`.
//! - [`RouterKind::Gemma4`] (HF `Gemma4TextRouter`; the logits come from
//!   the scaled, normed residual stream, see the decoder): `p = softmax(z)`;
//!   the `k` largest `p`, renormalised to sum 1, each times its expert's
//!   `per_expert_scale` (`ffn_gate_inp.expert_scale`).
//!
//! Ties go to the lower expert index. Sums run in expert order in f32.

use crate::{BackendError, Route};
use turbospark_core::arch::{MoeSpec, RouterKind};

/// What a router is: its kind, expert count and `top_k`, checked so that
/// routing can always choose `top_k` experts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RouterSpec {
    kind: RouterKind,
    num_experts: usize,
    top_k: usize,
}

impl RouterSpec {
    pub fn new(kind: RouterKind, num_experts: usize, top_k: usize) -> Result<Self, BackendError> {
        let bad = |problem| BackendError::Router {
            num_experts,
            top_k,
            problem,
        };
        if top_k == 0 || top_k > num_experts {
            return Err(bad("top_k must be between 1 and the expert count"));
        }
        if let RouterKind::SigmoidGrouped {
            n_group,
            topk_group,
            ..
        } = kind
        {
            if n_group == 0 || num_experts % n_group != 0 {
                return Err(bad("the expert count must split into n_group equal groups"));
            }
            if topk_group == 0 || topk_group > n_group {
                return Err(bad("topk_group must be between 1 and n_group"));
            }
            if topk_group * (num_experts / n_group) < top_k {
                return Err(bad("the kept groups hold fewer than top_k experts"));
            }
        }
        Ok(RouterSpec {
            kind,
            num_experts,
            top_k,
        })
    }

    /// The router of a MoE block.
    pub fn of(moe: &MoeSpec) -> Result<Self, BackendError> {
        Self::new(moe.router, moe.num_experts, moe.top_k)
    }

    pub fn kind(&self) -> RouterKind {
        self.kind
    }

    pub fn num_experts(&self) -> usize {
        self.num_experts
    }

    pub fn top_k(&self) -> usize {
        self.top_k
    }

    /// Groups of a grouped router (0 otherwise).
    pub fn groups(&self) -> usize {
        match self.kind {
            RouterKind::SigmoidGrouped { n_group, .. } => n_group,
            _ => 0,
        }
    }
}

/// Per-layer tensors a router reads besides the logits, each
/// `[num_experts]`; absent ones are the identity (bias 0, scale 1). `V` is
/// a backend's vector type, or `[f32]` on the host.
pub struct RouterTables<'a, V: ?Sized> {
    /// Selection-only bias added to the scores (`exp_probs_b.bias`,
    /// grouped router).
    pub correction: Option<&'a V>,
    /// Multiplier on each chosen expert's weight
    /// (`ffn_gate_inp.expert_scale`, Gemma 4).
    pub expert_scale: Option<&'a V>,
}

impl<V: ?Sized> Clone for RouterTables<'_, V> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<V: ?Sized> Copy for RouterTables<'_, V> {}

impl<V: ?Sized> Default for RouterTables<'_, V> {
    fn default() -> Self {
        RouterTables {
            correction: None,
            expert_scale: None,
        }
    }
}

/// Host scratch of [`route_token`], sized once for the widest router.
#[derive(Debug, Clone, Default)]
pub struct RouterScratch {
    /// Per-expert values being selected on.
    values: Vec<f32>,
    /// Per-expert sigmoid scores (grouped router).
    scores: Vec<f32>,
    /// Per-group scores (grouped router).
    groups: Vec<f32>,
    /// Chosen groups (grouped router).
    chosen_groups: Vec<usize>,
    /// Chosen experts, best first.
    chosen: Vec<usize>,
}

impl RouterScratch {
    /// Scratch for routers of at most `num_experts` experts.
    pub fn new(num_experts: usize) -> Self {
        RouterScratch {
            values: vec![0.0; num_experts],
            scores: vec![0.0; num_experts],
            groups: vec![0.0; num_experts],
            chosen_groups: vec![0; num_experts],
            chosen: vec![0; num_experts],
        }
    }

    /// Experts this scratch can route over.
    pub fn capacity(&self) -> usize {
        self.values.len()
    }
}

/// Index of the largest `values[i]` with `eligible(i)` and `i` not in
/// `taken`; ties go to the lower index. `None` when nothing is eligible.
fn best(values: &[f32], taken: &[usize], eligible: impl Fn(usize) -> bool) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, &v) in values.iter().enumerate() {
        if !eligible(i) || taken.contains(&i) {
            continue;
        }
        let better = match best {
            None => true,
            Some(b) => v > values[b],
        };
        if better {
            best = Some(i);
        }
    }
    best
}

/// Fills `chosen` with the `chosen.len()` best eligible indices, best first.
fn top_k(
    values: &[f32],
    chosen: &mut [usize],
    eligible: impl Fn(usize) -> bool + Copy,
) -> Result<(), BackendError> {
    let k = chosen.len();
    for i in 0..k {
        let (taken, rest) = chosen.split_at_mut(i);
        rest[0] = best(values, taken, eligible).ok_or(BackendError::TooFewEligible {
            top_k: k,
            eligible: i,
        })?;
    }
    Ok(())
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `values = softmax(logits)`, then the `chosen.len()` largest into `chosen`.
fn softmax_top_k(
    logits: &[f32],
    values: &mut [f32],
    chosen: &mut [usize],
) -> Result<(), BackendError> {
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for (p, &z) in values.iter_mut().zip(logits) {
        *p = (z - max).exp();
        sum += *p;
    }
    values.iter_mut().for_each(|p| *p /= sum);
    top_k(values, chosen, |_| true)
}

fn table_len(
    what: &'static str,
    table: Option<&[f32]>,
    experts: usize,
) -> Result<(), BackendError> {
    match table {
        Some(t) if t.len() < experts => Err(BackendError::BufferTooSmall {
            op: "route",
            what,
            need: experts,
            have: t.len(),
        }),
        _ => Ok(()),
    }
}

/// Routes one token: `logits` are its `num_experts` router logits (bias
/// included), `tables` the layer's selection bias and expert scales;
/// writes `top_k` routes into `out` (`slot` = expert id), best rank first.
pub fn route_token(
    spec: &RouterSpec,
    scratch: &mut RouterScratch,
    logits: &[f32],
    tables: RouterTables<'_, [f32]>,
    out: &mut [Route],
) -> Result<(), BackendError> {
    let (e, k) = (spec.num_experts, spec.top_k);
    if scratch.capacity() < e {
        return Err(BackendError::ScratchTooSmall {
            op: "route",
            need: e,
            have: scratch.capacity(),
        });
    }
    crate::check_len("route", "logits", logits.len(), e)?;
    crate::check_len("route", "routes", out.len(), k)?;
    table_len("correction", tables.correction, e)?;
    table_len("expert_scale", tables.expert_scale, e)?;
    let logits = &logits[..e];
    let out = &mut out[..k];
    let values = &mut scratch.values[..e];
    let chosen = &mut scratch.chosen[..k];
    match spec.kind {
        RouterKind::SoftmaxTopK { renormalize } => {
            softmax_top_k(logits, values, chosen)?;
            let total: f32 = chosen.iter().map(|&i| values[i]).sum();
            for (o, &i) in out.iter_mut().zip(chosen.iter()) {
                let w = values[i];
                *o = Route {
                    slot: i as u32,
                    weight: if renormalize { w / total } else { w },
                };
            }
        }
        RouterKind::Gemma4 => {
            softmax_top_k(logits, values, chosen)?;
            let total: f32 = chosen.iter().map(|&i| values[i]).sum();
            for (o, &i) in out.iter_mut().zip(chosen.iter()) {
                let scale = tables.expert_scale.map_or(1.0, |s| s[i]);
                *o = Route {
                    slot: i as u32,
                    weight: values[i] / total * scale,
                };
            }
        }
        RouterKind::TopKSoftmax => {
            top_k(logits, chosen, |_| true)?;
            let max = logits[chosen[0]];
            let sum: f32 = chosen.iter().map(|&i| (logits[i] - max).exp()).sum();
            for (o, &i) in out.iter_mut().zip(chosen.iter()) {
                *o = Route {
                    slot: i as u32,
                    weight: (logits[i] - max).exp() / sum,
                };
            }
        }
        RouterKind::SigmoidGrouped {
            n_group,
            topk_group,
            renormalize,
            scaling,
        } => {
            let per_group = e / n_group;
            let scores = &mut scratch.scores[..e];
            for i in 0..e {
                scores[i] = sigmoid(logits[i]);
                values[i] = scores[i] + tables.correction.map_or(0.0, |c| c[i]);
            }
            let groups = &mut scratch.groups[..n_group];
            for (g, score) in groups.iter_mut().enumerate() {
                let members = &values[g * per_group..(g + 1) * per_group];
                let mut top2 = [f32::NEG_INFINITY; 2];
                for &v in members {
                    if v > top2[0] {
                        top2 = [v, top2[0]];
                    } else if v > top2[1] {
                        top2[1] = v;
                    }
                }
                *score = if per_group >= 2 {
                    top2[0] + top2[1]
                } else {
                    top2[0]
                };
            }
            let kept = &mut scratch.chosen_groups[..topk_group];
            top_k(groups, kept, |_| true)?;
            let kept = &*kept;
            top_k(values, chosen, |i| kept.contains(&(i / per_group)))?;
            let total: f32 = chosen.iter().map(|&i| scores[i]).sum::<f32>() + 1e-20;
            for (o, &i) in out.iter_mut().zip(chosen.iter()) {
                let w = scores[i];
                let w = if renormalize { w / total } else { w };
                *o = Route {
                    slot: i as u32,
                    weight: w * scaling,
                };
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(kind: RouterKind, n: usize, k: usize, z: &[f32], c: Option<&[f32]>) -> Vec<(u32, f32)> {
        let tables = RouterTables {
            correction: c,
            expert_scale: None,
        };
        run_with(kind, n, k, z, tables)
    }

    fn run_with(
        kind: RouterKind,
        n: usize,
        k: usize,
        z: &[f32],
        tables: RouterTables<'_, [f32]>,
    ) -> Vec<(u32, f32)> {
        let spec = RouterSpec::new(kind, n, k).unwrap();
        let mut scratch = RouterScratch::new(n);
        let mut out = vec![Route::default(); k];
        route_token(&spec, &mut scratch, z, tables, &mut out).unwrap();
        out.iter().map(|r| (r.slot, r.weight)).collect()
    }

    #[test]
    fn softmax_top_k_renormalises() {
        let z = [0.0f32, 2.0, 1.0, -1.0];
        let got = run(
            RouterKind::SoftmaxTopK { renormalize: true },
            4,
            2,
            &z,
            None,
        );
        let (a, b) = (2f32.exp(), 1f32.exp());
        assert_eq!(got[0].0, 1);
        assert_eq!(got[1].0, 2);
        assert!((got[0].1 - a / (a + b)).abs() < 1e-6);
        let total: f32 = z.iter().map(|v| v.exp()).sum();
        let got = run(
            RouterKind::SoftmaxTopK { renormalize: false },
            4,
            2,
            &z,
            None,
        );
        assert!((got[1].1 - b / total).abs() < 1e-6);
    }

    #[test]
    fn top_k_softmax_uses_raw_logits() {
        let got = run(RouterKind::TopKSoftmax, 4, 2, &[3.0, -1.0, 3.5, 0.0], None);
        assert_eq!((got[0].0, got[1].0), (2, 0));
        let w = 1.0 / (1.0 + (-0.5f32).exp());
        assert!((got[0].1 - w).abs() < 1e-6);
    }

    #[test]
    fn grouped_router_limits_groups_and_ignores_bias_in_weights() {
        // 4 experts in 2 groups, keep 1 group, top-2.
        let kind = RouterKind::SigmoidGrouped {
            n_group: 2,
            topk_group: 1,
            renormalize: false,
            scaling: 2.0,
        };
        // Expert 0 alone is best, but group 1 (experts 2, 3) has the better pair.
        let z = [3.0f32, -3.0, 1.0, 1.0];
        let got = run(kind, 4, 2, &z, Some(&[0.0; 4]));
        assert_eq!((got[0].0, got[1].0), (2, 3));
        assert!((got[0].1 - 2.0 * sigmoid(1.0)).abs() < 1e-6);
        // A correction bias changes the choice, not the weight.
        let got = run(kind, 4, 2, &z, Some(&[0.0, 0.0, 0.0, 0.5]));
        assert_eq!(got[0].0, 3);
        assert!((got[0].1 - 2.0 * sigmoid(1.0)).abs() < 1e-6);
    }

    #[test]
    fn gemma4_router_renormalises_then_scales_per_expert() {
        let z = [0.0f32, 2.0, 1.0, -1.0];
        let scale = [1.0f32, 0.5, 3.0, 1.0];
        let got = run_with(
            RouterKind::Gemma4,
            4,
            2,
            &z,
            RouterTables {
                correction: None,
                expert_scale: Some(&scale[..]),
            },
        );
        // The scale applies after selection and renormalisation: it neither
        // changes the choice nor the normaliser.
        let (a, b) = (2f32.exp(), 1f32.exp());
        assert_eq!((got[0].0, got[1].0), (1, 2));
        assert!((got[0].1 - 0.5 * a / (a + b)).abs() < 1e-6);
        assert!((got[1].1 - 3.0 * b / (a + b)).abs() < 1e-6);
    }

    #[test]
    fn impossible_routers_are_refused() {
        let grouped = |n_group, topk_group| RouterKind::SigmoidGrouped {
            n_group,
            topk_group,
            renormalize: true,
            scaling: 1.0,
        };
        assert!(RouterSpec::new(RouterKind::TopKSoftmax, 4, 5).is_err());
        assert!(RouterSpec::new(RouterKind::TopKSoftmax, 4, 0).is_err());
        assert!(RouterSpec::new(grouped(0, 1), 4, 2).is_err());
        assert!(RouterSpec::new(grouped(3, 1), 4, 2).is_err());
        assert!(RouterSpec::new(grouped(4, 1), 4, 2).is_err());
        assert!(RouterSpec::new(grouped(2, 1), 4, 2).is_ok());
    }
}
