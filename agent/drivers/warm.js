// The warm Node.js of a pooled safe-run sandbox. The agent starts it before
// any code is known, so that Node's start-up and the preloaded modules are
// paid before the call, not during it; then the sandbox serves one run and
// is destroyed.
//
// Protocol (see warmProgram in agent/warm.go): the modules to preload are in
// $SAFE_RUN_PRELOAD (comma-separated). After requiring them this driver
// writes "ready" to fd 4 and reads messages on fd 3, each a line "COMMAND
// LENGTH" and LENGTH bytes. "prime" is answered "primed" (there is nothing
// to prime: Node sandboxes are never restored from a checkpoint). "run"
// carries the code file to write, the output directory to make and the
// run's argv; it then runs the script argv names (its first argument that
// is not an option) as `node argv...` would, as the main module, once it
// has closed fd 4: the program has only its stdio, as a cold `node main.js`
// would. At its normal end it names its process "srexit:CODE" and closes its
// stdio, which the agent takes as the end of the run.
'use strict';
const fs = require('fs');
const path = require('path');
const Module = require('module');

const preload = (process.env.SAFE_RUN_PRELOAD || '').split(',').filter(Boolean);
delete process.env.SAFE_RUN_PRELOAD;
const requireHere = Module.createRequire('/workspace/main.js');
for (const name of preload) {
  try { requireHere(name); } catch { /* the user's own require fails as it would cold */ }
}

// What a run's first console.log and the loading of its file would start
// lazily starts now: the stdio streams, the console's formatting, the
// CommonJS loader's way through a file (compiled on first use). Inside
// gVisor these first uses cost over 20 ms. The scratch module is in /tmp,
// and removed.
// Empty writes take the real streams' way to their pipes (a write of no
// bytes, which the agent never sees) without writing anything.
process.stdout.write('');
process.stderr.write('');
{
  const { Console } = require('console');
  const { Writable } = require('stream');
  new Console(new Writable({ write(chunk, enc, cb) { cb(); } })).log('%s %d', 'warm', 1, { a: [1] });
  const scratch = fs.mkdtempSync('/tmp/.safe-run-warm-');
  try {
    const file = path.join(scratch, 'main.js');
    const fd = fs.openSync(file, fs.constants.O_WRONLY | fs.constants.O_CREAT | fs.constants.O_EXCL | fs.constants.O_NOFOLLOW, 0o644);
    fs.writeSync(fd, Buffer.from('module.exports = 1;\n'));
    fs.closeSync(fd);
    fs.mkdirSync(path.join(scratch, 'out'), 0o755);
    fs.lstatSync(path.join(scratch, 'out'));
    requireHere(file);
    delete require.cache[file];
    path.resolve('main.js');
  } catch { /* only a warm-up */ }
  fs.rmSync(scratch, { recursive: true, force: true });
}
// Inside gVisor a system call on the way to the program costs a few µs
// once the sandbox is busy and up to 0.1-0.5 ms on one that waited idle in
// the pool: the umask, which nothing changes before the run, is read now.
const umask = process.umask(0o022);
process.umask(umask);
// Whether a script this driver writes can only load as CommonJS, whatever
// it holds (see loadsFromMemory): no package.json above the working
// directory, which is no link, and no NODE_OPTIONS (a loader there would
// take the main module). Read now, off the run's path.
const commonJSHere = !process.env.NODE_OPTIONS && fs.realpathSync(process.cwd()) === process.cwd() &&
  (() => {
    for (let dir = process.cwd(); ; dir = path.dirname(dir)) {
      if (fs.existsSync(path.join(dir, 'package.json'))) return false;
      if (dir === path.dirname(dir)) return true;
    }
  })();
fs.writeSync(4, 'ready\n');

function readSome(fd, buf) {
  for (;;) {
    try {
      return fs.readSync(fd, buf, 0, buf.length, null);
    } catch (e) {
      if (e.code !== 'EAGAIN') throw e;
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 1);
    }
  }
}

// readMessage returns the next message's command and bytes ('' at EOF).
let pending = Buffer.alloc(0);
function readMessage() {
  const buf = Buffer.alloc(65536);
  let nl;
  while ((nl = pending.indexOf(10)) < 0) {
    const n = readSome(3, buf);
    if (n === 0) return ['', null];
    pending = Buffer.concat([pending, buf.subarray(0, n)]);
  }
  const [command, size] = pending.subarray(0, nl).toString().split(' ');
  const want = nl + 1 + Number(size || 0);
  while (pending.length < want) {
    const n = readSome(3, buf);
    if (n === 0) return ['', null];
    pending = Buffer.concat([pending, buf.subarray(0, n)]);
  }
  const payload = pending.subarray(nl + 1, want);
  pending = pending.subarray(want);
  return [command, payload];
}

let command, payload;
while (([command, payload] = readMessage())[0] === 'prime') fs.writeSync(4, 'primed\n');
if (command !== 'run') process.reallyExit(0);
fs.closeSync(3);

