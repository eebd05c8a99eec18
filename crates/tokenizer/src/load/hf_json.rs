//! HF `tokenizer.json` (BPE models) and GPT-2's `vocab.json` + `merges.txt`.

use std::path::Path;

use serde_json::Value;

use crate::added::AddedToken;
use crate::error::{Result, TokenizerError};
use crate::load::{ModelSpec, byte_level_bytes, dense_tokens, read, sentencepiece_bytes};
use crate::normalize::{Normalize, Prepend};
use crate::pretokenize::Splitter;
use crate::tokenizer::{Parts, Tokenizer};

const BOS_NAMES: [&str; 3] = ["<s>", "<|begin_of_text|>", "<|startoftext|>"];
const EOS_NAMES: [&str; 3] = ["</s>", "<|end_of_text|>", "<|endoftext|>"];

impl Tokenizer {
    /// Loads a HF `tokenizer.json` with a BPE model.
    pub fn from_hf_json_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        Self::from_hf_json_bytes(&read(path)?, path)
    }

    /// Parses the bytes of a HF `tokenizer.json`; `path` names the source in errors.
    pub fn from_hf_json_bytes(bytes: &[u8], path: &Path) -> Result<Self> {
        let root: Value = serde_json::from_slice(bytes)
            .map_err(|e| TokenizerError::malformed(path, format!("invalid JSON: {e}")))?;
        HfLoader { path }.load(&root)
    }

    /// Loads GPT-2's `vocab.json` and `merges.txt` (byte-level BPE, GPT-2 pattern).
    pub fn from_gpt2_files(vocab: impl AsRef<Path>, merges: impl AsRef<Path>) -> Result<Self> {
        let (vocab_path, merges_path) = (vocab.as_ref(), merges.as_ref());
        let vocab: Value = serde_json::from_slice(&read(vocab_path)?)
            .map_err(|e| TokenizerError::malformed(vocab_path, format!("invalid JSON: {e}")))?;
        let merges_text = String::from_utf8(read(merges_path)?)
            .map_err(|_| TokenizerError::malformed(merges_path, "not UTF-8"))?;
        let merges: Vec<Value> = merges_text
            .lines()
            .filter(|l| !l.starts_with("#version") && !l.trim().is_empty())
            .map(|l| Value::String(l.to_owned()))
            .collect();
        let loader = HfLoader { path: vocab_path };
        let tokens = loader.vocab(&vocab, "vocab.json")?;
        let merges = HfLoader { path: merges_path }.merges(&merges, &tokens)?;
        let token_bytes: Vec<Vec<u8>> = tokens.iter().map(|t| byte_level_bytes(t)).collect();
        let eos = tokens
            .iter()
            .position(|t| t == "<|endoftext|>")
            .map(|i| i as u32);
        let added = eos.map(|id| AddedToken {
            content: "<|endoftext|>".into(),
            id,
            special: true,
        });
        let spec = ModelSpec {
            tokens,
            token_bytes: token_bytes.clone(),
            byte_level: true,
            byte_fallback: false,
            unk: None,
            fuse_unk: false,
            ignore_merges: false,
        };
        Ok(Tokenizer::from_parts(Parts {
            model: spec.build(&merges),
            normalizers: Vec::new(),
            splitters: vec![Splitter::Gpt2],
            prefix_space: false,
            added: added.into_iter().collect(),
            token_bytes,
            strip_leading_space: false,
            bos: None,
            eos,
        }))
    }
}

/// What the decoder section says about turning tokens back into bytes.
#[derive(Default)]
struct DecoderInfo {
    byte_level: bool,
    /// `<0xNN>` tokens decode to their byte (HF `ByteFallback` decoder); without it they stay literal text.
    byte_fallback: bool,
    marker: Option<String>,
    strip_leading_space: bool,
}

/// What the pre-tokenizer section contributes.
#[derive(Default)]
struct PreInfo {
    splitters: Vec<Splitter>,
    byte_level: bool,
    prefix_space: bool,
    metaspace: Option<Normalize>,
}

struct HfLoader<'p> {
    path: &'p Path,
}

