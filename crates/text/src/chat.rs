//! Chat templates: HF `chat_template` Jinja sources rendered with `minijinja`
//! the way transformers' `apply_chat_template` renders them with jinja2
//! (`transformers/utils/chat_template_utils.py`, transformers 5.24.0):
//!
//! - environment: `trim_blocks`, `lstrip_blocks`, loop controls, a single
//!   trailing newline of the template dropped (jinja2's default);
//! - globals `raise_exception(msg)` (an error of kind
//!   [`TemplateErrorKind::Raised`]), `strftime_now(fmt)` (the clock is
//!   [`ChatOptions::now_unix`] when set, so output can be pinned);
//! - `tojson` is Python's `json.dumps(x, ensure_ascii=False, indent=None,
//!   separators=None, sort_keys=False)` (HF's override, not Jinja's HTML-safe
//!   one): `", "` / `": "` separators, `","` with an indent;
//! - Python string/dict/list methods (`.strip()`, `.startswith()`,
//!   `.items()`, ...) through minijinja-contrib's `pycompat`;
//! - jinja2's `is iterable` (none is not iterable), and transformers'
//!   `{% generation %}` block tag (rendered as its body);
//! - context: `messages`, `tools`, `documents` (none unless given),
//!   `add_generation_prompt`, `bos_token`, `eos_token`, plus extra variables.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{Kwargs, Rest, Value, ValueKind};
use minijinja::{Environment, ErrorKind, State, UndefinedBehavior};
use serde::Serialize;

use crate::error::{io_err, Result, TemplateErrorKind, TextError};

const TEMPLATE_NAME: &str = "chat_template";

/// A chat message with plain-text content. Templates that need more fields
/// (`tool_calls`, content parts) take messages as JSON values through
/// [`ChatTemplate::render_json`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A value handed to a template: build one from anything serializable with
/// `TemplateValue::from_serialize`, or from JSON text with [`parse_json`]
/// (which keeps the key order, as Python dicts do; `tojson` output depends on it).
pub type TemplateValue = Value;

/// Parses JSON text into a [`TemplateValue`], keeping object key order.
pub fn parse_json(text: &str) -> Result<TemplateValue> {
    serde_json::from_str(text).map_err(|e| TextError::TemplateInput {
        detail: format!("invalid JSON: {e}"),
    })
}

/// Inputs of a rendering besides the messages.
#[derive(Debug, Clone, Default)]
pub struct ChatOptions {
    /// Append the prompt that starts the assistant's turn.
    pub add_generation_prompt: bool,
    /// JSON schemas of the tools, as OpenAI-style `{"type": "function", ...}`.
    pub tools: Option<TemplateValue>,
    pub documents: Option<TemplateValue>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    /// The clock of `strftime_now`, seconds since the Unix epoch (UTC);
    /// `None` reads the system clock.
    pub now_unix: Option<i64>,
    /// Further template variables (`enable_thinking`, `reasoning_effort`, ...).
    pub extra: Vec<(String, TemplateValue)>,
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").finish_non_exhaustive()
    }
}

fn template_error(e: minijinja::Error) -> TextError {
    let kind = match e.kind() {
        ErrorKind::SyntaxError => TemplateErrorKind::Syntax,
        ErrorKind::UnknownFilter => TemplateErrorKind::UnknownFilter,
        ErrorKind::UnknownFunction => TemplateErrorKind::UnknownFunction,
        ErrorKind::UnknownMethod => TemplateErrorKind::UnknownMethod,
        ErrorKind::UnknownTest => TemplateErrorKind::UnknownTest,
        ErrorKind::InvalidOperation | ErrorKind::UndefinedError | ErrorKind::MissingArgument => {
            TemplateErrorKind::InvalidOperation
        }
        _ => TemplateErrorKind::Other,
    };
    // `raise_exception` reports through InvalidOperation with a marker.
    let detail = e.detail().unwrap_or_default().to_string();
    let (kind, message) = match detail.strip_prefix(RAISED) {
        Some(msg) => (TemplateErrorKind::Raised, msg.to_string()),
        None => (
            kind,
            if detail.is_empty() {
                e.kind().to_string()
            } else {
                format!("{}: {detail}", e.kind())
            },
        ),
    };
    TextError::Template {
        name: None,
        kind,
        message,
        line: e.line(),
    }
}

