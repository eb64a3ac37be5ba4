//! `turbospark logits --model DIR --tokens 1,2,3 --out FILE.npy [--decode]
//! [--numerics exact|llama-cpp|fast] [expert options]`: raw logits `[n_tokens,
//! vocab]` of a token sequence as float32 NumPy, for comparison against
//! reference implementations. The expert options (`--experts`,
//! `--expert-slots`, `--expert-cache`, `--memory-budget`, `--direct-io`,
//! `--stats`, `--router-hist`) are [`ExpertArgs`]; the output file appears
//! only when every logit was computed. `--capture-resid` and
//! `--control-vector` are [`ProbeArgs`].

use anyhow::{Context, Result};
use std::path::PathBuf;
use std::process::ExitCode;
use turbospark_engine::SessionOptions;

use crate::experts::ExpertArgs;
use crate::loading::open_model;
use crate::numerics::{self, NumericsArg};
use crate::probe::ProbeArgs;

#[derive(clap::Args)]
pub struct Args {
    /// The install directory (made by `turbospark convert`).
    #[arg(long)]
    pub model: PathBuf,
    /// Token ids, comma-separated.
    #[arg(long, value_delimiter = ',', required = true, num_args = 1..)]
    pub tokens: Vec<u32>,
    /// Where to write the `.npy` file.
    #[arg(long)]
    pub out: PathBuf,
    /// Feed the tokens one at a time (decode) instead of one prefill.
    #[arg(long)]
    pub decode: bool,
    /// Compute threads (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Arithmetic: exact, llama-cpp or fast (--help says more). The
    /// default here is `exact`: `logits` is the parity tool.
    #[arg(long, value_enum, default_value = "exact", long_help = numerics::HELP)]
    pub numerics: NumericsArg,
    #[command(flatten)]
    pub experts: ExpertArgs,
    #[command(flatten)]
    pub probe: ProbeArgs,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let model = open_model(
        &a.model,
        a.threads,
        a.numerics.into(),
        &a.experts.options()?,
    )?;
    let n = a.tokens.len();
    let vocab = model.vocab_size();
    let mut session = model.session(SessionOptions::new(n))?;
    let numerics = format!("{:?}", a.numerics).to_lowercase();
    a.probe.apply(&mut session, &model, &a.model, &numerics)?;
    let mut logits = vec![0f32; n * vocab];
    if a.decode {
        for (pos, (&token, row)) in a
            .tokens
            .iter()
            .zip(logits.chunks_exact_mut(vocab))
            .enumerate()
        {
            row.copy_from_slice(session.decode(token, pos)?);
        }
    } else {
        session.prefill(&a.tokens, &mut logits)?;
    }
    session.finish_capture()?;
    a.experts
        .report(session.expert_stats(), session.router_histogram())?;
    crate::output::write_atomically(&a.out, |w| crate::npy::write_f32(w, &[n, vocab], &logits))
        .with_context(|| format!("writing {}", a.out.display()))?;
    Ok(ExitCode::SUCCESS)
}
