//! A session's side of the expert store: the routed-expert step of each MoE
//! layer, its statistics, and (streamed) the layer's slots.
//!
//! For each layer and batch, [`SessionExperts::run`] receives the routes
//! (`[n_tokens, top_k]`, expert ids, best rank first) and:
//!
//! - resident or mapped: hands them with every expert to
//!   [`Backend::moe`] in one call;
//! - streamed: splits the batch into consecutive token groups whose distinct
//!   experts fit the layer's slots (the whole batch when it fits; a decode
//!   token always fits since slots ≥ top_k), and per group fetches the
//!   experts (hits are pinned first, then each miss takes a victim slot,
//!   then all misses are read in parallel), rewrites the routes from expert
//!   ids to slot indices, and computes the group's rows over the slot
//!   weights: the experts that hit while the misses are being read
//!   ([`Backend::moe_experts`] on the hit slots), the misses once they
//!   have arrived, then the rank-order sum ([`Backend::moe_combine`]).
//!
//! Only the expert each route addresses changes place; the weights, rank
//! order and per-row arithmetic are those of the resident path, so the
//! output bits are too.
//!
//! Nothing here allocates after [`SessionExperts::new`]: route and group
//! buffers are sized for the session's largest batch, the slot matrices are
//! refreshed in place ([`Backend::reload_matrix`]) after a read.

use super::aligned::AlignedBuf;
use super::cache::SlotCache;
use super::io::{IoPool, Pending, ReadJob};
use super::stats::{ExpertStats, LayerStats, RouterHistogram};
use super::{slot_bytes, Bytes, ExpertError, ExpertFile, ExpertPlan, Residency};
use crate::model::Model;
use crate::EngineError;
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use turbospark_backend::host::ByteOwner;
use turbospark_backend::{
    Backend, BackendError, ExpertWeights, HostTensor, MoeInput, MoeScratch, Route, SharedBytes,
};
use turbospark_core::arch::{Activation, ArchSpec};

/// One MoE layer's routed-expert step.
pub(crate) struct RoutedInput<'a, B: Backend> {
    pub layer: usize,
    /// `[n_tokens, hidden]`
    pub x: &'a B::Buf,
    pub n_tokens: usize,
    /// `[n_tokens, top_k]`; `slot` is the expert id.
    pub routes: &'a [Route],
    /// Every expert of the layer, by id (resident, mapped); empty when
    /// streamed.
    pub held: &'a [ExpertWeights<B::Matrix, B::Vector>],
    pub activation: Activation,
}

/// The parts of one slot as host tensors over its bytes, built once.
struct SlotTensors {
    gate: HostTensor,
    up: HostTensor,
    down: HostTensor,
    gate_bias: Option<HostTensor>,
    up_bias: Option<HostTensor>,
    down_bias: Option<HostTensor>,
}

/// A read the current group needs.
struct Miss {
    slot: u32,
    expert: u32,
}

/// The slots of one streamed layer.
struct SlotLayer<B: Backend> {
    layer: usize,
    file: Arc<File>,
    path: PathBuf,
    stride: u64,
    /// Bytes read per expert: the record, or the whole page-rounded slot
    /// under direct I/O.
    read_len: usize,
    slot_bytes: usize,
    /// `[slots, slot_bytes]`, owner of every slot tensor's bytes.
    buf: Arc<AlignedBuf>,
    tensors: Vec<SlotTensors>,
    /// The backend's view of each slot, refreshed after each read.
    weights: Vec<ExpertWeights<B::Matrix, B::Vector>>,
    cache: SlotCache,
}

