import t from 'tap';
import { readFileSync } from 'node:fs';
import { ActionLedgerError, ERROR_CODES, toRefusal } from '../../core/errors.js';

t.test('every code is unique, documented once in docs/errors.md with its group, and nothing else is', async (t) => {
  const doc = readFileSync('docs/errors.md', 'utf8');
  const documented = [...doc.matchAll(/^\| `([a-z_]+)` \| ([a-z_]+) \|/gm)].map((m) => [m[1], m[2]] as const);
  const codes = Object.entries(ERROR_CODES);
  t.equal(new Set(documented.map(([c]) => c)).size, documented.length, 'no code documented twice');
  t.same(new Map(documented), new Map(codes), 'documented codes and groups match the code exactly');
});

t.test('refusals are structured and never leak unexpected error text', async (t) => {
  const e = new ActionLedgerError('route_not_approved', 'no route', { details: { tool: 'x' }, cause: new Error('inner') });
  t.same(toRefusal(e), { ok: false, error: 'route_not_approved', message: 'no route', details: { tool: 'x' } });
  t.equal(e.group, 'refused');
  t.same(toRefusal(new Error('password=hunter2 at db')), { ok: false, error: 'internal', message: 'internal error' });
});
