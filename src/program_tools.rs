//! Code Mode's `workspace.*` tools: code running in a workspace starts,
//! polls, writes to and kills programs there, as an MCP client does with
//! `start_program` and its kin ([`workspace_tools`]; grant them like any
//! tool, `workspace.*`).
//!
//! ```text
//! workspace.start_program {command, tty?, env?, cwd?, timeout_ms?, yield_ms?}
//! workspace.poll_program {program_id, yield_ms?, limit?}
//! workspace.write_program {program_id, data?, newline?, interrupt?, eof?, yield_ms?}
//! workspace.kill_program {program_id, grace_ms?}
//!     → {program_id, status, output, offset, next_offset, exit_code, dropped_bytes, input_dropped_bytes}
//! ```
//!
//! A program belongs to its workspace: any run in that workspace (the one
//! that started it, a later one, a session's cell) reaches it by id; a run
//! in another workspace, or in none, does not. It keeps running after the
//! run that started it, until it ends, is killed, reaches its lifetime
//! (`timeout_ms`, at most ten minutes or the registry's own cap) or its workspace goes; an ended
//! program is forgotten once an answer carried its end. It starts under
//! its run's policy (less the tool grants: programs call no tools), held to
//! the executor's ceiling, so code gets no more than it had. At most 16 per
//! workspace (its container's cap). A server's idle expiry counts them as
//! use of their workspace while they run.
//!
//! Errors code can catch (`ToolError.kind`): `invalid_arguments`,
//! `not_found` (no such program in this workspace), `unavailable` (the run
//! has no workspace, or was not admitted by an executor), `quota_exceeded`
//! (16 programs), `failed` (the program could not start or take input).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::tool::{ToolError, ToolErrorKind};
use crate::program::{self, Program, ProgramCommand, ProgramHost, ProgramSpec, ProgramStatus};
use crate::tools::registry::{ToolAnnotations, ToolContext, ToolFuture, ToolHandler, ToolRegistry, ToolSpec};
use crate::workspace::WeakWorkspace;

/// The namespace of the program tools (grant them with `workspace.*`).
pub const NAMESPACE: &str = "workspace";

/// Programs code may hold in one workspace.
const MAX_PROGRAMS_PER_WORKSPACE: usize = 16;
/// The longest lifetime code may give a program, and the default, unless
/// the registry was made with another ([`workspace_tools_with`]).
const MAX_LIFETIME: Duration = Duration::from_secs(600);

/// The four operations.
#[derive(Clone, Copy, Debug)]
enum Op {
    Start,
    Poll,
    Write,
    Kill,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Start => "workspace.start_program",
            Op::Poll => "workspace.poll_program",
            Op::Write => "workspace.write_program",
            Op::Kill => "workspace.kill_program",
        }
    }
}

/// The programs code started, by workspace id: each entry holds its
/// workspace weakly, and goes (with its handles) once the workspace is gone.
#[derive(Default)]
struct Table(HashMap<String, Held>);

/// One workspace's programs.
struct Held {
    workspace: WeakWorkspace,
    programs: BTreeMap<String, Program>,
    /// Places taken by programs still starting.
    starting: usize,
}

impl Table {
    /// Drops the entries of workspaces that are gone.
    fn prune(&mut self) {
        self.0.retain(|_, held| held.workspace.upgrade().is_some());
    }
}

/// The one table of code's programs in this process: workspace ids are
/// never reused, and a workspace's programs are its own whichever
/// executor's tools started them.
fn shared_table() -> Arc<Mutex<Table>> {
    static TABLE: std::sync::OnceLock<Arc<Mutex<Table>>> = std::sync::OnceLock::new();
    TABLE.get_or_init(Default::default).clone()
}

/// Whether a program code started in `workspace` still runs (a server's
/// idle expiry counts it as use).
#[cfg_attr(not(feature = "serve"), allow(dead_code))]
pub(crate) fn code_programs_running(workspace: &crate::workspace::Workspace) -> bool {
    let table = shared_table();
    let table = table.lock();
    table
        .0
        .get(workspace.id())
        .is_some_and(|held| held.starting > 0 || held.programs.values().any(|p| p.status() == ProgramStatus::Running))
}

/// One `workspace.*` tool; all four share the table.
struct ProgramTool {
    op: Op,
    table: Arc<Mutex<Table>>,
    max_lifetime: Duration,
}

/// The tools code starts and drives programs with: `workspace.start_program`,
/// `workspace.poll_program`, `workspace.write_program` and
/// `workspace.kill_program` (see the [module docs](self)). Merge them into
/// the registry of an executor ([`ToolRegistry::merged`]) and grant them
/// (`workspace.*`); they work in runs that have a workspace
/// ([`ExecRequest::workspace`](crate::request::ExecRequest::workspace)).
pub fn workspace_tools() -> ToolRegistry {
    workspace_tools_with(MAX_LIFETIME)
}

