# The persistent Python interpreter of a safe-run session. The agent starts
# it once and sends it cells; variables, functions and imports live on in
# one namespace, as in an interactive interpreter.
#
# Protocol: on fd 3 the agent writes, per cell, the code, a NUL, the cell's
# standard input, a NUL. After the cell, this driver flushes stdout and
# stderr, writes the end marker ($SAFE_RUN_MARKER) to both, and then a status line to
# fd 4: "ok", "error", "interrupted", or "exit N".
import ast
import importlib
import io
import linecache
import os
import site
import sys
import traceback
import warnings

marker = os.environ.pop("SAFE_RUN_MARKER")
commands = os.fdopen(3, "rb")
status_out = os.fdopen(4, "w", buffering=1)
namespace = {"__name__": "__main__", "__builtins__": __builtins__}
figures = 0
# plt.show() has nothing to show on: figures come back as images instead.
warnings.filterwarnings("ignore", message=".*non-interactive.*")


def read_field():
    data = bytearray()
    while True:
        b = commands.read(1)
        if not b:
            return None
        if b == b"\0":
            return bytes(data)
        data += b


def see_new_packages():
    """Puts packages installed since this interpreter started on sys.path.

    pip install --user (an install step, or pip run by an earlier cell)
    creates the user site directory after startup, when site skipped it.
    """
    user_site = site.getusersitepackages()
    if site.ENABLE_USER_SITE and user_site not in sys.path and os.path.isdir(user_site):
        site.addsitedir(user_site)
    importlib.invalidate_caches()


def run_cell(n, code):
    see_new_packages()
    name = "<cell %d>" % n
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    tree = ast.parse(code, filename=name, mode="exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, name, "exec"), namespace)
    if last is not None:
        value = eval(compile(last, name, "eval"), namespace)
        if value is not None:
            namespace["_"] = value
            print(repr(value))


def save_figures():
    """Saves every figure left open into out/, then closes them all."""
    global figures
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    for num in plt.get_fignums():
        figures += 1
        try:
            plt.figure(num).savefig("/workspace/out/figure-%d.png" % figures)
        except Exception:
            traceback.print_exc()
    plt.close("all")


def print_user_traceback():
    # Hide this driver's own frames: the user's code starts at the cell.
    kind, value, tb = sys.exc_info()
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell"):
        tb = tb.tb_next
    traceback.print_exception(kind, value, tb)


n = 0
while True:
    code = read_field()
    stdin = read_field()
    if code is None or stdin is None:
        break
    n += 1
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin))
    status = "ok"
    try:
        run_cell(n, code.decode())
    except SystemExit as e:
        status = "exit %d" % (e.code if isinstance(e.code, int) else (0 if e.code is None else 1))
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except KeyboardInterrupt:
        print_user_traceback()
        status = "interrupted"
    except BaseException:
        print_user_traceback()
        status = "error"
    try:
        save_figures()
    except BaseException:
        traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    os.write(1, marker.encode())
    os.write(2, marker.encode())
    status_out.write(status + "\n")
