//! A session's side of the expert store: the routed-expert step of each MoE
//! layer, its statistics, and (streamed) the layer's slots.
//!
//! For each layer and batch, [`SessionExperts::run`] receives the routes
//! the device computed (`[n_tokens, top_k]`, expert ids, best rank first)
//! and:
//!
//! - resident or mapped: hands them with the layer's bank to
//!   [`Stream::moe`] in one call, never reading them back unless the
//!   session counts routes (the router histogram; see
//!   `Session::set_route_statistics`);
//! - streamed: reads them back, splits the batch into consecutive token
//!   groups whose distinct experts fit the layer's slots (the whole batch
//!   when it fits; a decode token always fits since slots ≥ top_k), and per
//!   group fetches the experts (hits are pinned first, then each miss takes
//!   a victim slot, then all misses are read in parallel — or, with every
//!   expert in host memory, copied from there; a miss whose expert the
//!   device has locked in the page cache is copied from there by the
//!   device, `page_cache.rs`), rewrites the
//!   routes from expert ids to slot indices, and computes the group's rows
//!   over the slot bank: the experts that hit while the misses are being
//!   read ([`Stream::moe_experts`] on the hit slots), the misses once they
//!   have arrived and been filled into their slots, then the rank-order sum
//!   ([`Stream::moe_combine`]). A miss is handed to the device as it is
//!   read: where the stream fills a slot in pieces
//!   ([`Stream::fill_slot_rows`]), each projection's rows as soon as the
//!   reader pool has read them front to back ([`Pending::wait_prefix`]), so
//!   that the copy of an expert's start overlaps the read of its end (on an
//!   H200 this took 25 % slots from 37–41 to 45–47 tok/s, BENCHMARKS.md,
//!   twenty-second session); elsewhere the whole expert once read
//!   ([`Stream::fill_slot`]).
//!
//! Only the expert each route addresses changes place; the weights, rank
//! order and per-row arithmetic are those of the resident path, so the
//! output bits are too.
//!
//! Nothing here allocates after [`SessionExperts::new`]: route and group
//! buffers are sized for the session's largest batch, the slots are
//! refilled in place ([`Stream::fill_slot`]) after a read.

use super::aligned::AlignedBuf;
use super::cache::SlotCache;
use super::io::{IoPool, Pending, ReadJob};
use super::page_cache::{MappedExperts, PinBudget};
use super::stats::{ExpertStats, LayerStats, RouterHistogram};
use super::{slot_bytes, Bytes, ExpertError, ExpertFile, ExpertPlan, ExpertStore, Residency};
use crate::census::CensusState;
use crate::EngineError;
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use turbospark_backend::host::ByteOwner;
use turbospark_backend::DType;
use turbospark_backend::{
    BackendError, Device, ExpertTensors, ExpertWeights, HostPin, HostTensor, MoeInput, MoeScratch,
    Projection, Route, SharedBytes, Stream,
};
use turbospark_core::arch::{Activation, ArchSpec};
use turbospark_format::install::ExpertLayer;

/// One MoE layer's routed-expert step.
pub(crate) struct RoutedInput<'a, D: Device> {
    /// The model's device (it locks page-cache pages for streamed misses).
    pub device: &'a D,
    pub layer: usize,
    /// `[n_tokens, hidden]`
    pub x: &'a D::Buf,
    pub n_tokens: usize,
    /// `[n_tokens, top_k]` on the device; `slot` is the expert id.
    pub routes: &'a D::Routes,
    /// Every expert of the layer, slot = id (resident, mapped); `None`
    /// when streamed.
    pub resident: Option<&'a D::Bank>,
    pub activation: Activation,
    /// The FFN census, when one runs: it counts the intermediate of every
    /// route, over whichever bank computed it.
    pub census: Option<&'a mut CensusState<D>>,
}

/// A read the current group needs.
struct Miss {
    slot: u32,
    expert: u32,
}

