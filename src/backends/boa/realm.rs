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

use parking_lot::Mutex;
use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;

use boa_engine::object::builtins::JsArray;
use boa_engine::object::{FunctionObjectBuilder, ObjectInitializer};
use boa_engine::property::{Attribute, PropertyDescriptor};
use boa_engine::value::IntegerOrInfinity;
use boa_engine::{Context, JsBigInt, JsNativeError, JsObject, JsResult, JsString, JsValue, NativeFunction, js_string};

use super::EngineSettings;
use crate::limits::nesting;
use crate::limits::output::BoundedBuffer;

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
        let mut streams = self.0.lock();
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
pub(super) struct RunDeadline(pub crate::limits::deadline::Deadline);

/// Context data: how deep guarded built-ins that recurse through user-visible
/// methods (`join` via `toString`, `toLocaleString`) are nested right now,
/// and how many elements the outermost call has visited in all (shared
/// sub-arrays count each time, so `a = [a, a]` cannot blow up a join).
#[derive(Default)]
struct BuiltinDepth {
    depth: Cell<usize>,
    visited: Cell<u64>,
}

/// Context data: pristine built-ins the guards use, captured before any user
/// code runs.
struct Pristine {
    object_keys: JsObject,
    is_array: JsObject,
    /// The original `JSON.stringify`, for snapshots (which hold plain data only).
    stringify: JsObject,
}

/// Installs `console` and the guards. Runs once per fresh context, before any
/// user code, so everything it reads from the global object is pristine.
pub(super) fn install(ctx: &mut Context, limits: GuardLimits) -> JsResult<()> {
    ctx.insert_data(limits);
    ctx.insert_data(BuiltinDepth::default());

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
    let reflect = object(global.get(js_string!("Reflect"), ctx)?)?;
    let constructors = ctx.intrinsics().constructors();
    let array_ctor = constructors.array().constructor();
    let object_ctor = constructors.object().constructor();
    let array_proto = constructors.array().prototype();
    let string_proto = constructors.string().prototype();
    let function_proto = constructors.function().prototype();
    let pristine = Pristine {
        object_keys: object(object_ctor.get(js_string!("keys"), ctx)?)?,
        is_array: object(array_ctor.get(js_string!("isArray"), ctx)?)?,
        stringify: object(json.get(js_string!("stringify"), ctx)?)?,
    };
    ctx.insert_data(pristine);

    wrap(ctx, &json, "parse", 2, guarded_json_parse)?;
    wrap(ctx, &json, "stringify", 3, guarded_stringify)?;
    wrap(ctx, &array_proto, "join", 1, guarded_join)?;
    wrap(ctx, &array_proto, "toLocaleString", 0, guarded_to_locale_string)?;
    for name in ["toSorted", "toReversed", "with"] {
        wrap(ctx, &array_proto, name, 1, guarded_copying)?;
    }
    wrap(ctx, &array_proto, "flat", 0, guarded_flat)?;
    wrap(ctx, &array_proto, "sort", 1, guarded_sort)?;
    wrap(ctx, &array_proto, "fill", 1, guarded_fill)?;
    wrap(ctx, &string_proto, "repeat", 1, guarded_repeat)?;
    wrap(ctx, &string_proto, "padStart", 2, guarded_pad)?;
    wrap(ctx, &string_proto, "padEnd", 2, guarded_pad)?;
    wrap(ctx, &function_proto, "apply", 2, guarded_function_apply)?;
    wrap(ctx, &reflect, "apply", 3, guarded_reflect_apply)?;
    wrap(ctx, &reflect, "construct", 2, guarded_reflect_construct)?;
    install_symbol_registry(ctx, &global)?;
    Ok(())
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
    let wrapper: JsObject =
        FunctionObjectBuilder::new(ctx.realm(), function).name(js_string!(name)).length(length).build().into();
    target.set(js_string!(name), wrapper.clone(), true, ctx)?;
    Ok(wrapper)
}