const RAISED: &str = "raise_exception: ";

fn raise_exception(msg: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(
        ErrorKind::InvalidOperation,
        format!("{RAISED}{msg}"),
    ))
}

impl ChatTemplate {
    /// Compiles a template; a syntax error is reported here.
    pub fn new(source: impl Into<String>) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_undefined_behavior(UndefinedBehavior::Lenient);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson_filter);
        env.add_function("raise_exception", raise_exception);
        env.add_test("iterable", is_iterable);
        env.add_template_owned(TEMPLATE_NAME, rewrite_generation_tags(&source.into()))
            .map_err(template_error)?;
        Ok(ChatTemplate { env })
    }

    /// Reads `chat_template.jinja` (or the manifest's `chat_template` file) of
    /// an install directory; `Ok(None)` when the install has no template.
    pub fn from_install_dir(dir: impl AsRef<Path>) -> Result<Option<ChatTemplate>> {
        let dir = dir.as_ref();
        let manifest = dir.join(turbospark_format::install::MANIFEST_FILE);
        let name = if manifest.is_file() {
            let bytes = std::fs::read(&manifest).map_err(io_err(&manifest))?;
            let v: serde_json::Value =
                serde_json::from_slice(&bytes).map_err(|e| TextError::Json {
                    path: manifest.clone(),
                    detail: e.to_string(),
                })?;
            match v.get("chat_template").and_then(|t| t.as_str()) {
                Some(n) => n.to_string(),
                None => return Ok(None),
            }
        } else {
            turbospark_format::install::CHAT_TEMPLATE_FILE.to_string()
        };
        let path = dir.join(name);
        if !path.is_file() {
            return Ok(None);
        }
        let src = std::fs::read_to_string(&path).map_err(io_err(&path))?;
        Self::new(src).map(Some)
    }

    /// Renders plain-text messages.
    pub fn render(&self, messages: &[Message], opts: &ChatOptions) -> Result<String> {
        self.render_values(&Value::from_serialize(messages), opts)
    }

    /// Renders messages given as a JSON array of objects (any fields the
    /// template reads: `role`, `content`, `tool_calls`, `reasoning_content`, ...).
    pub fn render_json(&self, messages: &serde_json::Value, opts: &ChatOptions) -> Result<String> {
        self.render_values(&Value::from_serialize(messages), opts)
    }

    /// Renders messages given as a template value (a sequence of maps).
    pub fn render_values(&self, messages: &TemplateValue, opts: &ChatOptions) -> Result<String> {
        let all_maps = messages.kind() == ValueKind::Seq
            && messages
                .try_iter()
                .map(|mut it| it.all(|m| m.kind() == ValueKind::Map))
                .unwrap_or(false);
        if !all_maps {
            return Err(TextError::TemplateInput {
                detail: "messages must be a sequence of objects".into(),
            });
        }
        let now = opts.now_unix.unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0)
        });
        let none = Value::from(());
        let mut ctx: Vec<(String, Value)> = opts.extra.clone();
        ctx.push(("messages".into(), messages.clone()));
        ctx.push((
            "tools".into(),
            opts.tools.clone().unwrap_or_else(|| none.clone()),
        ));
        ctx.push(("documents".into(), opts.documents.clone().unwrap_or(none)));
        ctx.push((
            "add_generation_prompt".into(),
            Value::from(opts.add_generation_prompt),
        ));
        if let Some(b) = &opts.bos_token {
            ctx.push(("bos_token".into(), Value::from(b.as_str())));
        }
        if let Some(e) = &opts.eos_token {
            ctx.push(("eos_token".into(), Value::from(e.as_str())));
        }
        ctx.push((
            "strftime_now".into(),
            Value::from_function(move |fmt: String| strftime(&fmt, now)),
        ));
        let ctx: Value = ctx.into_iter().collect();
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(template_error)?;
        tmpl.render(ctx).map_err(template_error)
    }
}

