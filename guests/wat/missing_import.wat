;; Hostile: imports a function the host does not provide; refused before it runs.
(module
  (import "env" "launch_missiles" (func $launch (param i32) (result i32)))
  (func (export "_start") (drop (call $launch (i32.const 1)))))
