/**
 * The configuration validator is compiled ahead of time (config/validator-source.ts): the committed
 * config/validator.generated.ts must be what the schema compiles to now, and must judge a configuration as ajv
 * compiling the schema at run time does (the same errors, the same defaults filled in).
 */
import t from 'tap';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Ajv } from 'ajv';
import { configSchema } from '../../config/schema.js';
import { validate } from '../../config/validator.generated.js';
import { configValidatorSource, GENERATED_VALIDATOR_PATH, VALIDATOR_OPTIONS } from '../../config/validator-source.js';

const ROOT = fileURLToPath(new URL('../../../', import.meta.url));

t.test('the committed validator is the one the schema compiles to (else: npm run generate)', (t) => {
  const committed = readFileSync(join(ROOT, GENERATED_VALIDATOR_PATH), 'utf8');
  t.ok(committed === configValidatorSource(), `${GENERATED_VALIDATOR_PATH} is current; npm run generate rewrites it`);
  t.end();
});

t.test('the generated validator and a run-time compilation agree, errors and defaults', (t) => {
  const runtime = new Ajv({ ...VALIDATOR_OPTIONS }).compile(configSchema);
  const generated = validate as unknown as typeof runtime;
  const cases: unknown[] = [
    { tools: {} },
    { tools: { t1: { base_url: 'https://p.example/', readback: 'none' } }, dispatcher: { workers: 2 } },
    { tools: {}, dispatcher: { workers: 'two', wrokers: 1 }, schema: 7 },
    { tools: { t1: 5 }, reconciler: { schedule: [] }, effect_keys: { active: 1 } },
    { nothing: true },
    [],
    'text',
  ];
  for (const input of cases) {
    const a = structuredClone(input);
    const b = structuredClone(input);
    const okA = runtime(a);
    const okB = generated(b);
    t.equal(okB, okA, `${JSON.stringify(input)}: same verdict`);
    t.same(b, a, `${JSON.stringify(input)}: same defaults filled in`);
    t.same(generated.errors ?? null, runtime.errors ?? null, `${JSON.stringify(input)}: same errors`);
  }
  t.notOk(runtime({ tools: {}, dispatcher: { workers: 'two' } }), 'a case that fails fails at all');
  t.end();
});
