//! The HTTP surface (axum): routes, API-key check, body limit, and the
//! responses of each endpoint, streamed as server-sent events or whole.
//!
//! - `POST /v1/chat/completions`, `POST /v1/completions`: OpenAI's shapes
//!   (`chat.completion`, `chat.completion.chunk`, `text_completion`); a
//!   stream is `data: {json}\n\n` frames ending in `data: [DONE]\n\n`, with a
//!   last chunk carrying `usage` when `stream_options.include_usage` is set.
//! - `POST /v1/messages`: Anthropic's `message`, or its event stream
//!   (`event: NAME\ndata: {json}\n\n`): `message_start`,
//!   `content_block_start`, `ping`, `content_block_delta`…,
//!   `content_block_stop`, `message_delta`, `message_stop`.
//! - `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus text).
//! - `GET /`: a chat page (embedded, nothing fetched from elsewhere) that
//!   streams answers and polls `GET /stats` (JSON) for its live panel.
//!
//! The key (when set) is accepted as `Authorization: Bearer KEY` and as
//! `x-api-key: KEY`; `/health` needs none. The HTTP side only parses,
//! tokenizes and queues: generation is the scheduler's ([`crate::engine`]),
//! on its own thread.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{Request as HttpRequest, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use turbospark_text::{chat_prompt_tokens, ChatTemplate, SamplerConfig, Tokenizer};

use crate::engine::{Event, Finish, GenParams, Job};
use crate::error::{json_response, ApiError, Dialect, ErrorKind};
use crate::metrics::Metrics;
use crate::request::{Input, Request};

/// What every handler shares.
pub struct AppState {
    /// The name clients give as `model`.
    pub model_id: String,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Option<ChatTemplate>,
    /// KV positions of each sequence.
    pub context: usize,
    pub jobs: SyncSender<Job>,
    pub metrics: Arc<Metrics>,
    pub api_key: Option<String>,
    /// Largest accepted request body, in bytes.
    pub max_body: usize,
    /// Per-request limit, from arrival to the last token.
    pub timeout: Duration,
    pub created: u64,
    pub next_id: AtomicU64,
    /// The control vectors requests may name.
    pub vectors: crate::steer::VectorLibrary,
    /// The model's decoder layers and hidden size (to check vectors).
    pub n_layers: usize,
    pub hidden: usize,
}

type Shared = Arc<AppState>;

/// The router of every endpoint.
pub fn router(state: Shared) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/messages", post(messages))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/stats", get(stats))
        .route("/", get(page))
        .fallback(fallback)
        .method_not_allowed_fallback(fallback)
        .with_state(state)
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Compares without stopping at the first differing byte.
fn same_key(given: &[u8], key: &[u8]) -> bool {
    given.len() == key.len() && given.iter().zip(key).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

fn check_key(state: &AppState, headers: &HeaderMap, dialect: Dialect) -> Result<(), ApiError> {
    let Some(key) = &state.api_key else {
        return Ok(());
    };
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let x_api_key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    let ok = [bearer, x_api_key]
        .into_iter()
        .flatten()
        .any(|g| same_key(g.as_bytes(), key.as_bytes()));
    if ok {
        Ok(())
    } else {
        let message = if bearer.is_none() && x_api_key.is_none() {
            "an API key is required (Authorization: Bearer KEY or x-api-key: KEY)"
        } else {
            "the API key is not valid"
        };
        Err(ApiError::new(dialect, ErrorKind::Authentication, message))
    }
}

async fn read_body(
    state: &AppState,
    req: HttpRequest,
    dialect: Dialect,
) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            dialect,
            ErrorKind::TooLarge,
            format!(
                "the request body is over the limit of {} bytes",
                state.max_body
            ),
        )
    };
    if let Some(len) = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    {
        if len > state.max_body as u64 {
            return Err(too_large());
        }
    }
    // Read frame by frame so that a body without a length (chunked) stops
    // being read as soon as it passes the limit.
    let mut frames = req.into_body().into_data_stream();
    let mut body = Vec::new();
    while let Some(frame) = frames.next().await {
        let frame = frame
            .map_err(|e| ApiError::invalid(dialect, format!("reading the request body: {e}")))?;
        if body.len() + frame.len() > state.max_body {
            return Err(too_large());
        }
        body.extend_from_slice(&frame);
    }
    Ok(Bytes::from(body))
}

