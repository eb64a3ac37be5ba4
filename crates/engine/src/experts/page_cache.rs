//! Streamed misses copied by the device straight out of the page cache.
//!
//! A read of a missing expert moves its bytes twice through host memory: a
//! reader thread copies them out of the page cache into a slot (`pread`),
//! then the device's DMA engine copies the slot to the device. On an H200
//! host those two shared the memory bandwidth, and at 25 % of gpt-oss-20b's
//! experts in VRAM they, not the GPU, bound decode (BENCHMARKS.md,
//! twenty-second session).
//!
//! Here each streamed layer's expert file is also mapped read-only. The
//! first time an expert misses while every page of its record is in the
//! page cache (`mincore(2)`), and the model's [`PinBudget`] has room, its
//! pages are page-locked in place for the device
//! ([`Device::pin_host_read_only`]) and stay locked while the model is
//! open. From then on a miss of that expert is one DMA from the page cache
//! into its slot: no reader thread, no CPU copy. An expert whose pages are
//! not all cached, or past the budget, is read as before (the read brings
//! it into the page cache, so a later miss may lock it). A device that
//! locks nothing (the CPU) never gets past the first attempt.
//!
//! The device copies the same record bytes a read would have put in the
//! slot, so a layer's output bits do not depend on which way a miss came.

use super::ExpertFile;
use crate::EngineError;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use turbospark_backend::host::ByteOwner;
use turbospark_backend::{Device, ExpertTensors, HostPin};

/// Bytes of page cache a model may keep locked for its devices, shared by
/// its layers and sessions.
#[derive(Debug)]
pub(crate) struct PinBudget {
    left: AtomicU64,
}

impl PinBudget {
    pub(crate) fn new(bytes: u64) -> PinBudget {
        PinBudget {
            left: AtomicU64::new(bytes),
        }
    }

    /// Takes `bytes` from the budget if that many are left.
    fn take(&self, bytes: u64) -> bool {
        self.left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                left.checked_sub(bytes)
            })
            .is_ok()
    }

    /// Returns `bytes` taken by [`PinBudget::take`].
    fn give_back(&self, bytes: u64) {
        self.left.fetch_add(bytes, Ordering::AcqRel);
    }

    /// Bytes not yet taken.
    fn left(&self) -> u64 {
        self.left.load(Ordering::Acquire)
    }
}

/// One page-aligned range of a mapping, as a byte owner of its own (what
/// a pin locks; it keeps the whole mapping alive).
struct MapRange {
    map: ByteOwner,
    range: Range<usize>,
}

impl AsRef<[u8]> for MapRange {
    fn as_ref(&self) -> &[u8] {
        &(*self.map).as_ref()[self.range.clone()]
    }
}

/// One layer's expert file mapped read-only, its experts locked one by one
/// as they miss (see the module docs); shared by a model's sessions
/// ([`ExpertFile::mapped`]).
pub(crate) struct MappedExperts {
    map: ByteOwner,
    /// Expert `e`'s parts, over its record in the mapping.
    tensors: Vec<ExpertTensors>,
    /// Expert `e`'s pages: its record rounded up to whole pages (records
    /// start on page boundaries, so no two experts share a page).
    pages: Vec<Range<usize>>,
    /// The lock of each expert, once taken.
    pins: Mutex<Vec<Option<HostPin>>>,
    /// The device locked nothing when asked: stop asking.
    refused: AtomicBool,
    budget: Arc<PinBudget>,
}

