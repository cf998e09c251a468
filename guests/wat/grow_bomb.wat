;; Hostile: grows memory by 16 MiB until the host refuses (-1), then traps,
;; as a guest that cannot handle allocation failure would.
(module
  (memory 1)
  (func (export "_start")
    (loop $more
      (br_if $more (i32.ne (memory.grow (i32.const 256)) (i32.const -1))))
    (unreachable)))
