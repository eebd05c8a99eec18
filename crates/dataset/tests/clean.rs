//! Each cleaning rule on realistic chat and e-mail samples.

use ember_dataset::clean::{
    CleanOptions, Cleaner, Redactor, normalize_line_endings, normalize_whitespace,
    strip_quoted_replies, strip_signature,
};

#[test]
fn line_endings_become_newlines() {
    assert_eq!(normalize_line_endings("a\r\nb\rc\nd"), "a\nb\nc\nd");
}

#[test]
fn whitespace_is_collapsed_and_blank_lines_limited() {
    let raw = "\u{FEFF}  Hello\u{00A0}\u{00A0}team,\t \r\n\r\n\r\n\r\nThe  build\u{200B} is   green.   \n   \n";
    assert_eq!(
        normalize_whitespace(raw),
        "Hello team,\n\nThe build is green."
    );
}

#[test]
fn quoted_lines_and_wrapped_attribution_are_removed() {
    let reply = "Sounds good, see you then.\n\nOn Tue, Mar 3, 2020 at 10:15 AM Ann Lee <ann@example.com>\nwrote:\n> Can we meet at 3?\n>> Earlier thread\n> Ann";
    assert_eq!(
        strip_quoted_replies(reply).trim_end(),
        "Sounds good, see you then."
    );
    let one_line = "Yes.\nOn 03/03/2020 10:15, Bob wrote:\n> Ready?";
    assert_eq!(strip_quoted_replies(one_line), "Yes.");
}

#[test]
fn outlook_original_message_block_is_removed() {
    let mail = "Approved.\n\n-----Original Message-----\nFrom: Carol\nSent: Monday\nSubject: budget\n\nPlease approve.";
    assert_eq!(strip_quoted_replies(mail).trim_end(), "Approved.");
    let underscored =
        "Done.\n________________________________\nFrom: Dan <dan@corp.com>\nSent: Friday";
    assert_eq!(strip_quoted_replies(underscored), "Done.");
}

#[test]
fn text_that_merely_mentions_quotes_is_kept() {
    let text = "On Monday we ship.\nThe ratio is 3 > 2, which she wrote: fine.";
    assert_eq!(strip_quoted_replies(text), text);
}

#[test]
fn signature_after_the_dash_dash_delimiter_is_removed() {
    let mail =
        "See the attached plan.\n\n-- \nEve Smith\nHead of Ops, Example Ltd\n+1 555 010 0199";
    assert_eq!(strip_signature(mail).trim_end(), "See the attached plan.");
}

#[test]
fn closing_sign_off_and_name_are_removed() {
    let mail = "Thanks for the quick turnaround on the draft.\n\nBest regards,\nFrank Miller\nSenior Analyst";
    assert_eq!(
        strip_signature(mail).trim_end(),
        "Thanks for the quick turnaround on the draft."
    );
    let chat = "ok pushing the fix now\ncheers\nG";
    assert_eq!(strip_signature(chat), "ok pushing the fix now");
    let phone = "Running late, start without me.\n\nSent from my iPhone";
    assert_eq!(
        strip_signature(phone).trim_end(),
        "Running late, start without me."
    );
}

#[test]
fn sign_off_words_inside_the_message_are_kept() {
    // "Thanks" starts a sentence, and a sign-off-like line followed by a long paragraph is not a signature.
    let mail = "Thanks, that fixed it.";
    assert_eq!(strip_signature(mail), mail);
    let long = "Intro.\nThanks\nHere is a much longer paragraph that continues the message with real content.";
    assert_eq!(strip_signature(long), long);
    let only = "Thanks!";
    assert_eq!(strip_signature(only), only);
}

#[test]
fn emails_and_urls_are_redacted() {
    let r = Redactor::new();
    assert_eq!(
        r.redact("Mail john.doe+news@mail.example.co.uk or see https://example.com/a?b=1&c=2."),
        "Mail <|email|> or see <|url|>."
    );
    assert_eq!(
        r.redact("(docs at www.example.org/guide)"),
        "(docs at <|url|>)"
    );
    assert_eq!(
        r.redact("login https://bob@host.example.com:8443/x"),
        "login <|url|>"
    );
}

#[test]
fn phone_numbers_in_common_formats_are_redacted() {
    let r = Redactor::new();
    for phone in [
        "+1 (555) 010-0199",
        "555-010-0199",
        "(020) 7946 0958",
        "+44 20 7946 0958",
        "+4915112345678",
    ] {
        assert_eq!(
            r.redact(&format!("call {phone} today")),
            "call <|phone|> today",
            "{phone}"
        );
    }
}

#[test]
fn dates_addresses_and_short_numbers_are_not_phones() {
    let r = Redactor::new();
    let text = "On 2024-01-15 at 10:30 we hit 192.168.100.200; 12.05.2023 was v1.2.3 with 42 users in 2023.";
    assert_eq!(r.redact(text), text);
}

#[test]
fn long_digit_runs_and_card_numbers_are_redacted() {
    let r = Redactor::new();
    assert_eq!(
        r.redact("Order 88812345 shipped"),
        "Order <|number|> shipped"
    );
    assert_eq!(
        r.redact("card 4111 1111 1111 1111 exp"),
        "card <|number|> exp"
    );
    assert_eq!(r.redact("account 5551234567"), "account <|number|>");
    assert_eq!(r.redact("pin 12345 stays"), "pin 12345 stays");
}

#[test]
fn full_pipeline_cleans_a_realistic_reply() {
    let mail = "Hi Grace,\r\n\r\nPlease call me at 555-010-0199 or mail ops@example.com   about ticket 99812345.\r\n\r\nKind regards,\r\nHeidi\r\n\r\nOn Mon, 2 Mar 2020, Grace <grace@example.com> wrote:\r\n> Any news?\r\n";
    let cleaned = Cleaner::new(CleanOptions::all()).clean(mail);
    assert_eq!(
        cleaned,
        "Hi Grace,\n\nPlease call me at <|phone|> or mail <|email|> about ticket <|number|>."
    );
}

#[test]
fn disabled_rules_leave_the_text_alone() {
    let options = CleanOptions {
        redact: false,
        ..CleanOptions::all()
    };
    assert_eq!(
        Cleaner::new(options).clean("write to a@b.com\n"),
        "write to a@b.com"
    );
}
