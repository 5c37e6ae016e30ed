// The persistent Node.js interpreter of a safe-run session. The agent
// starts it once (node --expose-internals) and sends it cells; globals and
// top-level declarations live on, as in the Node REPL, and top-level await
// works through the REPL's own rewriting.
//
// Protocol: on fd 3 the agent writes, per cell, the code, a NUL, the
// cell's standard input (ignored: cells read no input), a NUL. After the
// cell, this driver writes the end marker ($SAFE_RUN_MARKER) to stdout and stderr,
// then a status line to fd 4: "ok" or "error".
'use strict';
const fs = require('fs');
const vm = require('vm');
const util = require('util');
const { createRequire } = require('module');

const marker = process.env.SAFE_RUN_MARKER;
delete process.env.SAFE_RUN_MARKER;
let processTopLevelAwait = null;
try {
  ({ processTopLevelAwait } = require('internal/repl/await'));
} catch { /* without --expose-internals, top-level await is a syntax error */ }

// Cells require modules as a file in /workspace would.
globalThis.require = createRequire('/workspace/cell.js');

function write(fd, s) {
  return new Promise((resolve) => fs.write(fd, s, () => resolve()));
}

async function runCell(n, code) {
  const filename = `cell ${n}`;
  let wrapped = null;
  if (processTopLevelAwait && /\bawait\b/.test(code)) {
    try { wrapped = processTopLevelAwait(code); } catch { wrapped = null; }
  }
  let value;
  if (wrapped) {
    const result = await vm.runInThisContext(wrapped, { filename, breakOnSigint: true });
    value = result ? result.value : undefined;
  } else {
    value = vm.runInThisContext(code, { filename, breakOnSigint: true });
    if (value instanceof Promise) value = await value;
  }
  if (value !== undefined) console.log(util.inspect(value, { colors: false }));
}

async function main() {
  const input = fs.createReadStream(null, { fd: 3 });
  let buffered = Buffer.alloc(0);
  let n = 0;
  for await (const chunk of input) {
    buffered = Buffer.concat([buffered, chunk]);
    for (;;) {
      const a = buffered.indexOf(0);
      const b = a < 0 ? -1 : buffered.indexOf(0, a + 1);
      if (b < 0) break;
      const code = buffered.subarray(0, a).toString();
      buffered = buffered.subarray(b + 1);
      let status = 'ok';
      try {
        await runCell(++n, code);
      } catch (err) {
        status = 'error';
        console.error(err && err.stack ? err.stack : util.inspect(err));
      }
      await write(1, marker);
      await write(2, marker);
      await write(4, status + '\n');
    }
  }
}

process.on('uncaughtException', (err) => console.error('Uncaught', err && err.stack ? err.stack : err));
process.on('unhandledRejection', (err) => console.error('Unhandled rejection:', err && err.stack ? err.stack : err));
main();