/// Context data: this realm's `Symbol.for` registry.
#[derive(Default)]
struct SymbolRegistry(std::cell::RefCell<Vec<(JsString, boa_engine::JsSymbol)>>);

/// Replaces `Symbol.for` and `Symbol.keyFor` with versions over a registry
/// that lives and dies with this realm.
fn install_symbol_registry(ctx: &mut Context, global: &JsObject) -> JsResult<()> {
    ctx.insert_data(SymbolRegistry::default());
    let symbol = object(global.get(js_string!("Symbol"), ctx)?)?;
    let symbol_for = |_this: &JsValue, args: &[JsValue], ctx: &mut Context| -> JsResult<JsValue> {
        let key = arg(args, 0).to_string(ctx)?;
        let Some(registry) = ctx.get_data::<SymbolRegistry>() else { return Ok(JsValue::undefined()) };
        let mut entries = registry.0.borrow_mut();
        if let Some((_, found)) = entries.iter().find(|(k, _)| *k == key) {
            return Ok(found.clone().into());
        }
        let created = boa_engine::JsSymbol::new(Some(key.clone()))
            .ok_or_else(|| JsNativeError::range().with_message("too many symbols"))?;
        entries.push((key, created.clone()));
        Ok(created.into())
    };
    let key_for = |_this: &JsValue, args: &[JsValue], ctx: &mut Context| -> JsResult<JsValue> {
        let Some(sym) = arg(args, 0).as_symbol() else {
            return Err(JsNativeError::typ().with_message("Symbol.keyFor: sym is not a symbol").into());
        };
        let Some(registry) = ctx.get_data::<SymbolRegistry>() else { return Ok(JsValue::undefined()) };
        let entries = registry.0.borrow();
        Ok(entries.iter().find(|(_, s)| *s == sym).map_or(JsValue::undefined(), |(k, _)| k.clone().into()))
    };
    for (name, function) in
        [("for", NativeFunction::from_fn_ptr(symbol_for)), ("keyFor", NativeFunction::from_fn_ptr(key_for))]
    {
        let f: JsObject =
            FunctionObjectBuilder::new(ctx.realm(), function).name(js_string!(name)).length(1).build().into();
        symbol.define_property_or_throw(
            js_string!(name),
            PropertyDescriptor::builder().value(f).writable(true).enumerable(false).configurable(true),
            ctx,
        )?;
    }
    Ok(())
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

fn arg(args: &[JsValue], i: usize) -> JsValue {
    args.get(i).cloned().unwrap_or_default()
}

/// Throws once the run's deadline has passed (long native loops check it).
fn check_deadline(ctx: &Context) -> JsResult<()> {
    if ctx.get_data::<RunDeadline>().is_some_and(|d| d.0.expired()) {
        return Err(range_error("deadline exceeded inside a built-in".into()));
    }
    Ok(())
}

/// Refuses source text nested deeper than the limit (see [`nesting`]):
/// `JSON.parse` here, `eval` and the `Function` constructors through the
/// realm's compile-strings host hook (so direct `eval` stays direct).
pub(super) fn scan(text: &str, ctx: &Context) -> JsResult<()> {
    let max = limits(ctx).max_nesting;
    match nesting::source_nesting_exceeds(text, max) {
        Some(depth) => Err(range_error(format!("source nests {depth} levels deep, over the limit of {max}"))),
        None => Ok(()),
    }
}

fn guarded_json_parse(this: &JsValue, args: &[JsValue], original: &JsObject, ctx: &mut Context) -> JsResult<JsValue> {
    let text = arg(args, 0).to_string(ctx)?;
    scan(&text.to_std_string_escaped(), ctx)?;
    let mut args = args.to_vec();
    match args.first_mut() {
        Some(first) => *first = text.into(),
        None => args.push(text.into()),
    }
    original.call(this, &args, ctx)
}

// ---- JSON.stringify: snapshot, then serialize the snapshot ----

/// How one `JSON.stringify` call walks its value.
struct Snapshot {
    replacer: Option<JsObject>,
    keys: Option<Vec<JsString>>,
    visited: u64,
    limits: GuardLimits,
    /// A lower bound of the JSON text's size so far, and its budget: a
    /// returned value over the output cap is refused before its text exists.
    bytes: u64,
    max_bytes: u64,
}

impl Snapshot {
    fn new(limits: GuardLimits) -> Self {
        Self { replacer: None, keys: None, visited: 0, limits, bytes: 0, max_bytes: u64::MAX }
    }

    fn spend(&mut self, bytes: u64) -> JsResult<()> {
        self.bytes = self.bytes.saturating_add(bytes);
        if self.bytes > self.max_bytes {
            return Err(range_error(OVER_BUDGET.into()));
        }
        Ok(())
    }
}

/// The message of the error that ends a snapshot over its byte budget.
const OVER_BUDGET: &str = "the value's JSON is over the output cap";

/// How the returned value's JSON ended.
pub(super) enum OutputJson {
    /// No JSON form (`undefined`, a function, a symbol).
    None,
    Text(String),
    /// Its JSON would be over `max_bytes`.
    TooLarge,
}

/// The JSON text of a run's returned value: what the pristine
/// `JSON.stringify` makes of its bounded snapshot (whatever the code did to
/// the global `JSON`), refused early once it must exceed `max_bytes`.
pub(super) fn output_json(value: JsValue, max_bytes: Option<u64>, ctx: &mut Context) -> JsResult<OutputJson> {
    let stringify = ctx.get_data::<Pristine>().map(|p| p.stringify.clone());
    let Some(stringify) = stringify else { return Ok(OutputJson::None) };
    let mut snapshot = Snapshot::new(limits(ctx));
    snapshot.max_bytes = max_bytes.unwrap_or(u64::MAX);
    let holder = JsObject::with_null_proto();
    holder.create_data_property_or_throw(js_string!(""), value, ctx)?;
    let copy = match snapshot.property(js_string!(""), &holder, 1, ctx) {
        Ok(Some(copy)) => copy,
        Ok(None) => return Ok(OutputJson::None),
        Err(_) if snapshot.bytes > snapshot.max_bytes => return Ok(OutputJson::TooLarge),
        Err(e) => return Err(e),
    };
    let text = stringify.call(&JsValue::undefined(), &[copy], ctx)?;
    let Some(text) = text.as_string() else { return Ok(OutputJson::None) };
    // UTF-8 is never shorter than UTF-16 units: refuse before converting.
    if text.len() as u64 > snapshot.max_bytes {
        return Ok(OutputJson::TooLarge);
    }
    Ok(OutputJson::Text(without_lone_surrogates(&text.to_std_string_escaped())))
}

/// JSON text with every escaped lone surrogate (`"\ud83d"`, which
/// `JSON.stringify` emits for a string cut inside a character) replaced by
/// `\ufffd`: serde_json, like Rust strings, cannot hold lone surrogates.
fn without_lone_surrogates(json: &str) -> String {
    let bytes = json.as_bytes();
    let mut out = String::with_capacity(json.len());
    let mut i = 0;
    let unit_at = |at: usize| -> Option<u16> {
        let hex = json.get(at + 2..at + 6)?;
        (bytes.get(at) == Some(&b'\\') && bytes.get(at + 1) == Some(&b'u'))
            .then(|| u16::from_str_radix(hex, 16).ok())?
    };
    let mut last = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            if let Some(unit) = unit_at(i) {
                let high = (0xD800..0xDC00).contains(&unit);
                let low = (0xDC00..0xE000).contains(&unit);
                let paired = high && unit_at(i + 6).is_some_and(|next| (0xDC00..0xE000).contains(&next));
                if (high || low) && !paired {
                    out.push_str(&json[last..i]);
                    out.push_str("\\ufffd");
                    i += 6;
                    last = i;
                    continue;
                }
                i += if paired { 12 } else { 6 };
                continue;
            }
            i += 2; // any other escape: skip the escaped character
            continue;
        }
        i += 1;
    }
    out.push_str(&json[last..]);
    out
}

