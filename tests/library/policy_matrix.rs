//! Matching and selection: every control × enforced / by omission / not
//! enforced, all violations reported, and how the executor picks or refuses.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use execbox::backends::{BoaJs, BoaJsInThread};
use execbox::{
    Access, Backend, BackendCapabilities, Control, CostClass, Enforcement, ExecError, ExecRequest, ExecResult,
    Executor, IsolationKind, Language, Outcome, PathGrants, PayloadKind, RequestFeatures, SandboxPolicy,
    SurfaceCapability, check,
};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Level {
    Enforced,
    Omission,
    Cannot,
}

fn enforcement(level: Level) -> Enforcement {
    match level {
        Level::Enforced => Enforcement::enforced("test mechanism"),
        Level::Omission => Enforcement::by_omission("no such surface"),
        Level::Cannot => Enforcement::not_enforced("cannot"),
    }
}

/// Capabilities with every control at `level` (allow-lists too).
fn caps(level: Level) -> BackendCapabilities {
    let e = || enforcement(level);
    let surface = || SurfaceCapability { deny: e(), allow_list: e() };
    BackendCapabilities {
        default_timeout_ms: 30_000,
        isolation: IsolationKind::InProcess,
        cost: CostClass::Low,
        languages: vec![Language::JavaScript, Language::Python],
        payloads: vec![PayloadKind::Source],
        features: RequestFeatures { json_input: true, stdin: true, args: true, input_files: true, output_files: false },
        network: surface(),
        filesystem: surface(),
        environment: surface(),
        timeout: e(),
        memory: e(),
        fuel: e(),
        stdout_cap: e(),
        stderr_cap: e(),
        processes: e(),
        tools: surface(),
        workspace: e(),
    }
}

/// A policy that asks nothing at all.
fn nothing_asked() -> SandboxPolicy {
    SandboxPolicy::unstated()
}

/// One policy per control, asking for just that control.
fn single_control_policies() -> Vec<(Control, SandboxPolicy)> {
    let base = nothing_asked;
    vec![
        (Control::Network, base().network(Access::Deny)),
        (Control::Network, base().network(Access::Allow(vec!["example.org".into()]))),
        (Control::Filesystem, base().filesystem(Access::Deny)),
        (Control::Filesystem, base().filesystem(Access::Allow(PathGrants::default()))),
        (Control::Environment, base().environment(Access::Deny)),
        (Control::Environment, base().environment(Access::Allow(vec!["HOME".into()]))),
        (Control::Timeout, base().timeout(Duration::from_secs(1))),
        (Control::Memory, base().memory_bytes(1 << 20)),
        (Control::Fuel, base().fuel(1000)),
        (Control::StdoutCap, {
            let mut p = base();
            p.max_stdout_bytes = Some(10);
            p
        }),
        (Control::StderrCap, {
            let mut p = base();
            p.max_stderr_bytes = Some(10);
            p
        }),
        (Control::Tools, base().tools(["memory.*"])),
        (Control::Tools, base().tools(Vec::<String>::new())),
        (Control::Processes, base().max_processes(4)),
    ]
}

#[test]
fn every_control_at_every_enforcement_level() {
    for (control, policy) in single_control_policies() {
        let req = ExecRequest::javascript("1").policy(policy);
        for level in [Level::Enforced, Level::Omission, Level::Cannot] {
            let result = check(&caps(level), &req);
            match level {
                Level::Enforced | Level::Omission => assert_eq!(result, Ok(()), "{control:?} at {level:?}"),
                Level::Cannot => {
                    let v = result.expect_err("must be refused");
                    assert_eq!(v.len(), 1, "{control:?}: {v:?}");
                    assert_eq!(v[0].control, control);
                    assert_eq!(v[0].reason, "cannot");
                }
            }
        }
    }
}

#[test]
fn unasked_controls_are_never_violations() {
    let req = ExecRequest::javascript("1").policy(nothing_asked());
    assert_eq!(check(&caps(Level::Cannot), &req), Ok(()));
}

