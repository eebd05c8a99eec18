//! `ember tokenize`: encode stdin to token ids, or decode ids.

use std::io::{Read, Write};

use anyhow::{Context as _, bail};
use ember_tokenizer::Tokenizer;

use crate::Context;

/// How ids are printed (and read with `--decode`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// One JSON array, e.g. `[15496, 995]`.
    Json,
    /// Ids separated by spaces on one line.
    Ids,
}

/// Flags of `ember tokenize`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// tokenizer.json, tiktoken ranks file, GGUF file (its `tokenizer.ggml.*` vocabulary), or model directory
    /// (tokenizer.json or vocab.json + merges.txt).
    #[arg(long)]
    pub tokenizer: std::path::PathBuf,
    /// Output format of the ids [default: json].
    #[arg(long, value_enum, default_value_t = Format::Json)]
    pub format: Format,
    /// Read ids (a JSON array or whitespace-separated numbers) from stdin and write the decoded bytes
    /// [default: off, i.e. encode].
    #[arg(long)]
    pub decode: bool,
    /// Treat special tokens written in the input (e.g. `<|endoftext|>`) as plain text [default: off].
    #[arg(long)]
    pub no_special: bool,
    /// Add the BOS / EOS tokens the tokenizer declares around the ids (a GGUF file's
    /// `tokenizer.ggml.add_bos_token` / `add_eos_token`) [default: off, so ids equal HF
    /// `encode(text, add_special_tokens=False)`].
    #[arg(long)]
    pub add_special: bool,
}

/// Runs `ember tokenize`.
pub fn run(args: Args, _ctx: &Context) -> anyhow::Result<()> {
    let tokenizer = open_tokenizer(&args.tokenizer)
        .with_context(|| format!("loading tokenizer {}", args.tokenizer.display()))?;
    let mut input = Vec::new();
    std::io::stdin()
        .read_to_end(&mut input)
        .context("reading stdin")?;
    let mut stdout = std::io::stdout().lock();
    if args.decode {
        let ids = parse_ids(&input)?;
        let bytes = tokenizer.decode_bytes(&ids)?;
        stdout.write_all(&bytes).map_err(super::StdoutError)?;
    } else {
        let text = std::str::from_utf8(&input).context("stdin is not valid UTF-8")?;
        let ids = if args.no_special {
            tokenizer.encode_ordinary(text)?
        } else {
            tokenizer.encode(text)?
        };
        let ids = if args.add_special {
            tokenizer.with_special(ids)
        } else {
            ids
        };
        let line = match args.format {
            Format::Json => serde_json::to_string(&ids)?,
            Format::Ids => ids.iter().map(u32::to_string).collect::<Vec<_>>().join(" "),
        };
        writeln!(stdout, "{line}").map_err(super::StdoutError)?;
    }
    stdout.flush().map_err(super::StdoutError)?;
    Ok(())
}

/// The tokenizer at `path`: a GGUF file (recognised by its magic number, so any file name works) or whatever
/// [`Tokenizer::from_path`] reads.
pub fn open_tokenizer(path: &std::path::Path) -> anyhow::Result<Tokenizer> {
    if path.is_file() && ember_model::gguf::is_gguf(path) {
        return Ok(ember_model::gguf::load_tokenizer(path)?);
    }
    Ok(Tokenizer::from_path(path)?)
}

/// Ids from a JSON array or whitespace-separated integers.
fn parse_ids(input: &[u8]) -> anyhow::Result<Vec<u32>> {
    let text = std::str::from_utf8(input)
        .context("ids on stdin are not UTF-8")?
        .trim();
    if text.starts_with('[') {
        return serde_json::from_str(text).context("stdin is not a JSON array of token ids");
    }
    text.split_whitespace()
        .map(|t| match t.parse::<u32>() {
            Ok(id) => Ok(id),
            Err(_) => bail!("{t:?} on stdin is not a token id"),
        })
        .collect()
}
