//! `turbospark`: convert, inspect and verify model installs; compute logits;
//! generate text; serve it over HTTP; write synthetic installs; benchmark
//! speed and expert streaming.

mod census;
mod commands;
mod experts;
mod generate;
mod loading;
mod npy;
mod numerics;
mod output;
mod probe;
mod progress;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Local inference runtime for large Mixture-of-Experts and dense language
/// models, with routed experts streamed from storage.
#[derive(Parser)]
#[command(name = "turbospark", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Convert a Hugging Face checkpoint directory or a GGUF file into an
    /// install directory.
    ///
    /// Tensors are streamed one at a time (memory stays near the largest
    /// tensor), quantized blocks are kept as they are, and the install appears
    /// at DST only when it is complete: a failed or interrupted conversion
    /// leaves nothing behind.
    Convert(commands::convert::Args),
    /// Show what a model is: family, dimensions, layer pattern, tensors,
    /// resident bytes and expert layout. PATH is an install, a GGUF file or
    /// an HF checkpoint directory.
    Inspect(commands::inspect::Args),
    /// Re-hash every file of an install against its manifest. Exits 0 when
    /// all match, 1 when a file is missing or differs (it is named).
    Verify(commands::verify::Args),
    /// Write the raw logits of a token sequence as a float32 NumPy array
    /// `[n_tokens, vocab]`, computed in one prefill (or token by token with
    /// --decode), with exact arithmetic (the default), llama.cpp's or the
    /// fast one (--numerics).
    Logits(commands::logits::Args),
    /// Write a random gpt-oss-shaped install (MXFP4 experts) of any size,
    /// for benchmarking expert streaming without a checkpoint; or, with
    /// --like, one with exactly the layout of another install (or of its
    /// layout file, --save-layout).
    Synth(commands::synth::Args),
    /// Prefill and decode speed of any install, as llama-bench measures
    /// them (`-p 512 -n 128 -r 5 -t N`: tok/s mean ± sd, peak memory; a
    /// table or --json); with --sweep (or --slots), a MoE install's speed
    /// with streamed experts at several slot counts, with hit rate, read
    /// bandwidth and peak memory against the slot cache's bound.
    Bench(commands::bench::Args),
    /// Answer one prompt: the chat template is applied (unless --raw), the
    /// answer streams to stdout, and a summary (prompt tokens, prefill and
    /// decode speed, peak memory) goes to stderr.
    Run(commands::run::Args),
    /// Chat on stdin: the conversation is kept (the KV cache is reused
    /// across turns); /reset forgets it, /exit leaves, Ctrl-C stops an answer.
    Chat(commands::chat::Args),
    /// Serve the model over HTTP: OpenAI (/v1/chat/completions,
    /// /v1/completions, /v1/models) and Anthropic (/v1/messages) APIs,
    /// streaming or whole, with continuous batching of up to --parallel
    /// sequences; /health and /metrics (Prometheus).
    Serve(commands::serve::Args),
    /// Build a control vector from paired positive and negative prompts
    /// (mean difference or first principal component of their residuals),
    /// written as llama.cpp's control-vector GGUF (`--control-vector`).
    ControlVector(commands::control_vector::Args),
    /// Draw a router histogram (`--router-hist`) as a per-layer ×
    /// per-expert heatmap, or an expert-slot sweep (`bench --sweep
    /// --json`) as hit rate and decode tok/s against slot count (SVG).
    Plot(commands::plot::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Convert(a) => commands::convert::run(a),
        Command::Inspect(a) => commands::inspect::run(a),
        Command::Verify(a) => commands::verify::run(a),
        Command::Logits(a) => commands::logits::run(a),
        Command::Synth(a) => commands::synth::run(a),
        Command::Bench(a) => commands::bench::run(a),
        Command::Run(a) => commands::run::run(a),
        Command::Chat(a) => commands::chat::run(a),
        Command::Serve(a) => commands::serve::run(a),
        Command::ControlVector(a) => commands::control_vector::run(a),
        Command::Plot(a) => commands::plot::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
