// The warm Node.js of a pooled safe-run sandbox. The agent starts it before
// any code is known, so that Node's start-up and the preloaded modules are
// paid before the call, not during it; then the sandbox serves one run and
// is destroyed.
//
// Protocol: the modules to preload are in $SAFE_RUN_PRELOAD (comma-separated).
// After requiring them this driver writes "ready" to fd 4 and waits on fd 3
// for the run's argv: NUL-separated, ended by EOF. It then runs the script
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
fs.closeSync(4);

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
