//! [`ToolRegistry`]: the host's tools that sandboxed code may call — Rust
//! closures registered by the library user, and the tools of upstream MCP
//! servers (see `upstream.rs`). Tools run in the host process with the
//! host's credentials; only arguments and results cross into the sandbox.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::tool::ToolError;
use crate::schema::JsonSchema;

/// A boxed, sendable future (a tool call in flight).
pub type ToolFuture = Pin<Box<dyn Future<Output = Result<Value, ToolError>> + Send + 'static>>;

/// What runs a tool: an async function of its JSON arguments.
///
/// Implemented for every `Fn(Value) -> impl Future<Output = Result<Value,
/// ToolError>>`, so a closure registers in one line. A handler must stop
/// work it no longer needs when its future is dropped (the run ended or
/// the call timed out): execbox drops it then.
pub trait ToolHandler: Send + Sync + 'static {
    /// Starts one call with `args` (a JSON object).
    fn call(&self, args: Value) -> ToolFuture;

    /// Starts one call with `args`, knowing which run made it (`context`).
    /// What execbox calls; the default ignores the context and calls
    /// [`ToolHandler::call`], so only a handler that keeps state per caller
    /// (the artifact store's tools) implements it.
    fn call_in(&self, args: Value, context: &ToolContext) -> ToolFuture {
        let _ = context;
        self.call(args)
    }
}

/// What a tool handler may know of the run that called it
/// ([`ToolHandler::call_in`]). Nothing in it comes from the code.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ToolContext {
    /// Where Code Mode's `workspace.*` tools start the run's programs: set
    /// for a run in a workspace admitted by an executor.
    pub(crate) programs: Option<crate::program::ProgramHost>,
    /// The run's scope: the caller's
    /// [`ExecRequest::artifact_scope`](crate::request::ExecRequest::artifact_scope)
    /// (a session's cells get their session's). Tools that keep state per
    /// caller, such as the artifact store's, keep it under this name; a run
    /// without one has none.
    ///
    /// # Default
    /// `None`.
    pub scope: Option<Arc<str>>,
    /// The largest answer the run takes from one call, as JSON text (its
    /// policy's [`ToolLimits::max_result_bytes`](crate::tools::ToolLimits::max_result_bytes)):
    /// a larger one is cut to fit, keeping its shape, so its strings and
    /// arrays lose their ends. A tool that can answer in parts fits its
    /// answer itself and says so (`artifacts.load` returns fewer bytes and
    /// `truncated: true`, and code reads on from where it stopped).
    ///
    /// # Default
    /// `None` (no limit known); the tool bridge sets it for every call.
    pub max_result_bytes: Option<u64>,
}

impl ToolContext {
    /// The context of a run whose scope is `scope`.
    pub fn with_scope(scope: impl Into<Arc<str>>) -> Self {
        Self { scope: Some(scope.into()), ..Self::default() }
    }

    /// The run's scope, if it has one.
    pub fn scope(&self) -> Option<&str> {
        self.scope.as_deref()
    }
}

impl<F, Fut> ToolHandler for F
where
    F: Fn(Value) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Value, ToolError>> + Send + 'static,
{
    fn call(&self, args: Value) -> ToolFuture {
        Box::pin(self(args))
    }
}

/// Hints about a tool's effects, as MCP's tool annotations state them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ToolAnnotations {
    /// The tool does not change anything.
    ///
    /// # Default
    /// `false`.
    pub read_only: bool,
    /// The tool may change or delete things irreversibly.
    ///
    /// # Default
    /// `false`.
    pub destructive: bool,
    /// Each call from code must be approved by the host's approver first
    /// (see [`ToolRegistryBuilder::approver`]); without one it is denied.
    ///
    /// # Default
    /// `false`.
    pub requires_approval: bool,
}

crate::config::setters!(ToolAnnotations { read_only: bool, destructive: bool, requires_approval: bool });

