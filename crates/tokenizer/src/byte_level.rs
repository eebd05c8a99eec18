//! GPT-2's reversible byte-to-unicode mapping: every byte becomes a printable character so that a byte-level
//! vocabulary can be stored as JSON strings. Printable Latin-1 bytes map to themselves; the other 68 bytes map, in
//! order, to U+0100 onwards.

use std::sync::OnceLock;

struct Tables {
    to_char: [char; 256],
    /// Indexed by code point for code points below 0x180 (all images of the mapping are below 0x144).
    to_byte: [Option<u8>; 0x180],
}

fn tables() -> &'static Tables {
    static TABLES: OnceLock<Tables> = OnceLock::new();
    TABLES.get_or_init(|| {
        let mut to_char = ['\0'; 256];
        let mut to_byte = [None; 0x180];
        let mut next = 0x100u32;
        for b in 0..=255u8 {
            let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
            let cp = if printable {
                u32::from(b)
            } else {
                next += 1;
                next - 1
            };
            let c = char::from_u32(cp).expect("code points below 0x180 are valid");
            to_char[usize::from(b)] = c;
            to_byte[cp as usize] = Some(b);
        }
        Tables { to_char, to_byte }
    })
}

/// The character that stands for `byte` in a byte-level vocabulary.
pub fn byte_to_char(byte: u8) -> char {
    tables().to_char[usize::from(byte)]
}

/// The byte a byte-level character stands for, or `None` if `c` is not an image of the mapping.
pub fn char_to_byte(c: char) -> Option<u8> {
    tables().to_byte.get(c as usize).copied().flatten()
}

/// Maps raw bytes to their byte-level string (as stored in `vocab.json`).
pub fn bytes_to_string(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| byte_to_char(b)).collect()
}

/// Maps a byte-level string back to raw bytes; `None` if a character is not an image of the mapping.
pub fn string_to_bytes(s: &str) -> Option<Vec<u8>> {
    s.chars().map(char_to_byte).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_matches_gpt2_reference_points_and_is_a_bijection() {
        // Fixed points from GPT-2's encoder.py: space is the 33rd unmapped byte (0..=32 come first) -> U+0120 'Ġ',
        // newline is the 11th -> U+010A 'Ċ', and 'A' maps to itself.
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'A'), 'A');
        assert_eq!(byte_to_char(0xAD), '\u{0143}');
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(string_to_bytes(&bytes_to_string(&all)), Some(all));
        assert_eq!(char_to_byte('€'), None);
    }
}
