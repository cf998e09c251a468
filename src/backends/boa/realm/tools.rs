//! `tools` and `ToolError`: what code sees of the host's tools (Code Mode),
//! installed only for a run whose policy grants tools.
//!
//! ```text
//! await tools.ns.name({...})        // a granted tool: its value, or throws a ToolError
//! await tools.call("ns.name", {...}) // any name (not an identifier, not granted: the bridge answers)
//! await tools.list()                 // the granted tools' names
//! await tools.describe("ns.name")    // a granted tool's spec
//! e instanceof ToolError             // an Error with .tool, .kind ("failed", "not_granted", ...), .message
//! new ToolError(tool, kind, message) // code may make its own
//! ```
//!
//! Every call returns a Promise at once: the call is handed to the run's
//! [`ToolPort`] and its resolving functions wait, by id, in the run's
//! [`ToolsRun`]; the engine settles them as answers arrive. Nothing the
//! code passes is trusted: the arguments are converted to JSON once,
//! through the same bounded snapshot as `JSON.stringify` (each getter,
//! `toJSON` and trap runs once; depth, size and deadline bounds), and
//! what crosses is that JSON. A namespace called `call`, `list` or
//! `describe` is reachable through `tools.call` only.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

use boa_engine::builtins::promise::ResolvingFunctions;
use boa_engine::object::FunctionObjectBuilder;
use boa_engine::object::builtins::JsPromise;
use boa_engine::property::{Attribute, PropertyDescriptor};
use boa_engine::{Context, JsError, JsNativeError, JsObject, JsResult, JsString, JsValue, NativeFunction, js_string};
use serde_json::Value;

use crate::backends::boa::port::{Gone, JobTools, ToolPort, fit_result};
use crate::backends::boa::realm::data::arg;
use crate::backends::boa::realm::snapshot::{OutputJson, output_json};
use crate::tools::frame::{ToolCall, ToolResult, json_len};
use crate::tools::{ToolError, ToolErrorKind};

/// Longest tool name a call may carry (registered names are at most 193
/// bytes): a longer one is `not_found` without crossing.
const MAX_NAME_BYTES: usize = 256;

/// Most calls of one run waiting for answers at once: more are
/// `too_many_in_flight` without crossing. A backstop on what the host
/// holds for the run (the bridge's own `max_concurrent`, far lower by
/// default, decides which calls run).
pub(crate) const MAX_PENDING: usize = 256;

/// Context data while a run may call tools: removed when the run ends (a
/// session's later cell holding on to `tools` gets `not_granted`).
pub(crate) struct ToolsData(Rc<ToolsRun>);

/// One run's calls: where they go, and the Promises waiting for answers.
pub(crate) struct ToolsRun {
    port: Rc<dyn ToolPort>,
    max_argument_bytes: u64,
    /// Calls in flight by id: their Promise's resolving functions.
    pending: RefCell<HashMap<u64, (String, ResolvingFunctions)>>,
    class: ToolErrorClass,
}

/// Context data: this context's `ToolError` class, made at its first run
/// with tools (a session keeps it across cells).
#[derive(Clone)]
struct ToolErrorClass {
    constructor: JsObject,
    prototype: JsObject,
}

/// Call ids, unique in this process: an answer to a call of an earlier run
/// (a session's earlier cell, a worker's earlier job) never matches.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Gives the run `tools` and `ToolError` (globals, writable and
/// configurable like `input`), its calls going to `port`.
pub(crate) fn install(ctx: &mut Context, tools: &JobTools, port: Rc<dyn ToolPort>) -> JsResult<()> {
    let class = error_class(ctx)?;
    let api = api(ctx, &tools.names)?;
    ctx.register_global_property(js_string!("tools"), api, Attribute::WRITABLE | Attribute::CONFIGURABLE)?;
    ctx.register_global_property(
        js_string!("ToolError"),
        class.constructor.clone(),
        Attribute::WRITABLE | Attribute::CONFIGURABLE,
    )?;
    let run = ToolsRun { port, max_argument_bytes: tools.max_argument_bytes, pending: RefCell::default(), class };
    ctx.insert_data(ToolsData(Rc::new(run)));
    Ok(())
}

