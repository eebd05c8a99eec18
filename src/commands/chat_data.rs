//! Chat fine-tuning data (`data.format: chat`): JSONL conversations rendered with the model's chat template and
//! tokenized into one right-padded row each, trained only on the assistant's replies.

use std::path::Path;

use anyhow::{Context as _, bail};
use ember_dataset::{ChatConversation, ChatRows, NO_LOSS, chat_row, read_chat_jsonl};
use ember_inference::{ChatTemplate, Message};
use ember_tokenizer::Tokenizer;

/// Training rows and validation rows, each `block_size + 1` ids.
pub type SplitRows = (Vec<Vec<u32>>, Vec<Vec<u32>>);

/// Training and validation rows of `block_size + 1` tokens from the chat JSONL files `inputs`: the last
/// `val_fraction` of the conversations (at least one) are held out, as the text format holds out the end of the
/// corpus. A conversation longer than a row is an error naming its file and line.
pub fn chat_rows(
    inputs: &[std::path::PathBuf],
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
    block_size: usize,
    val_fraction: f64,
) -> anyhow::Result<SplitRows> {
    let width = block_size + 1;
    let pad = tokenizer.eos_id().unwrap_or(0);
    let mut rows = Vec::new();
    for input in inputs {
        let conversations = read_chat_jsonl(input)?;
        for ChatConversation { line, turns } in conversations {
            let messages: Vec<Message> = turns
                .iter()
                .map(|t| Message::new(&t.role, &t.content))
                .collect();
            let (ids, trained) = template
                .encode_for_training(tokenizer, &messages)
                .with_context(|| format!("{}:{line}", input.display()))?;
            let Some(row) = chat_row(&ids, &trained, width, pad) else {
                bail!(
                    "{}:{line}: the conversation is {} tokens, longer than a training row (model.block_size + 1 = \
                     {width}); raise model.block_size or shorten it",
                    input.display(),
                    ids.len()
                );
            };
            rows.push(row);
        }
    }
    if rows.len() < 2 {
        bail!(
            "data.inputs: {} chat conversation(s); at least two are needed, one to train on and one to validate",
            rows.len()
        );
    }
    let held_out = ((rows.len() as f64 * val_fraction).ceil() as usize).clamp(1, rows.len() - 1);
    let val = rows.split_off(rows.len() - held_out);
    Ok((rows, val))
}

/// The chat template of `model.from` (`path`), or an error saying chat data needs one.
pub fn base_template<'a>(
    template: Option<&'a ChatTemplate>,
    path: &Path,
) -> anyhow::Result<&'a ChatTemplate> {
    template.with_context(|| {
        format!(
            "data.format chat: model.from {} has no chat template (tokenizer_config.json `chat_template` or GGUF \
             `tokenizer.chat_template`)",
            path.display()
        )
    })
}

/// The rows of a chat corpus `ember prepare --format chat` wrote, when `inputs` is such a directory: they must
/// have been made with the tokenizer of `model_path` (`vocab_size` ids) and for rows of `block_size + 1` tokens.
pub fn prepared_rows(
    inputs: &[std::path::PathBuf],
    model_path: &Path,
    vocab_size: usize,
    block_size: usize,
) -> anyhow::Result<Option<SplitRows>> {
    let prepared: Vec<_> = inputs.iter().filter(|p| ChatRows::is_prepared(p)).collect();
    let [dir] = prepared.as_slice() else {
        if prepared.is_empty() {
            return Ok(None);
        }
        bail!(
            "data.inputs: {} prepared chat directories; give one",
            prepared.len()
        );
    };
    if inputs.len() > 1 {
        bail!(
            "data.inputs: {} is a prepared chat corpus (`ember prepare --format chat`); it must be the only input",
            dir.display()
        );
    }
    let rows = ChatRows::open(dir).with_context(|| format!("data.inputs: {}", dir.display()))?;
    let fingerprint = ember_dataset::fingerprint_path(model_path)?;
    if rows.tokenizer != fingerprint {
        bail!(
            "data.inputs: {} was prepared with another tokenizer than model.from {}'s; prepare it again with \
             `--tokenizer {}`",
            dir.display(),
            model_path.display(),
            model_path.display()
        );
    }
    if rows.width != block_size + 1 {
        bail!(
            "model.block_size: {} was prepared for rows of {} tokens (block size {}), found {block_size}",
            dir.display(),
            rows.width,
            rows.width - 1
        );
    }
    // A rows file of the right size can still hold anything: an id past the vocabulary is refused here, not
    // met by the embedding lookup.
    if let Some(id) = rows
        .train
        .iter()
        .chain(&rows.val)
        .flatten()
        .map(|&id| id & !NO_LOSS)
        .find(|&id| id as usize >= vocab_size)
    {
        bail!(
            "data.inputs: {} holds token id {id}, outside model.from's vocabulary of {vocab_size}",
            dir.display()
        );
    }
    Ok(Some((rows.train, rows.val)))
}
