//! A JavaScript lexer just deep enough for two questions asked before boa's
//! parser sees any text: how deeply the source nests
//! ([`source_nesting_exceeds`]: boa's recursive-descent parser uses native
//! stack per level, and an overflow aborts the process), and whether a
//! session cell has a `return` outside every function
//! ([`has_top_level_return`]).
//!
//! Linear time, constant native stack, on any input.

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
///
/// Statements nested without brackets (`if (a) if (b) …`, `else if` chains,
/// `while (a) while (b) …`) count one level per nested statement.
///
/// A `/` after `)` or `}` may start a regex (`if (x) /re/.test(s)`) or
/// divide (`(a) / b`): the source is scanned both ways and the deeper count
/// wins, so a quote inside a regex taken for a division cannot hide code.
pub(crate) fn source_nesting_exceeds(source: &str, max: usize) -> Option<usize> {
    let bytes = source.as_bytes();
    Scanner::default()
        .run(bytes, max)
        .or_else(|| Scanner { regex_after_close: true, ..Scanner::default() }.run(bytes, max))
}

/// Whether `source` has a `return` keyword outside every function body (a
/// session cell that then runs as a function body, see
/// [`engine`](crate::backends::boa::engine)).
///
/// A `{` opens a function body after `=>`, and after a `)` that does not
/// close the head of `if`, `while`, `for`, `with`, `switch` or `catch`
/// (functions, methods, getters and setters); every other `{` is a block or
/// an object. Strings, template text, comments and regexes are skipped as
/// for [`source_nesting_exceeds`], scanned both ways a `/` may be read. An
/// approximation, so its answer is only ever a hint: the caller also asks
/// the parser (a cell that parses as a script never runs as a function).
pub(crate) fn has_top_level_return(source: &str) -> bool {
    let bytes = source.as_bytes();
    [false, true].into_iter().any(|regex_after_close| {
        let mut scanner = Scanner { regex_after_close, ..Scanner::default() };
        scanner.run(bytes, usize::MAX);
        scanner.top_level_return
    })
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
    /// Statements nested without brackets, per open code level.
    stmt: Vec<usize>,
    stmt_total: usize,
    /// The statement head's condition just closed, or `else`/`do` came: the
    /// next statement nests in it.
    stmt_armed: bool,
    /// A `;` or `}` just ended a statement: the run of nested statements
    /// goes on only if `else` follows.
    stmt_boundary: bool,
    /// Bracket depths whose `(` holds a statement head's condition.
    conditions: Vec<usize>,
    /// A statement head (`if`, `while`, `for`, `with`) awaits its `(`.
    expect_condition: bool,
    /// Take a `/` after `)` or `}` as a regex (the second scan).
    regex_after_close: bool,
    /// The last word was `else` (so an `if` after it nests once with it).
    last_was_else: bool,
    /// Significant tokens seen so far, to tell which one came right before
    /// a `{`.
    tokens: usize,
    /// `tokens` just after the last `=>`.
    arrow_at: Option<usize>,
    /// `tokens` just after the last `)` that closed a block head's
    /// parentheses (`if (…)`, `switch (…)`, `catch (…)`, …).
    head_close_at: Option<usize>,
    /// `switch` or `catch` awaits its `(`.
    expect_block_head: bool,
    /// Bracket depths whose `(` follows `switch` or `catch`.
    block_heads: Vec<usize>,
    /// Per open frame: whether it is a function body.
    bodies: Vec<bool>,
    /// Open function bodies.
    function_depth: usize,
    /// A `return` keyword outside every function body was seen.
    top_level_return: bool,
}