/// Which endpoint a generation request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Chat,
    Completion,
    Messages,
}

impl Endpoint {
    fn dialect(self) -> Dialect {
        match self {
            Endpoint::Messages => Dialect::Anthropic,
            _ => Dialect::OpenAi,
        }
    }
    fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completion => "/v1/completions",
            Endpoint::Messages => "/v1/messages",
        }
    }
}

async fn chat_completions(State(s): State<Shared>, req: HttpRequest) -> Response {
    generate(s, req, Endpoint::Chat).await
}
async fn completions(State(s): State<Shared>, req: HttpRequest) -> Response {
    generate(s, req, Endpoint::Completion).await
}
async fn messages(State(s): State<Shared>, req: HttpRequest) -> Response {
    generate(s, req, Endpoint::Messages).await
}

async fn generate(state: Shared, req: HttpRequest, endpoint: Endpoint) -> Response {
    let response = match start(&state, req, endpoint).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    };
    state
        .metrics
        .request(endpoint.path(), response.status().as_u16());
    response
}

/// A request accepted by the scheduler.
struct Accepted {
    id: String,
    events: mpsc::UnboundedReceiver<Event>,
    prompt_tokens: usize,
    stream: bool,
    include_usage: bool,
}

async fn start(state: &Shared, req: HttpRequest, endpoint: Endpoint) -> Result<Response, ApiError> {
    let dialect = endpoint.dialect();
    let arrived = Instant::now();
    check_key(state, req.headers(), dialect)?;
    let body = read_body(state, req, dialect).await?;
    let request = match endpoint {
        Endpoint::Chat => Request::chat(&body)?,
        Endpoint::Completion => Request::completion(&body)?,
        Endpoint::Messages => Request::messages(&body)?,
    };
    if let Some(m) = &request.model {
        if m != &state.model_id {
            return Err(ApiError::new(
                dialect,
                ErrorKind::NotFound,
                format!(
                    "the model `{m}` does not exist; this server has `{}`",
                    state.model_id
                ),
            )
            .with_param("model"));
        }
    }
    let prompt = prompt_tokens(state, &request.input, dialect)?;
    if prompt.is_empty() {
        return Err(ApiError::invalid(
            dialect,
            "the prompt is empty (no tokens)",
        ));
    }
    if prompt.len() >= state.context {
        return Err(ApiError::new(
            dialect,
            ErrorKind::ContextLength,
            format!(
                "the prompt is {} tokens but the context holds {} positions (prompt + answer)",
                prompt.len(),
                state.context
            ),
        ));
    }
    let room = state.context - prompt.len();
    let max_tokens = request.max_tokens.unwrap_or(room);
    let seed = request.seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    });
    let params = GenParams {
        sampler: SamplerConfig {
            temperature: request.temperature,
            top_k: request.top_k,
            top_p: request.top_p,
            min_p: request.min_p,
            repeat_penalty: request.repeat_penalty,
            presence_penalty: request.presence_penalty,
            frequency_penalty: request.frequency_penalty,
            seed,
            ..SamplerConfig::default()
        },
        max_tokens,
        stops: request.stops.clone(),
    };
    let steering = request
        .steer
        .as_ref()
        .map(|s| {
            state
                .vectors
                .resolve(dialect, s, state.n_layers, state.hidden)
        })
        .transpose()?;
    let (tx, rx) = mpsc::unbounded_channel();
    let prompt_tokens = prompt.len();
    let job = Job {
        prompt,
        params,
        steering,
        events: tx,
        deadline: arrived + state.timeout,
    };
    state.metrics.enqueued();
    match state.jobs.try_send(job) {
        Ok(()) => {}
        Err(TrySendError::Full(_)) => {
            state.metrics.dequeued();
            return Err(ApiError::new(
                dialect,
                ErrorKind::RateLimited,
                "the server's queue is full; retry later",
            ));
        }
        Err(TrySendError::Disconnected(_)) => {
            state.metrics.dequeued();
            return Err(ApiError::new(
                dialect,
                ErrorKind::Unavailable,
                "the server is shutting down",
            ));
        }
    }
    state.metrics.prompt(prompt_tokens);
    let n = state.next_id.fetch_add(1, Ordering::Relaxed);
    let id = match endpoint {
        Endpoint::Chat => format!("chatcmpl-{n:016x}"),
        Endpoint::Completion => format!("cmpl-{n:016x}"),
        Endpoint::Messages => format!("msg_{n:016x}"),
    };
    let accepted = Accepted {
        id,
        events: rx,
        prompt_tokens,
        stream: request.stream,
        include_usage: request.include_usage,
    };
    if accepted.stream {
        Ok(stream_response(state.clone(), accepted, endpoint))
    } else {
        whole_response(state, accepted, endpoint).await
    }
}