/// [`workspace_tools`] whose programs live `max_lifetime` at the most (and
/// by default): e.g. a server's own program lifetime.
pub fn workspace_tools_with(max_lifetime: Duration) -> ToolRegistry {
    let table = shared_table();
    let id = json!({"type": "string", "description": "the id start_program returned"});
    let yield_ms = json!({"type": "integer", "minimum": 0, "description": "how long to wait for output or the end, in ms (default 1000, at most 30000)"});
    let start = ToolSpec::new(Op::Start.name())
        .description(
            "Start a program that keeps running in this run's workspace (a server, a build, a REPL): command is \
             a line run by bash, or an argv array; cwd is relative to /work. Answers {program_id, status \
             (running|exited|killed), output, offset, next_offset, exit_code, dropped_bytes} after waiting up to \
             yield_ms for output or its end. Any later run in the workspace can poll it by id.",
        )
        .input_schema(json!({
            "type": "object",
            "properties": {
                "command": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}]},
                "tty": {"type": "boolean", "description": "give it a terminal (REPLs, prompts)"},
                "env": {"type": "object", "additionalProperties": {"type": "string"}, "description": "names the policy allows"},
                "cwd": {"type": "string"},
                "timeout_ms": {"type": "integer", "minimum": 1, "description": "its lifetime (default and at most 600000)"},
                "yield_ms": yield_ms,
            },
            "required": ["command"],
            "additionalProperties": false,
        }));
    let poll = ToolSpec::new(Op::Poll.name())
        .description("A program's new output since the last answer, after waiting up to yield_ms for output or its end.")
        .input_schema(json!({
            "type": "object",
            "properties": {
                "program_id": id,
                "yield_ms": yield_ms,
                "limit": {"type": "integer", "minimum": 1, "description": "bytes of output at the most (default 65536, at most 1048576)"},
            },
            "required": ["program_id"],
            "additionalProperties": false,
        }))
        .annotations(ToolAnnotations::default().read_only(true));
    let write = ToolSpec::new(Op::Write.name())
        .description(
            "Write text to a program's input (newline: add a newline; interrupt: then Ctrl-C; eof: then end its \
             input), then answer like poll_program.",
        )
        .input_schema(json!({
            "type": "object",
            "properties": {
                "program_id": id,
                "data": {"type": "string", "description": "at most 1 MiB"},
                "newline": {"type": "boolean"},
                "interrupt": {"type": "boolean"},
                "eof": {"type": "boolean"},
                "yield_ms": yield_ms,
            },
            "required": ["program_id"],
            "additionalProperties": false,
        }));
    let kill = ToolSpec::new(Op::Kill.name())
        .description("Kill a program: SIGTERM, then SIGKILL to all it started after grace_ms (default 2000).")
        .input_schema(json!({
            "type": "object",
            "properties": {
                "program_id": id,
                "grace_ms": {"type": "integer", "minimum": 0, "description": "at most 30000"},
            },
            "required": ["program_id"],
            "additionalProperties": false,
        }))
        .annotations(ToolAnnotations::default().destructive(true));
    let tool = |op| ProgramTool { op, table: table.clone(), max_lifetime };
    ToolRegistry::builder()
        .tool(start, tool(Op::Start))
        .tool(poll, tool(Op::Poll))
        .tool(write, tool(Op::Write))
        .tool(kill, tool(Op::Kill))
        .build()
        .expect("the program tools' names and schemas are valid and distinct")
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StartArgs {
    command: ProgramCommand,
    #[serde(default)]
    tty: bool,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    timeout_ms: Option<u64>,
    #[serde(default)]
    yield_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PollArgs {
    program_id: String,
    #[serde(default)]
    yield_ms: Option<u64>,
    #[serde(default)]
    limit: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteArgs {
    program_id: String,
    #[serde(default)]
    data: String,
    #[serde(default)]
    newline: bool,
    #[serde(default)]
    interrupt: bool,
    #[serde(default)]
    eof: bool,
    #[serde(default)]
    yield_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KillArgs {
    program_id: String,
    #[serde(default)]
    grace_ms: Option<u64>,
}

impl ToolHandler for ProgramTool {
    fn call(&self, args: Value) -> ToolFuture {
        self.call_in(args, &ToolContext::default())
    }

    fn call_in(&self, args: Value, context: &ToolContext) -> ToolFuture {
        let (op, table, max_lifetime) = (self.op, self.table.clone(), self.max_lifetime);
        let Some(host) = context.programs.clone() else {
            return Box::pin(async move {
                Err(error(op, ToolErrorKind::Unavailable, "this run has no workspace to start programs in"))
            });
        };
        Box::pin(async move {
            match op {
                Op::Start => start(&table, host, parse(op, args)?, max_lifetime).await,
                Op::Poll => {
                    let args: PollArgs = parse(op, args)?;
                    let program = find(op, &table, &host, &args.program_id)?;
                    let limit = program::answer_limit(args.limit);
                    Ok(answer(&table, &host, &args.program_id, &program, args.yield_ms, limit).await)
                }
                Op::Write => {
                    let args: WriteArgs = parse(op, args)?;
                    let program = find(op, &table, &host, &args.program_id)?;
                    program
                        .send(args.data, args.newline, args.interrupt, args.eof)
                        .map_err(|e| error(op, ToolErrorKind::Failed, crate::error::with_causes(&e)))?;
                    let limit = program::DEFAULT_ANSWER_BYTES;
                    Ok(answer(&table, &host, &args.program_id, &program, args.yield_ms, limit).await)
                }
                Op::Kill => {
                    let args: KillArgs = parse(op, args)?;
                    let program = find(op, &table, &host, &args.program_id)?;
                    let end = program.kill(program::kill_grace(args.grace_ms)).await;
                    forget(&table, &host, &args.program_id);
                    Ok(end.to_json(&args.program_id))
                }
            }
        })
    }
}

/// Starts a program in the run's workspace and keeps it there (even when
/// the call is given up on while it starts), then answers its first poll.
async fn start(
    table: &Arc<Mutex<Table>>,
    host: ProgramHost,
    args: StartArgs,
    max_lifetime: Duration,
) -> Result<Value, ToolError> {
    let op = Op::Start;
    let invalid = |why| error(op, ToolErrorKind::InvalidArguments, why);
    let command = args.command.checked().map_err(invalid)?;
    let lifetime = program::lifetime_within(args.timeout_ms, max_lifetime).map_err(invalid)?;
    let mut spec = ProgramSpec::new(command).tty(args.tty).policy(host.policy.clone()).lifetime(lifetime);
    spec.env = args.env;
    spec.cwd = args.cwd;
    spec.packages = host.packages.clone();
    let id = crate::nonce::hex128();
    let kept = {
        let (table, host, id) = (table.clone(), host.clone(), id.clone());
        crate::backend::blocking("programs", move || {
            // A place among the workspace's programs, taken before it starts.
            reserve(&table, &host)?;
            let started = host.starter.start_program_blocking(&host.workspace, &spec);
            let mut table = table.lock();
            if let Some(held) = table.0.get_mut(host.workspace.id()) {
                held.starting = held.starting.saturating_sub(1);
                if let Ok(program) = &started {
                    held.programs.insert(id, program.clone());
                }
            }
            started
        })
        .await
    };
    let program = kept.map_err(|e| match e {
        crate::error::ExecError::Busy { reason, .. } => error(op, ToolErrorKind::QuotaExceeded, reason),
        other => error(op, ToolErrorKind::Failed, crate::error::with_causes(&other)),
    })?;
    Ok(answer(table, &host, &id, &program, args.yield_ms, program::DEFAULT_ANSWER_BYTES).await)
}

/// Takes a place among the run's workspace's programs (counted as
/// starting until it started or failed), or refuses past the cap.
fn reserve(table: &Mutex<Table>, host: &ProgramHost) -> Result<(), crate::error::ExecError> {
    let mut table = table.lock();
    table.prune();
    let held = table.0.entry(host.workspace.id().to_string()).or_insert_with(|| Held {
        workspace: host.workspace.downgrade(),
        programs: BTreeMap::new(),
        starting: 0,
    });
    if held.programs.len() + held.starting >= MAX_PROGRAMS_PER_WORKSPACE {
        return Err(crate::error::ExecError::Busy {
            backend: "programs".into(),
            reason: format!("this workspace holds {MAX_PROGRAMS_PER_WORKSPACE} programs code started: kill one first"),
        });
    }
    held.starting += 1;
    Ok(())
}

/// Program `id` of the run's workspace.
fn find(op: Op, table: &Mutex<Table>, host: &ProgramHost, id: &str) -> Result<Program, ToolError> {
    let table = table.lock();
    let found = table.0.get(host.workspace.id()).and_then(|held| held.programs.get(id)).cloned();
    found.ok_or_else(|| {
        let why = format!(
            "no program {id} in this workspace (ids are the workspace's; an ended program is forgotten once its end was read)"
        );
        error(op, ToolErrorKind::NotFound, why)
    })
}

fn forget(table: &Mutex<Table>, host: &ProgramHost, id: &str) {
    if let Some(held) = table.lock().0.get_mut(host.workspace.id()) {
        held.programs.remove(id);
    }
}

/// Polls `program`; an ended program whose end this answer carries is forgotten.
async fn answer(
    table: &Mutex<Table>,
    host: &ProgramHost,
    id: &str,
    program: &Program,
    yield_ms: Option<u64>,
    limit: usize,
) -> Value {
    let out = program.poll_text(program::call_wait(yield_ms), limit).await;
    if program.end_was_read(&out) {
        forget(table, host, id);
    }
    out.to_json(id)
}

fn parse<T: serde::de::DeserializeOwned>(op: Op, args: Value) -> Result<T, ToolError> {
    serde_json::from_value(args).map_err(|e| error(op, ToolErrorKind::InvalidArguments, e.to_string()))
}

fn error(op: Op, kind: ToolErrorKind, message: impl Into<String>) -> ToolError {
    ToolError::new(op.name(), kind, message)
}
