/**
 * The configuration bench/http.ts measures with: one tool, routed for one tenant, that the gate reserves at
 * once (no approval, no caps, no rate), and an API whose request limit no run reaches:
 * the cells measure the path, not a refusal.
 */
import type { Config } from '../config/index.js';
import type { Pool } from '../db/db.js';
import { Secret } from '../core/secret.js';
import { EffectKeyer, Ledger } from '../ledger/index.js';

export const BENCH_TENANT = 'tenant-a';

export const BENCH_ARGS = { order_id: 'ord-1', amount: 1250, currency: 'EUR' };

export const BENCH_RAW_CONFIG: Record<string, unknown> = {
  tools: {
    issue_refund: {
      provider_id: 'billing',
      endpoint: 'https://localhost:9443/v1/refunds',
      allowed_tenants: [BENCH_TENANT],
      idempotency: { mechanism: 'header', name: 'Idempotency-Key' },
    },
  },
  gate: {
    policy_version: 'bench-1',
    tools: {
      issue_refund: {
        schema: {
          type: 'object',
          additionalProperties: false,
          required: ['order_id', 'amount', 'currency'],
          properties: {
            order_id: { type: 'string', maxLength: 64 },
            amount: { type: 'integer', minimum: 1 },
            currency: { type: 'string', enum: ['EUR'] },
          },
        },
        roles: ['agent'],
      },
    },
  },
  api: {
    permissions: { reserve: ['service'] },
    rate_limit: { requests: 10000000, window_s: 60 },
  },
};

/** A ledger with a fixed effect-key secret (the benchmarks keep no secret). */
export function benchLedgerWith(config: Config, pool: Pool): Ledger {
  return new Ledger(
    config,
    pool,
    new EffectKeyer({ active: 'k1', secrets: new Map([['k1', new Secret(Buffer.alloc(32, 7))]]) }),
  );
}
