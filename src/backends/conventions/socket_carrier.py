def _execbox_socket(path, _state=[], _lock=__import__('_thread').allocate_lock()):
    def connect(spec):
        import os, socket
        from json import loads
        open_socket, unix, getpid = socket.socket, socket.AF_UNIX, os.getpid
        def exchange(id, frame):
            with _lock:
                try:
                    if _state and _state[2] != getpid():
                        del _state[:]
                    if not _state:
                        conn = open_socket(unix)
                        conn.connect(path)
                        _state[:] = [conn, bytearray(), getpid()]
                    conn, buffer = _state[0], _state[1]
                    conn.sendall(frame + b'\n')
                    seen = 0
                    while True:
                        end = buffer.find(b'\n', seen)
                        if end < 0:
                            seen = len(buffer)
                            chunk = conn.recv(1 << 16)
                            if not chunk:
                                raise OSError('the host closed the connection')
                            buffer += chunk
                            continue
                        line = bytes(buffer[:end])
                        del buffer[:end + 1]
                        seen = 0
                        result = loads(line).get('tool_result') or {}
                        if result.get('id') == id:
                            return result
                except (OSError, ValueError):
                    if _state:
                        _state[0].close()
                        del _state[:]
                    return None
        return exchange
    return connect
