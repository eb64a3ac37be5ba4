//! Decode allocates nothing once a session exists: a counting global
//! allocator (this test binary's own) sees zero allocations, on any thread,
//! while several tokens are decoded after a warm-up. The models are sized so
//! that the CPU backend's thread pool does the heavy ops. The MoE fixtures
//! then run as installs with streamed experts in as few slots as possible,
//! so decode steps miss and read experts on the I/O pool.

mod common;

use common::{model_as, spec, tokens, TempInstall, MOE_FAMILIES};
use serde_json::json;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use turbospark_core::QuantFormat;
use turbospark_cpu::{CpuDevice, Numerics};
use turbospark_engine::{ExpertOptions, Model, SessionOptions};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call forwards to the system allocator with the caller's own
// arguments; the counter has no effect on the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        // SAFETY: forwarded unchanged (see the impl comment).
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        // SAFETY: forwarded unchanged.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn decode_does_not_allocate() {
    let probe_before = ALLOCATIONS.load(Ordering::SeqCst);
    let probe = std::hint::black_box(vec![1u8; 16]);
    assert!(
        ALLOCATIONS.load(Ordering::SeqCst) > probe_before,
        "the counter is live"
    );
    drop(probe);
    let resize = [
        ("hidden_size", json!(128)),
        ("vocab_size", json!(1024)),
        ("intermediate_size", json!(256)),
    ];
    // Exact f32, and the fast kernels on repacked Q8_0 weights.
    let modes = [
        (QuantFormat::F32, Numerics::Exact),
        (QuantFormat::Q8_0, Numerics::Fast),
    ];
    for (family, (format, numerics)) in ["gpt_oss", "muse_glimmer", "glm4_moe", "gemma3", "gemma4"]
        .into_iter()
        .flat_map(|f| modes.map(|m| (f, m)))
    {
        let Some(spec) = spec(family, &resize) else {
            println!("skipped {family}: fixture absent");
            continue;
        };
        let m = model_as(&spec, 2, format, numerics);
        let toks = tokens(12, spec.vocab_size);
        let mut s = m
            .session(SessionOptions {
                context: toks.len(),
                max_batch: 4,
            })
            .unwrap();
        let mut checksum = 0f32;
        for (pos, &t) in toks[..2].iter().enumerate() {
            checksum += s.decode(t, pos).unwrap()[0];
        }
        let before = ALLOCATIONS.load(Ordering::SeqCst);
        for (pos, &t) in toks.iter().enumerate().skip(2) {
            checksum += s.decode(t, pos).unwrap()[0];
        }
        let during = ALLOCATIONS.load(Ordering::SeqCst) - before;
        assert!(checksum.is_finite());
        assert_eq!(
            during, 0,
            "{family} ({format}, {numerics}): {during} allocations while decoding 10 tokens"
        );
        println!("{family} ({format}, {numerics}): 0 allocations over 10 decoded tokens");
    }

    // One test function: the counter is global and tests run in parallel.
    for &family in MOE_FAMILIES {
        let Some(tmp) = TempInstall::convert(family, "noalloc") else {
            println!("skipped streamed {family}: fixture absent");
            continue;
        };
        let install = tmp.open();
        let k = install.manifest.arch.moe.as_ref().unwrap().top_k;
        let opts = ExpertOptions {
            io_threads: 2,
            ..ExpertOptions::streamed(k)
        };
        let m = Model::open(&install, CpuDevice::new(2).unwrap(), &opts).unwrap();
        let toks = tokens(12, m.vocab_size());
        let mut s = m
            .session(SessionOptions {
                context: toks.len(),
                max_batch: 4,
            })
            .unwrap();
        let mut checksum = 0f32;
        for (pos, &t) in toks[..2].iter().enumerate() {
            checksum += s.decode(t, pos).unwrap()[0];
        }
        let reads_before = s.expert_stats().total().reads;
        let before = ALLOCATIONS.load(Ordering::SeqCst);
        for (pos, &t) in toks.iter().enumerate().skip(2) {
            checksum += s.decode(t, pos).unwrap()[0];
        }
        let during = ALLOCATIONS.load(Ordering::SeqCst) - before;
        let reads = s.expert_stats().total().reads - reads_before;
        assert!(checksum.is_finite());
        assert!(reads > 0, "{family}: the streamed decode read no experts");
        assert_eq!(
            during, 0,
            "{family} streamed ({k} slots): {during} allocations while decoding 10 tokens"
        );
        println!("{family} streamed: 0 allocations over 10 decoded tokens, {reads} expert reads");
    }
}