/// The slots of one streamed layer.
struct SlotLayer<D: Device> {
    layer: usize,
    file: Arc<File>,
    path: PathBuf,
    stride: u64,
    /// Bytes read per expert: the record, or the whole page-rounded slot
    /// under direct I/O.
    read_len: usize,
    slot_bytes: usize,
    /// `[slots, slot_bytes]`, owner of every slot tensor's bytes (none
    /// with `host`).
    buf: Arc<AlignedBuf>,
    /// The parts of each host slot as host tensors over its bytes, built
    /// once (none with `host`).
    tensors: Vec<ExpertTensors>,
    /// Every expert of the layer in host memory, shared with the model's
    /// other sessions (`--host-experts`): a miss is a copy from there, no
    /// read.
    host: Option<Arc<HostExperts>>,
    /// The layer's file mapped, its experts locked in the page cache for
    /// the device as they miss (none with `host`, direct I/O, or no
    /// budget): a miss of a locked expert is a copy from there, no read.
    mapped: Option<Arc<MappedExperts>>,
    /// Where each projection's rows lie in a record (gate, up, down).
    parts: [PartRows; 3],
    /// The device's copy of the slots, refilled after each read.
    bank: D::Bank,
    cache: SlotCache,
    /// `buf` page-locked by the device, when it copies from it in place
    /// ([`Device::pin_host`]); then a read into a slot first waits for the
    /// copies queued from it ([`Stream::wait_slot_fills`]).
    pin: Option<HostPin>,
}

impl<D: Device> SlotLayer<D> {
    fn new(
        device: &D,
        spec: &ArchSpec,
        f: &ExpertFile,
        plan: &ExpertPlan,
        pin_budget: &Arc<PinBudget>,
    ) -> Result<SlotLayer<D>, EngineError> {
        let layer = f.layer;
        let layout = &f.layout;
        let slots = plan.slots.min(layout.num_experts);
        let host = if plan.host_experts {
            Some(host_experts(device, spec, f, plan)?)
        } else {
            None
        };
        // Host slots of this session's own: none when every expert is held.
        let held = if host.is_some() { 0 } else { slots };
        let sb = slot_bytes(layout) as usize;
        let read_len = read_len(layout, plan);
        let buf = Arc::new(record_buffer(layer, held, sb, read_len)?);
        let owner: ByteOwner = buf.clone();
        let tensors = expert_tensors(spec, layout, &owner, held, sb, "expert_slot")?;
        let mapped = if host.is_none() && plan.pin_page_cache > 0 {
            mapped_experts(spec, f, pin_budget)?
        } else {
            None
        };
        // The device's slots start as copies of the first host slots (zeros,
        // or experts 0.. when every expert is held); the cache holds none.
        let first = match &host {
            Some(h) => &h.tensors[..slots],
            None => &tensors[..],
        };
        let bank = device.upload_bank(first)?;
        let pin = if held > 0 {
            device.pin_host(&owner)?
        } else {
            None
        };
        Ok(SlotLayer {
            layer,
            file: Arc::clone(&f.file),
            path: f.path.clone(),
            stride: layout.stride,
            read_len,
            slot_bytes: sb,
            buf,
            tensors,
            host,
            mapped,
            parts: [
                PartRows::new(layout, Projection::Gate)?,
                PartRows::new(layout, Projection::Up)?,
                PartRows::new(layout, Projection::Down)?,
            ],
            bank,
            cache: SlotCache::new(plan.policy, slots, layout.num_experts),
            pin,
        })
    }

    /// Empties the slots of `misses` after a failed fetch, so a later
    /// request reads them again.
    fn forget(&mut self, misses: &[Miss]) {
        for m in misses {
            self.cache.invalidate(m.slot);
        }
    }

