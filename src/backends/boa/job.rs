//! From an admitted call to an engine [`Job`]: the code and input checked
//! against the nesting bounds, the instruction budget chosen.

use crate::admission::Admitted;
use crate::backends::boa::config::BoaJsConfig;
use crate::backends::boa::engine::{Job, Mode};
use crate::backends::boa::lexer;
use crate::backends::boa::port::JobTools;
use crate::error::{ExecError, InvalidRequest};
use crate::limits::nesting;

/// Checks an admitted call's code (against
/// [`BoaJsConfig::max_code_nesting`]) and input (against the defaults'
/// `max_input_nesting`) and turns it into a job. Contained runs get no
/// instruction budget unless the policy asks for `fuel` (the host's kill
/// ends runaway code); in-thread runs get the backstop. A run whose policy
/// grants tools gets their names (the caller keeps the bridge,
/// `call.tools()`, to answer the calls).
pub(crate) fn job(cfg: &BoaJsConfig, mut call: Admitted, mode: Mode, backstop: bool) -> Result<Job, ExecError> {
    let max = cfg.max_code_nesting;
    let source = call.take_source("boa")?;
    if let Some(depth) = lexer::source_nesting_exceeds(&source, max) {
        return Err(InvalidRequest::TooDeep { what: "code", depth, max }.into());
    }
    let deadline = call.deadline();
    let tools = call.tools().map(|bridge| JobTools::of(bridge));
    let mut request = call.into_request();
    let input = nesting::take_bounded_input(&mut request.input, cfg.defaults.max_input_nesting)?;
    let policy = &request.policy;
    let (budget, fuel_asked) = match policy.fuel {
        Some(fuel) => (fuel, true),
        None if backstop => (cfg.backstop_budget(policy.timeout_ms), false),
        None => (u64::MAX, false),
    };
    Ok(Job {
        source,
        mode,
        input,
        budget,
        fuel_asked,
        timeout: deadline.limit(),
        max_stdout: policy.max_stdout_bytes,
        max_stderr: policy.max_stderr_bytes,
        tools,
    })
}
