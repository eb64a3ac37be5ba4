//! Request bodies of the three generation endpoints, parsed and checked
//! into one [`Request`]: the conversation (or raw prompt) and the sampling
//! parameters.
//!
//! References: OpenAI's API reference for `POST /v1/chat/completions` and
//! `POST /v1/completions` (`platform.openai.com/docs/api-reference`), and
//! Anthropic's for `POST /v1/messages` (`docs.anthropic.com/en/api/messages`).
//! Fields this server does not implement and that would change the answer
//! (`n > 1`, tools, images, logprobs) are refused with a 400 rather than
//! ignored. Every endpoint also takes this server's own `turbospark`
//! object (per-request steering, [`crate::steer`]).

use serde::Deserialize;
use turbospark_text::Message;

use crate::error::{ApiError, Dialect};
use crate::steer::{SteerRequest, MAX_SCALE, MAX_VECTORS};
use turbospark_engine::SteerMode;

/// What to generate, whatever the API.
#[derive(Debug, Clone)]
pub struct Request {
    pub model: Option<String>,
    pub input: Input,
    pub stream: bool,
    /// OpenAI `stream_options.include_usage`.
    pub include_usage: bool,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: usize,
    pub min_p: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub repeat_penalty: f32,
    pub seed: Option<u64>,
    /// `None`: until the context is full.
    pub max_tokens: Option<usize>,
    pub stops: Vec<String>,
    /// The `turbospark` object's steering; `None`: the server's default.
    pub steer: Option<SteerRequest>,
}

/// The `turbospark` extension object.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Extension {
    #[serde(default)]
    control_vectors: Option<Vec<VectorRef>>,
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    layer_range: Option<[usize; 2]>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct VectorRef {
    name: String,
    #[serde(default)]
    scale: Option<f64>,
}

/// Checks the `turbospark` object: `None` when it says nothing about
/// steering.
fn steer_request(d: Dialect, ext: Option<Extension>) -> Result<Option<SteerRequest>, ApiError> {
    let Some(ext) = ext else { return Ok(None) };
    let param = "turbospark.control_vectors";
    let Some(refs) = ext.control_vectors else {
        if ext.mode.is_some() || ext.layer_range.is_some() {
            return Err(ApiError::invalid(
                d,
                "`turbospark.mode` and `turbospark.layer_range` need `turbospark.control_vectors`",
            )
            .with_param(param));
        }
        return Ok(None);
    };
    if refs.len() > MAX_VECTORS {
        return Err(ApiError::invalid(
            d,
            format!("{} control vectors; at most {MAX_VECTORS}", refs.len()),
        )
        .with_param(param));
    }
    let mut vectors = Vec::with_capacity(refs.len());
    for (i, r) in refs.into_iter().enumerate() {
        let scale = r.scale.unwrap_or(1.0);
        if !(scale.is_finite() && scale.abs() <= f64::from(MAX_SCALE)) {
            return Err(ApiError::invalid(
                d,
                format!(
                    "turbospark.control_vectors[{i}].scale is {scale}; it must be a number \
                     in [-{MAX_SCALE}, {MAX_SCALE}]"
                ),
            )
            .with_param(param));
        }
        vectors.push((r.name, scale as f32));
    }
    let mode = match ext.mode.as_deref() {
        None | Some("add") => SteerMode::Add,
        Some("ablate") => SteerMode::Ablate,
        Some("clamp") => SteerMode::Clamp,
        Some(other) => {
            return Err(ApiError::invalid(
                d,
                format!("turbospark.mode `{other}` is not one of add, ablate, clamp"),
            )
            .with_param("turbospark.mode"))
        }
    };
    Ok(Some(SteerRequest {
        vectors,
        mode,
        layer_range: ext.layer_range.map(|[a, b]| (a, b)),
    }))
}

