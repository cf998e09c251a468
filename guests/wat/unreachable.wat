;; Hostile: executes `unreachable` (what a Rust panic with panic=abort becomes).
(module
  (func (export "_start") (unreachable)))
