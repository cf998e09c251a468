//! The fix-your-own-error loop, end to end, with no network and no model
//! API: a scripted stand-in model first writes JavaScript with a bug, reads
//! the failure execbox feeds back, writes the fix, then answers in prose.
//!
//! `cargo run --example agent_loop`

use execbox::Executor;
use execbox::agent::{AgentLoop, ExecboxCodeExecutor, Message, Part, Role};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let executor = ExecboxCodeExecutor::new(Executor::with_default_backends());

    // The stand-in model: deterministic replies that depend on what it saw.
    let model = |history: &[Message]| -> String {
        let failures = history
            .iter()
            .flat_map(|m| &m.parts)
            .filter(|p| matches!(p, Part::CodeResult { outcome: execbox::agent::ModelOutcome::Failed, .. }))
            .count();
        let results = history.iter().filter(|m| m.role == Role::Tool).count();
        match (results, failures) {
            (0, _) => "I'll average the scores.\n\
                       ```js\n\
                       const scores = [72, 88, 95, 61];\n\
                       return scores.sum() / scores.length;\n\
                       ```"
            .into(),
            (1, 1) => "Arrays have no `sum` method; I'll reduce instead.\n\
                       ```js\n\
                       const scores = [72, 88, 95, 61];\n\
                       return scores.reduce((a, b) => a + b, 0) / scores.length;\n\
                       ```"
            .into(),
            _ => "The average score is 79.".into(),
        }
    };

    let report = AgentLoop::new(&executor).run(vec![Message::user("What is the average of the scores?")], model).await;

    for message in &report.history {
        for part in &message.parts {
            match part {
                Part::Text { text } => println!("{:?}: {}", message.role, text.trim()),
                Part::Code { language, code } => println!("{:?} runs {language}:\n{code}", message.role),
                Part::CodeResult { outcome, output } => println!("{:?} → {outcome:?}: {}", message.role, output.trim()),
            }
        }
        println!();
    }
    println!("stopped: {:?}", report.stop);
    for step in &report.trace {
        println!(
            "trace: turn {} block {} {} sha256 {}… on {} → {:?} in {:.2} ms, {} output bytes",
            step.turn,
            step.block,
            step.language,
            &step.code_sha256[..12],
            step.backend.as_deref().unwrap_or("-"),
            step.outcome,
            step.duration_ms,
            step.output_bytes
        );
    }
}