/// The prompt.
#[derive(Debug, Clone)]
pub enum Input {
    /// A conversation, rendered with the chat template.
    Chat(Vec<Message>),
    /// Text fed as it is (`/v1/completions`).
    Raw(String),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

/// Message content: a string, or a list of typed parts of which only text
/// is supported.
#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

impl Content {
    fn into_text(self, dialect: Dialect, field: &str) -> Result<String, ApiError> {
        match self {
            Content::Text(s) => Ok(s),
            Content::Parts(parts) => {
                let mut out = Vec::with_capacity(parts.len());
                for p in parts {
                    match (p.kind.as_str(), p.text) {
                        ("text", Some(t)) => out.push(t),
                        ("text", None) => {
                            return Err(ApiError::invalid(
                                dialect,
                                format!("a text part of {field} has no `text`"),
                            )
                            .with_param(field))
                        }
                        (other, _) => {
                            return Err(ApiError::invalid(
                                dialect,
                                format!(
                                    "content parts of type `{other}` are not supported \
                                     (only `text`)"
                                ),
                            )
                            .with_param(field))
                        }
                    }
                }
                Ok(out.join("\n"))
            }
        }
    }
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

#[derive(Deserialize)]
struct OpenAiMessage {
    role: String,
    #[serde(default)]
    content: Option<Content>,
}

/// Sampling fields shared by both OpenAI endpoints.
#[derive(Deserialize)]
struct OpenAiSampling {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default)]
    top_k: Option<usize>,
    #[serde(default)]
    min_p: Option<f32>,
    #[serde(default)]
    max_tokens: Option<usize>,
    #[serde(default)]
    max_completion_tokens: Option<usize>,
    #[serde(default)]
    stop: Option<OneOrMany>,
    #[serde(default)]
    seed: Option<u64>,
    #[serde(default)]
    presence_penalty: Option<f32>,
    #[serde(default)]
    frequency_penalty: Option<f32>,
    #[serde(default)]
    repeat_penalty: Option<f32>,
    #[serde(default)]
    n: Option<u32>,
    #[serde(default)]
    logprobs: Option<serde_json::Value>,
    #[serde(default)]
    tools: Option<serde_json::Value>,
    #[serde(default)]
    turbospark: Option<Extension>,
}

#[derive(Deserialize)]
struct ChatBody {
    messages: Vec<OpenAiMessage>,
    #[serde(flatten)]
    sampling: OpenAiSampling,
}

#[derive(Deserialize)]
struct CompletionBody {
    prompt: OneOrMany,
    #[serde(flatten)]
    sampling: OpenAiSampling,
}

#[derive(Deserialize)]
struct AnthropicMessage {
    role: String,
    content: Content,
}

#[derive(Deserialize)]
struct AnthropicBody {
    #[serde(default)]
    model: Option<String>,
    messages: Vec<AnthropicMessage>,
    max_tokens: usize,
    #[serde(default)]
    system: Option<Content>,
    #[serde(default)]
    stop_sequences: Option<Vec<String>>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default)]
    top_k: Option<usize>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    tools: Option<serde_json::Value>,
    #[serde(default)]
    turbospark: Option<Extension>,
}

/// Most stop strings a request may give.
const MAX_STOPS: usize = 16;

fn parse<'a, T: Deserialize<'a>>(dialect: Dialect, body: &'a [u8]) -> Result<T, ApiError> {
    if body.is_empty() {
        return Err(ApiError::invalid(
            dialect,
            "the request body is empty; a JSON object is expected",
        ));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(dialect, format!("invalid request body: {e}")))
}

fn check_range(dialect: Dialect, name: &str, v: f32, lo: f32, hi: f32) -> Result<f32, ApiError> {
    if v.is_finite() && (lo..=hi).contains(&v) {
        Ok(v)
    } else {
        Err(ApiError::invalid(
            dialect,
            format!("`{name}` is {v}; it must lie in [{lo}, {hi}]"),
        )
        .with_param(name))
    }
}

