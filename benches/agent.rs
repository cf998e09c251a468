//! The agent layer's own costs: code-block extraction on a typical reply, on
//! 1 MB without delimiters and on the replies of about 1 MB that a
//! quadratic scanner would take minutes over (`agent_extract_large`, the
//! inputs of the agent tests), and `CodeExecutor::execute_code` vs the
//! `Executor` it wraps (boa, a trivial JS body).
//!
//! `cargo bench --bench agent`.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use execbox::agent::{CodeBlockExtractor, CodeExecutionInput, CodeExecutor, ExecboxCodeExecutor, InvocationContext};
use execbox::backends::BoaJs;
use execbox::{ExecRequest, Executor, SandboxPolicy};

#[path = "../tests/common/large_replies.rs"]
mod large_replies;

const REPLY: &str = "I'll compute the totals first.\n\n```js\nconst xs = [1, 2, 3];\nreturn xs.reduce((a, b) => a + b, 0);\n```\n\n\
                     Then check the shape:\n```json\n{\"ok\": true}\n```\nDone.";

fn bench(c: &mut Criterion) {
    let extractor = CodeBlockExtractor::default();
    let [(_, prose), ..] = large_replies::large_replies();
    let mut g = c.benchmark_group("agent");
    g.bench_function("extract_typical_reply", |b| b.iter(|| black_box(extractor.extract(black_box(REPLY)))));
    g.bench_function("extract_1mib_without_delimiters", |b| b.iter(|| black_box(extractor.extract(black_box(&prose)))));

    let executor = Executor::builder().backend(BoaJs::default()).build();
    let agent = ExecboxCodeExecutor::new(executor.clone());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let ctx = InvocationContext::default();
    g.bench_function("executor_execute_blocking", |b| {
        b.iter(|| {
            black_box(executor.execute_blocking(ExecRequest::javascript("return 1").policy(SandboxPolicy::strict())))
        })
    });
    g.bench_function("code_executor_execute_code", |b| {
        b.iter(|| black_box(runtime.block_on(agent.execute_code(&ctx, CodeExecutionInput::new("js", "return 1")))))
    });
    g.finish();

    // Speed on these is measured here, never asserted in a test.
    let mut large = c.benchmark_group("agent_extract_large");
    large.sample_size(20);
    for (name, text) in large_replies::large_replies() {
        large.throughput(Throughput::Bytes(text.len() as u64));
        large.bench_function(name, |b| b.iter(|| black_box(extractor.extract(black_box(&text)))));
    }
    large.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
