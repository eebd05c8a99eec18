//! Chat prompts: a model's Jinja chat template (from `tokenizer_config.json` or GGUF `tokenizer.chat_template`)
//! rendered with `minijinja`, the way `transformers`' `apply_chat_template` renders it.

use std::ops::Range;
use std::path::Path;

use ember_tokenizer::Tokenizer;
use minijinja::{Environment, Error, ErrorKind, context};
use serde::Serialize;

use crate::error::InferenceError;

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A message from `role` with `content`.
    pub fn new(role: &str, content: &str) -> Self {
        Self {
            role: role.to_string(),
            content: content.to_string(),
        }
    }
}

/// A chat template and the special-token strings it may refer to.
#[derive(Clone, Debug)]
pub struct ChatTemplate {
    source: String,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// A template from its Jinja source; `bos_token` / `eos_token` are the strings the template sees under those
    /// names.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Self {
        Self {
            source: source.to_string(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        }
    }

    /// The template of a Hugging Face `tokenizer_config.json` (`chat_template`, `bos_token`, `eos_token`), or
    /// `None` when it has no template.
    pub fn from_tokenizer_config(path: &Path) -> Result<Option<Self>, InferenceError> {
        let bad = |m: String| InferenceError::Template(format!("{}: {m}", path.display()));
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let config: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(format!("invalid JSON: {e}")))?;
        // A special token is either a string or an object with `content`.
        let token = |key: &str| {
            let v = config.get(key);
            v.and_then(|v| {
                v.as_str()
                    .or_else(|| v.get("content").and_then(|c| c.as_str()))
            })
            .unwrap_or("")
            .to_string()
        };
        let source = match config.get("chat_template") {
            None | Some(serde_json::Value::Null) => return Ok(None),
            Some(serde_json::Value::String(s)) => s.clone(),
            // The list form names several templates; the one called `default` is what apply_chat_template uses.
            Some(serde_json::Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template").and_then(|t| t.as_str()))
                .ok_or_else(|| {
                    bad("`chat_template` list has no template named `default`".to_string())
                })?
                .to_string(),
            Some(other) => {
                return Err(bad(format!(
                    "`chat_template` must be a string, found {other}"
                )));
            }
        };
        Ok(Some(Self {
            source,
            bos_token: token("bos_token"),
            eos_token: token("eos_token"),
        }))
    }

