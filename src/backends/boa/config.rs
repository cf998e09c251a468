//! [`BoaJsConfig`]: the settings of both boa backends, and the part of them
//! a worker process receives ([`EngineSettings`]).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{RunDefaults, setters};
use crate::error::ConfigError;

/// Settings of both boa backends ([`BoaJs`](crate::backends::BoaJs) and
/// [`BoaJsInThread`](crate::backends::BoaJsInThread)). Each field says which
/// backend it applies to and its default; the defaults suit agent loops on a
/// small machine.
///
/// Build one with [`BoaJsConfig::default`] and the chainable setters
/// (`BoaJsConfig::default().idle_workers(0)`), or assign fields of a `mut`
/// value. The backends' constructors refuse, as
/// [`ConfigError::Invalid`], a value no run could work with: a default
/// deadline under 1 ms, a zero default memory cap, a zero `yield_every`,
/// `max_workers` or `worker_start_timeout`.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct BoaJsConfig {
    /// Both: what a run gets when its policy states nothing: its deadline,
    /// its memory cap (`boa-js` only: the worker may grow by this much
    /// beyond its size; also the cap of an idle worker), and the deepest
    /// JSON `input` accepted.
    ///
    /// # Default
    /// 30 s, 256 MiB, 128 levels.
    pub defaults: RunDefaults,
    /// Both: deepest nesting accepted in code (before boa's recursive parser
    /// sees it: the request's code, and text given to `eval`, the `Function`
    /// constructors and `JSON.parse`) and in values walked natively
    /// (`JSON.stringify`, `join`, `toLocaleString`, `flat`, `console.*`, the
    /// returned value). Deeper is a typed refusal (`invalid_request` for the
    /// request's code, a catchable `RangeError` at run time).
    ///
    /// # Default
    /// 128 (serde_json's parser stops there too).
    pub max_code_nesting: usize,
    /// Both: longest string or array a guarded built-in (`repeat`,
    /// `padStart`, `padEnd`, `fill`, `join`, `sort`) may produce or take.
    ///
    /// # Default
    /// 16 Mi units.
    pub max_builtin_len: u64,
    /// Both: most values one guarded walk (`JSON.stringify`, `console.*`)
    /// visits; shared sub-values count each time they are reached.
    ///
    /// # Default
    /// 1 Mi.
    pub max_walk_nodes: u64,
    /// Both: VM budget cycles between deadline checks. Must be at least 1.
    ///
    /// # Default
    /// 10,000.
    pub yield_every: u32,
    /// Both: JS call depth limit (boa's `RuntimeLimits`, uncatchable when hit).
    ///
    /// # Default
    /// 512.
    pub recursion_limit: usize,
    /// Both: workers kept ready (processes for `boa-js`, threads for
    /// `boa-js-inthread`), each with a fresh context built.
    ///
    /// # Default
    /// 2.
    pub idle_workers: usize,
    /// `boa-js`: most worker processes at once; more concurrent requests
    /// wait for one within their deadline, then get
    /// [`ExecError::Busy`](crate::error::ExecError::Busy). Must be at least 1.
    ///
    /// # Default
    /// 16.
    pub max_workers: usize,
    /// `boa-js`: the program that serves as a worker (see
    /// [`crate::backends::worker`]); `None` finds one (`EXECBOX_WORKER`, this program
    /// if it called `execbox::worker::serve_if_worker()`, or an `execbox`
    /// binary next to it). With none, the backend is unavailable and says
    /// how to fix it.
    ///
    /// # Default
    /// `None`.
    pub worker_program: Option<PathBuf>,
    /// `boa-js`: the worker process's stack limit (`RLIMIT_STACK`; the engine
    /// runs on its main thread, whose stack grows on demand). Native
    /// recursion past it ends the run as `failed` ("stack overflow"); it is
    /// well under the default memory cap so that it, not the cap, is hit.
    ///
    /// # Default
    /// 64 MiB.
    pub worker_stack_bytes: usize,
    /// `boa-js-inthread`: the reserved stack of each worker thread (address
    /// space, committed only as used; boa's parser needs ~100 KB per nesting
    /// level in debug builds, much less in release).
    ///
    /// # Default
    /// 1 GiB.
    pub thread_stack_bytes: usize,
    /// `boa-js`: how long a new worker may take to start and lock down.
    /// Must not be zero.
    ///
    /// # Default
    /// 10 s.
    pub worker_start_timeout: Duration,
    /// Both: how long past the deadline a run may take to report itself.
    /// Then `boa-js` kills the worker; `boa-js-inthread` returns `timed_out`
    /// and abandons the thread to its instruction budget.
    ///
    /// # Default
    /// 20 ms.
    pub deadline_grace: Duration,
    /// `boa-js-inthread`: without a policy `fuel`, the instruction backstop
    /// is the timeout times this rate (a generous multiple of what boa
    /// executes per ms here), so an abandoned thread stops.
    ///
    /// # Default
    /// 200,000.
    pub backstop_instructions_per_ms: u64,
    /// `boa-js-inthread`: the backstop when the policy has neither `fuel`
    /// nor a timeout.
    ///
    /// # Default
    /// 2^32.
    pub backstop_without_timeout: u64,
}