    /// Whether a read may write host bytes a device copy is still reading
    /// (see [`Stream::wait_slot_fills`]): slots read into in place.
    fn reads_into_pinned_slots(&self) -> bool {
        self.pin.is_some()
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
                self.forget(misses);
                return Err(exhausted().into());
            };
            misses.push(Miss { slot, expert: e });
        }
        stats.requests += needed.len() as u64;
        stats.hits += hits;
        Ok(())
    }

    /// Moves each miss the device can copy straight from the page cache
    /// (its expert locked there, now or before: `page_cache.rs`) from
    /// `misses` to `mapped`, leaving the misses to read.
    fn take_mapped(
        &self,
        device: &D,
        misses: &mut Vec<Miss>,
        mapped: &mut Vec<Miss>,
    ) -> Result<(), EngineError> {
        mapped.clear();
        let Some(pc) = &self.mapped else {
            return Ok(());
        };
        let mut i = 0;
        while i < misses.len() {
            if pc.source(device, misses[i].expert as usize)?.is_some() {
                mapped.push(misses.swap_remove(i));
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// Queues the copies of `mapped` (from [`SlotLayer::take_mapped`]) from
    /// the page cache into their slots, counted as reads taking no read
    /// time. On failure their slots are emptied.
    fn fill_mapped(
        &mut self,
        st: &mut D::Stream,
        mapped: &[Miss],
        stats: &mut LayerStats,
    ) -> Result<(), EngineError> {
        let Some(pc) = self.mapped.clone() else {
            return Ok(());
        };
        for m in mapped {
            let filled = match pc.expert(m.expert as usize) {
                Some(t) => st.fill_slot(&mut self.bank, m.slot as usize, t),
                None => Err(BackendError::BadRoute {
                    slot: m.expert as usize,
                    available: pc.experts(),
                }),
            };
            if let Err(e) = filled {
                self.forget(mapped);
                return Err(e.into());
            }
        }
        stats.reads += mapped.len() as u64;
        let bytes = (mapped.len() * self.read_len) as u64;
        stats.page_cache_copies += mapped.len() as u64;
        stats.page_cache_bytes += bytes;
        stats.bytes_read += bytes;
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
        if misses.is_empty() || self.host.is_some() {
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

    /// Waits for the reads of `misses`, filling each device slot as soon as
    /// its expert is read, and counts them (with `host_experts`: fills each
    /// from the expert's host copy, counted as a read of its record taking
    /// no time). On failure the misses' slots are emptied, so a later
    /// request reads them again.
    fn finish_reads(
        &mut self,
        st: &mut D::Stream,
        pending: Option<Pending<'_>>,
        misses: &[Miss],
        stats: &mut LayerStats,
    ) -> Result<(), EngineError> {
        if let Some(host) = &self.host {
            for m in misses {
                let fill = match host.tensors.get(m.expert as usize) {
                    Some(t) => st.fill_slot(&mut self.bank, m.slot as usize, t),
                    None => Err(BackendError::BadRoute {
                        slot: m.expert as usize,
                        available: host.tensors.len(),
                    }),
                };
                if let Err(e) = fill {
                    self.forget(misses);
                    return Err(e.into());
                }
            }
            stats.reads += misses.len() as u64;
            stats.bytes_read += (misses.len() * self.read_len) as u64;
            return Ok(());
        }
        let Some(pending) = pending else {
            return Ok(());
        };
        // Each expert goes to the device as it is read — in pieces, where
        // the device takes them, else whole — so its copy runs while the
        // rest is still being read.
        let in_pieces = st.fills_slot_rows();
        for (i, m) in misses.iter().enumerate() {
            let slot = m.slot as usize;
            let filled = if in_pieces {
                self.fill_as_read(st, &pending, i, slot)
            } else if pending.wait_job(i) {
                st.fill_slot(&mut self.bank, slot, &self.tensors[slot])
                    .map(|()| true)
            } else {
                Ok(false)
            };
            match filled {
                Ok(true) => {}
                Ok(false) => break, // `wait` reports the failure
                Err(e) => {
                    self.forget(misses);
                    return Err(e.into());
                }
            }
        }
        let times = match pending.wait() {
            Ok(t) => t,
            Err((i, source)) => {
                self.forget(misses);
                return Err(self.read_error(misses.get(i).map_or(0, |m| m.expert), source));
            }
        };
        stats.read_nanos += times.busy.as_nanos() as u64;
        stats.wait_nanos += times.waited.as_nanos() as u64;
        stats.reads += misses.len() as u64;
        stats.bytes_read += (misses.len() * self.read_len) as u64;
        Ok(())
    }

    /// Hands expert `i` of `pending`, being read into `slot`, to the device
    /// in pieces ([`Stream::fill_slot_rows`]): each projection's rows as
    /// soon as they have been read (at least [`FILL_STEP`] bytes more a
    /// time), then its biases once the whole record has. `Ok(false)` when a
    /// read of the batch failed (no more is filled).
    fn fill_as_read(
        &mut self,
        st: &mut D::Stream,
        pending: &Pending<'_>,
        i: usize,
        slot: usize,
    ) -> Result<bool, BackendError> {
        let expert = &self.tensors[slot];
        let mut filled = [0usize; 3];
        let mut read = 0;
        while read < self.read_len {
            let Some(now) = pending.wait_prefix(i, read + FILL_STEP) else {
                return Ok(false);
            };
            // (`now` ≥ read + FILL_STEP, or the whole record)
            read = now.max(read + 1);
            for (k, part) in Projection::ALL.into_iter().enumerate() {
                let p = &self.parts[k];
                let ready = if read >= self.read_len {
                    p.rows // the whole record (the layout was checked in `new`)
                } else {
                    (read.saturating_sub(p.offset) / p.row_bytes).min(p.rows)
                };
                if ready > filled[k] {
                    st.fill_slot_rows(&mut self.bank, slot, expert, part, filled[k]..ready)?;
                    filled[k] = ready;
                }
            }
        }
        st.fill_slot_biases(&mut self.bank, slot, expert)?;
        Ok(true)
    }
}

/// Bytes of an expert read between two partial fills of its slot (see
/// [`SlotLayer::fill_as_read`]): a few of the reader pool's pieces, so a
/// fill's fixed costs (a copy and a layout launch) stay small beside the
/// megabyte it moves.
const FILL_STEP: usize = 1 << 20;

/// The part `name` of `layout`'s expert records.
fn record_part<'a>(
    layout: &'a ExpertLayer,
    name: &str,
) -> Result<&'a turbospark_format::install::ExpertPart, EngineError> {
    layout.part(name).ok_or_else(|| EngineError::MissingTensor {
        name: format!("blk.{}.experts.{name}", layout.layer),
    })
}

/// Where one projection's rows lie in an expert record.
#[derive(Debug, Clone, Copy)]
struct PartRows {
    offset: usize,
    rows: usize,
    row_bytes: usize,
}

impl PartRows {
    /// The rows of `part` in `layout`'s records.
    fn new(layout: &ExpertLayer, part: Projection) -> Result<PartRows, EngineError> {
        let name = match part {
            Projection::Gate => "gate",
            Projection::Up => "up",
            Projection::Down => "down",
        };
        let p = record_part(layout, name)?;
        let rows = p.shape.first().map_or(0, |&r| r as usize);
        Ok(PartRows {
            offset: p.offset as usize,
            rows,
            row_bytes: (p.length as usize / rows.max(1)).max(1),
        })
    }
}

/// The shared read-only mapping of `f`'s experts (made by the first
/// caller); `None` when its records are not page-aligned.
fn mapped_experts(
    spec: &ArchSpec,
    f: &ExpertFile,
    budget: &Arc<PinBudget>,
) -> Result<Option<Arc<MappedExperts>>, EngineError> {
    let mut shared = f.mapped.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(m) = shared.as_ref() {
        return Ok(Some(Arc::clone(m)));
    }
    let layout = &f.layout;
    let (n, stride) = (layout.num_experts, layout.stride as usize);
    let tensors = |owner: &ByteOwner| expert_tensors(spec, layout, owner, n, stride, "expert");
    let Some(m) = MappedExperts::open(f, budget, tensors)? else {
        return Ok(None);
    };
    let m = Arc::new(m);
    *shared = Some(Arc::clone(&m));
    Ok(Some(m))
}

/// Every expert of one layer in host memory, shared by a model's sessions
/// (`--host-experts`, [`ExpertFile::host`]): read once, by the first
/// session that needs it, page-locked by its device where it can be, and
/// never written again, so copies from it need no wait.
pub(crate) struct HostExperts {
    /// Expert `e`'s parts, over the shared bytes.
    tensors: Vec<ExpertTensors>,
    /// Unlocks the bytes when the last holder drops them.
    _pin: Option<HostPin>,
}

/// The shared host copy of `f`'s experts, read now by the first caller.
fn host_experts<D: Device>(
    device: &D,
    spec: &ArchSpec,
    f: &ExpertFile,
    plan: &ExpertPlan,
) -> Result<Arc<HostExperts>, EngineError> {
    // Held while the first caller reads, so a second waits for its copy.
    let mut shared = f.host.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(h) = shared.as_ref() {
        return Ok(Arc::clone(h));
    }
    let layout = &f.layout;
    let (n, sb) = (layout.num_experts, slot_bytes(layout) as usize);
    let len = read_len(layout, plan);
    let mut buf = record_buffer(f.layer, n, sb, len)?;
    read_every_expert(&mut buf, f, sb, len, plan.io_threads)?;
    let owner: ByteOwner = Arc::new(buf);
    let h = Arc::new(HostExperts {
        tensors: expert_tensors(spec, layout, &owner, n, sb, "expert")?,
        _pin: device.pin_host(&owner)?,
    });
    *shared = Some(Arc::clone(&h));
    Ok(h)
}

/// Bytes one read of an expert of `layout` takes: its record, or the whole
/// page-rounded slot under direct I/O.
fn read_len(layout: &ExpertLayer, plan: &ExpertPlan) -> usize {
    if plan.direct_io {
        slot_bytes(layout) as usize
    } else {
        layout.record_len() as usize
    }
}

/// Zeroed, page-aligned room for `count` records `sb` bytes apart, each
/// read `read_len` bytes long: every read's range lies inside it, which
/// reads rely on.
fn record_buffer(
    layer: usize,
    count: usize,
    sb: usize,
    read_len: usize,
) -> Result<AlignedBuf, ExpertError> {
    let buf = count
        .checked_mul(sb)
        .and_then(AlignedBuf::zeroed)
        .ok_or(ExpertError::Alloc {
            layer,
            bytes: Bytes((count as u64).saturating_mul(sb as u64)),
        })?;
    if read_len > sb || (count > 0 && buf.region((count - 1) * sb, sb).is_none()) {
        return Err(ExpertError::Alloc {
            layer,
            bytes: Bytes(buf.len() as u64),
        });
    }
    Ok(buf)
}

/// Host tensors over `count` records of `layout` in `owner`, record `s` at
/// `s · spacing`, named `blk.{layer}.{what}.{s}.{part}`.
fn expert_tensors(
    spec: &ArchSpec,
    layout: &ExpertLayer,
    owner: &ByteOwner,
    count: usize,
    spacing: usize,
    what: &str,
) -> Result<Vec<ExpertTensors>, EngineError> {
    let (layer, sb) = (layout.layer, spacing);
    let biases = spec.moe.as_ref().is_some_and(|m| m.expert_biases);
    let mut tensors = Vec::with_capacity(count);
    for s in 0..count {
        let part = |name: &str| -> Result<HostTensor, EngineError> {
            let p = record_part(layout, name)?;
            let start = s * sb + p.offset as usize;
            Ok(HostTensor {
                name: format!("blk.{layer}.{what}.{s}.{name}"),
                format: p.dtype,
                shape: p.shape.iter().map(|&d| d as usize).collect(),
                bytes: SharedBytes::new(owner.clone(), start..start + p.length as usize)?,
            })
        };
        let bias = |name: &str| biases.then(|| part(name)).transpose();
        tensors.push(ExpertWeights {
            gate: part("gate")?,
            up: part("up")?,
            down: part("down")?,
            gate_bias: bias("gate.bias")?,
            up_bias: bias("up.bias")?,
            down_bias: bias("down.bias")?,
        });
    }
    Ok(tensors)
}

/// Reads `len` bytes of every expert of `f` into `buf` (expert `e` at
/// `e · sb`, from `e · stride` of the file), `threads` experts at a time
/// (at least one).
fn read_every_expert(
    buf: &mut AlignedBuf,
    f: &ExpertFile,
    sb: usize,
    len: usize,
    threads: usize,
) -> Result<(), EngineError> {
    use std::os::unix::fs::FileExt;
    let n = f.layout.num_experts;
    let stride = f.layout.stride;
    if n == 0 {
        return Ok(());
    }
    let bytes = buf.as_mut_slice();
    let threads = threads.clamp(1, n);
    let per = n.div_ceil(threads);
    let failed = std::thread::scope(|scope| {
        let workers: Vec<_> = bytes[..n * sb]
            .chunks_mut(per * sb)
            .enumerate()
            .map(|(w, part)| {
                scope.spawn(move || {
                    for (i, slot) in part.chunks_mut(sb).enumerate() {
                        let e = w * per + i;
                        let at = e as u64 * stride;
                        if let Err(source) = f.file.read_exact_at(&mut slot[..len], at) {
                            return Some((e, source));
                        }
                    }
                    None
                })
            })
            .collect();
        workers
            .into_iter()
            .find_map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
    });
    match failed {
        None => Ok(()),
        Some((e, source)) => Err(ExpertError::Read {
            layer: f.layer,
            expert: e,
            path: f.path.clone(),
            offset: e as u64 * stride,
            len,
            source,
        }
        .into()),
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
struct Streamed<D: Device> {
    /// By layer index; `None` for dense layers.
    layers: Vec<Option<SlotLayer<D>>>,
    pool: IoPool,
    /// A group's misses to read, and those copied from the page cache.
    misses: Vec<Miss>,
    mapped: Vec<Miss>,
    /// Which slots a partial expert computation covers `[max_slots]`.
    ready: Vec<bool>,
    /// Routes rewritten to slot indices `[max_batch, top_k]`, on the host
    /// and on the device.
    remap: Vec<Route>,
    remap_device: D::Routes,
    /// A group's input rows and output rows `[max_batch, hidden]`.
    group_x: D::Buf,
    group_out: D::Buf,
}

/// The expert side of a session.
pub(crate) struct SessionExperts<D: Device> {
    hidden: usize,
    pub stats: ExpertStats,
    pub histogram: RouterHistogram,
    /// Count routes (histogram, resident hits): reads them back.
    pub observe: bool,
    /// A batch's routes read back to the host `[max_batch, top_k]`.
    host_routes: Vec<Route>,
    grouper: Grouper,
    streamed: Option<Streamed<D>>,
}

impl<D: Device> SessionExperts<D> {
    /// The routed-expert state of a session over a model of `spec` on
    /// `device` whose experts live in `store`.
    pub(crate) fn new(
        spec: &ArchSpec,
        device: &D,
        store: &ExpertStore,
        max_batch: usize,
    ) -> Result<Self, EngineError> {
        let (num_experts, top_k) = spec
            .moe
            .as_ref()
            .map_or((0, 0), |m| (m.num_experts, m.top_k));
        let moe_layers: Vec<usize> = spec.moe_layers().collect();
        let streamed = if store.residency() == Residency::Streamed && !moe_layers.is_empty() {
            let plan = store.plan();
            let mut layers: Vec<Option<SlotLayer<D>>> =
                (0..spec.num_layers()).map(|_| None).collect();
            for f in &store.files {
                if let Some(slot) = layers.get_mut(f.layer) {
                    *slot = Some(SlotLayer::new(device, spec, f, plan, &store.pin_budget)?);
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
            let max_read = layers
                .iter()
                .flatten()
                .map(|l| l.read_len)
                .max()
                .unwrap_or(0);
            Some(Streamed {
                layers,
                pool: IoPool::new(plan.io_threads, max_slots, max_read)
                    .map_err(ExpertError::Threads)?,
                misses: Vec::with_capacity(max_slots),
                mapped: Vec::with_capacity(max_slots),
                ready: vec![false; max_slots],
                remap: vec![Route::default(); max_batch * top_k],
                remap_device: device.alloc_routes(max_batch, top_k)?,
                group_x: device.alloc(DType::F32, max_batch * spec.hidden_size)?,
                group_out: device.alloc(DType::F32, max_batch * spec.hidden_size)?,
            })
        } else {
            None
        };
        Ok(SessionExperts {
            hidden: spec.hidden_size,
            stats: ExpertStats::new(moe_layers.iter().copied()),
            histogram: RouterHistogram::new(moe_layers.iter().copied(), num_experts, top_k),
            observe: true,
            host_routes: vec![Route::default(); max_batch * top_k],
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
    /// Whether every MoE step stays on the device (resident experts, no
    /// route counting), so that a decode step can be recorded and replayed.
    pub(crate) fn device_only(&self) -> bool {
        self.streamed.is_none() && !self.observe
    }

    pub(crate) fn run(
        &mut self,
        st: &mut D::Stream,
        input: RoutedInput<'_, D>,
        scratch: &mut MoeScratch<D::Buf>,
        out: &mut D::Buf,
    ) -> Result<(), EngineError> {
        let RoutedInput {
            device,
            layer,
            x,
            n_tokens: n,
            routes,
            resident,
            activation,
            mut census,
        } = input;
        if self.streamed.is_none() && !self.observe {
            // The routes stay on the device.
            let bank = resident.ok_or(EngineError::NotImplemented {
                feature: "resident experts without a bank",
            })?;
            let input = MoeInput {
                x,
                n_tokens: n,
                routes,
                bank,
                activation,
            };
            st.moe(input, scratch, out)?;
            if let Some(c) = census {
                c.experts(st, layer, input, scratch, None)?;
            }
            return Ok(());
        }
        let k = self.grouper.top_k;
        let have = self.host_routes.len();
        let host = self
            .host_routes
            .get_mut(..n * k)
            .ok_or(BackendError::BufferTooSmall {
                op: "moe",
                what: "routes",
                need: n * k,
                have,
            })?;
        st.read_routes(routes, host)?;
        let host = &*host;
        if self.observe {
            self.histogram.record(layer, host.iter().map(|r| r.slot));
        }
        let stats = self
            .stats
            .layer_mut(layer)
            .ok_or(EngineError::NotImplemented {
                feature: "routed experts on a layer the spec does not mark MoE",
            })?;
        let Some(sd) = self.streamed.as_mut() else {
            // Every expert is in memory: one call, every request a hit.
            let bank = resident.ok_or(EngineError::NotImplemented {
                feature: "resident experts without a bank",
            })?;
            self.grouper.next(host, 0, n, usize::MAX)?;
            let requested = self.grouper.needed.len() as u64;
            stats.requests += requested;
            stats.hits += requested;
            let input = MoeInput {
                x,
                n_tokens: n,
                routes,
                bank,
                activation,
            };
            st.moe(input, scratch, out)?;
            if let Some(c) = census {
                c.experts(st, layer, input, scratch, Some(host))?;
            }
            return Ok(());
        };
        let sl = sd
            .layers
            .get_mut(layer)
            .and_then(Option::as_mut)
            .ok_or(ExpertError::NoExpertFiles)?;
        let slots = sl.cache.slots();
        let h = self.hidden;
        let mut t0 = 0;
        while t0 < n {
            let t1 = self.grouper.next(host, t0, n, slots)?;
            sl.plan(&self.grouper.needed, &mut sd.misses, stats)?;
            if let Err(e) = sl.take_mapped(device, &mut sd.misses, &mut sd.mapped) {
                // No slot keeps an expert it never received.
                sl.forget(&sd.misses);
                sl.forget(&sd.mapped);
                return Err(e);
            }
            let group = t0 * k..t1 * k;
            let remap = &mut sd.remap[..group.len()];
            for (dst, r) in remap.iter_mut().zip(&host[group]) {
                let slot = sl
                    .cache
                    .slot_of(r.slot)
                    .ok_or(ExpertError::SlotsExhausted { layer, slots })?;
                *dst = Route {
                    slot,
                    weight: r.weight,
                };
            }
            st.write_routes(&mut sd.remap_device, remap)?;
            let m = t1 - t0;
            let whole = m == n;
            if !whole {
                st.copy(x, t0 * h, &mut sd.group_x, 0, m * h)?;
            }
            let gx = if whole { x } else { &sd.group_x };
            // The hits are computed while the misses are read.
            let ready = &mut sd.ready[..slots];
            ready.fill(true);
            for miss in sd.misses.iter().chain(&sd.mapped) {
                ready[miss.slot as usize] = false;
            }
            let started = if sl.reads_into_pinned_slots() && !sd.misses.is_empty() {
                // The misses' slots may still be copied from (an earlier group).
                st.wait_slot_fills().map_err(EngineError::from)
            } else {
                Ok(())
            }
            .and_then(|()| sl.start_reads(&sd.pool, &sd.misses));
            let pending = match started {
                Ok(p) => p,
                Err(e) => {
                    sl.forget(&sd.misses);
                    sl.forget(&sd.mapped);
                    return Err(e);
                }
            };
            let fetched = sd.misses.len() + sd.mapped.len();
            let hits = if fetched < self.grouper.needed.len() {
                let input = MoeInput {
                    x: gx,
                    n_tokens: m,
                    routes: &sd.remap_device,
                    bank: &sl.bank,
                    activation,
                };
                st.moe_experts(input, scratch, Some(ready))
            } else {
                Ok(())
            };
            // The device copies from the page cache while the rest is read.
            let copied = sl.fill_mapped(st, &sd.mapped, stats);
            sl.finish_reads(st, pending, &sd.misses, stats)?;
            hits?;
            copied?;
            if fetched > 0 {
                ready.fill(false);
                for miss in sd.misses.iter().chain(&sd.mapped) {
                    ready[miss.slot as usize] = true;
                }
                let input = MoeInput {
                    x: gx,
                    n_tokens: m,
                    routes: &sd.remap_device,
                    bank: &sl.bank,
                    activation,
                };
                st.moe_experts(input, scratch, Some(ready))?;
            }
            if whole {
                st.moe_combine(n, h, &sd.remap_device, scratch, out)?;
            } else {
                st.moe_combine(m, h, &sd.remap_device, scratch, &mut sd.group_out)?;
                st.copy(&sd.group_out, 0, out, t0 * h, m * h)?;
            }
            // The group's experts are all in their slots until the next
            // group evicts some: the census reads them now, counting each
            // row under its expert id, not its slot.
            if let Some(c) = census.as_deref_mut() {
                let input = MoeInput {
                    x: gx,
                    n_tokens: m,
                    routes: &sd.remap_device,
                    bank: &sl.bank,
                    activation,
                };
                c.experts(st, layer, input, scratch, Some(&host[t0 * k..t1 * k]))?;
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
        send::<SessionExperts<turbospark_cpu::CpuDevice>>();
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