fn guarded_stringify(this: &JsValue, args: &[JsValue], original: &JsObject, ctx: &mut Context) -> JsResult<JsValue> {
    let replacer_arg = arg(args, 1);
    let mut snapshot = Snapshot::new(limits(ctx));
    if let Some(replacer) = replacer_arg.as_object() {
        if replacer.is_callable() {
            snapshot.replacer = Some(replacer.clone());
        } else if is_array(&replacer_arg, ctx)? {
            snapshot.keys = Some(property_list(&replacer, ctx, &snapshot.limits)?);
        }
    }
    // The wrapper holder of the spec: {"": value}.
    let holder = JsObject::with_null_proto();
    holder.create_data_property_or_throw(js_string!(""), arg(args, 0), ctx)?;
    let value = snapshot.property(js_string!(""), &holder, 1, ctx)?;
    let Some(value) = value else { return Ok(JsValue::undefined()) };
    original.call(this, &[value, JsValue::undefined(), arg(args, 2)], ctx)
}

/// The keys of an array replacer: strings, numbers and their wrappers, once each.
fn property_list(replacer: &JsObject, ctx: &mut Context, limits: &GuardLimits) -> JsResult<Vec<JsString>> {
    let len = replacer.get(js_string!("length"), ctx)?.to_length(ctx)?;
    if len > limits.max_walk {
        return Err(range_error(format!("a replacer list of {len} keys is over the limit of {}", limits.max_walk)));
    }
    let mut keys: Vec<JsString> = Vec::new();
    for i in 0..len {
        let v = replacer.get(i, ctx)?;
        let item = match v.as_object() {
            Some(o) if o.is::<JsString>() || o.is::<f64>() => Some(v.to_string(ctx)?),
            Some(_) => None,
            None if v.is_string() || v.is_number() => Some(v.to_string(ctx)?),
            None => None,
        };
        if let Some(item) = item
            && !keys.contains(&item)
        {
            keys.push(item);
        }
    }
    Ok(keys)
}

