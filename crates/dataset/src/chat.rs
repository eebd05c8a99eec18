//! Chat fine-tuning data: OpenAI-style conversations in JSONL (`{"messages": [{"role", "content"}, ...]}` per
//! line), and the rows the trainer reads from them.
//!
//! A row holds one conversation, right-padded to the window: conversations are not packed several to a window,
//! because packing without attention across their boundary needs a per-document attention mask in every
//! attention kernel, where right padding needs none (causal attention never lets a real token see the padding
//! after it) and costs only the padded positions' compute. Positions that are not trained on (the prompt, the
//! template's headers, the padding) carry [`NO_LOSS`] on their token id.

use std::io::{BufRead, BufReader};
use std::path::Path;

use serde::Deserialize;

use crate::error::{DatasetError, Result};

/// Set on a row's token id when that token is an input only, not a loss target (a prompt or padding token).
/// Token ids are below 2^31 (vocabularies are at most 2^20), so the bit never collides with an id.
pub const NO_LOSS: u32 = 1 << 31;

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ChatTurn {
    /// `system`, `user`, `assistant`, ...
    pub role: String,
    /// The text.
    pub content: String,
}

/// One conversation and the line it came from (for error messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatConversation {
    /// 1-based line number in its file.
    pub line: usize,
    /// Its messages, in order.
    pub turns: Vec<ChatTurn>,
}

#[derive(Deserialize)]
struct ChatLine {
    messages: Vec<ChatTurn>,
}

/// Reads every conversation of a chat JSONL file. Blank lines are skipped; a line that is not JSON, has no
/// `messages` list, a message without a string `role` and `content`, or no assistant message (nothing to train
/// on) is an error naming the file and line.
pub fn read_chat_jsonl(path: &Path) -> Result<Vec<ChatConversation>> {
    let io = |source| DatasetError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut conversations = Vec::new();
    for (index, line) in BufReader::new(file).lines().enumerate() {
        let line_no = index + 1;
        let bad = |message: String| DatasetError::Jsonl {
            path: path.to_path_buf(),
            line: line_no,
            message,
        };
        let line = line.map_err(io)?;
        if line.trim().is_empty() {
            continue;
        }
        let parsed: ChatLine = serde_json::from_str(&line).map_err(|e| {
            bad(format!(
                "expected {{\"messages\": [{{\"role\": ..., \"content\": ...}}, ...]}}: {e}"
            ))
        })?;
        if !parsed.messages.iter().any(|m| m.role == "assistant") {
            return Err(bad(
                "no message has role `assistant`: the loss is on the assistant's replies, so this conversation \
                 would train nothing"
                    .into(),
            ));
        }
        conversations.push(ChatConversation {
            line: line_no,
            turns: parsed.messages,
        });
    }
    if conversations.is_empty() {
        return Err(DatasetError::EmptyCorpus {
            inputs: path.display().to_string(),
        });
    }
    Ok(conversations)
}

/// One training row of `width` (`block_size + 1`) tokens from a conversation's `ids`, where `trained[i]` says
/// whether token `i` is a loss target: untrained tokens carry [`NO_LOSS`], and the row is right-padded with
/// `pad` (untrained). `None` when the conversation is longer than the row.
pub fn chat_row(ids: &[u32], trained: &[bool], width: usize, pad: u32) -> Option<Vec<u32>> {
    if ids.len() > width || ids.len() != trained.len() {
        return None;
    }
    let mut row: Vec<u32> = ids
        .iter()
        .zip(trained)
        .map(|(&id, &t)| if t { id } else { id | NO_LOSS })
        .collect();
    row.resize(width, pad | NO_LOSS);
    Some(row)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chat.jsonl");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn conversations_are_read_with_their_line_numbers() {
        let (_dir, path) = write(
            "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hello\"}]}\n\
             \n\
             {\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": \"u\"}, \
             {\"role\": \"assistant\", \"content\": \"a\"}], \"id\": 7}\n",
        );
        let conversations = read_chat_jsonl(&path).unwrap();
        assert_eq!(conversations.len(), 2);
        assert_eq!(conversations[1].line, 3);
        assert_eq!(conversations[1].turns[2].role, "assistant");
        assert_eq!(conversations[0].turns[1].content, "Hello");
    }

    #[test]
    fn a_bad_line_is_an_error_naming_the_file_and_line() {
        let good = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Yo\"}]}";
        for (bad, expect) in [
            ("not json", "expected {\"messages\""),
            ("{\"text\": \"hi\"}", "missing field `messages`"),
            (
                "{\"messages\": [{\"content\": \"x\"}]}",
                "missing field `role`",
            ),
            (
                "{\"messages\": [{\"role\": \"user\"}]}",
                "missing field `content`",
            ),
            (
                "{\"messages\": [{\"role\": \"user\", \"content\": 3}]}",
                "invalid type",
            ),
            (
                "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}",
                "role `assistant`",
            ),
        ] {
            let (_dir, path) = write(&format!("{good}\n{bad}\n"));
            let err = read_chat_jsonl(&path).unwrap_err().to_string();
            assert!(
                err.contains("chat.jsonl:2:") && err.contains(expect),
                "{bad}: {err}"
            );
        }
        let (_dir, path) = write("\n\n");
        assert!(matches!(
            read_chat_jsonl(&path),
            Err(DatasetError::EmptyCorpus { .. })
        ));
    }

    #[test]
    fn rows_mark_untrained_tokens_and_padding() {
        let row = chat_row(&[5, 6, 7], &[false, true, true], 5, 0).unwrap();
        assert_eq!(row, [5 | NO_LOSS, 6, 7, NO_LOSS, NO_LOSS]);
        assert_eq!(chat_row(&[1, 2, 3], &[true; 3], 2, 0), None);
    }
}
