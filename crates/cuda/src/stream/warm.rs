//! L2 warm-up of a recorded decode step's next weights, beside its
//! latency-bound kernels (an experiment, off unless `TURBOSPARK_CUDA_WARM`
//! is set; its one measurement, on an H100 in the thirty-second session,
//! also warmed the output head, which only doubled the head's traffic, so
//! it says nothing yet about the layers: BENCHMARKS.md).
//!
//! Between two products of one token's decode step run kernels that move
//! kilobytes — the norms, the rope with its cache writes, the attention,
//! the routing — for several µs a layer, while the HBM idles; a product
//! then reads its weights at about half the copy bandwidth (BENCHMARKS.md,
//! thirty-first session). While a step is recorded, each product launched
//! on the stream is marked with an event; a product of at least `min_mb`
//! of weights that arrives forks a second stream of the same graph from
//! the mark `lead` products back and there asks the L2 for its weights
//! (`kernels/warm.cu` `l2_warm`), so the fetch runs beside the small
//! kernels between them. With `down`, the routed experts' down rows are
//! asked for too, forked after the routing, beside the gate/up products.
//! The side stream joins the step's stream before the recording ends. The
//! kernels only ask the L2 for lines, so every result is the same bits.
//!
//! `TURBOSPARK_CUDA_WARM=blocks:chunk:lead:min_mb:down`: the warm-up
//! launch's blocks; bytes a bulk prefetch asks for (sm_90; 0: a 128-byte
//! line a thread); how many products back the fork is (0: no dense
//! warm-up); the smallest weights in MB warmed (never more than
//! [`LARGEST`]); 1 to warm the down rows; optionally, the most KiB one
//! warm-up asks for (0: none, so that only the forks and launches cost,
//! to tell their cost from the prefetches').

use crate::kernels::{args, Kernels};
use crate::memory::runtime;
use crate::types::{CudaBank, CudaRoutes};
use cudarc::driver::{result, sys, CudaContext, CudaStream as RawStream};
use std::cell::Cell;
use std::sync::Arc;
use turbospark_backend::BackendError;

/// Marks kept: a fork reaches at most `MARKS - 1` products back.
const MARKS: usize = 4;

/// The largest weights warmed: more than the L2 keeps (50 MB on an H100
/// or H200, less what the step's other kernels hold) would only be read
/// twice from the HBM. The output head (0.6–1.2 GB for gpt-oss-20b) was
/// warmed in the thirty-second session's measurements, which doubled its
/// traffic (BENCHMARKS.md).
const LARGEST: usize = 32 << 20;

/// Threads of a warm-up block.
const THREADS: u32 = 128;

/// The parsed `TURBOSPARK_CUDA_WARM`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WarmSetting {
    pub blocks: u32,
    pub chunk: i32,
    pub lead: usize,
    pub min_bytes: usize,
    pub down: bool,
    /// The most bytes one warm-up asks for (all, unless set).
    pub ask: usize,
}

impl WarmSetting {
    /// `blocks:chunk:lead:min_mb:down[:ask_kb]`; `None` when unset, `0` or
    /// not of that form.
    pub(crate) fn parse(v: Option<&str>) -> Option<WarmSetting> {
        let parts: Vec<u64> = v?
            .split(':')
            .map(|p| p.trim().parse().ok())
            .collect::<Option<_>>()?;
        let (&[blocks, chunk, lead, min_mb, down], ask_kb) =
            (parts.get(..5)?, parts.get(5).copied())
        else {
            return None;
        };
        if parts.len() > 6 {
            return None;
        }
        let s = WarmSetting {
            blocks: u32::try_from(blocks).ok().filter(|&b| b > 0)?,
            chunk: i32::try_from(chunk).ok().filter(|c| c % 16 == 0)?,
            lead: usize::try_from(lead).ok().filter(|&l| l < MARKS)?,
            min_bytes: usize::try_from(min_mb).ok()? << 20,
            down: down == 1,
            ask: match ask_kb {
                Some(kb) => usize::try_from(kb).ok()?.checked_mul(1024)?,
                None => usize::MAX,
            },
        };
        (s.lead > 0 || s.down).then_some(s)
    }
}

/// The side stream, its marks and where the recording stands.
pub(super) struct Warm {
    setting: WarmSetting,
    side: Arc<RawStream>,
    marks: [sys::CUevent; MARKS],
    /// Recorded on the step's stream just before a routed experts' call.
    routed: sys::CUevent,
    /// Recorded on the side stream at the end, which the step waits for.
    join: sys::CUevent,
    /// Products marked since the recording began.
    launched: Cell<usize>,
    forked: Cell<bool>,
}

// SAFETY: events are handles usable from any thread that binds their
// context; a `Warm` belongs to one stream, used from one thread at a time.
unsafe impl Send for Warm {}

fn event(op: &'static str) -> Result<sys::CUevent, BackendError> {
    result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).map_err(runtime(op))
}

impl Warm {
    /// The side stream and events, in `ctx` (bound by the caller).
    pub(super) fn new(ctx: &Arc<CudaContext>, setting: WarmSetting) -> Result<Warm, BackendError> {
        const OP: &str = "warm";
        let side = ctx.new_stream().map_err(runtime(OP))?;
        Ok(Warm {
            setting,
            side,
            marks: [event(OP)?, event(OP)?, event(OP)?, event(OP)?],
            routed: event(OP)?,
            join: event(OP)?,
            launched: Cell::new(0),
            forked: Cell::new(false),
        })
    }

    pub(super) fn setting(&self) -> WarmSetting {
        self.setting
    }

