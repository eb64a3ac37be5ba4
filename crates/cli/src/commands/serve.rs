//! `turbospark serve --model DIR`: the OpenAI- and Anthropic-compatible
//! HTTP server (crate `turbospark-server`). This module only turns the
//! options into a [`ServeConfig`], loads the tokenizer and chat template,
//! opens the model on the device `--backend` names the way every other
//! command does ([`crate::loading::with_model`]), and hands it to the
//! server, whose scheduler then runs on this thread.

use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use turbospark_backend::Device;
use turbospark_engine::{ControlVector, Model};
use turbospark_server::{EngineConfig, ServeConfig, VectorLibrary};

use crate::experts::ExpertArgs;
use crate::generate::{Text, DEFAULT_CONTEXT_CAP};
use crate::loading::{with_model, DeviceArgs, ModelTask};
use crate::numerics::{self, NumericsArg};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The install directory (made by `turbospark convert`).
    #[arg(long)]
    pub model: PathBuf,
    /// Address to listen on. Loopback by default; another address without
    /// an API key prints a warning.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require this key as `Authorization: Bearer KEY` or `x-api-key: KEY`
    /// (default: the environment variable TURBOSPARK_API_KEY, if set).
    #[arg(long)]
    pub api_key: Option<String>,
    /// Sequences decoded together (each with its own KV cache).
    #[arg(long, default_value_t = 4)]
    pub parallel: usize,
    /// Requests that may wait for a place; more get 429 with Retry-After.
    #[arg(long, default_value_t = 64)]
    pub queue: usize,
    /// KV cache positions of each sequence (prompt + answer). Default: the
    /// model's maximum position, capped at 4096.
    #[arg(long)]
    pub context: Option<usize>,
    /// The name clients give as `model` (default: the install directory's name).
    #[arg(long)]
    pub model_name: Option<String>,
    /// Seconds a request may take, from arrival to its last token.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Largest request body in bytes (larger: 413).
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body: usize,
    /// After SIGINT/SIGTERM, seconds in-flight requests may still run.
    #[arg(long, default_value_t = 10)]
    pub grace: u64,
    /// A Jinja chat template file, or a built-in template's name, to use
    /// instead of the install's.
    #[arg(long, value_name = "FILE|NAME")]
    pub chat_template: Option<String>,
    /// Compute threads (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Arithmetic: exact, llama-cpp or fast (--help says more).
    #[arg(long, value_enum, default_value = "fast", long_help = numerics::HELP)]
    pub numerics: NumericsArg,
    #[command(flatten)]
    pub device: DeviceArgs,
    #[command(flatten)]
    pub experts: ExpertArgs,
    /// Control vectors steering every answer (as `run`'s), unless a
    /// request brings its own.
    #[command(flatten)]
    pub steer: crate::probe::SteerArgs,
    /// A control vector (llama.cpp's GGUF format) that requests may name in
    /// their `turbospark.control_vectors` (repeatable).
    #[arg(long, value_name = "NAME=FILE")]
    pub request_control_vector: Vec<String>,
    /// A directory whose control-vector files requests may name (by file
    /// name, with or without `.gguf`).
    #[arg(long, value_name = "DIR")]
    pub request_control_vector_dir: Option<PathBuf>,
}

/// The control vectors requests may name.
fn vector_library(a: &Args) -> Result<VectorLibrary> {
    let mut named = BTreeMap::new();
    for arg in &a.request_control_vector {
        let Some((name, file)) = arg.split_once('=') else {
            bail!("--request-control-vector {arg}: expected NAME=FILE");
        };
        if name.is_empty() || named.contains_key(name) {
            bail!("--request-control-vector {arg}: the name is empty or given twice");
        }
        let cv = ControlVector::read_gguf(Path::new(file))
            .with_context(|| format!("reading control vector {file}"))?;
        named.insert(name.to_string(), cv);
    }
    let dir = a.request_control_vector_dir.clone();
    if let Some(d) = &dir {
        if !d.is_dir() {
            bail!(
                "--request-control-vector-dir {}: not a directory",
                d.display()
            );
        }
    }
    VectorLibrary::new(named, dir).context("--request-control-vector-dir")
}

/// The server, once the model is open.
struct Serve {
    cfg: ServeConfig,
    text: Text,
}

impl ModelTask for Serve {
    type Output = ();
    fn run<D: Device>(self, model: Model<D>) -> Result<()> {
        let (id, parallel, context) = (
            self.cfg.model_id.clone(),
            self.cfg.engine.parallel,
            self.cfg.engine.context,
        );
        turbospark_server::serve(
            self.cfg,
            self.text.tokenizer,
            self.text.template,
            model,
            turbospark_server::shutdown_signal(),
            move |addr| {
                eprintln!(
                    "serving {id} on http://{addr} ({parallel} parallel sequences of \
                     {context} positions); Ctrl-C stops"
                );
            },
        )
        .context("serve")
    }
}

pub fn run(a: Args) -> Result<ExitCode> {
    let text = Text::load(&a.model, a.chat_template.as_deref())?;
    let vectors = vector_library(&a)?;
    let install = turbospark_format::install::Install::open(&a.model)?;
    let max = install.manifest.arch.max_position;
    let context = match a.context {
        Some(c) if c < 2 => bail!("--context must be at least 2"),
        Some(c) => c,
        None if max == 0 => DEFAULT_CONTEXT_CAP,
        None => max.min(DEFAULT_CONTEXT_CAP),
    };
    drop(install);
    let api_key = a
        .api_key
        .or_else(|| std::env::var("TURBOSPARK_API_KEY").ok())
        .filter(|k| !k.is_empty());
    if !a.host.is_loopback() && api_key.is_none() {
        eprintln!(
            "warning: listening on {} without an API key: anyone who can reach this address \
             can use the model (set --api-key or TURBOSPARK_API_KEY)",
            a.host
        );
    }
    let model_id = match a.model_name {
        Some(n) => n,
        None => a
            .model
            .canonicalize()
            .unwrap_or_else(|_| a.model.clone())
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into()),
    };
    let cfg = ServeConfig {
        addr: SocketAddr::new(a.host, a.port),
        model_id,
        api_key,
        engine: EngineConfig {
            parallel: a.parallel,
            context,
            steering: a.steer.steering()?,
        },
        queue: a.queue,
        max_body: a.max_body,
        timeout: Duration::from_secs(a.timeout),
        grace: Duration::from_secs(a.grace),
        vectors,
    };
    let experts = a.experts.options(a.device.backend)?;
    with_model(
        &a.model,
        &a.device,
        a.threads,
        a.numerics.into(),
        &experts,
        Serve { cfg, text },
    )?;
    eprintln!("server stopped");
    Ok(ExitCode::SUCCESS)
}