impl<B: Backend> SlotLayer<B> {
    fn new(
        be: &B,
        spec: &ArchSpec,
        f: &ExpertFile,
        plan: &ExpertPlan,
    ) -> Result<SlotLayer<B>, EngineError> {
        let layer = f.layer;
        let layout = &f.layout;
        let slots = plan.slots.min(layout.num_experts);
        let sb = slot_bytes(layout) as usize;
        let total = slots.checked_mul(sb);
        let buf = total
            .and_then(AlignedBuf::zeroed)
            .ok_or(ExpertError::Alloc {
                layer,
                bytes: Bytes((slots as u64).saturating_mul(sb as u64)),
            })?;
        let record = layout.record_len() as usize;
        let read_len = if plan.direct_io { sb } else { record };
        // Every slot's read range lies inside the buffer; reads rely on it.
        if read_len > sb || buf.region((slots.max(1) - 1) * sb, sb).is_none() {
            return Err(ExpertError::Alloc {
                layer,
                bytes: Bytes(buf.len() as u64),
            }
            .into());
        }
        let buf = Arc::new(buf);
        let owner: ByteOwner = buf.clone();
        let biases = spec.moe.as_ref().is_some_and(|m| m.expert_biases);
        let mut tensors = Vec::with_capacity(slots);
        let mut weights = Vec::with_capacity(slots);
        for s in 0..slots {
            let part = |name: &str| -> Result<HostTensor, EngineError> {
                let p = layout
                    .part(name)
                    .ok_or_else(|| EngineError::MissingTensor {
                        name: format!("blk.{layer}.experts.{name}"),
                    })?;
                let start = s * sb + p.offset as usize;
                Ok(HostTensor {
                    name: format!("blk.{layer}.expert_slot.{s}.{name}"),
                    format: p.dtype,
                    shape: p.shape.iter().map(|&d| d as usize).collect(),
                    bytes: SharedBytes::new(owner.clone(), start..start + p.length as usize)?,
                })
            };
            let bias = |name: &str| biases.then(|| part(name)).transpose();
            let t = SlotTensors {
                gate: part("gate")?,
                up: part("up")?,
                down: part("down")?,
                gate_bias: bias("gate.bias")?,
                up_bias: bias("up.bias")?,
                down_bias: bias("down.bias")?,
            };
            let vector =
                |t: &Option<HostTensor>| t.as_ref().map(|t| be.upload_vector(t)).transpose();
            weights.push(ExpertWeights {
                gate: be.upload_matrix(&t.gate)?,
                up: be.upload_matrix(&t.up)?,
                down: be.upload_matrix(&t.down)?,
                gate_bias: vector(&t.gate_bias)?,
                up_bias: vector(&t.up_bias)?,
                down_bias: vector(&t.down_bias)?,
            });
            tensors.push(t);
        }
        Ok(SlotLayer {
            layer,
            file: Arc::clone(&f.file),
            path: f.path.clone(),
            stride: layout.stride,
            read_len,
            slot_bytes: sb,
            buf,
            tensors,
            weights,
            cache: SlotCache::new(plan.policy, slots, layout.num_experts),
        })
    }

    /// Pins the experts of `needed` (distinct ids) already in a slot for the
    /// current group and gives every other one a victim slot, listed in
    /// `misses` to be read; counts the requests and hits.
    fn plan(
        &mut self,
        needed: &[u32],
        misses: &mut Vec<Miss>,
        stats: &mut LayerStats,
    ) -> Result<(), EngineError> {
        let (layer, slots) = (self.layer, self.cache.slots());
        let exhausted = || ExpertError::SlotsExhausted { layer, slots };
        self.cache.begin();
        let mut hits = 0;
        for &e in needed {
            if self.cache.pin(e).is_some() {
                hits += 1;
            }
        }
        misses.clear();
        for &e in needed {
            if self.cache.pinned(e) {
                continue;
            }
            let Some(slot) = self.cache.assign(e) else {
                // Not reachable when groups fit the slots; leave no slot
                // claiming an expert it never received.
                for m in misses.iter() {
                    self.cache.invalidate(m.slot);
                }
                return Err(exhausted().into());
            };
            misses.push(Miss { slot, expert: e });
        }
        stats.requests += needed.len() as u64;
        stats.hits += hits;
        Ok(())
    }

    /// The error of a failed read of `expert`.
    fn read_error(&self, expert: u32, source: std::io::Error) -> EngineError {
        ExpertError::Read {
            layer: self.layer,
            expert: expert as usize,
            path: self.path.clone(),
            offset: expert as u64 * self.stride,
            len: self.read_len,
            source,
        }
        .into()
    }

