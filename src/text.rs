//! Text caps: every message execbox builds from what a program or the
//! caller supplied is bounded (a leaf: errors, results and backends use it).

/// Longest `message` (and diagnostic message) kept, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 4096;

/// Longest list of names (skipped files, ...) spelled out in a message;
/// the rest are counted.
pub const MAX_LISTED_NAMES: usize = 16;

/// Adds `note` to a result's `message` (after what it says, if anything).
pub fn add_note(message: &mut Option<String>, note: String) {
    *message = Some(match message.take() {
        Some(m) => format!("{m}; {note}"),
        None => note,
    });
}

/// `text` cut to [`MAX_MESSAGE_BYTES`] at a character boundary, with a note
/// of its full length when cut.
pub fn cap_message(text: String) -> String {
    cap_text(text, MAX_MESSAGE_BYTES)
}

/// `text` cut to `max` bytes at a character boundary, with a note of its full
/// length when cut (the note may take the result slightly past `max`).
pub fn cap_text(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let total = text.len();
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str(&format!("… [cut: {total} bytes in all]"));
    text
}

/// "a, b, c and 7 more": at most [`MAX_LISTED_NAMES`] items spelled out.
pub fn list_names<S: AsRef<str>>(names: &[S]) -> String {
    let shown: Vec<&str> = names.iter().take(MAX_LISTED_NAMES).map(AsRef::as_ref).collect();
    let mut text = shown.join(", ");
    if names.len() > shown.len() {
        text.push_str(&format!(" and {} more", names.len() - shown.len()));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_are_cut_on_a_char_boundary() {
        let text = "é".repeat(MAX_MESSAGE_BYTES);
        let capped = cap_message(text);
        assert!(capped.len() < MAX_MESSAGE_BYTES + 64);
        assert!(capped.ends_with(&format!("[cut: {} bytes in all]", 2 * MAX_MESSAGE_BYTES)));
        assert_eq!(cap_message("short".into()), "short");
    }

    #[test]
    fn names_are_listed_up_to_a_bound() {
        let names: Vec<String> = (0..100).map(|i| format!("f{i}")).collect();
        let text = list_names(&names);
        assert!(text.ends_with("f15 and 84 more"), "{text}");
        assert_eq!(list_names(&["a", "b"]), "a, b");
    }
}
