//! Errors: [`ServerError`] for starting and running the server, and
//! [`ApiError`], a failed request, rendered in the error shape of the API
//! the client speaks:
//!
//! - OpenAI (`platform.openai.com/docs/guides/error-codes`, the shape the
//!   `openai` client parses): `{"error": {"message", "type", "param", "code"}}`;
//! - Anthropic (`docs.anthropic.com/en/api/errors`):
//!   `{"type": "error", "error": {"type", "message"}}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use turbospark_engine::EngineError;

/// Starting or running the server failed.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("the HTTP thread stopped unexpectedly")]
    HttpGone,
    #[error("invalid option: {0}")]
    Options(String),
}

/// Which API's error shape a response takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    OpenAi,
    Anthropic,
}

/// What went wrong, which decides the status and the error type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// 400: malformed JSON, a missing or wrong-typed field, a bad value.
    InvalidRequest,
    /// 400: the prompt does not fit the context.
    ContextLength,
    /// 401: a missing or wrong API key.
    Authentication,
    /// 404: an unknown model or path.
    NotFound,
    /// 405: a path that exists under another method.
    MethodNotAllowed,
    /// 408: the request's time ran out.
    Timeout,
    /// 413: the body is over the size limit.
    TooLarge,
    /// 429: the queue is full.
    RateLimited,
    /// 500: the engine failed.
    Internal,
    /// 503: the server is shutting down.
    Unavailable,
}

impl ErrorKind {
    pub fn status(self) -> StatusCode {
        match self {
            ErrorKind::InvalidRequest | ErrorKind::ContextLength => StatusCode::BAD_REQUEST,
            ErrorKind::Authentication => StatusCode::UNAUTHORIZED,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorKind::Timeout => StatusCode::REQUEST_TIMEOUT,
            ErrorKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// OpenAI's `error.type` and `error.code`.
    fn openai(self) -> (&'static str, Option<&'static str>) {
        match self {
            ErrorKind::InvalidRequest => ("invalid_request_error", None),
            ErrorKind::ContextLength => ("invalid_request_error", Some("context_length_exceeded")),
            ErrorKind::Authentication => ("authentication_error", Some("invalid_api_key")),
            ErrorKind::NotFound => ("invalid_request_error", Some("model_not_found")),
            ErrorKind::MethodNotAllowed => ("invalid_request_error", Some("method_not_allowed")),
            ErrorKind::Timeout => ("timeout", Some("timeout")),
            ErrorKind::TooLarge => ("invalid_request_error", Some("request_too_large")),
            ErrorKind::RateLimited => ("rate_limit_exceeded", Some("rate_limit_exceeded")),
            ErrorKind::Internal => ("server_error", None),
            ErrorKind::Unavailable => ("server_error", Some("unavailable")),
        }
    }

    /// Anthropic's `error.type`.
    fn anthropic(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest | ErrorKind::ContextLength | ErrorKind::MethodNotAllowed => {
                "invalid_request_error"
            }
            ErrorKind::Authentication => "authentication_error",
            ErrorKind::NotFound => "not_found_error",
            ErrorKind::Timeout => "timeout_error",
            ErrorKind::TooLarge => "request_too_large",
            ErrorKind::RateLimited => "rate_limit_error",
            ErrorKind::Internal => "api_error",
            ErrorKind::Unavailable => "overloaded_error",
        }
    }
}

/// A failed request, rendered in `dialect`'s error shape.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub dialect: Dialect,
    pub kind: ErrorKind,
    pub message: String,
    /// The request field at fault (OpenAI's `param`).
    pub param: Option<String>,
}

impl ApiError {
    pub fn new(dialect: Dialect, kind: ErrorKind, message: impl Into<String>) -> Self {
        ApiError {
            dialect,
            kind,
            message: message.into(),
            param: None,
        }
    }

    pub fn invalid(dialect: Dialect, message: impl Into<String>) -> Self {
        Self::new(dialect, ErrorKind::InvalidRequest, message)
    }

    pub fn with_param(mut self, param: &str) -> Self {
        self.param = Some(param.to_string());
        self
    }

    pub fn status(&self) -> StatusCode {
        self.kind.status()
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        match self.dialect {
            Dialect::OpenAi => {
                let (kind, code) = self.kind.openai();
                json!({"error": {
                    "message": self.message,
                    "type": kind,
                    "param": self.param,
                    "code": code,
                }})
            }
            Dialect::Anthropic => json!({
                "type": "error",
                "error": {"type": self.kind.anthropic(), "message": self.message},
            }),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = json_response(self.status(), &self.body());
        if self.kind == ErrorKind::RateLimited {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if self.kind == ErrorKind::Authentication && self.dialect == Dialect::OpenAi {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

/// A JSON response with `status`.
pub fn json_response(status: StatusCode, body: &serde_json::Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}
