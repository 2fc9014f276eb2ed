import t from 'tap';
import { readFileSync } from 'node:fs';
import { ActionLedgerError, ERROR_CODES, toRefusal } from '../../core/errors.js';

t.test('every code is unique, documented once in docs/errors.md with its group, and nothing else is', (t) => {
  const doc = readFileSync('docs/errors.md', 'utf8');
  const documented = [...doc.matchAll(/^\| `([a-z_]+)` +\| ([a-z_]+) +\|/gm)].map((m) => [m[1], m[2]] as const);
  const codes = Object.entries(ERROR_CODES);
  t.equal(new Set(documented.map(([c]) => c)).size, documented.length, 'no code documented twice');
  t.same(new Map(documented), new Map(codes), 'documented codes and groups match the code exactly');
  t.end();
});

t.test('refusals are structured and never leak unexpected error text', (t) => {
  const e = new ActionLedgerError('route_not_approved', 'no route', {
    details: { tool: 'x' },
    cause: new Error('inner'),
  });
  t.same(toRefusal(e), { ok: false, error: 'route_not_approved', message: 'no route', details: { tool: 'x' } });
  t.equal(e.group, 'refused');
  t.same(toRefusal(new Error('password=hunter2 at db')), { ok: false, error: 'internal', message: 'internal error' });
  t.end();
});

t.test('database failures become coded errors with their SQLSTATE, never internal', (t) => {
  const pgError = (code: string): Error => Object.assign(new Error(`server says ${code}`), { code });
  const cases: [unknown, string][] = [
    [pgError('53100'), 'storage_full'],
    [pgError('58030'), 'storage_full'],
    [pgError('57014'), 'statement_timeout'],
    [pgError('53300'), 'database_overloaded'],
    [pgError('40P01'), 'database_conflict'],
    [pgError('25006'), 'database_read_only'],
    [pgError('57P01'), 'database_unavailable'],
    [pgError('08006'), 'database_unavailable'],
    [Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:1'), { code: 'ECONNREFUSED' }), 'database_unavailable'],
    [new Error('Connection terminated unexpectedly'), 'database_unavailable'],
    [pgError('22P02'), 'database_error'],
  ];
  for (const [err, code] of cases) {
    const r = toRefusal(err);
    t.equal(r.error, code, `${(err as Error).message} -> ${code}`);
    t.notMatch(r.message, /server says/, 'the server message is not passed on');
  }
  t.same(toRefusal(pgError('53100')).details, { sqlstate: '53100' });
  t.equal(toRefusal(new TypeError('x')).error, 'internal', 'a non-database failure stays internal');
  t.end();
});
