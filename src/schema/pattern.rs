//! `pattern`, in place of the validator's own: the same ECMA-262
//! translation and the same engine (the `regex` crate's lazy DFA), without
//! its unbounded fallback.
//!
//! When the lazy DFA's cache fills again and again (a pattern whose
//! automaton grows by a state every few bytes), the `regex` crate falls
//! back to its PikeVM, whose time is the text's length times the pattern's
//! NFA: a 70-byte pattern over a 100 KB string took 61 s of a debug build,
//! long past any run's deadline. Here the lazy DFA gives up instead; a
//! string short enough for the bounded backtracker (the NFA's states times
//! the string's bytes within [`BACKTRACK_BITS`]) is matched by it, and a
//! longer one does not match, with a mismatch that says why: unchecked is
//! not accepted. A Unicode word boundary (`\b`) over non-ASCII text takes
//! the same way (the lazy DFA cannot see one).

use jsonschema::paths::Location;
use jsonschema::{Keyword, ValidationError};
use parking_lot::Mutex;
use regex_automata::hybrid::dfa::{self, DFA};
use regex_automata::nfa::thompson::NFA;
use regex_automata::nfa::thompson::backtrack::{self, BoundedBacktracker};
use regex_automata::{Input, MatchError};
use serde_json::{Map, Value};

/// Largest regular expression program a `pattern` may compile to (here and
/// in the validator's own `pattern` options).
pub(super) const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// The lazy DFA gives up once it cleared its cache this often while
/// building a state for fewer than [`BYTES_PER_STATE`] bytes of text (the
/// `regex` crate's own thresholds, before it falls back).
const CACHE_CLEARS: usize = 3;

/// See [`CACHE_CLEARS`]. Building a state costs up to the pattern's NFA
/// states, so a byte of text costs at most an NFA state per this many bytes
/// before the DFA gives up: what [`byte_cost`] counts.
const BYTES_PER_STATE: usize = 10;

/// The bounded backtracker's budget: it visits each (NFA state, byte) pair
/// at most once, marking it in a bitset of this many bits (256 KiB).
const BACKTRACK_BITS: usize = 1 << 21;

/// The keyword's factory (`pattern: "<ECMA-262 regular expression>"`).
pub(super) fn factory<'a>(
    _parent: &'a Map<String, Value>,
    value: &'a Value,
    _path: Location,
) -> Result<Box<dyn for<'i> Keyword<'i>>, ValidationError<'a>> {
    let Value::String(pattern) = value else { return Err(ValidationError::schema("pattern must be a string")) };
    let parts = translated(pattern).ok_or_else(|| {
        ValidationError::schema(format!("pattern {pattern:?} is not a regular expression execbox runs"))
    })?;
    let parts = parts
        .iter()
        .map(|part| Part::new(part))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ValidationError::schema(format!("pattern {pattern:?} does not compile: {e}")))?;
    Ok(Box::new(Pattern { source: pattern.clone(), parts }))
}

/// What one byte of text costs a `pattern` check at most, in evaluations
/// of the schema bounds: 8 for a small pattern, an NFA state per
/// [`BYTES_PER_STATE`] bytes for a large one. `None` for a pattern that
/// does not compile (the validator refuses it).
pub(super) fn byte_cost(pattern: &str) -> Option<u64> {
    Some((nfa_states(pattern)? / BYTES_PER_STATE as u64).max(8))
}

/// The states of the pattern's NFA (of all its parts): what the `regex`
/// crate's PikeVM may visit per byte of text, where `patternProperties`
/// (the validator's own) matches an object's keys.
pub(super) fn nfa_states(pattern: &str) -> Option<u64> {
    translated(pattern)?.iter().map(|part| nfa(part).ok().map(|n| n.states().len() as u64)).sum()
}

/// The pattern in the `regex` crate's syntax: one part, or (as the
/// validator does) a leading lookahead's parts, each of which must match.
fn translated(pattern: &str) -> Option<Vec<String>> {
    if let Some(parts) = jsonschema_regex::split_leading_lookaheads(pattern) {
        return parts.iter().map(|part| jsonschema_regex::to_rust_regex(part).ok().map(|p| p.into_owned())).collect();
    }
    jsonschema_regex::to_rust_regex(pattern).ok().map(|p| vec![p.into_owned()])
}

/// Why a pattern does not compile (the engine's own error, boxed: it is large).
type BuildError = Box<dyn std::error::Error + Send + Sync>;

/// The NFA both matchers run, size-limited as the validator's own.
fn nfa(translated: &str) -> Result<NFA, BuildError> {
    Ok(NFA::compiler().configure(NFA::config().nfa_size_limit(Some(REGEX_SIZE_LIMIT))).build(translated)?)
}

struct Pattern {
    source: String,
    parts: Vec<Part>,
}

/// One part of a pattern: its lazy DFA (with caches to reuse) and the
/// bounded backtracker for when the DFA gives up.
struct Part {
    dfa: DFA,
    caches: Mutex<Vec<dfa::Cache>>,
    backtracker: BoundedBacktracker,
}

/// Whether a string matches, or why it could not be told.
enum Matched {
    Yes,
    No,
    Untold(String),
}

impl Part {
    fn new(translated: &str) -> Result<Self, BuildError> {
        let nfa = nfa(translated)?;
        let dfa = DFA::builder()
            .configure(
                DFA::config()
                    .cache_capacity(REGEX_SIZE_LIMIT)
                    .minimum_cache_clear_count(Some(CACHE_CLEARS))
                    .minimum_bytes_per_state(Some(BYTES_PER_STATE))
                    .unicode_word_boundary(true),
            )
            .build_from_nfa(nfa.clone())?;
        let backtracker = BoundedBacktracker::builder()
            .configure(backtrack::Config::new().visited_capacity(BACKTRACK_BITS / 8))
            .build_from_nfa(nfa)?;
        Ok(Self { dfa, caches: Mutex::new(Vec::new()), backtracker })
    }