#[test]
fn all_violations_are_listed_not_just_the_first() {
    let policy = nothing_asked()
        .network(Access::Deny)
        .filesystem(Access::Allow(PathGrants { read_only: vec!["/data".into()], read_write: vec![] }))
        .environment(Access::Allow(vec!["HOME".into()]))
        .timeout(Duration::from_secs(1))
        .memory_bytes(1 << 20)
        .fuel(10)
        .max_output_bytes(10)
        .max_processes(1);
    let req = ExecRequest::source(Language::Rust, "fn main() {}").policy(policy).stdin("x").arg("a");
    let mut nothing = caps(Level::Cannot);
    nothing.features = RequestFeatures::default();
    let violations = check(&nothing, &req).unwrap_err();
    let controls: Vec<Control> = violations.iter().map(|v| v.control).collect();
    assert_eq!(
        controls,
        vec![
            Control::Language,
            Control::Stdin,
            Control::Args,
            Control::Network,
            Control::Filesystem,
            Control::Environment,
            Control::Timeout,
            Control::Memory,
            Control::Fuel,
            Control::StdoutCap,
            Control::StderrCap,
            Control::Processes,
        ]
    );
}

#[test]
fn deny_and_allow_are_judged_separately() {
    let mut c = caps(Level::Enforced);
    c.network.allow_list = Enforcement::not_enforced("all or nothing");
    let deny = ExecRequest::javascript("1").policy(nothing_asked().network(Access::Deny));
    assert_eq!(check(&c, &deny), Ok(()));
    let allow = ExecRequest::javascript("1").policy(nothing_asked().network(Access::Allow(vec!["a.b".into()])));
    let v = check(&c, &allow).unwrap_err();
    assert_eq!((v[0].control, v[0].requested.as_str()), (Control::Network, "allow-list"));
}

#[test]
fn request_env_values_need_an_environment_grant() {
    let mut c = caps(Level::Enforced);
    c.environment.allow_list = Enforcement::not_enforced("no env");
    let req = ExecRequest::javascript("1").policy(nothing_asked()).env("K", "v");
    assert_eq!(check(&c, &req).unwrap_err()[0].control, Control::Environment);
}

#[test]
fn unsupported_request_features_are_violations() {
    let mut c = caps(Level::Enforced);
    c.features = RequestFeatures::default();
    let req = ExecRequest::javascript("1")
        .policy(nothing_asked())
        .input(serde_json::json!(1))
        .stdin("s")
        .arg("a")
        .input_file(execbox::ExecFile { name: "f".into(), content: vec![], mime_type: None });
    let controls: Vec<Control> = check(&c, &req).unwrap_err().iter().map(|v| v.control).collect();
    assert_eq!(controls, vec![Control::JsonInput, Control::Stdin, Control::Args, Control::InputFiles]);
    let wasm = ExecRequest::wasm(vec![0u8; 4]).policy(nothing_asked());
    let controls: Vec<Control> = check(&c, &wasm).unwrap_err().iter().map(|v| v.control).collect();
    assert_eq!(controls, vec![Control::Language, Control::Payload]);
}

/// A backend that records how often it ran and returns a fixed result.
struct Fake {
    name: &'static str,
    caps: BackendCapabilities,
    available: bool,
    runs: Arc<AtomicUsize>,
}

impl Fake {
    fn new(name: &'static str, caps: BackendCapabilities) -> (Self, Arc<AtomicUsize>) {
        let runs = Arc::new(AtomicUsize::new(0));
        (Self { name, caps, available: true, runs: runs.clone() }, runs)
    }
}

impl Backend for Fake {
    fn name(&self) -> &str {
        self.name
    }
    fn capabilities(&self) -> &BackendCapabilities {
        &self.caps
    }
    fn availability(&self) -> Result<(), execbox::Unavailable> {
        if self.available { Ok(()) } else { Err(execbox::Unavailable::new("engine missing", "run scripts/setup")) }
    }
    fn execute(&self, _call: execbox::Admitted) -> Result<ExecResult, ExecError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let mut result = ExecResult::new(self.name, Outcome::Ok);
        result.exit_code = Some(0);
        Ok(result)
    }
}

