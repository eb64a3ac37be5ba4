//! Router math: one token's router logits → `(expert, weight)` pairs, best
//! rank first. Runs on the host over `num_experts` floats, without
//! allocating (scratch is sized once).
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
//! Ties go to the lower expert index.

use crate::EngineError;
use turbospark_backend::Route;
use turbospark_core::arch::{MoeSpec, RouterKind};

/// Per-layer tensors a router reads besides the logits, each
/// `[num_experts]`; absent ones are the identity (bias 0, scale 1).
#[derive(Debug, Clone, Copy, Default)]
pub struct RouterTables<'a> {
    /// Selection-only bias added to the scores (`exp_probs_b.bias`,
    /// grouped router).
    pub correction: Option<&'a [f32]>,
    /// Multiplier on each chosen expert's weight
    /// (`ffn_gate_inp.expert_scale`, Gemma 4).
    pub expert_scale: Option<&'a [f32]>,
}

/// Host-side router of one model, with its scratch.
pub struct Router {
    kind: RouterKind,
    num_experts: usize,
    top_k: usize,
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
) -> Result<(), EngineError> {
    for i in 0..chosen.len() {
        let (taken, rest) = chosen.split_at_mut(i);
        rest[0] = best(values, taken, eligible).ok_or(EngineError::NotImplemented {
            feature: "routing with fewer eligible experts than top_k",
        })?;
    }
    Ok(())
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

impl Router {
    pub fn new(moe: &MoeSpec) -> Result<Router, EngineError> {
        let n_group = match moe.router {
            RouterKind::SigmoidGrouped { n_group, .. } => n_group,
            _ => 0,
        };
        Ok(Router {
            kind: moe.router,
            num_experts: moe.num_experts,
            top_k: moe.top_k,
            values: vec![0.0; moe.num_experts],
            scores: vec![0.0; moe.num_experts],
            groups: vec![0.0; n_group],
            chosen_groups: vec![0; n_group],
            chosen: vec![0; moe.top_k],
        })
    }

    pub fn top_k(&self) -> usize {
        self.top_k
    }

    pub fn num_experts(&self) -> usize {
        self.num_experts
    }

    /// `values = softmax(logits)`, then the `top_k` largest into `chosen`.
    fn softmax_top_k(&mut self, logits: &[f32]) -> Result<(), EngineError> {
        let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for (p, &z) in self.values.iter_mut().zip(logits) {
            *p = (z - max).exp();
            sum += *p;
        }
        self.values.iter_mut().for_each(|p| *p /= sum);
        top_k(&self.values, &mut self.chosen, |_| true)
    }

    /// Routes one token: `logits` are its `num_experts` router logits (bias
    /// included), `tables` the layer's selection bias and expert scales;
    /// writes `top_k` routes into `out`, best rank first.
    pub fn route(
        &mut self,
        logits: &[f32],
        tables: RouterTables<'_>,
        out: &mut [Route],
    ) -> Result<(), EngineError> {
        let (e, k) = (self.num_experts, self.top_k);
        let logits = &logits[..e];
        let out = &mut out[..k];
        match self.kind {
            RouterKind::SoftmaxTopK { renormalize } => {
                self.softmax_top_k(logits)?;
                let total: f32 = self.chosen.iter().map(|&i| self.values[i]).sum();
                for (o, &i) in out.iter_mut().zip(&self.chosen) {
                    let w = self.values[i];
                    *o = Route {
                        slot: i as u32,
                        weight: if renormalize { w / total } else { w },
                    };
                }
            }
            RouterKind::Gemma4 => {
                self.softmax_top_k(logits)?;
                let total: f32 = self.chosen.iter().map(|&i| self.values[i]).sum();
                for (o, &i) in out.iter_mut().zip(&self.chosen) {
                    let scale = tables.expert_scale.map_or(1.0, |s| s[i]);
                    *o = Route {
                        slot: i as u32,
                        weight: self.values[i] / total * scale,
                    };
                }
            }
            RouterKind::TopKSoftmax => {
                top_k(logits, &mut self.chosen, |_| true)?;
                let max = logits[self.chosen[0]];
                let sum: f32 = self.chosen.iter().map(|&i| (logits[i] - max).exp()).sum();
                for (o, &i) in out.iter_mut().zip(&self.chosen) {
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
                for i in 0..e {
                    self.scores[i] = sigmoid(logits[i]);
                    self.values[i] = self.scores[i] + tables.correction.map_or(0.0, |c| c[i]);
                }
                for g in 0..n_group {
                    let members = &self.values[g * per_group..(g + 1) * per_group];
                    let mut top2 = [f32::NEG_INFINITY; 2];
                    for &v in members {
                        if v > top2[0] {
                            top2 = [v, top2[0]];
                        } else if v > top2[1] {
                            top2[1] = v;
                        }
                    }
                    self.groups[g] = if per_group >= 2 {
                        top2[0] + top2[1]
                    } else {
                        top2[0]
                    };
                }
                top_k(&self.groups, &mut self.chosen_groups[..topk_group], |_| {
                    true
                })?;
                let groups = &self.chosen_groups[..topk_group];
                top_k(&self.values, &mut self.chosen, |i| {
                    groups.contains(&(i / per_group))
                })?;
                let total: f32 = self.chosen.iter().map(|&i| self.scores[i]).sum::<f32>() + 1e-20;
                for (o, &i) in out.iter_mut().zip(&self.chosen) {
                    let w = self.scores[i];
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(router: RouterKind, n: usize, k: usize) -> MoeSpec {
        MoeSpec {
            num_experts: n,
            top_k: k,
            expert_intermediate: 1,
            router,
            router_bias: false,
            expert_biases: false,
            shared_intermediate: None,
            parallel_dense: false,
        }
    }

    fn run(r: &mut Router, z: &[f32], c: Option<&[f32]>) -> Vec<(u32, f32)> {
        let tables = RouterTables {
            correction: c,
            expert_scale: None,
        };
        run_with(r, z, tables)
    }

    fn run_with(r: &mut Router, z: &[f32], tables: RouterTables<'_>) -> Vec<(u32, f32)> {
        let mut out = vec![Route::default(); r.top_k()];
        r.route(z, tables, &mut out).unwrap();
        out.iter().map(|r| (r.slot, r.weight)).collect()
    }

    #[test]
    fn softmax_top_k_renormalises() {
        let z = [0.0f32, 2.0, 1.0, -1.0];
        let mut r =
            Router::new(&spec(RouterKind::SoftmaxTopK { renormalize: true }, 4, 2)).unwrap();
        let got = run(&mut r, &z, None);
        let (a, b) = (2f32.exp(), 1f32.exp());
        assert_eq!(got[0].0, 1);
        assert_eq!(got[1].0, 2);
        assert!((got[0].1 - a / (a + b)).abs() < 1e-6);
        let mut r =
            Router::new(&spec(RouterKind::SoftmaxTopK { renormalize: false }, 4, 2)).unwrap();
        let total: f32 = z.iter().map(|v| v.exp()).sum();
        assert!((run(&mut r, &z, None)[1].1 - b / total).abs() < 1e-6);
    }

    #[test]
    fn top_k_softmax_uses_raw_logits() {
        let mut r = Router::new(&spec(RouterKind::TopKSoftmax, 4, 2)).unwrap();
        let got = run(&mut r, &[3.0, -1.0, 3.5, 0.0], None);
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
        let mut r = Router::new(&spec(kind, 4, 2)).unwrap();
        // Expert 0 alone is best, but group 1 (experts 2, 3) has the better pair.
        let z = [3.0f32, -3.0, 1.0, 1.0];
        let got = run(&mut r, &z, Some(&[0.0; 4]));
        assert_eq!((got[0].0, got[1].0), (2, 3));
        assert!((got[0].1 - 2.0 * sigmoid(1.0)).abs() < 1e-6);
        // A correction bias changes the choice, not the weight.
        let got = run(&mut r, &z, Some(&[0.0, 0.0, 0.0, 0.5]));
        assert_eq!(got[0].0, 3);
        assert!((got[0].1 - 2.0 * sigmoid(1.0)).abs() < 1e-6);
    }

    #[test]
    fn gemma4_router_renormalises_then_scales_per_expert() {
        let z = [0.0f32, 2.0, 1.0, -1.0];
        let mut r = Router::new(&spec(RouterKind::Gemma4, 4, 2)).unwrap();
        let scale = [1.0f32, 0.5, 3.0, 1.0];
        let got = run_with(
            &mut r,
            &z,
            RouterTables {
                correction: None,
                expert_scale: Some(&scale),
            },
        );
        // The scale applies after selection and renormalisation: it neither
        // changes the choice nor the normaliser.
        let (a, b) = (2f32.exp(), 1f32.exp());
        assert_eq!((got[0].0, got[1].0), (1, 2));
        assert!((got[0].1 - 0.5 * a / (a + b)).abs() < 1e-6);
        assert!((got[1].1 - 3.0 * b / (a + b)).abs() < 1e-6);
    }
}
