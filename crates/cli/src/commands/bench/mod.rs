//! `turbospark bench --model DIR`: how fast an install runs, in two modes.
//!
//! - Speed (the default, any install, dense or MoE): llama-bench's tests
//!   and report ([`speed`]): `-p 512` one prefill of 512 random tokens into
//!   an empty cache (`pp512`), `-n 128` 128 single-token decode steps from
//!   an empty cache (`tg128`), `-d 512` each of them after an untimed
//!   512-token prompt (`tg128 @ d512`), `-r 5` repetitions after a warm-up, mean ±
//!   standard deviation of tok/s, peak resident memory; a markdown table, or
//!   one JSON object per line and test with `--json`.
//! - Expert-slot sweep (MoE installs; `--sweep`, or any of its options
//!   `--slots`, `--prompt`, `--generate`, `--mapped`, `--resident`) ([`sweep`]): prefill
//!   and decode with streamed experts at several slot counts, with hit rate,
//!   read bandwidth, the engine's phases, the routing skew and each
//!   configuration's peak memory against the slot cache's bound.

mod model_desc;
mod speed;
mod sweep;

use crate::experts::ExpertArgs;
use crate::numerics::{self, NumericsArg};
use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
#[command(
    after_help = "Speed mode follows llama-bench: `turbospark bench -m DIR -p 512 -n 128 \
-r 5 -t 2` runs the same tests as `llama-bench -m FILE.gguf -p 512 -n 128 -r 5 -t 2`."
)]
pub struct Args {
    /// The install directory.
    #[arg(long, short = 'm')]
    pub model: PathBuf,
    /// Prompt lengths to test, comma-separated: each is one prefill of that
    /// many random tokens into an empty KV cache, or one holding `-d`
    /// tokens (test `ppN`); 0 skips the prefill test.
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "512"
    )]
    pub n_prompt: Vec<usize>,
    /// Generation lengths to test, comma-separated: each is that many
    /// single-token decode steps from an empty KV cache, or one holding `-d`
    /// tokens (test `tgN`); 0 skips the decode test.
    #[arg(
        short = 'n',
        long = "n-gen",
        value_delimiter = ',',
        default_value = "128"
    )]
    pub n_gen: Vec<usize>,
    /// Tokens already in the KV cache when each test starts, comma-separated
    /// to test several (llama-bench's `-d`): an untimed prefill of that many
    /// random tokens runs first, so `-n 128 -d 512` times 128 decode steps
    /// after a 512-token prompt (test `tg128 @ d512`).
    #[arg(
        short = 'd',
        long = "n-depth",
        value_delimiter = ',',
        default_value = "0"
    )]
    pub n_depth: Vec<usize>,
    /// Timed runs of each test (after one warm-up run); each starts from an
    /// empty KV cache (and its `-d` prefill).
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub repetitions: usize,
    /// Compute threads, comma-separated to test several (default: one per
    /// core).
    #[arg(short = 't', long = "threads", value_delimiter = ',')]
    pub threads: Vec<usize>,
    /// Arithmetic, comma-separated to test several: exact, llama-cpp or fast
    /// (--help says more).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "fast", long_help = numerics::HELP)]
    pub numerics: Vec<NumericsArg>,
    /// Most tokens one batched prefill pass processes (the engine's prefill
    /// chunk; default: the backend's, 64 on the CPU and 512 on CUDA;
    /// llama-bench's counterpart is its micro-batch, `-ub`, 512 by default).
    #[arg(long)]
    pub prefill_chunk: Option<usize>,
    /// Skip the warm-up run before each test's repetitions.
    #[arg(long)]
    pub no_warmup: bool,
    /// One JSON object per line and test (fields `test`, `tok_per_s`, `sd`,
    /// `samples`, `threads`, `numerics`, `model`, `backend`, `n_prompt`,
    /// `n_gen`, `repetitions`, `peak_rss_bytes`, ...) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// The expert-slot sweep instead of the speed tests (MoE installs).
    #[arg(long)]
    pub sweep: bool,
    /// Sweep: slot counts to run, streamed: numbers, multiples of top_k
    /// (`k`, `2k`, ...) or `all` (default `k,2k,4k,all`). Implies --sweep.
    #[arg(long, value_delimiter = ',')]
    pub slots: Option<Vec<String>>,
    /// Sweep: prompt tokens, run as one prefill (default 16). Implies --sweep.
    #[arg(long)]
    pub prompt: Option<usize>,
    /// Sweep: tokens decoded greedily after the prompt (default 16). Implies
    /// --sweep.
    #[arg(long)]
    pub generate: Option<usize>,
    /// Sweep: also run with every expert memory-mapped, first, as a
    /// baseline. Implies --sweep.
    #[arg(long)]
    pub mapped: bool,
    /// Sweep: also run with every expert resident (read into memory), first,
    /// as the baseline streamed decode is compared with. Implies --sweep.
    #[arg(long)]
    pub resident: bool,
    #[command(flatten)]
    pub experts: ExpertArgs,
    #[command(flatten)]
    pub device: crate::loading::DeviceArgs,
}

impl Args {
    /// Whether the expert-slot sweep was asked for.
    fn sweep_mode(&self) -> bool {
        self.sweep
            || self.slots.is_some()
            || self.prompt.is_some()
            || self.generate.is_some()
            || self.mapped
            || self.resident
    }
}

pub fn run(a: Args) -> Result<ExitCode> {
    if a.sweep_mode() {
        sweep::run(&a)
    } else {
        speed::run(&a)
    }
}

/// Resets the peak resident set size to the current one (Linux ≥ 4.0);
/// false where the system cannot.
fn peak_rss_reset() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}