fn with_cost(level: Level, cost: CostClass) -> BackendCapabilities {
    BackendCapabilities { cost, ..caps(level) }
}

#[test]
fn cheapest_satisfying_backend_wins_then_registration_order() {
    let (container, _) = Fake::new("container", with_cost(Level::Enforced, CostClass::High));
    let (a, _) = Fake::new("a", with_cost(Level::Enforced, CostClass::Low));
    let (b, _) = Fake::new("b", with_cost(Level::Enforced, CostClass::Low));
    let exec = Executor::builder().backend(container).backend(a).backend(b).build();
    let req = ExecRequest::javascript("1");
    assert_eq!(exec.select(&req).unwrap().name(), "a");
    let names: Vec<&str> = exec.backends().map(|b| b.name()).collect();
    assert_eq!(names, vec!["a", "b", "container"]);
}

#[test]
fn a_backend_that_cannot_enforce_is_skipped_for_one_that_can() {
    let (weak, weak_runs) = Fake::new("weak", with_cost(Level::Cannot, CostClass::Low));
    let (strong, strong_runs) = Fake::new("strong", with_cost(Level::Enforced, CostClass::High));
    let exec = Executor::builder().backend(weak).backend(strong).build();
    let r = exec.execute_blocking(ExecRequest::javascript("1").policy(SandboxPolicy::strict().memory_bytes(1 << 20)));
    assert_eq!(r.unwrap().backend, "strong");
    assert_eq!((weak_runs.load(Ordering::SeqCst), strong_runs.load(Ordering::SeqCst)), (0, 1));
}

#[test]
fn refusal_names_every_backend_and_runs_nothing() {
    let (x, x_runs) = Fake::new("x", caps(Level::Cannot));
    let (y, y_runs) = Fake::new("y", caps(Level::Cannot));
    let exec = Executor::builder().backend(x).backend(y).build();
    let err = exec.execute_blocking(ExecRequest::javascript("1").policy(SandboxPolicy::strict())).unwrap_err();
    let ExecError::Refused { rejections } = &err else { panic!("{err}") };
    let names: Vec<&str> = rejections.iter().map(|r| r.backend.as_str()).collect();
    assert_eq!(names, vec!["x", "y"]);
    // strict asks: network, filesystem, environment and tools deny; timeout; memory; stdout/stderr caps.
    assert_eq!(rejections[0].violations.len(), 8);
    assert_eq!(x_runs.load(Ordering::SeqCst) + y_runs.load(Ordering::SeqCst), 0);
    assert_eq!(err.kind(), "refused");
    let json = err.to_json();
    assert_eq!(json["error"]["violations"].as_array().unwrap().len(), 16);
    assert_eq!(json["error"]["violations"][0]["backend"], "x");
    assert_eq!(json["error"]["violations"][0]["control"], "network");
}

#[test]
fn pinning_selects_by_name_or_refuses() {
    let (a, _) = Fake::new("a", caps(Level::Enforced));
    let (b, b_runs) = Fake::new("b", caps(Level::Enforced));
    let (c, _) = Fake::new("c", caps(Level::Cannot));
    let exec = Executor::builder().backend(a).backend(b).backend(c).build();
    assert_eq!(exec.execute_blocking(ExecRequest::javascript("1").on_backend("b")).unwrap().backend, "b");
    assert_eq!(b_runs.load(Ordering::SeqCst), 1);
    let err = exec.execute_blocking(ExecRequest::javascript("1").on_backend("c")).unwrap_err();
    let ExecError::Refused { rejections } = err else { panic!() };
    assert_eq!(rejections.len(), 1, "only the pinned backend is judged");
    let err = exec.execute_blocking(ExecRequest::javascript("1").on_backend("nope")).unwrap_err();
    assert!(matches!(err, ExecError::UnknownBackend { ref name, .. } if name == "nope"), "{err}");
}