impl Request {
    fn from_openai(s: OpenAiSampling, input: Input) -> Result<Request, ApiError> {
        let d = Dialect::OpenAi;
        if s.n.is_some_and(|n| n != 1) {
            return Err(ApiError::invalid(d, "only `n` = 1 is supported").with_param("n"));
        }
        if s.logprobs
            .as_ref()
            .is_some_and(|v| !v.is_null() && v != &serde_json::Value::Bool(false))
        {
            return Err(ApiError::invalid(d, "`logprobs` is not supported").with_param("logprobs"));
        }
        if s.tools.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(ApiError::invalid(d, "`tools` is not supported").with_param("tools"));
        }
        let max_tokens = s.max_completion_tokens.or(s.max_tokens);
        if max_tokens == Some(0) {
            return Err(
                ApiError::invalid(d, "`max_tokens` must be at least 1").with_param("max_tokens")
            );
        }
        let stops = s.stop.map(OneOrMany::into_vec).unwrap_or_default();
        check_stops(d, &stops, "stop")?;
        let steer = steer_request(d, s.turbospark)?;
        Ok(Request {
            model: s.model,
            input,
            stream: s.stream.unwrap_or(false),
            include_usage: s
                .stream_options
                .and_then(|o| o.include_usage)
                .unwrap_or(false),
            temperature: check_range(d, "temperature", s.temperature.unwrap_or(1.0), 0.0, 2.0)?,
            top_p: check_range(d, "top_p", s.top_p.unwrap_or(1.0), 0.0, 1.0)?,
            top_k: s.top_k.unwrap_or(0),
            min_p: check_range(d, "min_p", s.min_p.unwrap_or(0.0), 0.0, 1.0)?,
            presence_penalty: check_range(
                d,
                "presence_penalty",
                s.presence_penalty.unwrap_or(0.0),
                -2.0,
                2.0,
            )?,
            frequency_penalty: check_range(
                d,
                "frequency_penalty",
                s.frequency_penalty.unwrap_or(0.0),
                -2.0,
                2.0,
            )?,
            repeat_penalty: check_range(
                d,
                "repeat_penalty",
                s.repeat_penalty.unwrap_or(1.0),
                0.0,
                10.0,
            )?,
            seed: s.seed,
            max_tokens,
            stops,
            steer,
        })
    }

    /// `POST /v1/chat/completions`.
    pub fn chat(body: &[u8]) -> Result<Request, ApiError> {
        let d = Dialect::OpenAi;
        let b: ChatBody = parse(d, body)?;
        if b.messages.is_empty() {
            return Err(ApiError::invalid(d, "`messages` is empty").with_param("messages"));
        }
        let mut messages = Vec::with_capacity(b.messages.len());
        for (i, m) in b.messages.into_iter().enumerate() {
            let role = match m.role.as_str() {
                "system" | "developer" => "system",
                "user" => "user",
                "assistant" => "assistant",
                other => {
                    return Err(ApiError::invalid(
                        d,
                        format!("messages[{i}].role `{other}` is not supported (system, developer, user, assistant)"),
                    )
                    .with_param("messages"))
                }
            };
            let content = match m.content {
                Some(c) => c.into_text(d, &format!("messages[{i}].content"))?,
                None => String::new(),
            };
            messages.push(Message::new(role, content));
        }
        Self::from_openai(b.sampling, Input::Chat(messages))
    }

    /// `POST /v1/completions`.
    pub fn completion(body: &[u8]) -> Result<Request, ApiError> {
        let d = Dialect::OpenAi;
        let b: CompletionBody = parse(d, body)?;
        let mut prompts = b.prompt.into_vec();
        if prompts.len() != 1 {
            return Err(ApiError::invalid(d, "`prompt` must be one string").with_param("prompt"));
        }
        let prompt = prompts.pop().unwrap_or_default();
        Self::from_openai(b.sampling, Input::Raw(prompt))
    }

    /// `POST /v1/messages`.
    pub fn messages(body: &[u8]) -> Result<Request, ApiError> {
        let d = Dialect::Anthropic;
        let b: AnthropicBody = parse(d, body)?;
        if b.tools.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(ApiError::invalid(d, "`tools` is not supported"));
        }
        if b.max_tokens == 0 {
            return Err(ApiError::invalid(d, "`max_tokens` must be at least 1"));
        }
        if b.messages.is_empty() {
            return Err(ApiError::invalid(d, "`messages` is empty"));
        }
        let mut messages = Vec::with_capacity(b.messages.len() + 1);
        if let Some(system) = b.system {
            messages.push(Message::new("system", system.into_text(d, "system")?));
        }
        for (i, m) in b.messages.into_iter().enumerate() {
            let role = match m.role.as_str() {
                "user" => "user",
                "assistant" => "assistant",
                other => {
                    return Err(ApiError::invalid(
                        d,
                        format!("messages.{i}.role `{other}` is not supported (user, assistant)"),
                    ))
                }
            };
            messages.push(Message::new(
                role,
                m.content.into_text(d, &format!("messages.{i}.content"))?,
            ));
        }
        let stops = b.stop_sequences.unwrap_or_default();
        check_stops(d, &stops, "stop_sequences")?;
        let steer = steer_request(d, b.turbospark)?;
        Ok(Request {
            model: b.model,
            input: Input::Chat(messages),
            stream: b.stream.unwrap_or(false),
            include_usage: true,
            temperature: check_range(d, "temperature", b.temperature.unwrap_or(1.0), 0.0, 1.0)?,
            top_p: check_range(d, "top_p", b.top_p.unwrap_or(1.0), 0.0, 1.0)?,
            top_k: b.top_k.unwrap_or(0),
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repeat_penalty: 1.0,
            seed: None,
            max_tokens: Some(b.max_tokens),
            stops,
            steer,
        })
    }
}

