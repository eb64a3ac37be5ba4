//! `turbospark serve`: an OpenAI- and Anthropic-compatible HTTP server with
//! continuous batching.
//!
//! - [`http`]: the endpoints (axum on a tokio runtime), API key, body limit,
//!   responses whole or as server-sent events; requests are parsed by
//!   [`request`] and fail in their API's error shape ([`error`]).
//! - [`engine`]: the scheduler, on the thread that loaded the model (never
//!   on the async runtime), that computes up to `parallel` sequences
//!   together in one forward pass per step (decode tokens and prompt
//!   chunks), each over its own KV cache, reusing cached prompt prefixes.
//! - [`steer`]: the control vectors a request may name in its `turbospark`
//!   object.
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
pub mod steer;

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
pub use steer::VectorLibrary;

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
    /// The control vectors requests may name ([`steer`]).
    pub vectors: VectorLibrary,
}

/// Serves `model` until `shutdown` resolves (or SIGINT/SIGTERM, see
/// [`shutdown_signal`]): stops accepting, lets in-flight requests finish for
/// up to `grace`, cancels what is left, and returns once both sides have
/// stopped. The scheduler runs on the calling thread (the one that loaded
/// the model, so a device bound to it stays there); HTTP runs on a thread of
/// its own with a small tokio runtime. `ready` is called with the bound
/// address once the server accepts connections.
pub fn serve<D: Device>(
    cfg: ServeConfig,
    tokenizer: Tokenizer,
    template: Option<ChatTemplate>,
    model: Model<D>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    ready: impl FnOnce(SocketAddr) + Send + 'static,
) -> Result<(), ServerError> {
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
    let state = Arc::new(http::AppState {
        model_id: cfg.model_id,
        tokenizer: tokenizer.clone(),
        template,
        context: cfg.engine.context,
        jobs: jobs_tx,
        metrics: metrics.clone(),
        api_key: cfg.api_key,
        max_body: cfg.max_body,
        timeout: cfg.timeout,
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        next_id: AtomicU64::new(1),
        vectors: cfg.vectors,
        n_layers: model.spec().layers.len(),
        hidden: model.spec().hidden_size,
    });
    let (bound_tx, bound_rx) = std::sync::mpsc::channel();
    let (addr, grace, cancel) = (cfg.addr, cfg.grace, cancel_all.clone());
    // Stops the HTTP side when the scheduler fails.
    let stop = Arc::new(tokio::sync::Notify::new());
    let stop_http = stop.clone();
    let shutdown = async move {
        tokio::select! {
            () = shutdown => {}
            () = stop_http.notified() => {}
        }
    };
    let http_thread = std::thread::Builder::new()
        .name("turbospark-http".into())
        .spawn(move || -> Result<(), ServerError> {
            let result = serve_http(state, addr, grace, &cancel, shutdown, |local| {
                let _ = bound_tx.send(Ok(local));
                ready(local);
            });
            if let Err(e) = &result {
                let _ = bound_tx.send(Err(e.to_string()));
            }
            // The router (and with it the job sender) is gone: the
            // scheduler ends once its sequences are done; cancel any left.
            cancel.store(true, Ordering::Relaxed);
            result
        })
        .map_err(|source| ServerError::Io {
            what: "starting the HTTP thread".into(),
            source,
        })?;
    let engine_result = match bound_rx.recv() {
        Ok(Ok(_)) => engine::run(
            &model,
            &tokenizer,
            cfg.engine,
            jobs_rx,
            &metrics,
            &cancel_all,
        ),
        // Binding failed: the HTTP thread's own error says why.
        Ok(Err(_)) | Err(_) => Ok(()),
    };
    if engine_result.is_err() {
        // Nothing can be served any more: stop accepting.
        cancel_all.store(true, Ordering::Relaxed);
        stop.notify_one();
    }
    let http_result = http_thread.join().map_err(|_| ServerError::HttpGone)?;
    http_result?;
    engine_result
}

/// The HTTP side: binds, serves until `shutdown`, then lets in-flight
/// requests run for `grace` before `cancel` ends every sequence.
fn serve_http(
    state: Arc<http::AppState>,
    addr: SocketAddr,
    grace: Duration,
    cancel: &Arc<AtomicBool>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), ServerError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|source| ServerError::Io {
            what: "starting the async runtime".into(),
            source,
        })?;
    let cancel = cancel.clone();
    let served = runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| ServerError::Io {
                what: format!("binding {addr}"),
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
    runtime.shutdown_timeout(Duration::from_secs(1));
    served
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
