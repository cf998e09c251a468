# execbox's setup: the init container of a Kubernetes run
# (src/backends/kubernetes/). Root with CAP_NET_ADMIN and no other
# capability. 1. Takes every interface but lo off the network: no IPv4
# address, link down (which drops its routes); the unprivileged main
# container cannot bring them back. 2. Copies the run's files from the
# job's ConfigMap into /work (which the main container mounts read-only),
# and makes the mount point of /work/out.
import fcntl, json, os, shutil, socket, struct

s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _, name in socket.if_nameindex():
    if name == "lo":
        continue
    n = name.encode()
    try:  # SIOCSIFADDR 0.0.0.0 deletes the IPv4 address
        fcntl.ioctl(s, 0x8916, struct.pack("16sHH4s16s", n, socket.AF_INET, 0, bytes(4), b""))
    except OSError:
        pass  # none to remove
    flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16sH22s", n, 0, b""))[:18])[1]
    fcntl.ioctl(s, 0x8914, struct.pack("16sH22s", n, flags & ~1, b""))  # SIOCSIFFLAGS without IFF_UP

JOB = "/run/execbox/job"
files = json.load(open(JOB + "/files.json"))
for key, name in files["files"].items():
    path = os.path.normpath(os.path.join("/work", name))
    reserved = files["outputs"] and (path.startswith("/work/out/") or path == "/work/out")
    if not path.startswith("/work/") or reserved:
        raise SystemExit("execbox setup: refused file name %r" % name)
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    shutil.copyfile(os.path.join(JOB, key), path)  # the ConfigMap's own links
    os.chmod(path, 0o644)
if files["outputs"]:
    os.makedirs("/work/out", mode=0o755, exist_ok=True)
