//! Model replies of about 1 MB that a scanner of code blocks must read in
//! linear time (quadratic scanning of these would take minutes). Shared by
//! the agent tests (what the extractor finds in them) and `benches/agent.rs`
//! (how fast it does), which includes this file by path.

/// Each reply, named.
pub fn large_replies() -> [(&'static str, String); 4] {
    [
        ("prose_without_delimiters", "no delimiters at all, just prose. ".repeat(32 * 1024)),
        ("opening_fences_only", "```python\n".repeat(100_000)),
        ("fences_inside_words", "a```".repeat(250_000)),
        ("one_unclosed_block_of_fences", format!("```python\n{}", "x```y\n".repeat(150_000))),
    ]
}
