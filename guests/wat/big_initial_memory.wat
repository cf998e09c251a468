;; Hostile: declares 512 MiB of initial memory (8192 pages); refused at instantiation under a smaller cap.
(module
  (memory 8192)
  (func (export "_start")))
