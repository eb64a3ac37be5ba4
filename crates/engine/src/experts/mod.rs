//! The expert store: where a model's routed experts live and how a session
//! gets at them.
//!
//! Modes ([`Residency`]):
//!
//! - **resident**: every expert file is read into memory at open.
//! - **mapped**: every expert file is memory-mapped at open; the OS pages
//!   experts in on first use and may drop them under memory pressure.
//! - **streamed**: nothing is loaded at open. Each session owns, per MoE
//!   layer, a fixed pool of `slots` expert slots (page-aligned buffers,
//!   allocated once) and fills them on demand with one positioned read per
//!   expert (expert `e` of a layer is bytes `[e · stride, e · stride +
//!   record_len)` of its file), the misses of a layer read in parallel on a
//!   persistent I/O pool, optionally with `O_DIRECT`. Which slot a missing
//!   expert replaces is the cache policy's choice ([`CachePolicy`], see
//!   `cache.rs`); a slot in use by the current computation is never evicted.
//!   With [`ExpertOptions::host_experts`] every expert of a layer is read
//!   into host memory when the model's first session opens (one copy,
//!   shared by its sessions, page-locked where the device copies from it in
//!   place), and a miss is only the copy of that expert into its slot: for
//!   a device whose memory holds some of the experts on a machine whose
//!   memory holds them all.
//!   Without it, on a device that copies from locked host memory (a GPU),
//!   an expert whose pages are all in the page cache is locked there on its
//!   first miss, within [`ExpertPlan::pin_page_cache`] bytes, and later
//!   misses of it are one copy from the page cache by the device (see
//!   `page_cache.rs`).
//!
//! [`ExpertOptions::default`] picks resident when the resident weights plus
//! every expert fit the memory budget, and streamed otherwise, with as many
//! slots as the budget leaves room for; [`ExpertPlan`] records the choice and
//! the reason.
//!
//! Determinism: the mode, the slot count and the policy change where an
//! expert's bytes are, never the arithmetic. Routes name slots instead of
//! experts, every token's experts are still summed in router-rank order, and
//! each row of a batched expert op is computed the same way whatever the
//! batch. When a prefill chunk routes to more distinct experts of a layer
//! than there are slots, its tokens are processed in consecutive groups whose
//! experts fit (each needed expert read once per group), which changes only
//! which rows share a call. So logits are bit-identical across modes, slot
//! counts and policies; the tests check it on every MoE fixture.
//!
//! Statistics (requests, hits, bytes and time read, per layer) and the
//! router's per-expert selection counts are always kept ([`ExpertStats`],
//! [`RouterHistogram`]).

mod aligned;
mod cache;
mod io;
mod page_cache;
pub(crate) mod routed;
pub mod stats;

pub use stats::{ExpertStats, LayerStats, RouterHistogram};

pub use crate::expert_error::{Bytes, ExpertError};
use std::fmt;
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use turbospark_core::ArchSpec;
use turbospark_format::install::{align_up, ExpertLayer, Install, EXPERT_ALIGN};

/// Where experts live, as asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExpertMode {
    /// Resident when the model fits the memory budget, streamed otherwise.
    #[default]
    Auto,
    Resident,
    Mapped,
    Streamed,
}

/// Where experts live, as decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residency {
    Resident,
    Mapped,
    Streamed,
}

impl fmt::Display for Residency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Residency::Resident => "resident",
            Residency::Mapped => "mapped",
            Residency::Streamed => "streamed",
        })
    }
}

/// Expert slots per MoE layer of a streamed store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SlotCount {
    /// As many as the memory budget leaves room for (at most every expert).
    #[default]
    Auto,
    Fixed(usize),
}

/// Which cached expert a miss replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CachePolicy {
    /// Least frequently requested over the session; ties to the least
    /// recently used.
    #[default]
    Lfu,
    /// Least recently used.
    Lru,
}

impl fmt::Display for CachePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CachePolicy::Lfu => "lfu",
            CachePolicy::Lru => "lru",
        })
    }
}

