//! The MCP tools of programs: `start_program`, `poll_program`,
//! `write_program`, `kill_program`. A program runs in one of the
//! connection's workspaces and keeps running between calls; its id is the
//! connection's own, like a workspace's, and it ends with its workspace.
//!
//! Every answer is a poll: `{program_id, status, output, offset,
//! next_offset, exit_code?, dropped_bytes}`, `output` being what is new
//! since the last answer (as UTF-8 text, invalid bytes replaced). A program
//! that ended is forgotten once an answer has carried its end.

use std::time::Duration;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{ErrorData as McpError, schemars, tool, tool_router};
use serde::Deserialize;
use serde_json::json;

use super::tools::{Connection, ExecboxMcp, invalid_arguments, structured};
use crate::policy::SandboxPolicy;
use crate::program::{self, Program, ProgramCommand, ProgramError, ProgramOutput, ProgramSpec};

/// Programs one connection may hold at once (each workspace's container
/// runs 16 at the most).
pub(super) const MAX_PROGRAMS_PER_CONNECTION: usize = 32;

/// `start_program`'s arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StartProgramArgs {
    /// The workspace to run in (from `create_workspace`): the program sees it at /work.
    pub workspace_id: String,
    /// A line run by bash, or an argv array.
    pub command: ProgramCommand,
    /// Give it a terminal (for REPLs and prompts; Ctrl-C and Ctrl-D are keys).
    #[serde(default)]
    pub tty: bool,
    /// Environment values (names must be allowed by the server's policy).
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    /// Its directory, relative to /work.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Its lifetime in ms: then it is killed (default and at most the server's).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub timeout_ms: Option<u64>,
    /// How long to wait for its first output or its end before answering (default 1000, at most 30000).
    #[serde(default)]
    pub yield_ms: Option<u64>,
}

/// `poll_program`'s arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PollProgramArgs {
    /// The id `start_program` returned.
    pub program_id: String,
    /// How long to wait for new output or its end (default 1000, at most 30000).
    #[serde(default)]
    pub yield_ms: Option<u64>,
    /// Bytes of output at the most (default 65536, at most 1048576).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// `write_program`'s arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteProgramArgs {
    /// The id `start_program` returned.
    pub program_id: String,
    /// Text for its input (at most 1 MiB).
    #[serde(default)]
    pub data: String,
    /// Add a newline after `data` (default false).
    #[serde(default)]
    pub newline: bool,
    /// Then interrupt it (Ctrl-C: SIGINT to its process group).
    #[serde(default)]
    pub interrupt: bool,
    /// Then end its input (close its stdin; Ctrl-D on a terminal).
    #[serde(default)]
    pub eof: bool,
    /// How long to wait for its answer (default 1000, at most 30000).
    #[serde(default)]
    pub yield_ms: Option<u64>,
}

/// `kill_program`'s arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KillProgramArgs {
    /// The id `start_program` returned.
    pub program_id: String,
    /// How long it gets after SIGTERM before SIGKILL, in ms (default 2000, at most 30000).
    #[serde(default)]
    pub grace_ms: Option<u64>,
}