impl Snapshot {
    /// SerializeJSONProperty's value preparation for `holder[key]`, then a
    /// plain copy of it: `None` where JSON has no value (`undefined`,
    /// functions, symbols).
    fn property(
        &mut self,
        key: JsString,
        holder: &JsObject,
        depth: usize,
        ctx: &mut Context,
    ) -> JsResult<Option<JsValue>> {
        self.visited += 1;
        if self.visited > self.limits.max_walk {
            return Err(range_error(format!("value has more than {} elements", self.limits.max_walk)));
        }
        if self.visited.is_multiple_of(4096) {
            check_deadline(ctx)?;
        }
        let mut value = holder.get(key.clone(), ctx)?;
        if value.is_object() || value.is_bigint() {
            let to_json = value.to_object(ctx)?.get(js_string!("toJSON"), ctx)?;
            if let Some(f) = to_json.as_callable() {
                value = f.call(&value, &[key.clone().into()], ctx)?;
            }
        }
        if let Some(replacer) = &self.replacer {
            value = replacer.call(&holder.clone().into(), &[key.into(), value], ctx)?;
        }
        if let Some(obj) = value.as_object() {
            if obj.is::<f64>() {
                value = value.to_number(ctx)?.into();
            } else if obj.is::<JsString>() {
                value = value.to_string(ctx)?.into();
            } else if let Some(b) = obj.downcast_ref::<bool>().map(|b| *b) {
                value = b.into();
            } else if let Some(big) = obj.downcast_ref::<JsBigInt>().map(|b| b.clone()) {
                value = big.into();
            }
        }
        let Some(obj) = value.as_object() else {
            // Primitives are data already; symbols and undefined have no JSON.
            let size = match value.as_string() {
                Some(s) => s.len() as u64 + 2,
                None => 4,
            };
            self.spend(size)?;
            return Ok((!value.is_undefined() && !value.is_symbol()).then_some(value));
        };
        if obj.is_callable() {
            return Ok(None);
        }
        if depth >= self.limits.max_nesting {
            return Err(range_error(format!("value nests {} levels or more (or is cyclic)", self.limits.max_nesting)));
        }
        self.spend(2)?;
        if is_array(&value, ctx)? {
            let len = obj.get(js_string!("length"), ctx)?.to_length(ctx)?;
            if len > self.limits.max_walk.saturating_sub(self.visited) {
                return Err(range_error(format!("value has more than {} elements", self.limits.max_walk)));
            }
            let mut items = Vec::with_capacity(len as usize);
            for i in 0..len {
                let item = self.property(JsString::from(i.to_string().as_str()), &obj, depth + 1, ctx)?;
                items.push(item.unwrap_or_else(JsValue::null));
            }
            let copy = JsArray::from_iter(items, ctx);
            // An own `toJSON: undefined` hides any `Array.prototype.toJSON`
            // the code installed; arrays serialize indices only, so it is
            // never printed.
            copy.define_property_or_throw(
                js_string!("toJSON"),
                PropertyDescriptor::builder()
                    .value(JsValue::undefined())
                    .writable(false)
                    .enumerable(false)
                    .configurable(false),
                ctx,
            )?;
            return Ok(Some(copy.into()));
        }
        if obj.is::<boa_engine::builtins::typed_array::TypedArray>() {
            // Listing the keys of a typed array of millions of elements
            // would itself be the allocation bomb: check its length first.
            let len = obj.get(js_string!("length"), ctx)?.to_length(ctx)?;
            if len > self.limits.max_walk.saturating_sub(self.visited) {
                return Err(range_error(format!("value has more than {} elements", self.limits.max_walk)));
            }
        }
        let keys = match &self.keys {
            Some(keys) => keys.clone(),
            None => own_enumerable_keys(&obj, ctx)?,
        };
        // A null-prototype copy: nothing inherited (no `toJSON`) can run.
        let copy = JsObject::with_null_proto();
        for key in keys {
            self.spend(key.len() as u64 + 3)?;
            if let Some(item) = self.property(key.clone(), &obj, depth + 1, ctx)? {
                copy.create_data_property_or_throw(key, item, ctx)?;
            }
        }
        Ok(Some(copy.into()))
    }
}