/// How to open a model's experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertOptions {
    pub mode: ExpertMode,
    pub slots: SlotCount,
    pub policy: CachePolicy,
    /// Bytes the weights may take: resident tensors plus, when streamed,
    /// one session's expert slots. `None`: the memory available now.
    pub memory_budget: Option<u64>,
    /// Read experts with `O_DIRECT` (bypassing the page cache).
    pub direct_io: bool,
    /// Reader threads per session besides the decoding thread.
    pub io_threads: usize,
    /// Streamed: every expert held in host memory (read once, when the
    /// model's first session opens, and shared by its sessions), so that a
    /// miss copies it into its slot without a read.
    pub host_experts: bool,
    /// Streamed, not `host_experts` nor `direct_io`: bytes of the expert
    /// files' page cache the device may lock to copy misses straight from
    /// it (see `page_cache.rs`). `None`: half the host memory available
    /// when the model opens; 0 turns it off.
    pub pin_page_cache: Option<u64>,
}

impl Default for ExpertOptions {
    fn default() -> Self {
        ExpertOptions {
            mode: ExpertMode::Auto,
            slots: SlotCount::Auto,
            policy: CachePolicy::Lfu,
            memory_budget: None,
            direct_io: false,
            io_threads: 4,
            host_experts: false,
            pin_page_cache: None,
        }
    }
}

impl ExpertOptions {
    /// Every expert memory-mapped.
    pub fn mapped() -> Self {
        ExpertOptions {
            mode: ExpertMode::Mapped,
            ..Self::default()
        }
    }

    /// `slots` streamed slots per layer.
    pub fn streamed(slots: usize) -> Self {
        ExpertOptions {
            mode: ExpertMode::Streamed,
            slots: SlotCount::Fixed(slots),
            ..Self::default()
        }
    }
}

/// The sizes the store's decision depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint {
    /// Every non-expert tensor.
    pub resident_bytes: u64,
    /// Every expert file.
    pub expert_bytes: u64,
    /// One slot of every MoE layer (a slot holds one expert record, page
    /// aligned).
    pub slot_bytes: u64,
    pub moe_layers: usize,
    pub num_experts: usize,
    pub top_k: usize,
}

/// Bytes of one slot of `layer` (its record rounded up to a page).
pub(crate) fn slot_bytes(layer: &ExpertLayer) -> u64 {
    align_up(layer.record_len().max(1), EXPERT_ALIGN)
}

impl Footprint {
    pub fn of_install(install: &Install) -> Footprint {
        let m = &install.manifest;
        Footprint {
            resident_bytes: m.resident_bytes,
            expert_bytes: m.expert_bytes(),
            slot_bytes: m.experts.iter().map(slot_bytes).sum(),
            moe_layers: m.experts.len(),
            num_experts: m.arch.moe.as_ref().map_or(0, |x| x.num_experts),
            top_k: m.arch.moe.as_ref().map_or(0, |x| x.top_k),
        }
    }

    /// Resident weights plus every expert.
    pub fn total(&self) -> u64 {
        self.resident_bytes + self.expert_bytes
    }

    /// Resident weights plus `slots` slots per MoE layer.
    pub fn with_slots(&self, slots: usize) -> u64 {
        self.resident_bytes + self.slot_bytes * slots as u64
    }
}

/// The store's decision: mode, slots, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpertPlan {
    pub residency: Residency,
    /// Slots per MoE layer (streamed), else every expert.
    pub slots: usize,
    pub policy: CachePolicy,
    pub direct_io: bool,
    pub io_threads: usize,
    /// Streamed: every expert held in host memory (see
    /// [`ExpertOptions::host_experts`]).
    pub host_experts: bool,
    /// Streamed: bytes of page cache the device may lock for its copies
    /// ([`ExpertOptions::pin_page_cache`], at most the experts' bytes; 0
    /// when off).
    pub pin_page_cache: u64,
    pub reason: String,
}

