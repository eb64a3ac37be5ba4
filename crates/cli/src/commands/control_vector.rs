//! `turbospark control-vector --model DIR --positive FILE --negative FILE
//! --out FILE.gguf [--layers A-B] [--method mean-diff|pca]`: a control
//! vector from two prompt sets, in llama.cpp's GGUF format.
//!
//! The files hold one prompt a line (`\n` inside a line is a newline, as in
//! llama-cvector-generator's prompt files); line `i` of each forms pair
//! `i`. Each prompt runs in one prefill (raw text, BOS as the vocabulary
//! asks, or through the chat template as a user message with `--chat`),
//! its last token's residual after every layer is captured, and
//! `direction.N` is built from layer `N − 1`'s pairs
//! (`turbospark_engine::control_vector` has the math).

use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use turbospark_engine::control_vector::build_direction;
use turbospark_engine::{BuildMethod, CapturedRows, ControlVector, ResidualSink, SessionOptions};
use turbospark_text::Message;

use crate::experts::ExpertArgs;
use crate::generate::Text;
use crate::loading::{cpu_device, open_model};
use crate::numerics::{self, NumericsArg};

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum MethodArg {
    /// The normalised mean of the paired differences (llama.cpp's
    /// `--method mean`).
    MeanDiff,
    /// The first principal component of the paired differences (repeng's
    /// `pca_diff`).
    Pca,
}

#[derive(clap::Args)]
pub struct Args {
    /// The install directory.
    #[arg(long)]
    pub model: PathBuf,
    /// Positive prompts, one a line.
    #[arg(long, value_name = "FILE")]
    pub positive: PathBuf,
    /// Negative prompts, one a line, paired with the positive ones.
    #[arg(long, value_name = "FILE")]
    pub negative: PathBuf,
    /// The control vector GGUF to write.
    #[arg(long, value_name = "FILE.gguf")]
    pub out: PathBuf,
    /// Directions to write, `A-B` (default: 1 to the last layer; layer 0
    /// is never steered).
    #[arg(long, value_name = "A-B")]
    pub layers: Option<String>,
    #[arg(long, value_enum, default_value = "mean-diff")]
    pub method: MethodArg,
    /// Put each prompt through the chat template as a user message.
    #[arg(long)]
    pub chat: bool,
    /// Compute threads (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Arithmetic (--help says more); `exact` by default.
    #[arg(long, value_enum, default_value = "exact", long_help = numerics::HELP)]
    pub numerics: NumericsArg,
    #[command(flatten)]
    pub experts: ExpertArgs,
}

/// Keeps the last captured row of every layer.
#[derive(Clone, Default)]
struct LastRow(Arc<Mutex<Vec<f32>>>);

impl ResidualSink for LastRow {
    fn write(&mut self, r: &CapturedRows<'_>) -> std::io::Result<()> {
        let width = r.layers.len() * r.hidden;
        if let Some(last) = r.data.chunks_exact(width).last() {
            let mut v = self
                .0
                .lock()
                .map_err(|_| std::io::Error::other("poisoned"))?;
            v.clear();
            v.extend_from_slice(last);
        }
        Ok(())
    }
    fn finish(self: Box<Self>) -> std::io::Result<()> {
        Ok(())
    }
}

fn read_prompts(path: &std::path::Path) -> Result<Vec<String>> {
    let text = crate::commands::run::read_prompt_file(path)?;
    Ok(text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.replace("\\n", "\n"))
        .collect())
}

pub fn run(a: Args) -> Result<ExitCode> {
    let positive = read_prompts(&a.positive)?;
    let negative = read_prompts(&a.negative)?;
    if positive.is_empty() || positive.len() != negative.len() {
        bail!(
            "{} has {} prompts and {} has {}: they pair line by line, so give the same number (≥ 1)",
            a.positive.display(),
            positive.len(),
            a.negative.display(),
            negative.len()
        );
    }
    let text = Text::load(&a.model, None)?;
    let template = if a.chat {
        Some(text.require_template(&a.model)?)
    } else {
        None
    };
    let tokenize = |p: &str| -> Result<Vec<u32>> {
        match template {
            Some(t) => text.chat_tokens(t, &[Message::new("user", p)]),
            None => text.raw_tokens(p),
        }
    };
    // The builder reads residuals on the CPU backend.
    let model = open_model(
        &a.model,
        cpu_device(a.threads, a.numerics.into())?,
        &a.experts.options(crate::loading::BackendArg::Cpu)?,
    )?;
    let spec = model.spec();
    let (n_layers, hidden) = (spec.layers.len(), spec.hidden_size);
    if n_layers < 2 {
        bail!("the model has {n_layers} layer(s); directions start at layer 1");
    }
    let directions: Vec<usize> = match &a.layers {
        Some(s) => {
            let v = crate::probe::parse_layers(s, n_layers)?;
            if v.contains(&0) {
                bail!("--layers {s}: layer 0 is never steered (llama.cpp refuses direction.0)");
            }
            v
        }
        None => (1..n_layers).collect(),
    };
    // direction.N is read from the output of layer N − 1.
    let captured: Vec<usize> = directions.iter().map(|n| n - 1).collect();

    let states = |prompts: &[String]| -> Result<Vec<Vec<f32>>> {
        let mut out = Vec::with_capacity(prompts.len());
        for p in prompts {
            let tokens = tokenize(p)?;
            if tokens.is_empty() {
                bail!("prompt {p:?} has no tokens");
            }
            let mut session = model.session(SessionOptions::new(tokens.len()))?;
            let sink = LastRow::default();
            session.set_capture(&captured, Box::new(sink.clone()))?;
            session.forward(0, &tokens, turbospark_engine::Logits::None)?;
            session.finish_capture()?;
            let row = sink.0.lock().map(|v| v.clone()).unwrap_or_default();
            out.push(row);
        }
        Ok(out)
    };
    let pos = states(&positive).context("running the positive prompts")?;
    let neg = states(&negative).context("running the negative prompts")?;

    let method = match a.method {
        MethodArg::MeanDiff => BuildMethod::MeanDiff,
        MethodArg::Pca => BuildMethod::Pca,
    };
    let mut cv = ControlVector::new(hidden);
    for (k, &n) in directions.iter().enumerate() {
        let at = k * hidden..(k + 1) * hidden;
        let p: Vec<&[f32]> = pos.iter().map(|r| &r[at.clone()]).collect();
        let q: Vec<&[f32]> = neg.iter().map(|r| &r[at.clone()]).collect();
        cv.set(n, build_direction(method, n, &p, &q)?)?;
    }
    cv.write_gguf(&a.out, turbospark_format::families::name(&spec.family))
        .with_context(|| format!("writing {}", a.out.display()))?;
    eprintln!(
        "wrote {} ({} directions, layers {}..={}, {} pairs, {:?})",
        a.out.display(),
        directions.len(),
        directions.first().copied().unwrap_or(0),
        directions.last().copied().unwrap_or(0),
        positive.len(),
        a.method
    );
    Ok(ExitCode::SUCCESS)
}