/// `Object.keys(obj)` with the pristine `Object.keys`.
fn own_enumerable_keys(obj: &JsObject, ctx: &mut Context) -> JsResult<Vec<JsString>> {
    let keys_fn = ctx.get_data::<Pristine>().map(|p| p.object_keys.clone());
    let Some(keys_fn) = keys_fn else { return Ok(Vec::new()) };
    let keys = object(keys_fn.call(&JsValue::undefined(), &[obj.clone().into()], ctx)?)?;
    let len = keys.get(js_string!("length"), ctx)?.to_length(ctx)?;
    let mut out = Vec::with_capacity(len as usize);
    for i in 0..len {
        out.push(keys.get(i, ctx)?.to_string(ctx)?);
    }
    Ok(out)
}

/// `Array.isArray(value)` with the pristine function (sees through proxies).
fn is_array(value: &JsValue, ctx: &mut Context) -> JsResult<bool> {
    let is_array = ctx.get_data::<Pristine>().map(|p| p.is_array.clone());
    match is_array {
        Some(f) => Ok(f.call(&JsValue::undefined(), std::slice::from_ref(value), ctx)?.to_boolean()),
        None => Ok(value.as_object().is_some_and(|o| o.is_array())),
    }
}

// ---- join / toLocaleString / flat / sort / fill ----

/// Runs `f` one level deeper in the built-in nesting count (join through
/// `toString`, `toLocaleString` through elements), refusing past the limit:
/// a cyclic or deep array fails with a `RangeError` instead of native recursion.
fn nested<T>(ctx: &mut Context, f: impl FnOnce(&mut Context) -> JsResult<T>) -> JsResult<T> {
    let max = limits(ctx).max_nesting;
    let depth = ctx.get_data::<BuiltinDepth>().map_or(0, |d| d.depth.get());
    if depth >= max {
        return Err(range_error(format!("array nests deeper than {max} levels (or is cyclic)")));
    }
    if let Some(d) = ctx.get_data::<BuiltinDepth>() {
        d.depth.set(depth + 1);
        if depth == 0 {
            d.visited.set(0);
        }
    }
    let result = f(ctx);
    if let Some(d) = ctx.get_data::<BuiltinDepth>() {
        d.depth.set(depth);
    }
    result
}