impl fmt::Display for ExpertPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.residency {
            Residency::Streamed => write!(
                f,
                "experts streamed: {} slots per layer, {} cache, {}: {}",
                self.slots,
                self.policy,
                if self.host_experts {
                    "every expert in host memory".to_string()
                } else {
                    format!(
                        "{} reader threads{}{}",
                        self.io_threads,
                        if self.direct_io { ", direct I/O" } else { "" },
                        if self.pin_page_cache > 0 {
                            format!(
                                ", up to {} of page cache locked for the device",
                                Bytes(self.pin_page_cache)
                            )
                        } else {
                            String::new()
                        }
                    )
                },
                self.reason
            ),
            r => write!(f, "experts {r}: {}", self.reason),
        }
    }
}

/// The memory the system could give now (`MemAvailable`), if known.
pub fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Decides the mode and slot count for a model of `fp` under `opts`;
/// `available` is the memory budget used when `opts` sets none.
pub fn plan(
    fp: &Footprint,
    opts: &ExpertOptions,
    available: Option<u64>,
) -> Result<ExpertPlan, ExpertError> {
    let mut plan = ExpertPlan {
        residency: Residency::Resident,
        slots: fp.num_experts,
        policy: opts.policy,
        direct_io: opts.direct_io,
        io_threads: opts.io_threads,
        host_experts: false,
        pin_page_cache: 0,
        reason: String::new(),
    };
    if fp.moe_layers == 0 {
        plan.reason = "the model has no routed experts".into();
        return Ok(plan);
    }
    let budget = match (opts.memory_budget, available) {
        (Some(b), _) => Some((b, "the memory budget")),
        (None, Some(a)) => Some((a, "the available memory")),
        (None, None) => None,
    };
    let total = Bytes(fp.total());
    let (residency, reason) = match (opts.mode, opts.slots) {
        (ExpertMode::Resident, _) => (Residency::Resident, "requested".to_string()),
        (ExpertMode::Mapped, _) => (Residency::Mapped, "requested".to_string()),
        (ExpertMode::Streamed, _) => (Residency::Streamed, "requested".to_string()),
        (ExpertMode::Auto, SlotCount::Fixed(_)) => {
            (Residency::Streamed, "a slot count was given".to_string())
        }
        (ExpertMode::Auto, SlotCount::Auto) => match budget {
            Some((b, what)) if fp.total() > b => (
                Residency::Streamed,
                format!("the model ({total}) exceeds {what} ({})", Bytes(b)),
            ),
            Some((b, what)) => (
                Residency::Resident,
                format!("the model ({total}) fits {what} ({})", Bytes(b)),
            ),
            None => (Residency::Resident, "no memory budget is known".to_string()),
        },
    };
    plan.residency = residency;
    plan.reason = reason;
    if residency != Residency::Streamed {
        return Ok(plan);
    }
    let slots = match (opts.slots, budget) {
        (SlotCount::Fixed(n), _) => {
            if n < fp.top_k {
                return Err(ExpertError::TooFewSlots {
                    slots: n,
                    top_k: fp.top_k,
                });
            }
            n
        }
        (SlotCount::Auto, Some((b, _))) => {
            let room = b.saturating_sub(fp.resident_bytes);
            let n = (room / fp.slot_bytes.max(1)).min(fp.num_experts as u64) as usize;
            if n < fp.top_k {
                return Err(ExpertError::BudgetTooSmall {
                    budget: Bytes(b),
                    need: Bytes(fp.with_slots(fp.top_k)),
                    resident: Bytes(fp.resident_bytes),
                    top_k: fp.top_k,
                });
            }
            n
        }
        (SlotCount::Auto, None) => fp.num_experts,
    };
    if slots > fp.num_experts {
        plan.reason += &format!(
            "; {slots} slots asked, the layers have {} experts",
            fp.num_experts
        );
    }
    plan.slots = slots.min(fp.num_experts);
    plan.reason += &format!(
        "; weights take {} ({} resident + {} slots × {} MoE layers)",
        Bytes(fp.with_slots(plan.slots)),
        Bytes(fp.resident_bytes),
        plan.slots,
        fp.moe_layers
    );
    plan.host_experts = opts.host_experts;
    if !plan.host_experts && !plan.direct_io {
        plan.pin_page_cache = opts.pin_page_cache.unwrap_or(0).min(fp.expert_bytes);
    }
    if plan.host_experts {
        plan.reason += &format!(
            "; every expert also in host memory ({})",
            Bytes(fp.expert_bytes)
        );
    }
    Ok(plan)
}

