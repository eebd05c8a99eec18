//! HF `tokenizer.json` (BPE models) and GPT-2's `vocab.json` + `merges.txt`.

use std::path::Path;

use serde_json::Value;

use crate::added::AddedToken;
use crate::error::{Result, TokenizerError};
use crate::load::ids::{RawAdded, SameText, check_added, dense_tokens, id_limit};
use crate::load::json::{self, Fields, type_name};
use crate::load::{ModelSpec, byte_level_bytes, read, sentencepiece_bytes};
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
        let root = json::parse(bytes, path)?;
        HfLoader::new(path).load(&root)
    }

    /// Loads GPT-2's `vocab.json` and `merges.txt` (byte-level BPE, GPT-2 pattern).
    pub fn from_gpt2_files(vocab: impl AsRef<Path>, merges: impl AsRef<Path>) -> Result<Self> {
        let (vocab_path, merges_path) = (vocab.as_ref(), merges.as_ref());
        let vocab = json::parse(&read(vocab_path)?, vocab_path)?;
        let merges_text = String::from_utf8(read(merges_path)?)
            .map_err(|_| TokenizerError::malformed(merges_path, "not UTF-8"))?;
        // Each merge with its line, so an error points at the line of the file.
        let (lines, merges): (Vec<usize>, Vec<Value>) = merges_text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.starts_with("#version") && !l.trim().is_empty())
            .map(|(n, l)| (n + 1, Value::String(l.to_owned())))
            .unzip();
        let pairs = HfLoader::new(vocab_path).vocab_pairs(&vocab, "vocab.json")?;
        // No added tokens here: every id is one of the file's entries.
        let limit = id_limit(pairs.len());
        let tokens = dense_tokens(pairs, limit, vocab_path, "vocab.json")?;
        let merges = HfLoader::new(merges_path)
            .merges(&merges, &tokens, |n| format!("line {}", lines[n]))?;
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
            add_bos: false,
            add_eos: false,
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
    f: Fields<'p>,
    path: &'p Path,
}

impl<'p> HfLoader<'p> {
    fn new(path: &'p Path) -> Self {
        HfLoader {
            f: Fields { path },
            path,
        }
    }

    fn bad(&self, message: impl Into<String>) -> TokenizerError {
        self.f.bad(message)
    }

    fn unsupported(&self, what: impl Into<String>) -> TokenizerError {
        TokenizerError::Unsupported {
            path: self.path.to_owned(),
            what: what.into(),
        }
    }

