//! [`ModuleLimits`]: static bounds on an untrusted module, checked with
//! wasmparser before Cranelift sees it.
//!
//! Compiling is the one step of a wasm run that no deadline can preempt:
//! Cranelift runs to completion on the host thread. Its cost grows with the
//! number of functions and the size of each body, and superlinearly with the
//! number of control blocks in one function (quadratically: 40,000 sequential
//! `if`s in one function compiled for 22 s here, 2,500 for 0.27 s) and with
//! the locals live across them (17,000 nested loops over 200 live locals:
//! 29 s). Before these checks, 260,000 empty functions or a ~1 MB module of
//! nested `loop`/`if` kept the host busy for over a minute and several GB.
//! The checks read the module once, in time linear in its size, and refuse
//! what could make the compile unbounded, so a hostile module costs at most a
//! bounded compile (docs/performance.md has the measured worst case).
//!
//! A module's declared minimum memory (and table size) is read here too: a
//! module that cannot even start under the backend's memory ceiling is a
//! resource outcome (`out_of_memory`), decided before anything is compiled.

use wasmparser::{Operator, Parser, Payload};

use crate::config::setters;
use crate::error::InvalidRequest;

/// Static limits on an untrusted module, checked before it is compiled.
///
/// The defaults admit what C and Rust toolchains produce for programs up to
/// QuickJS's size (0.9 MB of code) and bound the worst case: a module built
/// to sit at several limits at once compiled in ≈6.5 s using ~110 MB here
/// (2-core VM; docs/performance.md has the numbers), where unchecked
/// modules took minutes and gigabytes. Raise them for larger toolchain
/// output, at the price of a longer worst-case compile. Interpreter modules
/// pinned by sha256 (CPython, QuickJS) are trusted and not checked.
///
/// ```
/// use execbox::backends::{ModuleLimits, WasmGuestConfig};
/// let mut cfg = WasmGuestConfig::default();
/// cfg.module_limits.max_functions = 2_000;
/// // or, in one chain:
/// let cfg = WasmGuestConfig::default().module_limits(ModuleLimits::default().max_functions(2_000));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ModuleLimits {
    /// Bytes of the payload (binary or WAT text), checked before anything
    /// else, even hashing. A policy's `max_code_bytes` usually caps it
    /// lower (`strict`: 1 MiB); this holds for direct `Backend::execute`
    /// calls too.
    ///
    /// # Default
    /// 16 MiB.
    pub max_module_bytes: u64,
    /// Bytes of a payload given as WAT text. WAT is turned into binary in
    /// the host (before the compile worker), at ~0.2 s and ~25 MB per MiB
    /// in a debug build: this keeps that step short whatever
    /// `max_module_bytes` allows. Larger modules can come as binary.
    ///
    /// # Default
    /// 1 MiB.
    pub max_wat_bytes: u64,
    /// Types in the type section.
    ///
    /// # Default
    /// 10,000.
    pub max_types: u32,
    /// Globals defined by the module.
    ///
    /// # Default
    /// 10,000.
    pub max_globals: u32,
    /// Functions defined by the module (imports not counted).
    ///
    /// # Default
    /// 10,000 (a C guest with wasi-libc defines ~100, a Rust guest with std
    /// ~1,000).
    pub max_functions: u32,
    /// Bytes of one function body (its locals and code).
    ///
    /// # Default
    /// 128 KiB.
    pub max_function_body_bytes: u32,
    /// Bytes of all function bodies together.
    ///
    /// # Default
    /// 4 MiB.
    pub max_total_body_bytes: u64,
    /// How deeply `block`, `loop`, `if` and `try_table` may nest in one
    /// function.
    ///
    /// # Default
    /// 512 (a `switch` over 200 cases compiles to ~200 nested blocks;
    /// CPython's interpreter loop nests 283 deep).
    pub max_control_depth: u32,
    /// Control blocks (`block`, `loop`, `if`, `try_table`) in one function.
    /// Compile time grows quadratically with this count, and with it times
    /// the locals live across the blocks.
    ///
    /// # Default
    /// 2,000 (CPython's largest function has 1,622).
    pub max_blocks_per_function: u32,
    /// Control blocks in all functions together.
    ///
    /// # Default
    /// 40,000 (QuickJS, 0.9 MB of code, has 19,273).
    pub max_total_blocks: u64,
    /// Locals of one function, its parameters included.
    ///
    /// # Default
    /// 1,000 (CPython's most are 187).
    pub max_locals_per_function: u32,
    /// Locals of all functions together, parameters included.
    ///
    /// # Default
    /// 100,000.
    pub max_total_locals: u64,
    /// One function's control blocks times its locals: what Cranelift's SSA
    /// construction and register allocation pay for when values live across
    /// many blocks (2,000 nested loops over 1,000 live locals compiled for
    /// 0.8 s here, 20 such functions for 16 s).
    ///
    /// # Default
    /// 250,000 (CPython's largest is 102,850).
    pub max_block_locals_per_function: u64,
    /// The same product summed over all functions.
    ///
    /// # Default
    /// 1,000,000 (CPython: 463,217; QuickJS: 246,885).
    pub max_total_block_locals: u64,
}