/// Statement heads followed by a parenthesized condition.
const STATEMENT_HEADS: &[&[u8]] = &[b"if", b"while", b"for", b"with"];

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
        self.stmt.push(0);
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
                b'/' if self.slash_starts_regex() => {
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
                        self.tokens += 1;
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
                    let condition = c == b'(' && std::mem::take(&mut self.expect_condition);
                    let block_head = std::mem::take(&mut self.expect_block_head) && c == b'(';
                    let body = c == b'{'
                        && (self.arrow_at == Some(self.tokens)
                            || (self.last == Some(b')') && self.head_close_at != Some(self.tokens)));
                    self.statement_token();
                    if condition {
                        self.conditions.push(self.brackets + 1);
                    }
                    if block_head {
                        self.block_heads.push(self.brackets + 1);
                    }
                    self.open(Frame::Bracket(c), body);
                    i += 1;
                }
                b')' | b']' | b'}' => {
                    let was_template_expr = self.stack.last() == Some(&Frame::TemplateExpr);
                    let level = self.brackets;
                    self.close();
                    i += 1;
                    if was_template_expr {
                        // Back in template text; no code token ended here.
                        continue;
                    }
                    if self.block_heads.last() == Some(&level) {
                        self.block_heads.pop();
                        self.head_close_at = Some(self.tokens + 1);
                    }
                    if self.conditions.last() == Some(&level) {
                        self.head_close_at = Some(self.tokens + 1);
                        self.conditions.pop();
                        self.stmt_armed = true;
                        self.stmt_boundary = false;
                    } else {
                        self.statement_token();
                        self.stmt_boundary = c == b'}';
                    }
                }
                b';' => {
                    self.reset_chain();
                    self.statement_token();
                    self.stmt_boundary = true;
                    i += 1;
                }
                b',' => {
                    self.reset_chain();
                    self.statement_token();
                    i += 1;
                }
                b'=' => {
                    let next = s.get(i + 1).copied();
                    let prev = i.checked_sub(1).map(|p| s[p]);
                    if next == Some(b'>') {
                        self.extend_chain();
                        self.arrow_at = Some(self.tokens + 1);
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
                    if is_word_byte(c) {
                        let start = i;
                        while i < s.len() && is_word_byte(s[i]) {
                            i += 1;
                        }
                        self.last_word_is_property = self.last == Some(b'.');
                        self.last_word.clear();
                        self.last_word.extend_from_slice(&s[start..i]);
                        self.last = Some(b'a');
                        self.tokens += 1;
                        let keyword = !self.last_word_is_property;
                        let word = self.last_word.as_slice();
                        self.expect_block_head = keyword && (word == b"switch" || word == b"catch");
                        if keyword && word == b"return" && self.function_depth == 0 {
                            self.top_level_return = true;
                        }
                        if keyword && PREFIX_WORDS.contains(&self.last_word.as_slice()) {
                            self.extend_unary();
                        } else {
                            self.end_operand();
                        }
                        self.statement_word(keyword);
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
            self.tokens += 1;
            if self.depth() > max {
                return Some(self.depth());
            }
        }
        None
    }

    fn depth(&self) -> usize {
        self.brackets + self.chain_total + self.unary_total + self.stmt_total
    }

    /// A word: a statement head or `else`/`do` nests the statement run,
    /// anything else is an ordinary token for it.
    fn statement_word(&mut self, keyword: bool) {
        let word = self.last_word.as_slice();
        let head = keyword && STATEMENT_HEADS.contains(&word);
        let is_else = keyword && word == b"else";
        let is_if = word == b"if";
        let follower = is_else || (keyword && word == b"do");
        if !(head || follower) {
            self.statement_token();
            return;
        }
        let continues = self.stmt_armed || (is_else && self.stmt_boundary);
        if !continues {
            self.reset_statements();
        }
        // `else if` nests once, not twice.
        let else_if = head && is_if && self.stmt_armed && self.last_was_else;
        if !else_if {
            self.set_statements(self.current_statements() + 1);
        }
        self.stmt_boundary = false;
        self.stmt_armed = follower;
        self.last_was_else = is_else;
        self.expect_condition = head;
    }

    /// Any token that is not part of a statement head: the run of nested
    /// statements ends at a boundary not followed by `else`.
    fn statement_token(&mut self) {
        if std::mem::take(&mut self.stmt_boundary) {
            self.reset_statements();
        }
        self.stmt_armed = false;
        self.last_was_else = false;
    }

    fn current_statements(&self) -> usize {
        self.stmt.last().copied().unwrap_or(0)
    }

    fn set_statements(&mut self, n: usize) {
        if let Some(s) = self.stmt.last_mut() {
            self.stmt_total = self.stmt_total - *s + n;
            *s = n;
        }
    }

    fn reset_statements(&mut self) {
        self.set_statements(0);
    }

    /// Opens a bracket or a template's `${`; `body` if it is a function body.
    fn open(&mut self, frame: Frame, body: bool) {
        self.stack.push(frame);
        self.bodies.push(body);
        self.function_depth += usize::from(body);
        self.chains.push(0);
        self.unary.push(0);
        self.stmt.push(0);
        self.brackets += 1;
    }

    fn close(&mut self) {
        // Unbalanced closers are the parser's problem, not a depth risk.
        if matches!(self.stack.last(), Some(Frame::Bracket(_) | Frame::TemplateExpr)) {
            self.stack.pop();
            if self.bodies.pop() == Some(true) {
                self.function_depth -= 1;
            }
            self.brackets -= 1;
            let chain = self.chains.pop().unwrap_or(0);
            self.chain_total -= chain;
            let unary = self.unary.pop().unwrap_or(0);
            self.unary_total -= unary;
            let stmt = self.stmt.pop().unwrap_or(0);
            self.stmt_total -= stmt;
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

    /// Whether a `/` here starts a regex: where an operand may start, or
    /// (in the second scan) after `)` or `}`.
    fn slash_starts_regex(&self) -> bool {
        self.regex_allowed() || (self.regex_after_close && matches!(self.last, Some(b')' | b'}')))
    }

    /// Whether an operand may start here.
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
                    self.tokens += 1;
                    self.end_operand();
                    return i + 1;
                }
                b'$' if s.get(i + 1) == Some(&b'{') => {
                    self.open(Frame::TemplateExpr, false);
                    self.last = Some(b'{');
                    self.last_word.clear();
                    self.tokens += 1;
                    return i + 2;
                }
                _ => i += 1,
            }
        }
        i
    }
}

