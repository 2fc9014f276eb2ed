import t from 'tap';
import { Writable } from 'node:stream';
import { createLogger, RepeatedFailureLog } from '../../core/log.js';

function capture(): { lines: Record<string, unknown>[]; stream: Writable } {
  const lines: Record<string, unknown>[] = [];
  const stream = new Writable({
    write(chunk: Buffer, _enc, cb) {
      for (const l of chunk.toString('utf8').split('\n'))
        if (l !== '') lines.push(JSON.parse(l) as Record<string, unknown>);
      cb();
    },
  });
  return { lines, stream };
}

t.test('a repeating failure is logged once per interval with a count, a new code at once, a recovery once', (t) => {
  const { lines, stream } = capture();
  let now = 0;
  const rep = new RepeatedFailureLog(createLogger({ level: 'info', name: 't', destination: stream }), 'claim failed', {
    intervalMs: 1000,
    now: () => now,
  });
  const refused = Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' });
  for (let i = 0; i < 50; i++) rep.fail(refused);
  t.equal(lines.length, 1, 'fifty failures within the interval: one line');
  t.equal((lines[0]?.err as { code?: string }).code, 'ECONNREFUSED');
  rep.fail(Object.assign(new Error('disk full'), { code: '53100' }));
  t.equal(lines.length, 2, 'another code is logged at once');
  now = 1500;
  rep.fail(refused);
  t.equal(lines.length, 3);
  t.equal(lines[2]?.repeated, 50, 'the line after the interval counts the 49 suppressed plus itself');
  t.notOk('err' in (lines[2] ?? {}), 'repeats carry no stack');
  rep.ok();
  rep.ok();
  t.equal(lines.length, 4, 'recovery logged once');
  t.equal(lines[3]?.failures, 52);
  rep.fail(refused);
  t.equal(lines.length, 5, 'after a recovery the next failure is logged at once');
  t.end();
});
