//! The realm a run sees: `console`, and guards on built-ins whose native
//! code would otherwise recurse without bound or allocate without bound.
//!
//! Guards wrap the original built-in in a native function that checks first;
//! the originals are captured in the wrappers and unreachable from JS.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use boa_engine::object::ObjectInitializer;
use boa_engine::property::{Attribute, PropertyDescriptor};
use boa_engine::value::IntegerOrInfinity;
use boa_engine::{Context, JsNativeError, JsObject, JsResult, JsValue, NativeFunction, js_string};

use super::EngineSettings;
use crate::limits::BoundedBuffer;
use crate::limits::nesting;

/// Where `console.*` lines go during a run: a bounded buffer shared with a
/// waiting host thread (in-thread), or frames to the host (worker process).
pub(super) trait Console {
    /// Appends `text` and a newline to stdout, or to stderr.
    fn line(&self, to_stderr: bool, text: &str);
}

/// Captured stdout/stderr of one run, shared with the waiting caller so a run
/// abandoned at its deadline still reports what it printed.
#[derive(Debug)]
pub(super) struct Streams {
    pub stdout: BoundedBuffer,
    pub stderr: BoundedBuffer,
}

/// [`Streams`] shared between the run's thread and its caller.
pub(super) struct SharedStreams(pub Arc<Mutex<Streams>>);

impl Console for SharedStreams {
    fn line(&self, to_stderr: bool, text: &str) {
        let mut streams = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let stream = if to_stderr { &mut streams.stderr } else { &mut streams.stdout };
        stream.write_str(text);
        stream.write_str("\n");
    }
}

/// Context data: where `console` writes during the current run.
pub(super) struct ConsoleSink(pub Rc<dyn Console>);

/// Context data: bounds the guards enforce.
#[derive(Clone, Copy)]
pub(super) struct GuardLimits {
    pub max_nesting: usize,
    pub max_len: u64,
    pub max_walk: u64,
}

impl From<&EngineSettings> for GuardLimits {
    fn from(cfg: &EngineSettings) -> Self {
        Self { max_nesting: cfg.max_nesting, max_len: cfg.max_builtin_len, max_walk: cfg.max_walk_nodes }
    }
}

/// Context data: the current run's deadline, for long native walks.
pub(super) struct RunDeadline(pub crate::limits::Deadline);

/// Context data: set while a guarded `join` runs, so nested joins (one per
/// nesting level, through `Array.prototype.toString`) skip the walk.
struct JoinActive(Cell<bool>);

/// Handles kept from setup for the engine's own use.
pub(super) struct Realm {
    /// The guarded `JSON.stringify`, used to produce `output` whatever the
    /// code does to the global `JSON`.
    pub stringify: JsObject,
}

/// Installs `console` and the guards. Runs once per fresh context, before any
/// user code, so everything it reads from the global object is pristine.
pub(super) fn install(ctx: &mut Context, limits: GuardLimits) -> JsResult<Realm> {
    ctx.insert_data(limits);
    ctx.insert_data(JoinActive(Cell::new(false)));

    let console = ObjectInitializer::new(ctx)
        .function(NativeFunction::from_fn_ptr(console_out), js_string!("log"), 0)
        .function(NativeFunction::from_fn_ptr(console_out), js_string!("info"), 0)
        .function(NativeFunction::from_fn_ptr(console_out), js_string!("debug"), 0)
        .function(NativeFunction::from_fn_ptr(console_err), js_string!("warn"), 0)
        .function(NativeFunction::from_fn_ptr(console_err), js_string!("error"), 0)
        .build();
    ctx.register_global_property(js_string!("console"), console, Attribute::WRITABLE | Attribute::CONFIGURABLE)?;

    let global = ctx.global_object();
    let json = object(global.get(js_string!("JSON"), ctx)?)?;
    let constructors = ctx.intrinsics().constructors();
    let array_proto = constructors.array().prototype();
    let string_proto = constructors.string().prototype();
    // Every way to reach a function constructor: the global `Function`, and
    // `.constructor` on each function prototype (async, generator, ...).
    let function_constructors: Vec<(JsObject, JsObject)> = [
        constructors.function(),
        constructors.async_function(),
        constructors.generator_function(),
        constructors.async_generator_function(),
    ]
    .into_iter()
    .map(|c| (c.constructor(), c.prototype()))
    .collect();

    wrap(ctx, &global, "eval", 1, guarded_eval)?;
    wrap(ctx, &json, "parse", 2, guarded_json_parse)?;
    let stringify = wrap(ctx, &json, "stringify", 3, guarded_stringify)?;
    wrap(ctx, &array_proto, "join", 1, guarded_join)?;
    wrap(ctx, &array_proto, "fill", 1, guarded_fill)?;
    wrap(ctx, &string_proto, "repeat", 1, guarded_repeat)?;
    wrap(ctx, &string_proto, "padStart", 2, guarded_pad)?;
    wrap(ctx, &string_proto, "padEnd", 2, guarded_pad)?;

    for (original, prototype) in function_constructors {
        let guarded = guarded_function(ctx, original.clone());
        // Some of these are non-writable but configurable: redefine.
        prototype.define_property_or_throw(
            js_string!("constructor"),
            PropertyDescriptor::builder().value(guarded.clone()).writable(true).enumerable(false).configurable(true),
            ctx,
        )?;
        if JsValue::from(original) == global.get(js_string!("Function"), ctx)? {
            global.set(js_string!("Function"), guarded, true, ctx)?;
        }
    }

    Ok(Realm { stringify })
}

