# execbox's availability probe (src/backends/kubernetes/probe.rs): runs as a
# Kubernetes run's program, in the run's exact pod shape, and prints one
# JSON object of what it can see and do. The host judges it.
import errno, importlib.util, json, os, socket, sys

seen = {}
status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
seen["uid"] = os.getuid()
seen["cap_eff"] = status.get("CapEff", "").strip()
seen["no_new_privs"] = status.get("NoNewPrivs", "").strip()
seen["seccomp"] = status.get("Seccomp", "").strip()
seen["links_up"] = [n for _, n in socket.if_nameindex() if n != "lo"
                    and open("/sys/class/net/%s/operstate" % n).read().strip() != "down"]
seen["routes"] = len(open("/proc/net/route").read().splitlines()) - 1


def connect(host, port):
    c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    c.settimeout(2)
    try:
        c.connect((host, port))
        return "connected"
    except ConnectionRefusedError:
        return "refused"
    except OSError as e:
        return errno.errorcode.get(e.errno, "timeout")
    finally:
        c.close()


seen["outside"] = connect("192.0.2.1", 80)  # TEST-NET-1: only a route decides
seen["token"] = os.path.exists("/var/run/secrets/kubernetes.io")
try:
    open("/usr/execbox-probe", "w")
    seen["root_writable"] = True
except OSError:
    seen["root_writable"] = False
st = os.statvfs("/tmp")
seen["tmp_bytes"] = st.f_blocks * st.f_frsize
st = os.statvfs("/dev/shm")
seen["shm_bytes"] = st.f_blocks * st.f_frsize
seen["kubernetes_env"] = sorted(k for k in os.environ if k.startswith("KUBERNETES_"))
# execbox's own seccomp profile refuses io_uring (EPERM); RuntimeDefault
# (docker's profile) lets the call reach the kernel (EFAULT for no params).
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
seen["io_uring_errno"] = ctypes.get_errno() if libc.syscall(425, 0, 0) == -1 else 0
seen["packages"] = [p for p in sys.argv[1:] if importlib.util.find_spec(p) is not None]
print(json.dumps(seen))
