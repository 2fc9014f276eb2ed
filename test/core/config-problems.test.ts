/**
 * Configuration problems are reported in one pass, each with its path, the allowed values, the nearest valid
 * name where one is close, and as text one line per problem; a malformed part is skipped, never crashed on.
 */
import t from 'tap';
import { compileConfig } from '../../config/index.js';
import {
  configProblemsText,
  dottedPath,
  editDistance,
  nearest,
  type ConfigProblem,
} from '../../core/config-problems.js';
import { ActionLedgerError, isActionLedgerError } from '../../core/errors.js';
import { BROKEN_CONFIG, BROKEN_PATHS } from '../helpers/broken-config.js';

const route = {
  provider_id: 'billing',
  endpoint: 'https://billing.example.org/v3/refunds',
  allowed_tenants: ['tenant-a'],
  idempotency: { mechanism: 'header', name: 'Idempotency-Key' },
};

function refusal(input: unknown, env: NodeJS.ProcessEnv = {}): ActionLedgerError {
  try {
    compileConfig(input, env);
  } catch (err) {
    if (isActionLedgerError(err, 'config_invalid')) return err;
    throw err;
  }
  throw new Error('the configuration compiled');
}

const issues = (err: ActionLedgerError): ConfigProblem[] => err.details?.issues as ConfigProblem[];
const at = (err: ActionLedgerError, path: string): ConfigProblem | undefined =>
  issues(err).find((i) => i.path === path);

t.test('schema, cross-field, route and gate mistakes are all reported in one error', (t) => {
  const err = refusal(BROKEN_CONFIG);
  t.same(
    issues(err)
      .map((i) => i.path)
      .sort(),
    [...BROKEN_PATHS].sort(),
    'every mistake, each once, and nothing that follows from another',
  );
  const problems = err.details?.problems as string[];
  t.equal(problems.length, BROKEN_PATHS.length, 'details.problems keeps one line per problem');
  for (const path of BROKEN_PATHS)
    t.ok(
      problems.some((p) => p.startsWith(`${path} `)),
      `${path} in problems`,
    );
  t.match(err.message, /approval\/mode[\s\S]*issue_refnd[\s\S]*backoff_max_ms/, 'and in the message');
  t.end();
});

t.test('enum and const errors name the allowed values and the value given', (t) => {
  const err = refusal({
    gate: { direct_reservations: 'maybe' },
    tools: { a: { ...route, idempotency: { mechanism: 'hedder', name: 'K' } } },
  });
  t.match(at(err, '/gate/direct_reservations'), {
    message: 'must be one of: allow, deny',
    allowed: ['allow', 'deny'],
    got: 'maybe',
  });
  t.notOk(at(err, '/gate/direct_reservations')?.suggestion, '"maybe" is near neither');
  t.match(at(err, '/tools/a/idempotency/mechanism'), {
    message: 'must be "header"',
    allowed: ['header'],
    suggestion: 'header',
  });
  const broken = refusal(BROKEN_CONFIG);
  t.match(at(broken, '/gate/tools/issue_refund/approval/mode'), {
    message: 'must be one of: auto, threshold, always, confirm',
    allowed: ['auto', 'threshold', 'always', 'confirm'],
    got: 'alwyas',
    suggestion: 'always',
  });
  t.end();
});

t.test('a misspelt key or name gets the nearest valid one; a name near nothing gets none', (t) => {
  const err = refusal({
    bogus: true,
    tools: { issue_refund: { ...route, compensation: { tool: 'zzz', arguments: {} } } },
    gate: {
      tools: { issue_refund: { schema: { type: 'object', additionalProperties: false }, roles: ['a'], aproval: {} } },
    },
  });
  t.match(at(err, '/gate/tools/issue_refund/aproval'), { message: 'is not a known key', suggestion: 'approval' });
  t.ok(at(err, '/gate/tools/issue_refund/aproval')?.allowed?.includes('approval'), 'the known keys are listed');
  const bogus = at(err, '/bogus');
  t.equal(bogus?.suggestion, undefined, 'no suggestion for a key near nothing');
  t.match(bogus?.message, /^is not a known key \(known keys: .*dispatcher.*\)$/, 'the known keys instead');
  t.equal(at(err, '/tools/issue_refund/compensation/tool')?.suggestion, undefined);
  const broken = refusal(BROKEN_CONFIG);
  t.equal(at(broken, '/dispach')?.suggestion, 'dispatcher');
  t.equal(at(broken, '/tools/issue_refund/compensation/tool')?.suggestion, 'void_refund', 'the nearest declared tool');
  t.equal(at(broken, '/gate/tools/issue_refnd')?.suggestion, 'issue_refund', 'the nearest route');
  t.equal(at(broken, '/effect_keys/active')?.suggestion, 'k1', 'the nearest declared key');
  t.end();
});

