//! `turbospark serve`: an OpenAI- and Anthropic-compatible HTTP server with
//! continuous batching.
//!
//! - [`http`]: the endpoints (axum on a tokio runtime), API key, body limit,
//!   responses whole or as server-sent events; requests are parsed by
//!   [`request`] and fail in their API's error shape ([`error`]).
//! - [`engine`]: the scheduler, on a thread of its own, that owns the model
//!   and decodes up to `parallel` sequences together in one forward pass
//!   per step, each over its own KV cache.
//! - [`metrics`]: counters and histograms, exposed as Prometheus text.
//!
//! References: the OpenAI API reference (chat completions, completions,
//! models, streaming) and the Anthropic Messages API reference (messages,
//! streaming events, errors).

pub mod engine;
pub mod error;
pub mod http;
pub mod metrics;
pub mod request;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use turbospark_backend::Device;
use turbospark_engine::Model;
use turbospark_text::{ChatTemplate, Tokenizer};

pub use engine::EngineConfig;
pub use error::{ApiError, ServerError};

/// Everything `serve` needs besides the model.
pub struct ServeConfig {
    pub addr: SocketAddr,
    /// The name clients give as `model` (and `/v1/models` lists).
    pub model_id: String,
    pub api_key: Option<String>,
    pub engine: EngineConfig,
    /// Requests waiting for a place before new ones get 429.
    pub queue: usize,
    /// Largest request body, in bytes (over it: 413).
    pub max_body: usize,
    /// Per-request limit, from arrival to the last token.
    pub timeout: Duration,
    /// After a shutdown signal, how long in-flight requests may run before
    /// they are cancelled.
    pub grace: Duration,
}

/// Serves until `shutdown` resolves (or SIGINT/SIGTERM, see
/// [`shutdown_signal`]): stops accepting, lets in-flight requests finish for
/// up to `grace`, cancels what is left, and returns once the scheduler has
/// stopped. `load` builds the model on the scheduler's thread; `ready` is
/// called with the bound address once the server accepts connections.
pub fn serve<D, F>(
    cfg: ServeConfig,
    tokenizer: Tokenizer,
    template: Option<ChatTemplate>,
    load: F,
    shutdown: impl Future<Output = ()> + Send + 'static,
    ready: impl FnOnce(SocketAddr) + Send,
) -> Result<(), ServerError>
where
    D: Device,
    F: FnOnce() -> Result<Model<D>, String> + Send + 'static,
{
    if cfg.engine.parallel == 0 || cfg.queue == 0 || cfg.engine.context < 2 {
        return Err(ServerError::Options(format!(
            "--parallel ({}) and --queue ({}) must be at least 1, --context ({}) at least 2",
            cfg.engine.parallel, cfg.queue, cfg.engine.context
        )));
    }
    let tokenizer = Arc::new(tokenizer);
    let metrics = Arc::new(metrics::Metrics::default());
    let cancel_all = Arc::new(AtomicBool::new(false));
    let (jobs_tx, jobs_rx) = std::sync::mpsc::sync_channel(cfg.queue);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let engine = engine::spawn(
        load,
        tokenizer.clone(),
        cfg.engine,
        jobs_rx,
        metrics.clone(),
        cancel_all.clone(),
        ready_tx,
    )?;
    match ready_rx.recv() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(ServerError::Load(e)),
        Err(_) => return Err(ServerError::EngineGone),
    }

    let state = Arc::new(http::AppState {
        model_id: cfg.model_id,
        tokenizer,
        template,
        context: cfg.engine.context,
        jobs: jobs_tx,
        metrics,
        api_key: cfg.api_key,
        max_body: cfg.max_body,
        timeout: cfg.timeout,
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        next_id: AtomicU64::new(1),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|source| ServerError::Io {
            what: "starting the async runtime".into(),
            source,
        })?;
    let grace = cfg.grace;
    let cancel = cancel_all.clone();
    let served = runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(cfg.addr)
            .await
            .map_err(|source| ServerError::Io {
                what: format!("binding {}", cfg.addr),
                source,
            })?;
        let local = listener.local_addr().map_err(|source| ServerError::Io {
            what: "reading the bound address".into(),
            source,
        })?;
        ready(local);
        let app = http::router(state);
        let signal = async move {
            shutdown.await;
            // In-flight requests get `grace` to finish; then every sequence
            // is cancelled, which ends their streams.
            tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                cancel.store(true, Ordering::Relaxed);
            });
        };
        axum::serve(listener, app)
            .with_graceful_shutdown(signal)
            .await
            .map_err(|source| ServerError::Io {
                what: "serving".into(),
                source,
            })
    });
    // The router (and with it the job sender) is gone: the scheduler ends
    // once its sequences are done; cancel any left.
    cancel_all.store(true, Ordering::Relaxed);
    runtime.shutdown_timeout(Duration::from_secs(1));
    let engine_result = engine.join().map_err(|_| ServerError::EngineGone)?;
    served?;
    engine_result
}

/// Resolves on SIGINT or SIGTERM (Ctrl-C only where there are no Unix
/// signals).
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) {
            (Ok(mut int), Ok(mut term)) => {
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