type Guard = fn(&JsValue, &[JsValue], &JsObject, &mut Context) -> JsResult<JsValue>;

/// Replaces `target[name]` with a native function that runs `guard` with the
/// original captured. Returns the wrapper.
fn wrap(ctx: &mut Context, target: &JsObject, name: &str, length: usize, guard: Guard) -> JsResult<JsObject> {
    let original = object(target.get(js_string!(name), ctx)?)?;
    let function = NativeFunction::from_copy_closure_with_captures(
        move |this, args, original: &JsObject, ctx| guard(this, args, original, ctx),
        original,
    );
    let wrapper: JsObject = boa_engine::object::FunctionObjectBuilder::new(ctx.realm(), function)
        .name(js_string!(name))
        .length(length)
        .build()
        .into();
    target.set(js_string!(name), wrapper.clone(), true, ctx)?;
    Ok(wrapper)
}

fn guarded_function(ctx: &mut Context, original: JsObject) -> JsObject {
    let function = NativeFunction::from_copy_closure_with_captures(
        |_this, args, original: &JsObject, ctx| {
            let mut texts = Vec::with_capacity(args.len());
            for arg in args {
                let text = arg.to_string(ctx)?;
                scan(&text.to_std_string_escaped(), ctx)?;
                texts.push(JsValue::from(text));
            }
            original.call(&JsValue::undefined(), &texts, ctx)
        },
        original,
    );
    boa_engine::object::FunctionObjectBuilder::new(ctx.realm(), function)
        .name(js_string!("Function"))
        .length(1)
        .constructor(true)
        .build()
        .into()
}

fn object(value: JsValue) -> JsResult<JsObject> {
    value.as_object().ok_or_else(|| JsNativeError::typ().with_message("execbox realm setup: expected an object").into())
}

fn limits(ctx: &Context) -> GuardLimits {
    // Always inserted by `install`; the fallback only keeps this total.
    ctx.get_data::<GuardLimits>().copied().unwrap_or_else(|| GuardLimits::from(&EngineSettings::default()))
}

fn range_error(message: String) -> boa_engine::JsError {
    JsNativeError::range().with_message(message).into()
}

/// Refuses source text nested deeper than the limit (see [`nesting`]).
fn scan(text: &str, ctx: &Context) -> JsResult<()> {
    let max = limits(ctx).max_nesting;
    match nesting::source_nesting_exceeds(text, max) {
        Some(depth) => Err(range_error(format!("source nests {depth} levels deep, over the limit of {max}"))),
        None => Ok(()),
    }
}

fn guarded_eval(_this: &JsValue, args: &[JsValue], original: &JsObject, ctx: &mut Context) -> JsResult<JsValue> {
    if let Some(text) = args.first().and_then(JsValue::as_string) {
        scan(&text.to_std_string_escaped(), ctx)?;
    }
    original.call(&JsValue::undefined(), args, ctx)
}

fn guarded_json_parse(this: &JsValue, args: &[JsValue], original: &JsObject, ctx: &mut Context) -> JsResult<JsValue> {
    let text = args.first().cloned().unwrap_or_default().to_string(ctx)?;
    scan(&text.to_std_string_escaped(), ctx)?;
    let mut args = args.to_vec();
    match args.first_mut() {
        Some(first) => *first = text.into(),
        None => args.push(text.into()),
    }
    original.call(this, &args, ctx)
}

fn guarded_stringify(this: &JsValue, args: &[JsValue], original: &JsObject, ctx: &mut Context) -> JsResult<JsValue> {
    if let Some(value) = args.first() {
        check_value(value, Walk::AllObjects, ctx)?;
    }
    original.call(this, args, ctx)
}

fn guarded_join(this: &JsValue, args: &[JsValue], original: &JsObject, ctx: &mut Context) -> JsResult<JsValue> {
    let outermost = ctx.get_data::<JoinActive>().is_some_and(|a| !a.0.replace(true));
    if !outermost {
        return original.call(this, args, ctx);
    }
    let result = check_value(this, Walk::ArraysOnly, ctx).and_then(|()| original.call(this, args, ctx));
    if let Some(active) = ctx.get_data::<JoinActive>() {
        active.0.set(false);
    }
    result
}

fn guarded_fill(this: &JsValue, args: &[JsValue], original: &JsObject, ctx: &mut Context) -> JsResult<JsValue> {
    if let Some(obj) = this.as_object() {
        let len = obj.get(js_string!("length"), ctx)?.to_length(ctx)?;
        let max = limits(ctx).max_len;
        if len > max {
            return Err(range_error(format!("fill of {len} elements exceeds the limit of {max}")));
        }
    }
    original.call(this, args, ctx)
}