/// One MoE layer's expert file, open for streaming.
pub(crate) struct ExpertFile {
    pub layer: usize,
    pub layout: ExpertLayer,
    pub path: PathBuf,
    pub file: Arc<File>,
    /// Every expert of the layer in host memory, once a session has read
    /// them (`--host-experts`); shared by the model's sessions.
    pub host: std::sync::Mutex<Option<Arc<routed::HostExperts>>>,
    /// The file mapped read-only, its experts locked for the device as they
    /// miss (see `page_cache.rs`); shared by the model's sessions.
    pub mapped: std::sync::Mutex<Option<Arc<page_cache::MappedExperts>>>,
}

/// A model's experts: the plan, and the open files of a streamed store.
pub struct ExpertStore {
    plan: ExpertPlan,
    /// One per MoE layer when streamed, else empty.
    pub(crate) files: Vec<ExpertFile>,
    /// What is left of [`ExpertPlan::pin_page_cache`].
    pub(crate) pin_budget: Arc<page_cache::PinBudget>,
}

/// Checks that `file` (at `path`) holds every expert of `layout`.
pub(crate) fn check_length(
    path: &std::path::Path,
    found: u64,
    layout: &ExpertLayer,
) -> Result<(), ExpertError> {
    if found < layout.file_len() {
        return Err(ExpertError::FileShort {
            path: path.to_path_buf(),
            found,
            expected: layout.file_len(),
            experts: layout.num_experts,
            stride: layout.stride,
        });
    }
    Ok(())
}

impl ExpertStore {
    /// Experts held by a weight source other than an install (resident).
    pub(crate) fn held(spec: &ArchSpec) -> ExpertStore {
        let num_experts = spec.moe.as_ref().map_or(0, |m| m.num_experts);
        ExpertStore {
            plan: ExpertPlan {
                residency: Residency::Resident,
                slots: num_experts,
                policy: CachePolicy::default(),
                direct_io: false,
                io_threads: 0,
                host_experts: false,
                pin_page_cache: 0,
                reason: "held by the weight source".into(),
            },
            files: Vec::new(),
            pin_budget: Arc::new(page_cache::PinBudget::new(0)),
        }
    }

    /// Decides how to hold `install`'s experts on a device with `available`
    /// bytes free (the budget when `opts` sets none) and, when streamed,
    /// opens and checks their files.
    pub fn open(
        install: &Install,
        opts: &ExpertOptions,
        available: Option<u64>,
    ) -> Result<ExpertStore, ExpertError> {
        // The page cache's default share: half the host memory available.
        let opts = &ExpertOptions {
            pin_page_cache: Some(
                opts.pin_page_cache
                    .unwrap_or_else(|| available_memory().map_or(0, |a| a / 2)),
            ),
            ..*opts
        };
        let plan = plan(&Footprint::of_install(install), opts, available)?;
        let mut files = Vec::new();
        if plan.residency == Residency::Streamed {
            for layout in &install.manifest.experts {
                let path = install.expert_path(layout);
                files.push(ExpertFile {
                    layer: layout.layer,
                    file: Arc::new(open_expert_file(&path, layout, plan.direct_io)?),
                    layout: layout.clone(),
                    path,
                    host: std::sync::Mutex::new(None),
                    mapped: std::sync::Mutex::new(None),
                });
            }
        }
        let pin_budget = Arc::new(page_cache::PinBudget::new(plan.pin_page_cache));
        Ok(ExpertStore {
            plan,
            files,
            pin_budget,
        })
    }

    pub fn plan(&self) -> &ExpertPlan {
        &self.plan
    }

    pub fn residency(&self) -> Residency {
        self.plan.residency
    }
}

