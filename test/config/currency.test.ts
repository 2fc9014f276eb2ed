/**
 * A tool's value caps and approval threshold are kept in one currency (`value.limits_currency`), and the gate
 * refuses a call in any other. An argument schema that admits another currency contradicts them: every call the
 * model makes in it, as the schema allows, is refused. Such a configuration is refused at load, naming the
 * schema property; a consistent one, and the shipped configurations, load.
 */
import t from 'tap';
import { readFileSync } from 'node:fs';
import { compileConfig, loadConfig } from '../../config/index.js';
import type { ConfigProblem } from '../../core/config-problems.js';
import { isActionLedgerError } from '../../core/errors.js';
import { gateConfig } from '../helpers/gate.js';

const url = 'postgres://nobody@localhost/none';
const FIELD = '/gate/tools/issue_refund/schema/properties/currency';

/** The issues of the `config_invalid` the load throws, or [] when it loads. */
function issues(load: () => unknown): ConfigProblem[] {
  try {
    load();
  } catch (err) {
    if (isActionLedgerError(err, 'config_invalid')) return err.details?.issues as ConfigProblem[];
    throw err;
  }
  return [];
}

/** The test fixture's issue_refund (caps and threshold in GBP) with this schema for its currency argument. */
const refund = (currency: unknown) =>
  gateConfig(url, {
    gate: {
      tools: {
        issue_refund: {
          schema: {
            type: 'object',
            additionalProperties: false,
            required: ['order_id', 'amount', 'currency'],
            properties: {
              order_id: { type: 'string', pattern: '^O-[0-9]{1,10}$' },
              amount: { type: 'number', exclusiveMinimum: 0, maximum: 10000 },
              currency,
            },
          },
        },
      },
    },
  });

t.test('a currency argument admitting what the caps cannot price is refused at load, the field named', (t) => {
  const cases: [unknown, RegExp][] = [
    [{ type: 'string', enum: ['GBP', 'EUR'] }, /^admits "EUR"; .*in GBP \(value\.limits_currency\)/],
    [{ type: 'string', enum: ['EUR', 'USD'] }, /^admits "EUR", "USD";/],
    [{ type: 'string', const: 'EUR' }, /^admits "EUR";/],
    [{ type: 'string', pattern: '^[A-Z]{3}$' }, /^admits any currency;/],
  ];
  for (const [schema, says] of cases) {
    const found = issues(() => refund(schema));
    t.same(
      found.map((p) => p.path),
      [FIELD],
      `${JSON.stringify(schema)}: one problem, at the currency argument`,
    );
    t.match(found[0], { message: says, allowed: ['GBP'] });
  }
  t.throws(() => refund({ type: 'string', enum: ['GBP', 'EUR'] }), {
    code: 'config_invalid',
    message: new RegExp(`${FIELD} admits "EUR"`),
  });
  t.end();
});

t.test('a currency argument admitting the caps’ currency alone loads', (t) => {
  for (const schema of [
    { type: 'string', enum: ['GBP'] },
    { type: 'string', const: 'GBP' },
  ])
    t.same(
      issues(() => refund(schema)),
      [],
      JSON.stringify(schema),
    );
  t.same(
    issues(() => gateConfig(url)),
    [],
    'the test fixture loads',
  );
  t.end();
});

t.test('the shipped example loads; with its old currencies (EUR, GBP, USD) it is refused', (t) => {
  t.doesNotThrow(() => loadConfig({ ACTIONLEDGER_CONFIG: 'actionledger.config.json' }));
  const raw = JSON.parse(readFileSync('actionledger.config.json', 'utf8')) as {
    gate: { tools: { issue_refund: { schema: { properties: { currency: { enum: string[] } } } } } };
  };
  t.same(raw.gate.tools.issue_refund.schema.properties.currency.enum, ['EUR'], 'the schema admits EUR alone');
  raw.gate.tools.issue_refund.schema.properties.currency.enum = ['EUR', 'GBP', 'USD'];
  const found = issues(() => compileConfig(raw, {}));
  t.same(
    found.map((p) => p.path),
    [FIELD],
  );
  t.match(found[0]?.message, /^admits "GBP", "USD"; the caps and approval threshold are in EUR/);
  t.end();
});