    fn load(&self, root: &Value) -> Result<Tokenizer> {
        let f = self.f;
        if !root.is_object() {
            return Err(self.bad(format!("expected a JSON object, found {}", type_name(root))));
        }
        let model = f
            .get(root, "model")
            .ok_or_else(|| self.bad("`model` (an object) is missing"))?;
        if !model.is_object() {
            return Err(self.bad(format!(
                "`model` must be an object, found {}",
                type_name(model)
            )));
        }
        if let Some(kind) = f.opt_str(model, "type", "model")?
            && kind != "BPE"
        {
            return Err(self.unsupported(format!("model type {kind:?} (only BPE)")));
        }
        let flag =
            |key: &str| Ok::<_, TokenizerError>(f.opt_bool(model, key, "model")?.unwrap_or(false));
        if f.opt_f64(model, "dropout", "model")?
            .is_some_and(|d| d > 0.0)
        {
            return Err(self.unsupported("BPE dropout"));
        }
        for key in ["continuing_subword_prefix", "end_of_word_suffix"] {
            if f.opt_str(model, key, "model")?
                .is_some_and(|s| !s.is_empty())
            {
                return Err(self.unsupported(format!("model.{key}")));
            }
        }
        let raw_added = self.added_tokens(root)?;
        let vocab = f
            .get(model, "vocab")
            .ok_or_else(|| self.bad("`model.vocab` (an object) is missing"))?;
        let pairs = self.vocab_pairs(vocab, "model.vocab")?;
        let limit = id_limit(pairs.len() + raw_added.len());
        let tokens = dense_tokens(pairs, limit, self.path, "model.vocab")?;
        let merges = self.merges(f.array(model, "merges", "model")?, &tokens, |n| {
            format!("model.merges[{n}]")
        })?;
        let unk = match f.opt_str(model, "unk_token", "model")? {
            Some(u) => Some(tokens.iter().position(|t| t == u).ok_or_else(|| {
                self.bad(format!("model.unk_token {u:?} is not in the vocabulary"))
            })? as u32),
            None => None,
        };

        let mut normalizers = Vec::new();
        if let Some(n) = f.get(root, "normalizer") {
            self.normalizer(n, "normalizer", &mut normalizers)?;
        }
        let mut pre = PreInfo::default();
        if let Some(p) = f.get(root, "pre_tokenizer") {
            self.pre_tokenizer(p, "pre_tokenizer", &mut pre)?;
        }
        normalizers.extend(pre.metaspace.take());
        let mut decoder = DecoderInfo::default();
        if let Some(d) = f.get(root, "decoder") {
            self.decoder(d, "decoder", &mut decoder)?;
        }
        let byte_level = pre.byte_level || decoder.byte_level;
        let byte_fallback = flag("byte_fallback")?;
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

        let added = check_added(raw_added, &tokens, limit, SameText::Refuse, self.path)?;
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
            fuse_unk: flag("fuse_unk")?,
            ignore_merges: flag("ignore_merges")?,
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
            add_bos: false,
            add_eos: false,
        }))
    }

    /// The `token -> id` entries of a vocabulary object, ids not yet range-checked.
    fn vocab_pairs(&self, vocab: &Value, key: &str) -> Result<Vec<(String, u64)>> {
        let map = vocab.as_object().ok_or_else(|| {
            self.bad(format!(
                "`{key}` must be an object of token -> id, found {}",
                type_name(vocab)
            ))
        })?;
        map.iter()
            .map(|(token, id)| {
                let id = id.as_u64().ok_or_else(|| {
                    self.bad(format!(
                        "{key}[{token:?}] must be a non-negative integer id, found {}",
                        type_name(id)
                    ))
                })?;
                Ok((token.clone(), id))
            })
            .collect()
    }

    /// Merges as `"left right"` strings or `[left, right]` arrays, resolved to `(left, right, merged)` ids.
    /// `at(n)` names merge `n` in errors (its index in `model.merges`, or its line in `merges.txt`).
    fn merges(
        &self,
        merges: &[Value],
        tokens: &[String],
        at: impl Fn(usize) -> String,
    ) -> Result<Vec<(u32, u32, u32)>> {
        let ids: rustc_hash::FxHashMap<&str, u32> = tokens
            .iter()
            .enumerate()
            .rev()
            .filter(|(_, t)| !t.is_empty())
            .map(|(i, t)| (t.as_str(), i as u32))
            .collect();
        let mut out = Vec::with_capacity(merges.len());
        for (n, merge) in merges.iter().enumerate() {
            let n = at(n);
            let (left, right) = match merge {
                Value::String(s) => s
                    .split_once(' ')
                    .ok_or_else(|| self.bad(format!("{n} ({s:?}) is not `left right`")))?,
                Value::Array(a) if a.len() == 2 => match (a[0].as_str(), a[1].as_str()) {
                    (Some(l), Some(r)) => (l, r),
                    _ => return Err(self.bad(format!("{n} is not a pair of strings"))),
                },
                _ => return Err(self.bad(format!("{n} is neither a string nor a pair"))),
            };
            let id = |t: &str| {
                ids.get(t).copied().ok_or_else(|| {
                    self.bad(format!(
                        "{n} ({left:?} {right:?}): {t:?} is not in the vocabulary"
                    ))
                })
            };
            out.push((id(left)?, id(right)?, id(&format!("{left}{right}"))?));
        }
        Ok(out)
    }

    /// `added_tokens`: an array of `{content, id, special}` objects (absent or `null`: none).
    fn added_tokens(&self, root: &Value) -> Result<Vec<RawAdded>> {
        let f = self.f;
        let Some(list) = f.opt_array(root, "added_tokens", "")? else {
            return Ok(Vec::new());
        };
        list.iter()
            .enumerate()
            .map(|(n, t)| {
                let source = format!("added_tokens[{n}]");
                if !t.is_object() {
                    return Err(self.bad(format!(
                        "`{source}` must be an object, found {}",
                        type_name(t)
                    )));
                }
                let content = f.str(t, "content", &source)?.to_owned();
                let id = f
                    .opt_u64(t, "id", &source)?
                    .ok_or_else(|| self.bad(format!("`{source}.id` is missing")))?;
                let special = f.opt_bool(t, "special", &source)?.unwrap_or(false);
                Ok(RawAdded {
                    source,
                    content,
                    id,
                    special,
                })
            })
            .collect()
    }

    /// The `type` of a section (an object).
    fn kind<'v>(&self, v: &'v Value, section: &str) -> Result<&'v str> {
        if !v.is_object() {
            return Err(self.bad(format!(
                "`{section}` must be an object, found {}",
                type_name(v)
            )));
        }
        self.f.str(v, "type", section)
    }

    fn normalizer(&self, n: &Value, section: &str, out: &mut Vec<Normalize>) -> Result<()> {
        match self.kind(n, section)? {
            "Sequence" => {
                for (i, child) in self.f.array(n, "normalizers", section)?.iter().enumerate() {
                    self.normalizer(child, &format!("{section}.normalizers[{i}]"), out)?;
                }
            }
            "NFC" => out.push(Normalize::Nfc),
            "NFKC" => out.push(Normalize::Nfkc),
            "Prepend" => out.push(Normalize::Prepend(
                self.f.str(n, "prepend", section)?.to_owned(),
            )),
            "Replace" => {
                let (from, to) = self.replace(n, section)?;
                out.push(Normalize::Replace(from, to));
            }
            other => return Err(self.unsupported(format!("normalizer type {other:?}"))),
        }
        Ok(())
    }

    /// A `Replace` section's literal pattern and replacement.
    fn replace(&self, v: &Value, section: &str) -> Result<(String, String)> {
        let pattern = self.pattern(v, section)?;
        let Some(from) = self
            .f
            .opt_str(pattern, "String", &format!("{section}.pattern"))?
        else {
            return Err(self.unsupported(format!("{section} with a non-literal pattern")));
        };
        Ok((
            from.to_owned(),
            self.f.str(v, "content", section)?.to_owned(),
        ))
    }

    /// A section's `pattern` object (`{"String": ...}` or `{"Regex": ...}`).
    fn pattern<'v>(&self, v: &'v Value, section: &str) -> Result<&'v Value> {
        let pattern = self
            .f
            .get(v, "pattern")
            .ok_or_else(|| self.bad(format!("`{section}.pattern` is missing")))?;
        if !pattern.is_object() {
            return Err(self.bad(format!(
                "`{section}.pattern` must be an object, found {}",
                type_name(pattern)
            )));
        }
        Ok(pattern)
    }

    fn metaspace(&self, v: &Value, section: &str) -> Result<(char, Prepend)> {
        let f = self.f;
        let replacement = f.str(v, "replacement", section)?;
        let mut chars = replacement.chars();
        let (Some(c), None) = (chars.next(), chars.next()) else {
            return Err(self.bad(format!(
                "`{section}.replacement` must be one character, found {replacement:?}"
            )));
        };
        let prepend = match f.opt_str(v, "prepend_scheme", section)? {
            Some("always") => Prepend::Always,
            Some("first") => Prepend::First,
            Some("never") => Prepend::Never,
            Some(other) => {
                return Err(self.bad(format!(
                    "`{section}.prepend_scheme` is {other:?}, expected always, first or never"
                )));
            }
            None if f.opt_bool(v, "add_prefix_space", section)? == Some(false) => Prepend::Never,
            None => Prepend::Always,
        };
        Ok((c, prepend))
    }

    fn pre_tokenizer(&self, p: &Value, section: &str, out: &mut PreInfo) -> Result<()> {
        let f = self.f;
        match self.kind(p, section)? {
            "Sequence" => {
                for (i, child) in f.array(p, "pretokenizers", section)?.iter().enumerate() {
                    self.pre_tokenizer(child, &format!("{section}.pretokenizers[{i}]"), out)?;
                }
            }
            "ByteLevel" => {
                out.byte_level = true;
                // HF's serde defaults for ByteLevel are add_prefix_space = true and use_regex = true.
                out.prefix_space = f.opt_bool(p, "add_prefix_space", section)?.unwrap_or(true);
                if f.opt_bool(p, "use_regex", section)?.unwrap_or(true) {
                    out.splitters.push(Splitter::Gpt2);
                }
            }
            "Split" => {
                let behavior = f.opt_str(p, "behavior", section)?.unwrap_or("Isolated");
                if behavior != "Isolated" || f.opt_bool(p, "invert", section)? == Some(true) {
                    return Err(self.unsupported(format!(
                        "Split behavior {behavior:?} (only Isolated, not inverted)"
                    )));
                }
                let pattern = self.pattern(p, section)?;
                let at = format!("{section}.pattern");
                let splitter = match (
                    f.opt_str(pattern, "Regex", &at)?,
                    f.opt_str(pattern, "String", &at)?,
                ) {
                    // A pattern error names the pattern but not the file it came from.
                    (Some(re), _) => Splitter::from_pattern(re)
                        .map_err(|e| self.bad(format!("`{at}.Regex`: {e}")))?,
                    (None, Some(s)) => Splitter::regex(&regex_syntax::escape(s))
                        .map_err(|e| self.bad(format!("`{at}.String`: {e}")))?,
                    _ => return Err(self.bad(format!("`{at}` needs `Regex` or `String`"))),
                };
                out.splitters.push(splitter);
            }
            "Metaspace" => {
                let (replacement, prepend) = self.metaspace(p, section)?;
                out.metaspace = Some(Normalize::Metaspace {
                    replacement,
                    prepend,
                });
                if f.opt_bool(p, "split", section)?.unwrap_or(true) {
                    out.splitters.push(Splitter::BeforeChar(replacement));
                }
            }
            other => return Err(self.unsupported(format!("pre_tokenizer type {other:?}"))),
        }
        Ok(())
    }

    fn decoder(&self, d: &Value, section: &str, out: &mut DecoderInfo) -> Result<()> {
        let f = self.f;
        match self.kind(d, section)? {
            "Sequence" => {
                for (i, child) in f.array(d, "decoders", section)?.iter().enumerate() {
                    self.decoder(child, &format!("{section}.decoders[{i}]"), out)?;
                }
            }
            "ByteLevel" => out.byte_level = true,
            "ByteFallback" => out.byte_fallback = true,
            "Fuse" => {}
            "Replace" => {
                let (from, to) = self.replace(d, section)?;
                if to != " " {
                    return Err(self.unsupported(format!(
                        "decoder Replace {from:?} -> {to:?} (only to a space)"
                    )));
                }
                out.marker = Some(from);
            }
            "Strip" => {
                let start = f.opt_u64(d, "start", section)?.unwrap_or(0);
                let stop = f.opt_u64(d, "stop", section)?.unwrap_or(0);
                let content = f.opt_str(d, "content", section)?.unwrap_or(" ");
                if content != " " || start > 1 || stop != 0 {
                    return Err(self.unsupported("decoder Strip other than one leading space"));
                }
                out.strip_leading_space = start == 1;
            }
            "Metaspace" => {
                let (replacement, prepend) = self.metaspace(d, section)?;
                out.marker = Some(replacement.to_string());
                out.strip_leading_space = prepend != Prepend::Never;
            }
            other => return Err(self.unsupported(format!("decoder type {other:?}"))),
        }
        Ok(())
    }
}
