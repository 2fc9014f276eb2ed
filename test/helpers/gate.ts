/**
 * The gate's test fixture: a cloned database with a small "shop" (orders owned by accounts, versioned
 * documents) that the business validator and the resource resolver read, a configuration with example tools
 * (refunds with a per-conversation cap, transfers with daily caps, documents needing approval, email needing
 * confirmation, customer deletion needing two approvers), and a Gate over it.
 */
import type { Test } from 'tap';
import { compileConfig, type Config } from '../../config/index.js';
import { createPool, type Pool } from '../../db/db.js';
import { Gate } from '../../gate/index.js';
import type { BusinessValidator, GateContext, ResourceResolver, Reviewer } from '../../gate/index.js';
import { Ledger } from '../../ledger/index.js';
import { createTestDatabase, TEST_SECRET, testKeyer } from './db.js';

export const GATE_POLICY = 'gate-policy-1';

const route = (endpoint: string) => ({
  provider_id: 'billing-test',
  endpoint,
  allowed_tenants: ['tenant-a', 'tenant-b'],
  credential_env: 'TEST_BILLING_TOKEN',
  idempotency: { mechanism: 'header' as const, name: 'Idempotency-Key' },
  definitive_failure_statuses: [400, 422],
});

export const GATE_TOOL_NAMES = [
  'issue_refund',
  'transfer_funds',
  'update_document',
  'send_email',
  'delete_customer',
  'lookup_order',
] as const;

/** Provider routes for every gate tool, all to `endpoint`. */
export function gateRoutes(endpoint = 'https://localhost:9443/v1/effects'): Record<string, ReturnType<typeof route>> {
  return Object.fromEntries(GATE_TOOL_NAMES.map((n) => [n, route(endpoint)]));
}

const obj = (properties: Record<string, unknown>, required: string[]) => ({
  type: 'object',
  additionalProperties: false,
  required,
  properties,
});

/** The example gate section; `tools` entries are merged over the defaults one level deep. */
export function gateSection(
  over: { tools?: Record<string, Record<string, unknown>>; [k: string]: unknown } = {},
): Record<string, unknown> {
  const tools: Record<string, Record<string, unknown>> = {
    issue_refund: {
      schema: obj(
        {
          order_id: { type: 'string', pattern: '^O-[0-9]{1,10}$' },
          amount: { type: 'number', exclusiveMinimum: 0, maximum: 10000 },
          currency: { type: 'string', enum: ['GBP'] },
        },
        ['order_id', 'amount', 'currency'],
      ),
      roles: ['agent', 'admin'],
      value: { argument: 'amount', currency_argument: 'currency', limits_currency: 'GBP' },
      approver_roles: ['supervisor'],
      approval: { mode: 'threshold', threshold: 500 },
      validator: 'order_owned',
      limits: { per_conversation: { max_count: 3, max_value: 500 } },
      rate: { limit: 100, window_s: 3600 },
    },
    transfer_funds: {
      schema: obj(
        {
          to_account: { type: 'string', pattern: '^ACC[0-9]{10}$' },
          amount: { type: 'number', exclusiveMinimum: 0, maximum: 1000000 },
          memo: { type: 'string', maxLength: 200 },
        },
        ['to_account', 'amount'],
      ),
      roles: ['agent', 'admin'],
      value: { argument: 'amount', currency: 'GBP' },
      limits: { per_principal_day: { max_value: 100000 }, per_account_day: { max_value: 100000 } },
      redact: ['memo'],
    },
    update_document: {
      schema: obj(
        {
          document_id: { type: 'string', pattern: '^DOC-[0-9]{1,10}$' },
          status: { type: 'string', enum: ['draft', 'reviewed', 'published'] },
        },
        ['document_id', 'status'],
      ),
      roles: ['editor'],
      approver_roles: ['supervisor'],
      approval: { mode: 'always' },
      irreversible: true,
      resources: [{ type: 'document', id_argument: 'document_id' }],
      effect: 'Set document {document_id} to {status}',
    },
    send_email: {
      schema: obj(
        {
          to: { type: 'string', pattern: '^[^@\\s]+@[^@\\s]+$' },
          subject: { type: 'string', maxLength: 200 },
          body: { type: 'string', maxLength: 5000 },
        },
        ['to', 'subject', 'body'],
      ),
      roles: ['agent'],
      approval: { mode: 'confirm' },
      redact: ['body'],
    },
    delete_customer: {
      schema: obj({ customer_id: { type: 'string', pattern: '^C-[0-9]{1,10}$' } }, ['customer_id']),
      roles: ['admin'],
      approver_roles: ['supervisor'],
      approval: { mode: 'always', approvers: 2 },
    },
    lookup_order: {
      schema: obj({ order_id: { type: 'string', pattern: '^O-[0-9]{1,10}$' } }, ['order_id']),
      roles: [],
    },
  };
  const { tools: toolOver = {}, ...rest } = over;
  for (const [name, t] of Object.entries(toolOver)) tools[name] = { ...tools[name], ...t };
  return { policy_version: GATE_POLICY, tools, ...rest };
}

