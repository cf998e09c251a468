//! Code blocks in model text: fenced blocks with a language tag, found in one
//! linear pass (no regex, no backtracking), so a huge reply without any
//! delimiter costs one scan.

use crate::language::Language;

/// One delimiter pair: `open` + optional language tag + newline, the code,
/// then `close`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delimiters {
    /// Opens a block; a language tag may follow on the same line.
    pub open: String,
    /// Closes it.
    pub close: String,
    /// `open` and `close` count only at the start of a line (after spaces):
    /// true for Markdown fences, so a "```" inside a code line does not close the block.
    pub line_anchored: bool,
}

impl Delimiters {
    /// Markdown fences: ```` ```python ```` … ```` ``` ````.
    pub fn markdown() -> Self {
        Self { open: "```".into(), close: "```".into(), line_anchored: true }
    }

    /// Any pair, e.g. `("<execute>", "</execute>")`, matched anywhere.
    pub fn pair(open: impl Into<String>, close: impl Into<String>) -> Self {
        Self { open: open.into(), close: close.into(), line_anchored: false }
    }
}

/// A block found in model text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeBlock {
    /// The tag after the opening delimiter (`python` in ```` ```python ````), if any.
    pub tag: Option<String>,
    /// The language it runs as, if it is runnable under the extractor's rules.
    pub language: Option<Language>,
    /// The code between the delimiters.
    pub code: String,
    /// Byte range of the whole block (delimiters included) in the text.
    pub span: std::ops::Range<usize>,
}

/// What [`CodeBlockExtractor::extract`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Extraction {
    /// The text before the first block (the whole text if there is none).
    pub text_before: String,
    /// Every closed block, in order, runnable or not.
    pub blocks: Vec<CodeBlock>,
}

impl Extraction {
    /// The blocks to execute, in order.
    pub fn runnable(&self) -> impl Iterator<Item = (&CodeBlock, Language)> {
        self.blocks.iter().filter_map(|b| b.language.map(|l| (b, l)))
    }
}

/// Finds code blocks; by default only Markdown fences tagged with a runnable
/// language (`python`, `js`, `rust`, `sh`, `wasm`/`wat`, and their aliases)
/// execute: prose, `json`, `markdown` and untagged fences do not.
#[derive(Clone, Debug)]
pub struct CodeBlockExtractor {
    delimiters: Vec<Delimiters>,
    languages: Vec<Language>,
    untagged: Option<Language>,
}

impl Default for CodeBlockExtractor {
    fn default() -> Self {
        Self {
            delimiters: vec![Delimiters::markdown()],
            languages: vec![Language::Python, Language::JavaScript, Language::Rust, Language::Shell, Language::Wasm],
            untagged: None,
        }
    }
}

impl CodeBlockExtractor {
    /// Replaces the delimiter pairs (tried together; the earliest opening wins).
    pub fn delimiters(mut self, delimiters: Vec<Delimiters>) -> Self {
        self.delimiters = delimiters.into_iter().filter(|d| !d.open.is_empty() && !d.close.is_empty()).collect();
        self
    }

    /// Only these languages run.
    pub fn languages(mut self, languages: Vec<Language>) -> Self {
        self.languages = languages;
        self
    }

    /// Untagged blocks run as `language` (default: they do not run).
    pub fn untagged_as(mut self, language: Option<Language>) -> Self {
        self.untagged = language;
        self
    }

    /// Scans `text` once. Unclosed blocks are not blocks (a reply cut off
    /// mid-block runs nothing from it).
    pub fn extract(&self, text: &str) -> Extraction {
        let mut blocks = Vec::new();
        // Next opening position per delimiter pair; `None` once there is none.
        let mut next_open: Vec<Option<usize>> =
            self.delimiters.iter().map(|d| find_from(text, &d.open, 0, d.line_anchored)).collect();
        // The earliest next opening (the longest delimiter on a tie).
        let earliest = |next_open: &[Option<usize>]| {
            next_open
                .iter()
                .enumerate()
                .filter_map(|(i, at)| at.map(|at| (i, at)))
                .min_by_key(|&(i, at)| (at, std::cmp::Reverse(self.delimiters[i].open.len())))
        };
        while let Some((which, open_at)) = earliest(&next_open) {
            let d = &self.delimiters[which];
            let header_start = open_at + d.open.len();
            let header_end = text[header_start..].find('\n').map_or(text.len(), |i| header_start + i);
            let code_start = (header_end + 1).min(text.len());
            let close_at = find_from(text, &d.close, code_start, d.line_anchored);
            let Some(close_at) = close_at.filter(|_| header_end < text.len()) else {
                // No close after this opening: none after a later opening of
                // this pair either. Stop looking for it (keeps the scan linear).
                next_open[which] = None;
                continue;
            };
            let tag = text[header_start..header_end].split_whitespace().next().map(str::to_string);
            let code_end = if text[..close_at].ends_with('\n') { close_at - 1 } else { close_at };
            let code = text[code_start..code_end.max(code_start)].trim_end_matches('\r').to_string();
            let language = match &tag {
                Some(tag) => Language::from_id(tag).or_else(|| (tag == "wat").then_some(Language::Wasm)),
                None => self.untagged,
            }
            .filter(|l| self.languages.contains(l));
            let end = close_at + d.close.len();
            blocks.push(CodeBlock { tag, language, code, span: open_at..end });
            for (i, at) in next_open.iter_mut().enumerate() {
                if at.is_some_and(|at| at < end) {
                    *at = find_from(text, &self.delimiters[i].open, end, self.delimiters[i].line_anchored);
                }
            }
        }
        let text_before = blocks.first().map_or(text, |b| &text[..b.span.start]).to_string();
        Extraction { text_before, blocks }
    }
}

/// The first occurrence of `needle` at or after `from`; with `anchored`, only
/// where nothing but spaces or tabs precede it on its line.
fn find_from(text: &str, needle: &str, from: usize, anchored: bool) -> Option<usize> {
    let mut start = from;
    while start <= text.len() {
        let at = start + text[start..].find(needle)?;
        // Only the blanks right before `at` are looked at: linear overall.
        let before = text.as_bytes()[..at].iter().rev().find(|&&b| b != b' ' && b != b'\t');
        if !anchored || matches!(before, None | Some(b'\n')) {
            return Some(at);
        }
        start = at + needle.len();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchored_search_skips_mid_line_fences() {
        assert_eq!(find_from("a ``` b\n```", "```", 0, true), Some(8));
        assert_eq!(find_from("  ```", "```", 0, true), Some(2));
        assert_eq!(find_from("x```", "```", 0, false), Some(1));
    }
}
