//! What the realm's pieces share: the context data they read (the bounds,
//! the run's deadline, pristine built-ins) and small helpers.

use boa_engine::{Context, JsNativeError, JsObject, JsResult, JsValue, js_string};

use crate::backends::boa::config::EngineSettings;
use crate::limits::deadline::Deadline;

/// Context data: bounds the guards enforce.
#[derive(Clone, Copy)]
pub(crate) struct GuardLimits {
    pub max_nesting: usize,
    pub max_len: u64,
    pub max_walk: u64,
}

impl From<&EngineSettings> for GuardLimits {
    fn from(cfg: &EngineSettings) -> Self {
        Self { max_nesting: cfg.max_code_nesting, max_len: cfg.max_builtin_len, max_walk: cfg.max_walk_nodes }
    }
}

/// Context data: the current run's deadline, for long native walks.
pub(crate) struct RunDeadline(pub Deadline);

/// Context data: pristine built-ins the guards use, captured before any user
/// code runs.
pub(crate) struct Pristine {
    pub object_keys: JsObject,
    pub is_array: JsObject,
    /// The original `JSON.stringify`, for snapshots (which hold plain data only).
    pub stringify: JsObject,
}

pub(crate) fn object(value: JsValue) -> JsResult<JsObject> {
    value.as_object().ok_or_else(|| JsNativeError::typ().with_message("execbox realm setup: expected an object").into())
}

pub(crate) fn limits(ctx: &Context) -> GuardLimits {
    // Always inserted by `install`; the fallback only keeps this total.
    ctx.get_data::<GuardLimits>().copied().unwrap_or_else(|| GuardLimits::from(&EngineSettings::default()))
}

pub(crate) fn range_error(message: String) -> boa_engine::JsError {
    JsNativeError::range().with_message(message).into()
}

pub(crate) fn arg(args: &[JsValue], i: usize) -> JsValue {
    args.get(i).cloned().unwrap_or_default()
}

/// Throws once the run's deadline has passed (long native loops check it).
pub(crate) fn check_deadline(ctx: &Context) -> JsResult<()> {
    if ctx.get_data::<RunDeadline>().is_some_and(|d| d.0.expired()) {
        return Err(range_error("deadline exceeded inside a built-in".into()));
    }
    Ok(())
}

/// `key` of `object` or its prototypes as a data property holding a
/// primitive, described: strings as they are (capped), other primitives as
/// they display. Never runs a getter or a proxy trap (proxies have no own
/// storage, so they read as absent); objects read as absent.
pub(crate) fn plain_property(object: &JsObject, key: &str) -> Option<String> {
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
                Some(s) => Some(crate::text::cap_message(s.to_std_string_escaped())),
                None if value.is_object() => None,
                None => Some(value.display().to_string()),
            };
        }
        current = proto;
    }
    None
}