export function gateConfig(
  url: string,
  options: { endpoint?: string; gate?: Parameters<typeof gateSection>[0]; extra?: Record<string, unknown> } = {},
): Config {
  return compileConfig(
    { tools: gateRoutes(options.endpoint), gate: gateSection(options.gate), ...options.extra },
    { DATABASE_URL: url, ACTIONLEDGER_EFFECT_KEY_SECRET: TEST_SECRET, TEST_BILLING_TOKEN: 'token-for-tests' },
  );
}

/** Ownership lives in the query: an order of another account is exactly as absent as a missing one. */
export const orderOwned: BusinessValidator = async ({ context, args, db }) => {
  const { rows } = await db.query<{ refunded: boolean }>(
    'SELECT refunded FROM shop.orders WHERE order_id = $1 AND account_id = $2 AND tenant_id = $3',
    [args.order_id, context.account_id, context.tenant_id],
  );
  const row = rows[0];
  if (row === undefined) return { ok: false, error: 'not_found', message: 'order not found' };
  if (row.refunded) return { ok: false, error: 'invalid_request', message: 'this order is already refunded' };
  return { ok: true };
};

export const documentVersion: ResourceResolver = async ({ tenant_id, id, db }) => {
  const { rows } = await db.query<{ version: number }>(
    'SELECT version FROM shop.documents WHERE doc_id = $1 AND tenant_id = $2',
    [id, tenant_id],
  );
  return rows[0]?.version ?? null;
};

export const GATE_VALIDATORS = { order_owned: orderOwned };
export const GATE_RESOLVERS = { document: documentVersion };

export async function createShop(pool: Pool): Promise<void> {
  await pool.query(`
    CREATE SCHEMA IF NOT EXISTS shop;
    CREATE TABLE IF NOT EXISTS shop.orders (order_id text PRIMARY KEY, tenant_id text NOT NULL, account_id text NOT NULL, total numeric NOT NULL, refunded boolean NOT NULL DEFAULT false);
    CREATE TABLE IF NOT EXISTS shop.documents (doc_id text PRIMARY KEY, tenant_id text NOT NULL, version integer NOT NULL, status text NOT NULL);
    INSERT INTO shop.orders (order_id, tenant_id, account_id, total, refunded)
      SELECT 'O-' || i, 'tenant-a', 'acct-1', 243.71, false FROM generate_series(1, 20) i
      UNION ALL SELECT 'O-900', 'tenant-a', 'acct-2', 50, false
      UNION ALL SELECT 'O-901', 'tenant-a', 'acct-1', 50, true
    ON CONFLICT DO NOTHING;
    INSERT INTO shop.documents VALUES ('DOC-1', 'tenant-a', 7, 'draft') ON CONFLICT DO NOTHING;`);
}

export interface GateFixture {
  url: string;
  config: Config;
  pool: Pool;
  ledger: Ledger;
  gate: Gate;
}

export async function gateFixture(
  t: Test,
  options: Parameters<typeof gateConfig>[1] & { url?: string; pool?: Pool } = {},
): Promise<GateFixture> {
  const url = options.url ?? (await createTestDatabase(t));
  const config = gateConfig(url, options);
  const pool = options.pool ?? createPool(url, { max: 20, statementTimeoutMs: 30_000, applicationName: 'test-gate' });
  const ledger = new Ledger(config, pool, testKeyer());
  t.teardown(async () => {
    ledger.stop();
    if (options.pool === undefined) await pool.end();
  });
  await createShop(pool);
  const gate = new Gate({ config, pool, ledger, validators: GATE_VALIDATORS, resolvers: GATE_RESOLVERS });
  return { url, config, pool, ledger, gate };
}

export const gctx = (over: Partial<GateContext> = {}): GateContext => ({
  tenant_id: 'tenant-a',
  principal_id: 'agent-1',
  role: 'agent',
  account_id: 'acct-1',
  conversation_id: 'conv-1',
  turn_id: 'turn-1',
  trace_id: 'trace-1',
  task_id: 'task-1',
  workflow_step_id: 'step-1',
  ...over,
});

export const reviewer = (principal: string, over: Partial<Reviewer> = {}): Reviewer => ({
  tenant_id: 'tenant-a',
  principal_id: principal,
  role: 'supervisor',
  ...over,
});

export async function count(pool: Pool, sql: string, params: unknown[] = []): Promise<number> {
  const { rows } = await pool.query<{ n: string }>(`SELECT count(*)::bigint AS n FROM ${sql}`, params);
  return Number(rows[0]?.n ?? 0);
}

export async function auditRows(
  pool: Pool,
  where = 'true',
  params: unknown[] = [],
): Promise<Record<string, unknown>[]> {
  return (await pool.query(`SELECT * FROM actionledger.gate_audit WHERE ${where} ORDER BY id`, params)).rows as Record<
    string,
    unknown
  >[];
}
