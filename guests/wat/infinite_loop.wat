;; Hostile: spins forever. Stopped by fuel (out_of_fuel) or the deadline (timed_out).
(module
  (func (export "_start")
    (loop $forever (br $forever))))
