def _execbox_empty(top, _os=__import__('os')):
    dirs, stack = [], [top]
    while stack:
        d = stack.pop()
        try:
            entries = list(_os.scandir(d))
        except OSError:
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    _os.chmod(e.path, 0o700)
                    stack.append(e.path)
                    dirs.append(e.path)
                else:
                    _os.unlink(e.path)
            except OSError:
                pass
    for d in reversed(dirs):
        try:
            _os.rmdir(d)
        except OSError:
            pass