impl Default for BoaJsConfig {
    fn default() -> Self {
        Self {
            defaults: RunDefaults { timeout: Duration::from_secs(30), memory_bytes: 256 << 20, max_input_nesting: 128 },
            max_code_nesting: 128,
            max_builtin_len: 1 << 24,
            max_walk_nodes: 1 << 20,
            yield_every: 10_000,
            recursion_limit: 512,
            idle_workers: 2,
            max_workers: 16,
            worker_program: None,
            worker_stack_bytes: 64 << 20,
            thread_stack_bytes: 1 << 30,
            worker_start_timeout: Duration::from_secs(10),
            deadline_grace: Duration::from_millis(20),
            backstop_instructions_per_ms: 200_000,
            backstop_without_timeout: 1 << 32,
        }
    }
}

setters!(BoaJsConfig {
    defaults: RunDefaults,
    max_code_nesting: usize,
    max_builtin_len: u64,
    max_walk_nodes: u64,
    yield_every: u32,
    recursion_limit: usize,
    idle_workers: usize,
    max_workers: usize,
    worker_stack_bytes: usize,
    thread_stack_bytes: usize,
    worker_start_timeout: Duration,
    deadline_grace: Duration,
    backstop_instructions_per_ms: u64,
    backstop_without_timeout: u64,
} some {
    worker_program: PathBuf,
});

impl BoaJsConfig {
    /// Refuses what no run could work with (see the type's docs); the
    /// backends' constructors call it.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let zero =
            |setting: &'static str, what: &str| Err(ConfigError::invalid(setting, format!("{what} cannot be zero")));
        if self.defaults.timeout < Duration::from_millis(1) {
            return Err(ConfigError::invalid(
                "BoaJsConfig::defaults.timeout",
                "the default deadline must be at least 1 ms (every run without a policy timeout would time out)",
            ));
        }
        if self.defaults.memory_bytes == 0 {
            return zero("BoaJsConfig::defaults.memory_bytes", "the default memory cap");
        }
        if self.yield_every == 0 {
            return zero("BoaJsConfig::yield_every", "the number of cycles between deadline checks");
        }
        if self.max_workers == 0 {
            return zero("BoaJsConfig::max_workers", "the most worker processes");
        }
        if self.worker_start_timeout.is_zero() {
            return zero("BoaJsConfig::worker_start_timeout", "the time a worker may take to start");
        }
        Ok(())
    }

    /// The default deadline in milliseconds (what capabilities declare).
    pub(crate) fn default_timeout_ms(&self) -> u64 {
        u64::try_from(self.defaults.timeout.as_millis()).unwrap_or(u64::MAX)
    }

    /// The in-thread instruction backstop for a run without a policy `fuel`.
    pub(crate) fn backstop_budget(&self, timeout_ms: Option<u64>) -> u64 {
        timeout_ms
            .map_or(self.backstop_without_timeout, |ms| ms.saturating_mul(self.backstop_instructions_per_ms).max(1))
    }

    /// What the engine itself needs (sent to worker processes).
    pub(crate) fn engine(&self) -> EngineSettings {
        EngineSettings {
            max_code_nesting: self.max_code_nesting,
            max_builtin_len: self.max_builtin_len,
            max_walk_nodes: self.max_walk_nodes,
            yield_every: self.yield_every,
            recursion_limit: self.recursion_limit,
        }
    }
}

/// The engine's own settings, as a worker process receives them.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub(crate) struct EngineSettings {
    pub max_code_nesting: usize,
    pub max_builtin_len: u64,
    pub max_walk_nodes: u64,
    pub yield_every: u32,
    pub recursion_limit: usize,
}

impl Default for EngineSettings {
    fn default() -> Self {
        BoaJsConfig::default().engine()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid_and_mistakes_name_their_setting() {
        assert_eq!(BoaJsConfig::default().validate(), Ok(()));
        let mut cfg = BoaJsConfig::default().max_workers(0);
        let Err(ConfigError::Invalid { setting, .. }) = cfg.validate() else { panic!() };
        assert_eq!(setting, "BoaJsConfig::max_workers");
        cfg = BoaJsConfig::default();
        cfg.defaults.timeout = Duration::ZERO;
        let Err(ConfigError::Invalid { setting, .. }) = cfg.validate() else { panic!() };
        assert_eq!(setting, "BoaJsConfig::defaults.timeout");
        assert_eq!(BoaJsConfig::default().worker_program("/x").worker_program, Some(PathBuf::from("/x")));
    }
}