/// For a run without tools on a context that had them (a session): the
/// globals go. A no-op on a context that never had them. Globals an earlier
/// cell made undeletable stay, and their calls are `not_granted`.
pub(crate) fn remove(ctx: &mut Context) {
    if ctx.get_data::<ToolErrorClass>().is_none() {
        return;
    }
    let global = ctx.global_object();
    for name in [js_string!("tools"), js_string!("ToolError")] {
        let _ = global.delete_property_or_throw(name, ctx);
    }
}

/// The run is over: calls still pending are abandoned (their Promises
/// never settle), later calls are `not_granted`.
pub(crate) fn end_run(ctx: &mut Context) {
    ctx.remove_data::<ToolsData>();
}

/// The current run's calls, if it has tools.
pub(crate) fn active(ctx: &Context) -> Option<Rc<ToolsRun>> {
    ctx.get_data::<ToolsData>().map(|data| data.0.clone())
}

impl ToolsRun {
    /// True while some call waits for its answer.
    pub fn waiting(&self) -> bool {
        !self.pending.borrow().is_empty()
    }

    /// Where answers come from.
    pub fn port(&self) -> &Rc<dyn ToolPort> {
        &self.port
    }

    /// Settles the Promises of `answers`; an answer for an id that no call
    /// waits for (already answered, of another run, made up) is ignored.
    pub fn settle(&self, answers: Vec<ToolResult>, ctx: &mut Context) -> JsResult<()> {
        for answer in answers {
            let Some((tool, resolvers)) = self.pending.borrow_mut().remove(&answer.id) else { continue };
            let answer = fit_result(answer, &tool);
            match (answer.ok, answer.value, answer.error) {
                (true, value, _) => {
                    let value = match value {
                        Some(value) => JsValue::from_json(&value, ctx)?,
                        None => JsValue::null(),
                    };
                    resolvers.resolve.call(&JsValue::undefined(), &[value], ctx)?;
                }
                (false, _, error) => {
                    let error = error.unwrap_or_else(|| {
                        ToolError::new(&tool, ToolErrorKind::Protocol, "the host answered with neither value nor error")
                    });
                    let error = error_object(&self.class, &error, ctx)?;
                    resolvers.reject.call(&JsValue::undefined(), &[error], ctx)?;
                }
            }
        }
        Ok(())
    }

    /// The host went away: every pending call fails as `unavailable`.
    pub fn abandon(&self, why: &Gone, ctx: &mut Context) -> JsResult<()> {
        let pending: Vec<(String, ResolvingFunctions)> = self.pending.borrow_mut().drain().map(|(_, p)| p).collect();
        for (tool, resolvers) in pending {
            let error = ToolError::new(&tool, ToolErrorKind::Unavailable, format!("no answer: {}", why.0));
            let error = error_object(&self.class, &error, ctx)?;
            resolvers.reject.call(&JsValue::undefined(), &[error], ctx)?;
        }
        Ok(())
    }
}

/// The `tools` object of `names`.
fn api(ctx: &mut Context, names: &[String]) -> JsResult<JsObject> {
    let tools = JsObject::with_object_proto(ctx.intrinsics());
    let builtins: [(&str, usize, NativeFunction); 3] = [
        ("call", 2, NativeFunction::from_fn_ptr(tools_call)),
        ("list", 0, NativeFunction::from_fn_ptr(tools_list)),
        ("describe", 1, NativeFunction::from_fn_ptr(tools_describe)),
    ];
    for (name, length, native) in builtins {
        let function: JsObject =
            FunctionObjectBuilder::new(ctx.realm(), native).name(js_string!(name)).length(length).build().into();
        tools.create_data_property_or_throw(js_string!(name), function, ctx)?;
    }
    let mut spaces: BTreeMap<&str, JsObject> = BTreeMap::new();
    for full in names {
        let Some((space, short)) = full.split_once('.') else { continue };
        if matches!(space, "call" | "list" | "describe") {
            continue;
        }
        let object = spaces.entry(space).or_insert_with(|| JsObject::with_object_proto(ctx.intrinsics())).clone();
        let native = NativeFunction::from_copy_closure_with_captures(
            |_this, args, name: &JsString, ctx| start_call(name.to_std_string_escaped(), arg(args, 0), ctx),
            JsString::from(full.as_str()),
        );
        let function: JsObject =
            FunctionObjectBuilder::new(ctx.realm(), native).name(JsString::from(short)).length(1).build().into();
        object.create_data_property_or_throw(JsString::from(short), function, ctx)?;
    }
    for (space, object) in spaces {
        tools.create_data_property_or_throw(JsString::from(space), object, ctx)?;
    }
    Ok(tools)
}

