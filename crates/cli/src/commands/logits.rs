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

use crate::experts::ExpertArgs;
use crate::loading::{with_model, DeviceArgs, ModelTask};
use crate::numerics::{self, NumericsArg};
use crate::probe::ProbeArgs;
use turbospark_backend::Device;
use turbospark_engine::Model;

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
    /// After the tokens, decode this many greedy (argmax) tokens and print
    /// their ids to stdout as `greedy: 1,2,3` (the logits file still holds
    /// the given tokens' rows only).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub greedy: usize,
    /// Compute threads (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Arithmetic: exact, llama-cpp or fast (--help says more). The
    /// default here is `exact`: `logits` is the parity tool.
    #[arg(long, value_enum, default_value = "exact", long_help = numerics::HELP)]
    pub numerics: NumericsArg,
    #[command(flatten)]
    pub device: DeviceArgs,
    #[command(flatten)]
    pub experts: ExpertArgs,
    #[command(flatten)]
    pub probe: ProbeArgs,
}

pub fn run(a: Args) -> Result<ExitCode> {
    with_model(
        &a.model,
        &a.device,
        a.threads,
        a.numerics.into(),
        &a.experts.options(a.device.backend)?,
        Logits { args: &a },
    )?;
    Ok(ExitCode::SUCCESS)
}

/// Computing and writing the logits, on whichever device holds the model.
struct Logits<'a> {
    args: &'a Args,
}

impl ModelTask for Logits<'_> {
    type Output = ();

    fn run<D: Device>(self, model: Model<D>) -> Result<()> {
        let a = self.args;
        let n = a.tokens.len();
        let vocab = model.vocab_size();
        let mut session = model.session(model.session_options(n + a.greedy))?;
        session.set_route_statistics(a.experts.counts_routes());
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
        a.probe.finish(&mut session, &a.model, &numerics)?;
        if a.greedy > 0 {
            let mut next = turbospark_text::sampler::argmax(&logits[(n - 1) * vocab..]);
            let mut ids = Vec::with_capacity(a.greedy);
            for pos in n..n + a.greedy {
                ids.push(next);
                next = turbospark_text::sampler::argmax(session.decode(next, pos)?);
            }
            let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
            println!("greedy: {}", ids.join(","));
        }
        a.experts
            .report(session.expert_stats(), session.router_histogram())?;
        crate::output::write_atomically(&a.out, |w| crate::npy::write_f32(w, &[n, vocab], &logits))
            .with_context(|| format!("writing {}", a.out.display()))
    }
}