#[test]
fn unsupported_language_and_unavailable_backend_are_typed() {
    let (js_only, _) =
        Fake::new("js", BackendCapabilities { languages: vec![Language::JavaScript], ..caps(Level::Enforced) });
    let exec = Executor::builder().backend(js_only).build();
    let err = exec.execute_blocking(ExecRequest::source(Language::Shell, "echo")).unwrap_err();
    assert!(matches!(err, ExecError::UnsupportedLanguage { language: Language::Shell, .. }), "{err}");

    let (mut down, runs) = Fake::new("down", caps(Level::Enforced));
    down.available = false;
    let exec = Executor::builder().backend(down).build();
    let err = exec.execute_blocking(ExecRequest::javascript("1")).unwrap_err();
    assert_eq!(err.kind(), "backend_unavailable");
    assert!(err.to_string().contains("scripts/setup"));
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[test]
fn env_values_outside_the_policy_allow_list_are_invalid() {
    let (a, _) = Fake::new("a", caps(Level::Enforced));
    let exec = Executor::builder().backend(a).build();
    let policy = SandboxPolicy::strict().environment(Access::Allow(vec!["OK".into()]));
    let err = exec
        .execute_blocking(ExecRequest::javascript("1").policy(policy.clone()).env("OK", "1").env("SECRET", "x"))
        .unwrap_err();
    assert_eq!(err.kind(), "invalid_request");
    assert!(err.to_string().contains("SECRET"));
    assert!(exec.execute_blocking(ExecRequest::javascript("1").policy(policy).env("OK", "1")).is_ok());
    // strict denies the environment: any value is invalid.
    let err = exec.execute_blocking(ExecRequest::javascript("1").env("OK", "1")).unwrap_err();
    assert_eq!(err.kind(), "invalid_request");
}

#[test]
fn boa_refuses_what_it_cannot_grant_listing_every_control() {
    let exec = Executor::builder().backend(BoaJsInThread::default()).backend(BoaJs::default()).build();
    let policy = SandboxPolicy::strict()
        .memory_bytes(1 << 26)
        .network(Access::Allow(vec!["example.org".into()]))
        .filesystem(Access::Allow(PathGrants { read_only: vec!["/tmp".into()], read_write: vec![] }));
    let err = exec.execute_blocking(ExecRequest::javascript("1").policy(policy).stdin("x")).unwrap_err();
    let ExecError::Refused { rejections } = &err else { panic!("{err}") };
    let controls = |name: &str| -> Vec<Control> {
        let r = rejections.iter().find(|r| r.backend == name).expect(name);
        r.violations.iter().map(|v| v.control).collect()
    };
    // In-thread boa also cannot cap memory; the contained one can.
    assert_eq!(
        controls("boa-js-inthread"),
        vec![Control::Stdin, Control::Network, Control::Filesystem, Control::Memory]
    );
    assert_eq!(controls("boa-js"), vec![Control::Stdin, Control::Network, Control::Filesystem]);
}

#[test]
fn strict_js_runs_contained_and_in_thread_boa_only_when_memory_is_not_asked() {
    let exec = Executor::builder().backend(BoaJsInThread::default()).backend(BoaJs::default()).build();
    let r = exec.execute_blocking(ExecRequest::javascript("return 1")).unwrap();
    assert_eq!(r.backend, "boa-js", "strict asks for a memory cap");
    let trusted = {
        let mut p = SandboxPolicy::host_local();
        p.memory_bytes = None;
        p
    };
    let r = exec.execute_blocking(ExecRequest::javascript("return 1").policy(trusted)).unwrap();
    assert_eq!(r.backend, "boa-js-inthread", "registered first, and nothing it cannot enforce is asked");
}

#[test]
fn boa_satisfies_strict_and_fuel_and_process_limits() {
    let exec = Executor::with_default_backends();
    let policy = SandboxPolicy::strict().fuel(1_000_000).max_processes(1);
    let r = exec.execute_blocking(ExecRequest::javascript("return 1").policy(policy)).unwrap();
    assert_eq!(r.outcome, Outcome::Ok);
}

#[cfg(feature = "wasm")]
mod wasm_routing {
    use super::*;
    use execbox::backends::{WasmGuest, WasmGuestConfig};

    const HELLO: &[u8] = include_bytes!("../../guests/wat/hello.wat");

    #[test]
    fn wasm_requests_route_to_the_wasm_backend() {
        let exec = Executor::with_default_backends();
        let r = exec.execute_blocking(ExecRequest::wasm(HELLO)).unwrap();
        assert_eq!((r.backend.as_str(), r.outcome), ("wasm", Outcome::Ok));
        // JavaScript still goes to boa.
        assert_eq!(exec.select(&ExecRequest::javascript("1")).unwrap().name(), "boa-js");
    }

    #[test]
    fn wasm_enforces_everything_but_network() {
        let exec = Executor::with_default_backends();
        let dir = std::env::temp_dir();
        let everything = SandboxPolicy::strict()
            .memory_bytes(1 << 26)
            .fuel(1 << 30)
            .max_processes(1)
            .environment(Access::Allow(vec!["A".into()]))
            .filesystem(Access::Allow(PathGrants::new().read_only(&dir).read_write_at(&dir, "/w")));
        let request = ExecRequest::wasm(HELLO)
            .policy(everything.clone())
            .stdin("x")
            .arg("a")
            .env("A", "1")
            .input_file(execbox::ExecFile { name: "f".into(), content: vec![], mime_type: None });
        assert_eq!(exec.select(&request).unwrap().name(), "wasm");

        let err = exec
            .execute_blocking(
                ExecRequest::wasm(HELLO).policy(everything.network(Access::Allow(vec!["example.org".into()]))),
            )
            .unwrap_err();
        let ExecError::Refused { rejections } = &err else { panic!("{err}") };
        let wasm = rejections.iter().find(|r| r.backend == "wasm").unwrap();
        let controls: Vec<Control> = wasm.violations.iter().map(|v| v.control).collect();
        assert_eq!(controls, vec![Control::Network]);
        let boa = rejections.iter().find(|r| r.backend == "boa-js").unwrap();
        assert_eq!(boa.violations[0].control, Control::Language);
    }

    #[test]
    fn fuel_is_refused_when_metering_is_off() {
        let unmetered = WasmGuest::new(WasmGuestConfig::default().consume_fuel(false)).unwrap();
        let exec = Executor::builder().backend(unmetered).build();
        let err =
            exec.execute_blocking(ExecRequest::wasm(HELLO).policy(SandboxPolicy::strict().fuel(1000))).unwrap_err();
        let controls: Vec<Control> = err.violations().into_iter().map(|(_, v)| v.control).collect();
        assert_eq!(controls, vec![Control::Fuel]);
        // Without a fuel requirement it runs, unmetered.
        let r = exec.execute_blocking(ExecRequest::wasm(HELLO)).unwrap();
        assert_eq!((r.outcome, r.usage.fuel), (Outcome::Ok, None));
    }

    #[test]
    fn oversized_modules_are_invalid_before_compiling() {
        let exec = Executor::with_default_backends();
        let err = exec
            .execute_blocking(ExecRequest::wasm(HELLO).policy(SandboxPolicy::strict().max_code_bytes(16)))
            .unwrap_err();
        assert_eq!(err.kind(), "invalid_request");
    }
}

#[cfg(feature = "container")]
mod container_routing {
    use super::*;
    use execbox::Language;

    #[test]
    fn in_process_backends_refuse_output_files_and_containers_take_python() {
        let exec = Executor::with_default_backends();
        let Err(err) = exec.select(&ExecRequest::javascript("return 1").collect_output_files()) else {
            panic!("selected")
        };
        let ExecError::Refused { rejections } = &err else { panic!("{err}") };
        let boa = rejections.iter().find(|r| r.backend == "boa-js").unwrap();
        assert_eq!(boa.violations.iter().map(|v| v.control).collect::<Vec<_>>(), vec![Control::OutputFiles]);

        // Python has only the container; a pin to it is honoured whatever its availability says.
        let python = ExecRequest::source(Language::Python, "print(1)").collect_output_files();
        assert!(execbox::check(exec.backends().last().unwrap().capabilities(), &python).is_ok());
        assert_eq!(exec.backends().last().unwrap().name(), "container", "the high-cost backend is tried last");
    }

    /// The container carries the tool bridge: a shell or Rust request that
    /// grants tools (which no other backend runs) now matches it.
    #[test]
    fn requests_granting_tools_match_the_container_in_every_language() {
        let exec = Executor::with_default_backends();
        let container = exec.backends().find(|b| b.name() == "container").expect("the container backend");
        let tools = &container.capabilities().tools;
        assert!(matches!(tools.allow_list, Enforcement::Enforced { .. }), "{tools:?}");
        assert!(tools.deny.holds());
        for language in [Language::Python, Language::Shell, Language::Rust] {
            let request =
                ExecRequest::source(language, "x").policy(SandboxPolicy::strict().tools(["math.*", "files.read"]));
            assert_eq!(execbox::check(container.capabilities(), &request), Ok(()), "{language}");
        }
    }

    #[test]
    fn containers_refuse_what_they_cannot_enforce_with_every_control_named() {
        let exec = Executor::with_default_backends();
        let policy = SandboxPolicy::strict().fuel(10).network(Access::Allow(vec!["example.org:443".into()]));
        let request = ExecRequest::source(Language::Rust, "fn run() {}").policy(policy).stdin("x");
        let Err(err) = exec.select(&request) else { panic!("selected") };
        let ExecError::Refused { rejections } = &err else { panic!("{err}") };
        let container = rejections.iter().find(|r| r.backend == "container").unwrap();
        let controls: Vec<Control> = container.violations.iter().map(|v| v.control).collect();
        assert_eq!(controls, vec![Control::Stdin, Control::Network, Control::Fuel]);
    }
}

/// Declared packages route by what each backend provides: numpy is refused
/// by python-wasm (named) and runs on the container's data image; a package
/// nobody has is refused with every backend's reason.
#[cfg(all(feature = "wasm", feature = "container"))]
#[test]
fn declared_packages_route_to_the_backend_that_has_them() {
    use execbox::backends::{Container, InterpreterConfig, WasmInterpreter};
    let python = WasmInterpreter::new(InterpreterConfig::default()).expect("engine");
    let container = Container::default();
    // Without an engine, only the python-wasm half runs.
    let container_up = common::skip::available(common::skip::CONTAINERS, container.availability());
    let exec = Executor::builder().backend(python).backend(container).build();
    let numpy = ExecRequest::source(Language::Python, "import numpy").packages(["numpy"]);
    let pinned = exec.select(&numpy.clone().on_backend("python-wasm")).err().expect("python-wasm lacks numpy");
    let v = pinned.violations();
    assert_eq!(v.len(), 1, "{pinned}");
    assert_eq!((v[0].1.control, v[0].1.requested.as_str()), (Control::Packages, "numpy"));
    if container_up {
        assert_eq!(exec.select(&numpy).unwrap().name(), "container");
        // No packages: python-wasm, the cheaper one.
        assert_eq!(exec.select(&ExecRequest::source(Language::Python, "1")).unwrap().name(), "python-wasm");
    }
    let unknown = ExecRequest::source(Language::Python, "1").packages(["no-such-package"]);
    let err = exec.select(&unknown).err().expect("nobody has it");
    let backends: Vec<String> = err.violations().into_iter().map(|(b, _)| b).collect();
    assert_eq!(backends, ["python-wasm", "container"], "{err}");
    let bad = ExecRequest::source(Language::Python, "1").packages(["numpy; rm -rf /"]);
    assert_eq!(exec.select(&bad).err().unwrap().kind(), "invalid_request");
}
