//! Nesting bounds, checked before anything recursive sees the data.
//!
//! Recursive-descent parsers and converters use native stack per nesting
//! level (boa in a debug build: ~100 KB per `[`/`(` level), and a native stack
//! overflow aborts the whole host process. So nesting is measured up front, in
//! linear time and constant stack, and refused beyond a bound.

use serde_json::Value;

use crate::error::InvalidRequest;

/// Takes the request's JSON input out of `slot` if it nests at most `max`
/// levels; a deeper one is dropped without recursion and refused.
pub fn take_bounded_input(slot: &mut Option<Value>, max: usize) -> Result<Option<Value>, InvalidRequest> {
    let Some(input) = slot.take() else { return Ok(None) };
    match json_depth_exceeds(&input, max) {
        None => Ok(Some(input)),
        Some(depth) => {
            drop_deep(input);
            Err(InvalidRequest::TooDeep { what: "input", depth, max })
        }
    }
}

/// Returns the nesting depth of `value` if it exceeds `max` (containers count
/// one level each), without recursion.
pub fn json_depth_exceeds(value: &Value, max: usize) -> Option<usize> {
    let mut stack: Vec<(&Value, usize)> = vec![(value, 1)];
    while let Some((v, depth)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match v {
            Value::Array(a) => Box::new(a.iter()),
            Value::Object(o) => Box::new(o.values()),
            _ => continue,
        };
        if depth > max {
            return Some(depth);
        }
        stack.extend(children.map(|c| (c, depth + 1)));
    }
    None
}

/// Drops a `Value` of any depth without recursion (serde_json's own `Drop`
/// recurses, so dropping a hostile 100,000-deep input could overflow a stack).
pub fn drop_deep(value: Value) {
    let mut pending = vec![value];
    while let Some(v) = pending.pop() {
        match v {
            Value::Array(a) => pending.extend(a),
            Value::Object(o) => pending.extend(o.into_iter().map(|(_, v)| v)),
            _ => {}
        }
    }
}