impl Default for ModuleLimits {
    fn default() -> Self {
        Self {
            max_module_bytes: 16 << 20,
            max_wat_bytes: 1 << 20,
            max_types: 10_000,
            max_globals: 10_000,
            max_functions: 10_000,
            max_function_body_bytes: 128 << 10,
            max_total_body_bytes: 4 << 20,
            max_control_depth: 512,
            max_blocks_per_function: 2_000,
            max_total_blocks: 40_000,
            max_locals_per_function: 1_000,
            max_total_locals: 100_000,
            max_block_locals_per_function: 250_000,
            max_total_block_locals: 1_000_000,
        }
    }
}

setters!(ModuleLimits {
    max_module_bytes: u64,
    max_wat_bytes: u64,
    max_types: u32,
    max_globals: u32,
    max_functions: u32,
    max_function_body_bytes: u32,
    max_total_body_bytes: u64,
    max_control_depth: u32,
    max_blocks_per_function: u32,
    max_total_blocks: u64,
    max_locals_per_function: u32,
    max_total_locals: u64,
    max_block_locals_per_function: u64,
    max_total_block_locals: u64,
});

/// Why a module was refused before compiling.
#[derive(Debug)]
pub(crate) enum StaticRefusal {
    /// Malformed, or over one of the [`ModuleLimits`]: an `invalid_request`.
    Invalid(InvalidRequest),
    /// Its declared minimum memory or table does not fit the backend's
    /// ceiling: it could never start, an `out_of_memory` outcome.
    TooBigToStart(String),
}

impl From<InvalidRequest> for StaticRefusal {
    fn from(e: InvalidRequest) -> Self {
        StaticRefusal::Invalid(e)
    }
}

/// The ceilings a module's declared minimums must fit.
pub(crate) struct Ceilings {
    /// Largest linear memory, in bytes.
    pub memory_bytes: u64,
    /// Largest table, in elements.
    pub table_elements: u64,
}

