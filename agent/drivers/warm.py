# The warm Python of a pooled safe-run sandbox. The agent starts it before
# any code is known, so that the interpreter's start-up and the imports of
# the preloaded modules are paid before the call, not during it; then the
# sandbox serves one run and is destroyed.
#
# Protocol (see warmProgram in agent/warm.go): the modules to preload are in
# $SAFE_RUN_PRELOAD (comma-separated). After importing them this driver
# writes "ready" to fd 4 and reads messages on fd 3, each a line "COMMAND
# LENGTH" and LENGTH bytes. "prime" asks it to touch its memory (a sandbox
# restored from a checkpoint maps its pages back only when first touched,
# which would otherwise slow the run) and to reseed the random generators
# that every sandbox restored from one checkpoint would share; it answers
# "primed". "run" carries the code file to write, the output directory to
# make, whether the user site may have changed, and the run's argv; the
# driver writes the file (or answers "fail MSG" and exits), closes both its
# descriptors, so that the program has only its
# stdio as a cold `python3 main.py` would, and runs the script argv names
# (its first argument that is not an option) as `python3 argv...` would, as
# __main__. At its end the driver names its process "srexit:CODE", with the
# code the script would have exited with, closes its stdio and exits; the
# agent takes the name, read once both pipes have ended, as the end of the
# run, and otherwise sees the exit itself.
import atexit
import builtins
import fcntl
import os
import stat
import sys
import traceback
import types

# What run and see_new_packages use is imported now, before "ready": an
# import during the run, even of a module already loaded, is work in its
# path.
import importlib  # noqa: E402
import site  # noqa: E402


def preload(names):
    # Preloading must not print: its output is nobody's.
    saved = os.dup(1), os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    try:
        for name in names:
            try:
                __import__(name)
            except BaseException:
                pass  # a missing module fails the user's own import, as it would cold
        if "matplotlib" in sys.modules:
            try:
                __import__("matplotlib.pyplot")
            except BaseException:
                pass
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (devnull,) + saved:
            os.close(fd)


# The command and status descriptors move out of the program's way, to
# descriptors it does not inherit: a cold `python3 main.py` has only 0-2.
CMD = fcntl.fcntl(3, fcntl.F_DUPFD_CLOEXEC, 100)
STATUS = fcntl.fcntl(4, fcntl.F_DUPFD_CLOEXEC, 100)
os.close(3)
os.close(4)
# The end of the run is said in the process's name (see finish), through
# prctl: loaded now, before any program can replace what it finds.
import ctypes  # noqa: E402

_prctl = ctypes.CDLL(None, use_errno=True).prctl
PR_SET_NAME = 15
# A sleep that keeps the interpreter's lock (see finish): through PyDLL,
# which does not release it around the call.
_usleep_locked = ctypes.PyDLL(None).usleep


def read_message():
    data = b""
    while b"\n" not in data:
        chunk = os.read(CMD, 65536)
        if not chunk:
            return "", b""
        data += chunk
    head, _, payload = data.partition(b"\n")
    command, _, size = head.decode().partition(" ")
    size = int(size or 0)
    while len(payload) < size:
        chunk = os.read(CMD, max(65536, size - len(payload)))
        if not chunk:
            return "", b""
        payload += chunk
    return command, payload


def parse_run(payload):
    name, mode, size, rest = payload.split(b"\0", 3)
    size = int(size)
    data, rest = rest[:size], rest[size:]
    fields = rest.split(b"\0")
    decode = lambda b: b.decode("utf-8", "surrogateescape")
    return (decode(name), int(mode or b"0", 8), data, decode(fields[0]), fields[1] == b"1",
            [decode(a) for a in fields[2:-1]])


# Inside gVisor a system call on the way to the program and back costs a
# few µs once the sandbox is busy and up to 0.1-0.5 ms on one that waited
# idle in the pool, so the steps below take the fewest: the umask and the
# working directory, which nothing changes before the run, are read now.
UMASK = os.umask(0o022)
os.umask(UMASK)
CWD = os.getcwd()