/// The prompt's tokens: a conversation rendered with the chat template
/// ([`chat_prompt_tokens`], as `turbospark run` builds it), or raw text.
fn prompt_tokens(state: &AppState, input: &Input, dialect: Dialect) -> Result<Vec<u32>, ApiError> {
    let tok = &state.tokenizer;
    match input {
        Input::Raw(text) => tok
            .encode(text, true)
            .map_err(|e| ApiError::invalid(dialect, format!("tokenizing the prompt: {e}"))),
        Input::Chat(messages) => {
            let Some(template) = &state.template else {
                return Err(ApiError::invalid(
                    dialect,
                    "the model has no chat template; use /v1/completions with a raw prompt",
                ));
            };
            chat_prompt_tokens(tok, template, messages)
                .map_err(|e| ApiError::invalid(dialect, format!("building the prompt: {e}")))
        }
    }
}

fn timed_out(dialect: Dialect, state: &AppState) -> ApiError {
    ApiError::new(
        dialect,
        ErrorKind::Timeout,
        format!(
            "the request ran past the server's limit of {} s",
            state.timeout.as_secs()
        ),
    )
}

/// Waits for the whole answer and returns it in one body.
async fn whole_response(
    state: &Shared,
    mut a: Accepted,
    endpoint: Endpoint,
) -> Result<Response, ApiError> {
    let dialect = endpoint.dialect();
    let mut text = String::new();
    let (finish, completion_tokens) = loop {
        match a.events.recv().await {
            Some(Event::Started) => {}
            Some(Event::Text(t)) => text.push_str(&t),
            Some(Event::Done {
                finish,
                completion_tokens,
                ..
            }) => break (finish, completion_tokens),
            Some(Event::TimedOut) => return Err(timed_out(dialect, state)),
            Some(Event::Failed(e)) => return Err(ApiError::new(dialect, ErrorKind::Internal, e)),
            None => {
                return Err(ApiError::new(
                    dialect,
                    ErrorKind::Unavailable,
                    "the request was cancelled (the server is shutting down)",
                ))
            }
        }
    };
    let created = unix_now();
    let model = &state.model_id;
    let body = match endpoint {
        Endpoint::Chat => json!({
            "id": a.id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": null,
                "finish_reason": openai_finish(&finish),
            }],
            "usage": openai_usage(a.prompt_tokens, completion_tokens),
        }),
        Endpoint::Completion => json!({
            "id": a.id, "object": "text_completion", "created": created, "model": model,
            "choices": [{
                "index": 0, "text": text, "logprobs": null,
                "finish_reason": openai_finish(&finish),
            }],
            "usage": openai_usage(a.prompt_tokens, completion_tokens),
        }),
        Endpoint::Messages => {
            let (reason, seq) = anthropic_finish(&finish);
            json!({
                "id": a.id, "type": "message", "role": "assistant", "model": model,
                "content": [{"type": "text", "text": text}],
                "stop_reason": reason, "stop_sequence": seq,
                "usage": {"input_tokens": a.prompt_tokens, "output_tokens": completion_tokens},
            })
        }
    };
    Ok(json_response(StatusCode::OK, &body))
}

fn openai_finish(f: &Finish) -> &'static str {
    match f {
        Finish::Eos | Finish::Stop(_) => "stop",
        Finish::MaxTokens | Finish::ContextFull => "length",
    }
}