fn guarded_repeat(this: &JsValue, args: &[JsValue], original: &JsObject, ctx: &mut Context) -> JsResult<JsValue> {
    let text = this.to_string(ctx)?;
    let count = args.first().cloned().unwrap_or_default().to_integer_or_infinity(ctx)?;
    if let IntegerOrInfinity::Integer(n) = count
        && n > 0
    {
        let len = (text.len() as u64).saturating_mul(n as u64);
        check_len(len, "repeat", ctx)?;
    } else if count == IntegerOrInfinity::PositiveInfinity && !text.is_empty() {
        check_len(u64::MAX, "repeat", ctx)?;
    }
    original.call(&text.into(), args, ctx)
}

fn guarded_pad(this: &JsValue, args: &[JsValue], original: &JsObject, ctx: &mut Context) -> JsResult<JsValue> {
    let target = args.first().cloned().unwrap_or_default().to_length(ctx)?;
    check_len(target, "padStart/padEnd", ctx)?;
    original.call(this, args, ctx)
}

fn check_len(len: u64, what: &str, ctx: &Context) -> JsResult<()> {
    let max = limits(ctx).max_len;
    if len > max {
        return Err(range_error(format!("{what} would create {len} units, over the limit of {max}")));
    }
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Walk {
    /// Descend into arrays and plain objects (what `JSON.stringify` visits).
    AllObjects,
    /// Descend into arrays only (what `join` visits).
    ArraysOnly,
}

/// Walks `value` iteratively and throws a `RangeError` if it nests deeper than
/// `max_nesting` (cycles count as infinitely deep) or has more than
/// `max_walk` nodes (shared sub-values count each time they are reached, as
/// the native walkers would reach them).
pub(super) fn check_value(value: &JsValue, walk: Walk, ctx: &mut Context) -> JsResult<()> {
    let GuardLimits { max_nesting, max_walk, .. } = limits(ctx);
    let max_len = max_walk;
    let Some(root) = value.as_object() else { return Ok(()) };
    let mut stack = vec![(root, 1usize)];
    let mut visited: u64 = 0;
    let mut next_deadline_check: u64 = 0;
    while let Some((obj, depth)) = stack.pop() {
        if visited >= next_deadline_check {
            // Native code does not yield to the deadline check; do it here.
            next_deadline_check = visited + 4096;
            if ctx.get_data::<RunDeadline>().is_some_and(|d| d.0.expired()) {
                return Err(range_error("deadline exceeded while walking a value".into()));
            }
        }
        if depth > max_nesting {
            return Err(range_error(format!("value nests deeper than {max_nesting} levels (or is cyclic)")));
        }
        let is_array = obj.is_array();
        if !is_array && walk == Walk::ArraysOnly {
            continue;
        }
        if is_array {
            let len = obj.get(js_string!("length"), ctx)?.to_length(ctx)?;
            if len > max_len.saturating_sub(visited) {
                return Err(range_error(format!("value has more than {max_len} elements")));
            }
            visited += len;
            for index in 0..len {
                // len <= max_len, which is far below u32::MAX.
                if let Some(child) = obj.get(index as u32, ctx)?.as_object() {
                    stack.push((child, depth + 1));
                }
            }
        } else if !obj.is_callable() {
            for key in obj.own_property_keys(ctx)? {
                visited += 1;
                if visited > max_len {
                    return Err(range_error(format!("value has more than {max_len} elements")));
                }
                if let Some(child) = obj.get(key, ctx)?.as_object() {
                    stack.push((child, depth + 1));
                }
            }
        }
    }
    Ok(())
}

fn console_out(_this: &JsValue, args: &[JsValue], ctx: &mut Context) -> JsResult<JsValue> {
    write_console(args, ctx, false)
}

fn console_err(_this: &JsValue, args: &[JsValue], ctx: &mut Context) -> JsResult<JsValue> {
    write_console(args, ctx, true)
}

/// Formats like a terse `console.log`: strings as-is, other values through
/// boa's display (after the same depth/size check as `JSON.stringify`),
/// space-separated, one line.
fn write_console(args: &[JsValue], ctx: &mut Context, to_stderr: bool) -> JsResult<JsValue> {
    let mut line = String::new();
    for (i, arg) in args.iter().enumerate() {
        if i > 0 {
            line.push(' ');
        }
        match arg.as_string() {
            Some(s) => line.push_str(&s.to_std_string_escaped()),
            None => match check_value(arg, Walk::AllObjects, ctx) {
                Ok(()) => line.push_str(&arg.display().to_string()),
                Err(_) => line.push_str("[value too deep or too large to print]"),
            },
        }
    }
    if let Some(ConsoleSink(console)) = ctx.get_data::<ConsoleSink>() {
        console.line(to_stderr, &line);
    }
    Ok(JsValue::undefined())
}