/// Rewrites `{% generation %}` / `{% endgeneration %}` (transformers'
/// assistant-mask extension, which renders its body unchanged) into an
/// always-true `if` with the same whitespace control.
fn rewrite_generation_tags(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (lead, body) = match inner.strip_prefix('-') {
            Some(b) => ("-", b),
            None => match inner.strip_prefix('+') {
                Some(b) => ("+", b),
                None => ("", inner),
            },
        };
        let (body, trail) = match body.strip_suffix('-') {
            Some(b) => (b, "-"),
            None => match body.strip_suffix('+') {
                Some(b) => (b, "+"),
                None => (body, ""),
            },
        };
        match body.trim() {
            "generation" => out.push_str(&format!("{{%{lead} if true {trail}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{lead} endif {trail}%}}")),
            _ => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

/// jinja2's `is iterable`: strings, sequences, mappings and undefined are;
/// none, booleans and numbers are not.
fn is_iterable(v: Value) -> bool {
    match v.kind() {
        ValueKind::None | ValueKind::Bool | ValueKind::Number | ValueKind::Invalid => false,
        ValueKind::Plain => v.try_iter().is_ok(),
        _ => true,
    }
}

// ---------------------------------------------------------------------------
// tojson: Python's json.dumps
// ---------------------------------------------------------------------------

fn tojson_filter(
    _state: &State,
    value: Value,
    args: Rest<Value>,
    kwargs: Kwargs,
) -> std::result::Result<Value, minijinja::Error> {
    // Positional order of HF's tojson(x, ensure_ascii, indent, separators, sort_keys).
    let pos = |i: usize| args.get(i).cloned();
    let ensure_ascii = kwargs
        .get::<Option<Value>>("ensure_ascii")?
        .or_else(|| pos(0))
        .is_some_and(|v| v.is_true());
    let indent_v = kwargs.get::<Option<Value>>("indent")?.or_else(|| pos(1));
    let separators = kwargs
        .get::<Option<Value>>("separators")?
        .or_else(|| pos(2));
    let sort_keys = kwargs
        .get::<Option<Value>>("sort_keys")?
        .or_else(|| pos(3))
        .is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    let indent = match indent_v {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match v.as_i64() {
            Some(n) => Some(" ".repeat(n.max(0) as usize)),
            None => Some(v.as_str().unwrap_or("").to_string()),
        },
    };
    let (item_sep, key_sep) = match separators.filter(|s| !s.is_none() && !s.is_undefined()) {
        Some(s) => {
            let a = s.get_item_by_index(0)?;
            let b = s.get_item_by_index(1)?;
            (
                a.as_str().unwrap_or(",").to_string(),
                b.as_str().unwrap_or(":").to_string(),
            )
        }
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let opts = JsonOpts {
        ensure_ascii,
        indent,
        item_sep,
        key_sep,
        sort_keys,
    };
    let mut out = String::new();
    write_json(&mut out, &value, &opts, 0)?;
    Ok(Value::from(out))
}

struct JsonOpts {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

fn write_json(
    out: &mut String,
    v: &Value,
    o: &JsonOpts,
    depth: usize,
) -> std::result::Result<(), minijinja::Error> {
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if v.is_integer() {
                out.push_str(&v.to_string());
            } else {
                let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
                out.push_str(&python_float_repr(f));
            }
        }
        ValueKind::String => write_json_str(out, v.as_str().unwrap_or(""), o.ensure_ascii),
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if o.sort_keys {
                keys.sort_by_key(|k| k.to_string());
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&o.item_sep);
                }
                newline(out, o, depth + 1);
                let key = match k.kind() {
                    ValueKind::String => k.as_str().unwrap_or("").to_string(),
                    ValueKind::None | ValueKind::Undefined => "null".to_string(),
                    ValueKind::Bool => (if k.is_true() { "true" } else { "false" }).to_string(),
                    ValueKind::Number if !k.is_integer() => {
                        python_float_repr(f64::try_from(k.clone()).unwrap_or(f64::NAN))
                    }
                    _ => k.to_string(),
                };
                write_json_str(out, &key, o.ensure_ascii);
                out.push_str(&o.key_sep);
                write_json(out, &v.get_item(k)?, o, depth + 1)?;
            }
            newline(out, o, depth);
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&o.item_sep);
                }
                newline(out, o, depth + 1);
                write_json(out, x, o, depth + 1)?;
            }
            newline(out, o, depth);
            out.push(']');
        }
        _ => write_json_str(out, &v.to_string(), o.ensure_ascii),
    }
    Ok(())
}

