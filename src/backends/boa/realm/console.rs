//! `console`: `log`, `info` and `debug` to stdout, `warn` and `error` to
//! stderr, one line per call, written to where the run's [`Console`] says.

use parking_lot::Mutex;
use std::rc::Rc;
use std::sync::Arc;

use boa_engine::object::ObjectInitializer;
use boa_engine::property::Attribute;
use boa_engine::{Context, JsResult, JsValue, NativeFunction, js_string};

use crate::backends::boa::realm::data::plain_property;
use crate::backends::boa::realm::snapshot::{OutputJson, output_json};
use crate::limits::output::BoundedBuffer;

/// Where `console.*` lines go during a run: a bounded buffer shared with a
/// waiting host thread (in-thread), or frames to the host (worker process).
pub(crate) trait Console {
    /// Appends `text` and a newline to stdout, or to stderr.
    fn line(&self, to_stderr: bool, text: &str);
}

/// Captured stdout/stderr of one run, shared with the waiting caller so a run
/// abandoned at its deadline still reports what it printed.
#[derive(Debug)]
pub(crate) struct Streams {
    pub stdout: BoundedBuffer,
    pub stderr: BoundedBuffer,
}

/// [`Streams`] shared between the run's thread and its caller.
pub(crate) struct SharedStreams(pub Arc<Mutex<Streams>>);

impl Console for SharedStreams {
    fn line(&self, to_stderr: bool, text: &str) {
        let mut streams = self.0.lock();
        let stream = if to_stderr { &mut streams.stderr } else { &mut streams.stdout };
        stream.write_str(text);
        stream.write_str("\n");
    }
}

/// Context data: where `console` writes during the current run.
pub(crate) struct ConsoleSink(pub Rc<dyn Console>);

/// Installs the global `console`.
pub(crate) fn install(ctx: &mut Context) -> JsResult<()> {
    let console = ObjectInitializer::new(ctx)
        .function(NativeFunction::from_fn_ptr(console_out), js_string!("log"), 0)
        .function(NativeFunction::from_fn_ptr(console_out), js_string!("info"), 0)
        .function(NativeFunction::from_fn_ptr(console_out), js_string!("debug"), 0)
        .function(NativeFunction::from_fn_ptr(console_err), js_string!("warn"), 0)
        .function(NativeFunction::from_fn_ptr(console_err), js_string!("error"), 0)
        .build();
    ctx.register_global_property(js_string!("console"), console, Attribute::WRITABLE | Attribute::CONFIGURABLE)
}

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
            format!("[unprintable: {}]", crate::text::cap_message(first.to_string()))
        }
    }
}
