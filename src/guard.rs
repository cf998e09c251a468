//! [`on_drop`]: work that must happen however a scope ends (an early
//! return, a panic, a cancelled future).

/// Runs `f` when the returned guard is dropped.
pub(crate) fn on_drop(f: impl FnOnce()) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}