fn newline(out: &mut String, o: &JsonOpts, depth: usize) {
    if let Some(ind) = &o.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(ind);
        }
    }
}

fn write_json_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && (c as u32) >= 0x7f) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: shortest round-trip digits, positional notation for
/// exponents in [-4, 16), `1e+16` / `1e-05` style otherwise, `.0` on integers.
pub(crate) fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "d.ddde±x".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let n = digits.len() as i32;
        let body = if exp >= 0 {
            if n <= exp + 1 {
                format!("{digits}{}.0", "0".repeat((exp + 1 - n) as usize))
            } else {
                let (a, b) = digits.split_at((exp + 1) as usize);
                format!("{a}.{b}")
            }
        } else {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        };
        format!("{sign}{body}")
    } else {
        let m = if digits.len() > 1 {
            format!("{}.{}", &digits[..1], &digits[1..])
        } else {
            digits.clone()
        };
        let es = if exp < 0 { "-" } else { "+" };
        format!("{sign}{m}e{es}{:02}", exp.abs())
    }
}

// ---------------------------------------------------------------------------
// strftime_now
// ---------------------------------------------------------------------------

/// Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Days since 1970-01-01 of a civil date (inverse of [`civil_from_days`]).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// C `strftime` for the directives chat templates use, in UTC.
pub(crate) fn strftime(fmt: &str, unix: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (secs / 3600, secs / 60 % 60, secs % 60);
    // 1970-01-01 was a Thursday (index 3 with Monday = 0).
    let wd = (days + 3).rem_euclid(7) as usize;
    let yday = days - days_from_civil(y, 1, 1) + 1;
    let mut out = String::new();
    let mut it = fmt.chars();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:2}")),
            Some('-') => match it.next() {
                Some('d') => out.push_str(&d.to_string()),
                Some('m') => out.push_str(&m.to_string()),
                Some('H') => out.push_str(&hh.to_string()),
                Some(o) => {
                    out.push_str("%-");
                    out.push(o);
                }
                None => out.push_str("%-"),
            },
            Some('H') => out.push_str(&format!("{hh:02}")),
            Some('I') => out.push_str(&format!("{:02}", if hh % 12 == 0 { 12 } else { hh % 12 })),
            Some('p') => out.push_str(if hh < 12 { "AM" } else { "PM" }),
            Some('M') => out.push_str(&format!("{mm:02}")),
            Some('S') => out.push_str(&format!("{ss:02}")),
            Some('B') => out.push_str(MONTHS[(m - 1) as usize]),
            Some('b') | Some('h') => out.push_str(&MONTHS[(m - 1) as usize][..3]),
            Some('A') => out.push_str(DAYS[wd]),
            Some('a') => out.push_str(&DAYS[wd][..3]),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('F') => out.push_str(&format!("{y}-{m:02}-{d:02}")),
            Some('T') => out.push_str(&format!("{hh:02}:{mm:02}:{ss:02}")),
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        for (f, s) in [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (7.5, "7.5"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (123456789012345.0, "123456789012345.0"),
            (-2.25, "-2.25"),
            (0.1, "0.1"),
        ] {
            assert_eq!(python_float_repr(f), s);
        }
    }

    #[test]
    fn strftime_formats() {
        // 2025-06-15 09:30:05 UTC, a Sunday.
        let t = 1_749_979_805;
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S", t), "2025-06-15 09:30:05");
        assert_eq!(strftime("%d %b %Y", t), "15 Jun 2025");
        assert_eq!(strftime("%A %B %-d, %j", t), "Sunday June 15, 166");
    }
}
