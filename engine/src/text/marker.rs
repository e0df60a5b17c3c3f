//! Finding tag-like markers (`<think>`, `<tool_call>`, `[TOOL_CALLS]`) in text
//! that arrives in pieces: a piece may end in the middle of one, so the parsers
//! hold back the end of their text that could still become a marker.

/// The length of the longest end of `text` that is a proper start of one of
/// `markers` (0 if none): text that must wait for the next piece.
pub fn partial_marker_len(text: &str, markers: &[&str]) -> usize {
    let mut longest = 0;
    for marker in markers {
        let most = marker.len().saturating_sub(1).min(text.len());
        for len in (longest + 1..=most).rev() {
            let start = text.len() - len;
            if text.is_char_boundary(start) && marker.starts_with(&text[start..]) {
                longest = len;
                break;
            }
        }
    }
    longest
}

/// `text` cut into pieces of `step` bytes (each stretched to the next char
/// boundary), as a stream would deliver it: the parsers' tests feed these.
#[cfg(test)]
pub(crate) fn stream_pieces(text: &str, step: usize) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut start = 0;
    while start < text.len() {
        let mut end = (start + step).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        pieces.push(&text[start..end]);
        start = end;
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_what_may_become_a_marker() {
        assert_eq!(partial_marker_len("abc <tool", &["<tool_call>"]), 5);
        assert_eq!(partial_marker_len("abc <", &["<tool_call>", "</s>"]), 1);
        assert_eq!(partial_marker_len("abc </", &["<tool_call>", "</s>"]), 2);
        assert_eq!(partial_marker_len("abc", &["<tool_call>"]), 0);
        // A whole marker is not partial (the caller finds it).
        assert_eq!(partial_marker_len("<a>", &["<a>"]), 0);
        assert_eq!(partial_marker_len("é", &["éa"]), 2);
    }
}