def abspath(path):
    # os.path.abspath without its getcwd.
    return os.path.normpath(os.path.join(CWD, path))


def write_code(name, mode, data):
    # As the agent writes files: exactly mode, never through a link. A file
    # this open creates has mode already unless the umask clears some of
    # its bits; one that was there is truncated and gets mode.
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    created = True
    try:
        fd = os.open(name, flags | os.O_EXCL, mode)
    except FileExistsError:
        fd = os.open(name, flags | os.O_TRUNC, mode)
        created = False
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if not created or mode & UMASK:
            os.fchmod(fd, mode)
    finally:
        os.close(fd)


def make_dir(path):
    # As the agent does: each missing component with mode 0755; one that
    # was there must be a directory, not a link to one.
    done = ""
    for part in path.split("/"):
        done = os.path.join(done, part)
        try:
            os.mkdir(done, 0o755)
            continue
        except FileExistsError:
            pass
        if not stat.S_ISDIR(os.lstat(done).st_mode):
            raise OSError("create %s: %s is not a directory" % (path, done))


def prime():
    import io
    import tempfile

    # Go once through what the run does, in a scratch directory of /tmp
    # removed at once: restored memory is mapped back as it is first
    # touched, and these paths would otherwise pay for it during the run.
    # Only these paths: a gc.collect() here, which touches the whole heap,
    # cost 85-125 ms of CPU per restore and made no run measurably faster.
    scratch = tempfile.mkdtemp(prefix=".safe-run-prime-")
    try:
        write_code(os.path.join(scratch, "main.py"), 0o644, b"print(1)\n")
        os.mkdir(os.path.join(scratch, "out"), 0o755)
        stat.S_ISDIR(os.lstat(scratch).st_mode)
        with open(os.path.join(scratch, "main.py"), "rb") as f:
            code = compile(f.read(), "main.py", "exec")
        saved, sys.stdout = sys.stdout, io.StringIO()
        try:
            exec(code, {"__name__": "__prime__"})
        finally:
            sys.stdout = saved
        see_new_packages()
        # The end of a run names the process through ctypes: the first
        # call after a restore maps libffi's pages back. The name stays.
        _prctl(PR_SET_NAME, b"python3", 0, 0, 0)
        _usleep_locked(0)
        sys.stdout.flush()
        sys.stderr.flush()
        rehearse_exit()
        rehearse_allocations()
    except OSError:
        pass
    finally:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
    tempfile._name_sequence = None  # drew names above; reseeded anew


def rehearse_exit():
    # The atexit functions the preloads register run at the end of every
    # run, and after a restore their first call pays for mapping their
    # pages back (PIL's clear_cache alone 0.4-1.2 ms). Only those that
    # leave nothing behind when called now are rehearsed. (Flushing
    # logging's handlers, logging.shutdown without its close, did not
    # make it measurably faster.)
    image = sys.modules.get("PIL.Image")
    if image is not None:
        try:
            image.core.clear_cache()  # frees PIL's cache of image blocks
        except BaseException:
            pass
    helpers = sys.modules.get("matplotlib._pylab_helpers")
    if helpers is not None:
        try:
            if not helpers.Gcf.figs:
                helpers.Gcf.destroy_all()  # no figure yet: nothing to destroy
        except BaseException:
            pass
    # logging.shutdown, registered by the first import of logging, locks
    # and flushes each handler before closing it, and threading._shutdown
    # looks at the main thread and its list of locks: both are rehearsed as
    # far as leaves nothing changed, each lock taken only if it is free.
    # Measured (2026-12-06, the driver timing each of a warm run's exit
    # steps, 6 calls each): logging.shutdown p50 0.55 against 1.2 ms,
    # threading._shutdown 0.62 against 0.8 ms.
    logging = sys.modules.get("logging")
    if logging is not None:
        try:
            for ref in reversed(logging._handlerList[:]):
                handler = ref()
                if handler is not None and handler.lock is not None and handler.lock.acquire(blocking=False):
                    try:
                        handler.flush()
                    finally:
                        handler.lock.release()
        except BaseException:
            pass
    threading = sys.modules.get("threading")
    if threading is not None:
        try:
            threading._main_thread._is_stopped
            threading._main_thread.ident == threading.get_ident()
            threading._main_thread._tstate_lock.locked()
            if threading._shutdown_locks_lock.acquire(blocking=False):
                try:
                    list(threading._shutdown_locks)
                finally:
                    threading._shutdown_locks_lock.release()
            list(reversed(threading._threading_atexits))
        except BaseException:
            pass