/// Checks the binary module `wasm` against `limits` and `ceilings`, reading
/// it once.
pub(crate) fn check(wasm: &[u8], limits: &ModuleLimits, ceilings: &Ceilings) -> Result<(), StaticRefusal> {
    let malformed = |e: wasmparser::BinaryReaderError| InvalidRequest::InvalidModule { reason: format!("{e}") };
    let mut functions: u64 = 0;
    let mut total_body: u64 = 0;
    let mut total_locals: u64 = 0;
    let mut total_blocks: u64 = 0;
    let mut total_block_locals: u64 = 0;
    // Parameters of each type (0 for non-function types), and the type of
    // each defined function: parameters are locals too.
    let mut type_params: Vec<u32> = Vec::new();
    let mut function_types: Vec<u32> = Vec::new();
    for payload in Parser::new(0).parse_all(wasm) {
        match payload.map_err(malformed)? {
            Payload::GlobalSection(reader) => {
                over("max_globals", u64::from(reader.count()), u64::from(limits.max_globals), "globals")?;
            }
            Payload::TypeSection(reader) => {
                over("max_types", u64::from(reader.count()), u64::from(limits.max_types), "types")?;
                for group in reader {
                    for ty in group.map_err(malformed)?.types() {
                        type_params.push(match &ty.composite_type.inner {
                            wasmparser::CompositeInnerType::Func(f) => f.params().len() as u32,
                            _ => 0,
                        });
                    }
                }
            }
            Payload::FunctionSection(reader) => {
                let count = u64::from(reader.count());
                over("max_functions", count, u64::from(limits.max_functions), "functions")?;
                for ty in reader {
                    function_types.push(ty.map_err(malformed)?);
                }
            }
            Payload::MemorySection(reader) => {
                for memory in reader {
                    let memory = memory.map_err(malformed)?;
                    let page = 1u64 << memory.page_size_log2.unwrap_or(16).min(32);
                    let bytes = memory.initial.saturating_mul(page);
                    if bytes > ceilings.memory_bytes {
                        return Err(StaticRefusal::TooBigToStart(format!(
                            "the module's initial memory of {bytes} bytes is over the memory ceiling of {} bytes \
                             (WasmGuestConfig::max_memory_bytes): it cannot start",
                            ceilings.memory_bytes
                        )));
                    }
                }
            }
            Payload::TableSection(reader) => {
                for table in reader {
                    let initial = table.map_err(malformed)?.ty.initial;
                    if initial > ceilings.table_elements {
                        return Err(StaticRefusal::TooBigToStart(format!(
                            "the module's initial table of {initial} elements is over the ceiling of {} \
                             (WasmGuestConfig::max_table_elements): it cannot start",
                            ceilings.table_elements
                        )));
                    }
                }
            }
            Payload::CodeSectionEntry(body) => {
                functions += 1;
                // The function section's count was checked; a code section
                // with more bodies is malformed, but refuse before reading them.
                over("max_functions", functions, u64::from(limits.max_functions), "function bodies")?;
                let size = body.range().len() as u64;
                over("max_function_body_bytes", size, u64::from(limits.max_function_body_bytes), "bytes in one body")?;
                total_body += size;
                over("max_total_body_bytes", total_body, limits.max_total_body_bytes, "bytes of function bodies")?;

                let params = function_types
                    .get(functions as usize - 1)
                    .and_then(|&ty| type_params.get(ty as usize))
                    .copied()
                    .unwrap_or(0);
                let mut locals = u64::from(params);
                let mut reader = body.get_locals_reader().map_err(malformed)?;
                for _ in 0..reader.get_count() {
                    let (count, _) = reader.read().map_err(malformed)?;
                    locals = locals.saturating_add(u64::from(count));
                    over("max_locals_per_function", locals, u64::from(limits.max_locals_per_function), "locals")?;
                }
                total_locals += locals;
                over("max_total_locals", total_locals, limits.max_total_locals, "locals in all functions")?;

                let blocks = control_flow(&body, limits)?;
                total_blocks += blocks;
                over("max_total_blocks", total_blocks, limits.max_total_blocks, "control blocks in all functions")?;
                let block_locals = blocks.saturating_mul(locals);
                let max = limits.max_block_locals_per_function;
                over("max_block_locals_per_function", block_locals, max, "blocks times locals in one function")?;
                total_block_locals = total_block_locals.saturating_add(block_locals);
                let max = limits.max_total_block_locals;
                over("max_total_block_locals", total_block_locals, max, "blocks times locals in all functions")?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// Walks one body's operators, refusing it once control blocks nest deeper
/// or are more than the limits allow; returns how many blocks it has.
fn control_flow(body: &wasmparser::FunctionBody<'_>, limits: &ModuleLimits) -> Result<u64, InvalidRequest> {
    let malformed = |e: wasmparser::BinaryReaderError| InvalidRequest::InvalidModule { reason: format!("{e}") };
    let mut reader = body.get_operators_reader().map_err(malformed)?;
    let (mut depth, mut blocks): (u64, u64) = (0, 0);
    while !reader.eof() {
        match reader.read().map_err(malformed)? {
            Operator::Block { .. }
            | Operator::Loop { .. }
            | Operator::If { .. }
            | Operator::TryTable { .. }
            | Operator::Try { .. } => {
                depth += 1;
                blocks += 1;
                over("max_control_depth", depth, u64::from(limits.max_control_depth), "levels of nested blocks")?;
                let max = u64::from(limits.max_blocks_per_function);
                over("max_blocks_per_function", blocks, max, "control blocks in one function")?;
            }
            // `delegate` ends a legacy `try` as `end` does.
            Operator::End | Operator::Delegate { .. } => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(blocks)
}

/// Refuses a payload over [`ModuleLimits::max_module_bytes`] before it is
/// hashed or parsed.
pub(crate) fn check_size(bytes: &[u8], limits: &ModuleLimits) -> Result<(), InvalidRequest> {
    over("max_module_bytes", bytes.len() as u64, limits.max_module_bytes, "bytes of module")?;
    if !bytes.starts_with(b"\0asm") {
        over(
            "max_wat_bytes",
            bytes.len() as u64,
            limits.max_wat_bytes,
            "bytes of WAT text; give larger modules as binary",
        )?;
    }
    Ok(())
}

/// A refusal naming the limit when `value` is over `max`.
fn over(limit: &str, value: u64, max: u64, what: &str) -> Result<(), InvalidRequest> {
    if value <= max {
        return Ok(());
    }
    Err(InvalidRequest::InvalidModule {
        reason: format!(
            "over the static module limit {limit} ({value} {what}, at most {max}; WasmGuestConfig::module_limits)"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CEILINGS: Ceilings = Ceilings { memory_bytes: 1 << 30, table_elements: 100_000 };

    fn check_wat(wat: &str, limits: &ModuleLimits) -> Result<(), StaticRefusal> {
        check(&wat::parse_str(wat).unwrap(), limits, &CEILINGS)
    }

    fn refused_for(result: Result<(), StaticRefusal>) -> String {
        match result {
            Err(StaticRefusal::Invalid(InvalidRequest::InvalidModule { reason })) => reason,
            other => panic!("expected an invalid module, got {other:?}"),
        }
    }

    #[test]
    fn wat_text_has_its_own_smaller_size_limit() {
        let limits = ModuleLimits { max_wat_bytes: 100, ..ModuleLimits::default() };
        let text = format!("(module {})", " ".repeat(200));
        let why = match check_size(text.as_bytes(), &limits) {
            Err(InvalidRequest::InvalidModule { reason }) => reason,
            other => panic!("{other:?}"),
        };
        assert!(why.contains("max_wat_bytes"), "{why}");
        // The same size as binary passes.
        let mut binary = b"\0asm\x01\0\0\0".to_vec();
        binary.resize(200, 0);
        check_size(&binary, &limits).unwrap();
    }

    #[test]
    fn small_modules_pass() {
        check_wat("(module (func (local i32) (block (loop (br 1)))))", &ModuleLimits::default()).unwrap();
    }

    #[test]
    fn each_limit_is_named() {
        let tight = ModuleLimits {
            max_module_bytes: 1 << 20,
            max_wat_bytes: 1 << 20,
            max_types: 2,
            max_globals: 1,
            max_functions: 2,
            max_function_body_bytes: 64,
            max_total_body_bytes: 100,
            max_control_depth: 2,
            max_blocks_per_function: 4,
            max_total_blocks: 6,
            max_locals_per_function: 3,
            max_total_locals: 5,
            max_block_locals_per_function: 6,
            max_total_block_locals: 10,
        };
        let big_body = format!("(module (func {}))", "(drop (i32.const 1000000))".repeat(20));
        let cases = [
            ("(module (func) (func) (func))", "max_functions"),
            ("(module (type (func)) (type (func (param i32))) (type (func (result i32))))", "max_types"),
            ("(module (global i32 (i32.const 0)) (global i32 (i32.const 1)))", "max_globals"),
            (big_body.as_str(), "max_function_body_bytes"),
            ("(module (func (block (block (block)))))", "max_control_depth"),
            ("(module (func (if (i32.const 0) (then (loop (if (i32.const 1) (then)))))))", "max_control_depth"),
            ("(module (func (local i32 i64 f32 f64)))", "max_locals_per_function"),
            ("(module (func (param i32 i32) (local i32 i64)))", "max_locals_per_function"),
            ("(module (func (param i32 i32 i32) (block) (block) (block)))", "max_block_locals_per_function"),
            (
                "(module (func (param i32 i32) (block) (block) (block)) (func (param i32 i32) (block) (block) (block)))",
                "max_total_block_locals",
            ),
            ("(module (func (local i32 i32 i32)) (func (local i32 i32 i32)))", "max_total_locals"),
            ("(module (func (block) (block) (block) (block) (block)))", "max_blocks_per_function"),
            (
                "(module (func (block) (block) (loop) (loop)) (func (if (i32.const 0) (then)) (block) (block)))",
                "max_total_blocks",
            ),
        ];
        for (wat, limit) in cases {
            let reason = refused_for(check_wat(wat, &tight));
            assert!(reason.contains(limit), "{wat}: {reason}");
        }
        // Sequential blocks are not nesting.
        check_wat("(module (func (block) (block) (block) (loop)))", &tight).unwrap();
    }

    #[test]
    fn total_body_bytes_is_counted_across_functions() {
        let limits = ModuleLimits { max_total_body_bytes: 40, ..ModuleLimits::default() };
        let body = "(func (drop (i32.const 1000000)) (drop (i32.const 1000000)) (drop (i32.const 1000000)))";
        check_wat(&format!("(module {body})"), &limits).unwrap();
        let reason = refused_for(check_wat(&format!("(module {body} {body} {body})"), &limits));
        assert!(reason.contains("max_total_body_bytes"), "{reason}");
    }

    #[test]
    fn memory_and_tables_too_big_to_start_are_resource_refusals() {
        let limits = ModuleLimits::default();
        // 16,385 pages = 1 GiB + 64 KiB.
        match check_wat("(module (memory 16385))", &limits) {
            Err(StaticRefusal::TooBigToStart(why)) => assert!(why.contains("initial memory"), "{why}"),
            other => panic!("{other:?}"),
        }
        check_wat("(module (memory 16384))", &limits).unwrap();
        match check_wat("(module (table 100001 funcref))", &limits) {
            Err(StaticRefusal::TooBigToStart(why)) => assert!(why.contains("initial table"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn malformed_bytes_are_invalid_not_a_panic() {
        let mut wasm = wat::parse_str("(module (func (block (loop))))").unwrap();
        wasm.truncate(wasm.len() - 3);
        refused_for(check(&wasm, &ModuleLimits::default(), &CEILINGS));
        refused_for(check(b"\0asm\x01\0\0\0\x0a\xff\xff\xff\xff\x0f", &ModuleLimits::default(), &CEILINGS));
    }
}