// The run: NUL-ended fields name, octal mode, length, the code's bytes,
// then the output directory, whether the agent wrote other files or
// installed packages ("1") and the argv.
const field = (from) => { const end = payload.indexOf(0, from); return [payload.subarray(from, end).toString(), end + 1]; };
let at = 0;
let name, mode, size, outDir, wrote;
[name, at] = field(at);
[mode, at] = field(at);
[size, at] = field(at);
const code = payload.subarray(at, at + Number(size));
at += Number(size);
[outDir, at] = field(at);
[wrote, at] = field(at);
const argv = [];
while (at < payload.length) {
  let a;
  [a, at] = field(at);
  argv.push(a);
}

try {
  if (name) {
    // As the agent writes files: exactly mode, never through a link. A
    // file this open creates has mode already unless the umask clears some
    // of its bits; one that was there is truncated and gets mode.
    const m = parseInt(mode, 8);
    const flags = fs.constants.O_WRONLY | fs.constants.O_CREAT | fs.constants.O_NOFOLLOW;
    let fd, created = true;
    try {
      fd = fs.openSync(name, flags | fs.constants.O_EXCL, m);
    } catch (e) {
      if (e.code !== 'EEXIST') throw e;
      fd = fs.openSync(name, flags | fs.constants.O_TRUNC, m);
      created = false;
    }
    fs.writeSync(fd, code);
    if (!created || (m & umask)) fs.fchmodSync(fd, m);
    fs.closeSync(fd);
  }
  if (outDir) {
    // As the agent does: each missing component with mode 0755; one that
    // was there must be a directory, not a link to one.
    let done = '';
    for (const part of outDir.split('/')) {
      done = done ? done + '/' + part : part;
      try { fs.mkdirSync(done, 0o755); continue; } catch (e) { if (e.code !== 'EEXIST') throw e; }
      if (!fs.lstatSync(done).isDirectory()) throw new Error(`create ${outDir}: ${done} is not a directory`);
    }
  }
} catch (e) {
  fs.writeSync(4, `fail write ${JSON.stringify(name)}: ${String(e.message).replace(/\n/g, ' ')}\n`);
  process.reallyExit(1);
}

// Nothing of the driver's stays open for the program: a status descriptor
// it could write to would let it end its run with a forged report.
fs.closeSync(4);

// At the process's normal exit, after every 'exit' listener, say the exit
// code in the process's name ("srexit:CODE"; libuv sets it with prctl) and
// close the stdio: the agent, seeing both pipes end, reads the name and
// ends the run without waiting for the exit. An uncaught exception emits
// 'exit' before Node prints it: leave that exit to Node.
let fatal = false;
process.on('uncaughtExceptionMonitor', () => { fatal = true; });
const emit = process.emit;
process.emit = function (event, ...args) {
  const result = emit.apply(this, [event, ...args]);
  if (event === 'exit' && !fatal) {
    let code = process.exitCode === undefined ? args[0] : process.exitCode;
    code = (Number(code) | 0) & 0xff;
    try { process.title = `srexit:${code}`; } catch { /* the agent sees the exit */ }
    // Stdout last: the agent waits for its end alone (see warm.py).
    for (const fd of [2, 0, 1]) {
      try { fs.closeSync(fd); } catch { /* already closed by the program */ }
    }
    process.reallyExit(code);
  }
  return result;
};

let i = 1;
while (argv[i].startsWith('-')) i++;
process.argv = [process.argv[0], path.resolve(argv[i]), ...argv.slice(i + 1)];
if (loadsFromMemory()) {
  // The loader finds the main module at its path without a stat and
  // compiles it from the bytes written above instead of reading the file
  // back: five system calls fewer, each 0.1 ms or more inside gVisor in a
  // sandbox that waited idle. Module._pathCache and Module._extensions are
  // the loader's monkey-patchable tables; the handler is put back at once.
  const file = process.argv[1];
  Module._pathCache[file + '\x00'] = file;
  const loadJS = Module._extensions['.js'];
  Module._extensions['.js'] = function (module, filename) {
    Module._extensions['.js'] = loadJS;
    if (filename !== file) return loadJS.call(this, module, filename);
    module._compile(code.toString('utf8'), filename);
  };
}
Module.runMain();

// loadsFromMemory says whether the main module is the file written above
// and would load as CommonJS from exactly those bytes: a .js file that its
// owner may read, run as `node FILE` with no options, no package.json that
// could make it an ES module (commonJSHere; the agent wrote no other file),
// and no import or export anywhere in it, which newer Node versions would
// take as an ES module's syntax. Otherwise the loader reads the file as it
// would cold.
function loadsFromMemory() {
  return commonJSHere && name !== '' && wrote !== '1' && i === 1 && name.endsWith('.js') &&
    (parseInt(mode, 8) & 0o400) !== 0 && path.resolve(name) === process.argv[1] &&
    !/\b(import|export)\b/.test(code.toString('latin1'));
}