fn check_stops(d: Dialect, stops: &[String], field: &str) -> Result<(), ApiError> {
    if stops.len() > MAX_STOPS {
        return Err(ApiError::invalid(
            d,
            format!("`{field}` has {} entries; at most {MAX_STOPS}", stops.len()),
        )
        .with_param(field));
    }
    if stops.iter().any(String::is_empty) {
        return Err(
            ApiError::invalid(d, format!("`{field}` has an empty string")).with_param(field),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_with_parts_and_defaults() {
        let r = Request::chat(
            br#"{"model":"m","messages":[{"role":"developer","content":"be brief"},
                {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],
                "stop":"x","stream":true,"stream_options":{"include_usage":true}}"#,
        )
        .unwrap();
        let Input::Chat(m) = &r.input else { panic!() };
        assert_eq!(m[0], Message::new("system", "be brief"));
        assert_eq!(m[1], Message::new("user", "a\nb"));
        assert_eq!(r.stops, ["x"]);
        assert!(r.stream && r.include_usage);
        assert_eq!((r.temperature, r.top_p, r.max_tokens), (1.0, 1.0, None));
    }

    #[test]
    fn bad_bodies_are_400_in_the_api_shape() {
        for body in [
            &b""[..],
            b"{",
            b"[]",
            b"{\"messages\": 3}",
            b"{\"messages\": []}",
            b"{\"messages\": [{\"role\": \"user\", \"content\": 5}]}",
            b"{\"messages\": [{\"role\": \"tool\", \"content\": \"x\"}]}",
            b"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"temperature\": \"hot\"}",
            b"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"temperature\": 9}",
            b"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"n\": 2}",
            b"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}",
            b"\xff\xfe",
        ] {
            let e = Request::chat(body).unwrap_err();
            assert_eq!(e.status(), 400, "{}", String::from_utf8_lossy(body));
            assert!(e.body()["error"]["message"].is_string());
        }
        let e = Request::messages(br#"{"messages":[{"role":"user","content":"x"}]}"#).unwrap_err();
        assert_eq!(e.status(), 400);
        assert_eq!(e.body()["type"], "error");
        assert_eq!(e.body()["error"]["type"], "invalid_request_error");
    }

    #[test]
    fn turbospark_extension_steering() {
        let r = Request::chat(
            br#"{"messages":[{"role":"user","content":"x"}],
                "turbospark":{"control_vectors":[{"name":"happy","scale":-2.5},{"name":"calm"}],
                "mode":"clamp","layer_range":[3,9]}}"#,
        )
        .unwrap();
        let s = r.steer.unwrap();
        assert_eq!(s.vectors, [("happy".into(), -2.5), ("calm".into(), 1.0)]);
        assert_eq!((s.mode, s.layer_range), (SteerMode::Clamp, Some((3, 9))));
        let r = Request::chat(br#"{"messages":[{"role":"user","content":"x"}]}"#).unwrap();
        assert!(r.steer.is_none());
        let ok = |ext: &str| {
            let body =
                format!(r#"{{"messages":[{{"role":"user","content":"x"}}],"turbospark":{ext}}}"#);
            Request::chat(body.as_bytes())
        };
        assert!(ok(r#"{"control_vectors":[]}"#)
            .unwrap()
            .steer
            .unwrap()
            .vectors
            .is_empty());
        for bad in [
            r#"{"control_vectors":[{"name":"a","scale":1e40}]}"#,
            r#"{"control_vectors":[{"name":"a","scale":1001}]}"#,
            r#"{"control_vectors":[{"name":"a","scale":"big"}]}"#,
            r#"{"control_vectors":[{"name":"a"}],"mode":"multiply"}"#,
            r#"{"control_vectors":[{"name":"a","weight":1}]}"#,
            r#"{"control_vectors":[{"scale":1}]}"#,
            r#"{"control_vectors":"a"}"#,
            r#"{"mode":"add"}"#,
            r#"{"steer":1}"#,
            r#"{"control_vectors":[{"name":"a"}],"layer_range":[1]}"#,
        ] {
            let e = ok(bad).unwrap_err();
            assert_eq!(e.status(), 400, "{bad}");
        }
        let e = Request::messages(
            br#"{"max_tokens":5,"messages":[{"role":"user","content":"x"}],
                "turbospark":{"control_vectors":[{"name":"a","scale":1e9}]}}"#,
        )
        .unwrap_err();
        assert_eq!(e.body()["error"]["type"], "invalid_request_error");
    }

    #[test]
    fn anthropic_system_and_blocks() {
        let r = Request::messages(
            br#"{"model":"m","max_tokens":5,"system":[{"type":"text","text":"s"}],
                "messages":[{"role":"user","content":[{"type":"text","text":"q"}]}],
                "stop_sequences":["\n\n"]}"#,
        )
        .unwrap();
        let Input::Chat(m) = &r.input else { panic!() };
        assert_eq!(m, &[Message::new("system", "s"), Message::new("user", "q")]);
        assert_eq!(r.max_tokens, Some(5));
        assert_eq!(r.stops, ["\n\n"]);
    }
}
