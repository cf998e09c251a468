;; JSON ABI reactor: returns its input unchanged. The smallest JSON-ABI guest,
;; used by the benchmarks. `alloc` bumps a pointer from 1 KiB, growing memory.
(module
  (memory (export "memory") 1)
  (global $next (mut i32) (i32.const 1024))
  (func (export "alloc") (param $len i32) (result i32)
    (local $ptr i32) (local $end i32)
    (local.set $ptr (global.get $next))
    (local.set $end (i32.add (local.get $ptr) (local.get $len)))
    (block $fits
      (br_if $fits (i32.le_u (local.get $end) (i32.mul (memory.size) (i32.const 65536))))
      (if (i32.eq (memory.grow (i32.add (i32.shr_u (local.get $len) (i32.const 16)) (i32.const 1))) (i32.const -1))
        (then (unreachable))))
    (global.set $next (local.get $end))
    (local.get $ptr))
  (func (export "run") (param $ptr i32) (param $len i32) (result i64)
    (i64.or
      (i64.shl (i64.extend_i32_u (local.get $ptr)) (i64.const 32))
      (i64.extend_i32_u (local.get $len)))))
