//! FFN census: how sparse the FFN intermediate is, layer by layer, and
//! which of its neurons carry the most.
//!
//! The intermediate is the GLU output that the down projection reads,
//!
//! ```text
//! a = act(gate·x + bg) ⊙ (up·x + bu)        [rows, width]
//! ```
//!
//! of every dense FFN (dense layers, a MoE layer's shared expert and its
//! parallel dense branch: a row per token) and of every routed expert (a
//! row per (token, rank), width the expert intermediate). Per site the
//! census counts, for each threshold `θ`, the values with `|a| < θ` (the
//! share of the intermediate a sparse kernel could skip at that cut-off),
//! and sums `|a|` per neuron (per (expert, neuron) for routed experts) in
//! f64, so that the mean `|a|` of a neuron over the rows that reached it
//! ranks the neurons worth keeping hot (the measurement behind
//! activation-sparsity offloading, as in PowerInfer and "LLM in a flash").
//!
//! The dense intermediate is read back from the decoder's own scratch
//! buffer after the GLU; the routed one is recomputed into a buffer of the
//! census with [`Stream::moe_intermediate`], so a backend's fused expert
//! kernels stay as they are. With streamed experts it is recomputed per
//! token group over the slots the group's experts were read into, and each
//! row is counted under the expert its route named, so the counts are
//! those of resident experts. None of it runs unless the session has a
//! census: the decoder pays one branch per FFN.

use crate::EngineError;
use turbospark_backend::{DType, Device, MoeInput, MoeScratch, Stream};

/// The thresholds of `--ffn-census` unless told otherwise.
pub const DEFAULT_THRESHOLDS: [f32; 3] = [1e-3, 1e-2, 1e-1];

/// Where in a layer an intermediate lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FfnSite {
    /// The FFN of a dense layer.
    Dense,
    /// The routed experts of a MoE layer.
    Experts,
    /// A MoE layer's always-on shared expert.
    Shared,
    /// A MoE layer's parallel dense MLP (Gemma 4).
    ParallelDense,
}

impl FfnSite {
    pub fn name(self) -> &'static str {
        match self {
            FfnSite::Dense => "dense",
            FfnSite::Experts => "experts",
            FfnSite::Shared => "shared_expert",
            FfnSite::ParallelDense => "parallel_dense",
        }
    }
}

/// The census of one site of one layer.
#[derive(Debug, Clone, PartialEq)]
pub struct SiteCensus {
    pub layer: usize,
    pub site: FfnSite,
    /// Neurons per row (the intermediate size).
    pub width: usize,
    /// Rows seen per group: one group (tokens) for a dense site, one per
    /// expert (routes to it) for routed experts.
    pub rows: Vec<u64>,
    /// Per threshold, the values with `|a|` below it.
    pub below: Vec<u64>,
    /// `Σ |a|` per `(group, neuron)`, `[groups, width]`.
    pub sum_abs: Vec<f64>,
}

/// One neuron of [`SiteCensus::top`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Neuron {
    /// The expert (0 for a dense site).
    pub group: usize,
    pub neuron: usize,
    /// Mean `|a|` over the rows that reached the neuron.
    pub mean_abs: f64,
}

impl SiteCensus {
    fn new(layer: usize, site: FfnSite, width: usize, groups: usize, thresholds: usize) -> Self {
        SiteCensus {
            layer,
            site,
            width,
            rows: vec![0; groups],
            below: vec![0; thresholds],
            sum_abs: vec![0.0; groups * width],
        }
    }

    /// Values counted: rows × width.
    pub fn values(&self) -> u64 {
        self.rows.iter().sum::<u64>() * self.width as u64
    }

    /// Per threshold, the share of values with `|a|` below it (0 with no
    /// values).
    pub fn share_below(&self) -> Vec<f64> {
        let v = self.values();
        self.below
            .iter()
            .map(|&b| if v == 0 { 0.0 } else { b as f64 / v as f64 })
            .collect()
    }