/// A tool's description: what the model and the code see of it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ToolSpec {
    /// `namespace.tool`: the namespace is an identifier (`[A-Za-z_][A-Za-z0-9_]*`);
    /// the tool part is the tool's own name (an upstream server's name as it
    /// declares it).
    pub name: String,
    /// What it does, for the model.
    ///
    /// # Default
    /// Empty.
    pub description: String,
    /// The JSON Schema of its arguments (an object).
    ///
    /// # Default
    /// `{"type": "object"}`.
    pub input_schema: Value,
    /// The JSON Schema of its result, if declared.
    ///
    /// # Default
    /// `None`.
    pub output_schema: Option<Value>,
    /// Its effects.
    ///
    /// # Default
    /// [`ToolAnnotations::default`].
    pub annotations: ToolAnnotations,
}

impl ToolSpec {
    /// A tool called `name` (`namespace.tool`), taking any object.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            description: String::new(),
            input_schema: serde_json::json!({"type": "object"}),
            output_schema: None,
            annotations: ToolAnnotations::default(),
        }
    }

    /// The namespace (before the first `.`).
    pub fn namespace(&self) -> &str {
        self.name.split_once('.').map_or("", |(ns, _)| ns)
    }

    /// The tool's own name (after the first `.`).
    pub fn short_name(&self) -> &str {
        self.name.split_once('.').map_or(&self.name, |(_, tool)| tool)
    }
}

crate::config::setters!(ToolSpec {
    input_schema: Value,
    annotations: ToolAnnotations,
} some {
    output_schema: Value,
} into {
    description: String,
});

/// One registered tool: its spec and its handler.
#[derive(Clone)]
pub struct Tool {
    /// What it is.
    pub spec: Arc<ToolSpec>,
    pub(crate) handler: Arc<dyn ToolHandler>,
    /// The spec's schemas, compiled: a call's arguments are checked before
    /// its handler runs, its result after.
    pub(crate) schemas: Arc<ToolSchemas>,
}

/// A tool's schemas, compiled ([`JsonSchema`]); `None` where there is
/// nothing to check.
#[derive(Default)]
pub(crate) struct ToolSchemas {
    pub(crate) input: Option<JsonSchema>,
    pub(crate) output: Option<JsonSchema>,
}

impl ToolSchemas {
    /// Both schemas of `spec`, or which one execbox refuses and why.
    fn of(spec: &ToolSpec) -> Result<Self, RegistryError> {
        let bad = |which: &'static str| {
            move |e: crate::schema::SchemaError| RegistryError::BadSchema {
                name: spec.name.clone(),
                which,
                reason: e.reason,
            }
        };
        Ok(Self {
            input: Some(JsonSchema::new(spec.input_schema.clone()).map_err(bad("input_schema"))?),
            output: spec.output_schema.clone().map(JsonSchema::new).transpose().map_err(bad("output_schema"))?,
        })
    }

    /// Both schemas of a tool from elsewhere (an upstream MCP server): one
    /// execbox refuses (over its bounds) is not checked here, with a
    /// warning; its server checks its own arguments.
    #[cfg(feature = "upstream")]
    pub(crate) fn lenient(spec: &ToolSpec) -> Self {
        let compile = |which: &str, schema: Value| match JsonSchema::new(schema) {
            Ok(schema) => Some(schema),
            Err(e) => {
                tracing::warn!(tool = %spec.name, which, reason = %e, "a tool's schema is not checked by execbox");
                None
            }
        };
        Self {
            input: compile("input_schema", spec.input_schema.clone()),
            output: spec.output_schema.clone().and_then(|schema| compile("output_schema", schema)),
        }
    }
}

#[cfg(feature = "upstream")]
impl Tool {
    /// A tool from elsewhere (see [`ToolSchemas::lenient`]).
    pub(crate) fn lenient(spec: ToolSpec, handler: Arc<dyn ToolHandler>) -> Self {
        let schemas = Arc::new(ToolSchemas::lenient(&spec));
        Self { spec: Arc::new(spec), handler, schemas }
    }
}

impl std::fmt::Debug for Tool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tool").field("name", &self.spec.name).finish_non_exhaustive()
    }
}

/// What the host decides about one call to a tool that requires approval.
pub trait Approver: Send + Sync + 'static {
    /// Whether `tool` may run with `args`; `Err(reason)` denies it, the
    /// reason reaching the code. Waited for within the call's timeout.
    fn approve(&self, tool: &ToolSpec, args: &Value) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;
}