#[tool_router(router = program_router, vis = "pub(super)")]
impl ExecboxMcp {
    /// Starts a program in a workspace.
    #[tool(description = "Start a program that keeps running in a workspace's container (a REPL such as \
            `python3 -i` or `bash` with tty, a server, a build): command is a line run by bash, or an argv \
            array; cwd is relative to /work. Programs of one workspace share its files and its loopback \
            network. The answer is a poll: {program_id, status (running|exited|killed), output, offset, \
            next_offset, exit_code, dropped_bytes}. Then use poll_program, write_program and kill_program.")]
    async fn start_program(&self, Parameters(args): Parameters<StartProgramArgs>) -> Result<CallToolResult, McpError> {
        let Some(workspace) = self.workspace(&args.workspace_id) else {
            return Ok(self.no_workspace("start_program", &args.workspace_id));
        };
        // A place among the connection's programs, taken under the lock
        // that counts them (calls racing each other cannot all pass).
        let Some(starting) = Starting::take(&self.connection) else {
            let why = format!("this connection holds {MAX_PROGRAMS_PER_CONNECTION} programs: kill one first");
            return Ok(invalid_arguments("start_program", &why));
        };
        let lifetime = match program::lifetime_within(args.timeout_ms, self.shared.cfg.program_lifetime) {
            Ok(lifetime) => lifetime,
            Err(why) => return Ok(invalid_arguments("start_program", why)),
        };
        let command = match args.command.checked() {
            Ok(command) => command,
            Err(why) => return Ok(invalid_arguments("start_program", why)),
        };
        // Tools denied, not unstated: a ceiling that grants them (for
        // Code Mode) would fill them in, and programs call no tools.
        let mut policy = SandboxPolicy::unstated();
        policy.tools = crate::policy::Access::Deny;
        let mut spec = ProgramSpec::new(command).tty(args.tty).policy(policy).lifetime(lifetime);
        spec.env = self.shared.cfg.env.clone();
        spec.env.extend(args.env);
        spec.cwd = args.cwd;
        self.declare_workspace_packages(&args.workspace_id, &mut spec.packages);
        let program = match self.shared.exec.start_program(&workspace, spec).await {
            Ok(program) => program,
            Err(e) => return Ok(super::tools::refusal(&e)),
        };
        let id = crate::nonce::hex128();
        // The workspaces' lock is held while the program is put in: a close
        // of its workspace comes before (then it is killed here) or after
        // (then the close forgets it).
        let kept = {
            let workspaces = self.connection.workspaces.lock();
            let open = workspaces.contains_key(&args.workspace_id);
            let mut programs = self.connection.programs.lock();
            if open {
                programs.insert(id.clone(), (program.clone(), args.workspace_id.clone()));
            }
            // Counted among the programs now, not as starting (under their lock).
            drop(starting);
            open
        };
        if !kept {
            program.kill(Duration::ZERO).await;
            let why = format!("workspace {} was closed while the program started", args.workspace_id);
            return Ok(invalid_arguments("start_program", &why));
        }
        Ok(self.answer(&id, &program, args.yield_ms, program::DEFAULT_ANSWER_BYTES).await)
    }

    /// New output of a program.
    #[tool(description = "Read a program's new output since the last answer, waiting up to yield_ms for \
            output or its end. Answers {program_id, status, output, offset, next_offset, exit_code, dropped_bytes}.")]
    async fn poll_program(&self, Parameters(args): Parameters<PollProgramArgs>) -> Result<CallToolResult, McpError> {
        let Some(program) = self.program(&args.program_id) else {
            return Ok(no_program("poll_program", &args.program_id));
        };
        let limit = program::answer_limit(args.limit);
        Ok(self.answer(&args.program_id, &program, args.yield_ms, limit).await)
    }

    /// Writes to a program's input.
    #[tool(description = "Write text to a program's input (newline: add a newline; interrupt: then Ctrl-C; \
            eof: then end its input), and answer like poll_program after waiting up to yield_ms for its answer.")]
    async fn write_program(&self, Parameters(args): Parameters<WriteProgramArgs>) -> Result<CallToolResult, McpError> {
        let Some(program) = self.program(&args.program_id) else {
            return Ok(no_program("write_program", &args.program_id));
        };
        if let Err(e) = program.send(args.data, args.newline, args.interrupt, args.eof) {
            return Ok(program_error("write_program", &args.program_id, &e));
        }
        Ok(self.answer(&args.program_id, &program, args.yield_ms, program::DEFAULT_ANSWER_BYTES).await)
    }

    /// Kills a program.
    #[tool(description = "Kill a program: SIGTERM, then SIGKILL to everything it started after grace_ms \
            (default 2000). Answers like poll_program, with its end.")]
    async fn kill_program(&self, Parameters(args): Parameters<KillProgramArgs>) -> Result<CallToolResult, McpError> {
        let Some(program) = self.program(&args.program_id) else {
            return Ok(no_program("kill_program", &args.program_id));
        };
        let end = program.kill(program::kill_grace(args.grace_ms)).await;
        self.connection.programs.lock().remove(&args.program_id);
        Ok(rendered(&args.program_id, &end))
    }
}