/// Bytes of an identifier or keyword: ASCII letters, digits, `_`, `$`, `\`
/// (escapes) and every non-ASCII byte (an identifier like `πreturn` is one
/// word, not `π` and the keyword `return`).
fn is_word_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c == b'\\' || c >= 0x80
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
    fn statements_nested_without_brackets_count() {
        // Depths include the bracket of the innermost condition or call.
        assert_eq!(depth("if (a) if (b) if (c) x();"), 4);
        assert_eq!(depth("if (a) x(); if (b) y(); if (c) z();"), 2);
        assert_eq!(depth("if (a) x()\nif (b) y()\nif (c) z()"), 2, "ASI ends a statement too");
        assert_eq!(depth("if (a) {} if (b) {} if (c) {}"), 2);
        assert_eq!(depth("if (a) {} else if (b) {} else if (c) {} else {}"), 5);
        assert_eq!(depth("if (a) x(); else if (b) y(); else z();"), 4);
        assert_eq!(depth("while (a) while (b) for (;;) x++"), 4);
        assert_eq!(depth("o.if(1); o.while(2)"), 1);
        assert!(source_nesting_exceeds(&format!("{}return 7", "if(1)".repeat(20_000)), 128).is_some());
        assert!(source_nesting_exceeds(&format!("{}7", "if(0){}else ".repeat(20_000)), 128).is_some());
        assert!(source_nesting_exceeds(&format!("{}7", "if(0)x;else ".repeat(20_000)), 128).is_some());
        let sequential: String = (0..1000).map(|i| format!("if (x == {i}) {{ y = {i}; }}\n")).collect();
        assert!(source_nesting_exceeds(&sequential, 128).is_none(), "sequential ifs do not nest");
    }

    #[test]
    fn a_quote_inside_a_regex_after_a_close_cannot_hide_code() {
        let brackets = format!("{}1{}", "(".repeat(3000), ")".repeat(3000));
        let code = format!("if (1) /'/.test, x = {brackets}, /'/; return 1");
        assert!(source_nesting_exceeds(&code, 128).is_some());
    }

    #[test]
    fn non_ascii_identifiers_are_one_word() {
        let code = format!("var \u{3c0}return = 2; return \u{3c0}return / {}1{} / 1", "(".repeat(500), ")".repeat(500));
        assert!(source_nesting_exceeds(&code, 128).is_some());
        assert_eq!(depth("let caf\u{e9} = 1; return caf\u{e9} / 2 / 3"), 1);
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
    fn a_return_outside_every_function_is_found() {
        for code in [
            "return 1",
            "let k = 1; return k + 1",
            "if (x) { return 1 } 2",
            "if (x) return 1",
            "for (const a of b) { return a }",
            "while (true) { return 1 }",
            "do { return 1 } while (0)",
            "switch (x) { case 1: return 2 }",
            "try { f() } catch (e) { return 2 }",
            "try { f() } catch { return 2 } finally {}",
            "label: { return 1 }",
            "function f() { return 1 }\nreturn f()",
            "const g = () => { return 1 }; return g()",
            "if (x) /'/.test(s); return 1",
        ] {
            assert!(has_top_level_return(code), "{code}");
        }
    }

    #[test]
    fn a_return_inside_a_function_is_not_top_level() {
        for code in [
            "function f() { return 1 } f()",
            "const g = (a, b) => { if (a) { return b } }; g(1, 2)",
            "const h = async x => { return x }",
            "({ m() { return 1 }, get p() { return 2 }, set p(v) { return } })",
            "class A { m() { if (x) { return 1 } } static s() { return 2 } }",
            "[1].map(function (x) { return x * 2 })",
            "`${ (() => { return 1 })() }`",
            "'return'; \"return\"; // return\n/* return */ o.return; /return/.test(s)",
            "function* g() { yield 1; return 2 } async function a() { try { return 1 } catch (e) { return 2 } }",
            "let k = 1; k",
        ] {
            assert!(!has_top_level_return(code), "{code}");
        }
    }
}
