/** The tool registry is validated at start: closed object schemas, no identity arguments, known hooks. */
import t from 'tap';
import { Gate } from '../../gate/index.js';
import { GateRegistry } from '../../gate/registry.js';
import { gateConfig } from '../helpers/gate.js';
import { isActionLedgerError } from '../../core/errors.js';

const url = 'postgres://nobody@localhost/none';
const problems = (fn: () => unknown): string[] => {
  try {
    fn();
  } catch (err) {
    if (isActionLedgerError(err, 'config_invalid')) return (err.details?.problems as string[]) ?? [err.message];
    throw err;
  }
  return [];
};

t.test('an object schema without additionalProperties: false is refused, nested ones too', (t) => {
  const open = { type: 'object', properties: { order_id: { type: 'string' } }, required: ['order_id'] };
  t.match(
    problems(() => gateConfig(url, { gate: { tools: { issue_refund: { schema: open } } } })).join('\n'),
    /issue_refund\/schema is an object schema without additionalProperties: false/,
  );
  const nested = {
    type: 'object',
    additionalProperties: false,
    properties: {
      order_id: { type: 'string' },
      amount: { type: 'number' },
      currency: { type: 'string' },
      meta: { type: 'object', properties: {} },
    },
  };
  t.match(
    problems(() => gateConfig(url, { gate: { tools: { issue_refund: { schema: nested } } } })).join('\n'),
    /schema\/properties\/meta is an object schema without additionalProperties/,
  );
  t.same(
    problems(() => gateConfig(url)),
    [],
    'the example registry is valid',
  );
  t.end();
});

t.test('strict mode, identity arguments, value wiring and routes are checked', (t) => {
  const unknownKeyword = {
    type: 'object',
    additionalProperties: false,
    properties: { order_id: { type: 'string', fancy: true }, amount: { type: 'number' }, currency: { type: 'string' } },
  };
  t.match(
    problems(() => gateConfig(url, { gate: { tools: { issue_refund: { schema: unknownKeyword } } } })).join('\n'),
    /strict mode/,
  );
  const identity = {
    type: 'object',
    additionalProperties: false,
    properties: { to_account: { type: 'string' }, amount: { type: 'number' }, user_id: { type: 'string' } },
  };
  t.match(
    problems(() => gateConfig(url, { gate: { tools: { transfer_funds: { schema: identity } } } })).join('\n'),
    /user_id declares an identity argument/,
  );
  t.match(
    problems(() =>
      gateConfig(url, { gate: { tools: { transfer_funds: { value: { argument: 'nope', currency: 'GBP' } } } } }),
    ).join('\n'),
    /value\/argument names nope/,
  );
  t.match(
    problems(() =>
      gateConfig(url, {
        gate: {
          tools: {
            orphan: { schema: { type: 'object', additionalProperties: false, properties: {} }, roles: ['agent'] },
          },
        },
      }),
    ).join('\n'),
    /orphan has no provider route/,
  );
  t.end();
});

t.test('a configured validator or resolver that is not registered refuses to start', (t) => {
  const config = gateConfig(url);
  t.throws(() => new Gate({ config, pool: undefined as never, ledger: undefined as never }), {
    code: 'config_invalid',
    message: /order_owned.*not registered[\s\S]*resolver registered for type document/,
  });
  t.end();
});

t.test('names every object inherits (toString, constructor) are not registered hooks', (t) => {
  const config = gateConfig(url, {
    gate: {
      tools: {
        issue_refund: { validator: 'constructor' },
        update_document: { resources: [{ type: 'toString', id_argument: 'document_id' }] },
      },
    },
  });
  t.throws(() => new Gate({ config, pool: undefined as never, ledger: undefined as never }), {
    code: 'config_invalid',
    message: /validator names constructor, which is not registered[\s\S]*no resolver registered for type toString/,
  });
  // Registered under those names, as own functions, they are found; something that is not a function is not.
  const registered = new GateRegistry(config, {
    validators: {
      constructor: () => Promise.resolve({ ok: true as const }),
      order_owned: () => Promise.resolve({ ok: true as const }),
    },
    resolvers: { toString: () => Promise.resolve('v1'), document: () => Promise.resolve('v1') },
  });
  t.ok(registered.validator('constructor'));
  t.equal(registered.resolver('hasOwnProperty'), undefined);
  t.throws(
    () =>
      new Gate({
        config,
        pool: undefined as never,
        ledger: undefined as never,
        validators: { constructor: 'not a function' as never },
        resolvers: { toString: () => Promise.resolve('v1') },
      }),
    { code: 'config_invalid', message: /validator names constructor/ },
  );
  t.end();
});