t.test('edit distance and its cutoff', (t) => {
  t.equal(editDistance('alwyas', 'always'), 1, 'a transposition is one edit');
  t.equal(editDistance('dispach', 'dispatcher'), 3);
  t.equal(editDistance('', 'abc'), 3);
  t.equal(nearest('dispach', ['database', 'dispatcher', 'gate']), 'dispatcher');
  t.equal(nearest('ab', ['k1', 'xy']), undefined, 'short words need a near-exact match');
  t.equal(nearest('k2', ['k1']), 'k1');
  t.equal(nearest('ALWAYS', ['auto', 'always']), 'always', 'case is ignored');
  t.equal(nearest('always', ['auto', 'always']), undefined, 'an exact name needs no suggestion');
  t.end();
});

t.test('a malformed part is skipped and reported once; the rest is still checked', (t) => {
  const err = refusal({
    http: null,
    effect_keys: { active: 'k9', keys: { k1: 5 } },
    tools: {
      a: null,
      b: { ...route, endpoint: 'http://b.example/x', readback: 'x' },
      c: { ...route, compensation: { tool: 'b', arguments: { x: 'str', y: { from: 'reciept' } } } },
    },
    gate: { tools: { b: 5, c: { schema: 'x', roles: ['a'], value: { argument: 'amount', currency: 'EUR' } } } },
  });
  t.same(
    issues(err)
      .map((i) => i.path)
      .sort(),
    [
      '/effect_keys/active',
      '/effect_keys/keys/k1',
      '/gate/tools/b',
      '/gate/tools/c/schema',
      '/http',
      '/tools/a',
      '/tools/b/endpoint',
      '/tools/b/readback',
      '/tools/c/compensation/arguments/x',
      '/tools/c/compensation/arguments/y/from',
    ],
  );
  t.match(at(err, '/tools/c/compensation/arguments/y/from'), { suggestion: 'receipt' }, 'the oneOf branch meant');
  for (const bad of [null, 5, 'x', []]) {
    const root = refusal(bad);
    t.same(
      issues(root).map((i) => i.path),
      [''],
      `${JSON.stringify(bad)}: one problem, at the root`,
    );
  }
  t.end();
});

t.test('the environment is checked with the file', (t) => {
  const err = refusal({ bogus: 1, tools: {} }, { PORT: 'eighty' });
  t.same(
    issues(err).map((i) => i.path),
    ['/bogus', 'PORT'],
  );
  t.end();
});

t.test('as text: a heading and one line per problem, with readable paths', (t) => {
  t.equal(dottedPath('/gate/tools/x/resources/0/id_argument'), 'gate.tools.x.resources[0].id_argument');
  t.equal(dottedPath('/tools/a~1b/compensation/arguments/x.y'), 'tools["a/b"].compensation.arguments["x.y"]');
  t.equal(dottedPath(''), '(root)');
  const err = refusal({ gate: { direct_reservations: 'maybe', tools: {} }, dispach: {}, tools: {} });
  t.equal(
    configProblemsText(err),
    [
      'configuration is invalid (2 problems):',
      '  dispach: is not a known key (did you mean "dispatcher"?)',
      '  gate.direct_reservations: must be one of: allow, deny (got "maybe")',
      '',
    ].join('\n'),
  );
  t.equal(configProblemsText(new ActionLedgerError('not_found', 'x')), null, 'other errors have no such text');
  t.end();
});