/// The system's page size.
fn page_size() -> usize {
    // SAFETY: sysconf only reads a system constant.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

impl MappedExperts {
    /// Maps `f` read-only, with `tensors(owner)` giving each expert's parts
    /// over a mapping whose records lie `stride` apart. `None` when its
    /// records do not start on page boundaries (locking one expert would
    /// lock part of its neighbour), the file is empty, or the system maps
    /// no such file: its experts are then only read.
    pub(crate) fn open(
        f: &ExpertFile,
        budget: &Arc<PinBudget>,
        tensors: impl FnOnce(&ByteOwner) -> Result<Vec<ExpertTensors>, EngineError>,
    ) -> Result<Option<MappedExperts>, EngineError> {
        let page = page_size();
        let layout = &f.layout;
        let (stride, record) = (layout.stride as usize, layout.record_len() as usize);
        if layout.num_experts == 0 || stride == 0 || stride % page != 0 {
            return Ok(None);
        }
        // SAFETY: the file is opened read-only and an install is immutable
        // while open (see `source::map_file`), so the mapping does not
        // change underneath the tensors over it.
        let Ok(map) = (unsafe { memmap2::Mmap::map(&*f.file) }) else {
            return Ok(None);
        };
        let len = map.len();
        let map: ByteOwner = Arc::new(map);
        let pages = (0..layout.num_experts)
            .map(|e| {
                let start = e * stride;
                start..(start + record.div_ceil(page) * page).min(len)
            })
            .collect();
        Ok(Some(MappedExperts {
            tensors: tensors(&map)?,
            map,
            pages,
            pins: Mutex::new((0..layout.num_experts).map(|_| None).collect()),
            refused: AtomicBool::new(false),
            budget: Arc::clone(budget),
        }))
    }

    /// Expert `e`'s parts if `device` can copy them straight from the page
    /// cache now: locked already, or locked here because every page of the
    /// expert is cached and the budget has room. `None`: read it instead.
    pub(crate) fn source<D: Device>(
        &self,
        device: &D,
        e: usize,
    ) -> Result<Option<&ExpertTensors>, EngineError> {
        let (Some(pages), Some(tensors)) = (self.pages.get(e), self.tensors.get(e)) else {
            return Ok(None);
        };
        if self.refused.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let mut pins = self.pins.lock().unwrap_or_else(|p| p.into_inner());
        if pins[e].is_some() {
            return Ok(Some(tensors));
        }
        let bytes = pages.len() as u64;
        // (the budget first: asking the kernel about every page costs more)
        if self.budget.left() < bytes || !self.all_cached(pages.clone()) || !self.budget.take(bytes)
        {
            return Ok(None);
        }
        let owner: ByteOwner = Arc::new(MapRange {
            map: Arc::clone(&self.map),
            range: pages.clone(),
        });
        match device.pin_host_read_only(&owner) {
            Ok(Some(pin)) => {
                pins[e] = Some(pin);
                Ok(Some(tensors))
            }
            Ok(None) => {
                self.budget.give_back(bytes);
                // The device locks no read-only memory (or no more of it).
                self.refused.store(true, Ordering::Relaxed);
                Ok(None)
            }
            Err(err) => {
                self.budget.give_back(bytes);
                Err(err.into())
            }
        }
    }

    /// Expert `e`'s parts over the mapping (`None` past the layer's
    /// experts).
    pub(crate) fn expert(&self, e: usize) -> Option<&ExpertTensors> {
        self.tensors.get(e)
    }

    /// The layer's experts.
    pub(crate) fn experts(&self) -> usize {
        self.tensors.len()
    }

    /// Whether every page of `pages` (page-aligned, inside the mapping) is
    /// in the page cache now.
    fn all_cached(&self, pages: Range<usize>) -> bool {
        let page = page_size();
        let n = pages.len().div_ceil(page);
        if n == 0 {
            return true;
        }
        let mut resident = vec![0u8; n];
        let bytes = (*self.map).as_ref();
        // SAFETY: `pages` lies inside the live mapping and starts on a page
        // boundary (a mapping starts on one and records are page-aligned);
        // `resident` has one byte per page of the range.
        let r = unsafe {
            libc::mincore(
                bytes.as_ptr().add(pages.start) as *mut libc::c_void,
                pages.len(),
                resident.as_mut_ptr(),
            )
        };
        r == 0 && resident.iter().all(|&b| b & 1 == 1)
    }

    /// How many experts are locked now.
    #[cfg(test)]
    fn locked(&self) -> usize {
        let pins = self.pins.lock().unwrap_or_else(|p| p.into_inner());
        pins.iter().flatten().count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use turbospark_backend::{ExpertWeights, HostTensor, SharedBytes};
    use turbospark_core::QuantFormat;
    use turbospark_format::install::{ExpertLayer, ExpertPart};

    /// A layer file of `n` experts `stride` bytes apart, each record 3 × 100
    /// bytes (gate, up, down), every byte a function of its position.
    fn layer_file(tag: &str, n: usize, stride: usize) -> (PathBuf, ExpertFile, Vec<u8>) {
        let data: Vec<u8> = (0..n * stride).map(|i| (i * 31 % 251) as u8).collect();
        let (path, file) = crate::experts::file_holding(&format!("pc-{tag}"), &data);
        let part = |name: &str, k: u64| ExpertPart {
            name: name.into(),
            dtype: QuantFormat::F32,
            shape: vec![25],
            offset: 100 * k,
            length: 100,
        };
        let layout = ExpertLayer {
            layer: 0,
            file: "000.bin".into(),
            num_experts: n,
            stride: stride as u64,
            parts: vec![part("gate", 0), part("up", 1), part("down", 2)],
        };
        let f = ExpertFile {
            layer: 0,
            layout,
            path: path.clone(),
            file,
            host: Mutex::new(None),
            mapped: Mutex::new(None),
        };
        (path, f, data)
    }

    /// Gate, up and down of each expert over `owner`, records `stride` apart.
    fn tensors(
        owner: &ByteOwner,
        n: usize,
        stride: usize,
    ) -> Result<Vec<ExpertTensors>, EngineError> {
        let t = |e: usize, k: usize| -> Result<HostTensor, EngineError> {
            let at = e * stride + 100 * k;
            Ok(HostTensor {
                name: format!("e{e}.{k}"),
                format: QuantFormat::F32,
                shape: vec![25],
                bytes: SharedBytes::new(owner.clone(), at..at + 100)?,
            })
        };
        (0..n)
            .map(|e| {
                Ok(ExpertWeights {
                    gate: t(e, 0)?,
                    up: t(e, 1)?,
                    down: t(e, 2)?,
                    gate_bias: None,
                    up_bias: None,
                    down_bias: None,
                })
            })
            .collect()
    }

    #[test]
    fn the_budget_gives_only_what_is_left() {
        let b = PinBudget::new(25);
        assert!(b.take(10) && b.take(15));
        assert!(!b.take(1), "nothing is left");
        b.give_back(15);
        assert!(!b.take(16) && b.take(15));
        assert_eq!(b.left(), 0);
    }

    /// The mapped experts are the file's records, byte for byte; a file
    /// just written is in the page cache; a device that locks nothing (the
    /// CPU) gets `None`, the budget back, and is not asked again.
    #[test]
    fn a_device_that_locks_nothing_reads_instead() {
        let page = page_size();
        let (n, stride) = (3, 2 * page);
        let (path, f, data) = layer_file("cpu", n, stride);
        let budget = Arc::new(PinBudget::new(u64::MAX / 2));
        let m = MappedExperts::open(&f, &budget, |o| tensors(o, n, stride))
            .unwrap()
            .expect("page-aligned records map");
        assert_eq!(m.experts(), n);
        for e in 0..n {
            let t = m.expert(e).unwrap();
            let at = e * stride;
            assert_eq!(t.gate.bytes.as_slice(), &data[at..at + 100]);
            assert_eq!(t.down.bytes.as_slice(), &data[at + 200..at + 300]);
            // One page each: the record rounded up, not the whole stride.
            assert_eq!(m.pages[e], at..at + page);
            assert!(m.all_cached(m.pages[e].clone()), "expert {e} not cached");
        }
        assert!(m.expert(n).is_none());
        let cpu = turbospark_cpu::CpuDevice::new(1).unwrap();
        assert!(m.source(&cpu, 1).unwrap().is_none());
        assert_eq!(budget.left(), u64::MAX / 2, "the budget was given back");
        assert!(m.refused.load(Ordering::Relaxed));
        assert!(m.source(&cpu, 0).unwrap().is_none());
        assert_eq!(m.locked(), 0);
        let _ = std::fs::remove_file(path);
    }

    /// Records that do not start on page boundaries are not mapped: locking
    /// one expert would lock part of the next.
    #[test]
    fn unaligned_records_are_not_mapped() {
        let (path, f, _) = layer_file("unaligned", 2, page_size() + 512);
        let budget = Arc::new(PinBudget::new(1 << 40));
        let m = MappedExperts::open(&f, &budget, |o| tensors(o, 2, page_size() + 512));
        assert!(m.unwrap().is_none());
        let _ = std::fs::remove_file(path);
    }
}
