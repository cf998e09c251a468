def _execbox_shell_session(nonce, read_message):
    import json, os, subprocess
    marker = '\0execbox:' + nonce + ':'
    cell = '/tmp/.execbox-cell-' + nonce

    def start():
        # The shell writes each cell's status to a pipe of its own; the cell
        # runs without that pipe (and with stdin /dev/null).
        read_end, write_end = os.pipe()
        shell = subprocess.Popen(['/bin/bash', '--norc', '--noprofile'], stdin=subprocess.PIPE,
                                 pass_fds=(write_end,), cwd='/work')
        os.close(write_end)
        return shell, os.fdopen(read_end, 'rb'), write_end

    shell, statuses, fd = start()
    while True:
        source = read_message()
        if source is None:
            os._exit(0)
        _execbox_empty('/work/out')
        status = None
        try:
            try:
                os.unlink(cell)
            except FileNotFoundError:
                pass
            out = os.open(cell, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(out, 'wb') as f:
                f.write(source.encode('utf-8', 'surrogateescape'))
        except OSError as e:
            os.write(2, ('execbox: cannot write the cell to %s: %s\n' % (cell, e)).encode())
            status = 126
        if status is None:
            line = '. %s </dev/null %d>&-; builtin printf "%%d\\n" "$?" >&%d\n' % (cell, fd, fd)
            try:
                shell.stdin.write(line.encode())
                shell.stdin.flush()
                answer = statuses.readline()
            except OSError:
                answer = b''
            try:
                status = int(answer)
            except ValueError:
                # The shell is gone (the cell ran `exit`, or `exec`) or broke
                # its status line: its status is the cell's (a process the
                # cell exec'd is killed), and a new shell takes the next cell.
                shell.kill()
                code = shell.wait()
                status = code if code >= 0 else 128 - code
                os.write(2, b'execbox: the shell exited; the next cell runs in a new shell '
                            b'(variables, functions and the working directory are reset)\n')
                statuses.close()
                try:
                    shell.stdin.close()
                except OSError:
                    pass
                shell, statuses, fd = start()
        record = json.dumps({'status': status})
        record = (marker + 'R%d:%s\n' % (len(record), record)).encode()
        os.write(2, record)
        os.write(1, record)
