//! Stop strings matched in the decoded text, across token boundaries.
//!
//! Text is fed in as it is decoded; the matcher releases only text that can no longer be the start of a stop
//! string, so a streamed output never shows part of a stop string that is completed by a later token.

/// What [`StopMatcher::push`] decided about the text fed so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StopStep {
    /// Text that is now final and can be shown.
    pub emit: String,
    /// Whether a stop string was completed (the text before it has been emitted; it and anything after dropped).
    pub stopped: bool,
}

/// Finds the first occurrence of any of a set of stop strings in a stream of text pieces.
#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not yet emitted because it may begin a stop string.
    pending: String,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: impl IntoIterator<Item = String>) -> Self {
        Self {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            pending: String::new(),
        }
    }

    /// Feeds the next decoded piece.
    pub fn push(&mut self, piece: &str) -> StopStep {
        self.pending.push_str(piece);
        let first_match = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min();
        if let Some(at) = first_match {
            let emit = self.pending[..at].to_string();
            self.pending.clear();
            return StopStep {
                emit,
                stopped: true,
            };
        }
        let keep = self.longest_partial_suffix();
        let cut = self.pending.len() - keep;
        let emit = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        StopStep {
            emit,
            stopped: false,
        }
    }

    /// Releases the held-back text at the end of generation (no stop string can be completed any more).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Bytes at the end of `pending` that are a proper prefix of some stop string (on a char boundary).
    fn longest_partial_suffix(&self) -> usize {
        let text = &self.pending;
        self.stops
            .iter()
            .flat_map(|stop| {
                (1..stop.len().min(text.len() + 1))
                    .filter(|&n| stop.is_char_boundary(n) && text.is_char_boundary(text.len() - n))
                    .filter(|&n| text.ends_with(&stop[..n]))
            })
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()));
        let mut out = String::new();
        for p in pieces {
            let step = m.push(p);
            out.push_str(&step.emit);
            if step.stopped {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn stop_string_split_across_pieces_is_found() {
        assert_eq!(
            run(&["\nUser:"], &["Hi", " there\nUs", "er: next"]),
            ("Hi there".to_string(), true)
        );
    }

    #[test]
    fn partial_match_is_held_back_then_released() {
        let mut m = StopMatcher::new(["END".to_string()]);
        assert_eq!(m.push("abcE").emit, "abc", "`E` may start `END`");
        assert_eq!(m.push("Nx").emit, "ENx", "`ENx` cannot");
        assert_eq!(m.push("EN").emit, "");
        assert_eq!(m.finish(), "EN", "the end of generation releases the rest");
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        assert_eq!(run(&["cd", "b"], &["abcd"]), ("a".to_string(), true));
    }

    #[test]
    fn without_a_match_all_text_comes_out() {
        assert_eq!(run(&["zz"], &["a", "z", "b"]), ("azb".to_string(), false));
        assert_eq!(run(&[], &["a", "b"]), ("ab".to_string(), false));
    }

    #[test]
    fn multibyte_stop_strings_respect_char_boundaries() {
        assert_eq!(run(&["é!"], &["caf", "é", "!"]), ("caf".to_string(), true));
        assert_eq!(
            run(&["é!"], &["caf", "é", "?"]),
            ("café?".to_string(), false)
        );
    }
}
