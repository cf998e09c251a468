//! Backends: one module per engine, each with the same shape — a public
//! backend type with a config, its [`BackendCapabilities`](crate::capabilities::BackendCapabilities),
//! and an implementation of [`Backend`](crate::backend::Backend).

#[cfg(any(feature = "wasm", feature = "container"))]
mod conventions;
#[cfg(any(feature = "js", feature = "wasm"))]
pub mod worker;

#[cfg(feature = "js")]
pub mod boa;

#[cfg(feature = "js")]
pub use boa::{BoaJs, BoaJsConfig, BoaJsInThread, JsSession, WorkerGauge};

#[cfg(feature = "wasm")]
pub mod wasm;

#[cfg(feature = "wasm")]
pub use wasm::{
    CacheStats, Interpreter, InterpreterConfig, ModuleLimits, PythonSession, WasmEngine, WasmGuest, WasmGuestConfig,
    WasmInterpreter,
};

#[cfg(feature = "container")]
pub mod container;

#[cfg(feature = "container")]
pub use container::{Container, ContainerConfig};

#[cfg(feature = "kubernetes")]
pub mod kubernetes;

#[cfg(feature = "kubernetes")]
pub use kubernetes::{Kubernetes, KubernetesConfig};
