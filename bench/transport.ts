/**
 * The transport cell: what the floor cell (bench/cells.ts) would cost with the plainest client instead of the
 * dispatcher's. N producers in a closed loop, each reserving an operation and then making the same two
 * mutual-TLS requests to the same sandbox servers with the same certificates (the authorization, then the
 * provider call with the Idempotency-Key and the bearer credential), through a bare undici Agent: the body read
 * whole and given to `JSON.parse`, no byte cap, no strict parser, no hash of the body, no classification, no
 * connect-phase bookkeeping or TLS 1.3 handshake confirmation. Each answer is checked only as far as needed
 * to count it: the decision is `allow` for this operation, the provider answered 2xx with an operation id.
 *
 * `floor / transport` is therefore the share of the bare transport's rate that the dispatcher's own client code
 * (strict parsing, classification, the checked decision) leaves; below 1.0 is what that code costs.
 */
import { Agent } from 'undici';
import { canonicalJson, sha256Hex } from '../core/json.js';
import {
  ARGS,
  cellContext,
  closedLoopOps,
  dropDatabase,
  migratedDatabase,
  type CellLimits,
  type Run,
  producerContext,
} from './cells.js';
import { openDispatchBench, PROVIDER_TOKEN, type BenchPki } from './dispatch-env.js';

export interface TransportResult extends Run {
  /** Requests whose answer was not the expected one (a denied or unechoed decision, a non-2xx provider answer). */
  notSucceeded: number;
}

/** POSTs `body` through `agent` and returns the status and `JSON.parse` of the whole body. */
async function post(
  agent: Agent,
  url: URL,
  body: string,
  headers: Record<string, string>,
): Promise<{ status: number; json: Record<string, unknown> }> {
  const res = await agent.request({
    origin: url.origin,
    path: url.pathname,
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json', ...headers },
    body,
  });
  return { status: res.statusCode, json: JSON.parse(await res.body.text()) as Record<string, unknown> };
}

export async function transportCell(
  adminUrl: string,
  pki: BenchPki,
  n: number,
  limits: CellLimits,
): Promise<TransportResult> {
  const name = `al_bench_transport_${n}`;
  const url = await migratedDatabase(adminUrl, name);
  // The floor cell's environment: its reservations, its sandbox servers (no dispatcher started).
  const env = await openDispatchBench(pki, url, n, 2, false);
  cellContext.sandboxThread = env.sandbox.tid;
  const tls = { ca: pki.ca.cert, cert: pki.client.cert, key: pki.client.key };
  const authorizer = new Agent({ connect: tls });
  const provider = new Agent({ connect: tls });
  const authorizeUrl = new URL(env.sandbox.authorizeUrl);
  const endpoint = new URL(env.sandbox.endpoint);
  const route = env.config.tools.get('issue_refund')!;
  const argsSha256 = sha256Hex(canonicalJson(ARGS));
  const argsBody = JSON.stringify(ARGS);
  try {
    let notSucceeded = 0;
    const cycle =
      (tag: string) =>
      async (w: number, i: number): Promise<number> => {
        const t0 = performance.now();
        const context = producerContext(tag, w, i);
        const r = await env.ledger.reserve(context, 'issue_refund', ARGS);
        const decision = await post(
          authorizer,
          authorizeUrl,
          JSON.stringify({
            operation_id: r.operation_id,
            effect_key: r.effect_key,
            principal_id: context.principal_id,
            task_id: context.task_id,
            workflow_step_id: context.workflow_step_id,
            tool_name: route.tool,
            tenant_id: context.tenant_id,
            provider_id: route.providerId,
            args_sha256: argsSha256,
            approval_id: context.approval_id,
            policy_version: context.policy_version,
          }),
          {},
        );
        const allowed =
          decision.status === 200 &&
          decision.json.decision === 'allow' &&
          decision.json.operation_id === r.operation_id;
        const answer = await post(provider, endpoint, argsBody, {
          [route.idempotencyHeader]: r.effect_key,
          authorization: `Bearer ${PROVIDER_TOKEN}`,
        });
        const applied = answer.status >= 200 && answer.status < 300 && typeof answer.json.operation_id === 'string';
        if (!allowed || !applied) notSucceeded++;
        return performance.now() - t0;
      };
    await closedLoopOps(n, Math.max(20, 2 * n), limits.capMs, cycle('warm'));
    notSucceeded = 0;
    const run = await closedLoopOps(n, limits.ops, limits.capMs, cycle('run'), limits.minMs);
    if (notSucceeded > 0)
      process.stderr.write(`WARNING transport N=${n}: ${notSucceeded} request pairs did not succeed\n`);
    return { ...run, notSucceeded };
  } finally {
    cellContext.sandboxThread = null;
    await Promise.all([authorizer.close(), provider.close()]);
    await env.close();
    await dropDatabase(adminUrl, name);
  }
}
