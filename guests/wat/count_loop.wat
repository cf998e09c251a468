;; Counts to 10 million and returns: the fuel on/off benchmark's loop.
(module
  (func (export "_start")
    (local $i i32)
    (loop $next
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $next (i32.lt_u (local.get $i) (i32.const 10000000))))))