    /// The template's Jinja source, as the model files carry it.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The string the template sees as `eos_token` (the end-of-turn marker of most templates).
    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// Renders `messages`; `add_generation_prompt` appends the header that starts the assistant's reply.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, InferenceError> {
        let mut env = Environment::new();
        // transformers renders with trim_blocks and lstrip_blocks, which templates are written for.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<String, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        let template_error = |e: Error| InferenceError::Template(format!("{e:#}"));
        env.add_template("chat", &self.source)
            .map_err(template_error)?;
        let template = env.get_template("chat").map_err(template_error)?;
        template
            .render(context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token,
                eos_token => self.eos_token,
            })
            .map_err(template_error)
    }

    /// Renders a whole conversation (no generation prompt) and the byte ranges of the text each assistant
    /// message adds: what chat fine-tuning computes its loss on.
    ///
    /// The range of assistant message `i` is what rendering `messages[..=i]` adds to rendering `messages[..i]`
    /// with the generation prompt: the reply and its end-of-turn marker, without the header that opens the turn
    /// (which the model is given, not asked to write). transformers computes the same mask from `{% generation %}`
    /// tags, which few templates carry; prefixes work for every template that renders a conversation as the
    /// concatenation of its turns, and one that does not is an error, not a wrong mask.
    pub fn render_assistant_spans(
        &self,
        messages: &[Message],
    ) -> Result<(String, Vec<Range<usize>>), InferenceError> {
        let text = self.render(messages, false)?;
        let mut spans = Vec::new();
        for (i, message) in messages.iter().enumerate() {
            if message.role != "assistant" {
                continue;
            }
            let prompt = self.render(&messages[..i], true)?;
            let through = self.render(&messages[..=i], false)?;
            if !through.starts_with(&prompt) || !text.starts_with(&through) {
                return Err(InferenceError::Template(format!(
                    "message {i} (assistant): the chat template does not render a conversation as its turns one \
                     after another, so the reply's tokens cannot be told from the prompt's"
                )));
            }
            if through.len() > prompt.len() {
                spans.push(prompt.len()..through.len());
            }
        }
        Ok((text, spans))
    }

    /// The token ids of a conversation rendered for fine-tuning and whether each is a reply token (trained on).
    /// The whole text of [`render_assistant_spans`](Self::render_assistant_spans) is encoded at once, so the ids
    /// are what `apply_chat_template(tokenize=True)` gives (special tokens the template writes become their
    /// ids), and a token is trained when its bytes overlap a reply span, as transformers'
    /// `return_assistant_tokens_mask` marks every token from the one holding a span's first character to the
    /// one holding its last. A token may straddle an edge (`"\n  The"` after `assistant` is one token `"\n "`
    /// then `" The"` in SmolLM2's vocabulary): it is trained, as there. Where the decoded tokens do not spell
    /// the text byte for byte (a normalizer that rewrites it), the pieces are encoded separately at the spans'
    /// edges instead, so each token lies wholly inside or outside a reply.
    pub fn encode_for_training(
        &self,
        tokenizer: &Tokenizer,
        messages: &[Message],
    ) -> Result<(Vec<u32>, Vec<bool>), InferenceError> {
        let (text, spans) = self.render_assistant_spans(messages)?;
        let ids = tokenizer.encode(&text)?;
        if tokenizer.decode_bytes(&ids)? == text.as_bytes() {
            let ends = tokenizer.token_ends(&ids)?;
            let trained = ends
                .iter()
                .enumerate()
                .map(|(i, &end)| {
                    let start = if i == 0 { 0 } else { ends[i - 1] };
                    start < end && spans.iter().any(|s| start < s.end && end > s.start)
                })
                .collect();
            return Ok((ids, trained));
        }
        let (mut ids, mut trained) = (Vec::new(), Vec::new());
        let mut push = |piece: &str, train: bool| -> Result<(), InferenceError> {
            let piece_ids = tokenizer.encode(piece)?;
            trained.extend(std::iter::repeat_n(train, piece_ids.len()));
            ids.extend(piece_ids);
            Ok(())
        };
        let mut at = 0;
        for span in &spans {
            push(&text[at..span.start], false)?;
            push(&text[span.clone()], true)?;
            at = span.end;
        }
        push(&text[at..], false)?;
        Ok((ids, trained))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2-Instruct's template (as in its GGUF file and tokenizer_config.json).
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn smollm2_template_renders_the_default_system_prompt_and_generation_header() {
        let t = ChatTemplate::new(SMOLLM2, "<|im_start|>", "<|im_end|>");
        let got = t.render(&[Message::new("user", "Hi")], true).unwrap();
        let want = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
                    <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
        assert_eq!(got, want);
        let with_system = t
            .render(
                &[
                    Message::new("system", "Be brief."),
                    Message::new("user", "Hi"),
                ],
                false,
            )
            .unwrap();
        assert_eq!(
            with_system,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        );
    }

    #[test]
    fn assistant_spans_cover_each_reply_and_its_end_of_turn_marker() {
        let t = ChatTemplate::new(SMOLLM2, "<|im_start|>", "<|im_end|>");
        let messages = [
            Message::new("user", "Hi"),
            Message::new("assistant", "Hello."),
            Message::new("user", "Bye"),
            Message::new("assistant", "Farewell."),
        ];
        let (text, spans) = t.render_assistant_spans(&messages).unwrap();
        assert_eq!(text, t.render(&messages, false).unwrap());
        let covered: Vec<&str> = spans.iter().map(|s| &text[s.clone()]).collect();
        assert_eq!(covered, ["Hello.<|im_end|>\n", "Farewell.<|im_end|>\n"]);
        // A template that renders the last turn differently from the same turn followed by others.
        let odd = ChatTemplate::new(
            "{% for m in messages %}{% if loop.last %}[{{ m.content }}]{% else %}{{ m.content }}{% endif %}{% endfor %}",
            "",
            "",
        );
        let err = odd
            .render_assistant_spans(&messages)
            .unwrap_err()
            .to_string();
        assert!(err.contains("message 1 (assistant)"), "{err}");
    }

    #[test]
    fn raise_exception_in_a_template_is_an_error_with_its_message() {
        let t = ChatTemplate::new("{{ raise_exception('roles must alternate') }}", "", "");
        let err = t.render(&[], false).unwrap_err().to_string();
        assert!(err.contains("roles must alternate"), "{err}");
    }

    #[test]
    fn block_tags_do_not_leave_newlines_behind() {
        let t = ChatTemplate::new(
            "{% for m in messages %}\n  {{ m.content }}\n{% endfor %}",
            "",
            "",
        );
        assert_eq!(
            t.render(
                &[Message::new("user", "a"), Message::new("user", "b")],
                false
            )
            .unwrap(),
            "  a\n  b\n"
        );
    }
}
