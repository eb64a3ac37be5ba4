//! Chat templates built into the binary, by name: the defaults of families
//! whose checkpoints often come without one (a GGUF converted without its
//! tokenizer config, a base checkpoint), and what `--chat-template NAME`
//! selects.
//!
//! Each follows its model card's published template, reduced to plain
//! user / assistant / system turns (no tools): `gemma` is Gemma 3's
//! (`<start_of_turn>` turns, the assistant as `model`, a system message
//! prefixed to the first user turn), `chatml` Qwen 2 / Qwen 3's, `mistral`
//! Mixtral-Instruct's (`[INST] … [/INST]`), `glm4` GLM-4.5's (`[gMASK]<sop>`
//! then `<|role|>` turns).

/// `(name, Jinja source)` of every built-in template.
pub const BUILTIN_TEMPLATES: [(&str, &str); 4] = [
    ("gemma", GEMMA),
    ("chatml", CHATML),
    ("mistral", MISTRAL),
    ("glm4", GLM4),
];

/// The source of the built-in template `name`.
pub fn builtin_template(name: &str) -> Option<&'static str> {
    BUILTIN_TEMPLATES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|&(_, src)| src)
}

/// Comma-separated names, for messages.
pub fn builtin_template_names() -> String {
    BUILTIN_TEMPLATES
        .iter()
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}

const GEMMA: &str = r#"{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
{%- set loop_messages = messages[1:] -%}
{%- else -%}
{%- set first_user_prefix = '' -%}
{%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}{%- else -%}{%- set role = message['role'] -%}{%- endif -%}
{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + message['content'] | trim + '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"#;

const CHATML: &str = r#"{%- for message in messages -%}
{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"#;

const MISTRAL: &str = r#"{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
{%- set loop_messages = messages[1:] -%}
{%- else -%}
{%- set first_user_prefix = '' -%}
{%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
{%- if message['role'] == 'user' -%}
{{ '[INST] ' + (first_user_prefix if loop.first else '') + message['content'] + ' [/INST]' }}
{%- else -%}
{{ message['content'] + eos_token }}
{%- endif -%}
{%- endfor -%}"#;

const GLM4: &str = r#"[gMASK]<sop>
{%- for message in messages -%}
{{ '<|' + message['role'] + '|>\n' + message['content'] }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<|assistant|>\n' }}{%- endif -%}"#;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ChatOptions, ChatTemplate, Message};

    fn render(name: &str, messages: &[Message]) -> String {
        let t = ChatTemplate::new(builtin_template(name).unwrap()).unwrap();
        let opts = ChatOptions {
            add_generation_prompt: true,
            bos_token: Some("<bos>".into()),
            eos_token: Some("</s>".into()),
            ..ChatOptions::default()
        };
        t.render(messages, &opts).unwrap()
    }

    #[test]
    fn builtin_templates_render_the_published_formats() {
        let msgs = [
            Message::new("system", "Be brief."),
            Message::new("user", "Hi"),
            Message::new("assistant", "Hello."),
            Message::new("user", "Capital of France?"),
        ];
        assert_eq!(
            render("gemma", &msgs),
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n\
             Hello.<end_of_turn>\n<start_of_turn>user\nCapital of France?<end_of_turn>\n\
             <start_of_turn>model\n"
        );
        assert_eq!(
            render("chatml", &msgs[1..2]),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            render("mistral", &msgs),
            "<bos>[INST] Be brief.\n\nHi [/INST]Hello.</s>[INST] Capital of France? [/INST]"
        );
        assert_eq!(
            render("glm4", &msgs[1..2]),
            "[gMASK]<sop><|user|>\nHi<|assistant|>\n"
        );
        assert!(builtin_template("nope").is_none());
    }
}