    /// A recording begins.
    pub(super) fn begin(&self) {
        self.launched.set(0);
        self.forked.set(false);
    }

    /// Marks a product just launched on `main`.
    pub(super) fn product_launched(&self, main: &RawStream) -> Result<(), BackendError> {
        let n = self.launched.get();
        // SAFETY: a valid event and stream of the bound context.
        unsafe { result::event::record(self.marks[n % MARKS], main.cu_stream()) }
            .map_err(runtime("warm"))?;
        self.launched.set(n + 1);
        Ok(())
    }

    /// Makes the side stream wait for `event`.
    fn fork(&self, event: sys::CUevent) -> Result<(), BackendError> {
        // SAFETY: a valid event and stream of the bound context; the event
        // was recorded in this recording.
        unsafe {
            result::stream::wait_event(
                self.side.cu_stream(),
                event,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(runtime("warm"))?;
        self.forked.set(true);
        Ok(())
    }

    /// Launches `f` on the side stream without programmatic dependence
    /// (its KERNEL_ENTRY wait is then a no-op; it depends on the fork).
    fn launch(
        &self,
        f: &cudarc::driver::CudaFunction,
        grid: (u32, u32, u32),
        args: &mut [*mut std::ffi::c_void],
    ) -> Result<(), BackendError> {
        // SAFETY: `args` point at values of the kernel's parameter types,
        // alive until the launch has copied them; the kernels only ask the
        // L2 for lines of the allocations the caller names.
        unsafe {
            result::launch_kernel(
                f.cu_function(),
                grid,
                (THREADS, 1, 1),
                0,
                self.side.cu_stream(),
                args,
            )
        }
        .map_err(runtime("warm"))
    }

    /// A product of `bytes` of weights at `w` arrives: ask the L2 for
    /// them from the mark `lead` products back, if there is one.
    pub(super) fn weights(&self, k: &Kernels, w: u64, bytes: usize) -> Result<(), BackendError> {
        let (lead, n) = (self.setting.lead, self.launched.get());
        if lead == 0 || n < lead || bytes < self.setting.min_bytes.max(1) || bytes > LARGEST {
            return Ok(());
        }
        self.fork(self.marks[(n - lead) % MARKS])?;
        let (b, chunk) = (bytes.min(self.setting.ask) as i64, self.setting.chunk);
        self.launch(
            &k.l2_warm,
            (self.setting.blocks, 1, 1),
            &mut args![w, b, chunk],
        )
    }

    /// One token's routed experts' call arrives after its routing (all
    /// launched on `main`): ask the L2 for the down rows of each route's
    /// slot of `bank`.
    pub(super) fn routed(
        &self,
        k: &Kernels,
        main: &RawStream,
        routes: &CudaRoutes,
        bank: &CudaBank,
    ) -> Result<(), BackendError> {
        let n_routes = routes.top_k;
        let slot_bytes = bank.hidden * bank.down.row_bytes;
        if !self.setting.down || n_routes == 0 || n_routes * slot_bytes > LARGEST {
            return Ok(());
        }
        // SAFETY: a valid event and stream of the bound context.
        unsafe { result::event::record(self.routed, main.cu_stream()) }.map_err(runtime("warm"))?;
        self.fork(self.routed)?;
        let (rp, s, base) = (routes.mem.ptr, bank.slots as i32, bank.down.mem.ptr);
        let (sb, chunk) = (slot_bytes.min(self.setting.ask) as i64, self.setting.chunk);
        let blocks = self.setting.blocks.div_ceil(n_routes as u32).max(1);
        self.launch(
            &k.l2_warm_routes,
            (blocks, n_routes as u32, 1),
            &mut args![rp, s, base, sb, chunk],
        )
    }

    /// The recording ends: `main` waits for the side stream.
    pub(super) fn end(&self, main: &RawStream) -> Result<(), BackendError> {
        if !self.forked.replace(false) {
            return Ok(());
        }
        // SAFETY: valid events and streams of the bound context.
        unsafe {
            result::event::record(self.join, self.side.cu_stream()).map_err(runtime("warm"))?;
            result::stream::wait_event(
                main.cu_stream(),
                self.join,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(runtime("warm"))
    }
}

impl Drop for Warm {
    fn drop(&mut self) {
        let _ = self.side.synchronize();
        for e in self.marks.into_iter().chain([self.routed, self.join]) {
            // SAFETY: created in `new`, destroyed once, the side stream idle.
            let _ = unsafe { result::event::destroy(e) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::WarmSetting;

    #[test]
    fn the_setting_takes_five_or_six_numbers() {
        let s = WarmSetting::parse(Some("132:0:1:1:0")).unwrap();
        assert_eq!(
            (s.blocks, s.chunk, s.lead, s.min_bytes, s.down),
            (132, 0, 1, 1 << 20, false)
        );
        assert_eq!(s.ask, usize::MAX);
        assert_eq!(WarmSetting::parse(Some("132:0:1:1:0:0")).unwrap().ask, 0);
        assert_eq!(
            WarmSetting::parse(Some("132:0:1:1:0:64")).unwrap().ask,
            64 << 10
        );
        assert!(WarmSetting::parse(Some("32:4096:0:1:1")).unwrap().down);
        for bad in [
            "0",
            "",
            "1:2:3",
            "132:8:1:1:0",
            "132:0:4:1:0",
            "0:0:1:1:0",
            "132:0:0:1:0",
            "132,0,1,1,0",
            "132:0:1:1:0:0:0",
        ] {
            assert_eq!(WarmSetting::parse(Some(bad)), None, "{bad}");
        }
        assert_eq!(WarmSetting::parse(None), None);
    }
}
