//! A conversation's prompt tokens: the messages rendered with the chat
//! template (with the prompt that opens the assistant's turn), then
//! tokenized. The template is given the vocabulary's BOS and EOS texts as
//! `bos_token` / `eos_token` (HF `apply_chat_template` passes the
//! tokenizer's special tokens the same way); BOS is added by the tokenizer
//! only when the vocabulary asks for it (`add_bos`) and the rendered text
//! does not already begin with it, so a template that writes BOS itself
//! does not get two (llama.cpp's server tokenizes its rendered chat with
//! the same rule). `turbospark run`, `chat` and `serve` all build their
//! prompts here, so their tokens agree.

use crate::chat::{ChatOptions, ChatTemplate, Message};
use crate::error::Result;
use crate::tokenizer::Tokenizer;

/// The tokens of `messages` as a prompt for the assistant's next turn.
pub fn chat_prompt_tokens(
    tokenizer: &Tokenizer,
    template: &ChatTemplate,
    messages: &[Message],
) -> Result<Vec<u32>> {
    let bos_text = tokenizer.bos().and_then(|b| tokenizer.token_text(b));
    let opts = ChatOptions {
        add_generation_prompt: true,
        bos_token: bos_text.clone(),
        eos_token: tokenizer.eos().and_then(|e| tokenizer.token_text(e)),
        ..ChatOptions::default()
    };
    let text = template.render(messages, &opts)?;
    let has_bos = bos_text.is_some_and(|b| !b.is_empty() && text.starts_with(&b));
    tokenizer.encode(&text, !has_bos)
}
