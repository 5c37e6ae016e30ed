// The warm Node.js of a pooled safe-run sandbox. The agent starts it before
// any code is known, so that Node's start-up and the preloaded modules are
// paid before the call, not during it; then the sandbox serves one run and
// is destroyed.
//
// Protocol: the modules to preload are in $SAFE_RUN_PRELOAD (comma-separated).
// After requiring them this driver writes "ready" to fd 4 and waits for
// commands on fd 3: "prime\n" is answered "primed" on fd 4 (there is
// nothing to prime: Node sandboxes are never restored from a checkpoint);
// "run\n" is followed by the run's argv: NUL-separated, ended by EOF. It
// then runs the script
// argv names (its first argument that is not an option) as `node argv...`
// would, as the main module.
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
fs.writeSync(4, 'ready\n');

function readByte(fd) {
  const b = Buffer.alloc(1);
  for (;;) {
    try {
      return fs.readSync(fd, b, 0, 1, null) === 1 ? b[0] : -1;
    } catch (e) {
      if (e.code !== 'EAGAIN') throw e;
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 1);
    }
  }
}

function readCommand(fd) {
  let line = '';
  for (;;) {
    const c = readByte(fd);
    if (c < 0) return '';
    if (c === 10) return line;
    line += String.fromCharCode(c);
  }
}

let command;
while ((command = readCommand(3)) === 'prime') fs.writeSync(4, 'primed\n');
fs.closeSync(4);
if (command !== 'run') process.exit(0);

function readAll(fd) {
  const chunks = [];
  const buf = Buffer.alloc(65536);
  for (;;) {
    let n;
    try {
      n = fs.readSync(fd, buf, 0, buf.length, null);
    } catch (e) {
      if (e.code === 'EAGAIN') { Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 1); continue; }
      throw e;
    }
    if (n === 0) break;
    chunks.push(Buffer.from(buf.subarray(0, n)));
  }
  fs.closeSync(fd);
  return Buffer.concat(chunks);
}

const argv = readAll(3).toString().split('\0').filter(Boolean);
let i = 1;
while (argv[i].startsWith('-')) i++;
process.argv = [process.argv[0], path.resolve(argv[i]), ...argv.slice(i + 1)];
Module.runMain();
