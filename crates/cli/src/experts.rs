//! Expert-store options shared by every command that runs a model
//! (`logits` today; `run`, `bench` and `serve` flatten the same struct), and
//! what they print or write afterwards (`--stats`, `--router-hist`).

use crate::loading::BackendArg;
use crate::output::write_atomically;
use anyhow::{bail, Context, Result};
use serde_json::json;
use std::path::{Path, PathBuf};
use turbospark_engine::experts::Bytes;
use turbospark_engine::{
    CachePolicy, ExpertMode, ExpertOptions, ExpertStats, RouterHistogram, SlotCount,
};

/// `--experts` values.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum ModeArg {
    /// Resident when the model fits --memory-budget, streamed otherwise.
    Auto,
    /// Every expert read into memory at open.
    Resident,
    /// Every expert file memory-mapped.
    Mapped,
    /// Experts read on demand into a fixed cache of slots per layer.
    Streamed,
}

/// `--expert-cache` values.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum PolicyArg {
    /// Least frequently used, ties to the least recently used.
    Lfu,
    /// Least recently used.
    Lru,
}

fn parse_slots(s: &str) -> Result<SlotCount, String> {
    if s == "auto" {
        return Ok(SlotCount::Auto);
    }
    s.parse::<usize>()
        .map(SlotCount::Fixed)
        .map_err(|_| format!("expected a number of slots or `auto`, got `{s}`"))
}

/// How a streamed expert cache behaves (shared by every command that
/// streams experts, `bench` included).
#[derive(clap::Args, Debug, Clone)]
pub struct CacheArgs {
    /// Which cached expert a miss replaces.
    #[arg(long, value_enum, default_value = "lfu")]
    pub expert_cache: PolicyArg,
    /// Read experts with O_DIRECT, bypassing the page cache.
    #[arg(long)]
    pub direct_io: bool,
    /// Expert reader threads besides the decoding thread [default: 4 on
    /// the CPU, whose cores the compute threads need too; with a GPU
    /// computing, the cores less two, at most 12].
    #[arg(long, value_name = "N")]
    pub io_threads: Option<usize>,
    /// Streamed experts: also hold every expert in host memory (read once
    /// when the first session opens, page-locked on a GPU, one copy shared
    /// by the model's sessions), so that a miss of the slot cache is one
    /// copy from host memory instead of a read. For a GPU whose memory
    /// holds some of the experts on a machine whose RAM holds them all; it
    /// takes host memory the size of the expert files.
    #[arg(long)]
    pub host_experts: bool,
    /// Streamed experts on a GPU: GiB of the expert files' page cache that
    /// may be page-locked so that the GPU copies a miss straight out of the
    /// page cache (one DMA, no read). An expert is locked at its first miss
    /// once all its pages are cached (a read caches them) and stays locked
    /// while the model is open. 0 turns it off [default: half the host
    /// memory available when the model opens, at most the expert files;
    /// not with --host-experts or --direct-io].
    #[arg(long, value_name = "GIB")]
    pub pin_page_cache: Option<f64>,
}

impl CacheArgs {
    /// `--io-threads`, or its default for `backend`. On an H200 host
    /// (16 cores, gpt-oss-20b shapes, 8 of 32 experts in VRAM, misses read
    /// from the page cache) decode went 37, 43, 45, 45, 45, 46 tok/s with
    /// 4, 6, 8, 10, 12, 15 readers and prefill rose up to 12
    /// (BENCHMARKS.md, twenty-second session): the copies to the GPU, not
    /// the reads, bound it from about 8 on.
    pub fn io_threads(&self, backend: BackendArg) -> usize {
        self.io_threads.unwrap_or_else(|| match backend {
            BackendArg::Cpu => 4,
            BackendArg::Cuda => {
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                cores.saturating_sub(2).clamp(1, 12)
            }
        })
    }

    /// `--pin-page-cache` in bytes for `backend` (`None`: the store's
    /// default). The CPU computes from host memory and locks nothing.
    pub fn pin_page_cache(&self, backend: BackendArg) -> Result<Option<u64>> {
        match (backend, self.pin_page_cache) {
            (BackendArg::Cpu, _) => Ok(Some(0)),
            (BackendArg::Cuda, None) => Ok(None),
            (BackendArg::Cuda, Some(g)) if g.is_finite() && g >= 0.0 => {
                Ok(Some((g * (1u64 << 30) as f64) as u64))
            }
            (BackendArg::Cuda, Some(g)) => {
                bail!("--pin-page-cache must be a number of GiB, 0 or more, got {g}")
            }
        }
    }

    pub fn policy(&self) -> CachePolicy {
        match self.expert_cache {
            PolicyArg::Lfu => CachePolicy::Lfu,
            PolicyArg::Lru => CachePolicy::Lru,
        }
    }
}

/// Where routed experts live and how they are cached.
#[derive(clap::Args, Debug, Clone)]
pub struct ExpertArgs {
    /// Where routed experts live.
    #[arg(long, value_enum, default_value = "auto")]
    pub experts: ModeArg,
    /// Expert slots per MoE layer when streamed: a number (at least the
    /// model's top_k), or `auto` for as many as --memory-budget leaves room
    /// for. A number with `--experts auto` means streamed.
    #[arg(long, value_parser = parse_slots, default_value = "auto")]
    pub expert_slots: SlotCount,
    /// GiB the weights may take on the compute device (resident tensors
    /// plus expert slots): host memory with --backend cpu, GPU memory with
    /// --backend cuda (alias --gpu-memory-budget). The default is the
    /// device's memory available now.
    #[arg(long, value_name = "GIB", visible_alias = "gpu-memory-budget")]
    pub memory_budget: Option<f64>,
    #[command(flatten)]
    pub cache: CacheArgs,
    /// Print per-layer expert cache statistics (requests, hits, bytes and
    /// time read, bandwidth) to stderr at the end.
    #[arg(long)]
    pub stats: bool,
    /// Write the router's per-layer, per-expert selection counts as JSON.
    #[arg(long, value_name = "FILE.json")]
    pub router_hist: Option<PathBuf>,
}

