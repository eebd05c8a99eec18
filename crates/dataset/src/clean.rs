//! Document preparation for chat and e-mail style text: normalisation, reply and signature stripping, and
//! redaction of personal data into placeholder tokens.
//!
//! Each rule is a separate public function so it can be tested and reasoned about alone; [`Cleaner`] runs them in
//! the order that makes them compose: line endings first (the line rules split on `\n`), then quoted replies and
//! signatures (both cut whole lines), then redaction, then whitespace (which tidies what the cuts left).

use regex::{Captures, Regex};

/// Replaces an e-mail address.
pub const EMAIL_PLACEHOLDER: &str = "<|email|>";
/// Replaces a URL.
pub const URL_PLACEHOLDER: &str = "<|url|>";
/// Replaces a phone number.
pub const PHONE_PLACEHOLDER: &str = "<|phone|>";
/// Replaces a long run of digits (account, card, order or ID numbers).
pub const NUMBER_PLACEHOLDER: &str = "<|number|>";

/// Which cleaning rules to apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CleanOptions {
    /// Normalise line endings and whitespace ([`normalize_whitespace`]).
    pub normalize_whitespace: bool,
    /// Remove quoted replies and their attribution lines ([`strip_quoted_replies`]).
    pub strip_quoted_replies: bool,
    /// Remove the signature block ([`strip_signature`]).
    pub strip_signature: bool,
    /// Replace e-mail addresses, URLs, phone numbers and long digit runs by placeholders ([`Redactor`]).
    pub redact: bool,
}

impl CleanOptions {
    /// Every rule enabled (what `ember prepare --clean` uses).
    pub fn all() -> Self {
        Self {
            normalize_whitespace: true,
            strip_quoted_replies: true,
            strip_signature: true,
            redact: true,
        }
    }
}

/// Applies the enabled rules of a [`CleanOptions`] to documents.
#[derive(Debug, Clone)]
pub struct Cleaner {
    options: CleanOptions,
    redactor: Redactor,
}

impl Cleaner {
    /// A cleaner applying `options`.
    pub fn new(options: CleanOptions) -> Self {
        Self {
            options,
            redactor: Redactor::new(),
        }
    }

    /// The cleaned document.
    pub fn clean(&self, text: &str) -> String {
        let mut text = normalize_line_endings(text);
        if self.options.strip_quoted_replies {
            text = strip_quoted_replies(&text);
        }
        if self.options.strip_signature {
            text = strip_signature(&text);
        }
        if self.options.redact {
            text = self.redactor.redact(&text);
        }
        if self.options.normalize_whitespace {
            text = normalize_whitespace(&text);
        }
        text
    }
}

/// Turns `\r\n` and lone `\r` into `\n`.
pub fn normalize_line_endings(text: &str) -> String {
    text.replace("\r\n", "\n").replace('\r', "\n")
}

/// Normalises line endings to `\n`, removes zero-width characters and the byte-order mark, turns tabs and Unicode
/// spaces (no-break, thin, ideographic, ...) into ASCII spaces, collapses runs of spaces, trims every line, keeps at
/// most one blank line between paragraphs, and trims the document.
pub fn normalize_whitespace(text: &str) -> String {
    let text = normalize_line_endings(text);
    let mut out = String::with_capacity(text.len());
    let mut blank_run = 0usize;
    for line in text.split('\n') {
        let mut cleaned = String::with_capacity(line.len());
        for c in line.chars() {
            match c {
                '\u{200B}'..='\u{200D}' | '\u{2060}' | '\u{FEFF}' => {}
                c if c == '\t' || (c.is_whitespace() && c != '\n') => {
                    if !cleaned.is_empty() && !cleaned.ends_with(' ') {
                        cleaned.push(' ');
                    }
                }
                c => cleaned.push(c),
            }
        }
        let cleaned = cleaned.trim_end();
        if cleaned.is_empty() {
            blank_run += 1;
            continue;
        }
        if !out.is_empty() {
            out.push_str(if blank_run > 0 { "\n\n" } else { "\n" });
        }
        out.push_str(cleaned);
        blank_run = 0;
    }
    out
}