impl ExecboxMcp {
    /// Checks the arguments of a program tool against its type (see
    /// `call_tool`); any other tool's pass.
    pub(super) fn check_program_arguments(tool: &str, arguments: serde_json::Value) -> Result<(), serde_json::Error> {
        match tool {
            "start_program" => serde_json::from_value::<StartProgramArgs>(arguments).map(drop),
            "poll_program" => serde_json::from_value::<PollProgramArgs>(arguments).map(drop),
            "write_program" => serde_json::from_value::<WriteProgramArgs>(arguments).map(drop),
            "kill_program" => serde_json::from_value::<KillProgramArgs>(arguments).map(drop),
            _ => Ok(()),
        }
    }

    /// This connection's program `id` (its workspace marked used).
    fn program(&self, id: &str) -> Option<Program> {
        let (program, workspace) = self.connection.programs.lock().get(id).cloned()?;
        super::workspaces::touch(&self.connection, &workspace);
        Some(program)
    }

    /// Polls `program` and renders the answer; an ended program whose end
    /// this answer carries is forgotten.
    async fn answer(&self, id: &str, program: &Program, yield_ms: Option<u64>, limit: usize) -> CallToolResult {
        let out = program.poll_text(program::call_wait(yield_ms), limit).await;
        if program.end_was_read(&out) {
            self.connection.programs.lock().remove(id);
        }
        rendered(id, &out)
    }
}

/// A place among a connection's programs while one starts.
struct Starting<'a>(&'a Connection);

impl<'a> Starting<'a> {
    fn take(connection: &'a Connection) -> Option<Self> {
        use std::sync::atomic::Ordering::SeqCst;
        let programs = connection.programs.lock();
        if programs.len() + connection.programs_starting.load(SeqCst) >= MAX_PROGRAMS_PER_CONNECTION {
            return None;
        }
        connection.programs_starting.fetch_add(1, SeqCst);
        Some(Self(connection))
    }
}

impl Drop for Starting<'_> {
    fn drop(&mut self) {
        self.0.programs_starting.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A write the program did not take: too large is the caller's to fix
/// (`invalid_arguments`); an ended program, a closed input or a lost
/// container is the program's state (`program`).
fn program_error(tool: &str, id: &str, error: &ProgramError) -> CallToolResult {
    if let ProgramError::TooLarge(_) = error {
        return invalid_arguments(tool, &error.to_string());
    }
    let message = format!("program {id}: {}", crate::error::with_causes(error));
    structured(json!({"error": {"kind": "program", "message": message}}), format!("program: {message}"), true)
}

fn no_program(tool: &str, id: &str) -> CallToolResult {
    invalid_arguments(
        tool,
        &format!("no program {id} (ids are this connection's; an ended program is forgotten once its end was read)"),
    )
}

/// The poll answer, as structuredContent and as text.
fn rendered(id: &str, out: &ProgramOutput) -> CallToolResult {
    let output = String::from_utf8_lossy(&out.output);
    let body = out.to_json(id);
    let status = serde_json::to_value(out.status).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
    let end = out.exit_code.map(|c| format!(" (exit code {c})")).unwrap_or_default();
    let dropped = if out.dropped_bytes > 0 { format!(" [{} bytes dropped]", out.dropped_bytes) } else { String::new() };
    structured(body, format!("program {id}: {status}{end}{dropped}\n{output}"), false)
}