/// `tools.call(name, args)`.
fn tools_call(_this: &JsValue, args: &[JsValue], ctx: &mut Context) -> JsResult<JsValue> {
    match arg(args, 0).as_string() {
        Some(name) => start_call(name.to_std_string_escaped(), arg(args, 1), ctx),
        None => refused(ToolError::new("tools.call", ToolErrorKind::NotFound, "a tool name is a string"), ctx),
    }
}

/// `tools.list()`.
fn tools_list(_this: &JsValue, _args: &[JsValue], ctx: &mut Context) -> JsResult<JsValue> {
    send_call("tools.list".into(), Value::Object(Default::default()), ctx)
}

/// `tools.describe(name)`.
fn tools_describe(_this: &JsValue, args: &[JsValue], ctx: &mut Context) -> JsResult<JsValue> {
    match arg(args, 0).as_string() {
        Some(name) if name.len() <= MAX_NAME_BYTES => {
            send_call("tools.describe".into(), serde_json::json!({"name": name.to_std_string_escaped()}), ctx)
        }
        _ => refused(
            ToolError::new("tools.describe", ToolErrorKind::NotFound, "tools.describe takes a tool's name (a string)"),
            ctx,
        ),
    }
}

/// A call of `name` with `args` (a JavaScript value, converted once).
fn start_call(name: String, args: JsValue, ctx: &mut Context) -> JsResult<JsValue> {
    let Some(run) = active(ctx) else { return refused(not_granted(&name), ctx) };
    if name.len() > MAX_NAME_BYTES {
        let error = ToolError::new(cut(&name), ToolErrorKind::NotFound, "no tool has a name this long");
        return refused(error, ctx);
    }
    let args = match arguments(args, run.max_argument_bytes, ctx) {
        Ok(Ok(args)) => args,
        Ok(Err(why)) => return refused(ToolError::new(&name, ToolErrorKind::InvalidArguments, why), ctx),
        // The instruction budget and runtime limits end the run, not the call.
        Err(err) if err.as_engine().is_some() => return Err(err),
        Err(err) => {
            let why = format!("the arguments could not be converted to JSON: {}", first_line(&err));
            return refused(ToolError::new(&name, ToolErrorKind::InvalidArguments, why), ctx);
        }
    };
    send_call(name, args, ctx)
}

/// Hands the call to the port; the Promise waits for its answer.
fn send_call(name: String, args: Value, ctx: &mut Context) -> JsResult<JsValue> {
    let Some(run) = active(ctx) else { return refused(not_granted(&name), ctx) };
    if run.pending.borrow().len() >= MAX_PENDING {
        let why = format!("{MAX_PENDING} calls of this run already wait for answers");
        return refused(ToolError::new(&name, ToolErrorKind::TooManyInFlight, why), ctx);
    }
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let (promise, resolvers) = JsPromise::new_pending(ctx);
    run.pending.borrow_mut().insert(id, (name.clone(), resolvers));
    if let Err(why) = run.port.send(ToolCall { id, name: name.clone(), args }) {
        // Taken out before the rejection runs anything.
        let waiting = run.pending.borrow_mut().remove(&id);
        if let Some((_, resolvers)) = waiting {
            let error =
                ToolError::new(&name, ToolErrorKind::Unavailable, format!("the call could not be sent: {}", why.0));
            let error = error_object(&run.class, &error, ctx)?;
            resolvers.reject.call(&JsValue::undefined(), &[error], ctx)?;
        }
    }
    Ok(promise.into())
}

/// The arguments as JSON: `undefined` and `null` are `{}`; anything else
/// is what `JSON.stringify` makes of its bounded snapshot, at most
/// `max_bytes` of JSON text. `Ok(Err(why))` when it cannot cross.
fn arguments(args: JsValue, max_bytes: u64, ctx: &mut Context) -> JsResult<Result<Value, String>> {
    if args.is_undefined() || args.is_null() {
        return Ok(Ok(Value::Object(Default::default())));
    }
    let over = || {
        format!("the arguments are over {max_bytes} bytes of JSON (tool_limits.max_argument_bytes); nothing was sent")
    };
    let text = match output_json(args, Some(max_bytes), ctx)? {
        OutputJson::Text(text) => text,
        OutputJson::None => return Ok(Err("the arguments have no JSON form (a function, a symbol)".into())),
        OutputJson::TooLarge => return Ok(Err(over())),
    };
    let value: Value = match serde_json::from_str(&text) {
        Ok(value) => value,
        Err(e) => return Ok(Err(format!("the arguments are not usable JSON: {e}"))),
    };
    if json_len(&value) > max_bytes {
        return Ok(Err(over()));
    }
    Ok(Ok(value))
}

