//! Guards on built-ins whose native code would otherwise recurse or
//! allocate without bound (see the list in [`super`]'s docs), and the
//! realm's own `Symbol.for` registry.

use std::cell::Cell;

use boa_engine::object::FunctionObjectBuilder;
use boa_engine::property::PropertyDescriptor;
use boa_engine::value::IntegerOrInfinity;
use boa_engine::{Context, JsNativeError, JsObject, JsResult, JsString, JsValue, NativeFunction, js_string};

use crate::backends::boa::lexer;
use crate::backends::boa::realm::data::{arg, check_deadline, limits, object, range_error};
use crate::backends::boa::realm::snapshot::guarded_stringify;

/// Wraps the guarded built-ins of the global object (captured before any
/// user code runs) and replaces `Symbol.for`/`Symbol.keyFor`.
pub(crate) fn install(ctx: &mut Context, global: &JsObject) -> JsResult<()> {
    ctx.insert_data(BuiltinDepth::default());
    let json = object(global.get(js_string!("JSON"), ctx)?)?;
    let reflect = object(global.get(js_string!("Reflect"), ctx)?)?;
    let constructors = ctx.intrinsics().constructors();
    let array_proto = constructors.array().prototype();
    let string_proto = constructors.string().prototype();
    let function_proto = constructors.function().prototype();

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
    install_symbol_registry(ctx, global)
}

/// Context data: how deep guarded built-ins that recurse through user-visible
/// methods (`join` via `toString`, `toLocaleString`) are nested right now,
/// and how many elements the outermost call has visited in all (shared
/// sub-arrays count each time, so `a = [a, a]` cannot blow up a join).
#[derive(Default)]
struct BuiltinDepth {
    depth: Cell<usize>,
    visited: Cell<u64>,
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

/// Refuses source text nested deeper than the limit (see
/// [`lexer::source_nesting_exceeds`]): `JSON.parse` here, `eval` and the
/// `Function` constructors through the realm's compile-strings host hook
/// (so direct `eval` stays direct).
pub(crate) fn scan(text: &str, ctx: &Context) -> JsResult<()> {
    let max = limits(ctx).max_nesting;
    match lexer::source_nesting_exceeds(text, max) {
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