impl<F, Fut> Approver for F
where
    F: Fn(&ToolSpec, &Value) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    fn approve(&self, tool: &ToolSpec, args: &Value) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> {
        Box::pin(self(tool, args))
    }
}

/// A shared [`Approver`] a request carries
/// ([`ExecRequest::tool_approver`](crate::request::ExecRequest::tool_approver)):
/// it decides that run's calls in place of the registry's approver (a
/// server asks the person behind the call that asked for the run).
#[derive(Clone)]
pub struct ToolApprover(pub(crate) Arc<dyn Approver>);

impl ToolApprover {
    /// Wraps `approver`.
    pub fn new(approver: impl Approver) -> Self {
        Self(Arc::new(approver))
    }
}

impl std::fmt::Debug for ToolApprover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ToolApprover")
    }
}

impl PartialEq for ToolApprover {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// Why a tool could not be registered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// The name is not `namespace.tool` as described on [`ToolSpec::name`].
    #[error("tool name {name:?}: {reason}")]
    BadName {
        /// The name as given.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// Two tools have the same name.
    #[error("tool {name:?} is registered twice")]
    Duplicate {
        /// The name.
        name: String,
    },
    /// A schema that execbox will not compile (see [`crate::schema`]).
    #[error("tool {name:?}: {which}: {reason}")]
    BadSchema {
        /// The tool's name.
        name: String,
        /// `input_schema` or `output_schema`.
        which: &'static str,
        /// Why.
        reason: String,
    },
}

/// The tools sandboxed code may call (when a policy grants them). Cheap to
/// clone; immutable once built.
#[derive(Clone, Default)]
pub struct ToolRegistry {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    tools: BTreeMap<String, Tool>,
    approver: Option<Arc<dyn Approver>>,
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.inner.tools.keys()).finish()
    }
}

/// Builds a [`ToolRegistry`].
#[derive(Default)]
pub struct ToolRegistryBuilder {
    tools: Vec<Tool>,
    approver: Option<Arc<dyn Approver>>,
    /// The first schema refused, reported by [`ToolRegistryBuilder::build`].
    refused: Option<RegistryError>,
}

impl ToolRegistryBuilder {
    /// Registers `handler` as the tool `spec` describes.
    ///
    /// ```
    /// use execbox::tools::{ToolRegistry, ToolSpec};
    /// use serde_json::{Value, json};
    /// let tools = ToolRegistry::builder()
    ///     .tool(ToolSpec::new("math.add").description("a + b"), |args: Value| async move {
    ///         Ok(json!(args["a"].as_f64().unwrap_or(0.0) + args["b"].as_f64().unwrap_or(0.0)))
    ///     })
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(tools.names(), ["math.add"]);
    /// ```
    ///
    /// Its `input_schema` (and `output_schema`, if any) are compiled here:
    /// each call's arguments are checked against it before `handler` runs
    /// (`invalid_arguments`, naming each failing place), and its result
    /// after (`failed`). A schema execbox will not compile (see
    /// [`crate::schema`]) is an error at [`ToolRegistryBuilder::build`].
    pub fn tool(mut self, spec: ToolSpec, handler: impl ToolHandler) -> Self {
        let schemas = match ToolSchemas::of(&spec) {
            Ok(schemas) => schemas,
            Err(e) => {
                self.refused.get_or_insert(e);
                ToolSchemas::default()
            }
        };
        self.tools.push(Tool { spec: Arc::new(spec), handler: Arc::new(handler), schemas: Arc::new(schemas) });
        self
    }

    /// Registers an already built tool (e.g. one of an upstream server's).
    pub fn add_tool(mut self, tool: Tool) -> Self {
        self.tools.push(tool);
        self
    }

    /// Registers every tool of `registry` (not its approver): e.g. an
    /// artifact store's, `ToolRegistry::builder().tool(..).tools(&store.tools())`.
    /// A name registered twice is an error at [`ToolRegistryBuilder::build`].
    pub fn tools(mut self, registry: &ToolRegistry) -> Self {
        self.tools.extend(registry.tools().cloned());
        self
    }