/// Counts elements visited under the outermost guarded call.
fn visit(ctx: &Context, n: u64) -> JsResult<()> {
    let max = limits(ctx).max_walk;
    if let Some(d) = ctx.get_data::<BuiltinDepth>() {
        let visited = d.visited.get().saturating_add(n);
        d.visited.set(visited);
        if visited > max {
            return Err(range_error(format!("value has more than {max} elements")));
        }
    }
    Ok(())
}

/// `Array.prototype.join`, reimplemented: the length is read once, the
/// result may not exceed `max_builtin_len`, elements that are arrays join
/// one nesting level deeper.
fn guarded_join(this: &JsValue, args: &[JsValue], _original: &JsObject, ctx: &mut Context) -> JsResult<JsValue> {
    let this = this.clone();
    let separator = arg(args, 0);
    nested(ctx, move |ctx| {
        let obj = this.to_object(ctx)?;
        let len = obj.get(js_string!("length"), ctx)?.to_length(ctx)?;
        let max = limits(ctx).max_len;
        if len > max {
            return Err(range_error(format!("join of {len} elements exceeds the limit of {max}")));
        }
        let sep: Vec<u16> =
            if separator.is_undefined() { vec![u16::from(b',')] } else { separator.to_string(ctx)?.iter().collect() };
        visit(ctx, len)?;
        let mut out: Vec<u16> = Vec::new();
        for k in 0..len {
            if k > 0 {
                out.extend_from_slice(&sep);
            }
            let element = obj.get(k, ctx)?;
            if !element.is_null_or_undefined() {
                out.extend(element.to_string(ctx)?.iter());
            }
            if out.len() as u64 > max {
                return Err(range_error(format!("join would create more than {max} units")));
            }
            if k % 4096 == 4095 {
                check_deadline(ctx)?;
            }
        }
        Ok(JsString::from(out.as_slice()).into())
    })
}

fn guarded_to_locale_string(
    this: &JsValue,
    args: &[JsValue],
    original: &JsObject,
    ctx: &mut Context,
) -> JsResult<JsValue> {
    let this = this.clone();
    check_this_length(&this, "toLocaleString", ctx)?;
    nested(ctx, move |ctx| original.call(&this, args, ctx))
}

/// `toSorted`, `toReversed`, `with`: each allocates a copy of `this.length` elements.
fn guarded_copying(this: &JsValue, args: &[JsValue], original: &JsObject, ctx: &mut Context) -> JsResult<JsValue> {
    check_this_length(this, "an array copy", ctx)?;
    original.call(this, args, ctx)
}

/// Refuses an array-like `this` longer than `max_builtin_len`.
fn check_this_length(this: &JsValue, what: &str, ctx: &mut Context) -> JsResult<()> {
    if let Some(obj) = this.as_object() {
        let len = obj.get(js_string!("length"), ctx)?.to_length(ctx)?;
        let max = limits(ctx).max_len;
        if len > max {
            return Err(range_error(format!("{what} of {len} elements exceeds the limit of {max}")));
        }
    }
    Ok(())
}

fn guarded_flat(this: &JsValue, args: &[JsValue], original: &JsObject, ctx: &mut Context) -> JsResult<JsValue> {
    let max = limits(ctx).max_nesting as f64;
    let depth = match args.first() {
        None => 1.0,
        Some(v) if v.is_undefined() => 1.0,
        Some(v) => match v.to_integer_or_infinity(ctx)? {
            IntegerOrInfinity::Integer(n) => (n as f64).clamp(0.0, max),
            IntegerOrInfinity::PositiveInfinity => max,
            IntegerOrInfinity::NegativeInfinity => 0.0,
        },
    };
    original.call(this, &[JsValue::from(depth)], ctx)
}

