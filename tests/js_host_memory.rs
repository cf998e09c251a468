//! The host's own memory while contained JS bombs it. Alone in its test
//! binary: the host's RSS is measured, and other tests in the same process
//! would move it.

mod common;

use std::time::Duration;

use common::procfs::own_rss_bytes;

use execbox::Executor;
use execbox::backends::{BoaJs, BoaJsConfig};
use execbox::{ExecRequest, Outcome, SandboxPolicy};
use serde_json::json;

#[test]
fn memory_bombs_and_huge_values_leave_the_host_flat() {
    let backend = BoaJs::new(BoaJsConfig::default().worker_program(env!("CARGO_BIN_EXE_execbox-worker"))).unwrap();
    let policy = SandboxPolicy::strict().timeout(Duration::from_secs(10));
    let warm = Executor::run_on(&backend, ExecRequest::javascript("return 1").policy(policy.clone())).unwrap();
    assert_eq!(warm.outcome, Outcome::Ok);
    let before = own_rss_bytes();
    for code in ["let a = []; while (true) a.push('x'.repeat(1e6) + a.length)", "let s = 'x'; while (true) s = s + s"] {
        let r = Executor::run_on(&backend, ExecRequest::javascript(code).policy(policy.clone().memory_bytes(64 << 20)))
            .unwrap();
        assert_eq!(r.outcome, Outcome::OutOfMemory, "{r:?}");
        assert!(r.message.unwrap().contains("67108864"));
    }
    for code in [
        "let a = new ArrayBuffer(1.5 * 2 ** 30); let b = new ArrayBuffer(1.5 * 2 ** 30); return 1",
        "console.log(new Uint8Array(128 * 2 ** 20)); return 1",
        "const s = 'x'.repeat(2 ** 23); return [s, s, s, s]",
        "console.log('x'.repeat(2 ** 24)); return 1",
        "throw 'y'.repeat(10000000)",
    ] {
        let r = Executor::run_on(&backend, ExecRequest::javascript(code).policy(policy.clone())).unwrap();
        assert!(r.message.as_deref().unwrap_or("").len() < 4200, "{code}");
    }
    let grown = own_rss_bytes().saturating_sub(before);
    assert!(grown < 32 << 20, "the host grew by {} MiB", grown >> 20);
    let r = Executor::run_on(
        &backend,
        ExecRequest::javascript("return input.map(x => x * 2)").input(json!([1, 2])).policy(policy),
    )
    .unwrap();
    assert_eq!(r.output, Some(json!([2, 4])));
}
