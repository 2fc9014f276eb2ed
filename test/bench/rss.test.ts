/**
 * The worker-memory benchmark's reader (bench/rss.ts): VmRSS from /proc/<pid>/status, in bytes, for this
 * process and for a child, following what the process really holds.
 */
import t from 'tap';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import { parseVmRss, readRss } from '../../bench/rss.js';

const STATUS = `Name:\tnode
Umask:\t0022
State:\tS (sleeping)
VmPeak:\t 1234567 kB
VmSize:\t 1200000 kB
VmHWM:\t  120000 kB
VmRSS:\t   98765 kB
RssAnon:\t   60000 kB
Threads:\t11
`;

t.test('VmRSS is read in kB and returned in bytes; the other Vm lines are not taken for it', (t) => {
  t.equal(parseVmRss(STATUS), 98765 * 1024);
  t.equal(parseVmRss(STATUS.replace(/^VmRSS:.*\n/m, '')), null, 'no VmRSS line (a kernel thread): null');
  t.equal(parseVmRss(''), null);
  t.end();
});

t.test("this process's resident set, as the kernel reports it, grows when memory is touched", (t) => {
  const before = readRss(process.pid);
  const own = parseVmRss(readFileSync('/proc/self/status', 'utf8'));
  t.ok(own !== null && Math.abs(before - own) < 64 * 2 ** 20, 'it reads the same figure as /proc/self/status');
  const block = Buffer.alloc(128 * 2 ** 20, 1); // filled: every page touched
  const after = readRss(process.pid);
  t.ok(after - before > 100 * 2 ** 20, `128 MB touched: RSS grew by ${((after - before) / 2 ** 20).toFixed(0)} MB`);
  t.equal(block[block.length - 1], 1);
  t.end();
});

t.test("a child process's resident set, and a process that is gone", async (t) => {
  const child = spawn(
    process.execPath,
    ['-e', "const b = Buffer.alloc(96 * 2 ** 20, 1); process.stdout.write('ready'); setInterval(() => b[0]++, 1000);"],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  const pid = child.pid!;
  await once(child.stdout, 'data');
  t.ok(readRss(pid) > 96 * 2 ** 20, `the child holds its 96 MB (${(readRss(pid) / 2 ** 20).toFixed(0)} MB)`);
  child.kill('SIGTERM');
  await once(child, 'exit');
  t.throws(() => readRss(pid), 'a process that exited has no status to read');
});
