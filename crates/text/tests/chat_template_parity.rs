//! Chat-template parity with transformers: each fixture holds a template, a
//! fixed conversation (system, user, assistant, user + generation prompt) and
//! the string transformers 5.24.0's `render_jinja_template` (jinja2) renders,
//! recorded by `scripts/text/record_templates.py` with `strftime_now` pinned.

mod common;

use serde::Deserialize;
use turbospark_text::chat::ChatOptions;
use turbospark_text::{parse_json, ChatTemplate, TemplateErrorKind, TemplateValue, TextError};

#[derive(Deserialize)]
struct Fixture {
    name: String,
    template: String,
    /// Read as template values so object keys keep their order.
    messages: TemplateValue,
    #[serde(default)]
    tools: Option<TemplateValue>,
    add_generation_prompt: bool,
    bos_token: Option<String>,
    eos_token: Option<String>,
    now_unix: i64,
    expected: String,
}

fn render(fx: &Fixture) -> Result<String, TextError> {
    let t = ChatTemplate::new(fx.template.clone())?;
    let opts = ChatOptions {
        add_generation_prompt: fx.add_generation_prompt,
        tools: fx.tools.clone(),
        bos_token: fx.bos_token.clone(),
        eos_token: fx.eos_token.clone(),
        now_unix: Some(fx.now_unix),
        ..Default::default()
    };
    t.render_values(&fx.messages, &opts)
}

fn load(dir: &std::path::Path) -> Vec<Fixture> {
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap())
        .collect()
}

fn first_difference(got: &str, expected: &str) -> String {
    let g: Vec<char> = got.chars().collect();
    let e: Vec<char> = expected.chars().collect();
    let i = g.iter().zip(&e).take_while(|(a, b)| a == b).count();
    let window = |v: &[char]| -> String {
        v[i.saturating_sub(40)..(i + 60).min(v.len())]
            .iter()
            .collect()
    };
    format!(
        "at char {i}:\n    expected …{:?}\n    got      …{:?}",
        window(&e),
        window(&g)
    )
}

/// One line per fixture whose rendering differs from the expected string
/// (or fails), naming it and the first difference.
fn mismatches(fixtures: &[Fixture]) -> Vec<String> {
    fixtures
        .iter()
        .filter_map(|fx| match render(fx) {
            Ok(got) if got == fx.expected => None,
            Ok(got) => Some(format!(
                "{}: {}",
                fx.name,
                first_difference(&got, &fx.expected)
            )),
            Err(e) => Some(format!("{}: {e}", fx.name)),
        })
        .collect()
}

#[test]
fn required_templates_match_transformers() {
    let fixtures = load(&common::fixtures().join("templates"));
    let names: Vec<&str> = fixtures.iter().map(|f| f.name.as_str()).collect();
    for required in ["smollm2", "qwen2.5-coder", "gpt-oss", "gemma-4", "qwen3"] {
        assert!(names.contains(&required), "fixture {required} missing");
    }
    let failures = mismatches(&fixtures);
    eprintln!(
        "{} templates, {} mismatches",
        fixtures.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The other templates of llama.cpp's models/templates that jinja2 renders for
/// the same conversation.
#[test]
fn extra_templates_match_transformers() {
    let fixtures = load(&common::fixtures().join("templates/extra"));
    let failures = mismatches(&fixtures);
    eprintln!(
        "extra: {} templates, {} match, {} differ",
        fixtures.len(),
        fixtures.len() - failures.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn unknown_filter_is_a_typed_error() {
    let t = ChatTemplate::new("{{ messages[0].content | no_such_filter }}");
    let err = match t {
        Err(e) => e,
        Ok(t) => t
            .render(
                &[turbospark_text::chat::Message::new("user", "hi")],
                &ChatOptions::default(),
            )
            .unwrap_err(),
    };
    match &err {
        TextError::Template { kind, message, .. } => {
            assert_eq!(*kind, TemplateErrorKind::UnknownFilter, "{err}");
            assert!(
                message.contains("no_such_filter") || err.to_string().contains("unknown filter"),
                "{err}"
            );
        }
        other => panic!("expected a template error, got {other}"),
    }
}

#[test]
fn raise_exception_is_a_typed_error() {
    let t = ChatTemplate::new("{% if messages[0].role != 'system' %}{{ raise_exception('System role required') }}{% endif %}").unwrap();
    let err = t
        .render(
            &[turbospark_text::chat::Message::new("user", "hi")],
            &ChatOptions::default(),
        )
        .unwrap_err();
    match err {
        TextError::Template { kind, message, .. } => {
            assert_eq!(kind, TemplateErrorKind::Raised);
            assert_eq!(message, "System role required");
        }
        other => panic!("expected a template error, got {other}"),
    }
}

#[test]
fn syntax_error_is_a_typed_error() {
    let err = ChatTemplate::new("{% for m in messages %}{{ m.content }}").unwrap_err();
    assert!(
        matches!(
            err,
            TextError::Template {
                kind: TemplateErrorKind::Syntax,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn tojson_is_pythons_json_dumps() {
    let t = ChatTemplate::new(
        "{{ tools | tojson }}|{{ tools[0] | tojson(indent=2) }}|{{ 'é\"\\n' | tojson(ensure_ascii=true) }}",
    )
    .unwrap();
    let tools = parse_json(
        r#"[{"name": "f", "x": 1.0, "y": [1, 2], "z": {}, "w": "<b>ü</b>", "n": null}]"#,
    )
    .unwrap();
    let out = t
        .render_json(
            &serde_json::json!([]),
            &ChatOptions {
                tools: Some(tools),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(
        out,
        "[{\"name\": \"f\", \"x\": 1.0, \"y\": [1, 2], \"z\": {}, \"w\": \"<b>ü</b>\", \"n\": null}]|{\n  \"name\": \"f\",\n  \"x\": 1.0,\n  \"y\": [\n    1,\n    2\n  ],\n  \"z\": {},\n  \"w\": \"<b>ü</b>\",\n  \"n\": null\n}|\"\\u00e9\\\"\\n\""
    );
}

#[test]
fn template_from_install_dir() {
    let dir = std::env::temp_dir().join(format!("turbospark-text-chat-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("manifest.json"),
        br#"{"tokenizer": null, "chat_template": "chat_template.jinja"}"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("chat_template.jinja"),
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}\n",
    )
    .unwrap();
    let t = ChatTemplate::from_install_dir(&dir).unwrap().unwrap();
    std::fs::write(dir.join("manifest.json"), br#"{"chat_template": null}"#).unwrap();
    let none = ChatTemplate::from_install_dir(&dir).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    assert!(none.is_none());
    let out = t
        .render(
            &[turbospark_text::Message::new("user", "hi")],
            &ChatOptions {
                add_generation_prompt: true,
                ..Default::default()
            },
        )
        .unwrap();
    // trim_blocks drops the newline after block tags; the template's single
    // trailing newline is dropped as jinja2 does.
    assert_eq!(out, "<user>hi\n<assistant>");
}
