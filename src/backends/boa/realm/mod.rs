//! The realm a run sees: `console`, and guards on built-ins whose native
//! code would otherwise recurse or allocate without bound.
//!
//! Guards are the first line of defence (on `boa-js` the worker process is
//! the second): they turn the common bombs into catchable `RangeError`s.
//! Each guard **converts its arguments once and passes the converted values
//! on**, so a getter, `valueOf`, `toJSON` or proxy cannot answer the check
//! one way and the built-in another:
//!
//! - `JSON.stringify` first takes a *snapshot* of the value (calling each
//!   `toJSON`, replacer, getter and trap exactly once, with depth, size and
//!   deadline bounds), then serializes the snapshot, which holds only plain
//!   data and cannot change or run code;
//! - `join` is reimplemented (length read once, result length bounded,
//!   nesting through `toString` counted); `toLocaleString` shares its depth
//!   count; `flat` gets a clamped depth; `sort` a bounded length;
//! - `repeat`, `padStart`, `padEnd` get their counts as numbers;
//! - `Function.prototype.apply`, `Reflect.apply` and `Reflect.construct`
//!   build the argument list themselves (length read once, bounded);
//! - `eval`, the `Function` constructors (through the realm's
//!   `HostEnsureCanCompileStrings` hook, so direct `eval` stays direct) and
//!   `JSON.parse` scan their text for nesting before boa's recursive parser
//!   sees it;
//! - `Symbol.for`/`Symbol.keyFor` use a registry of the realm's own, not
//!   boa's process-wide one (which would keep every key of every run and is
//!   built lazily with a system call the worker's filter forbids).
//!
//! The originals are captured in the wrappers and unreachable from JS.
//!
//! The pieces: [`console`], the JSON [`snapshot`] (which the returned value,
//! `console` and tool arguments go through too), the built-in [`guards`],
//! the context [`data`] they share, and [`tools`] (Code Mode's `tools` and
//! `ToolError`, installed per run only when the run's policy grants tools).

pub(crate) mod console;
pub(crate) mod data;
pub(crate) mod guards;
pub(crate) mod snapshot;
pub(crate) mod tools;

use boa_engine::{Context, JsResult, js_string};

use crate::backends::boa::realm::data::{GuardLimits, Pristine, object};

/// Installs `console` and the guards. Runs once per fresh context, before any
/// user code, so everything it reads from the global object is pristine.
pub(crate) fn install(ctx: &mut Context, limits: GuardLimits) -> JsResult<()> {
    ctx.insert_data(limits);
    console::install(ctx)?;
    let global = ctx.global_object();
    let json = object(global.get(js_string!("JSON"), ctx)?)?;
    let constructors = ctx.intrinsics().constructors();
    let array_ctor = constructors.array().constructor();
    let object_ctor = constructors.object().constructor();
    let pristine = Pristine {
        object_keys: object(object_ctor.get(js_string!("keys"), ctx)?)?,
        is_array: object(array_ctor.get(js_string!("isArray"), ctx)?)?,
        stringify: object(json.get(js_string!("stringify"), ctx)?)?,
    };
    ctx.insert_data(pristine);
    guards::install(ctx, &global)
}