fn open_expert_file(
    path: &std::path::Path,
    layout: &ExpertLayer,
    direct: bool,
) -> Result<File, ExpertError> {
    use std::os::unix::fs::OpenOptionsExt;
    let open_err = |source| ExpertError::Open {
        path: path.to_path_buf(),
        direct,
        source,
    };
    let mut oo = std::fs::OpenOptions::new();
    oo.read(true);
    if direct {
        if layout.stride % EXPERT_ALIGN != 0 {
            return Err(ExpertError::Unaligned {
                path: path.to_path_buf(),
                stride: layout.stride,
                align: EXPERT_ALIGN,
            });
        }
        oo.custom_flags(libc::O_DIRECT);
    }
    let file = oo.open(path).map_err(open_err)?;
    let len = file.metadata().map_err(open_err)?.len();
    check_length(path, len, layout)?;
    Ok(file)
}

/// A temporary file `ts-{tag}-{pid}` holding `data`, opened for reading,
/// for the store's unit tests; the caller removes it.
#[cfg(test)]
pub(crate) fn file_holding(tag: &str, data: &[u8]) -> (PathBuf, Arc<File>) {
    use std::io::Write;
    let path = std::env::temp_dir().join(format!("ts-{tag}-{}", std::process::id()));
    File::create(&path).unwrap().write_all(data).unwrap();
    let file = Arc::new(File::open(&path).unwrap());
    (path, file)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn fp() -> Footprint {
        Footprint {
            resident_bytes: 2 * GIB,
            expert_bytes: 60 * GIB,
            slot_bytes: 24 * (24 << 20), // 24 layers × 24 MiB
            moe_layers: 24,
            num_experts: 128,
            top_k: 4,
        }
    }

    #[test]
    fn auto_is_resident_when_the_model_fits() {
        let p = plan(&fp(), &ExpertOptions::default(), Some(100 * GIB)).unwrap();
        assert_eq!(p.residency, Residency::Resident);
        assert!(p.reason.contains("fits"), "{}", p.reason);
    }

    #[test]
    fn auto_streams_with_the_slots_the_budget_allows() {
        let opts = ExpertOptions {
            memory_budget: Some(11 * GIB),
            ..ExpertOptions::default()
        };
        let p = plan(&fp(), &opts, Some(100 * GIB)).unwrap();
        assert_eq!(p.residency, Residency::Streamed);
        // (11 − 2) GiB / 576 MiB = 16 slots.
        assert_eq!(p.slots, 16);
        assert!(
            p.reason.contains("exceeds the memory budget"),
            "{}",
            p.reason
        );
        assert!(fp().with_slots(p.slots) <= 11 * GIB);
    }

    #[test]
    fn too_few_slots_is_an_error() {
        let e = plan(&fp(), &ExpertOptions::streamed(3), None).unwrap_err();
        assert!(matches!(e, ExpertError::TooFewSlots { slots: 3, top_k: 4 }));
        let opts = ExpertOptions {
            memory_budget: Some(3 * GIB),
            ..ExpertOptions::default()
        };
        let e = plan(&fp(), &opts, None).unwrap_err();
        assert!(matches!(e, ExpertError::BudgetTooSmall { .. }), "{e}");
        assert!(e.to_string().contains("4 expert slots"), "{e}");
    }

    #[test]
    fn explicit_modes_and_clamping() {
        let p = plan(&fp(), &ExpertOptions::streamed(1000), None).unwrap();
        assert_eq!(p.slots, 128);
        let p = plan(&fp(), &ExpertOptions::mapped(), Some(GIB)).unwrap();
        assert_eq!(p.residency, Residency::Mapped);
        let p = plan(
            &fp(),
            &ExpertOptions {
                slots: SlotCount::Fixed(8),
                ..ExpertOptions::default()
            },
            Some(100 * GIB),
        )
        .unwrap();
        assert_eq!((p.residency, p.slots), (Residency::Streamed, 8));
        let dense = Footprint {
            moe_layers: 0,
            ..fp()
        };
        let p = plan(&dense, &ExpertOptions::streamed(1), None).unwrap();
        assert_eq!(p.residency, Residency::Resident);
    }
}