    /// Mean `|a|` over every value.
    pub fn mean_abs(&self) -> f64 {
        match self.values() {
            0 => 0.0,
            v => self.sum_abs.iter().sum::<f64>() / v as f64,
        }
    }

    /// The `n` neurons of highest mean `|a|`, highest first (ties: lower
    /// group, then lower neuron, first); groups no row reached are left
    /// out.
    pub fn top(&self, n: usize) -> Vec<Neuron> {
        let mut all: Vec<Neuron> = Vec::new();
        for (g, &rows) in self.rows.iter().enumerate() {
            if rows == 0 {
                continue;
            }
            let sums = &self.sum_abs[g * self.width..(g + 1) * self.width];
            all.extend(sums.iter().enumerate().map(|(i, &s)| Neuron {
                group: g,
                neuron: i,
                mean_abs: s / rows as f64,
            }));
        }
        all.sort_by(|a, b| {
            b.mean_abs
                .total_cmp(&a.mean_abs)
                .then(a.group.cmp(&b.group))
                .then(a.neuron.cmp(&b.neuron))
        });
        all.truncate(n);
        all
    }

    /// Counts `rows` rows of `data` (`[rows, width]`) into `group`.
    fn count(&mut self, thresholds: &[f32], group: usize, data: &[f32]) {
        let w = self.width;
        self.rows[group] += (data.len() / w) as u64;
        let sums = &mut self.sum_abs[group * w..(group + 1) * w];
        for row in data.chunks_exact(w) {
            for (s, &v) in sums.iter_mut().zip(row) {
                let a = v.abs();
                *s += f64::from(a);
                for (b, &th) in self.below.iter_mut().zip(thresholds) {
                    *b += u64::from(a < th);
                }
            }
        }
    }
}

/// The census of a session: every site met so far, in the order met
/// (layer order within a pass).
#[derive(Debug, Clone, PartialEq)]
pub struct FfnCensus {
    /// Ascending.
    pub thresholds: Vec<f32>,
    pub sites: Vec<SiteCensus>,
}

impl FfnCensus {
    /// The census of `site` of `layer`, if met.
    pub fn site(&self, layer: usize, site: FfnSite) -> Option<&SiteCensus> {
        self.sites
            .iter()
            .find(|s| s.layer == layer && s.site == site)
    }

    fn site_mut(&mut self, layer: usize, site: FfnSite, width: usize, groups: usize) -> usize {
        match self
            .sites
            .iter()
            .position(|s| s.layer == layer && s.site == site)
        {
            Some(i) => i,
            None => {
                let t = self.thresholds.len();
                self.sites
                    .push(SiteCensus::new(layer, site, width, groups, t));
                self.sites.len() - 1
            }
        }
    }

    /// Zeroes every count (the sites stay).
    pub fn reset(&mut self) {
        for s in &mut self.sites {
            s.rows.fill(0);
            s.below.fill(0);
            s.sum_abs.fill(0.0);
        }
    }
}

/// The census with what it reads back into.
pub(crate) struct CensusState<D: Device> {
    pub(crate) data: FfnCensus,
    /// Routed intermediates `[max_batch · top_k, expert_intermediate]`
    /// (`None` for a model without MoE layers).
    inter: Option<D::Buf>,
    /// Read-back of a dense intermediate or of `inter`.
    host: Vec<f32>,
    /// Read-back of the routes `[max_batch, top_k]`.
    routes: Vec<turbospark_backend::Route>,
    top_k: usize,
    /// Groups of the routed site: one per expert of the model.
    num_experts: usize,
}