fn guarded_sort(this: &JsValue, args: &[JsValue], original: &JsObject, ctx: &mut Context) -> JsResult<JsValue> {
    check_this_length(this, "sort", ctx)?;
    original.call(this, args, ctx)
}

fn guarded_fill(this: &JsValue, args: &[JsValue], original: &JsObject, ctx: &mut Context) -> JsResult<JsValue> {
    check_this_length(this, "fill", ctx)?;
    original.call(this, args, ctx)
}

// ---- repeat / padStart / padEnd ----

/// `String.prototype.repeat`, reimplemented: the count is converted once,
/// the result bounded, and built in one buffer (boa's own first builds a
/// list of `count` slices, 16 bytes each, before the result).
fn guarded_repeat(this: &JsValue, args: &[JsValue], _original: &JsObject, ctx: &mut Context) -> JsResult<JsValue> {
    if this.is_null_or_undefined() {
        return Err(JsNativeError::typ().with_message("String.prototype.repeat called on null or undefined").into());
    }
    let text = this.to_string(ctx)?;
    let count = match arg(args, 0).to_integer_or_infinity(ctx)? {
        IntegerOrInfinity::Integer(n) if n >= 0 => n as u64,
        _ => {
            return Err(JsNativeError::range()
                .with_message("repeat count must be a finite non-negative number")
                .into());
        }
    };
    if text.is_empty() || count == 0 {
        return Ok(js_string!().into());
    }
    check_len((text.len() as u64).saturating_mul(count), "repeat", ctx)?;
    let target = text.len() * count as usize;
    let mut out: Vec<u16> = Vec::with_capacity(target);
    out.extend(text.iter());
    while out.len() < target {
        // Doubling: log2(count) copies, not `count`.
        let more = out.len().min(target - out.len());
        out.extend_from_within(..more);
    }
    Ok(JsString::from(out.as_slice()).into())
}

fn guarded_pad(this: &JsValue, args: &[JsValue], original: &JsObject, ctx: &mut Context) -> JsResult<JsValue> {
    let text = this.to_string(ctx)?;
    let target = arg(args, 0).to_length(ctx)?;
    check_len(target, "padStart/padEnd", ctx)?;
    let filler = arg(args, 1);
    let filler = if filler.is_undefined() { filler } else { filler.to_string(ctx)?.into() };
    original.call(&text.into(), &[JsValue::from(target as f64), filler], ctx)
}

fn check_len(len: u64, what: &str, ctx: &Context) -> JsResult<()> {
    let max = limits(ctx).max_len;
    if len > max {
        return Err(range_error(format!("{what} would create {len} units, over the limit of {max}")));
    }
    Ok(())
}

// ---- apply / Reflect.apply / Reflect.construct ----

/// CreateListFromArrayLike, bounded: the length is read once.
fn argument_list(list: &JsValue, ctx: &mut Context) -> JsResult<Vec<JsValue>> {
    if list.is_null_or_undefined() {
        return Ok(Vec::new());
    }
    let Some(obj) = list.as_object() else {
        return Err(JsNativeError::typ().with_message("CreateListFromArrayLike called on a non-object").into());
    };
    let len = obj.get(js_string!("length"), ctx)?.to_length(ctx)?;
    let max = limits(ctx).max_walk;
    if len > max {
        return Err(range_error(format!("an argument list of {len} is over the limit of {max}")));
    }
    (0..len).map(|i| obj.get(i, ctx)).collect()
}

fn callable(value: &JsValue, what: &str) -> JsResult<JsObject> {
    value.as_callable().ok_or_else(|| JsNativeError::typ().with_message(format!("{what} is not a function")).into())
}

fn guarded_function_apply(this: &JsValue, args: &[JsValue], _o: &JsObject, ctx: &mut Context) -> JsResult<JsValue> {
    let function = callable(this, "Function.prototype.apply's receiver")?;
    let list = argument_list(&arg(args, 1), ctx)?;
    function.call(&arg(args, 0), &list, ctx)
}

