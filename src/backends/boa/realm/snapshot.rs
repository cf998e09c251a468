//! `JSON.stringify` and the returned value's JSON: a bounded *snapshot* of
//! the value first (each `toJSON`, replacer, getter and trap called exactly
//! once, with depth, size and deadline bounds), then the pristine
//! `JSON.stringify` over the snapshot, which holds only plain data and
//! cannot change or run code.

use boa_engine::object::builtins::JsArray;
use boa_engine::property::PropertyDescriptor;
use boa_engine::{Context, JsBigInt, JsObject, JsResult, JsString, JsValue, js_string};

use crate::backends::boa::realm::data::{GuardLimits, Pristine, arg, check_deadline, limits, object, range_error};

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
pub(crate) enum OutputJson {
    /// No JSON form (`undefined`, a function, a symbol).
    None,
    Text(String),
    /// Its JSON would be over `max_bytes`.
    TooLarge,
}

/// The JSON text of a run's returned value: what the pristine
/// `JSON.stringify` makes of its bounded snapshot (whatever the code did to
/// the global `JSON`), refused early once it must exceed `max_bytes`.
pub(crate) fn output_json(value: JsValue, max_bytes: Option<u64>, ctx: &mut Context) -> JsResult<OutputJson> {
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

pub(crate) fn guarded_stringify(
    this: &JsValue,
    args: &[JsValue],
    original: &JsObject,
    ctx: &mut Context,
) -> JsResult<JsValue> {
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