fn anthropic_finish(f: &Finish) -> (&'static str, Option<&str>) {
    match f {
        Finish::Eos => ("end_turn", None),
        Finish::Stop(s) => ("stop_sequence", Some(s.as_str())),
        Finish::MaxTokens | Finish::ContextFull => ("max_tokens", None),
    }
}

fn openai_usage(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

/// Streams the answer as server-sent events. A task turns the scheduler's
/// events into frames; when the client goes away the body (and with it the
/// frame channel) is dropped, the task stops and drops the event receiver,
/// which the scheduler sees at its next step.
fn stream_response(state: Shared, a: Accepted, endpoint: Endpoint) -> Response {
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::convert::Infallible>>(64);
    tokio::spawn(async move {
        let mut framer = Framer {
            state: &state,
            endpoint,
            id: a.id.clone(),
            created: unix_now(),
            include_usage: a.include_usage,
            prompt_tokens: a.prompt_tokens,
        };
        let mut events = a.events;
        for f in framer.opening() {
            if tx.send(Ok(f)).await.is_err() {
                return;
            }
        }
        loop {
            let ev = tokio::select! {
                ev = events.recv() => ev,
                () = tx.closed() => return,
            };
            let (frames, done) = framer.frames(ev);
            for f in frames {
                if tx.send(Ok(f)).await.is_err() {
                    return;
                }
            }
            if done {
                return;
            }
        }
    });
    let mut r = Response::new(Body::from_stream(ReceiverStream::new(rx)));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        "text/event-stream".parse().expect("static header"),
    );
    h.insert(
        header::CACHE_CONTROL,
        "no-cache".parse().expect("static header"),
    );
    r
}

/// Turns scheduler events into one API's SSE frames.
struct Framer<'a> {
    state: &'a AppState,
    endpoint: Endpoint,
    id: String,
    created: u64,
    include_usage: bool,
    prompt_tokens: usize,
}

fn data(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

fn event(name: &str, v: &Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {v}\n\n"))
}

impl Framer<'_> {
    fn chunk(&self, delta: Value, finish: Option<&str>) -> Value {
        match self.endpoint {
            Endpoint::Completion => json!({
                "id": self.id, "object": "text_completion", "created": self.created,
                "model": self.state.model_id,
                "choices": [{"index": 0, "text": delta.get("content").cloned().unwrap_or(json!("")),
                             "logprobs": null, "finish_reason": finish}],
            }),
            _ => json!({
                "id": self.id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.state.model_id,
                "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
            }),
        }
    }

    fn opening(&self) -> Vec<Bytes> {
        match self.endpoint {
            Endpoint::Chat => vec![data(
                &self.chunk(json!({"role": "assistant", "content": ""}), None),
            )],
            Endpoint::Completion => vec![],
            Endpoint::Messages => vec![
                event(
                    "message_start",
                    &json!({"type": "message_start", "message": {
                        "id": self.id, "type": "message", "role": "assistant", "content": [],
                        "model": self.state.model_id, "stop_reason": null, "stop_sequence": null,
                        "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0},
                    }}),
                ),
                event(
                    "content_block_start",
                    &json!({"type": "content_block_start", "index": 0,
                            "content_block": {"type": "text", "text": ""}}),
                ),
                event("ping", &json!({"type": "ping"})),
            ],
        }
    }

    /// The frames for one event, and whether the stream ends.
    fn frames(&mut self, ev: Option<Event>) -> (Vec<Bytes>, bool) {
        let anthropic = self.endpoint == Endpoint::Messages;
        match ev {
            Some(Event::Started) => (vec![], false),
            Some(Event::Text(t)) => {
                let f = if anthropic {
                    event(
                        "content_block_delta",
                        &json!({"type": "content_block_delta", "index": 0,
                                "delta": {"type": "text_delta", "text": t}}),
                    )
                } else {
                    data(&self.chunk(json!({"content": t}), None))
                };
                (vec![f], false)
            }
            Some(Event::Done {
                finish,
                completion_tokens,
                ..
            }) => {
                if anthropic {
                    let (reason, seq) = anthropic_finish(&finish);
                    (
                        vec![
                            event(
                                "content_block_stop",
                                &json!({"type": "content_block_stop", "index": 0}),
                            ),
                            event(
                                "message_delta",
                                &json!({"type": "message_delta",
                                        "delta": {"stop_reason": reason, "stop_sequence": seq},
                                        "usage": {"output_tokens": completion_tokens}}),
                            ),
                            event("message_stop", &json!({"type": "message_stop"})),
                        ],
                        true,
                    )
                } else {
                    let mut out = vec![data(&self.chunk(json!({}), Some(openai_finish(&finish))))];
                    if self.include_usage {
                        let mut last = self.chunk(json!({}), None);
                        last["choices"] = json!([]);
                        last["usage"] = openai_usage(self.prompt_tokens, completion_tokens);
                        out.push(data(&last));
                    }
                    out.push(Bytes::from_static(b"data: [DONE]\n\n"));
                    (out, true)
                }
            }
            Some(Event::TimedOut) => (
                vec![self.error(&timed_out(self.endpoint.dialect(), self.state))],
                true,
            ),
            Some(Event::Failed(e)) => (
                vec![self.error(&ApiError::new(
                    self.endpoint.dialect(),
                    ErrorKind::Internal,
                    e,
                ))],
                true,
            ),
            None => (
                vec![self.error(&ApiError::new(
                    self.endpoint.dialect(),
                    ErrorKind::Unavailable,
                    "the request was cancelled (the server is shutting down)",
                ))],
                true,
            ),
        }
    }

    /// An error after the stream began: OpenAI sends the error object as a
    /// data frame, Anthropic as an `error` event.
    fn error(&self, e: &ApiError) -> Bytes {
        match self.endpoint {
            Endpoint::Messages => event("error", &e.body()),
            _ => data(&e.body()),
        }
    }
}