    /// Posts the reads of `misses` (none: `None`). Until the batch is
    /// finished ([`SlotLayer::finish_reads`]) the misses' slots are being
    /// written: the caller computes only on other slots meanwhile, and this
    /// layer (which owns the buffer) outlives the batch.
    fn start_reads<'p>(
        &self,
        pool: &'p IoPool,
        misses: &[Miss],
    ) -> Result<Option<Pending<'p>>, EngineError> {
        if misses.is_empty() {
            return Ok(None);
        }
        pool.submit(misses.iter().map(|m| ReadJob {
            file: Arc::clone(&self.file),
            offset: m.expert as u64 * self.stride,
            // In bounds: `slot < slots` and the layout was checked in `new`.
            dst: self.buf.region_unchecked(m.slot as usize * self.slot_bytes),
            len: self.read_len,
        }))
        .map(Some)
        .map_err(|(i, source)| self.read_error(misses.get(i).map_or(0, |m| m.expert), source))
    }

    /// Waits for the reads of `misses`, counts them and points the backend
    /// at the new bytes. On failure the misses' slots are emptied, so a
    /// later request reads them again.
    fn finish_reads(
        &mut self,
        be: &B,
        pending: Option<Pending<'_>>,
        misses: &[Miss],
        stats: &mut LayerStats,
    ) -> Result<(), EngineError> {
        let Some(pending) = pending else {
            return Ok(());
        };
        let times = match pending.wait() {
            Ok(t) => t,
            Err((i, source)) => {
                for m in misses {
                    self.cache.invalidate(m.slot);
                }
                return Err(self.read_error(misses.get(i).map_or(0, |m| m.expert), source));
            }
        };
        stats.read_nanos += times.busy.as_nanos() as u64;
        stats.wait_nanos += times.waited.as_nanos() as u64;
        stats.reads += misses.len() as u64;
        stats.bytes_read += (misses.len() * self.read_len) as u64;
        for m in misses {
            if let Err(e) = self.reload(be, m.slot as usize) {
                for m in misses {
                    self.cache.invalidate(m.slot);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Points the backend's view of `slot` at its freshly read bytes.
    fn reload(&mut self, be: &B, slot: usize) -> Result<(), EngineError> {
        let (w, t) = (&mut self.weights[slot], &self.tensors[slot]);
        be.reload_matrix(&mut w.gate, &t.gate)?;
        be.reload_matrix(&mut w.up, &t.up)?;
        be.reload_matrix(&mut w.down, &t.down)?;
        for (v, t) in [
            (w.gate_bias.as_mut(), t.gate_bias.as_ref()),
            (w.up_bias.as_mut(), t.up_bias.as_ref()),
            (w.down_bias.as_mut(), t.down_bias.as_ref()),
        ] {
            if let (Some(v), Some(t)) = (v, t) {
                be.reload_vector(v, t)?;
            }
        }
        Ok(())
    }
}

/// Splits a batch's routes into groups of consecutive tokens whose distinct
/// experts fit a limit.
struct Grouper {
    top_k: usize,
    /// Per expert, the last group that counted it. `[num_experts]`
    seen: Vec<u64>,
    group: u64,
    /// Distinct experts of the current group, in first-use order.
    needed: Vec<u32>,
}

impl Grouper {
    /// Starts a group at token `t0` of `routes` (`[n, top_k]`) and extends
    /// it while its distinct experts stay within `limit` (a group holds at
    /// least one token); returns the token after the group.
    fn next(
        &mut self,
        routes: &[Route],
        t0: usize,
        n: usize,
        limit: usize,
    ) -> Result<usize, EngineError> {
        let k = self.top_k;
        self.group += 1;
        self.needed.clear();
        let mut t1 = t0;
        while t1 < n {
            let token = &routes[t1 * k..(t1 + 1) * k];
            let mut new = 0;
            for r in token {
                match self.seen.get(r.slot as usize) {
                    Some(&g) => new += usize::from(g != self.group),
                    None => {
                        return Err(BackendError::BadRoute {
                            slot: r.slot as usize,
                            available: self.seen.len(),
                        }
                        .into())
                    }
                }
            }
            if t1 > t0 && self.needed.len() + new > limit {
                break;
            }
            for r in token {
                let g = &mut self.seen[r.slot as usize];
                if *g != self.group {
                    *g = self.group;
                    self.needed.push(r.slot);
                }
            }
            t1 += 1;
        }
        Ok(t1)
    }
}

/// Slots, reader pool and group buffers of a streamed session.
struct Streamed<B: Backend> {
    /// By layer index; `None` for dense layers.
    layers: Vec<Option<SlotLayer<B>>>,
    pool: IoPool,
    misses: Vec<Miss>,
    /// Which slots a partial expert computation covers `[max_slots]`.
    ready: Vec<bool>,
    /// Routes rewritten to slot indices `[max_batch, top_k]`.
    remap: Vec<Route>,
    /// A group's input rows and output rows `[max_batch, hidden]`.
    group_x: B::Buf,
    group_out: B::Buf,
}

/// The expert side of a session.
pub(crate) struct SessionExperts<B: Backend> {
    hidden: usize,
    pub stats: ExpertStats,
    pub histogram: RouterHistogram,
    grouper: Grouper,
    streamed: Option<Streamed<B>>,
}

impl<B: Backend> SessionExperts<B> {
    pub(crate) fn new(model: &Model<B>, max_batch: usize) -> Result<Self, EngineError> {
        let spec = &model.spec;
        let be = &model.backend;
        let (num_experts, top_k) = spec
            .moe
            .as_ref()
            .map_or((0, 0), |m| (m.num_experts, m.top_k));
        let moe_layers: Vec<usize> = spec.moe_layers().collect();
        let store = &model.experts;
        let streamed = if store.residency() == Residency::Streamed && !moe_layers.is_empty() {
            let plan = store.plan();
            let mut layers: Vec<Option<SlotLayer<B>>> =
                (0..spec.num_layers()).map(|_| None).collect();
            for f in &store.files {
                if let Some(slot) = layers.get_mut(f.layer) {
                    *slot = Some(SlotLayer::new(be, spec, f, plan)?);
                }
            }
            if let Some(&l) = moe_layers.iter().find(|&&l| layers[l].is_none()) {
                return Err(EngineError::MissingTensor {
                    name: format!("blk.{l}.experts (expert file)"),
                });
            }
            let max_slots = layers
                .iter()
                .flatten()
                .map(|l| l.cache.slots())
                .max()
                .unwrap_or(0);
            Some(Streamed {
                layers,
                pool: IoPool::new(plan.io_threads, max_slots).map_err(ExpertError::Threads)?,
                misses: Vec::with_capacity(max_slots),
                ready: vec![false; max_slots],
                remap: vec![Route::default(); max_batch * top_k],
                group_x: be.alloc(max_batch * spec.hidden_size)?,
                group_out: be.alloc(max_batch * spec.hidden_size)?,
            })
        } else {
            None
        };
        Ok(SessionExperts {
            hidden: spec.hidden_size,
            stats: ExpertStats::new(moe_layers.iter().copied()),
            histogram: RouterHistogram::new(moe_layers.iter().copied(), num_experts, top_k),
            grouper: Grouper {
                top_k,
                seen: vec![0; num_experts],
                group: 0,
                needed: Vec::with_capacity(num_experts),
            },
            streamed,
        })
    }

    /// `out[t] = Σ_r w[t, r] · expert[t, r](x[t])`, summed in rank order,
    /// for the `n_tokens` rows of `input` (see the module docs).
    pub(crate) fn run(
        &mut self,
        be: &B,
        input: RoutedInput<'_, B>,
        scratch: &mut MoeScratch<B::Buf>,
        out: &mut B::Buf,
    ) -> Result<(), EngineError> {
        let RoutedInput {
            layer,
            x,
            n_tokens: n,
            routes,
            held,
            activation,
        } = input;
        let k = self.grouper.top_k;
        let routes = &routes[..n * k];
        self.histogram.record(layer, routes.iter().map(|r| r.slot));
        let stats = self
            .stats
            .layer_mut(layer)
            .ok_or(EngineError::NotImplemented {
                feature: "routed experts on a layer the spec does not mark MoE",
            })?;
        let Some(st) = self.streamed.as_mut() else {
            // Every expert is in memory: one call, every request a hit.
            self.grouper.next(routes, 0, n, usize::MAX)?;
            let requested = self.grouper.needed.len() as u64;
            stats.requests += requested;
            stats.hits += requested;
            let input = MoeInput {
                x,
                n_tokens: n,
                routes,
                experts: held,
                activation,
            };
            be.moe(input, scratch, out)?;
            return Ok(());
        };
        let sl = st
            .layers
            .get_mut(layer)
            .and_then(Option::as_mut)
            .ok_or(ExpertError::NoExpertFiles)?;
        let slots = sl.cache.slots();
        let h = self.hidden;
        let mut t0 = 0;
        while t0 < n {
            let t1 = self.grouper.next(routes, t0, n, slots)?;
            sl.plan(&self.grouper.needed, &mut st.misses, stats)?;
            let group = t0 * k..t1 * k;
            for (dst, r) in st.remap[group.clone()]
                .iter_mut()
                .zip(&routes[group.clone()])
            {
                let slot = sl
                    .cache
                    .slot_of(r.slot)
                    .ok_or(ExpertError::SlotsExhausted { layer, slots })?;
                *dst = Route {
                    slot,
                    weight: r.weight,
                };
            }
            let m = t1 - t0;
            let whole = m == n;
            if !whole {
                be.copy(x, t0 * h, &mut st.group_x, 0, m * h)?;
            }
            let gx = if whole { x } else { &st.group_x };
            // The hits are computed while the misses are read.
            let ready = &mut st.ready[..slots];
            ready.fill(true);
            for miss in &st.misses {
                ready[miss.slot as usize] = false;
            }
            let pending = sl.start_reads(&st.pool, &st.misses)?;
            let hits = if st.misses.len() < self.grouper.needed.len() {
                let input = MoeInput {
                    x: gx,
                    n_tokens: m,
                    routes: &st.remap[group.clone()],
                    experts: &sl.weights,
                    activation,
                };
                be.moe_experts(input, scratch, Some(ready))
            } else {
                Ok(())
            };
            sl.finish_reads(be, pending, &st.misses, stats)?;
            hits?;
            if !st.misses.is_empty() {
                ready.fill(false);
                for miss in &st.misses {
                    ready[miss.slot as usize] = true;
                }
                let input = MoeInput {
                    x: gx,
                    n_tokens: m,
                    routes: &st.remap[group.clone()],
                    experts: &sl.weights,
                    activation,
                };
                be.moe_experts(input, scratch, Some(ready))?;
            }
            if whole {
                be.moe_combine(n, h, &st.remap[group], scratch, out)?;
            } else {
                be.moe_combine(m, h, &st.remap[group], scratch, &mut st.group_out)?;
                be.copy(&st.group_out, 0, out, t0 * h, m * h)?;
            }
            t0 = t1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes(experts: &[[u32; 2]]) -> Vec<Route> {
        experts
            .iter()
            .flatten()
            .map(|&slot| Route { slot, weight: 1.0 })
            .collect()
    }

    #[test]
    fn sessions_stay_sendable() {
        fn send<T: Send>() {}
        send::<SessionExperts<turbospark_cpu::CpuBackend>>();
        send::<crate::Session<'static, turbospark_cpu::CpuBackend>>();
    }

    #[test]
    fn groups_fit_the_limit_and_cover_every_token() {
        let mut g = Grouper {
            top_k: 2,
            seen: vec![0; 8],
            group: 0,
            needed: Vec::with_capacity(8),
        };
        let r = routes(&[[0, 1], [1, 0], [2, 3], [0, 2], [4, 5]]);
        // Limit 3: {0,1} + {1,0} fit, + {2,3} would make 4.
        assert_eq!(g.next(&r, 0, 5, 3).unwrap(), 2);
        assert_eq!(g.needed, [0, 1]);
        // {2,3} + {0,2} is 3 experts.
        assert_eq!(g.next(&r, 2, 5, 3).unwrap(), 4);
        assert_eq!(g.needed, [2, 3, 0]);
        assert_eq!(g.next(&r, 4, 5, 3).unwrap(), 5);
        assert_eq!(g.needed, [4, 5]);
        // No limit: one group, distinct experts counted once.
        assert_eq!(g.next(&r, 0, 5, usize::MAX).unwrap(), 5);
        assert_eq!(g.needed, [0, 1, 2, 3, 4, 5]);
        let bad = routes(&[[0, 9]]);
        assert!(g.next(&bad, 0, 1, 4).is_err());
    }
}