    fn matches(&self, text: &str) -> Matched {
        let mut cache = self.caches.lock().pop().unwrap_or_else(|| self.dfa.create_cache());
        let found = self.dfa.try_search_fwd(&mut cache, &Input::new(text).earliest(true));
        self.caches.lock().push(cache);
        match found {
            Ok(found) => Self::told(found.is_some()),
            Err(why) => self.backtrack(text, &why),
        }
    }

    /// The lazy DFA gave up (or met a word boundary over non-ASCII text):
    /// the backtracker tells, if the text is short enough for its budget.
    fn backtrack(&self, text: &str, why: &MatchError) -> Matched {
        if text.len() > self.backtracker.max_haystack_len() {
            return Matched::Untold(format!(
                "the pattern is too costly to match against {} bytes of text within execbox's bounds ({why})",
                text.len()
            ));
        }
        let mut cache = self.backtracker.create_cache();
        match self.backtracker.try_is_match(&mut cache, Input::new(text)) {
            Ok(found) => Self::told(found),
            Err(e) => Matched::Untold(format!("the pattern could not be matched: {e}")),
        }
    }

    fn told(found: bool) -> Matched {
        if found { Matched::Yes } else { Matched::No }
    }
}

impl Pattern {
    /// `None` when `instance` is no string or matches every part.
    fn mismatch(&self, instance: &Value) -> Option<String> {
        let Value::String(text) = instance else { return None };
        for part in &self.parts {
            match part.matches(text) {
                Matched::Yes => {}
                Matched::No => return Some(format!("{} does not match {:?}", quoted_start(text), self.source)),
                Matched::Untold(why) => return Some(format!("{why}: {:?} is not accepted unchecked", self.source)),
            }
        }
        None
    }
}

impl<'i> Keyword<'i> for Pattern {
    fn validate(&self, instance: &'i Value) -> Result<(), ValidationError<'i>> {
        self.mismatch(instance).map_or(Ok(()), |why| Err(ValidationError::custom(why)))
    }

    fn is_valid(&self, instance: &'i Value) -> bool {
        self.mismatch(instance).is_none()
    }
}

/// The text quoted as JSON, its first 80 characters only.
fn quoted_start(text: &str) -> String {
    match text.char_indices().nth(80) {
        Some((end, _)) => format!("{}...", Value::String(text[..end].to_string())),
        None => Value::String(text.to_string()).to_string(),
    }
}

/// A pattern whose lazy DFA thrashes on text of `a`s and `b`s.
#[cfg(test)]
pub(super) const COSTLY: &str = "(?:a[ab]{400}c|b[ab]{400}d|[ab]{1,500}[^x]{1,500}\u{e9})";

/// `len` pseudo-random `a`s and `b`s, the same every time.
#[cfg(test)]
pub(super) fn coin_flips(len: usize) -> String {
    let mut seed = 1u32;
    (0..len)
        .map(|_| {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            if seed >> 16 & 1 == 0 { 'a' } else { 'b' }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pattern(source: &str) -> Pattern {
        let schema = json!(source);
        let Value::String(source) = &schema else { unreachable!() };
        let parts = translated(source).unwrap().iter().map(|p| Part::new(p).unwrap()).collect();
        Pattern { source: source.clone(), parts }
    }

    #[test]
    fn matches_as_the_validator_did() {
        let cases = [
            ("^[a-z]+$", "abc", true),
            ("^[a-z]+$", "abC", false),
            ("b", "abc", true),
            (r"^\d{3}$", "123", true),
            // ECMA's \d is ASCII only.
            (r"^\d$", "\u{0663}", false),
            ("^(?=.*[0-9])(?=.*[a-z]).{6,}$", "abc123", true),
            ("^(?=.*[0-9])(?=.*[a-z]).{6,}$", "abcdef", false),
            (r"\bcat\b", "a cat sat", true),
            (r"\bcat\b", "concatenate", false),
            // A word boundary over non-ASCII text: the backtracker tells.
            (r"\bcat\b", "é cat é", true),
            (r"\bcat\b", "écaté", false),
        ];
        for (source, text, expected) in cases {
            assert_eq!(pattern(source).mismatch(&json!(text)).is_none(), expected, "{source} on {text:?}");
        }
    }

    /// The issue's case: the `regex` crate's PikeVM took 61 s of a debug
    /// build here; the lazy DFA gives up, the text is too long for the
    /// backtracker, and the string is not accepted, at once.
    #[test]
    fn a_pattern_whose_dfa_gives_up_over_a_long_string_is_untold_at_once() {
        let costly = pattern(COSTLY);
        let text = coin_flips(100_000);
        let started = std::time::Instant::now();
        let why = costly.mismatch(&json!(text)).expect("not accepted unchecked");
        assert!(why.contains("too costly"), "{why}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
    }

    #[test]
    fn a_large_pattern_costs_more_per_byte() {
        assert_eq!(byte_cost("^[a-z]+$"), Some(8));
        assert!(byte_cost("[ab]{1,500}[^x]{1,500}").unwrap() > 500);
        assert_eq!(byte_cost("(unclosed"), None);
    }

    #[test]
    fn a_long_mismatch_quotes_its_start() {
        let why = pattern("^x").mismatch(&json!("y".repeat(10_000))).unwrap();
        assert!(why.len() < 200 && why.contains("..."), "{why}");
    }
}