    /// Decides calls to tools that require approval (see
    /// [`ToolAnnotations::requires_approval`]).
    pub fn approver(mut self, approver: impl Approver) -> Self {
        self.approver = Some(Arc::new(approver));
        self
    }

    /// Checks every name and finishes the registry.
    pub fn build(self) -> Result<ToolRegistry, RegistryError> {
        if let Some(refused) = self.refused {
            return Err(refused);
        }
        let mut tools = BTreeMap::new();
        for tool in self.tools {
            check_name(&tool.spec.name)?;
            let name = tool.spec.name.clone();
            if tools.insert(name.clone(), tool).is_some() {
                return Err(RegistryError::Duplicate { name });
            }
        }
        Ok(ToolRegistry { inner: Arc::new(Inner { tools, approver: self.approver }) })
    }
}

/// `namespace.tool`: an identifier, a dot, then 1 to 128 printable
/// characters.
fn check_name(name: &str) -> Result<(), RegistryError> {
    let bad = |reason: &str| RegistryError::BadName { name: name.to_string(), reason: reason.into() };
    let Some((ns, tool)) = name.split_once('.') else {
        return Err(bad("expected namespace.tool"));
    };
    let mut chars = ns.bytes();
    let identifier = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == b'_')
        && ns.len() <= 64;
    if !identifier {
        return Err(bad("the namespace must be an identifier ([A-Za-z_][A-Za-z0-9_]*, at most 64 bytes)"));
    }
    if tool.is_empty() || tool.len() > 128 || tool.chars().any(|c| c.is_control()) || tool.contains('*') {
        return Err(bad("the tool's own name must be 1 to 128 printable characters, without `*`"));
    }
    Ok(())
}

impl ToolRegistry {
    /// A registry to fill.
    pub fn builder() -> ToolRegistryBuilder {
        ToolRegistryBuilder::default()
    }

    /// Every tool's name, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.inner.tools.keys().map(String::as_str).collect()
    }

    /// The tool called `name`, if any.
    pub fn get(&self, name: &str) -> Option<&Tool> {
        self.inner.tools.get(name)
    }

    /// Every tool, sorted by name.
    pub fn tools(&self) -> impl Iterator<Item = &Tool> {
        self.inner.tools.values()
    }

    /// True when no tool is registered.
    pub fn is_empty(&self) -> bool {
        self.inner.tools.is_empty()
    }

    /// The approver of calls that need one.
    pub(crate) fn approver(&self) -> Option<&Arc<dyn Approver>> {
        self.inner.approver.as_ref()
    }

    /// This registry and `other`'s tools together (`other`'s approver wins
    /// if both have one).
    pub fn merged(&self, other: &ToolRegistry) -> Result<ToolRegistry, RegistryError> {
        let mut builder = ToolRegistry::builder();
        for tool in self.tools().chain(other.tools()) {
            builder = builder.add_tool(tool.clone());
        }
        builder.approver = other.inner.approver.clone().or_else(|| self.inner.approver.clone());
        builder.build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_namespaced_and_unique() {
        let noop = |_: Value| async { Ok(Value::Null) };
        for bad in ["plain", ".x", "1ns.x", "ns.", "ns.a*", "n-s.x"] {
            let err = ToolRegistry::builder().tool(ToolSpec::new(bad), noop).build().unwrap_err();
            assert!(matches!(err, RegistryError::BadName { .. }), "{bad}: {err}");
        }
        let ok = ToolRegistry::builder()
            .tool(ToolSpec::new("memory.read_graph"), noop)
            .tool(ToolSpec::new("fs.read-file.v2"), noop)
            .build()
            .unwrap();
        assert_eq!(ok.names(), ["fs.read-file.v2", "memory.read_graph"]);
        assert_eq!(ok.get("fs.read-file.v2").unwrap().spec.short_name(), "read-file.v2");
        let twice = ToolRegistry::builder().tool(ToolSpec::new("a.b"), noop).tool(ToolSpec::new("a.b"), noop).build();
        assert!(matches!(twice, Err(RegistryError::Duplicate { .. })));
    }
}
