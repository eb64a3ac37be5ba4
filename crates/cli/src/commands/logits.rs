//! `turbospark logits --model DIR --tokens 1,2,3 --out FILE.npy [--decode]`:
//! raw logits `[n_tokens, vocab]` of a token sequence as float32 NumPy, for
//! comparison against reference implementations.

use anyhow::{Context, Result};
use std::path::PathBuf;
use std::process::ExitCode;
use turbospark_cpu::CpuBackend;
use turbospark_engine::{Model, SessionOptions};
use turbospark_format::install::Install;

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
}

pub fn run(a: Args) -> Result<ExitCode> {
    let install = Install::open(&a.model)?;
    let backend = match a.threads {
        Some(t) => CpuBackend::new(t)?,
        None => CpuBackend::with_available_threads()?,
    };
    let model =
        Model::load(&install, backend).with_context(|| format!("loading {}", a.model.display()))?;
    let n = a.tokens.len();
    let vocab = model.vocab_size();
    let mut session = model.session(SessionOptions::new(n))?;
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
    let file =
        std::fs::File::create(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let mut w = std::io::BufWriter::new(file);
    crate::npy::write_f32(&mut w, &[n, vocab], &logits)
        .and_then(|()| std::io::Write::flush(&mut w))
        .with_context(|| format!("writing {}", a.out.display()))?;
    Ok(ExitCode::SUCCESS)
}