impl HfLoader<'_> {
    fn bad(&self, message: impl Into<String>) -> TokenizerError {
        TokenizerError::malformed(self.path, message)
    }

    fn unsupported(&self, what: impl Into<String>) -> TokenizerError {
        TokenizerError::Unsupported {
            path: self.path.to_owned(),
            what: what.into(),
        }
    }

    fn load(&self, root: &Value) -> Result<Tokenizer> {
        let model = root
            .get("model")
            .ok_or_else(|| self.bad("missing key `model`"))?;
        if let Some(kind) = model.get("type").and_then(Value::as_str)
            && kind != "BPE"
        {
            return Err(self.unsupported(format!("model type {kind:?} (only BPE)")));
        }
        let flag = |key: &str| model.get(key).and_then(Value::as_bool).unwrap_or(false);
        if model
            .get("dropout")
            .and_then(Value::as_f64)
            .is_some_and(|d| d > 0.0)
        {
            return Err(self.unsupported("BPE dropout"));
        }
        for key in ["continuing_subword_prefix", "end_of_word_suffix"] {
            if model
                .get(key)
                .and_then(Value::as_str)
                .is_some_and(|s| !s.is_empty())
            {
                return Err(self.unsupported(format!("model.{key}")));
            }
        }
        let tokens = self.vocab(
            model
                .get("vocab")
                .ok_or_else(|| self.bad("missing key `model.vocab`"))?,
            "model.vocab",
        )?;
        let merges = model
            .get("merges")
            .and_then(Value::as_array)
            .ok_or_else(|| self.bad("missing array `model.merges`"))?;
        let merges = self.merges(merges, &tokens)?;
        let unk = match model.get("unk_token").and_then(Value::as_str) {
            Some(u) => Some(tokens.iter().position(|t| t == u).ok_or_else(|| {
                self.bad(format!("model.unk_token {u:?} is not in the vocabulary"))
            })? as u32),
            None => None,
        };

        let mut normalizers = Vec::new();
        if let Some(n) = root.get("normalizer").filter(|v| !v.is_null()) {
            self.normalizer(n, &mut normalizers)?;
        }
        let mut pre = PreInfo::default();
        if let Some(p) = root.get("pre_tokenizer").filter(|v| !v.is_null()) {
            self.pre_tokenizer(p, &mut pre)?;
        }
        normalizers.extend(pre.metaspace.take());
        let mut decoder = DecoderInfo::default();
        if let Some(d) = root.get("decoder").filter(|v| !v.is_null()) {
            self.decoder(d, &mut decoder)?;
        }
        let byte_level = pre.byte_level || decoder.byte_level;
        let byte_fallback = flag("byte_fallback");
        let marker = decoder
            .marker
            .clone()
            .unwrap_or_else(|| "\u{2581}".to_owned());
        let token_bytes: Vec<Vec<u8>> = tokens
            .iter()
            .map(|t| {
                if byte_level {
                    byte_level_bytes(t)
                } else {
                    sentencepiece_bytes(t, decoder.byte_fallback, &marker)
                }
            })
            .collect();

        let added = self.added_tokens(root.get("added_tokens"))?;
        let find = |names: &[&str]| {
            names
                .iter()
                .find_map(|n| added.iter().find(|t| t.content == *n))
                .map(|t| t.id)
        };
        let (bos, eos) = (find(&BOS_NAMES), find(&EOS_NAMES));
        let spec = ModelSpec {
            tokens,
            token_bytes: token_bytes.clone(),
            byte_level,
            byte_fallback,
            unk,
            fuse_unk: flag("fuse_unk"),
            ignore_merges: flag("ignore_merges"),
        };
        Ok(Tokenizer::from_parts(Parts {
            model: spec.build(&merges),
            normalizers,
            splitters: pre.splitters,
            prefix_space: pre.prefix_space,
            added,
            token_bytes,
            strip_leading_space: decoder.strip_leading_space,
            bos,
            eos,
        }))
    }

    fn vocab(&self, vocab: &Value, key: &str) -> Result<Vec<String>> {
        let map = vocab
            .as_object()
            .ok_or_else(|| self.bad(format!("`{key}` is not an object")))?;
        let mut pairs = Vec::with_capacity(map.len());
        for (token, id) in map {
            let id = id
                .as_u64()
                .filter(|&i| i < u64::from(u32::MAX))
                .ok_or_else(|| self.bad(format!("{key}[{token:?}] is not a token id")))?;
            pairs.push((token.clone(), id as u32));
        }
        dense_tokens(pairs, self.path, key)
    }

    /// Merges as `"left right"` strings or `[left, right]` arrays, resolved to `(left, right, merged)` ids.
    fn merges(&self, merges: &[Value], tokens: &[String]) -> Result<Vec<(u32, u32, u32)>> {
        let ids: rustc_hash::FxHashMap<&str, u32> = tokens
            .iter()
            .enumerate()
            .rev()
            .map(|(i, t)| (t.as_str(), i as u32))
            .collect();
        let mut out = Vec::with_capacity(merges.len());
        for (n, merge) in merges.iter().enumerate() {
            let (left, right) = match merge {
                Value::String(s) => s
                    .split_once(' ')
                    .ok_or_else(|| self.bad(format!("merge {n} ({s:?}) is not `left right`")))?,
                Value::Array(a) if a.len() == 2 => match (a[0].as_str(), a[1].as_str()) {
                    (Some(l), Some(r)) => (l, r),
                    _ => return Err(self.bad(format!("merge {n} is not a pair of strings"))),
                },
                _ => return Err(self.bad(format!("merge {n} is neither a string nor a pair"))),
            };
            let id = |t: &str| {
                ids.get(t).copied().ok_or_else(|| {
                    self.bad(format!(
                        "merge {n} ({left:?} {right:?}): {t:?} is not in the vocabulary"
                    ))
                })
            };
            out.push((id(left)?, id(right)?, id(&format!("{left}{right}"))?));
        }
        Ok(out)
    }

    fn added_tokens(&self, added: Option<&Value>) -> Result<Vec<AddedToken>> {
        let Some(list) = added.and_then(Value::as_array) else {
            return Ok(Vec::new());
        };
        list.iter()
            .enumerate()
            .map(|(n, t)| {
                let content = t.get("content").and_then(Value::as_str);
                let id = t.get("id").and_then(Value::as_u64);
                match (content, id) {
                    (Some(content), Some(id)) => Ok(AddedToken {
                        content: content.to_owned(),
                        id: id as u32,
                        special: t.get("special").and_then(Value::as_bool).unwrap_or(false),
                    }),
                    _ => Err(self.bad(format!("added_tokens[{n}] needs `content` and `id`"))),
                }
            })
            .collect()
    }

    fn kind<'v>(&self, v: &'v Value, section: &str) -> Result<&'v str> {
        v.get("type")
            .and_then(Value::as_str)
            .ok_or_else(|| self.bad(format!("{section} without `type`")))
    }

    fn normalizer(&self, n: &Value, out: &mut Vec<Normalize>) -> Result<()> {
        match self.kind(n, "normalizer")? {
            "Sequence" => {
                for child in n
                    .get("normalizers")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    self.normalizer(child, out)?;
                }
            }
            "NFC" => out.push(Normalize::Nfc),
            "NFKC" => out.push(Normalize::Nfkc),
            "Prepend" => out.push(Normalize::Prepend(self.string(
                n,
                "prepend",
                "normalizer Prepend",
            )?)),
            "Replace" => {
                let (from, to) = self.replace(n, "normalizer Replace")?;
                out.push(Normalize::Replace(from, to));
            }
            other => return Err(self.unsupported(format!("normalizer type {other:?}"))),
        }
        Ok(())
    }

    fn string(&self, v: &Value, key: &str, section: &str) -> Result<String> {
        v.get(key)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| self.bad(format!("{section} needs string `{key}`")))
    }

    fn replace(&self, v: &Value, section: &str) -> Result<(String, String)> {
        let from = v
            .get("pattern")
            .and_then(|p| p.get("String"))
            .and_then(Value::as_str)
            .ok_or_else(|| self.unsupported(format!("{section} with a non-literal pattern")))?;
        Ok((from.to_owned(), self.string(v, "content", section)?))
    }

    fn metaspace(&self, v: &Value) -> Result<(char, Prepend)> {
        let replacement = self.string(v, "replacement", "Metaspace")?;
        let mut chars = replacement.chars();
        let (Some(c), None) = (chars.next(), chars.next()) else {
            return Err(self.bad("Metaspace replacement must be one character"));
        };
        let prepend = match v.get("prepend_scheme").and_then(Value::as_str) {
            Some("always") => Prepend::Always,
            Some("first") => Prepend::First,
            Some("never") => Prepend::Never,
            Some(other) => return Err(self.bad(format!("Metaspace prepend_scheme {other:?}"))),
            None if v.get("add_prefix_space").and_then(Value::as_bool) == Some(false) => {
                Prepend::Never
            }
            None => Prepend::Always,
        };
        Ok((c, prepend))
    }

    fn pre_tokenizer(&self, p: &Value, out: &mut PreInfo) -> Result<()> {
        match self.kind(p, "pre_tokenizer")? {
            "Sequence" => {
                for child in p
                    .get("pretokenizers")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    self.pre_tokenizer(child, out)?;
                }
            }
            "ByteLevel" => {
                out.byte_level = true;
                // HF's serde defaults for ByteLevel are add_prefix_space = true and use_regex = true.
                out.prefix_space = p
                    .get("add_prefix_space")
                    .and_then(Value::as_bool)
                    .unwrap_or(true);
                if p.get("use_regex").and_then(Value::as_bool).unwrap_or(true) {
                    out.splitters.push(Splitter::Gpt2);
                }
            }
            "Split" => {
                let behavior = p
                    .get("behavior")
                    .and_then(Value::as_str)
                    .unwrap_or("Isolated");
                if behavior != "Isolated" || p.get("invert").and_then(Value::as_bool) == Some(true)
                {
                    return Err(self.unsupported(format!(
                        "Split behavior {behavior:?} (only Isolated, not inverted)"
                    )));
                }
                let pattern = p
                    .get("pattern")
                    .ok_or_else(|| self.bad("Split needs `pattern`"))?;
                let splitter = match (
                    pattern.get("Regex").and_then(Value::as_str),
                    pattern.get("String").and_then(Value::as_str),
                ) {
                    (Some(re), _) => Splitter::from_pattern(re)?,
                    (None, Some(s)) => Splitter::regex(&regex_syntax::escape(s))?,
                    _ => return Err(self.bad("Split pattern needs `Regex` or `String`")),
                };
                out.splitters.push(splitter);
            }
            "Metaspace" => {
                let (replacement, prepend) = self.metaspace(p)?;
                out.metaspace = Some(Normalize::Metaspace {
                    replacement,
                    prepend,
                });
                if p.get("split").and_then(Value::as_bool).unwrap_or(true) {
                    out.splitters.push(Splitter::BeforeChar(replacement));
                }
            }
            other => return Err(self.unsupported(format!("pre_tokenizer type {other:?}"))),
        }
        Ok(())
    }

    fn decoder(&self, d: &Value, out: &mut DecoderInfo) -> Result<()> {
        match self.kind(d, "decoder")? {
            "Sequence" => {
                for child in d
                    .get("decoders")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    self.decoder(child, out)?;
                }
            }
            "ByteLevel" => out.byte_level = true,
            "ByteFallback" => out.byte_fallback = true,
            "Fuse" => {}
            "Replace" => {
                let (from, to) = self.replace(d, "decoder Replace")?;
                if to != " " {
                    return Err(self.unsupported(format!(
                        "decoder Replace {from:?} -> {to:?} (only to a space)"
                    )));
                }
                out.marker = Some(from);
            }
            "Strip" => {
                let start = d.get("start").and_then(Value::as_u64).unwrap_or(0);
                let stop = d.get("stop").and_then(Value::as_u64).unwrap_or(0);
                let content = d.get("content").and_then(Value::as_str).unwrap_or(" ");
                if content != " " || start > 1 || stop != 0 {
                    return Err(self.unsupported("decoder Strip other than one leading space"));
                }
                out.strip_leading_space = start == 1;
            }
            "Metaspace" => {
                let (replacement, prepend) = self.metaspace(d)?;
                out.marker = Some(replacement.to_string());
                out.strip_leading_space = prepend != Prepend::Never;
            }
            other => return Err(self.unsupported(format!("decoder type {other:?}"))),
        }
        Ok(())
    }
}
