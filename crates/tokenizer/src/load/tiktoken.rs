//! tiktoken rank files: one `base64(token bytes) rank` pair per line, ranks dense from 0.

use std::path::Path;

use base64::Engine;

use rustc_hash::FxHashMap;

use crate::byte_level;
use crate::error::{Result, TokenizerError};
use crate::load::ids::{RawAdded, SameText, check_added};
use crate::load::{ModelSpec, read};
use crate::pretokenize::{CL100K_PATTERN, R50K_PATTERN, Splitter};
use crate::tokenizer::{Parts, Tokenizer};

impl Tokenizer {
    /// Loads a tiktoken rank file with the given pre-tokenization pattern and special tokens `(text, id)`.
    pub fn from_tiktoken(
        path: impl AsRef<Path>,
        pattern: &str,
        specials: &[(&str, u32)],
    ) -> Result<Self> {
        let path = path.as_ref();
        let ranks = parse(&read(path)?, path)?;
        build(ranks, pattern, specials, path)
    }

    /// Loads a tiktoken rank file of a known encoding, recognised by its size: 50256 ranks is GPT-2 (`r50k_base`,
    /// `<|endoftext|>` = 50256), 100256 is `cl100k_base`.
    pub fn from_tiktoken_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        from_known_ranks(&read(path)?, path)
    }
}

pub(crate) fn from_known_ranks(bytes: &[u8], path: &Path) -> Result<Tokenizer> {
    let ranks = parse(bytes, path)?;
    match ranks.len() {
        50256 => build(ranks, R50K_PATTERN, &[("<|endoftext|>", 50256)], path),
        100256 => build(
            ranks,
            CL100K_PATTERN,
            &[
                ("<|endoftext|>", 100257),
                ("<|fim_prefix|>", 100258),
                ("<|fim_middle|>", 100259),
                ("<|fim_suffix|>", 100260),
                ("<|endofprompt|>", 100276),
            ],
            path,
        ),
        n => Err(TokenizerError::Unsupported {
            path: path.to_owned(),
            what: format!(
                "tiktoken encoding with {n} ranks (known: 50256 = gpt2, 100256 = cl100k_base); \
                 use Tokenizer::from_tiktoken with its pattern"
            ),
        }),
    }
}

fn parse(bytes: &[u8], path: &Path) -> Result<Vec<Vec<u8>>> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| TokenizerError::malformed(path, format!("not UTF-8: {e}")))?;
    let mut tokens = Vec::new();
    // Line of each token: tiktoken itself refuses a file listing one token twice (its encoder and decoder
    // would disagree), and so does this loader instead of letting the later rank win.
    let mut seen: FxHashMap<Vec<u8>, usize> = FxHashMap::default();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let bad = |what: &str| {
            TokenizerError::malformed(path, format!("line {}: {what}: {line:?}", n + 1))
        };
        let (b64, rank) = line
            .split_once(' ')
            .ok_or_else(|| bad("expected `<base64> <rank>`"))?;
        let rank: usize = rank
            .trim()
            .parse()
            .map_err(|_| bad("rank is not an integer"))?;
        let token = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|_| bad("invalid base64"))?;
        if rank != tokens.len() {
            return Err(bad(&format!(
                "ranks must be dense and ascending, expected rank {}",
                tokens.len()
            )));
        }
        if token.is_empty() {
            return Err(bad("empty token"));
        }
        if let Some(first) = seen.insert(token.clone(), n + 1) {
            return Err(bad(&format!("the same token as line {first}")));
        }
        tokens.push(token);
    }
    if tokens.is_empty() {
        return Err(TokenizerError::malformed(path, "no ranks"));
    }
    Ok(tokens)
}

/// How far above the ranks special-token ids may sit: published encodings leave small gaps (cl100k's last
/// special is 100276 for 100256 ranks, o200k's 200018 for 199998), and the bound keeps a caller's id of, say,
/// 2^31 from sizing an id table of 2^31 entries.
const SPECIAL_ID_SPAN: u64 = 1 << 16;

fn build(
    token_bytes: Vec<Vec<u8>>,
    pattern: &str,
    specials: &[(&str, u32)],
    path: &Path,
) -> Result<Tokenizer> {
    let priority: Vec<u32> = (0..token_bytes.len() as u32).collect();
    let spec = ModelSpec {
        tokens: token_bytes
            .iter()
            .map(|b| byte_level::bytes_to_string(b))
            .collect(),
        token_bytes: token_bytes.clone(),
        byte_level: true,
        byte_fallback: false,
        unk: None,
        fuse_unk: false,
        ignore_merges: true,
    };
    let limit = (token_bytes.len() as u64 + SPECIAL_ID_SPAN).min(u64::from(u32::MAX));
    let raw = specials
        .iter()
        .map(|&(content, id)| RawAdded {
            source: format!("special token {content:?}"),
            content: content.to_owned(),
            id: u64::from(id),
            special: true,
        })
        .collect();
    let added = check_added(raw, &spec.tokens, limit, SameText::Allow, path)?;
    let model = spec.build_from_splits(&priority);
    let eos = specials.first().map(|s| s.1);
    Ok(Tokenizer::from_parts(Parts {
        model,
        normalizers: Vec::new(),
        splitters: vec![Splitter::from_pattern(pattern)?],
        prefix_space: false,
        added,
        token_bytes,
        strip_leading_space: false,
        bos: None,
        add_bos: false,
        add_eos: false,
        eos,
    }))
}