def rehearse_allocations():
    # A restored heap is mapped back page by page as it is first touched,
    # and a run's first allocations land in free blocks of the allocator
    # that no step above touched: each such page cost the run a fault,
    # 15-35 µs in a sandbox that waited idle. Parsing a run's message and
    # making a few thousand small objects of the common kinds and sizes,
    # freed at once, touches the blocks the run then reuses. Measured
    # (2026-12-06): the driver timing its own steps of a warm print(1),
    # from the message to its end 3.1-4.4 ms against 4.8-5.8; side by side
    # (bench -warm -runs 15 -baseline), MCP p50 print(1) 13.6 against 14.2
    # ms, 30,000 small objects 43.3 against 61.1 ms; the prime takes 35-40
    # ms longer, restore + prime CPU 837 against 817 ms (bench -cpu).
    parse_run(b"main.py\0" b"644\0" b"8\0" b"print(1)out\0\0python3\0-u\0main.py\0")
    types.ModuleType("__main__")
    abspath("main.py")
    made = [(i, str(i), float(i), [i], {"k": i}, b"x" * (i % 700), "y" * (i % 300)) for i in range(4000)]
    del made


def exit_code(e):
    # As the interpreter treats an uncaught SystemExit.
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xFF
    try:
        print(e.code, file=sys.stderr)
    except BaseException:
        pass
    return 1


def reseed():
    # A pooled sandbox may be one of many restored from one checkpoint:
    # the generators the preloads seeded would repeat in each of them.
    r = sys.modules.get("random")
    if r is not None:
        r.seed()
    np = sys.modules.get("numpy")
    if np is not None:
        try:
            np.random.seed()
        except BaseException:
            pass
    tf = sys.modules.get("tempfile")
    if tf is not None:
        tf._name_sequence = None


def see_new_packages():
    """Puts packages the install step put in the user site on sys.path: it
    ran after this interpreter started, when site skipped the directory."""
    user_site = site.getusersitepackages()
    if not os.path.isdir(user_site):
        return  # nothing was installed there
    if site.ENABLE_USER_SITE and user_site not in sys.path:
        site.addsitedir(user_site)
    importlib.invalidate_caches()


def run(argv, written, source, new_site):
    """Runs the script argv names as __main__. written is the file the
    driver wrote, with source its bytes (None: read the file), which are
    compiled without reading the file back; new_site says the agent wrote files or installed packages
    since the prime, which saw the user site last."""
    i = 1
    while argv[i].startswith("-"):
        i += 1
    path = abspath(argv[i])
    sys.argv = argv[i:]
    sys.path[0] = os.path.dirname(path)
    if new_site:
        see_new_packages()
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    code = 0
    interrupted = False
    try:
        if source is None or abspath(written) != path:
            with open(path, "rb") as f:
                source = f.read()
        exec(compile(source, path, "exec"), main.__dict__)
    except SystemExit as e:
        code = exit_code(e)
    except BaseException as e:
        # Hide this driver's frame: the traceback starts in the user's file.
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)
        code = 1
        interrupted = isinstance(e, KeyboardInterrupt)
    # As at the interpreter's exit: wait for non-daemon threads, then run
    # the atexit functions.
    threading = sys.modules.get("threading")
    if threading is not None:
        try:
            threading._shutdown()
        except BaseException:
            traceback.print_exc()
    try:
        atexit._run_exitfuncs()
    except SystemExit as e:
        code = exit_code(e)
    except BaseException:
        traceback.print_exc()
    finish(code, interrupted)


