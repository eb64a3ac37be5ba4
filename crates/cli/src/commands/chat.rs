//! `turbospark chat --model DIR`: a conversation on stdin/stdout.
//!
//! Each turn re-renders the chat template over the whole history; when the
//! new prompt's tokens extend what the KV cache holds (the usual case: the
//! previous prompt and the answer as generated), only the new tokens are
//! prefilled, otherwise the conversation is prefilled again. `/reset` forgets
//! the conversation, `/exit` (or end of input) leaves. Ctrl-C during an
//! answer stops that answer and returns to the prompt; Ctrl-C at the prompt
//! leaves.

use anyhow::{bail, Result};
use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use turbospark_text::{Message, Sampler};

use crate::generate::{context_size, with_model, GenArgs, Generator, StopReason, Text};
use crate::loading::ModelTask;
use turbospark_backend::Device;
use turbospark_engine::Model;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub gen: GenArgs,
}

/// Set by SIGINT while an answer is being generated.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);
/// Whether an answer is being generated (SIGINT stops it) or the REPL waits
/// for input (SIGINT leaves).
static GENERATING: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    if GENERATING.load(Ordering::SeqCst) {
        INTERRUPTED.store(true, Ordering::SeqCst);
    } else {
        // SAFETY: write(2) and _exit(2) are async-signal-safe; the buffer is
        // a static byte string.
        unsafe {
            libc::write(2, b"\n".as_ptr().cast(), 1);
            libc::_exit(130);
        }
    }
}

fn install_sigint_handler() -> Result<()> {
    // SAFETY: a zeroed sigaction is a valid initial value; the handler only
    // touches atomics and async-signal-safe calls; sigemptyset and sigaction
    // get valid pointers to that local struct.
    let rc = unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut())
    };
    if rc != 0 {
        bail!(
            "installing the SIGINT handler: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

pub fn run(a: Args) -> Result<ExitCode> {
    let g = &a.gen;
    let text = Text::load(&g.model, g.chat_template.as_deref())?;
    let template = text.require_template(&g.model)?;
    with_model(
        g,
        Conversation {
            args: &a,
            text: &text,
            template,
        },
    )?;
    Ok(ExitCode::SUCCESS)
}

/// The conversation loop, on whichever device holds the model.
struct Conversation<'a> {
    args: &'a Args,
    text: &'a Text,
    template: &'a turbospark_text::ChatTemplate,
}

impl ModelTask for Conversation<'_> {
    type Output = ();

    fn run<D: Device>(self, model: Model<D>) -> Result<()> {
        let Conversation {
            args: a,
            text,
            template,
        } = self;
        let g = &a.gen;
        let context = context_size(g, &model)?;
        let mut sampler = Sampler::new(g.sampler_config(), model.vocab_size())?;
        let mut generator = Generator::with_probes(&model, context, g)?;
        install_sigint_handler()?;

        let system: Vec<Message> = g
            .system
            .iter()
            .map(|s| Message::new("system", s.clone()))
            .collect();
        let mut history = system.clone();
        eprintln!(
            "chat with {} — /reset forgets the conversation, /exit leaves; Ctrl-C stops an answer",
            g.model.display()
        );
        let stdin = std::io::stdin();
        let mut input = stdin.lock();
        let mut line = String::new();
        loop {
            eprint!("> ");
            std::io::stderr().flush().ok();
            line.clear();
            if input.read_line(&mut line)? == 0 {
                eprintln!();
                break;
            }
            let msg = line.trim_end_matches(['\n', '\r']);
            match msg.trim() {
                "" => continue,
                "/exit" | "/quit" => break,
                "/reset" => {
                    history = system.clone();
                    generator.reset();
                    sampler.reset();
                    eprintln!("(conversation reset)");
                    continue;
                }
                _ => {}
            }
            history.push(Message::new("user", msg));
            let t_prompt = std::time::Instant::now();
            let tokens = match text.chat_tokens(template, &history) {
                Ok(t) => t,
                Err(e) => {
                    history.pop();
                    eprintln!("error: {e:#}");
                    continue;
                }
            };
            let prompt_secs = t_prompt.elapsed().as_secs_f64();
            INTERRUPTED.store(false, Ordering::SeqCst);
            GENERATING.store(true, Ordering::SeqCst);
            let stdout = std::io::stdout();
            let mut out = stdout.lock();
            let result = generator.generate(
                &tokens,
                &text.tokenizer,
                &mut sampler,
                &g.stops,
                g.max_tokens,
                Some(&INTERRUPTED),
                &mut out,
            );
            GENERATING.store(false, Ordering::SeqCst);
            writeln!(out).ok();
            drop(out);
            match result {
                Ok(mut gen) => {
                    if gen.stats.stop == StopReason::Interrupted {
                        eprintln!("(answer stopped)");
                    }
                    gen.stats.phases.prompt = prompt_secs;
                    eprintln!("{}", gen.stats.summary());
                    if g.timings {
                        eprintln!("{}", gen.stats.timings());
                    }
                    history.push(Message::new("assistant", gen.text));
                }
                Err(e) => {
                    // Too long a conversation, most often: drop the turn.
                    history.pop();
                    eprintln!("error: {e:#}");
                }
            }
        }
        generator.finish_probes(g)?;
        Ok(())
    }
}