/// Removes quoted text from a reply: lines starting with `>`, the attribution line introducing them
/// (`On Tue, 3 Mar 2020 at 10:15, Ann <ann@example.com> wrote:`, also when wrapped over two lines), and everything
/// from an Outlook-style `-----Original Message-----` or `________________` + `From:` separator on.
pub fn strip_quoted_replies(text: &str) -> String {
    let lines: Vec<&str> = text.split('\n').collect();
    let mut kept = Vec::with_capacity(lines.len());
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim();
        let next = lines.get(i + 1).map(|l| l.trim()).unwrap_or("");
        if is_original_message_separator(line, next) {
            break;
        }
        if line.starts_with('>') {
            i += 1;
            continue;
        }
        if line.starts_with("On ") {
            if line.ends_with("wrote:") {
                i += 1;
                continue;
            }
            if next.ends_with("wrote:") && !next.starts_with('>') {
                i += 2;
                continue;
            }
        }
        kept.push(lines[i]);
        i += 1;
    }
    kept.join("\n")
}

fn is_original_message_separator(line: &str, next: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    (lower.starts_with("-----") && lower.contains("original message"))
        || (line.len() >= 10 && line.chars().all(|c| c == '_') && next.starts_with("From:"))
}

/// Lines that end a message and introduce the sender's name: a sign-off, lower-cased, without trailing
/// punctuation.
const SIGN_OFFS: &[&str] = &[
    "best",
    "best regards",
    "best wishes",
    "kind regards",
    "warm regards",
    "regards",
    "many thanks",
    "thanks",
    "thanks again",
    "thank you",
    "cheers",
    "sincerely",
    "yours sincerely",
    "yours truly",
    "all the best",
    "talk soon",
    "br",
];

/// The most lines (name, title, company, phone) a sign-off may be followed by and still count as a signature.
const MAX_SIGNATURE_LINES: usize = 4;
/// The longest line (in characters) that can be part of a signature block after a sign-off.
const MAX_SIGNATURE_LINE_CHARS: usize = 40;

/// Removes the signature: everything from a `-- ` delimiter line (RFC 3676) on; "Sent from my ..." lines; and a
/// closing sign-off ("Best regards,", "Thanks,", "Cheers", ...) on a line of its own when at most
/// four short lines follow it to the end of the message. A sign-off inside a sentence
/// ("Thanks, that fixed it") or followed by more text is kept.
pub fn strip_signature(text: &str) -> String {
    let mut lines: Vec<&str> = Vec::new();
    for line in text.split('\n') {
        if line == "-- " || line.trim_end() == "--" {
            break;
        }
        if line
            .trim()
            .to_ascii_lowercase()
            .starts_with("sent from my ")
        {
            continue;
        }
        lines.push(line);
    }
    // Indices of the non-empty lines; the sign-off must be one of the last MAX_SIGNATURE_LINES + 1 of them, must
    // not be the first (a message that is only "Thanks!" keeps it), and only short lines may follow it.
    let content: Vec<usize> = (0..lines.len())
        .filter(|&i| !lines[i].trim().is_empty())
        .collect();
    let first_candidate = content.len().saturating_sub(MAX_SIGNATURE_LINES + 1).max(1);
    let cut = (first_candidate..content.len()).find(|&k| {
        is_sign_off(lines[content[k]])
            && content[k + 1..]
                .iter()
                .all(|&j| lines[j].trim().chars().count() <= MAX_SIGNATURE_LINE_CHARS)
    });
    if let Some(k) = cut {
        lines.truncate(content[k]);
    }
    lines.join("\n")
}

fn is_sign_off(line: &str) -> bool {
    let lower = line
        .trim()
        .trim_end_matches([',', '.', '!', '-'])
        .trim()
        .to_lowercase();
    SIGN_OFFS.contains(&lower.as_str())
}

