/**
 * A configuration with one mistake of every kind the compiler checks, each independent of the others: before
 * they were all collected in one pass, the schema's mistakes hid the rest until they were fixed.
 */
const route = {
  provider_id: 'billing',
  endpoint: 'https://billing.example.org/v3/refunds',
  allowed_tenants: ['tenant-a'],
  idempotency: { mechanism: 'header', name: 'Idempotency-Key' },
};

const closedSchema = {
  type: 'object',
  additionalProperties: false,
  properties: { order_id: { type: 'string' }, amount: { type: 'number' } },
};

export const BROKEN_CONFIG = {
  // schema: an unknown key one typo from a known one, an enum value one typo from an allowed one, a range
  dispach: { workers: 2 },
  dispatcher: { workers: 0 },
  // cross-field: the active key is not declared; the backoff ceiling is under its start
  effect_keys: { active: 'k2' },
  reconciler: { backoff_initial_ms: 10000, backoff_max_ms: 5000 },
  tools: {
    // route: not https; compensation names a tool one typo from a declared one
    issue_refund: {
      ...route,
      endpoint: 'http://billing.example.org/v3/refunds',
      compensation: { tool: 'void_refnd', arguments: { refund_id: { from: 'receipt' } } },
    },
    void_refund: route,
  },
  gate: {
    tools: {
      issue_refund: { schema: closedSchema, roles: ['agent'], approval: { mode: 'alwyas' } },
      // gate: an open argument schema, and a value argument the schema does not declare
      void_refund: {
        schema: { type: 'object', properties: { refund_id: { type: 'string' } } },
        roles: ['agent'],
        value: { argument: 'amount', currency: 'EUR' },
      },
      // gate: a tool with no provider route (one typo from a declared one)
      issue_refnd: { schema: closedSchema, roles: ['agent'] },
    },
  },
};

/** Every problem BROKEN_CONFIG holds, by path. */
export const BROKEN_PATHS = [
  '/dispach',
  '/dispatcher/workers',
  '/gate/tools/issue_refund/approval/mode',
  '/effect_keys/active',
  '/reconciler/backoff_max_ms',
  '/tools/issue_refund/endpoint',
  '/tools/issue_refund/compensation/tool',
  '/gate/tools/void_refund/schema',
  '/gate/tools/void_refund/value/argument',
  '/gate/tools/issue_refnd',
];