impl<D: Device> CensusState<D> {
    /// A census with `thresholds` (sorted here) for a session of
    /// `max_batch` tokens a pass.
    pub(crate) fn new(
        device: &D,
        spec: &turbospark_core::ArchSpec,
        max_batch: usize,
        thresholds: &[f32],
    ) -> Result<Self, EngineError> {
        if thresholds.is_empty() || thresholds.iter().any(|t| !(t.is_finite() && *t > 0.0)) {
            return Err(EngineError::BadOptions {
                detail: format!(
                    "FFN census thresholds must be positive numbers, got {thresholds:?}"
                ),
            });
        }
        let mut thresholds = thresholds.to_vec();
        thresholds.sort_by(f32::total_cmp);
        thresholds.dedup();
        let dense = spec.intermediate_size.max(
            spec.moe
                .as_ref()
                .and_then(|m| m.shared_intermediate)
                .unwrap_or(0),
        );
        let (inter, routed) = match &spec.moe {
            Some(m) => {
                let len = max_batch * m.top_k * m.expert_intermediate;
                (Some(device.alloc(DType::F32, len)?), len)
            }
            None => (None, 0),
        };
        let routes = spec.moe.as_ref().map_or(0, |m| max_batch * m.top_k);
        Ok(CensusState {
            data: FfnCensus {
                thresholds,
                sites: Vec::new(),
            },
            inter,
            host: vec![0.0; (max_batch * dense).max(routed)],
            routes: vec![Default::default(); routes],
            top_k: spec.moe.as_ref().map_or(0, |m| m.top_k),
            num_experts: spec.moe.as_ref().map_or(0, |m| m.num_experts),
        })
    }

    /// Counts a dense intermediate: the first `n` rows of `a` (`[n,
    /// width]`).
    pub(crate) fn dense(
        &mut self,
        st: &mut D::Stream,
        layer: usize,
        site: FfnSite,
        a: &D::Buf,
        n: usize,
        width: usize,
    ) -> Result<(), EngineError> {
        let host = &mut self.host[..n * width];
        st.read(a, host)?;
        let i = self.data.site_mut(layer, site, width, 1);
        self.data.sites[i].count(&self.data.thresholds, 0, host);
        Ok(())
    }

    /// Counts the routed experts' intermediate of `input`, each row into
    /// its expert's group. `experts` gives the expert id of each route
    /// (`[n_tokens, top_k]`) when `input.bank` is a bank of slots that a
    /// streamed store filled; without it the routes are read back and
    /// their slots are the expert ids (a bank of every expert).
    pub(crate) fn experts(
        &mut self,
        st: &mut D::Stream,
        layer: usize,
        input: MoeInput<'_, D>,
        scratch: &mut MoeScratch<D::Buf>,
        experts: Option<&[turbospark_backend::Route]>,
    ) -> Result<(), EngineError> {
        use turbospark_backend::ExpertBank;
        let inter = self.inter.as_mut().ok_or(EngineError::NotImplemented {
            feature: "an FFN census of routed experts in a model without MoE layers",
        })?;
        let (n, width, k) = (input.n_tokens, input.bank.intermediate(), self.top_k);
        st.moe_intermediate(input, scratch, inter)?;
        let ids = match experts {
            Some(ids) => ids.get(..n * k).ok_or(EngineError::NotImplemented {
                feature: "an FFN census given fewer routes than rows",
            })?,
            None => {
                let routes = &mut self.routes[..n * k];
                st.read_routes(input.routes, routes)?;
                &*routes
            }
        };
        let host = &mut self.host[..n * k * width];
        st.read(inter, host)?;
        let i = self
            .data
            .site_mut(layer, FfnSite::Experts, width, self.num_experts);
        let site = &mut self.data.sites[i];
        for (r, row) in ids.iter().zip(host.chunks_exact(width)) {
            let group = r.slot as usize;
            if group >= self.num_experts {
                return Err(turbospark_backend::BackendError::BadRoute {
                    slot: group,
                    available: self.num_experts,
                }
                .into());
            }
            site.count(&self.data.thresholds, group, row);
        }
        Ok(())
    }
}