fn guarded_reflect_apply(_this: &JsValue, args: &[JsValue], _o: &JsObject, ctx: &mut Context) -> JsResult<JsValue> {
    let function = callable(&arg(args, 0), "Reflect.apply's target")?;
    let list = argument_list(&arg(args, 2), ctx)?;
    function.call(&arg(args, 1), &list, ctx)
}

fn guarded_reflect_construct(_this: &JsValue, args: &[JsValue], _o: &JsObject, ctx: &mut Context) -> JsResult<JsValue> {
    let not_constructor = || JsNativeError::typ().with_message("Reflect.construct's target is not a constructor");
    let target = arg(args, 0).as_constructor().ok_or_else(not_constructor)?;
    let new_target = match args.get(2) {
        None => target.clone(),
        Some(v) => v.as_constructor().ok_or_else(not_constructor)?,
    };
    let list = argument_list(&arg(args, 1), ctx)?;
    Ok(target.construct(&list, Some(&new_target), ctx)?.into())
}

// ---- console ----

fn console_out(_this: &JsValue, args: &[JsValue], ctx: &mut Context) -> JsResult<JsValue> {
    write_console(args, ctx, false)
}

fn console_err(_this: &JsValue, args: &[JsValue], ctx: &mut Context) -> JsResult<JsValue> {
    write_console(args, ctx, true)
}

/// One line per call, values space-separated: strings as they are, errors
/// as `Name: message`, everything else as its JSON (through the guarded
/// stringify), or a plain description when it has none. The same rules as
/// the QuickJS bootstrap's `console`.
fn write_console(args: &[JsValue], ctx: &mut Context, to_stderr: bool) -> JsResult<JsValue> {
    let mut line = String::new();
    for (i, arg) in args.iter().enumerate() {
        if i > 0 {
            line.push(' ');
        }
        line.push_str(&format_value(arg, ctx));
    }
    if let Some(ConsoleSink(console)) = ctx.get_data::<ConsoleSink>() {
        let console = console.clone();
        console.line(to_stderr, &line);
    }
    Ok(JsValue::undefined())
}

fn format_value(value: &JsValue, ctx: &mut Context) -> String {
    if let Some(s) = value.as_string() {
        return s.to_std_string_escaped();
    }
    let Some(obj) = value.as_object() else {
        // Primitives (numbers, booleans, null, undefined, symbols, BigInts) display without running code.
        return value.display().to_string();
    };
    if obj.is::<boa_engine::builtins::error::Error>() {
        let name = plain_property(&obj, "name").unwrap_or_else(|| "Error".into());
        return match plain_property(&obj, "message") {
            Some(message) if !message.is_empty() => format!("{name}: {message}"),
            _ => name,
        };
    }
    if obj.is_callable() {
        return "[Function]".into();
    }
    match output_json(value.clone(), None, ctx) {
        Ok(OutputJson::Text(text)) => text,
        Ok(_) => "undefined".into(),
        Err(e) => {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or_default();
            format!("[unprintable: {}]", crate::limits::text::cap_message(first.to_string()))
        }
    }
}

/// `key` of `object` or its prototypes as a data property holding a
/// primitive, described: strings as they are (capped), other primitives as
/// they display. Never runs a getter or a proxy trap (proxies have no own
/// storage, so they read as absent); objects read as absent.
pub(super) fn plain_property(object: &JsObject, key: &str) -> Option<String> {
    let key = boa_engine::property::PropertyKey::from(js_string!(key));
    let mut current = Some(object.clone());
    for _ in 0..32 {
        let obj = current?;
        let (found, proto) = {
            let borrowed = obj.borrow();
            (borrowed.properties().get(&key).and_then(|d| d.value().cloned()), borrowed.prototype())
        };
        if let Some(value) = found {
            return match value.as_string() {
                Some(s) => Some(crate::limits::text::cap_message(s.to_std_string_escaped())),
                None if value.is_object() => None,
                None => Some(value.display().to_string()),
            };
        }
        current = proto;
    }
    None
}
