SESSION = object()
def read_message(_read=__import__('os').read):
    header = b''
    while not header.endswith(b'\n'):
        if len(header) > 20:
            return None
        chunk = _read(0, 1)
        if not chunk:
            return None
        header += chunk
    if header == b'S\n':
        return SESSION
    size = int(header)
    data = bytearray()
    while len(data) < size:
        chunk = _read(0, size - len(data))
        if not chunk:
            return None
        data += chunk
    return data.decode('utf-8')
