/**
 * Logs at a terminal and elsewhere: the same logger writes JSON lines (exactly pino's) to a pipe and lines a person
 * reads to a terminal, with the same redaction in both; the terminal decision can be forced either way.
 */
import t from 'tap';
import { Writable } from 'node:stream';
import { createLogger } from '../../core/log.js';
import { atTerminal, prettyDestination, prettyLine } from '../../core/log-terminal.js';

const SECRETS = {
  arguments: { card: '4111-1111-1111-1111' },
  password: 'hunter2-password',
  headers: { authorization: 'Bearer alt_secret_token' },
  body: 'the whole body',
};

function logBoth(): { json: string[]; pretty: string[] } {
  const json: string[] = [];
  const pretty: string[] = [];
  const stream = new Writable({
    write(chunk: Buffer, _enc, cb) {
      json.push(...chunk.toString('utf8').split('\n').filter(Boolean));
      cb();
    },
  });
  for (const destination of [stream, prettyDestination((text) => pretty.push(text))]) {
    const log = createLogger({ level: 'info', name: 'service', destination, cluster: 'eu-1' });
    log.info({ host: '127.0.0.1', port: 7420, note: 'two words', ...SECRETS }, 'actionledger listening');
    log.warn({ err: Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' }) }, 'claim failed');
    log.debug('below the level');
  }
  return { json, pretty };
}

t.test('not at a terminal: one JSON object a line, redacted, as pino writes it', (t) => {
  const { json } = logBoth();
  t.equal(json.length, 2);
  const first = JSON.parse(json[0] ?? '') as Record<string, unknown>;
  t.match(first, { level: 30, name: 'service', cluster: 'eu-1', pid: process.pid, msg: 'actionledger listening' });
  t.match(first, { arguments: '[redacted]', password: '[redacted]', body: '[redacted]' });
  t.same(first.headers, { authorization: '[redacted]' });
  t.equal(Object.keys(first).slice(0, 4).join(','), 'level,time,pid,cluster', "pino's own field order");
  t.match(JSON.parse(json[1] ?? ''), { level: 40, err: { code: 'ECONNREFUSED', stack: /ECONNREFUSED/ } });
  t.end();
});

t.test('at a terminal: a line a person reads, redacted the same way, the stack below it', (t) => {
  const { pretty } = logBoth();
  t.equal(pretty.length, 2, 'one write a line, the level still applies');
  const [first = '', second = ''] = pretty;
  t.match(first, /^\d\d:\d\d:\d\d\.\d{3} INFO {2}service: actionledger listening {2}cluster=eu-1 /);
  t.match(first, / host=127\.0\.0\.1 port=7420 note="two words" /);
  t.match(first, /arguments=\[redacted\] password=\[redacted\] headers=\{"authorization":"\[redacted\]"\}/);
  for (const s of ['4111', 'hunter2', 'alt_secret', 'whole body']) t.notOk(first.includes(s), `no ${s}`);
  t.notOk(first.startsWith('{'), 'not JSON');
  t.ok(first.endsWith('\n') && first.indexOf('\n') === first.length - 1, 'one line');
  t.match(
    second,
    /^\d\d:\d\d:\d\d\.\d{3} WARN {2}service: claim failed {2}cluster=eu-1\n {4}Error: connect ECONNREFUSED\n {5,}at /,
  );
  t.match(second, /\n {4}code=ECONNREFUSED\n$/);
  t.end();
});

t.test('a line that is not a JSON object passes as it came', (t) => {
  t.equal(prettyLine('plain words\n'), 'plain words');
  t.equal(prettyLine('[1,2]'), '[1,2]');
  t.end();
});

t.test('ACTIONLEDGER_TERMINAL forces the decision; otherwise the fd says', (t) => {
  t.equal(atTerminal({ ACTIONLEDGER_TERMINAL: '1' }, 1), true);
  t.equal(atTerminal({ ACTIONLEDGER_TERMINAL: '0' }, 1), false);
  // The test runner's stdout is a pipe (or a file), never a terminal.
  t.equal(atTerminal({}, 1), false);
  t.equal(atTerminal({ ACTIONLEDGER_TERMINAL: 'yes' }, 1), false, 'anything else: the fd decides');
  t.end();
});
