# The warm Python of a pooled safe-run sandbox. The agent starts it before
# any code is known, so that the interpreter's start-up and the imports of
# the preloaded modules are paid before the call, not during it; then the
# sandbox serves one run and is destroyed.
#
# Protocol: the modules to preload are in $SAFE_RUN_PRELOAD (comma-separated).
# After importing them this driver writes "ready" to fd 4 and waits for
# commands on fd 3. "prime\n" asks it to touch its memory (a sandbox
# restored from a checkpoint maps its pages back only when first touched,
# which would otherwise slow the run); it answers "primed" on fd 4.
# "run\n" is followed by the run's argv: NUL-separated, ended by EOF. It then runs the script
# argv names (its first argument that is not an option) as `python3 argv...`
# would, as __main__, and exits with the code the script would have exited
# with.
import os
import sys


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


def read_command():
    line = b""
    while not line.endswith(b"\n"):
        b = os.read(3, 1)
        if not b:
            return ""
        line += b
    return line.decode().strip()


def prime():
    import gc
    gc.collect()  # visits every tracked object: most of the heap


def read_argv():
    data = b""
    while True:
        chunk = os.read(3, 65536)
        if not chunk:
            break
        data += chunk
    os.close(3)
    return [a.decode("utf-8", "surrogateescape") for a in data.split(b"\0") if a]


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
    import importlib
    import site

    user_site = site.getusersitepackages()
    if site.ENABLE_USER_SITE and user_site not in sys.path and os.path.isdir(user_site):
        site.addsitedir(user_site)
    importlib.invalidate_caches()


def run(argv):
    import atexit
    import builtins
    import traceback
    import types

    i = 1
    while argv[i].startswith("-"):
        i += 1
    path = os.path.abspath(argv[i])
    sys.argv = argv[i:]
    sys.path[0] = os.path.dirname(path)
    see_new_packages()
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    code = 0
    try:
        with open(path, "rb") as f:
            source = f.read()
        exec(compile(source, path, "exec"), main.__dict__)
    except SystemExit as e:
        code = exit_code(e)
    except BaseException as e:
        # Hide this driver's frame: the traceback starts in the user's file.
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)
        code = 1
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
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    # Skip the interpreter's teardown of every module: the sandbox is
    # destroyed next, and nothing the user can see happens there.
    os._exit(code)


preload([m for m in os.environ.pop("SAFE_RUN_PRELOAD", "").split(",") if m])
os.write(4, b"ready\n")
while True:
    command = read_command()
    if command == "prime":
        prime()
        os.write(4, b"primed\n")
        continue
    break
os.close(4)
if command != "run":
    os._exit(0)  # the agent is gone or confused; there is nothing to run
argv = read_argv()
reseed()
run(argv)