async fn models(State(state): State<Shared>, headers: HeaderMap) -> Response {
    let r = match check_key(&state, &headers, Dialect::OpenAi) {
        Err(e) => e.into_response(),
        Ok(()) => json_response(
            StatusCode::OK,
            &json!({"object": "list", "data": [{
                "id": state.model_id, "object": "model", "created": state.created,
                "owned_by": "turbospark",
                "context_length": state.context,
            }]}),
        ),
    };
    state.metrics.request("/v1/models", r.status().as_u16());
    r
}

async fn health(State(state): State<Shared>) -> Response {
    json_response(
        StatusCode::OK,
        &json!({
            "status": "ok",
            "active_sequences": state.metrics.active(),
            "queue_depth": state.metrics.queue_depth(),
        }),
    )
}

async fn metrics(State(state): State<Shared>, headers: HeaderMap) -> Response {
    if let Err(e) = check_key(&state, &headers, Dialect::OpenAi) {
        return e.into_response();
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

/// The chat page: one HTML file with its script and style inline, nothing
/// fetched from elsewhere.
async fn page() -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        include_str!("page.html"),
    )
        .into_response()
}

/// The page's live panel: decode speed, sequences, expert cache.
async fn stats(State(state): State<Shared>, headers: HeaderMap) -> Response {
    if let Err(e) = check_key(&state, &headers, Dialect::OpenAi) {
        return e.into_response();
    }
    let mut v = state.metrics.snapshot();
    v["model"] = json!(state.model_id);
    json_response(StatusCode::OK, &v)
}

async fn fallback(State(state): State<Shared>, method: Method, uri: axum::http::Uri) -> Response {
    let dialect = if uri.path().starts_with("/v1/messages") {
        Dialect::Anthropic
    } else {
        Dialect::OpenAi
    };
    let known = [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/messages",
        "/v1/models",
        "/health",
        "/metrics",
    ];
    let e = if known.contains(&uri.path()) {
        ApiError::new(
            dialect,
            ErrorKind::MethodNotAllowed,
            format!("{method} is not allowed on {}", uri.path()),
        )
    } else {
        ApiError::new(
            dialect,
            ErrorKind::NotFound,
            format!("no such endpoint: {method} {}", uri.path()),
        )
    };
    let r = e.into_response();
    state.metrics.request("other", r.status().as_u16());
    r
}
