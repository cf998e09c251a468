//! The ticker thread's lifetime, alone in its own test binary so no other
//! test's backend changes the thread count while it looks.
#![cfg(feature = "wasm")]

use execbox::backends::WasmGuest;

#[test]
fn dropping_the_backend_stops_its_ticker_thread() {
    fn threads_named(name: &str) -> usize {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(Result::ok)
            .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
            .count()
    }
    // A new thread names itself once it runs: give it a moment.
    fn settles_at(name: &str, expected: usize) -> usize {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            let n = threads_named(name);
            if n == expected || std::time::Instant::now() > until {
                return n;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
    let before = threads_named("execbox-epoch");
    let wasm = WasmGuest::new().unwrap();
    assert_eq!(settles_at("execbox-epoch", before + 1), before + 1);
    drop(wasm);
    // Drop joins the thread: it is gone at once.
    assert_eq!(threads_named("execbox-epoch"), before);
}