/// Replaces personal data by placeholders: URLs ([`URL_PLACEHOLDER`]), then e-mail addresses
/// ([`EMAIL_PLACEHOLDER`]), then phone numbers ([`PHONE_PLACEHOLDER`]), then long digit runs
/// ([`NUMBER_PLACEHOLDER`]). URLs go first because they may contain `@` and digits.
#[derive(Debug, Clone)]
pub struct Redactor {
    url: Regex,
    email: Regex,
    phone: Regex,
    number: Regex,
    date: Regex,
}

impl Default for Redactor {
    fn default() -> Self {
        Self::new()
    }
}

/// The fewest and most digits a phone number has (E.164 allows up to 15; 7 is a local number without area code).
const PHONE_DIGITS: std::ops::RangeInclusive<usize> = 7..=15;
/// The fewest digits in a run that is redacted as a number: long enough to spare years, prices and counts.
const MIN_NUMBER_DIGITS: usize = 6;

impl Redactor {
    /// Compiles the patterns.
    pub fn new() -> Self {
        // The patterns are constants; a failure to compile is a programming error caught by every test.
        let re =
            |p: &str| Regex::new(p).unwrap_or_else(|e| panic!("invalid built-in pattern {p}: {e}"));
        Self {
            url: re(r#"(?i)\b(?:https?://|ftp://|www\.)[^\s<>"'`{}|\\^\[\]]+"#),
            email: re(r"(?i)\b[a-z0-9._%+-]+@[a-z0-9-]+(?:\.[a-z0-9-]+)*\.[a-z]{2,}\b"),
            phone: re(r"(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,4}\)[ .-]?)?\d{2,4}(?:[ .-]?\d{2,4}){1,4}"),
            number: re(&format!(
                r"\b(?:\d{{4}}[ -]){{3}}\d{{4}}\b|\b\d{{{MIN_NUMBER_DIGITS},}}\b"
            )),
            date: re(
                r"^(?:\d{4}[./-]\d{1,2}[./-]\d{1,2}|\d{1,2}[./-]\d{1,2}[./-]\d{2,4}|\d{1,3}(?:\.\d{1,3}){3})$",
            ),
        }
    }

    /// `text` with every match replaced by its placeholder.
    pub fn redact(&self, text: &str) -> String {
        let text = self.url.replace_all(text, |c: &Captures| {
            // Sentence punctuation after a URL is not part of it.
            let url = &c[0];
            let trimmed = url.trim_end_matches(['.', ',', ';', ':', '!', '?', ')']);
            format!("{URL_PLACEHOLDER}{}", &url[trimmed.len()..])
        });
        let text = self.email.replace_all(&text, EMAIL_PLACEHOLDER);
        let text = self.redact_phones(&text);
        self.number
            .replace_all(&text, NUMBER_PLACEHOLDER)
            .into_owned()
    }

    /// A phone-number candidate is kept as a phone only if it has 7 to 15 digits, is written like a phone number
    /// (a `+` country code, an area code in parentheses, or separators between digit groups; a bare digit run is
    /// left to the number rule), is not a date or an IPv4 address, and is not glued to a word.
    fn redact_phones(&self, text: &str) -> String {
        self.phone
            .replace_all(text, |c: &Captures| {
                let m = c.get(0).map_or(0..0, |m| m.range());
                let candidate = &text[m.clone()];
                let digits = candidate.chars().filter(char::is_ascii_digit).count();
                let formatted = candidate.contains(['+', '(', ' ', '-', '.']);
                let before = text[..m.start].chars().next_back();
                let after = text[m.end..].chars().next();
                let glued = before.is_some_and(|ch| ch.is_alphanumeric() || ch == '.' || ch == '/')
                    || after.is_some_and(|ch| ch.is_alphanumeric() || ch == '/');
                if PHONE_DIGITS.contains(&digits)
                    && formatted
                    && !glued
                    && !self.date.is_match(candidate)
                {
                    PHONE_PLACEHOLDER.to_string()
                } else {
                    candidate.to_string()
                }
            })
            .into_owned()
    }
}
