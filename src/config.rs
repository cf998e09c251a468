//! What every backend's configuration shares: [`RunDefaults`], and the
//! setter methods each config type gets, so a caller outside this crate
//! can change any field of a `#[non_exhaustive]` config in one chain.

use std::time::Duration;

/// What a run gets when its policy states nothing: each backend's config
/// embeds one (its own default values differ: a container's runs may
/// compile Rust, a wasm guest's memory is bounded by its engine's slots).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunDefaults {
    /// The deadline of a run whose policy states none: nothing runs unbounded.
    ///
    /// # Default
    /// 30 s (containers: 300 s, for a Rust compile and run together).
    pub timeout: Duration,
    /// The memory cap of a run whose policy states none.
    ///
    /// # Default
    /// 256 MiB (containers: 512 MiB; wasm: the engine's `max_memory_bytes`).
    pub memory_bytes: u64,
    /// Deepest JSON `input` accepted (serialization and parsers recurse).
    ///
    /// # Default
    /// 128.
    pub max_input_nesting: usize,
}

impl Default for RunDefaults {
    fn default() -> Self {
        Self { timeout: Duration::from_secs(30), memory_bytes: 256 << 20, max_input_nesting: 128 }
    }
}

/// Generates a chainable setter per field of a config type: fields in the
/// first braces take their own type; fields after `some` are `Option<T>`
/// and their setter takes a `T` (anything `Into<T>`) and sets `Some`;
/// fields after `into` take anything `Into<T>` (e.g. `&str` for a `String`).
macro_rules! setters {
    ($ty:ident { $($field:ident : $t:ty),* $(,)? }
     $(some { $($ofield:ident : $ot:ty),* $(,)? })?
     $(into { $($ifield:ident : $it:ty),* $(,)? })?) => {
        impl $ty {
            $(
                #[doc = concat!("Sets [`Self::", stringify!($field), "`].")]
                #[must_use]
                pub fn $field(mut self, value: $t) -> Self {
                    self.$field = value;
                    self
                }
            )*
            $($(
                #[doc = concat!("Sets [`Self::", stringify!($ofield), "`].")]
                #[must_use]
                pub fn $ofield(mut self, value: impl Into<$ot>) -> Self {
                    self.$ofield = Some(value.into());
                    self
                }
            )*)?
            $($(
                #[doc = concat!("Sets [`Self::", stringify!($ifield), "`].")]
                #[must_use]
                pub fn $ifield(mut self, value: impl Into<$it>) -> Self {
                    self.$ifield = value.into();
                    self
                }
            )*)?
        }
    };
}
#[allow(unused_imports)] // used by each backend's config
pub(crate) use setters;

setters!(RunDefaults { timeout: Duration, memory_bytes: u64, max_input_nesting: usize });