/// Returns the effective nesting of JavaScript-like `source` if it exceeds
/// `max`.
///
/// Counts bracket depth (`(`, `[`, `{`, `${`) plus right-associative chains
/// within one bracket level (`a = b = …`, `a ? b : c ? …`, `x => y => …`,
/// `a ** b ** …`) and runs of prefix operators before one operand (`!!!x`,
/// `- - -x`, `typeof typeof x`, `new new X`), which parsers also descend
/// into. Strings, template text, comments and regular-expression literals
/// are skipped. Where a `/` could start a regex or be a division, it is taken
/// as a division unless the previous token makes a regex certain (a keyword
/// that is not a property name): misjudging a division as a regex would skip
/// code and under-count, misjudging a regex as a division only over-counts.
pub fn source_nesting_exceeds(source: &str, max: usize) -> Option<usize> {
    Scanner::default().run(source.as_bytes(), max)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Frame {
    /// `(`, `[` or `{`, with the right-associative chain length at this level.
    Bracket(u8),
    /// Inside a template literal's text.
    Template,
    /// Inside `${ … }` of a template literal.
    TemplateExpr,
}

#[derive(Default)]
struct Scanner {
    stack: Vec<Frame>,
    /// Chain length per open code level; index 0 is the top level.
    chains: Vec<usize>,
    brackets: usize,
    chain_total: usize,
    /// Last significant byte in code (not whitespace or comment).
    last: Option<u8>,
    /// The identifier that ended at `last`, for `return /re/` and friends.
    last_word: Vec<u8>,
    /// `last_word` followed a `.`: a property name, never a keyword.
    last_word_is_property: bool,
    /// Prefix operators waiting for their operand, per open code level.
    unary: Vec<usize>,
    unary_total: usize,
}

/// Reserved words after which a `/` starts a regex. Not `of`, `yield` or
/// `await`: each can also be a variable name (`of / 2`).
const REGEX_AFTER_WORDS: &[&[u8]] =
    &[b"return", b"typeof", b"case", b"do", b"else", b"in", b"new", b"delete", b"void", b"throw", b"instanceof"];

/// Keywords that are prefix operators: each nests its operand one level.
const PREFIX_WORDS: &[&[u8]] = &[b"typeof", b"void", b"delete", b"new", b"await", b"yield"];

impl Scanner {
    fn run(&mut self, s: &[u8], max: usize) -> Option<usize> {
        self.chains.push(0);
        self.unary.push(0);
        let mut i = 0;
        while i < s.len() {
            if self.stack.last() == Some(&Frame::Template) {
                i = self.template_text(s, i);
                continue;
            }
            let c = s[i];
            match c {
                b' ' | b'\t' | b'\n' | b'\r' => {
                    i += 1;
                    continue;
                }
                b'\'' | b'"' => {
                    i = skip_string(s, i, c);
                    self.end_operand();
                }
                b'`' => {
                    self.stack.push(Frame::Template);
                    i += 1;
                }
                b'/' if s.get(i + 1) == Some(&b'/') => {
                    i = memchr_or_end(s, i, b'\n');
                    continue;
                }
                b'/' if s.get(i + 1) == Some(&b'*') => {
                    i = find_or_end(s, i + 2, b"*/");
                    continue;
                }
                b'/' if self.regex_allowed() => {
                    i = skip_regex(s, i);
                    self.end_operand();
                }
                b'!' | b'~' if s.get(i + 1) != Some(&b'=') => {
                    self.extend_unary();
                    i += 1;
                }
                b'+' | b'-' if s.get(i + 1) == Some(&c) => {
                    // `x++ / 2` divides; `++x` is followed by an operand.
                    let postfix = !self.regex_allowed();
                    i += 2;
                    if postfix {
                        self.last = Some(b')');
                        self.last_word.clear();
                        continue;
                    }
                }
                b'+' | b'-' if s.get(i + 1) != Some(&b'=') && self.regex_allowed() => {
                    self.extend_unary();
                    i += 1;
                }
                b'*' if s.get(i + 1) == Some(&b'*') && s.get(i + 2) != Some(&b'=') => {
                    self.extend_chain();
                    i += 2;
                }
                b'(' | b'[' | b'{' => {
                    self.open(Frame::Bracket(c));
                    i += 1;
                }
                b')' | b']' | b'}' => {
                    let was_template_expr = self.stack.last() == Some(&Frame::TemplateExpr);
                    self.close();
                    i += 1;
                    if was_template_expr {
                        // Back in template text; no code token ended here.
                        continue;
                    }
                }
                b';' | b',' => {
                    self.reset_chain();
                    i += 1;
                }
                b'=' => {
                    let next = s.get(i + 1).copied();
                    let prev = i.checked_sub(1).map(|p| s[p]);
                    if next == Some(b'>') {
                        self.extend_chain();
                        i += 2;
                    } else if next == Some(b'=') {
                        i = skip_while(s, i, b'=');
                    } else {
                        if !matches!(prev, Some(b'=' | b'!' | b'<' | b'>')) {
                            self.extend_chain();
                        }
                        i += 1;
                    }
                }
                b'?' => {
                    let next = s.get(i + 1).copied();
                    let after = s.get(i + 2).copied();
                    let nullish = next == Some(b'?');
                    let optional_chain = next == Some(b'.') && !after.is_some_and(|a| a.is_ascii_digit());
                    if nullish || optional_chain {
                        i += 2;
                    } else {
                        self.extend_chain();
                        i += 1;
                    }
                }
                _ => {
                    if c.is_ascii_alphanumeric() || c == b'_' || c == b'$' {
                        let start = i;
                        while i < s.len() && (s[i].is_ascii_alphanumeric() || s[i] == b'_' || s[i] == b'$') {
                            i += 1;
                        }
                        self.last_word_is_property = self.last == Some(b'.');
                        self.last_word.clear();
                        self.last_word.extend_from_slice(&s[start..i]);
                        self.last = Some(s[i - 1]);
                        if !self.last_word_is_property && PREFIX_WORDS.contains(&self.last_word.as_slice()) {
                            self.extend_unary();
                        } else {
                            self.end_operand();
                        }
                        if self.depth() > max {
                            return Some(self.depth());
                        }
                        continue;
                    }
                    i += 1;
                }
            }
            self.last = Some(c);
            self.last_word.clear();
            if self.depth() > max {
                return Some(self.depth());
            }
        }
        None
    }

    fn depth(&self) -> usize {
        self.brackets + self.chain_total + self.unary_total
    }

    fn open(&mut self, frame: Frame) {
        self.stack.push(frame);
        self.chains.push(0);
        self.unary.push(0);
        self.brackets += 1;
    }

    fn close(&mut self) {
        // Unbalanced closers are the parser's problem, not a depth risk.
        if matches!(self.stack.last(), Some(Frame::Bracket(_) | Frame::TemplateExpr)) {
            self.stack.pop();
            self.brackets -= 1;
            let chain = self.chains.pop().unwrap_or(0);
            self.chain_total -= chain;
            let unary = self.unary.pop().unwrap_or(0);
            self.unary_total -= unary;
            // The bracketed expression is the operand of the prefix
            // operators before it.
            self.end_operand();
        }
    }

    fn extend_unary(&mut self) {
        if let Some(u) = self.unary.last_mut() {
            *u += 1;
            self.unary_total += 1;
        }
    }

    /// An operand ended: the prefix operators before it are done.
    fn end_operand(&mut self) {
        if let Some(u) = self.unary.last_mut() {
            self.unary_total -= *u;
            *u = 0;
        }
    }

    fn extend_chain(&mut self) {
        if let Some(c) = self.chains.last_mut() {
            *c += 1;
            self.chain_total += 1;
        }
    }

    fn reset_chain(&mut self) {
        if let Some(c) = self.chains.last_mut() {
            self.chain_total -= *c;
            *c = 0;
        }
    }

    fn regex_allowed(&self) -> bool {
        match self.last {
            None => true,
            Some(c) if c.is_ascii_alphanumeric() || c == b'_' || c == b'$' => {
                !self.last_word_is_property && REGEX_AFTER_WORDS.contains(&self.last_word.as_slice())
            }
            Some(c) => !matches!(c, b')' | b']' | b'}' | b'\'' | b'"' | b'`'),
        }
    }

    /// Scans template text from `i` up to the closing backtick or a `${`.
    fn template_text(&mut self, s: &[u8], mut i: usize) -> usize {
        while i < s.len() {
            match s[i] {
                b'\\' => i += 2,
                b'`' => {
                    self.stack.pop();
                    self.last = Some(b'`');
                    self.last_word.clear();
                    self.end_operand();
                    return i + 1;
                }
                b'$' if s.get(i + 1) == Some(&b'{') => {
                    self.open(Frame::TemplateExpr);
                    self.last = Some(b'{');
                    self.last_word.clear();
                    return i + 2;
                }
                _ => i += 1,
            }
        }
        i
    }
}

fn skip_string(s: &[u8], mut i: usize, quote: u8) -> usize {
    i += 1;
    while i < s.len() {
        match s[i] {
            b'\\' => i += 2,
            b'\n' => return i,
            c if c == quote => return i + 1,
            _ => i += 1,
        }
    }
    i
}

fn skip_regex(s: &[u8], mut i: usize) -> usize {
    i += 1;
    let mut in_class = false;
    while i < s.len() {
        match s[i] {
            b'\\' => i += 2,
            b'\n' => return i,
            b'[' => {
                in_class = true;
                i += 1;
            }
            b']' => {
                in_class = false;
                i += 1;
            }
            b'/' if !in_class => return i + 1,
            _ => i += 1,
        }
    }
    i
}

fn skip_while(s: &[u8], mut i: usize, c: u8) -> usize {
    while i < s.len() && s[i] == c {
        i += 1;
    }
    i
}

fn memchr_or_end(s: &[u8], i: usize, c: u8) -> usize {
    s[i..].iter().position(|&b| b == c).map_or(s.len(), |p| i + p)
}

fn find_or_end(s: &[u8], i: usize, pat: &[u8]) -> usize {
    s.get(i..).and_then(|rest| rest.windows(pat.len()).position(|w| w == pat)).map_or(s.len(), |p| i + p + pat.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn depth(src: &str) -> usize {
        // The smallest max that the source does not exceed.
        (0..10_000).find(|&m| source_nesting_exceeds(src, m).is_none()).unwrap()
    }

    #[test]
    fn brackets_count() {
        assert_eq!(depth("f([{}])"), 3);
        assert_eq!(depth("a; b; c"), 0);
        assert!(source_nesting_exceeds(&"(".repeat(200_000), 1000).is_some());
    }

    #[test]
    fn strings_comments_and_regexes_do_not_count() {
        assert_eq!(depth(r#"let s = "(((("; // ((((("#), 1);
        assert_eq!(depth("/* [[[[ */ x"), 0);
        assert_eq!(depth("let r = /[(]+/g; r.test(x)"), 1);
        assert_eq!(depth("return /((/.source"), 0);
        assert_eq!(depth("a / b / c"), 0);
    }

    #[test]
    fn template_expressions_count() {
        assert_eq!(depth("`a ${ `b ${ c } ` } d`"), 2);
        assert_eq!(depth("`((((`"), 0);
    }

    #[test]
    fn prefix_operator_runs_count_until_their_operand() {
        assert_eq!(depth("!!!x"), 3);
        assert_eq!(depth("!a && !b && !c && !d"), 1);
        assert_eq!(depth("- - -x + -y"), 3);
        assert_eq!(depth("typeof typeof x"), 2);
        assert_eq!(depth("a.typeof + b"), 0);
        assert_eq!(depth("!(!(x))"), 4);
        assert_eq!(depth("a != b; c !== d; x++ - y--"), 0);
        assert!(source_nesting_exceeds(&format!("return {}0", "!".repeat(3_000_000)), 1000).is_some());
        assert!(source_nesting_exceeds(&format!("return {}0", "~-".repeat(1000)), 1000).is_some());
    }

    #[test]
    fn a_slash_that_may_divide_is_not_a_regex() {
        let hidden = format!("let of = 4, g = 2; let x = of / {}1{} / g", "(".repeat(500), ")".repeat(500));
        assert!(source_nesting_exceeds(&hidden, 128).is_some(), "`of` is a variable here");
        let prop = format!("let x = o.return / {}1{} / 2", "(".repeat(500), ")".repeat(500));
        assert!(source_nesting_exceeds(&prop, 128).is_some(), "`.return` is a property name");
        let postfix = format!("let x = i++ / {}1{} / 2", "(".repeat(500), ")".repeat(500));
        assert!(source_nesting_exceeds(&postfix, 128).is_some(), "`i++ /` divides");
        assert!(depth("for (const m of /[((((]/g) {}") >= 5, "over-counts a regex after `of`: safe");
    }

    #[test]
    fn exponent_chains_count() {
        assert_eq!(depth("a ** b ** c"), 2);
        assert!(source_nesting_exceeds(&"2 ** ".repeat(100_000), 1000).is_some());
    }

    #[test]
    fn right_associative_chains_count() {
        assert_eq!(depth("a = b = c = 0"), 3);
        assert_eq!(depth("a == b; c === d; e != f; g <= h"), 0);
        assert_eq!(depth("x ? 1 : y ? 2 : 3"), 2);
        assert_eq!(depth("a ?? b; c?.d; e ?.5 : 1"), 1);
        assert_eq!(depth("f = a => b => c"), 3);
        assert!(source_nesting_exceeds(&"a=".repeat(100_000), 1000).is_some());
    }

    #[test]
    fn json_depth() {
        assert_eq!(json_depth_exceeds(&json!([[[1]]]), 3), None);
        assert_eq!(json_depth_exceeds(&json!([[[1]]]), 2), Some(3));
        assert_eq!(json_depth_exceeds(&json!({"a": {"b": 1}}), 2), None);
        let mut deep = json!(1);
        for _ in 0..100_000 {
            deep = Value::Array(vec![deep]);
        }
        assert!(json_depth_exceeds(&deep, 1000).is_some());
        drop_deep(deep);
    }
}