/// A Promise already rejected with `error`.
fn refused(error: ToolError, ctx: &mut Context) -> JsResult<JsValue> {
    let class = error_class(ctx)?;
    let error = error_object(&class, &error, ctx)?;
    let (promise, resolvers) = JsPromise::new_pending(ctx);
    resolvers.reject.call(&JsValue::undefined(), &[error], ctx)?;
    Ok(promise.into())
}

fn not_granted(name: &str) -> ToolError {
    ToolError::new(cut(name), ToolErrorKind::NotGranted, "this run's policy grants no tools")
}

/// At most [`MAX_NAME_BYTES`] of `name`, at a character boundary.
fn cut(name: &str) -> &str {
    let mut end = name.len().min(MAX_NAME_BYTES);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

fn first_line(err: &JsError) -> String {
    let text = err.to_string();
    crate::text::cap_message(text.lines().next().unwrap_or_default().to_string())
}

/// A `ToolError` instance: an `Error` (message, stack) whose prototype is
/// `ToolError.prototype`, with `tool` and `kind`.
fn error_object(class: &ToolErrorClass, error: &ToolError, ctx: &mut Context) -> JsResult<JsValue> {
    make_error(class, &error.tool, error.kind.as_str(), &error.message, ctx)
}

fn make_error(class: &ToolErrorClass, tool: &str, kind: &str, message: &str, ctx: &mut Context) -> JsResult<JsValue> {
    let object = JsNativeError::error().with_message(message.to_string()).into_opaque(ctx);
    object.set_prototype(Some(class.prototype.clone()));
    object.create_data_property_or_throw(js_string!("tool"), JsString::from(tool), ctx)?;
    object.create_data_property_or_throw(js_string!("kind"), JsString::from(kind), ctx)?;
    Ok(object.into())
}

/// This context's `ToolError` class, made on first use: a constructor
/// whose prototype inherits from `Error.prototype` (so `instanceof Error`
/// holds too), named `ToolError`.
fn error_class(ctx: &mut Context) -> JsResult<ToolErrorClass> {
    if let Some(class) = ctx.get_data::<ToolErrorClass>() {
        return Ok(class.clone());
    }
    let error_prototype = ctx.intrinsics().constructors().error().prototype();
    let prototype = JsObject::with_null_proto();
    prototype.set_prototype(Some(error_prototype));
    let constructor: JsObject =
        FunctionObjectBuilder::new(ctx.realm(), NativeFunction::from_fn_ptr(construct_tool_error))
            .name(js_string!("ToolError"))
            .length(3)
            .constructor(true)
            .build()
            .into();
    let hidden = |value: JsValue, writable: bool| {
        PropertyDescriptor::builder().value(value).writable(writable).enumerable(false).configurable(writable)
    };
    constructor.define_property_or_throw(js_string!("prototype"), hidden(prototype.clone().into(), false), ctx)?;
    prototype.define_property_or_throw(js_string!("constructor"), hidden(constructor.clone().into(), true), ctx)?;
    prototype.define_property_or_throw(js_string!("name"), hidden(js_string!("ToolError").into(), true), ctx)?;
    let class = ToolErrorClass { constructor, prototype };
    ctx.insert_data(class.clone());
    Ok(class)
}

/// `new ToolError(tool, kind, message)` (or without `new`).
fn construct_tool_error(_new_target: &JsValue, args: &[JsValue], ctx: &mut Context) -> JsResult<JsValue> {
    let class = error_class(ctx)?;
    let text = |i: usize, ctx: &mut Context| -> JsResult<String> {
        let value = arg(args, i);
        if value.is_undefined() { Ok(String::new()) } else { Ok(value.to_string(ctx)?.to_std_string_escaped()) }
    };
    let tool = text(0, ctx)?;
    let kind = text(1, ctx)?;
    let message = text(2, ctx)?;
    make_error(&class, &tool, &kind, &message, ctx)
}

#[cfg(test)]
mod tests {
    use std::cell::{Cell, RefCell};
    use std::rc::Rc;
    use std::time::{Duration, Instant};

    use serde_json::{Value, json};

    use crate::backends::boa::config::EngineSettings;
    use crate::backends::boa::engine::{Job, Mode, Prepared, RunReport};
    use crate::backends::boa::port::{Gone, JobTools, ToolPort};
    use crate::backends::boa::realm::console::Console;
    use crate::limits::deadline::Deadline;
    use crate::result::Outcome;
    use crate::tools::ToolError;
    use crate::tools::frame::{ToolCall, ToolResult};

    /// Answers calls like a host would, after answers nobody asked for: a
    /// result for an id no call has, and a second answer to a call already
    /// answered.
    #[derive(Default)]
    struct FakeHost {
        calls: RefCell<Vec<ToolCall>>,
        answered: Cell<usize>,
        /// Calls made before the first wait.
        before_first_wait: Cell<Option<usize>>,
        last_answered: RefCell<Option<ToolResult>>,
    }

    impl ToolPort for FakeHost {
        fn send(&self, call: ToolCall) -> Result<(), Gone> {
            self.calls.borrow_mut().push(call);
            Ok(())
        }

        fn wait(&self, _until: Option<Instant>) -> Result<Vec<ToolResult>, Gone> {
            // The Promises waiting are held from Rust only: they survive a collection.
            boa_gc::force_collect();
            if self.before_first_wait.get().is_none() {
                self.before_first_wait.set(Some(self.calls.borrow().len()));
            }
            let calls = self.calls.borrow();
            let Some(call) = calls.get(self.answered.get()) else { return Err(Gone("no call to answer".into())) };
            self.answered.set(self.answered.get() + 1);
            let answer = match call.name.as_str() {
                "math.add" => ToolResult::value(call.id, json!(call.args["a"].as_i64().unwrap() + 1), false),
                "deep.value" => {
                    let mut deep = json!(1);
                    for _ in 0..200 {
                        deep = json!([deep]);
                    }
                    ToolResult::value(call.id, deep, false)
                }
                name => ToolResult::error(call.id, ToolError::failed(name, "it broke")),
            };
            let forged = ToolResult::value(u64::MAX, json!("forged"), false);
            let mut answers = vec![forged];
            // The previous call's answer again, with another value: a replay.
            if let Some(mut replay) = self.last_answered.borrow_mut().take() {
                replay.value = Some(json!("replayed"));
                answers.push(replay);
            }
            answers.push(answer.clone());
            *self.last_answered.borrow_mut() = Some(answer);
            Ok(answers)
        }
    }

    struct Quiet;

    impl Console for Quiet {
        fn line(&self, _to_stderr: bool, _text: &str) {}
    }

    fn job(source: &str, mode: Mode, tools: Option<&[&str]>) -> Job {
        Job {
            source: source.into(),
            mode,
            input: None,
            budget: u64::MAX,
            fuel_asked: false,
            timeout: Some(Duration::from_secs(10)),
            max_stdout: None,
            max_stderr: None,
            tools: tools.map(|names| JobTools {
                names: names.iter().map(|n| n.to_string()).collect(),
                max_argument_bytes: 1024,
            }),
        }
    }

    fn run(prepared: &mut Prepared, job: Job, port: Option<Rc<FakeHost>>) -> RunReport {
        let deadline = Deadline::start(Some(Duration::from_secs(10)));
        prepared.run(job, &deadline, Rc::new(Quiet), port.map(|p| p as Rc<dyn ToolPort>))
    }

    fn output(report: &RunReport) -> Value {
        assert_eq!(report.outcome, Outcome::Ok, "{:?}", report.message);
        serde_json::from_str(report.output.as_deref().unwrap_or("null")).unwrap()
    }

    #[test]
    fn calls_settle_by_id_and_answers_nobody_waits_for_are_ignored() {
        let mut prepared = Prepared::new(u64::MAX, &EngineSettings::default()).unwrap();
        let host = Rc::new(FakeHost::default());
        let code = "
            const [x, y, z] = await Promise.all([1, 2, 3].map(a => tools.math.add({a})));
            let caught;
            try { await tools.call('other.thing', {}); } catch (e) {
                caught = [e instanceof ToolError, e instanceof Error, e.name, e.kind, e.tool, e.message];
            }
            let local;
            try { await tools.math.add({big: 'x'.repeat(2000)}); } catch (e) { local = e.kind; }
            let deep;
            try { await tools.call('deep.value'); } catch (e) { deep = e.kind; }
            const mine = new ToolError('a.b', 'failed', 'mine');
            return {sum: x + y + z, caught, local, deep, mine: [mine instanceof ToolError, mine.kind, mine.message],
                    namespaces: Object.keys(tools).sort()};";
        let report =
            run(&mut prepared, job(code, Mode::FunctionBody, Some(&["math.add", "call.x"])), Some(host.clone()));
        assert_eq!(
            output(&report),
            json!({
                "sum": 9,
                "caught": [true, true, "ToolError", "failed", "other.thing", "it broke"],
                "local": "invalid_arguments",
                "deep": "failed",
                "mine": [true, "failed", "mine"],
                // A namespace named like a built-in is reachable through tools.call only.
                "namespaces": ["call", "describe", "list", "math"],
            })
        );
        // The three calls of Promise.all were all sent before the first wait.
        assert_eq!(host.before_first_wait.get(), Some(3));
        // The oversized arguments never crossed.
        assert_eq!(host.calls.borrow().len(), 5);
    }

    #[test]
    fn a_run_without_tools_has_no_tools_and_a_later_cell_loses_them() {
        let mut prepared = Prepared::new(u64::MAX, &EngineSettings::default()).unwrap();
        let none = run(&mut prepared, job("return [typeof tools, typeof ToolError]", Mode::FunctionBody, None), None);
        assert_eq!(output(&none), json!(["undefined", "undefined"]));

        // A session: the first cell has tools and keeps a reference to them.
        let mut session = Prepared::new(u64::MAX, &EngineSettings::default()).unwrap();
        let host = Rc::new(FakeHost::default());
        let first = run(
            &mut session,
            job("globalThis.kept = tools; typeof tools", Mode::Script, Some(&["math.add"])),
            Some(host),
        );
        assert_eq!(output(&first), json!("object"));
        let code = "let kind; try { await kept.math.add({a: 1}); } catch (e) { kind = e.kind; } return [typeof tools, typeof ToolError, kind]";
        let second = run(&mut session, job(code, Mode::Script, None), None);
        assert_eq!(output(&second), json!(["undefined", "undefined", "not_granted"]));
    }

    #[test]
    fn calls_waiting_at_once_are_bounded() {
        let mut prepared = Prepared::new(u64::MAX, &EngineSettings::default()).unwrap();
        let host = Rc::new(FakeHost::default());
        let code = "const all = []; for (let i = 0; i < 300; i++) all.push(tools.math.add({a: i}));
                    const got = await Promise.allSettled(all);
                    return [got.filter(g => g.status === 'fulfilled').length, got[299].reason.kind]";
        let report = run(&mut prepared, job(code, Mode::FunctionBody, Some(&["math.add"])), Some(host.clone()));
        assert_eq!(output(&report), json!([super::MAX_PENDING, "too_many_in_flight"]));
        assert_eq!(host.calls.borrow().len(), super::MAX_PENDING);
    }

    #[test]
    fn a_job_without_tools_is_the_frame_it_always_was() {
        let frame = serde_json::to_value(job("return 1", Mode::FunctionBody, None)).unwrap();
        let mut keys: Vec<&String> = frame.as_object().unwrap().keys().collect();
        keys.sort();
        let before = ["budget", "fuel_asked", "input", "max_stderr", "max_stdout", "mode", "source", "timeout"];
        assert_eq!(keys, before);
        let with = serde_json::to_value(job("return 1", Mode::FunctionBody, Some(&["a.b"]))).unwrap();
        assert_eq!(with["tools"], json!({"names": ["a.b"], "max_argument_bytes": 1024}));
    }

    #[test]
    fn a_rejected_call_nobody_handles_fails_the_run_and_the_error_is_typed() {
        let mut prepared = Prepared::new(u64::MAX, &EngineSettings::default()).unwrap();
        let host = Rc::new(FakeHost::default());
        let report = run(&mut prepared, job("tools.call('x.y'); return 1", Mode::FunctionBody, Some(&[])), Some(host));
        assert_eq!(report.outcome, Outcome::Failed);
        assert_eq!(report.message.as_deref(), Some("(in promise) ToolError: it broke"));
    }
}
