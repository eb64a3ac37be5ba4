//! `turbospark run --model DIR --prompt TEXT`: one answer, streamed to
//! stdout as it is generated, with a one-line summary on stderr (prompt
//! tokens, prefill and decode speed, why it stopped, peak RSS).
//!
//! The prompt goes through the install's chat template as a user message
//! (after `--system`, if given) unless `--raw`; `--chat-template FILE`
//! replaces the install's template.

use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::process::ExitCode;
use turbospark_text::{Message, Sampler};

use crate::generate::{check_prompt_fits, context_size, with_model, GenArgs, Generator, Text};
use crate::loading::ModelTask;
use turbospark_backend::Device;
use turbospark_engine::Model;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The prompt text.
    #[arg(
        long,
        conflicts_with = "prompt_file",
        required_unless_present = "prompt_file"
    )]
    pub prompt: Option<String>,
    /// Read the prompt from a file (UTF-8).
    #[arg(long, value_name = "FILE")]
    pub prompt_file: Option<PathBuf>,
    /// Feed the prompt as it is, without the chat template.
    #[arg(long)]
    pub raw: bool,
    /// Debugging: write the prompt's token ids (after the chat template) to
    /// stderr as `prompt ids: 1,2,3`.
    #[arg(long, hide = true)]
    pub print_prompt_ids: bool,
    /// Debugging: write the generated token ids (including a final
    /// end-of-generation token) to stderr as `ids: 1,2,3`.
    #[arg(long, hide = true)]
    pub print_token_ids: bool,
    #[command(flatten)]
    pub gen: GenArgs,
}

/// Reads a prompt file, naming the file and the byte offset of invalid UTF-8.
pub fn read_prompt_file(path: &std::path::Path) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    match String::from_utf8(bytes) {
        Ok(s) => Ok(s),
        Err(e) => bail!(
            "prompt file {} is not valid UTF-8: invalid byte sequence at byte offset {}",
            path.display(),
            e.utf8_error().valid_up_to()
        ),
    }
}

pub fn run(a: Args) -> Result<ExitCode> {
    let g = &a.gen;
    let prompt = match (&a.prompt, &a.prompt_file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => read_prompt_file(f)?,
        (None, None) => bail!("give --prompt TEXT or --prompt-file FILE"),
    };
    let text = Text::load(&g.model, g.chat_template.as_deref())?;
    let t_prompt = std::time::Instant::now();
    let tokens = if a.raw {
        if g.system.is_some() {
            bail!("--system needs the chat template; it cannot be used with --raw");
        }
        text.raw_tokens(&prompt)?
    } else {
        let template = text.require_template(&g.model)?;
        let mut messages = Vec::new();
        if let Some(s) = &g.system {
            messages.push(Message::new("system", s.clone()));
        }
        messages.push(Message::new("user", prompt));
        text.chat_tokens(template, &messages)?
    };
    let prompt_secs = t_prompt.elapsed().as_secs_f64();

    if a.print_prompt_ids {
        eprintln!("prompt ids: {}", join_ids(&tokens));
    }

    with_model(
        g,
        Answer {
            args: &a,
            text: &text,
            tokens: &tokens,
            prompt_secs,
        },
    )?;
    Ok(ExitCode::SUCCESS)
}

/// Generating the answer, on whichever device holds the model.
struct Answer<'a> {
    args: &'a Args,
    text: &'a Text,
    tokens: &'a [u32],
    prompt_secs: f64,
}

impl ModelTask for Answer<'_> {
    type Output = ();

    fn run<D: Device>(self, model: Model<D>) -> Result<()> {
        let Answer {
            args: a,
            text,
            tokens,
            prompt_secs,
        } = self;
        let g = &a.gen;
        let context = context_size(g, &model)?;
        check_prompt_fits(tokens.len(), context)?;
        let mut sampler = Sampler::new(g.sampler_config(), model.vocab_size())?;
        let mut generator = Generator::with_probes(&model, context, g)?;
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        let mut gen = generator.generate(
            tokens,
            &text.tokenizer,
            &mut sampler,
            &g.stops,
            g.max_tokens,
            None,
            &mut out,
        )?;
        use std::io::Write;
        writeln!(out).ok();
        drop(out);
        generator.finish_probes(g)?;
        g.experts.report(
            generator.session.expert_stats(),
            generator.session.router_histogram(),
        )?;
        if a.print_token_ids {
            eprintln!("ids: {}", join_ids(&gen.ids));
        }
        gen.stats.phases.prompt = prompt_secs;
        eprintln!("{}", gen.stats.summary());
        if g.timings {
            eprintln!("{}", gen.stats.timings());
        }
        Ok(())
    }
}

fn join_ids(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}