def finish(code, interrupted):
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except BaseException:
            pass
    if interrupted:
        # As the interpreter ends after an uncaught KeyboardInterrupt:
        # killed by SIGINT, which the agent sees as it would cold.
        import signal

        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    # Say the exit code in the process's name, then close the stdio: the
    # agent, seeing both pipes end, reads the name and ends the run without
    # waiting for the exit, which takes 10-15 ms inside gVisor with numpy
    # loaded. What the program left running keeps its own copies of the
    # stdio, and the agent then waits for the exit as for a cold run.
    # Closed, not pointed at /dev/null: the program may have used up every
    # descriptor (the threat suite's T25 does). All three in one system
    # call: the agent waits for stdout's end alone, and by the time it
    # wakes stderr's, closed in the same call, is there too, one wake-up
    # instead of one per pipe. (closerange ignores descriptors already
    # closed.)
    _prctl(PR_SET_NAME, b"srexit:%d" % code, 0, 0, 0)
    os.closerange(0, 3)
    # Exit only after a moment, which the agent's kill, sent once its Exit
    # is on its way, usually cuts short: the exit of an interpreter with
    # numpy loaded keeps the sandbox busy for 10-15 ms, and begun now it
    # slowed the agent's end of the run by about 1 ms. When a process the
    # program left holds the stdio, the agent waits for this exit instead,
    # which then comes this much later. The sleep keeps the interpreter's
    # lock, so that the program's daemon threads stay as still as an exit
    # would leave them.
    _usleep_locked(10000)
    # Skip the interpreter's teardown of every module: the sandbox is
    # destroyed next, and nothing the user can see happens there.
    os._exit(code)


preload([m for m in os.environ.pop("SAFE_RUN_PRELOAD", "").split(",") if m])
# What the interpreter holds now (the preloads: some 87,000 objects with
# pandas) leaves the garbage collector's generations for good, and so does
# what the prime makes (below). The run's collections then walk only its own
# objects: in a sandbox restored from a checkpoint, a collection that walked
# the preloaded heap mapped it back page by page. Measured (2026-12-06, warm
# MCP calls, the program timing itself): 30,000 small objects made in 45 ms
# against 200-220 ms (a full collection), 3,000 in 4 against 8-10 ms. A
# program sees it only in gc.get_freeze_count() and gc.get_objects(), which
# leave the frozen objects out; gc.unfreeze() undoes it.
import gc  # noqa: E402

_freeze = getattr(gc, "freeze", lambda: None)  # Python 3.7 and later
_freeze()
os.write(STATUS, b"ready\n")
while True:
    command, payload = read_message()
    if command == "prime":
        reseed()
        prime()
        _freeze()
        os.write(STATUS, b"primed\n")
        continue
    break
if command != "run":
    os._exit(0)  # the agent is gone or confused; there is nothing to run
name, mode, data, out_dir, new_site, argv = parse_run(payload)
try:
    if name:
        write_code(name, mode, data)
    if out_dir:
        make_dir(out_dir)
except OSError as e:
    os.write(STATUS, ("fail write %r: %s\n" % (name, e)).encode("utf-8", "replace"))
    os._exit(1)
# Nothing of the driver's stays open for the program: a status descriptor
# it could write to would let it end its run with a forged report (the
# threat suite's T6 checks that a run has only its stdio). Both in one
# system call where they are neighbours, as they were made.
if STATUS == CMD + 1:
    os.closerange(CMD, STATUS + 1)
else:
    os.close(CMD)
    os.close(STATUS)
# The code is compiled from the bytes just written, unless its owner cannot
# read the file: a cold python3 would fail to open it.
run(argv, name, data if name and mode & 0o400 else None, new_site)