impl ExpertArgs {
    /// The expert options for a model computed on `backend`.
    pub fn options(&self, backend: BackendArg) -> Result<ExpertOptions> {
        let memory_budget = match self.memory_budget {
            Some(g) if !(g.is_finite() && g > 0.0) => {
                bail!("--memory-budget must be a positive number of GiB, got {g}")
            }
            Some(g) => Some((g * (1u64 << 30) as f64) as u64),
            None => None,
        };
        Ok(ExpertOptions {
            mode: match self.experts {
                ModeArg::Auto => ExpertMode::Auto,
                ModeArg::Resident => ExpertMode::Resident,
                ModeArg::Mapped => ExpertMode::Mapped,
                ModeArg::Streamed => ExpertMode::Streamed,
            },
            slots: self.expert_slots,
            policy: self.cache.policy(),
            memory_budget,
            direct_io: self.cache.direct_io,
            io_threads: self.cache.io_threads(backend),
            host_experts: self.cache.host_experts,
            pin_page_cache: self.cache.pin_page_cache(backend)?,
        })
    }

    /// Prints the statistics and writes the histogram, as asked.
    /// Whether the session must count routes (`--stats`, `--router-hist`):
    /// counting reads every MoE layer's routes back to the host, which a
    /// resident layer otherwise never does.
    pub fn counts_routes(&self) -> bool {
        self.stats || self.router_hist.is_some()
    }

    pub fn report(&self, stats: &ExpertStats, hist: &RouterHistogram) -> Result<()> {
        if self.stats {
            eprint!("{stats}");
            eprintln!("{}", summary(stats));
        }
        if let Some(path) = &self.router_hist {
            write_histogram(path, hist)?;
        }
        Ok(())
    }
}

/// Writes `hist` as [`histogram_json`] to `path` (atomically).
pub fn write_histogram(path: &Path, hist: &RouterHistogram) -> Result<()> {
    let json = histogram_json(hist);
    write_atomically(path, |w| {
        serde_json::to_writer_pretty(&mut *w, &json)?;
        std::io::Write::write_all(w, b"\n")
    })
    .with_context(|| format!("writing {}", path.display()))
}

/// One line: requests, hit rate, bytes and time read, bandwidth.
pub fn summary(stats: &ExpertStats) -> String {
    let t = stats.total();
    format!(
        "experts: {} requests, hit rate {:.2}%, {} read in {:.1} ms ({}/s)",
        t.requests,
        100.0 * t.hit_rate(),
        Bytes(t.bytes_read),
        t.read_nanos as f64 * 1e-6,
        Bytes(t.bandwidth() as u64)
    )
}

/// `{num_experts, top_k, total, layers: [{layer, total, counts}]}`.
pub fn histogram_json(h: &RouterHistogram) -> serde_json::Value {
    let layers: Vec<_> = h
        .layers()
        .iter()
        .map(|(l, counts)| {
            json!({
                "layer": l,
                "total": counts.iter().sum::<u64>(),
                "counts": counts,
            })
        })
        .collect();
    json!({
        "num_experts": h.num_experts(),
        "top_k": h.top_k(),
        "total": h.total(),
        "layers": layers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(io_threads: Option<usize>) -> CacheArgs {
        CacheArgs {
            expert_cache: PolicyArg::Lfu,
            direct_io: false,
            io_threads,
            host_experts: false,
            pin_page_cache: None,
        }
    }

    /// The CPU locks no page cache whatever is asked; a GPU takes the
    /// store's default when unset, the GiB given otherwise, and refuses a
    /// negative or non-finite amount.
    #[test]
    fn page_cache_to_lock_by_backend() {
        let with = |g| CacheArgs {
            pin_page_cache: g,
            ..cache(None)
        };
        assert_eq!(
            with(Some(3.0)).pin_page_cache(BackendArg::Cpu).unwrap(),
            Some(0)
        );
        assert_eq!(with(None).pin_page_cache(BackendArg::Cuda).unwrap(), None);
        assert_eq!(
            with(Some(1.5)).pin_page_cache(BackendArg::Cuda).unwrap(),
            Some(3 << 29)
        );
        assert_eq!(
            with(Some(0.0)).pin_page_cache(BackendArg::Cuda).unwrap(),
            Some(0)
        );
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            let e = with(Some(bad))
                .pin_page_cache(BackendArg::Cuda)
                .unwrap_err();
            assert!(e.to_string().contains("--pin-page-cache"), "{e}");
        }
    }

    /// `--io-threads` wins; unset, the CPU keeps 4 readers and a GPU
    /// leaves two cores to the decoding thread and the system, at most 12.
    #[test]
    fn reader_threads_default_by_backend() {
        for backend in [BackendArg::Cpu, BackendArg::Cuda] {
            assert_eq!(cache(Some(7)).io_threads(backend), 7);
        }
        assert_eq!(cache(None).io_threads(BackendArg::Cpu), 4);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let gpu = cache(None).io_threads(BackendArg::Cuda);
        assert!((1..=12).contains(&gpu), "{gpu}");
        assert!(
            gpu == 1 || gpu + 2 <= cores,
            "{gpu} readers on {cores} cores"
        );
        assert!(
            gpu == 12 || gpu + 2 >= cores,
            "{gpu} readers on {cores} cores"
        );
    }
}
