//! What a policy says about tools: which are granted (names and
//! `namespace.*` patterns in [`SandboxPolicy::tools`](crate::policy::SandboxPolicy::tools))
//! and how much a run may use them ([`ToolLimits`]).

use serde::{Deserialize, Serialize};

/// How much one run may use its tools. Held to a ceiling field by field
/// (the smaller wins).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct ToolLimits {
    /// Calls per run (a loop that calls tools stops getting answers here).
    ///
    /// # Default
    /// 100.
    pub max_calls: u32,
    /// How long one call may take, never past the run's deadline.
    ///
    /// # Default
    /// 10,000 ms.
    pub call_timeout_ms: u64,
    /// Largest arguments of one call, as JSON text.
    ///
    /// # Default
    /// 64 KiB.
    pub max_argument_bytes: u64,
    /// Largest result of one call, as JSON text; a larger one is cut,
    /// keeping its shape, and flagged.
    ///
    /// # Default
    /// 256 KiB.
    pub max_result_bytes: u64,
    /// Calls in flight at once.
    ///
    /// # Default
    /// 4.
    pub max_concurrent: u32,
}

impl Default for ToolLimits {
    fn default() -> Self {
        Self {
            max_calls: 100,
            call_timeout_ms: 10_000,
            max_argument_bytes: 64 << 10,
            max_result_bytes: 256 << 10,
            max_concurrent: 4,
        }
    }
}

crate::config::setters!(ToolLimits {
    max_calls: u32,
    call_timeout_ms: u64,
    max_argument_bytes: u64,
    max_result_bytes: u64,
    max_concurrent: u32,
});

impl ToolLimits {
    /// These limits held to `ceiling`: each the smaller of the two.
    pub fn within(&self, ceiling: &ToolLimits) -> ToolLimits {
        ToolLimits {
            max_calls: self.max_calls.min(ceiling.max_calls),
            call_timeout_ms: self.call_timeout_ms.min(ceiling.call_timeout_ms),
            max_argument_bytes: self.max_argument_bytes.min(ceiling.max_argument_bytes),
            max_result_bytes: self.max_result_bytes.min(ceiling.max_result_bytes),
            max_concurrent: self.max_concurrent.min(ceiling.max_concurrent),
        }
    }
}

/// Whether `grants` (exact names, `namespace.*`, or `*` for every tool)
/// grant the tool `name`.
pub fn granted(grants: &[String], name: &str) -> bool {
    grants.iter().any(|grant| covers(grant, name))
}

/// Whether the grant `pattern` covers `name` (a tool name or another pattern).
fn covers(pattern: &str, name: &str) -> bool {
    if pattern == "*" || pattern == name {
        return true;
    }
    match pattern.strip_suffix(".*") {
        Some(ns) => name.split_once('.').is_some_and(|(other, _)| other == ns),
        None => false,
    }
}

/// The grants of `asked` that `ceiling` does not cover (a pattern is covered
/// only by one at least as wide).
pub(crate) fn grants_outside(asked: &[String], ceiling: &[String]) -> Vec<String> {
    asked.iter().filter(|g| !ceiling.iter().any(|c| covers(c, g) && (g.as_str() != "*" || c == "*"))).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn grants_cover_names_and_namespaces() {
        let grants = list(&["memory.*", "fs.read"]);
        assert!(granted(&grants, "memory.read_graph"));
        assert!(granted(&grants, "fs.read"));
        assert!(!granted(&grants, "fs.write"));
        assert!(!granted(&grants, "memoryx.a"));
        assert!(granted(&list(&["*"]), "anything.at_all"));
        assert!(!granted(&[], "a.b"));
    }

    #[test]
    fn a_grant_within_a_ceiling_is_never_wider() {
        let ceiling = list(&["memory.*", "fs.read"]);
        assert!(grants_outside(&list(&["memory.read_graph", "memory.*", "fs.read"]), &ceiling).is_empty());
        assert_eq!(grants_outside(&list(&["fs.*", "*", "net.get"]), &ceiling), list(&["fs.*", "*", "net.get"]));
        assert!(grants_outside(&list(&["*"]), &list(&["*"])).is_empty());
        let limits = ToolLimits::default().max_calls(5).call_timeout_ms(60_000);
        let held = limits.within(&ToolLimits::default());
        assert_eq!((held.max_calls, held.call_timeout_ms), (5, 10_000));
    }
}
