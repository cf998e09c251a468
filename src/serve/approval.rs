//! Approval of tool calls by the person behind the MCP client: a call to a
//! tool that requires approval becomes an `elicitation/create` request to
//! the client that asked for the run, and runs only if they accept.

use std::future::Future;
use std::pin::Pin;

use rmcp::model::{ElicitRequestParams, ElicitationAction, ElicitationSchema};
use rmcp::service::{ElicitationMode, Peer, RoleServer};
use serde_json::Value;

use crate::tools::{Approver, ToolApprover, ToolSpec};

/// How much of a call's arguments the question shows.
const SHOWN_ARGUMENT_BYTES: usize = 2048;

/// An approver asking `peer`, when its client can be asked (it declared
/// form elicitation); `None` leaves approval to the server's registry
/// (and, without an approver there, such calls are denied).
pub(super) fn asking(peer: &Peer<RoleServer>) -> Option<ToolApprover> {
    peer.supported_elicitation_modes()
        .contains(&ElicitationMode::Form)
        .then(|| ToolApprover::new(AskTheClient { peer: peer.clone() }))
}

/// Asks the client through elicitation.
struct AskTheClient {
    peer: Peer<RoleServer>,
}

impl Approver for AskTheClient {
    fn approve(&self, tool: &ToolSpec, args: &Value) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> {
        let peer = self.peer.clone();
        let message = question(tool, args);
        Box::pin(async move {
            let schema = ElicitationSchema::builder()
                .optional_bool("approve", true)
                .build()
                .map_err(|e| format!("cannot ask: {e}"))?;
            let params = ElicitRequestParams::FormElicitationParams { meta: None, message, requested_schema: schema };
            // No timeout of its own: the call's timeout bounds the wait,
            // and dropping this future cancels the question.
            let answer = peer
                .create_elicitation_with_timeout(params, None)
                .await
                .map_err(|e| format!("the client could not be asked: {e}"))?;
            match answer.action {
                ElicitationAction::Accept
                    if answer.content.as_ref().and_then(|c| c.get("approve")).and_then(Value::as_bool)
                        != Some(false) =>
                {
                    Ok(())
                }
                ElicitationAction::Accept | ElicitationAction::Decline => Err("declined by the user".into()),
                ElicitationAction::Cancel => Err("cancelled by the user".into()),
                _ => Err("not approved".into()),
            }
        })
    }
}

/// The question: the tool, what it says of itself, and its arguments (cut).
fn question(tool: &ToolSpec, args: &Value) -> String {
    let mut shown = serde_json::to_string(args).unwrap_or_default();
    if shown.len() > SHOWN_ARGUMENT_BYTES {
        let mut end = SHOWN_ARGUMENT_BYTES;
        while !shown.is_char_boundary(end) {
            end -= 1;
        }
        shown.truncate(end);
        shown.push('…');
    }
    let about = if tool.description.is_empty() { String::new() } else { format!(" ({})", tool.description) };
    format!("Sandboxed code asks to call the tool {}{about} with arguments {shown}. Allow this call?", tool.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_question_names_the_tool_and_cuts_long_arguments() {
        let spec = ToolSpec::new("fs.delete").description("deletes a file");
        let text = question(&spec, &serde_json::json!({"path": "x".repeat(10_000)}));
        assert!(text.contains("fs.delete (deletes a file)"), "{text}");
        assert!(text.len() < SHOWN_ARGUMENT_BYTES + 200, "{}", text.len());
        assert!(text.ends_with("Allow this call?"));
    }
}
